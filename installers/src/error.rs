use std::path::PathBuf;
use std::time::Duration;

use marsh_publication::DeclarationError;

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
    #[error(
        "{name:?} is not a published tool name (1-64 of [A-Za-z0-9_.-], not starting with '-', not dots only)"
    )]
    BadToolName { name: String },
    #[error(
        "cannot locate the publication control directory: MARSH_CONTROL_HOME is not an absolute path and the passwd entry of uid {uid} has no home"
    )]
    NoControlDir { uid: u32 },
    #[error(
        "{tool} is not published: there is no declaration {path} (publish it with `mcp publish {tool} -- 'PIPELINE'` in the project shell of this workspace); nothing was written"
    )]
    NotPublished { tool: String, path: PathBuf },
    #[error(
        "sbx has no registration {server} for the published tool {tool}: publish it again from the project shell; nothing was written"
    )]
    NotRegistered { server: String, tool: String },
    #[error(
        "the sbx registration {server} does not match the publication of {tool} from this workspace and home: {difference}; nothing was written"
    )]
    RegistrationMismatch {
        server: String,
        tool: String,
        difference: String,
    },
    #[error("the publication of {tool} cannot be trusted: {source}; nothing was written")]
    Declaration {
        tool: String,
        source: DeclarationError,
    },
    #[error("the declaration {path} declares the tool {found:?}, not {tool}; nothing was written")]
    DeclarationNames {
        tool: String,
        path: PathBuf,
        found: String,
    },
}
