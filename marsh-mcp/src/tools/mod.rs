//! The tool surface: the catalog (names, descriptions, schemas, annotations) and the
//! dispatch, both derived from [`ToolName`] by exhaustive matches — a new tool that is
//! not described, scoped and dispatched does not compile.

mod args;
pub(crate) mod doctor;
mod envelope;
mod network_hint;
mod operation_reply;
mod operation_tools;
pub(crate) mod progress;
mod qualify;
mod readable;
mod result_data;
mod schema;
mod scope_id_argument;
mod scope_lifecycle;
mod views;
mod work_in_scope;

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolResult, JsonObject, Tool, ToolAnnotations};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::admission::WorkerStep;
use crate::context::ServerContext;
use crate::error::{ErrorKind, ToolError, ToolReply, ToolResult};
use crate::operations::{OpStatus, Operation, SessionId};
use crate::scopes;
use crate::shell_facts::ShellFacts;
use crate::tool_table::{Addressing, ToolName};
pub(crate) use envelope::error_schema;
use envelope::into_call_result;
use progress::Progress;
use readable::Readable;
use result_data::{
    DoctorReport, LifecycleResult, OperationCancelResult, OperationGetResult, OperationListResult,
    OperationOutputResult, OperationReport, QualifyResult, ReceiptList, ReceiptOne, ReceiptRead,
    ScopeListResult, ScopeStopResult, StatusResult, WorkersResult,
};
use schema::{input_schema as schema_of, output_schema};
pub(crate) use views::json_len;

/// The largest `timeout_ms` a call accepts (the advice of a timed-out operation).
pub(crate) const TIMEOUT_MAX_MS: u64 = args::TIMEOUT.max;

/// One call as a handler sees it: whose, with what arguments (`scope_id` already
/// taken out for `scope_*` tools), the request's cancellation, where its progress
/// goes while it waits, and the host places its output views are rewritten by (so a
/// reply is fitted to its frame as it will be sent).
#[derive(Clone, Copy)]
pub(crate) struct Call<'a> {
    pub session: SessionId,
    pub arguments: &'a Option<Map<String, Value>>,
    pub request: &'a CancellationToken,
    pub progress: &'a Progress,
    pub host_paths: &'a crate::redact::HostPaths,
}

impl Call<'_> {
    /// The arguments as the tool's closed argument struct.
    pub(crate) fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, ToolError> {
        args::parse(self.arguments.clone())
    }

    /// Waits until `op` ends, `wait` elapses or the request is cancelled, notifying
    /// progress meanwhile when the call asked for it; the status at that moment.
    pub(crate) async fn wait_for_end(&self, op: &Operation, wait: Duration) -> OpStatus {
        self.progress
            .during(op, op.wait_for_end(wait, self.request))
            .await
    }
}

const SHELL_RUN_DESCRIPTION: &str = "Run a command in the project shell (cwd = the workspace). Ends within wait_ms: the result inline; else the operation id and output so far, running on. Long output: head and tail inline, operation_output pages the rest. Non-UTF-8 output comes as `*_base64`. Workspace writable, system read-only, $HOME kept per scope; background processes end with the command (run a service as its own call).";

