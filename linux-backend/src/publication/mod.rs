//! Published commands: `mcp publish|unpublish|load` (README "Publication").
//!
//! A request is parsed and validated completely ([`cli`], [`PublicationRequest::validate`])
//! before any effect. A transaction ([`transaction`]) runs under the control
//! directory's lock ([`control`]), writes or checks the declaration ([`declaration`])
//! and drives the stock `sbx` ([`sbx`]). Its answer is one of three outcomes:
//! `committed`; `rejected_before_effect` (nothing of the publication changed);
//! `uncertain` (something may have changed and the caller must look).
//!
//! Who may run which transaction: `publish` only the daemon, for a job of its project
//! shell (the request arrives on the agent's channel; kit containers have no agent);
//! `unpublish` and `load` also a host `marsh mcp ...` in its own process.

pub mod cli;
mod control;
mod declaration;
mod names;
mod sbx;
mod settings;
mod transaction;
mod trust;

use serde::{Deserialize, Serialize};

pub use settings::{SBX_VAR, Settings, resolve_sbx};
pub use transaction::Publisher;

use names::{
    MAX_DESCRIPTION_BYTES, MAX_OUTPUT_BYTES, MAX_PIPELINE_BYTES, MAX_TIMEOUT_MS,
    valid_sandbox_name, valid_tool_name,
};

/// How a transaction failed: before any effect, or after one.
#[derive(Debug, thiserror::Error)]
pub enum TxError {
    #[error("{0}")]
    Rejected(String),
    #[error("{0}")]
    Uncertain(String),
}

/// The rule a publication request breaks (checked before any effect).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    #[error(
        "invalid tool name {0:?}: expected 1 to 64 of [A-Za-z0-9_.-], not starting with - and not only dots"
    )]
    ToolName(String),
    #[error("invalid sandbox name {0:?}: expected 1 to 64 of [A-Za-z0-9._-]")]
    SandboxName(String),
    #[error("the description must be 1 to {MAX_DESCRIPTION_BYTES} bytes")]
    Description,
    #[error("--timeout-ms {0} is outside 1..={MAX_TIMEOUT_MS}")]
    Timeout(u64),
    #[error("--max-output-bytes {0} is outside 1..={MAX_OUTPUT_BYTES}")]
    MaxOutput(u64),
    #[error("the pipeline must be 1 to {MAX_PIPELINE_BYTES} bytes")]
    PipelineLength,
    #[error("the pipeline contains a NUL byte")]
    PipelineNul,
}

/// One publication command, validated by [`PublicationRequest::validate`] on both
/// sides (the `mcp` client and the daemon, which trusts nothing from a sandbox).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verb", rename_all = "snake_case", deny_unknown_fields)]
pub enum PublicationRequest {
    Publish {
        tool_name: String,
        description: Option<String>,
        sandbox: Option<String>,
        timeout_ms: u64,
        max_output_bytes: u64,
        pipeline: String,
    },
    Unpublish {
        tool_name: String,
    },
    Load {
        tool_name: String,
        sandbox: String,
    },
}

impl PublicationRequest {
    pub fn tool_name(&self) -> &str {
        match self {
            Self::Publish { tool_name, .. }
            | Self::Unpublish { tool_name }
            | Self::Load { tool_name, .. } => tool_name,
        }
    }

    /// Every rule a request must meet before any effect; the problem otherwise.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        let name = self.tool_name();
        if !valid_tool_name(name) {
            return Err(InvalidRequest::ToolName(name.to_string()));
        }
        let sandbox_ok = |sandbox: &str| {
            if valid_sandbox_name(sandbox) {
                Ok(())
            } else {
                Err(InvalidRequest::SandboxName(sandbox.to_string()))
            }
        };
        match self {
            Self::Publish {
                description,
                sandbox,
                timeout_ms,
                max_output_bytes,
                pipeline,
                ..
            } => {
                if let Some(sandbox) = sandbox {
                    sandbox_ok(sandbox)?;
                }
                if let Some(text) = description
                    && (text.is_empty() || text.len() > MAX_DESCRIPTION_BYTES)
                {
                    return Err(InvalidRequest::Description);
                }
                if !(1..=MAX_TIMEOUT_MS).contains(timeout_ms) {
                    return Err(InvalidRequest::Timeout(*timeout_ms));
                }
                if !(1..=MAX_OUTPUT_BYTES).contains(max_output_bytes) {
                    return Err(InvalidRequest::MaxOutput(*max_output_bytes));
                }
                if pipeline.is_empty() || pipeline.len() > MAX_PIPELINE_BYTES {
                    return Err(InvalidRequest::PipelineLength);
                }
                if pipeline.contains('\0') {
                    return Err(InvalidRequest::PipelineNul);
                }
                Ok(())
            }
            Self::Unpublish { .. } => Ok(()),
            Self::Load { sandbox, .. } => sandbox_ok(sandbox),
        }
    }
}

/// `result` of a publication command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Committed,
    RejectedBeforeEffect,
    Uncertain,
}

