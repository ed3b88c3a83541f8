//! `content[0].text` of every result, written for a reader rather than a parser.
//!
//! The MCP specification says a tool returning structured content SHOULD also return
//! the serialized JSON as text. We depart from that on purpose: clients that show
//! `content` to the model (Claude Code does) would make it read one line of escaped
//! JSON (a traceback becomes `\n` and `\"` escapes after a dozen metadata fields) and
//! carry the output twice in its most expensive form. So the text is: a first line
//! with what happened (state, exit code or signal, duration, operation id), then the
//! output as raw text in marked sections, then what was left out and the next call.
//! `structuredContent` stays the typed contract; nothing here is parsed by anyone.

use std::fmt::Write as _;

use serde_json::Value;

use super::result_data::{
    DoctorReport, LifecycleResult, OperationCancelResult, OperationGetResult, OperationHead,
    OperationListResult, OperationOutputResult, OperationReport, OperationSummary, OutputView,
    QualifyResult, ReceiptList, ReceiptOne, ReceiptRead, ScopeListResult, ScopeStopResult,
    ScopeSummary, StatusResult, StreamViews, TextState, WaitResult, WorkersResult,
};
use crate::error::ToolError;
use crate::operations::OpState;

/// A result that can describe itself to a reader.
pub(crate) trait Readable {
    fn write_text(&self, out: &mut String);
}

/// The text of a failed call: its kind, its message (which names the way out), and
/// whether the same call may succeed later.
pub(crate) fn error_text(error: &ToolError) -> String {
    let retry = if error.kind.retryable() {
        " The same call may succeed later."
    } else {
        ""
    };
    format!("Error ({}): {}{retry}", error.kind.as_str(), error.message)
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// The first line of every operation: what it is, what happened, how long, its id.
fn headline(out: &mut String, h: &OperationHead) {
    let what = match h.state {
        OpState::Queued => "is queued".to_owned(),
        OpState::Running => "is still running".to_owned(),
        OpState::Succeeded => "succeeded (exit code 0)".to_owned(),
        OpState::Exited => match (h.exit_code, h.signal) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(signal)) => format!("was ended by signal {signal}"),
            (None, None) => "exited unsuccessfully".to_owned(),
        },
        OpState::Failed => "failed (not the command's own result)".to_owned(),
        OpState::TimedOut => format!("timed out (timeout_ms {})", h.timeout_ms),
        OpState::CancellationUncertain => {
            "was cancelled (cancellation_uncertain: signal delivery does not prove the work stopped)"
                .to_owned()
        }
    };
    let took = match (h.duration_ms, h.state.is_terminal()) {
        (Some(ms), true) => format!(" in {}", duration(ms)),
        (Some(ms), false) => format!(" after {}", duration(ms)),
        (None, _) => String::new(),
    };
    let _ = writeln!(
        out,
        "{} {what}{took} · operation {} · scope {}",
        h.kind, h.operation_id, h.scope_id
    );
    if let Some(error) = &h.error {
        let _ = writeln!(out, "Error ({}): {}", error.kind, error.message);
    }
}

