//! Tool inputs. Every struct denies unknown fields; serde rejects wrong types and
//! the `validate` functions enforce the bounds the schemas advertise, before anything
//! touches a child process.

use std::time::Duration;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::ToolError;

/// An integer argument's range and default: the one statement of them. The schemas'
/// `minimum`/`maximum`/`default` and the validation both read these constants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bound {
    pub name: &'static str,
    pub min: u64,
    pub max: u64,
    pub default: u64,
}

impl Bound {
    /// The value, or the default when absent; out of range is `invalid_argument`.
    pub(crate) fn check(self, value: Option<u64>) -> Result<u64, ToolError> {
        let v = value.unwrap_or(self.default);
        if v < self.min || v > self.max {
            return Err(ToolError::invalid(format!(
                "{} must be {}..{}, got {v}",
                self.name, self.min, self.max
            )));
        }
        Ok(v)
    }

    pub(crate) fn duration(self, value: Option<u64>) -> Result<Duration, ToolError> {
        self.check(value).map(Duration::from_millis)
    }

    /// The same range with another default.
    const fn defaulting_to(self, default: u64) -> Self {
        Self { default, ..self }
    }
}

pub(crate) const TIMEOUT: Bound = Bound {
    name: "timeout_ms",
    min: 10,
    max: 900_000,
    default: 120_000,
};
/// Below typical client request timeouts (60 s), with room for the response.
pub(crate) const WAIT: Bound = Bound {
    name: "wait_ms",
    min: 0,
    max: 55_000,
    default: 15_000,
};
/// `operation_get` answers at once unless asked to wait.
pub(crate) const OPERATION_WAIT: Bound = WAIT.defaulting_to(0);
pub(crate) const QUALIFY_TIMEOUT: Bound = TIMEOUT.defaulting_to(900_000);
pub(crate) const QUALIFY_WAIT: Bound = WAIT.defaulting_to(0);
/// Keeps any response, base64 included, well under the 1 MiB frame cap.
pub(crate) const MAX_BYTES: Bound = Bound {
    name: "max_bytes",
    min: 1,
    max: 262_144,
    default: 65_536,
};
/// 0 (the default) reads forward from `since_seq` instead.
pub(crate) const TAIL_LINES: Bound = Bound {
    name: "tail_lines",
    min: 0,
    max: 10_000,
    default: 0,
};
pub(crate) const RESULTS_LIMIT: Bound = Bound {
    name: "limit",
    min: 1,
    max: 100,
    default: 20,
};
/// Up to every record the server retains.
pub(crate) const OPERATIONS_LIMIT: Bound = Bound {
    name: "limit",
    min: 1,
    max: crate::operations::RETAINED_OPERATIONS as u64,
    default: 20,
};
pub(crate) const COMMAND_MAX_BYTES: usize = 65_536;
pub(crate) const SELECTOR_MAX_BYTES: usize = 64;
pub(crate) const SELECTION_MAX_NAMES: usize = 16;
pub(crate) const KIT_NAME_MAX_BYTES: usize = 64;

/// The arguments as `T`. A number with a zero fraction (`100.0`, `1e3`) is an integer
/// to JSON Schema, so it is handed to serde as one; serde's message, which can repeat
/// a huge argument, is bounded.
pub(crate) fn parse<T: DeserializeOwned>(
    arguments: Option<Map<String, Value>>,
) -> Result<T, ToolError> {
    let mut arguments = arguments.unwrap_or_default();
    arguments.values_mut().for_each(as_integer_when_integral);
    serde_json::from_value(Value::Object(arguments)).map_err(|e| {
        ToolError::invalid(format!(
            "invalid arguments: {}",
            crate::error::echo_excerpt(&e.to_string())
        ))
    })
}

/// Integers exactly representable in a double (|n| < 2^53); larger floats are left
/// for serde to refuse, as their integer value is not what the caller wrote.
const EXACT_INTEGER_BOUND: f64 = 9_007_199_254_740_992.0;