/// The one JSON line a publication command prints (field order as in the README).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicationResult {
    pub result: Outcome,
    pub tool_name: Option<String>,
    pub server: Option<String>,
    pub generation: Option<String>,
    /// Only when the tool was loaded into that sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Only when not committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A result plus how the command exits: `usage` marks a rejection of the command
/// line itself (exit 2) rather than of the transaction (exit 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicationAnswer {
    pub result: PublicationResult,
    pub usage: bool,
}

impl PublicationAnswer {
    /// A rejection; `tool_name` only when it is a valid name. `server` stays null: it
    /// depends on the publisher (workspace and home), which the daemon fills in.
    pub fn rejected(tool_name: Option<&str>, reason: impl Into<String>, usage: bool) -> Self {
        let tool_name = tool_name.filter(|n| valid_tool_name(n));
        Self {
            result: PublicationResult {
                result: Outcome::RejectedBeforeEffect,
                tool_name: tool_name.map(str::to_string),
                server: None,
                generation: None,
                sandbox: None,
                reason: Some(reason.into()),
            },
            usage,
        }
    }

    /// The outcome is unknown (the request may have been carried out).
    pub fn uncertain(tool_name: Option<&str>, reason: impl Into<String>) -> Self {
        let mut answer = Self::rejected(tool_name, reason, false);
        answer.result.result = Outcome::Uncertain;
        answer
    }

    /// `marsh mcp publish` from a host terminal.
    pub fn host_publish(tool_name: Option<&str>) -> Self {
        Self::rejected(
            tool_name,
            "publication needs an attached project shell: run `mcp publish ...` inside `marsh -c` (shell_run)",
            true,
        )
    }

    /// 0 only for committed; 2 for a usage rejection; 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match (self.result.result, self.usage) {
            (Outcome::Committed, _) => 0,
            (Outcome::RejectedBeforeEffect, true) => 2,
            _ => 1,
        }
    }

    /// The JSON line (without its newline).
    pub fn line(&self) -> String {
        serde_json::to_string(&self.result).unwrap_or_else(|_| {
            // Serializing plain strings and options cannot fail; keep the contract anyway.
            r#"{"result":"uncertain","tool_name":null,"server":null,"generation":null,"reason":"the answer could not be encoded"}"#.to_string()
        })
    }

    /// Prints the line on stdout and returns the exit code.
    pub fn print(&self) -> i32 {
        use std::io::Write as _;
        if writeln!(std::io::stdout().lock(), "{}", self.line()).is_err() {
            return 1;
        }
        self.exit_code()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn publish(name: &str) -> PublicationRequest {
        PublicationRequest::Publish {
            tool_name: name.into(),
            description: None,
            sandbox: None,
            timeout_ms: 120_000,
            max_output_bytes: 262_144,
            pipeline: "true".into(),
        }
    }

    #[test]
    fn validation_covers_every_bound() {
        assert!(publish("ok").validate().is_ok());
        assert!(publish("-x").validate().is_err());
        let with = |f: &dyn Fn(&mut PublicationRequest)| {
            let mut r = publish("ok");
            f(&mut r);
            r.validate()
        };
        let set = |r: &mut PublicationRequest, t: u64, m: u64, p: &str, d: Option<&str>| {
            if let PublicationRequest::Publish {
                timeout_ms,
                max_output_bytes,
                pipeline,
                description,
                ..
            } = r
            {
                *timeout_ms = t;
                *max_output_bytes = m;
                *pipeline = p.into();
                *description = d.map(str::to_string);
            }
        };
        assert!(with(&|r| set(r, 0, 1, "x", None)).is_err());
        assert!(with(&|r| set(r, 900_001, 1, "x", None)).is_err());
        assert!(with(&|r| set(r, 900_000, 262_144, "x", None)).is_ok());
        assert!(with(&|r| set(r, 1, 262_145, "x", None)).is_err());
        assert!(with(&|r| set(r, 1, 0, "x", None)).is_err());
        assert!(with(&|r| set(r, 1, 1, "", None)).is_err());
        assert!(with(&|r| set(r, 1, 1, &"x".repeat(65_537), None)).is_err());
        assert!(with(&|r| set(r, 1, 1, &"x".repeat(65_536), None)).is_ok());
        assert!(with(&|r| set(r, 1, 1, "x", Some(&"d".repeat(1025)))).is_err());
        assert!(with(&|r| set(r, 1, 1, "x", Some(""))).is_err());
        let load = PublicationRequest::Load {
            tool_name: "t".into(),
            sandbox: "bad name".into(),
        };
        assert!(load.validate().is_err());
    }

    #[test]
    fn answers_print_the_contract_line() {
        let a = PublicationAnswer::rejected(Some("hello"), "no", false);
        assert_eq!(
            a.line(),
            r#"{"result":"rejected_before_effect","tool_name":"hello","server":null,"generation":null,"reason":"no"}"#
        );
        assert_eq!(a.exit_code(), 1);
        let a = PublicationAnswer::rejected(Some("-bad"), "no", true);
        assert_eq!(a.result.tool_name, None);
        assert_eq!(a.exit_code(), 2);
        let wire = serde_json::to_string(&a).unwrap();
        let back: PublicationAnswer = serde_json::from_str(&wire).unwrap();
        assert_eq!(back, a);
    }
}
