//! The one result shape every tool returns: `{ok: true, data}` or
//! `{ok: false, error: {kind, message, retryable}}` with `isError: true`.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use serde::Serialize;
use serde_json::{Value, json};

/// Stable snake_case error codes. Callers branch on these; messages are for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    InvalidArgument,
    UnknownScope,
    ScopeNotReady,
    ScopeBusy,
    CapacityExhausted,
    LiveScopeLimit,
    RetainedScopeLimit,
    IdentityInvalid,
    ExecutableChanged,
    BackendFailed,
    NotFound,
    TimedOut,
    Disabled,
    NotOwner,
    UnknownOperation,
    Internal,
}

impl ErrorKind {
    /// Whether the same call may succeed later without anything else changing.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            Self::ScopeBusy | Self::CapacityExhausted | Self::TimedOut
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidArgument => "invalid_argument",
            Self::UnknownScope => "unknown_scope",
            Self::ScopeNotReady => "scope_not_ready",
            Self::ScopeBusy => "scope_busy",
            Self::CapacityExhausted => "capacity_exhausted",
            Self::LiveScopeLimit => "live_scope_limit",
            Self::RetainedScopeLimit => "retained_scope_limit",
            Self::IdentityInvalid => "identity_invalid",
            Self::ExecutableChanged => "executable_changed",
            Self::BackendFailed => "backend_failed",
            Self::NotFound => "not_found",
            Self::TimedOut => "timed_out",
            Self::Disabled => "disabled",
            Self::NotOwner => "not_owner",
            Self::UnknownOperation => "unknown_operation",
            Self::Internal => "internal",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ToolError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "kind": self.kind.as_str(),
            "message": self.message,
            "retryable": self.kind.retryable(),
        })
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

pub type ToolResult = Result<Value, ToolError>;

/// Wraps a handler's outcome as an MCP result: the structured envelope, plus the same
/// JSON as text for clients that ignore `structuredContent`.
pub fn into_call_result(outcome: ToolResult) -> CallToolResult {
    let (envelope, is_error) = match outcome {
        Ok(data) => (json!({"ok": true, "data": data}), false),
        Err(err) => (json!({"ok": false, "error": err.to_json()}), true),
    };
    let text = envelope.to_string();
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(envelope);
    result
}

/// The output schema shared by every tool: the envelope, with `data` left open
/// because each tool documents its own fields in its description.
pub fn envelope_schema() -> Arc<JsonObject> {
    let schema = json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "data": {"type": "object"},
            "error": {
                "type": "object",
                "properties": {
                    "kind": {"type": "string"},
                    "message": {"type": "string"},
                    "retryable": {"type": "boolean"}
                },
                "required": ["kind", "message", "retryable"]
            }
        },
        "required": ["ok"]
    });
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}
