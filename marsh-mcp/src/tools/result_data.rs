//! The `data` of every successful tool result, as types. A handler returns one of
//! these and its tool's `outputSchema` is generated from the same type (see
//! [`super::schema`]), so the schema cannot describe fields the handler does not send;
//! the black-box harness validates every real result against the published schemas
//! with a JSON Schema validator.
//!
//! Field docs here are for readers of the code: the published schemas drop them (every
//! byte of `tools/list` is read by the model each session; names say what a field is,
//! and docs/tools.md documents the shapes). A field documented as "always present, null when
//! …" is serialized as `null`, never omitted. Only `skip_serializing_if` fields and
//! flattened `Option`s (a pending receipt read's answer, the report of a `scope_stop`
//! that ran nothing) may be absent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::args::Gate;
use crate::error::ToolError;
use crate::operations::{OpState, Operation, now_ms};
use crate::output::Stream;
use crate::scopes::ScopeView;

/// The `error` member of a failed result, and of a failed operation.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ErrorBody {
    /// A stable snake_case code (`ErrorKind`); callers branch on it.
    pub kind: &'static str,
    pub message: String,
    pub retryable: bool,
}

impl From<&ToolError> for ErrorBody {
    fn from(error: &ToolError) -> Self {
        Self {
            kind: error.kind.as_str(),
            message: error.message.clone(),
            retryable: error.kind.retryable(),
        }
    }
}

/// What every operation reports about itself, whatever else the tool adds.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationHead {
    pub operation_id: String,
    /// The (default-scope) tool that created it.
    pub kind: &'static str,
    /// `default`, a scope id, or `host` for qualification.
    pub scope_id: String,
    pub state: OpState,
    /// Null until the child exits with a code.
    pub exit_code: Option<i32>,
    /// Null unless a signal ended the child.
    pub signal: Option<i32>,
    /// Null unless the operation failed, timed out or was cancelled with a reason.
    pub error: Option<ErrorBody>,
    pub cancel_requested: bool,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    /// Elapsed so far while running; null before the start.
    pub duration_ms: Option<u64>,
    pub timeout_ms: u64,
    /// Bytes the child wrote to each stream since the start (retained or not): the
    /// totals, never a page's size (that is `*_page_bytes`).
    pub stdout_total_bytes: u64,
    pub stderr_total_bytes: u64,
    /// The operation has ended and every byte its child wrote was captured: no more
    /// output will appear after `latest_seq`. The one completeness flag; whether a
    /// reply holds all of it is `more_to_page`/`output_truncated`/`tail`.
    pub output_complete: bool,
}

impl OperationHead {
    pub(crate) fn of(op: &Operation) -> Self {
        let s = op.status();
        let (stdout_total_bytes, stderr_total_bytes) = {
            let out = op.output();
            (out.written(Stream::Stdout), out.written(Stream::Stderr))
        };
        Self {
            operation_id: op.id.to_string(),
            kind: op.kind.as_str(),
            scope_id: op.scope.clone(),
            state: s.state,
            exit_code: s.exit_code,
            signal: s.signal,
            error: s.error.as_ref().map(ErrorBody::from),
            cancel_requested: s.cancel_requested,
            created_ms: op.created_ms,
            started_ms: s.started_ms,
            finished_ms: s.finished_ms,
            duration_ms: s
                .started_ms
                .map(|start| s.finished_ms.unwrap_or_else(now_ms).saturating_sub(start)),
            timeout_ms: u64::try_from(op.timeout.as_millis()).unwrap_or(u64::MAX),
            stdout_total_bytes,
            stderr_total_bytes,
            output_complete: s.state.is_terminal() && s.output_drained,
        }
    }
}

/// An operation with its output totals, without its output (operation_get,
/// operation_cancel, and a stopped-scope read).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationSummary {
    #[serde(flatten)]
    pub head: OperationHead,
    pub latest_seq: u64,
    /// Only for a stopped-scope read that ended: the receipts it read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

impl OperationSummary {
    pub(crate) fn of(op: &Operation) -> Self {
        Self {
            head: OperationHead::of(op),
            latest_seq: op.output().latest_seq(),
            result: op.result(),
        }
    }
}

/// How a stream's text view relates to its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TextState {
    /// The text is exactly the bytes.
    Utf8,
    /// The bytes are not UTF-8: the text is a lossy decoding, `*_base64` is exact.
    Lossy,
    /// The text was left out to keep the reply in one frame; `*_base64` is exact.
    Omitted,
}

/// Both streams' bytes in one part of a reply (a page, or a window's tail): per stream
/// its size, a text view with its state, and base64 whenever the text is not exact
/// (or asked for).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct StreamViews {
    /// Bytes of stdout in this part of the reply (the total is `stdout_total_bytes`).
    pub stdout_page_bytes: usize,
    pub stdout_text: String,
    pub stdout_text_state: TextState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    pub stderr_page_bytes: usize,
    pub stderr_text: String,
    pub stderr_text_state: TextState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
}