fn as_integer_when_integral(value: &mut Value) {
    let Some(float) = value.as_f64().filter(|_| value.is_f64()) else {
        return;
    };
    if float.fract() != 0.0 || float.abs() >= EXACT_INTEGER_BOUND {
        return;
    }
    *value = if float < 0.0 {
        Value::from(float as i64)
    } else {
        Value::from(float as u64)
    };
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

/// Run one command in a scope's project shell.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShellRunArgs {
    /// Command for the project shell (not a host shell); no NUL or control characters
    /// but tab, newline and CR.
    #[schemars(length(min = 1, max = COMMAND_MAX_BYTES))]
    pub command: String,
    /// Kill the command after this many milliseconds.
    #[schemars(range(min = TIMEOUT.min, max = TIMEOUT.max), extend("default" = TIMEOUT.default))]
    pub timeout_ms: Option<u64>,
    /// Answer inline if it ends within this many ms, else with its id and output so far.
    #[schemars(range(min = WAIT.min, max = WAIT.max), extend("default" = WAIT.default))]
    pub wait_ms: Option<u64>,
    /// Output bytes to include in this response.
    #[schemars(range(min = MAX_BYTES.min, max = MAX_BYTES.max), extend("default" = MAX_BYTES.default))]
    pub max_bytes: Option<u64>,
    /// Include `*_base64` views even when the output is valid UTF-8.
    #[schemars(extend("default" = false))]
    pub include_base64: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultsListArgs {
    /// Newest receipts to return.
    #[schemars(range(min = RESULTS_LIMIT.min, max = RESULTS_LIMIT.max), extend("default" = RESULTS_LIMIT.default))]
    pub limit: Option<u64>,
    /// A stopped scope's read is an operation: answer inline if it ends within this
    /// many ms, else with the operation.
    #[schemars(range(min = WAIT.min, max = WAIT.max), extend("default" = WAIT.default))]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResultGetArgs {
    /// A receipt id or unique prefix of `[0-9a-f-]`.
    // The pattern states the length too: SELECTOR_MAX_BYTES (a unit test ties them).
    #[schemars(regex(pattern = r"^[0-9a-f-]{1,64}$"))]
    pub selector: String,
    /// A stopped scope's read is an operation: answer inline if it ends within this
    /// many ms, else with the operation.
    #[schemars(range(min = WAIT.min, max = WAIT.max), extend("default" = WAIT.default))]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SelectionArgs {
    /// `all` or up to 16 comma-separated kit names.
    #[schemars(extend("default" = "all"))]
    pub selection: Option<String>,
    /// Wait up to this many milliseconds for the operation to end.
    #[schemars(range(min = WAIT.min, max = WAIT.max), extend("default" = WAIT.default))]
    pub wait_ms: Option<u64>,
}

/// Whole-scope lifecycle calls: only how long to wait for the operation.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitArgs {
    /// Wait up to this many milliseconds for the operation to end.
    #[schemars(range(min = WAIT.min, max = WAIT.max), extend("default" = WAIT.default))]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OperationListArgs {
    /// Newest operations to list.
    #[schemars(range(min = OPERATIONS_LIMIT.min, max = OPERATIONS_LIMIT.max), extend("default" = OPERATIONS_LIMIT.default))]
    pub limit: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OperationGetArgs {
    /// The opaque id returned when the operation was created.
    pub operation_id: String,
    /// Wait up to this many milliseconds for the operation to end.
    #[schemars(range(min = OPERATION_WAIT.min, max = OPERATION_WAIT.max), extend("default" = OPERATION_WAIT.default))]
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OperationOutputArgs {
    /// The opaque id returned when the operation was created.
    pub operation_id: String,
    /// Byte cursor: pass the previous response's `next_seq` (0 = from the start).
    #[schemars(extend("default" = 0))]
    pub since_seq: Option<u64>,
    /// Return the newest N lines of each stream instead of reading forward (0 = read
    /// forward); not together with since_seq.
    #[schemars(range(min = TAIL_LINES.min, max = TAIL_LINES.max), extend("default" = TAIL_LINES.default))]
    pub tail_lines: Option<u64>,
    /// Output bytes to include.
    #[schemars(range(min = MAX_BYTES.min, max = MAX_BYTES.max), extend("default" = MAX_BYTES.default))]
    pub max_bytes: Option<u64>,
    /// Include `*_base64` views even when the output is valid UTF-8.
    #[schemars(extend("default" = false))]
    pub include_base64: Option<bool>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct OperationCancelArgs {
    pub operation_id: String,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Gate {
    Source,
    Smoke,
    Full,
    Perf,
}

impl Gate {
    /// The fixed make target of each gate; nothing else can be run.
    pub(crate) fn make_target(self) -> &'static str {
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
pub(crate) struct QualifyArgs {
    pub gate: Gate,
    /// Kill the recipe after this many milliseconds.
    #[schemars(range(min = QUALIFY_TIMEOUT.min, max = QUALIFY_TIMEOUT.max), extend("default" = QUALIFY_TIMEOUT.default))]
    pub timeout_ms: Option<u64>,
    /// Wait up to this many milliseconds for the operation to end.
    #[schemars(range(min = QUALIFY_WAIT.min, max = QUALIFY_WAIT.max), extend("default" = QUALIFY_WAIT.default))]
    pub wait_ms: Option<u64>,
}

pub(crate) fn command(command: &str) -> Result<&str, ToolError> {
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

pub(crate) fn max_bytes(value: Option<u64>) -> Result<usize, ToolError> {
    MAX_BYTES.check(value).map(|v| v as usize)
}

pub(crate) fn selection(selection: Option<&str>) -> Result<String, ToolError> {
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
        // A leading `-` would read as a flag on marsh's command line.
        let ok = !name.is_empty()
            && !name.starts_with('-')
            && name.len() <= KIT_NAME_MAX_BYTES
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok || *name == "all" {
            return Err(ToolError::invalid(format!(
                "selection must be `all` or comma-separated names of [a-z0-9-]{{1,{KIT_NAME_MAX_BYTES}}} not starting with `-`; {name:?} is not"
            )));
        }
    }
    Ok(sel.to_owned())
}

pub(crate) fn selector(selector: &str) -> Result<&str, ToolError> {
    // A receipt id starts with a hex digit; a leading `-` would read as a flag.
    let ok = !selector.is_empty()
        && !selector.starts_with('-')
        && selector.len() <= SELECTOR_MAX_BYTES
        && selector
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-');
    if !ok {
        return Err(ToolError::invalid(format!(
            "selector must be 1..{SELECTOR_MAX_BYTES} of [0-9a-f-], not starting with `-`"
        )));
    }
    Ok(selector)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn integral_numbers_are_integers_and_refusals_are_bounded() {
        let parsed: ShellRunArgs = parse(Some(
            json!({"command": "true", "timeout_ms": 100.0, "wait_ms": 1e3, "max_bytes": -0.0})
                .as_object()
                .cloned()
                .unwrap(),
        ))
        .unwrap();
        assert_eq!(
            (parsed.timeout_ms, parsed.wait_ms, parsed.max_bytes),
            (Some(100), Some(1000), Some(0))
        );
        for fractional in [json!(100.5), json!(1e300)] {
            let args = json!({"command": "true", "timeout_ms": fractional});
            assert!(parse::<ShellRunArgs>(args.as_object().cloned()).is_err());
        }
        let huge = json!({"limit": "9".repeat(900_000)});
        let error = parse::<ResultsListArgs>(huge.as_object().cloned()).unwrap_err();
        assert!(error.message.len() < 400, "{}", error.message.len());
        assert!(error.message.contains("bytes in all)"), "{}", error.message);
    }

    #[test]
    fn schemas_state_the_same_bounds_the_validation_enforces() {
        let schema = serde_json::to_value(schemars::schema_for!(ShellRunArgs)).unwrap();
        let props = &schema["properties"];
        assert_eq!(props["timeout_ms"]["minimum"], TIMEOUT.min);
        assert_eq!(props["timeout_ms"]["maximum"], TIMEOUT.max);
        assert_eq!(props["timeout_ms"]["default"], TIMEOUT.default);
        assert_eq!(props["wait_ms"]["maximum"], WAIT.max);
        assert_eq!(props["max_bytes"]["maximum"], MAX_BYTES.max);
        assert_eq!(props["command"]["maxLength"], COMMAND_MAX_BYTES);
        let get = serde_json::to_value(schemars::schema_for!(OperationGetArgs)).unwrap();
        assert_eq!(get["properties"]["wait_ms"]["default"], 0);
    }

    #[test]
    fn rejects_unknown_fields_types_and_bounds() {
        let obj = |v: Value| v.as_object().cloned();
        assert!(parse::<ShellRunArgs>(obj(json!({"command": "ls", "cwd": "/"}))).is_err());
        assert!(parse::<ShellRunArgs>(obj(json!({"command": 5}))).is_err());
        assert!(parse::<ShellRunArgs>(obj(json!({"command": "ls", "timeout_ms": -1}))).is_err());
        assert!(command("a\0b").is_err());
        assert!(command("printf 'a\\tb'\n").is_ok());
        assert!(command(&"x".repeat(COMMAND_MAX_BYTES + 1)).is_err());
        assert!(TIMEOUT.check(Some(9)).is_err());
        assert_eq!(TIMEOUT.check(None).unwrap(), 120_000);
        assert_eq!(OPERATION_WAIT.check(None).unwrap(), 0);
        assert!(WAIT.check(Some(WAIT.max + 1)).is_err());
        assert!(selection(Some("a,b-2")).is_ok());
        assert!(selection(Some("A")).is_err());
        assert!(selection(Some(&vec!["k"; 17].join(","))).is_err());
        assert!(selector("0123abcd-").is_ok());
        assert!(selector("../x").is_err());
        // Nothing that marsh could read as a flag.
        assert!(selection(Some("--all")).is_err());
        assert!(selection(Some("a,-b")).is_err());
        assert!(selector("-c").is_err());
        assert!(selector("--json").is_err());
    }
}