/// A tool's description, its own arguments' schema (before `scope_id` is added) and
/// its output schema, generated from the type its handler returns (`dispatch`).
fn describe(tool: ToolName) -> (&'static str, Arc<JsonObject>, Arc<JsonObject>) {
    use args::*;
    match tool {
        ToolName::Doctor => (
            "Health of this server: pinned executables, scope home identity, sandbox isolation, registry, limits and operation counts. No host paths.",
            schema_of::<NoArgs>(),
            output_schema::<DoctorReport>(),
        ),
        ToolName::Status => (
            "State of the default scope and its marsh runtime (daemon, project shell, kit workers, active jobs).",
            schema_of::<NoArgs>(),
            output_schema::<StatusResult>(),
        ),
        ToolName::ResultsList => (
            "Newest durable result receipts of the default scope. Like every default-scope alias, refused while that scope is stopped (scope_results_list reads it then).",
            schema_of::<ResultsListArgs>(),
            output_schema::<ReceiptRead<ReceiptList>>(),
        ),
        ToolName::ResultGet => (
            "One durable result receipt of the default scope, by id or unique id prefix.",
            schema_of::<ResultGetArgs>(),
            output_schema::<ReceiptRead<ReceiptOne>>(),
        ),
        ToolName::ShellRun | ToolName::ScopeRun => (
            SHELL_RUN_DESCRIPTION,
            schema_of::<ShellRunArgs>(),
            output_schema::<OperationReport>(),
        ),
        ToolName::Prewarm => (
            "Warm kit workers of the default scope (an operation). A kit is a marsh-registered command with workers of its own; status lists them.",
            schema_of::<SelectionArgs>(),
            output_schema::<WorkersResult>(),
        ),
        ToolName::WorkersReset => (
            "Reset kit workers of the default scope to cold (an operation); refused while they work. A kit is a marsh-registered command; status lists them.",
            schema_of::<SelectionArgs>(),
            output_schema::<WorkersResult>(),
        ),
        ToolName::ScopeStart => (
            "Create and boot a private development scope (own home, daemon, shell, workers) over this workspace; returns its id and boot operation. Managed mode only; at most 16 live, 128 retained.",
            schema_of::<NoArgs>(),
            output_schema::<LifecycleResult>(),
        ),
        ToolName::ScopeList => (
            "Every scope of this server (default first) with its persisted state.",
            schema_of::<NoArgs>(),
            output_schema::<ScopeListResult>(),
        ),
        ToolName::ScopeStatus => (
            "State of one scope. A ready scope's runtime is probed; a stopped one is absent; failed or transitioning ones report their persisted state without probing.",
            schema_of::<NoArgs>(),
            output_schema::<StatusResult>(),
        ),
        ToolName::ScopeResultsList => (
            "Newest durable receipts of one scope. Reading a stopped scope is an operation (exclusive, always ending with an exact stop): inline within wait_ms, else `{operation, hint}`.",
            schema_of::<ResultsListArgs>(),
            output_schema::<ReceiptRead<ReceiptList>>(),
        ),
        ToolName::ScopeResultGet => (
            "One durable receipt of one scope, by id or unique prefix.",
            schema_of::<ResultGetArgs>(),
            output_schema::<ReceiptRead<ReceiptOne>>(),
        ),
        ToolName::ScopePrewarm => (
            "Warm kit workers of one ready scope (an operation). A kit is a marsh-registered command; scope_status lists them.",
            schema_of::<SelectionArgs>(),
            output_schema::<WorkersResult>(),
        ),
        ToolName::ScopeWorkersReset => (
            "Reset kit workers of one ready scope to cold (an operation). A kit is a marsh-registered command; scope_status lists them.",
            schema_of::<SelectionArgs>(),
            output_schema::<WorkersResult>(),
        ),
        ToolName::ScopeReset => (
            "Boot, reset and re-validate one scope (an operation): the recovery path from failed, and revival from stopped. Refused while work is active.",
            schema_of::<WaitArgs>(),
            output_schema::<LifecycleResult>(),
        ),
        ToolName::ScopeStop => (
            "Boot-validate then exactly stop one scope's runtime (an operation), keeping its home and receipts. Refused while work is active.",
            schema_of::<WaitArgs>(),
            output_schema::<ScopeStopResult>(),
        ),
        ToolName::ScopeRemove => (
            "Delete a stopped generated scope's home with a bounded no-follow walk and free its record (an operation).",
            schema_of::<WaitArgs>(),
            output_schema::<LifecycleResult>(),
        ),
        ToolName::OperationList => (
            "This session's operations, newest first: id, kind, scope, command excerpt, state, output size. Finds an id after a lost reply or when capacity_exhausted.",
            schema_of::<OperationListArgs>(),
            output_schema::<OperationListResult>(),
        ),
        ToolName::OperationGet => (
            "State of one of this session's operations; wait_ms waits for it to end.",
            schema_of::<OperationGetArgs>(),
            output_schema::<OperationGetResult>(),
        ),
        ToolName::OperationOutput => (
            "Read an operation's captured output, while running or after, with byte cursors (since_seq -> next_seq) or tail_lines.",
            schema_of::<OperationOutputArgs>(),
            output_schema::<OperationOutputResult>(),
        ),
        ToolName::OperationCancel => (
            "Cancel one of this session's operations. Always ends in cancellation_uncertain: signal delivery does not prove the sandbox work stopped.",
            schema_of::<OperationCancelArgs>(),
            output_schema::<OperationCancelResult>(),
        ),
        ToolName::Qualify => (
            "Run the repository's fixed qualification recipe (/usr/bin/make test|acceptance-smoke|acceptance|perf) in the workspace as the host user. Disabled unless started with --allow-full-sbx-control.",
            schema_of::<QualifyArgs>(),
            output_schema::<QualifyResult>(),
        ),
    }
}