/// The newest output of each stream, when a result from the start could not hold
/// all of it: the page is then the head, this is the tail.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OutputTail {
    #[serde(flatten)]
    pub streams: StreamViews,
    /// Bytes of both streams after the page (`next_seq`) and before this tail that
    /// this reply leaves out: page them from `next_seq`, or read `tail_lines`.
    pub omitted_bytes: u64,
}

/// A byte-faithful read of an operation's captured output: the page, the cursor
/// fields, and the flags that say what the reply does not hold.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OutputView {
    #[serde(flatten)]
    pub page: StreamViews,
    /// Where the returned bytes begin (later than asked when retention evicted some).
    pub start_seq: u64,
    /// The cursor to continue from (`since_seq`).
    pub next_seq: u64,
    pub latest_seq: u64,
    /// Retained output exists after `next_seq`: reading on from it returns more.
    pub more_to_page: bool,
    /// Output in the range this reply covers was evicted by retention and is gone;
    /// the only flag that means lost data.
    pub output_truncated: bool,
    /// Present when a result from the start could not hold everything: the page is
    /// the head and this the newest output of each stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<OutputTail>,
    /// Something was left out to keep the reply in one 1 MiB frame: a text view
    /// (`omitted`), a base64 view asked for, or part of the page (see `more_to_page`).
    pub shrunk_to_fit: bool,
    /// Whether the readable text content repeats the output (it does unless the
    /// reply had to shrink); not part of the structured result.
    #[serde(skip)]
    pub text_copy: bool,
}

/// An operation and its output from the start: what every tool that starts one
/// answers (inline when it ended within `wait_ms`, else `running`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationReport {
    #[serde(flatten)]
    pub head: OperationHead,
    #[serde(flatten)]
    pub output: OutputView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<&'static str>,
}

/// prewarm, workers_reset and their `scope_*` forms.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct WorkersResult {
    #[serde(flatten)]
    pub report: OperationReport,
    /// `all` or the comma-separated kit names.
    pub selection: String,
}

/// qualify.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct QualifyResult {
    #[serde(flatten)]
    pub report: OperationReport,
    pub gate: Gate,
    pub make_target: &'static str,
}

/// One scope as a caller sees it: never a path.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ScopeSummary {
    pub scope_id: String,
    /// The persisted lifecycle state (`ready`, `stopped`, `failed`, a transitional one).
    pub state: &'static str,
    pub identity_invalid: bool,
    pub last_operation: Option<String>,
    pub last_error: Option<String>,
    /// Null for a malformed record.
    pub created_ms: Option<u64>,
}

impl ScopeSummary {
    pub(crate) fn of(view: &ScopeView) -> Self {
        let record = view.record.as_ref();
        Self {
            scope_id: view.id.to_string(),
            state: view.state().as_str(),
            identity_invalid: view.identity_invalid(),
            last_operation: record.and_then(|r| r.last_operation.clone()),
            last_error: match record {
                Some(r) => r.last_error.clone(),
                None => Some("the persisted record is malformed".to_string()),
            },
            created_ms: record.map(|r| r.created_ms),
        }
    }
}

/// scope_start, scope_reset, scope_stop, scope_remove: the operation, then the scope
/// as it is afterwards.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct LifecycleResult {
    #[serde(flatten)]
    pub report: OperationReport,
    /// Absent only when the scope's record can no longer be read (removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<ScopeSummary>,
}

/// scope_stop: a lifecycle result, or only the scope and a `note` when it was already
/// stopped and nothing ran.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ScopeStopResult {
    #[serde(flatten)]
    pub report: Option<OperationReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<ScopeSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
}

impl From<LifecycleResult> for ScopeStopResult {
    fn from(ran: LifecycleResult) -> Self {
        Self {
            report: Some(ran.report),
            scope: ran.scope,
            note: None,
        }
    }
}

/// The generated-scope limits, as counts.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ScopeCounts {
    pub live_generated: usize,
    pub retained_generated: usize,
}

/// scope_list.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ScopeListResult {
    /// `legacy` or `managed`.
    pub mode: &'static str,
    /// The default scope first.
    pub scopes: Vec<ScopeSummary>,
    #[serde(flatten)]
    pub counts: ScopeCounts,
    pub limits: ScopeCounts,
}

/// Whether a ready scope's runtime was probed and found.
#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RuntimeState {
    Present,
    Absent,
    /// Failed or transitioning: not probed.
    Unknown,
}

