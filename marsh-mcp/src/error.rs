//! The tool error type: a stable snake_case `kind` callers branch on, and a message
//! for people. Every layer below the tools (admission, operations, scopes, the marsh
//! driver) reports in this type, so it lives here rather than in `tools/`.

use serde::Serialize;
use serde_json::{Value, json};

/// Stable snake_case error codes. Callers branch on these; messages are for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
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
    /// Export mode: the declaration this server started from changed or vanished.
    PublicationChanged,
    Internal,
}

impl ErrorKind {
    /// Whether the same call may succeed later without anything else changing. A
    /// timeout is not: the same command with the same limit times out again.
    pub fn retryable(self) -> bool {
        matches!(self, Self::ScopeBusy | Self::CapacityExhausted)
    }

    pub fn as_str(self) -> &'static str {
        self.into()
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

/// Bytes of a caller's input an error message repeats.
const ECHO_MAX: usize = 256;

/// `text` from a caller's input as an error message may repeat it: whole when short,
/// else its first [`ECHO_MAX`] bytes (cut on a character boundary) and its length, so
/// a refusal of a huge argument is not itself huge.
pub fn echo_excerpt(text: &str) -> String {
    if text.len() <= ECHO_MAX {
        return text.to_owned();
    }
    let end = text.floor_char_boundary(ECHO_MAX);
    format!("{}… ({} bytes in all)", &text[..end], text.len())
}

/// A successful call's result: the typed data (`structuredContent.data`) and its
/// readable text (`content[0].text`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    pub data: Value,
    pub text: String,
}

pub type ToolResult = Result<ToolReply, ToolError>;