/// `tool`'s hints, each written only where it differs from the MCP default
/// (readOnly false, destructive true, idempotent false, openWorld true); destructive
/// and idempotent mean something only for a tool that is not read-only. Every byte of
/// `tools/list` is read by the model each session, and the spec's defaults are what a
/// client assumes for an absent hint.
fn annotations(tool: ToolName) -> ToolAnnotations {
    let mut hints = ToolAnnotations::new();
    hints.read_only_hint = tool.read_only().then_some(true);
    if !tool.read_only() {
        hints.destructive_hint = (!tool.destructive()).then_some(false);
        hints.idempotent_hint = tool.idempotent().then_some(true);
    }
    hints.open_world_hint = (!tool.open_world()).then_some(false);
    hints
}

/// A hint as a client reads it: absent means the MCP default.
#[cfg(test)]
fn effective_hints(hints: &ToolAnnotations) -> [bool; 4] {
    let read_only = hints.read_only_hint.unwrap_or(false);
    [
        read_only,
        !read_only && hints.destructive_hint.unwrap_or(true),
        read_only || hints.idempotent_hint.unwrap_or(false),
        hints.open_world_hint.unwrap_or(true),
    ]
}

/// The catalog entry of `tool`; `project` is the workspace's directory name, `facts`
/// the default scope's shell and network.
fn catalog_entry(tool: ToolName, project: &str, facts: &ShellFacts) -> Tool {
    let (description, schema, output) = describe(tool);
    // A client registration can be account-wide (Codex): an agent in another
    // repository sees this catalog too, so the tool that runs commands names where.
    let description = match tool {
        ToolName::ShellRun => format!(
            "{description} {} The workspace is the directory `{project}`, whichever repository the session was opened in; this server serves no other.",
            facts.sentence()
        ),
        // The same run in another scope: said by reference, not repeated (every byte
        // of the catalog is read each session).
        ToolName::ScopeRun => format!(
            "Run a command in the project shell of scope `scope_id`, as shell_run does (same arguments, result, sandbox). Default scope: {} Other scopes: see scope_status. The workspace is the directory `{project}`; this server serves no other.",
            facts.sentence()
        ),
        _ => description.to_string(),
    };
    let schema = match tool.addressing() {
        Addressing::ScopeArgument => scope_id_argument::with_scope_id(schema),
        Addressing::DefaultScope | Addressing::Unscoped => schema,
    };
    let annotations = annotations(tool);
    Tool::new(tool.as_str(), description, schema)
        .with_title(tool.title())
        .with_raw_output_schema(output)
        .with_annotations(annotations)
}

