use std::path::PathBuf;
use std::time::Duration;

/// One variant per failing step; each names what it failed on and what to do.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(
        "refusing to run inside a marsh guest ({variable} is set): run marsh mcp install/start/stop from a host terminal"
    )]
    InsideGuest { variable: &'static str },
    #[error("cannot resolve {what} {path}: {source}")]
    Resolve {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} is not set and no HOME is available to derive it")]
    NoHome { what: &'static str },
    #[error(
        "{what} {value:?} is not valid UTF-8 or contains a comma (the sbx --args separator); use a path without commas"
    )]
    UnsafeValue { what: &'static str, value: String },
    #[error("{client} is not installed: {hint}")]
    MissingClient {
        client: &'static str,
        hint: &'static str,
    },
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` did not finish within {after:?}")]
    TimedOut { command: String, after: Duration },
    #[error("`{command}` failed ({code:?}): {diagnostic}")]
    ClientFailed {
        command: String,
        code: Option<i32>,
        diagnostic: String,
    },
    #[error("cannot understand the output of `{command}`: {reason}")]
    Unparseable { command: String, reason: String },
    #[error(
        "{client} already has a different entry named {name} ({difference}); it was left untouched. Remove or rename it yourself, then rerun"
    )]
    Conflict {
        client: &'static str,
        name: String,
        difference: String,
    },
    #[error(
        "{client} wrote {name} but reading it back shows {difference}; the registration cannot be trusted"
    )]
    VerifyFailed {
        client: &'static str,
        name: String,
        difference: String,
    },
    #[error(
        "sbx mcp rm answered something other than success or `MCP server \"{name}\" not found`: {diagnostic}; nothing was added"
    )]
    UnexpectedRemove { name: String, diagnostic: String },
    #[error("cannot read {path}: {reason}")]
    ReadConfig { path: PathBuf, reason: String },
}
