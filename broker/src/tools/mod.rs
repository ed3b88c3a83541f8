//! The tool surface: the static catalog (names, descriptions, schemas) and dispatch.

pub mod args;
mod doctor;
pub mod envelope;
mod launch;
mod operation_tools;
mod qualify;
mod scope_lifecycle;
mod scope_work;
mod scoped;
pub mod views;

use std::sync::Arc;

use marsh_scope_registry::ScopeId;
use rmcp::model::{CallToolResult, JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::context::ServerContext;
use crate::operations::{OpKind, SessionId};
use envelope::{ToolResult, envelope_schema, into_call_result};

/// Every tool this server exposes, in catalog order: exactly these 22.
pub const TOOL_NAMES: &[&str] = &[
    "doctor",
    "status",
    "results_list",
    "result_get",
    "shell_run",
    "prewarm",
    "workers_reset",
    "scope_start",
    "scope_list",
    "scope_status",
    "scope_run",
    "scope_results_list",
    "scope_result_get",
    "scope_prewarm",
    "scope_workers_reset",
    "scope_reset",
    "scope_stop",
    "scope_remove",
    "operation_get",
    "operation_output",
    "operation_cancel",
    "qualify",
];

fn schema_of<T: JsonSchema>() -> Arc<JsonObject> {
    let schema = schemars::schema_for!(T);
    match serde_json::to_value(schema) {
        Ok(Value::Object(mut map)) => {
            map.remove("$schema");
            map.remove("title");
            Arc::new(map)
        }
        _ => Arc::new(JsonObject::new()),
    }
}

fn annotated(tool: Tool, read_only: bool) -> Tool {
    let mut annotations = ToolAnnotations::new();
    annotations.read_only_hint = Some(read_only);
    annotations.destructive_hint = Some(false);
    annotations.open_world_hint = Some(false);
    tool.with_raw_output_schema(envelope_schema())
        .with_annotations(annotations)
}

fn tool<T: JsonSchema>(name: &'static str, description: &'static str, read_only: bool) -> Tool {
    annotated(Tool::new(name, description, schema_of::<T>()), read_only)
}

/// The same arguments as `T` plus a required `scope_id`.
fn scoped_tool<T: JsonSchema>(
    name: &'static str,
    description: &'static str,
    read_only: bool,
) -> Tool {
    annotated(
        Tool::new(name, description, scoped::with_scope_id(schema_of::<T>())),
        read_only,
    )
}

const SHELL_RUN_DESCRIPTION: &str = "Run a command in the project shell (cwd = the workspace). Returns the complete result inline if it ends within wait_ms; otherwise the operation id, state `running` and the output so far, while the command keeps running. Output fields: stdout_bytes, stdout_text, stdout_text_state (utf8|lossy|omitted|truncated), stdout_base64 when not UTF-8, the same for stderr, and byte cursors.";

pub fn catalog() -> Vec<Tool> {
    use args::*;
    vec![
        tool::<NoArgs>(
            "doctor",
            "Health of this server: pinned executables, scope home identity, sandbox isolation, registry, limits and operation counts. No host paths.",
            true,
        ),
        tool::<NoArgs>(
            "status",
            "State of the default scope and its marsh runtime (daemon, project shell, kit workers, active jobs).",
            true,
        ),
        tool::<ResultsListArgs>(
            "results_list",
            "Newest durable result receipts of the default scope.",
            true,
        ),
        tool::<ResultGetArgs>(
            "result_get",
            "One durable result receipt of the default scope, by id or unique id prefix.",
            true,
        ),
        tool::<ShellRunArgs>("shell_run", SHELL_RUN_DESCRIPTION, false),
        tool::<SelectionArgs>(
            "prewarm",
            "Warm the selected kit workers of the default scope (an operation).",
            false,
        ),
        tool::<SelectionArgs>(
            "workers_reset",
            "Reset the selected kit workers of the default scope to cold (an operation); refused while they have active work.",
            false,
        ),
        tool::<NoArgs>(
            "scope_start",
            "Create a private development scope (own home, daemon, project shell, workers) over this workspace and boot it. Returns its opaque id and the boot operation. Managed mode only; at most 16 live and 128 retained generated scopes.",
            false,
        ),
        tool::<NoArgs>(
            "scope_list",
            "Every scope of this server (default first) with its persisted state.",
            true,
        ),
        scoped_tool::<NoArgs>(
            "scope_status",
            "State of one scope. A ready scope's runtime is probed; a stopped one is absent; failed or transitioning ones report their persisted state without probing.",
            true,
        ),
        scoped_tool::<ShellRunArgs>("scope_run", SHELL_RUN_DESCRIPTION, false),
        scoped_tool::<ResultsListArgs>(
            "scope_results_list",
            "Newest durable receipts of one scope. Reading a stopped scope takes exclusive access and always ends with an exact stop.",
            true,
        ),
        scoped_tool::<ResultGetArgs>(
            "scope_result_get",
            "One durable receipt of one scope, by id or unique prefix.",
            true,
        ),
        scoped_tool::<SelectionArgs>(
            "scope_prewarm",
            "Warm the selected kit workers of one ready scope (an operation).",
            false,
        ),
        scoped_tool::<SelectionArgs>(
            "scope_workers_reset",
            "Reset the selected kit workers of one ready scope to cold (an operation).",
            false,
        ),
        scoped_tool::<WaitArgs>(
            "scope_reset",
            "Boot, reset and re-validate one scope (an operation): the recovery path from failed, and revival from stopped. Refused while work is active.",
            false,
        ),
        scoped_tool::<WaitArgs>(
            "scope_stop",
            "Boot-validate then exactly stop one scope's runtime (an operation), keeping its home and receipts. Refused while work is active.",
            false,
        ),
        scoped_tool::<WaitArgs>(
            "scope_remove",
            "Delete a stopped generated scope's home with a bounded no-follow walk and free its record (an operation).",
            false,
        ),
        tool::<OperationGetArgs>(
            "operation_get",
            "State of one of this session's operations; wait_ms waits for it to end.",
            true,
        ),
        tool::<OperationOutputArgs>(
            "operation_output",
            "Read an operation's captured output, while running or after, with byte cursors (since_seq -> next_seq) or tail_lines.",
            true,
        ),
        tool::<OperationCancelArgs>(
            "operation_cancel",
            "Cancel one of this session's operations. Always ends in cancellation_uncertain: signal delivery does not prove the sandbox work stopped.",
            false,
        ),
        tool::<QualifyArgs>(
            "qualify",
            "Run the repository's fixed qualification recipe (/usr/bin/make test|acceptance-smoke|acceptance|perf) in the workspace as the host user. Disabled unless the server was started with --allow-full-sbx-control.",
            false,
        ),
    ]
}

async fn default_scope_call(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    name: &str,
    arguments: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let view = ctx.scopes.view(ScopeId::Default)?;
    scope_call(ctx, session, name, &view, arguments, request).await
}

async fn scope_call(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    name: &str,
    view: &crate::scopes::ScopeView,
    arguments: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    match name {
        "status" | "scope_status" => {
            let _: args::NoArgs = args::parse(arguments)?;
            scope_work::status(ctx, view).await
        }
        "results_list" | "scope_results_list" => {
            scope_work::results_list(ctx, view, arguments).await
        }
        "result_get" | "scope_result_get" => scope_work::result_get(ctx, view, arguments).await,
        "shell_run" | "scope_run" => scope_work::run(ctx, session, view, arguments, request).await,
        "prewarm" | "scope_prewarm" => {
            scope_work::workers(ctx, session, view, arguments, request, OpKind::Prewarm).await
        }
        "workers_reset" | "scope_workers_reset" => {
            scope_work::workers(ctx, session, view, arguments, request, OpKind::WorkersReset).await
        }
        "scope_reset" => scope_lifecycle::scope_reset(ctx, session, view, arguments, request).await,
        "scope_stop" => scope_lifecycle::scope_stop(ctx, session, view, arguments, request).await,
        "scope_remove" => {
            scope_lifecycle::scope_remove(ctx, session, view, arguments, request).await
        }
        _ => Err(envelope::ToolError::new(
            envelope::ErrorKind::Internal,
            format!("{name} is not a scope tool"),
        )),
    }
}

/// Dispatches a call. `None` means no such tool (a protocol error for the caller).
pub async fn call(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    name: &str,
    mut arguments: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> Option<CallToolResult> {
    let outcome = match name {
        "doctor" => match args::parse::<args::NoArgs>(arguments) {
            Ok(_) => doctor::doctor(ctx).await,
            Err(e) => Err(e),
        },
        "status" | "results_list" | "result_get" | "shell_run" | "prewarm" | "workers_reset" => {
            default_scope_call(ctx, session, name, arguments, request).await
        }
        "scope_start" => scope_lifecycle::scope_start(ctx, session, arguments, request).await,
        "scope_list" => scope_lifecycle::scope_list(ctx, arguments),
        "scope_status"
        | "scope_run"
        | "scope_results_list"
        | "scope_result_get"
        | "scope_prewarm"
        | "scope_workers_reset"
        | "scope_reset"
        | "scope_stop"
        | "scope_remove" => match scoped::take_scope(&ctx.scopes, &mut arguments) {
            Ok(view) => scope_call(ctx, session, name, &view, arguments, request).await,
            Err(e) => Err(e),
        },
        "operation_get" => operation_tools::operation_get(ctx, session, arguments, request).await,
        "operation_output" => operation_tools::operation_output(ctx, session, arguments).await,
        "operation_cancel" => {
            operation_tools::operation_cancel(ctx, session, arguments, request).await
        }
        "qualify" => qualify::qualify(ctx, session, arguments, request).await,
        _ => return None,
    };
    Some(into_call_result(outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_matches_names_and_denies_unknown_fields() {
        let tools = catalog();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, TOOL_NAMES);
        for t in &tools {
            assert_eq!(
                t.input_schema.get("additionalProperties"),
                Some(&Value::Bool(false)),
                "{}",
                t.name
            );
        }
    }
}