/// One stream's section: raw text between markers, or what it is when not text.
fn section(out: &mut String, name: &str, part: &str, bytes: usize, text: &str, state: TextState) {
    if bytes == 0 {
        return;
    }
    match state {
        TextState::Utf8 => {
            let _ = writeln!(out, "--- {name}{part} ({bytes} bytes) ---");
            out.push_str(text);
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
        TextState::Lossy => {
            let _ = writeln!(
                out,
                "--- {name}{part}: {bytes} bytes that are not UTF-8 (binary); {name}_base64 has them exactly ---"
            );
        }
        TextState::Omitted => {
            let _ = writeln!(
                out,
                "--- {name}{part}: {bytes} bytes left out of the text views to fit one reply; {name}_base64 has them exactly ---"
            );
        }
    }
}

fn sections(out: &mut String, views: &StreamViews, part: &str) {
    section(
        out,
        "stdout",
        part,
        views.stdout_page_bytes,
        &views.stdout_text,
        views.stdout_text_state,
    );
    section(
        out,
        "stderr",
        part,
        views.stderr_page_bytes,
        &views.stderr_text,
        views.stderr_text_state,
    );
}

fn write_output(out: &mut String, view: &OutputView) {
    let page = &view.page;
    let shown = page.stdout_page_bytes + page.stderr_page_bytes;
    if !view.text_copy {
        let _ = writeln!(
            out,
            "The output ({shown} bytes on this page) is only in structuredContent (stdout_text, stderr_text or *_base64): this reply had to shrink to fit one frame."
        );
    } else if let Some(tail) = &view.tail {
        sections(out, page, ", first part");
        let _ = writeln!(out, "[... {} bytes left out here ...]", tail.omitted_bytes);
        sections(out, &tail.streams, ", last part");
    } else if view.latest_seq == 0 {
        out.push_str("(no output)\n");
    } else if shown == 0 {
        out.push_str("(no output on this page)\n");
    } else {
        sections(out, page, "");
    }
    if view.output_truncated {
        out.push_str(
            "Some of this output was evicted by retention limits and is gone (output_truncated).\n",
        );
    }
    if view.shrunk_to_fit {
        out.push_str(
            "Parts were left out to keep this reply in one 1 MiB frame (shrunk_to_fit).\n",
        );
    }
}

fn hint(out: &mut String, hint: Option<&str>) {
    if let Some(hint) = hint {
        let _ = writeln!(out, "Next: {hint}");
    }
}

fn scope_line(out: &mut String, s: &ScopeSummary) {
    let _ = write!(out, "scope {}: {}", s.scope_id, s.state);
    if s.identity_invalid {
        out.push_str(" (identity invalid)");
    }
    if let Some(error) = &s.last_error {
        let _ = write!(out, "; last error: {error}");
    }
    out.push('\n');
}

impl Readable for OperationReport {
    fn write_text(&self, out: &mut String) {
        headline(out, &self.head);
        write_output(out, &self.output);
        hint(out, self.hint);
    }
}

impl Readable for WorkersResult {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(out, "kits: {}", self.selection);
        self.report.write_text(out);
    }
}

impl Readable for QualifyResult {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(out, "qualification gate: {}", self.make_target);
        self.report.write_text(out);
    }
}

impl Readable for LifecycleResult {
    fn write_text(&self, out: &mut String) {
        self.report.write_text(out);
        if let Some(scope) = &self.scope {
            scope_line(out, scope);
        }
    }
}

impl Readable for ScopeStopResult {
    fn write_text(&self, out: &mut String) {
        if let Some(report) = &self.report {
            report.write_text(out);
        }
        if let Some(scope) = &self.scope {
            scope_line(out, scope);
        }
        if let Some(note) = self.note {
            let _ = writeln!(out, "{note}");
        }
    }
}

fn summary_text(out: &mut String, s: &OperationSummary) {
    headline(out, &s.head);
    let _ = writeln!(
        out,
        "Output so far: {} bytes of stdout, {} of stderr (latest_seq {}); operation_output reads it.",
        s.head.stdout_total_bytes, s.head.stderr_total_bytes, s.latest_seq
    );
    if let Some(result) = &s.result {
        let _ = writeln!(out, "Result: {result}");
    }
}

impl Readable for OperationGetResult {
    fn write_text(&self, out: &mut String) {
        summary_text(out, &self.summary);
        if let WaitResult::DeadlineReached = self.wait_result {
            out.push_str(
                "It had not ended when the wait ended: call operation_get again with wait_ms.\n",
            );
        }
    }
}

impl Readable for OperationCancelResult {
    fn write_text(&self, out: &mut String) {
        summary_text(out, &self.summary);
        let _ = writeln!(out, "{}", self.note);
    }
}

impl Readable for OperationOutputResult {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "Output of operation {} ({}), bytes {}..{} of {}:",
            self.operation_id,
            self.state.as_str(),
            self.output.start_seq,
            self.output.next_seq,
            self.output.latest_seq,
        );
        write_output(out, &self.output);
        hint(out, self.hint);
    }
}

impl Readable for OperationListResult {
    fn write_text(&self, out: &mut String) {
        if self.operations.is_empty() {
            out.push_str("This session has no operations.\n");
            return;
        }
        let _ = writeln!(
            out,
            "This session's operations, newest first ({} live):",
            self.live
        );
        for op in &self.operations {
            let _ = write!(
                out,
                "- {} {} {} · scope {} · {} bytes out, {} err",
                op.operation_id,
                op.kind,
                op.state.as_str(),
                op.scope_id,
                op.stdout_total_bytes,
                op.stderr_total_bytes,
            );
            if let Some(command) = &op.command {
                let _ = write!(out, " · {}", command.replace('\n', "⏎"));
            }
            out.push('\n');
        }
    }
}