/// Every tool, in catalog order, for the workspace directory named `project`.
pub(crate) fn catalog(project: &str, facts: &ShellFacts) -> Vec<Tool> {
    ToolName::ALL
        .iter()
        .map(|&tool| catalog_entry(tool, project, facts))
        .collect()
}

/// One server's catalog, built by the first `tools/list` and cloned for each later one
/// (its schemas are generated and compacted, ~13 ms in a debug build); rebuilt only
/// when the shell facts it states have changed. Held where sessions are served and
/// shared by them.
#[derive(Debug, Default)]
pub(crate) struct CatalogCache(std::sync::Mutex<Option<(ShellFacts, Vec<Tool>)>>);

impl CatalogCache {
    pub fn tools(&self, project: &str, facts: &ShellFacts) -> Vec<Tool> {
        let mut held = crate::lock::lock(&self.0);
        match held.as_ref() {
            Some((built_for, tools)) if built_for == facts => tools.clone(),
            _ => {
                let tools = catalog(project, facts);
                *held = Some((facts.clone(), tools.clone()));
                tools
            }
        }
    }
}

/// Forgets the shell facts when `view` is the default scope's.
fn forget_facts_of(ctx: &ServerContext, view: &scopes::ScopeView) {
    if view.id == marsh_scope_registry::ScopeId::Default {
        ctx.shell_facts.forget();
    }
}

async fn dispatch(
    ctx: &Arc<ServerContext>,
    tool: ToolName,
    session: SessionId,
    mut arguments: Option<Map<String, Value>>,
    request: &CancellationToken,
    progress: &Progress,
) -> ToolResult {
    // The scope an alias or `scope_*` tool works on; `scope_id` is taken out of the
    // arguments so the rest is parsed by the alias's own closed struct.
    let view = match tool.addressing() {
        Addressing::Unscoped => None,
        Addressing::DefaultScope => Some(ctx.scopes.default_alias_view()?),
        Addressing::ScopeArgument => {
            Some(scope_id_argument::take_scope(&ctx.scopes, &mut arguments)?)
        }
    };
    let call = Call {
        session,
        arguments: &arguments,
        request,
        progress,
        host_paths: &ctx.host_paths,
    };
    let scope = || {
        view.as_ref().ok_or_else(|| {
            ToolError::new(
                ErrorKind::Internal,
                format!("{} addresses a scope but none was resolved", tool.as_str()),
            )
        })
    };
    match tool {
        ToolName::Doctor => {
            let _: args::NoArgs = call.parse()?;
            data(doctor::doctor(ctx).await)
        }
        ToolName::Status | ToolName::ScopeStatus => {
            let _: args::NoArgs = call.parse()?;
            data(work_in_scope::status(ctx, scope()?).await)
        }
        ToolName::ResultsList | ToolName::ScopeResultsList => {
            data(work_in_scope::results_list(ctx, call, scope()?).await)
        }
        ToolName::ResultGet | ToolName::ScopeResultGet => {
            data(work_in_scope::result_get(ctx, call, scope()?).await)
        }
        ToolName::ShellRun | ToolName::ScopeRun => {
            data(work_in_scope::run(ctx, call, scope()?).await)
        }
        ToolName::Prewarm | ToolName::ScopePrewarm => {
            data(work_in_scope::workers(ctx, call, scope()?, WorkerStep::Prewarm).await)
        }
        ToolName::WorkersReset | ToolName::ScopeWorkersReset => {
            data(work_in_scope::workers(ctx, call, scope()?, WorkerStep::WorkersReset).await)
        }
        ToolName::ScopeStart => data(scope_lifecycle::scope_start(ctx, call).await),
        ToolName::ScopeList => data(scope_lifecycle::scope_list(ctx, call)),
        // The default scope's settings take effect at its next boot: its facts are
        // read again when next needed.
        ToolName::ScopeReset => {
            forget_facts_of(ctx, scope()?);
            let reply = scope_lifecycle::scope_reset(ctx, call, scope()?).await;
            forget_facts_of(ctx, scope()?);
            data(reply)
        }
        ToolName::ScopeStop => {
            forget_facts_of(ctx, scope()?);
            let reply = scope_lifecycle::scope_stop(ctx, call, scope()?).await;
            forget_facts_of(ctx, scope()?);
            data(reply)
        }
        ToolName::ScopeRemove => data(scope_lifecycle::scope_remove(ctx, call, scope()?).await),
        ToolName::OperationList => data(operation_tools::operation_list(ctx, call)),
        ToolName::OperationGet => data(operation_tools::operation_get(ctx, call).await),
        ToolName::OperationOutput => data(operation_tools::operation_output(ctx, call).await),
        ToolName::OperationCancel => data(operation_tools::operation_cancel(ctx, call).await),
        ToolName::Qualify => data(qualify::qualify(ctx, call).await),
    }
}