/// status and scope_status.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct StatusResult {
    #[serde(flatten)]
    pub scope: ScopeSummary,
    pub mode: &'static str,
    pub runtime_state: RuntimeState,
    /// marsh's own status fields (daemon, shell, workers, active_jobs, backend) for a
    /// probed ready scope; null otherwise.
    pub runtime: Option<Map<String, Value>>,
    pub active_runs: usize,
    /// The whole-scope step holding the scope, if any.
    pub lifecycle_in_progress: Option<&'static str>,
    pub operation_slots_free: usize,
    pub workspace_hash: String,
    /// The kits registered in this scope (commands whose workers prewarm and
    /// workers_reset select), from the probed runtime; empty when it was not probed.
    pub kits: Vec<String>,
}

/// The newest receipts of a scope (results_list, scope_results_list).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ReceiptList {
    pub scope_id: String,
    /// marsh's receipts, newest first, without host paths.
    pub results: Vec<Map<String, Value>>,
    pub returned: usize,
    /// More receipts exist than `limit` (nothing is lost: raise `limit`).
    pub more_available: bool,
}

/// One receipt of a scope (result_get, scope_result_get).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ReceiptOne {
    pub scope_id: String,
    pub result: Map<String, Value>,
}

/// A receipt read. A ready scope's is answered directly (`answer` only). A stopped
/// scope's read is an operation (read, then an exact stop): when it ended the answer
/// comes with that `operation` and the `scope` afterwards; when it did not end within
/// `wait_ms` only the `operation` and a `hint` are returned, and `operation_get` later
/// carries the answer as `result`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct ReceiptRead<A> {
    #[serde(flatten)]
    pub answer: Option<A>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<ScopeSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<&'static str>,
}

/// operation_get.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationGetResult {
    #[serde(flatten)]
    pub summary: OperationSummary,
    pub wait_result: WaitResult,
}

#[derive(Debug, Clone, Copy, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WaitResult {
    Ended,
    DeadlineReached,
}

/// operation_output.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationOutputResult {
    pub operation_id: String,
    pub state: OpState,
    /// As in every operation result: ended, and every byte captured.
    pub output_complete: bool,
    #[serde(flatten)]
    pub output: OutputView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<&'static str>,
}

/// One operation of operation_list.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationListEntry {
    pub operation_id: String,
    pub kind: &'static str,
    pub scope_id: String,
    pub state: OpState,
    /// The first 200 bytes of a shell_run/scope_run command; null for other kinds.
    pub command: Option<String>,
    pub created_ms: u64,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub stdout_total_bytes: u64,
    pub stderr_total_bytes: u64,
}

impl OperationListEntry {
    pub(crate) fn of(op: &Operation) -> Self {
        let head = OperationHead::of(op);
        Self {
            operation_id: head.operation_id,
            kind: head.kind,
            scope_id: head.scope_id,
            state: head.state,
            command: op.command.clone(),
            created_ms: head.created_ms,
            started_ms: head.started_ms,
            finished_ms: head.finished_ms,
            stdout_total_bytes: head.stdout_total_bytes,
            stderr_total_bytes: head.stderr_total_bytes,
        }
    }
}

/// operation_list: this session's operations, newest first.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationListResult {
    pub operations: Vec<OperationListEntry>,
    /// This session's operations that have not ended (listed or not).
    pub live: usize,
    /// More of this session's operations are retained than `limit` listed.
    pub more_available: bool,
}

/// operation_cancel.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationCancelResult {
    #[serde(flatten)]
    pub summary: OperationSummary,
    /// False when it had already ended or was already being cancelled.
    pub cancel_accepted: bool,
    pub note: &'static str,
}

/// One doctor check.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// doctor's operation counts.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct OperationCounts {
    pub live: usize,
    pub retained: usize,
    pub retained_output_bytes: usize,
}

/// doctor's scope counts.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct DoctorScopes {
    #[serde(flatten)]
    pub counts: ScopeCounts,
    /// Every scope scope_list shows, the default included.
    pub listed: usize,
}

/// The limits this server enforces.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct Limits {
    pub global_operation_cap: usize,
    pub operation_slots_free: usize,
    pub concurrent_reads: usize,
    pub retained_operations: usize,
    pub retained_output_bytes_per_stream: usize,
    pub retained_output_bytes_global: usize,
    pub frame_bytes: usize,
}

/// doctor.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub(crate) struct DoctorReport {
    /// Every check passed.
    pub healthy: bool,
    pub version: &'static str,
    pub server_name: String,
    pub workspace_hash: String,
    pub mode: &'static str,
    pub default_scope_state: &'static str,
    pub scopes: DoctorScopes,
    pub full_sbx_control: bool,
    pub checks: Vec<Check>,
    /// Names only: the variables every child of this server receives.
    pub child_environment: Vec<String>,
    pub operations: OperationCounts,
    pub limits: Limits,
}