impl Readable for StatusResult {
    fn write_text(&self, out: &mut String) {
        scope_line(out, &self.scope);
        let runtime = match self.runtime_state {
            super::result_data::RuntimeState::Present => "present",
            super::result_data::RuntimeState::Absent => "absent (stopped)",
            super::result_data::RuntimeState::Unknown => "not probed",
        };
        let _ = writeln!(
            out,
            "{} mode · runtime {runtime} · {} active runs · {} operation slots free",
            self.mode, self.active_runs, self.operation_slots_free
        );
        if let Some(step) = self.lifecycle_in_progress {
            let _ = writeln!(out, "In progress: {step}");
        }
        if !self.kits.is_empty() {
            let _ = writeln!(out, "Kits: {}", self.kits.join(", "));
        }
    }
}

impl Readable for ScopeListResult {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "{} mode · {} of {} live generated scopes, {} of {} retained",
            self.mode,
            self.counts.live_generated,
            self.limits.live_generated,
            self.counts.retained_generated,
            self.limits.retained_generated
        );
        for scope in &self.scopes {
            out.push_str("- ");
            scope_line(out, scope);
        }
    }
}

fn receipt_read<A>(out: &mut String, read: &ReceiptRead<A>, answer: impl Fn(&mut String, &A)) {
    if let Some(a) = &read.answer {
        answer(out, a);
    }
    if let Some(op) = &read.operation {
        summary_text(out, op);
    }
    if let Some(scope) = &read.scope {
        scope_line(out, scope);
    }
    hint(out, read.hint);
}

impl Readable for ReceiptRead<ReceiptList> {
    fn write_text(&self, out: &mut String) {
        receipt_read(out, self, |out, list| {
            let more = if list.more_available {
                "; more exist (raise limit)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "{} receipts of scope {}, newest first{more}:",
                list.returned, list.scope_id
            );
            for receipt in &list.results {
                let _ = writeln!(out, "- {}", Value::Object(receipt.clone()));
            }
        });
    }
}

impl Readable for ReceiptRead<ReceiptOne> {
    fn write_text(&self, out: &mut String) {
        receipt_read(out, self, |out, one| {
            let _ = writeln!(out, "Receipt of scope {}:", one.scope_id);
            let pretty = serde_json::to_string_pretty(&Value::Object(one.result.clone()))
                .unwrap_or_default();
            let _ = writeln!(out, "{pretty}");
        });
    }
}

impl Readable for DoctorReport {
    fn write_text(&self, out: &mut String) {
        let passed = self.checks.iter().filter(|c| c.ok).count();
        let _ = writeln!(
            out,
            "marsh-mcp {} ({}): {} · {passed} of {} checks passed · {} mode · default scope {}",
            self.version,
            self.server_name,
            if self.healthy {
                "healthy"
            } else {
                "NOT healthy"
            },
            self.checks.len(),
            self.mode,
            self.default_scope_state
        );
        for check in &self.checks {
            let mark = if check.ok { "ok  " } else { "FAIL" };
            let _ = writeln!(out, "{mark} {}: {}", check.name, check.detail);
        }
        let _ = writeln!(
            out,
            "operations: {} live, {} retained · {} of {} operation slots free",
            self.operations.live,
            self.operations.retained,
            self.limits.operation_slots_free,
            self.limits.global_operation_cap
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_read_as_on_the_wire() {
        for state in [
            OpState::Exited,
            OpState::CancellationUncertain,
            OpState::TimedOut,
        ] {
            assert_eq!(
                serde_json::to_value(state).unwrap(),
                Value::from(state.as_str())
            );
        }
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(duration(80), "80 ms");
        assert_eq!(duration(2_140), "2.1 s");
    }

    #[test]
    fn sections_keep_text_verbatim_and_describe_the_rest() {
        let mut out = String::new();
        section(
            &mut out,
            "stderr",
            "",
            10,
            "line \"1\"\n\tx",
            TextState::Utf8,
        );
        assert_eq!(out, "--- stderr (10 bytes) ---\nline \"1\"\n\tx\n");
        let mut out = String::new();
        section(&mut out, "stdout", "", 3, "\u{fffd}", TextState::Lossy);
        assert!(
            out.contains("not UTF-8") && !out.contains('\u{fffd}'),
            "{out}"
        );
        let mut out = String::new();
        section(&mut out, "stdout", "", 0, "", TextState::Utf8);
        assert!(out.is_empty());
    }
}