/// A handler's typed result as the envelope's `data` and its readable text.
fn data<T: Serialize + Readable>(result: Result<T, ToolError>) -> ToolResult {
    let result = result?;
    let mut text = String::new();
    result.write_text(&mut text);
    let data = serde_json::to_value(result).map_err(|e| {
        ToolError::new(
            ErrorKind::Internal,
            format!("a result could not be serialized: {e}"),
        )
    })?;
    Ok(ToolReply { data, text })
}

/// Dispatches a call. `None` means no such tool (a protocol error for the caller).
pub(crate) async fn call(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    name: &str,
    arguments: Option<Map<String, Value>>,
    request: &CancellationToken,
    progress: &Progress,
) -> Option<CallToolResult> {
    let tool = ToolName::parse(name)?;
    let mut outcome = dispatch(ctx, tool, session, arguments, request, progress).await;
    if let Err(error) = &mut outcome
        && crate::global_cap::is_slot_refusal(error)
    {
        name_live_operations(error, &operation_tools::live_ids(ctx, session));
    }
    ctx.host_paths.redact_outcome(&mut outcome);
    Some(into_call_result(outcome))
}

/// Completes a `capacity_exhausted` refusal with this session's live operations, so
/// an agent that lost their ids can still wait for or cancel them.
fn name_live_operations(error: &mut ToolError, live: &[String]) {
    if live.is_empty() {
        error.message.push_str(
            " None of them is this session's; wait for other sessions' work to end and call again.",
        );
    } else {
        error.message.push_str(&format!(
            " This session's live operations: {}. operation_get (wait_ms) waits for one to end; operation_cancel frees its slot.",
            live.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_the_23_tools_in_order_and_denies_unknown_fields() {
        let tools = catalog("ws", &ShellFacts::UNKNOWN);
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        let expected: Vec<&str> = ToolName::ALL.iter().map(|t| t.as_str()).collect();
        assert_eq!(names, expected);
        assert_eq!(names.len(), 23);
        for t in &tools {
            assert_eq!(
                t.input_schema.get("additionalProperties"),
                Some(&Value::Bool(false)),
                "{}",
                t.name
            );
            let scoped = t
                .input_schema
                .get("required")
                .and_then(Value::as_array)
                .is_some_and(|r| r.contains(&Value::from("scope_id")));
            let tool = ToolName::parse(&t.name).unwrap();
            assert_eq!(
                scoped,
                tool.addressing() == Addressing::ScopeArgument,
                "{}",
                t.name
            );
            assert_eq!(t.title.as_deref(), Some(tool.title()));
            let hints = effective_hints(t.annotations.as_ref().unwrap());
            assert_eq!(
                hints,
                [
                    tool.read_only(),
                    tool.destructive(),
                    tool.idempotent(),
                    tool.open_world()
                ],
                "{}",
                t.name
            );
        }
        let hints =
            |name: ToolName| effective_hints(&tools[name as usize].annotations.clone().unwrap());
        assert!(hints(ToolName::ShellRun)[1]);
        assert!(hints(ToolName::ScopeRemove)[1]);
        assert!(hints(ToolName::Qualify)[1]);
        assert!(!hints(ToolName::Prewarm)[1]);
        assert!(hints(ToolName::Status)[0]);
    }

    /// Every `type` in `schema`, at any depth.
    fn types(schema: &Value, found: &mut Vec<Value>) {
        match schema {
            Value::Object(map) => {
                for (key, value) in map {
                    if key == "type" {
                        found.push(value.clone());
                    }
                    types(value, found);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| types(v, found)),
            _ => {}
        }
    }

    #[test]
    fn optional_parameters_are_plainly_typed_with_a_default() {
        for t in catalog("ws", &ShellFacts::UNKNOWN) {
            let schema = Value::Object((*t.input_schema).clone());
            let mut found = Vec::new();
            types(&schema, &mut found);
            for ty in found {
                assert!(ty.is_string(), "{}: {ty}", t.name);
                assert_ne!(ty, "null", "{}", t.name);
            }
            let required = schema["required"].as_array().cloned().unwrap_or_default();
            if let Some(props) = schema["properties"].as_object() {
                for (name, prop) in props {
                    if !required.contains(&Value::from(name.as_str())) {
                        assert!(prop.get("default").is_some(), "{}.{name}", t.name);
                    }
                    assert!(prop.get("format").is_none(), "{}.{name}", t.name);
                }
            }
        }
        let qualify = catalog("ws", &ShellFacts::UNKNOWN).remove(ToolName::Qualify as usize);
        assert_eq!(qualify.input_schema["properties"]["gate"]["type"], "string");
        assert!(qualify.input_schema.get("$defs").is_none());
        let shell = catalog("ws", &ShellFacts::UNKNOWN).remove(ToolName::ShellRun as usize);
        let props = &shell.input_schema["properties"];
        assert_eq!(props["wait_ms"]["type"], "integer");
        assert_eq!(props["wait_ms"]["default"], args::WAIT.default);
        assert_eq!(props["include_base64"]["type"], "boolean");
        assert_eq!(props["include_base64"]["default"], false);
    }

    /// The facts with the longest sentence.
    fn longest_facts() -> ShellFacts {
        ShellFacts {
            shell: Some("sh".into()),
            network: crate::shell_facts::Network::Loopback,
        }
    }

    /// Every byte of `tools/list` is read by the model each session: at most 32 KiB
    /// with every tool's output schema, also for the longest directory name (255
    /// bytes; shell_run and scope_run name it) and the longest shell facts.
    #[test]
    fn tools_list_stays_small() {
        for project in ["workspace", &"w".repeat(255)] {
            let body = serde_json::json!({"tools": catalog(project, &longest_facts())}).to_string();
            eprintln!("tools/list result: {} bytes", body.len());
            assert!(body.len() <= 32 * 1024, "{} bytes", body.len());
        }
    }

    /// The selector's length bound is stated once, in its pattern.
    #[test]
    fn the_selector_pattern_states_its_length_bound() {
        let get = catalog("ws", &ShellFacts::UNKNOWN).remove(ToolName::ResultGet as usize);
        let pattern = get.input_schema["properties"]["selector"]["pattern"]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            pattern,
            format!("^[0-9a-f-]{{1,{}}}$", args::SELECTOR_MAX_BYTES)
        );
    }

    #[test]
    fn explicit_null_still_means_the_default() {
        let mut arguments = Map::new();
        arguments.insert("command".into(), Value::from("true"));
        arguments.insert("wait_ms".into(), Value::Null);
        arguments.insert("include_base64".into(), Value::Null);
        let parsed: args::ShellRunArgs = args::parse(Some(arguments)).unwrap();
        assert_eq!(
            args::WAIT.check(parsed.wait_ms).unwrap(),
            args::WAIT.default
        );
        assert_eq!(parsed.include_base64, None);
    }
}
