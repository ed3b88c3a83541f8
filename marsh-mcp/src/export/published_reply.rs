//! The published tool's result: `{ok, data}` for a run (`ok` = outcome is success),
//! `{ok: false, error}` for a call that ran nothing. `isError` = not `ok`.
//!
//! Size: the base64 streams are authoritative and always present; each stream is at
//! most 262144 bytes, so both encode to under 700 KB. Text views are the only part
//! that can push a response over [`RESPONSE_BUDGET`] (a control-character-heavy view
//! escapes to six bytes per byte); they are dropped (state `omitted`), stderr's
//! first, until the response fits. The text content block is a readable rendering
//! (the outcome, then the text views as raw text), so the budget counts both blocks.

use std::sync::Arc;

use base64::Engine;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use serde_json::{Map, Value, json};

use super::run::RunReport;
use crate::error::ToolError;
use crate::tools::error_schema;

/// Bytes of structured content plus text content one response may carry.
const RESPONSE_BUDGET: usize = 960 * 1024;

/// The text view of `bytes` and its state.
fn text_view(bytes: &[u8], truncated: bool) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) if truncated => (text.to_owned(), "truncated"),
        Ok(text) => (text.to_owned(), "utf8"),
        // A cut inside a multi-byte character is a truncation, not bad text.
        Err(e) if truncated && e.error_len().is_none() => (
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
            "truncated",
        ),
        Err(_) => (String::from_utf8_lossy(bytes).into_owned(), "lossy"),
    }
}

fn stream_fields(data: &mut Map<String, Value>, name: &str, bytes: &[u8], truncated: bool) {
    let (text, state) = text_view(bytes, truncated);
    data.insert(
        format!("{name}_base64"),
        Value::from(base64::engine::general_purpose::STANDARD.encode(bytes)),
    );
    data.insert(format!("{name}_text"), Value::from(text));
    data.insert(format!("{name}_text_state"), Value::from(state));
    data.insert(format!("{name}_truncated"), Value::from(truncated));
}

/// The `data` object of a run.
pub fn run_data(tool_name: &str, report: &RunReport) -> Map<String, Value> {
    let mut data = Map::new();
    data.insert("tool_name".into(), Value::from(tool_name));
    data.insert("outcome".into(), Value::from(report.outcome.as_str()));
    data.insert("exit_code".into(), json!(report.exit_code));
    data.insert("signal".into(), json!(report.signal));
    stream_fields(&mut data, "stdout", &report.stdout, report.stdout_truncated);
    stream_fields(&mut data, "stderr", &report.stderr, report.stderr_truncated);
    data.insert(
        "output_complete".into(),
        Value::from(report.output_complete),
    );
    data.insert(
        "cleanup_certainty".into(),
        Value::from(report.cleanup.as_str()),
    );
    if let Some(host) = report.host_cleanup {
        data.insert("host_cleanup_certainty".into(), Value::from(host.as_str()));
    }
    if let Some(receipt) = &report.receipt {
        data.insert("receipt_selector".into(), Value::from(receipt.as_str()));
    }
    data.insert("duration_ms".into(), Value::from(report.duration_ms));
    if let Some(failure) = &report.failure {
        data.insert("failure".into(), Value::from(failure.as_str()));
    }
    data
}

/// `content[0].text`: what happened on the first line, then each stream's text view
/// as raw text (or what it is when it is not text), then cleanup and failure.
fn readable(envelope: &Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if let Some(error) = envelope.get("error") {
        let field = |name: &str| error.get(name).and_then(Value::as_str).unwrap_or("");
        let _ = writeln!(out, "Error ({}): {}", field("kind"), field("message"));
        return out;
    }
    let data = envelope.get("data").cloned().unwrap_or(Value::Null);
    let text = |name: &str| data.get(name).and_then(Value::as_str).unwrap_or("");
    let how = match (
        data.get("exit_code").and_then(Value::as_i64),
        data.get("signal").and_then(Value::as_i64),
    ) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "no exit code".to_owned(),
    };
    let _ = writeln!(
        out,
        "{}: {} ({how}) in {} ms",
        text("tool_name"),
        text("outcome"),
        data.get("duration_ms").and_then(Value::as_u64).unwrap_or(0)
    );
    for stream in ["stdout", "stderr"] {
        let view = text(&format!("{stream}_text"));
        match text(&format!("{stream}_text_state")) {
            "utf8" | "truncated" if view.is_empty() => {}
            "utf8" | "truncated" => {
                let _ = writeln!(out, "--- {stream} ---");
                out.push_str(view);
                if !view.ends_with('\n') {
                    out.push('\n');
                }
            }
            state => {
                let _ = writeln!(
                    out,
                    "--- {stream}: text view {state}; {stream}_base64 has the exact bytes ---"
                );
            }
        }
        if data.get(format!("{stream}_truncated")) == Some(&Value::Bool(true)) {
            let _ = writeln!(
                out,
                "({stream} exceeded max_output_bytes: the rest was discarded)"
            );
        }
    }
    let _ = writeln!(out, "cleanup_certainty: {}", text("cleanup_certainty"));
    if let Some(failure) = data.get("failure").and_then(Value::as_str) {
        let _ = writeln!(out, "failure: {failure}");
    }
    out
}

