//! Tool inputs. Every struct denies unknown fields; serde rejects wrong types and
//! the `validate` functions enforce the bounds the schemas advertise, before anything
//! touches a child process.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::envelope::ToolError;

pub const COMMAND_MAX_BYTES: usize = 65536;
pub const TIMEOUT_MIN_MS: u64 = 10;
pub const TIMEOUT_MAX_MS: u64 = 900_000;
pub const TIMEOUT_DEFAULT_MS: u64 = 120_000;
pub const WAIT_DEFAULT_MS: u64 = 15_000;
/// Below typical client request timeouts (60 s), with room for the response.
pub const WAIT_MAX_MS: u64 = 55_000;
pub const MAX_BYTES_DEFAULT: u64 = 65_536;
/// Keeps any response, base64 included, well under the 1 MiB frame cap.
pub const MAX_BYTES_LIMIT: u64 = 262_144;
pub const TAIL_LINES_MAX: u64 = 10_000;
pub const SELECTION_MAX_NAMES: usize = 16;
pub const QUALIFY_TIMEOUT_DEFAULT_MS: u64 = 900_000;

pub fn parse<T: DeserializeOwned>(arguments: Option<Map<String, Value>>) -> Result<T, ToolError> {
    let value = Value::Object(arguments.unwrap_or_default());
    serde_json::from_value(value).map_err(|e| ToolError::invalid(format!("invalid arguments: {e}")))
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// Run one command in the default scope's project shell.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellRunArgs {
    /// Shell command for the project shell (not a host shell). 1..65536 bytes, no NUL
    /// or control characters other than tab, newline and carriage return.
    #[schemars(length(min = 1, max = 65536))]
    pub command: String,
    /// Kill the command after this many milliseconds (10..900000, default 120000).
    #[schemars(range(min = 10, max = 900000))]
    pub timeout_ms: Option<u64>,
    /// Return inline if the command ends within this many milliseconds (0..55000,
    /// default 15000); otherwise return the operation id and the output so far.
    #[schemars(range(min = 0, max = 55000))]
    pub wait_ms: Option<u64>,
    /// Output bytes to include in this response (1..262144, default 65536).
    #[schemars(range(min = 1, max = 262144))]
    pub max_bytes: Option<u64>,
    /// Include `*_base64` views even when the output is valid UTF-8.
    pub include_base64: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultsListArgs {
    /// Newest receipts to return (1..100, default 20).
    #[schemars(range(min = 1, max = 100))]
    pub limit: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResultGetArgs {
    /// A receipt id or unique prefix: 1..64 of `[0-9a-f-]`.
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[0-9a-f-]{1,64}$"))]
    pub selector: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SelectionArgs {
    /// `all` or up to 16 comma-separated kit names `[a-z0-9-]{1,64}` (default `all`).
    pub selection: Option<String>,
    /// Wait up to this many milliseconds for the operation to end (0..55000, default 15000).
    #[schemars(range(min = 0, max = 55000))]
    pub wait_ms: Option<u64>,
}

/// Whole-scope lifecycle calls: only how long to wait for the operation.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// Wait up to this many milliseconds for the operation to end (0..55000, default 15000).
    #[schemars(range(min = 0, max = 55000))]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperationGetArgs {
    /// The opaque id returned when the operation was created.
    pub operation_id: String,
    /// Wait up to this many milliseconds for the operation to end (0..55000, default 0).
    #[schemars(range(min = 0, max = 55000))]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperationOutputArgs {
    pub operation_id: String,
    /// Byte cursor: pass the previous response's `next_seq` (default 0 = from the start).
    pub since_seq: Option<u64>,
    /// Instead of reading forward, return the newest N lines of each stream (1..10000).
    #[schemars(range(min = 1, max = 10000))]
    pub tail_lines: Option<u64>,
    /// Output bytes to include (1..262144, default 65536).
    #[schemars(range(min = 1, max = 262144))]
    pub max_bytes: Option<u64>,
    /// Include `*_base64` views even when the output is valid UTF-8.
    pub include_base64: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperationCancelArgs {
    pub operation_id: String,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    Source,
    Smoke,
    Full,
    Perf,
}

impl Gate {
    /// The fixed make target of each gate; nothing else can be run.
    pub fn make_target(self) -> &'static str {
        match self {
            Self::Source => "test",
            Self::Smoke => "acceptance-smoke",
            Self::Full => "acceptance",
            Self::Perf => "perf",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QualifyArgs {
    pub gate: Gate,
    /// 10..900000 ms, default 900000.
    #[schemars(range(min = 10, max = 900000))]
    pub timeout_ms: Option<u64>,
    #[schemars(range(min = 0, max = 55000))]
    pub wait_ms: Option<u64>,
}

pub fn command(command: &str) -> Result<&str, ToolError> {
    if command.is_empty() || command.len() > COMMAND_MAX_BYTES {
        return Err(ToolError::invalid(format!(
            "command must be 1..{COMMAND_MAX_BYTES} bytes, got {}",
            command.len()
        )));
    }
    if let Some(bad) = command
        .bytes()
        .find(|b| (*b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r')) || *b == 0x7f)
    {
        return Err(ToolError::invalid(format!(
            "command contains the control byte 0x{bad:02x}; only tab, newline and carriage return are allowed"
        )));
    }
    Ok(command)
}

pub fn bounded(
    name: &str,
    value: Option<u64>,
    min: u64,
    max: u64,
    default: u64,
) -> Result<u64, ToolError> {
    let v = value.unwrap_or(default);
    if v < min || v > max {
        return Err(ToolError::invalid(format!(
            "{name} must be {min}..{max}, got {v}"
        )));
    }
    Ok(v)
}

pub fn wait(value: Option<u64>, default: u64) -> Result<std::time::Duration, ToolError> {
    bounded("wait_ms", value, 0, WAIT_MAX_MS, default).map(std::time::Duration::from_millis)
}

pub fn timeout(value: Option<u64>, default: u64) -> Result<std::time::Duration, ToolError> {
    bounded("timeout_ms", value, TIMEOUT_MIN_MS, TIMEOUT_MAX_MS, default)
        .map(std::time::Duration::from_millis)
}

pub fn max_bytes(value: Option<u64>) -> Result<usize, ToolError> {
    bounded("max_bytes", value, 1, MAX_BYTES_LIMIT, MAX_BYTES_DEFAULT).map(|v| v as usize)
}

pub fn selection(selection: Option<&str>) -> Result<String, ToolError> {
    let sel = selection.unwrap_or("all");
    if sel == "all" {
        return Ok(sel.to_owned());
    }
    let names: Vec<&str> = sel.split(',').collect();
    if names.len() > SELECTION_MAX_NAMES {
        return Err(ToolError::invalid(format!(
            "selection names at most {SELECTION_MAX_NAMES} kits, got {}",
            names.len()
        )));
    }
    for name in &names {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok || *name == "all" {
            return Err(ToolError::invalid(format!(
                "selection must be `all` or comma-separated names of [a-z0-9-]{{1,64}}; {name:?} is not"
            )));
        }
    }
    Ok(sel.to_owned())
}

pub fn selector(selector: &str) -> Result<&str, ToolError> {
    let ok = !selector.is_empty()
        && selector.len() <= 64
        && selector
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-');
    if !ok {
        return Err(ToolError::invalid("selector must be 1..64 of [0-9a-f-]"));
    }
    Ok(selector)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rejects_unknown_fields_types_and_bounds() {
        let obj = |v: Value| v.as_object().cloned();
        assert!(parse::<ShellRunArgs>(obj(json!({"command": "ls", "cwd": "/"}))).is_err());
        assert!(parse::<ShellRunArgs>(obj(json!({"command": 5}))).is_err());
        assert!(parse::<ShellRunArgs>(obj(json!({"command": "ls", "timeout_ms": -1}))).is_err());
        assert!(command("a\0b").is_err());
        assert!(command("printf 'a\\tb'\n").is_ok());
        assert!(command(&"x".repeat(COMMAND_MAX_BYTES + 1)).is_err());
        assert!(bounded("timeout_ms", Some(9), 10, 900_000, 1).is_err());
        assert!(selection(Some("a,b-2")).is_ok());
        assert!(selection(Some("A")).is_err());
        assert!(selection(Some(&vec!["k"; 17].join(","))).is_err());
        assert!(selector("0123abcd-").is_ok());
        assert!(selector("../x").is_err());
    }
}
