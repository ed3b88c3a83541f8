//! The tool surface: the static catalog (names, descriptions, schemas) and dispatch.

pub mod args;
mod default_scope;
mod doctor;
pub mod envelope;
mod launch;
mod operation_tools;
mod qualify;
pub mod views;

use std::sync::Arc;

use rmcp::model::{CallToolResult, JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::context::ServerContext;
use crate::operations::SessionId;
use envelope::{envelope_schema, into_call_result};

/// Every tool this server exposes, in catalog order.
pub const TOOL_NAMES: &[&str] = &[
    "doctor",
    "status",
    "results_list",
    "result_get",
    "shell_run",
    "prewarm",
    "workers_reset",
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

fn tool<T: JsonSchema>(name: &'static str, description: &'static str, read_only: bool) -> Tool {
    let mut annotations = ToolAnnotations::new();
    annotations.read_only_hint = Some(read_only);
    annotations.destructive_hint = Some(false);
    annotations.open_world_hint = Some(false);
    Tool::new(name, description, schema_of::<T>())
        .with_raw_output_schema(envelope_schema())
        .with_annotations(annotations)
}

pub fn catalog() -> Vec<Tool> {
    use args::*;
    vec![
        tool::<NoArgs>(
            "doctor",
            "Health of this server: pinned executables, scope home identity, sandbox isolation, limits and operation counts. No host paths.",
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
        tool::<ShellRunArgs>(
            "shell_run",
            "Run a command in the default scope's project shell (cwd = the workspace). Returns the complete result inline if it ends within wait_ms; otherwise the operation id, state `running` and the output so far, while the command keeps running. Output fields: stdout_bytes, stdout_text, stdout_text_state (utf8|lossy|omitted|truncated), stdout_base64 when not UTF-8, the same for stderr, and byte cursors.",
            false,
        ),
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

/// Dispatches a call. `None` means no such tool (a protocol error for the caller).
pub async fn call(
    ctx: &ServerContext,
    session: SessionId,
    name: &str,
    arguments: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> Option<CallToolResult> {
    let outcome = match name {
        "doctor" => doctor::doctor(ctx).await,
        "status" => match args::parse::<args::NoArgs>(arguments) {
            Ok(_) => default_scope::status(ctx).await,
            Err(e) => Err(e),
        },
        "results_list" => default_scope::results_list(ctx, arguments).await,
        "result_get" => default_scope::result_get(ctx, arguments).await,
        "shell_run" => default_scope::shell_run(ctx, session, arguments, request).await,
        "prewarm" => default_scope::prewarm(ctx, session, arguments, request).await,
        "workers_reset" => default_scope::workers_reset(ctx, session, arguments, request).await,
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