fn size_of(envelope: &Value) -> usize {
    serde_json::to_vec(envelope).map_or(usize::MAX, |v| v.len())
        + crate::tools::json_len(&readable(envelope))
}

fn finish(envelope: Value, is_error: bool) -> CallToolResult {
    let text = readable(&envelope);
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(envelope);
    result
}

/// A finished run as the call's result, fitted to the budget.
pub fn run_result(tool_name: &str, report: &RunReport) -> CallToolResult {
    let ok = report.outcome == super::run::Outcome::Success;
    let mut envelope = json!({"ok": ok, "data": run_data(tool_name, report)});
    for stream in ["stderr", "stdout"] {
        if size_of(&envelope) <= RESPONSE_BUDGET {
            break;
        }
        if let Some(data) = envelope.get_mut("data").and_then(Value::as_object_mut) {
            data.insert(format!("{stream}_text"), Value::from(""));
            data.insert(format!("{stream}_text_state"), Value::from("omitted"));
        }
    }
    finish(envelope, !ok)
}

/// A call that ran nothing.
pub fn error_result(error: &ToolError) -> CallToolResult {
    finish(json!({"ok": false, "error": error.to_json()}), true)
}

/// The output schema of the published tool: the envelope with `data` described.
pub fn output_schema() -> Arc<JsonObject> {
    let string = |d: &str| json!({"type": "string", "description": d});
    let state = json!({"type": "string", "enum": ["utf8", "lossy", "omitted", "truncated"]});
    let certainty = json!({"type": "string", "enum": ["verified", "uncertain", "pending"]});
    let schema = json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean", "description": "true only when outcome is success"},
            "data": {
                "type": "object",
                "properties": {
                    "tool_name": {"type": "string"},
                    "outcome": {"type": "string", "enum": ["success", "exit_nonzero", "timeout", "cancelled", "failed"]},
                    "exit_code": {"type": ["integer", "null"]},
                    "signal": {"type": ["integer", "null"]},
                    "stdout_base64": string("Authoritative stdout bytes (at most max_output_bytes)."),
                    "stderr_base64": string("Authoritative stderr bytes (at most max_output_bytes)."),
                    "stdout_text": {"type": "string"},
                    "stderr_text": {"type": "string"},
                    "stdout_text_state": state.clone(),
                    "stderr_text_state": state,
                    "stdout_truncated": {"type": "boolean"},
                    "stderr_truncated": {"type": "boolean"},
                    "output_complete": {"type": "boolean"},
                    "cleanup_certainty": certainty.clone(),
                    "host_cleanup_certainty": certainty,
                    "receipt_selector": string("A durable kit receipt (command mode only, when one exists)."),
                    "duration_ms": {"type": "integer"},
                    "failure": {"type": "string"}
                },
                "required": ["tool_name", "outcome", "exit_code", "stdout_base64", "stderr_base64",
                             "stdout_text_state", "stderr_text_state", "output_complete", "cleanup_certainty"]
            },
            "error": error_schema()
        },
        "required": ["ok"]
    });
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::run::{Certainty, Outcome};
    use super::*;

    fn report(stdout: Vec<u8>, truncated: bool) -> RunReport {
        RunReport {
            outcome: Outcome::Success,
            exit_code: Some(0),
            signal: None,
            stdout,
            stderr: Vec::new(),
            stdout_truncated: truncated,
            stderr_truncated: false,
            output_complete: !truncated,
            cleanup: Certainty::Uncertain,
            host_cleanup: Some(Certainty::Verified),
            receipt: None,
            duration_ms: 1,
            failure: None,
        }
    }

    #[test]
    fn text_states_follow_the_bytes() {
        assert_eq!(text_view(b"abc", false), ("abc".into(), "utf8"));
        assert_eq!(text_view(b"abc", true), ("abc".into(), "truncated"));
        assert_eq!(text_view(b"a\xff", false).1, "lossy");
        // "é" is two bytes; a cut after the first is a truncation.
        assert_eq!(text_view(b"a\xc3", true), ("a".into(), "truncated"));
    }

    #[test]
    fn oversized_views_are_omitted_and_base64_kept() {
        // 262144 control bytes escape to six bytes each in the text view.
        let bytes = vec![1u8; 262_144];
        let result = run_result("t", &report(bytes.clone(), false));
        let data = &result.structured_content.as_ref().unwrap()["data"];
        assert_eq!(data["stdout_text_state"], "omitted");
        let b64 = data["stdout_base64"].as_str().unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
            bytes
        );
        let total = serde_json::to_vec(&result).unwrap().len();
        assert!(total < 1024 * 1024, "{total}");
    }

    #[test]
    fn small_results_keep_their_views() {
        let result = run_result("t", &report(b"ABC".to_vec(), false));
        let envelope = result.structured_content.as_ref().unwrap();
        assert_eq!(envelope["ok"], true);
        assert_eq!(envelope["data"]["stdout_text"], "ABC");
        assert_eq!(envelope["data"]["stdout_text_state"], "utf8");
        assert_eq!(envelope["data"]["host_cleanup_certainty"], "verified");
        assert!(envelope["data"].get("receipt_selector").is_none());
    }
}
