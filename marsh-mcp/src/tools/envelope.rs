//! The one result shape every tool returns: `{ok: true, data}` or
//! `{ok: false, error: {kind, message, retryable}}` with `isError: true`.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{Value, json};

use crate::error::ToolResult;

/// Wraps a handler's outcome as an MCP result: the structured envelope, and its
/// readable text (see [`super::readable`] for why it is not the JSON again).
pub fn into_call_result(outcome: ToolResult) -> CallToolResult {
    let (envelope, text, is_error) = match outcome {
        Ok(reply) => (json!({"ok": true, "data": reply.data}), reply.text, false),
        Err(err) => (
            json!({"ok": false, "error": err.to_json()}),
            super::readable::error_text(&err),
            true,
        ),
    };
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(envelope);
    result
}

/// The `error` member of every failed result (export mode's too).
pub fn error_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "kind": {"type": "string"},
            "message": {"type": "string"},
            "retryable": {"type": "boolean"}
        },
        "required": ["kind", "message", "retryable"]
    })
}
