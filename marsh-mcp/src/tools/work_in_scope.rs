//! Work inside one scope: status, receipts, runs, prewarm and worker resets. The
//! default-scope aliases and the `scope_*` tools share these implementations.

use std::sync::Arc;
use std::time::Duration;

use marsh_scope_registry::{Event, ScopeId, ScopeState};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::args::{self, ResultGetArgs, ResultsListArgs, SelectionArgs, ShellRunArgs};
use super::operation_reply::{report, report_log};
use super::result_data::{
    OperationReport, OperationSummary, ReceiptList, ReceiptOne, ReceiptRead, RuntimeState,
    ScopeSummary, StatusResult, WorkersResult,
};
use super::views::ViewOptions;
use super::{Call, network_hint};
use crate::admission::{Admission, WorkerStep};
use crate::context::ServerContext;
use crate::error::{ErrorKind, ToolError};
use crate::launch::{Finish, Outcome, Plan, Step, Verdict};
use crate::marsh::Verb;
use crate::operations::{OpKind, OpState, Operation};
use crate::scopes::ScopeView;

/// Timeout of prewarm and worker resets (they boot workers, which can be slow), and of
/// the exact stop that ends a stopped-scope read.
pub(crate) const LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Runtime fields passed through from `marsh status`; anything else (host paths in
/// particular) stays on the host.
const RUNTIME_FIELDS: &[&str] = &["daemon", "shell", "workers", "active_jobs", "backend"];
/// Receipt fields that are never shown to a caller.
const HIDDEN_RECEIPT_FIELDS: &[&str] = &["workspace", "home"];

pub(super) fn read_permit(
    ctx: &ServerContext,
) -> Result<tokio::sync::SemaphorePermit<'_>, ToolError> {
    ctx.reads.try_acquire().map_err(|_| {
        ToolError::new(
            ErrorKind::CapacityExhausted,
            "too many concurrent status/result reads; retry shortly",
        )
    })
}

/// A receipt as a caller sees it: marsh's object without the hidden fields. marsh
/// writes every receipt as an object; anything else is a backend failure, never
/// passed on or replaced.
fn strip_receipt(receipt: Value) -> Result<Map<String, Value>, ToolError> {
    let Value::Object(mut map) = receipt else {
        return Err(ToolError::new(
            ErrorKind::BackendFailed,
            "marsh answered a receipt that is not a JSON object",
        ));
    };
    for key in HIDDEN_RECEIPT_FIELDS {
        map.remove(*key);
    }
    Ok(map)
}

/// Status of one scope. Only a ready scope's runtime is probed; a stopped one is
/// `absent`, and failed or transitioning ones report their persisted state only.
pub(crate) async fn status(
    ctx: &ServerContext,
    view: &ScopeView,
) -> Result<StatusResult, ToolError> {
    let state = view.state();
    let (runs, lifecycle) = ctx.scopes.gate(view.id).snapshot();
    let mut kits = Vec::new();
    let (runtime_state, runtime) = match state {
        ScopeState::Ready if !view.identity_invalid() => {
            let raw = probe_status(ctx, view).await?;
            kits = kit_names(&raw);
            let mut kept = Map::new();
            for key in RUNTIME_FIELDS {
                if let Some(v) = raw.get(*key) {
                    kept.insert((*key).into(), v.clone());
                }
            }
            let running = raw.pointer("/daemon/state").and_then(Value::as_str) == Some("running");
            let present = if running {
                RuntimeState::Present
            } else {
                RuntimeState::Absent
            };
            (present, Some(kept))
        }
        ScopeState::Stopped => (RuntimeState::Absent, None),
        _ => (RuntimeState::Unknown, None),
    };
    Ok(StatusResult {
        scope: ScopeSummary::of(view),
        mode: ctx.scopes.mode(),
        runtime_state,
        runtime,
        active_runs: runs,
        lifecycle_in_progress: lifecycle,
        operation_slots_free: ctx.cap.available(),
        workspace_hash: ctx.workspace_hash.clone(),
        kits,
    })
}

/// `marsh status` of a ready scope.
async fn probe_status(ctx: &ServerContext, view: &ScopeView) -> Result<Value, ToolError> {
    let home = ctx.scopes.verified_home(view)?;
    let _permit = read_permit(ctx)?;
    ctx.driver.query_json(&Verb::Status, &home).await
}

/// The registered kits of a `marsh status` answer (its `workers`).
fn kit_names(status: &Value) -> Vec<String> {
    status
        .get("workers")
        .and_then(Value::as_array)
        .map(|workers| {
            workers
                .iter()
                .filter_map(|w| w.get("name").and_then(Value::as_str).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Refuses a selection naming a kit the scope does not have, listing the ones it has,
/// before anything runs.
async fn check_kits(
    ctx: &ServerContext,
    view: &ScopeView,
    selection: &str,
) -> Result<(), ToolError> {
    if selection == "all" {
        return Ok(());
    }
    let kits = kit_names(&probe_status(ctx, view).await?);
    match selection
        .split(',')
        .find(|name| !kits.iter().any(|k| k == name))
    {
        None => Ok(()),
        Some(unknown) => Err(ToolError::new(
            ErrorKind::NotFound,
            format!(
                "no kit named {unknown} in scope {}; {}. A kit is a command registered with marsh whose workers run its jobs; status lists them",
                view.id,
                if kits.is_empty() {
                    "it has no registered kits".to_owned()
                } else {
                    format!("its kits are: {}", kits.join(", "))
                }
            ),
        )),
    }
}

/// A receipt query: what to ask marsh and how to shape its answer for the caller.
#[derive(Debug, Clone)]
enum ReceiptQuery {
    List { limit: usize },
    Get { selector: String },
}

impl ReceiptQuery {
    fn verb(&self) -> Verb {
        match self {
            Self::List { .. } => Verb::Results,
            Self::Get { selector } => Verb::ResultShow(selector.clone()),
        }
    }

    fn kind(&self) -> OpKind {
        match self {
            Self::List { .. } => OpKind::ResultsList,
            Self::Get { .. } => OpKind::ResultGet,
        }
    }

    /// marsh's answer as the caller sees it: hidden fields stripped, lists bounded.
    fn shape(&self, scope: ScopeId, answer: Value) -> Result<Value, ToolError> {
        let shaped = match self {
            Self::List { limit } => {
                let all = match answer {
                    Value::Object(mut map) => match map.remove("results") {
                        Some(Value::Array(all)) => all,
                        _ => Vec::new(),
                    },
                    _ => Vec::new(),
                };
                let total = all.len();
                let results = all
                    .into_iter()
                    .take(*limit)
                    .map(strip_receipt)
                    .collect::<Result<Vec<_>, _>>()?;
                serde_json::to_value(ReceiptList {
                    scope_id: scope.to_string(),
                    returned: results.len(),
                    results,
                    more_available: total > *limit,
                })
            }
            Self::Get { .. } => serde_json::to_value(ReceiptOne {
                scope_id: scope.to_string(),
                result: strip_receipt(answer)?,
            }),
        };
        shaped.map_err(|e| {
            ToolError::new(
                ErrorKind::Internal,
                format!("a receipt answer could not be serialized: {e}"),
            )
        })
    }
}

/// Reads receipts of `view`: directly when it is ready (a bounded read, not an
/// operation); a stopped scope's read is an operation on the admission path.
///
/// `A` is the shaped answer's type ([`ReceiptList`] or [`ReceiptOne`]): the shaping is
/// done once, as JSON (a stopped read's operation keeps it as its `result`), and read
/// back as `A` here.
async fn read_receipts<A: Serialize + DeserializeOwned>(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
    read: ReceiptQuery,
    wait: Duration,
) -> Result<ReceiptRead<A>, ToolError> {
    if view.state() == ScopeState::Stopped && !view.identity_invalid() {
        return stopped_read(ctx, call, view.id, read, wait).await;
    }
    let home = ctx.scopes.ready_home(view)?;
    let _permit = read_permit(ctx)?;
    let answer = ctx.driver.query_json(&read.verb(), &home).await?;
    Ok(ReceiptRead {
        answer: Some(typed_answer(read.shape(view.id, answer)?)?),
        operation: None,
        scope: None,
        hint: None,
    })
}

/// A shaped answer read back as its type; failing only if `shape` and `A` disagree.
fn typed_answer<A: DeserializeOwned>(shaped: Value) -> Result<A, ToolError> {
    serde_json::from_value(shaped).map_err(|e| {
        ToolError::new(
            ErrorKind::Internal,
            format!("a receipt answer does not have its documented shape: {e}"),
        )
    })
}

/// The stopped-scope read as an operation: exclusive access, a slot, the read, then
/// always an exact stop (600 s bound) whose failure marks the scope failed. Inline
/// when it ends within `wait`; otherwise the operation and a hint, and `operation_get` later
/// carries the shaped answer as `result`.
async fn stopped_read<A: Serialize + DeserializeOwned>(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    id: ScopeId,
    read: ReceiptQuery,
    wait: Duration,
) -> Result<ReceiptRead<A>, ToolError> {
    let ticket = ctx.admission().admit(id, Admission::StoppedRead)?;
    let plan = Plan {
        kind: read.kind(),
        timeout: LIFECYCLE_TIMEOUT,
        steps: vec![Step::Read(read.verb()), Step::Finally(Verb::Stop)],
    };
    let op = ticket.launch(ctx, call.session, plan, Some(stopped_read_finish(id, read)))?;
    let status = call.wait_for_end(&op, wait).await;
    if call.request.is_cancelled() {
        op.request_cancel();
    }
    match (status.state.is_terminal(), op.result()) {
        // The receipts were read; the operation summary says whether the exact stop
        // that followed was proven (else the scope is now failed).
        (true, Some(answer)) => {
            let mut summary = OperationSummary::of(&op);
            summary.result = None;
            Ok(ReceiptRead {
                answer: Some(typed_answer(answer)?),
                operation: Some(summary),
                scope: ctx.scopes.view(id).ok().as_ref().map(ScopeSummary::of),
                hint: None,
            })
        }
        (true, None) => Err(status.error.unwrap_or_else(|| {
            ToolError::new(
                ErrorKind::BackendFailed,
                "the stopped-scope read ended without an answer",
            )
        })),
        (false, _) => Ok(ReceiptRead {
            answer: None,
            operation: Some(OperationSummary::of(&op)),
            scope: None,
            hint: Some(
                "reading a stopped scope: poll operation_get with operation.operation_id (wait_ms); its `result` carries the receipts",
            ),
        }),
    }
}

/// Persists the scope's end (stopped again when the exact stop was proven, failed
/// otherwise) and records the shaped answer. The operation succeeds only when both the
/// read and the stop did; a failed read with a proven stop leaves the scope stopped.
fn stopped_read_finish(id: ScopeId, read: ReceiptQuery) -> Finish {
    Box::new(
        move |ctx: &ServerContext, op: &Operation, outcome: &Outcome| {
            // The stop always ran, cancel or not; only its own result decides.
            let stopped = !outcome.finally_failed;
            let persisted = if stopped {
                ctx.scopes
                    .apply(id, Event::Succeeded, crate::scopes::STOPPED_READ, None)
            } else {
                let why = format!(
                    "exact stop after a stopped-scope read was not proven: {}",
                    outcome
                        .error
                        .as_ref()
                        .map_or_else(|| crate::launch::stderr_tail(op), |e| e.message.clone())
                );
                ctx.scopes
                    .apply(id, Event::Failed, crate::scopes::STOPPED_READ, Some(&why))
                    .and(Err(ToolError::new(ErrorKind::BackendFailed, why)))
            };
            let answer = match &outcome.read {
                Some(Ok(answer)) => read.shape(id, answer.clone()),
                Some(Err(e)) => Err(e.clone()),
                None => Err(ToolError::new(
                    ErrorKind::BackendFailed,
                    "the stopped-scope read did not run",
                )),
            };
            // The answer is kept whatever the stop proved: the receipts were read.
            // The verdict is the stop's (then the read's): failed unless both hold.
            let read_error = match answer {
                Ok(shaped) => {
                    op.set_result(shaped);
                    None
                }
                Err(error) => Some(error),
            };
            match persisted.err().or(read_error) {
                None => Verdict {
                    state: OpState::Succeeded,
                    error: None,
                },
                Some(error) => Verdict {
                    state: OpState::Failed,
                    error: Some(error),
                },
            }
        },
    )
}

pub(crate) async fn results_list(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
) -> Result<ReceiptRead<ReceiptList>, ToolError> {
    let a: ResultsListArgs = call.parse()?;
    let limit = args::RESULTS_LIMIT.check(a.limit)? as usize;
    let wait = args::WAIT.duration(a.wait_ms)?;
    read_receipts(ctx, call, view, ReceiptQuery::List { limit }, wait).await
}

pub(crate) async fn result_get(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
) -> Result<ReceiptRead<ReceiptOne>, ToolError> {
    let a: ResultGetArgs = call.parse()?;
    let selector = args::selector(&a.selector)?.to_owned();
    let wait = args::WAIT.duration(a.wait_ms)?;
    read_receipts(ctx, call, view, ReceiptQuery::Get { selector }, wait).await
}

pub(crate) async fn run(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
) -> Result<OperationReport, ToolError> {
    let a: ShellRunArgs = call.parse()?;
    let command = args::command(&a.command)?;
    let timeout = args::TIMEOUT.duration(a.timeout_ms)?;
    let wait = args::WAIT.duration(a.wait_ms)?;
    let max_bytes = args::max_bytes(a.max_bytes)?;
    let ticket = ctx.admission().admit(view.id, Admission::Run)?;
    let plan = Plan {
        kind: OpKind::ShellRun,
        timeout,
        steps: vec![Step::Marsh(Verb::Run(command.to_owned()))],
    };
    let op = ticket.launch(ctx, call.session, plan, None)?;
    let opts = ViewOptions {
        include_base64: a.include_base64.unwrap_or(false),
        max_bytes,
    };
    let mut data = report(&op, wait, call, opts).await;
    never_ran(&op)?;
    if data.hint.is_none() && network_hint::looks_like_no_network(&op) {
        data.hint = network_hint::for_scope(ctx, view).await;
    }
    Ok(data)
}

/// A run the backend could not start at all (marsh's spawn-blocked exit) is an error
/// of the call, never `ok: true` with a failed state. The operation stays readable by
/// its id, which the message names.
fn never_ran(op: &Operation) -> Result<(), ToolError> {
    let status = op.status();
    match status.error {
        Some(error) if status.state.is_terminal() && error.kind == ErrorKind::BackendFailed => {
            Err(ToolError::new(
                error.kind,
                format!("{} (operation {})", error.message, op.id),
            ))
        }
        _ => Ok(()),
    }
}

pub(crate) async fn workers(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
    step: WorkerStep,
) -> Result<WorkersResult, ToolError> {
    let a: SelectionArgs = call.parse()?;
    let selection = args::selection(a.selection.as_deref())?;
    let wait = args::WAIT.duration(a.wait_ms)?;
    let (kind, verb) = match step {
        WorkerStep::Prewarm => (
            OpKind::Prewarm,
            Verb::LoadRun {
                selection: selection.clone(),
                command: "true".into(),
            },
        ),
        WorkerStep::WorkersReset => (OpKind::WorkersReset, Verb::WorkersReset(selection.clone())),
    };
    let ticket = ctx.admission().admit(view.id, Admission::Workers(step))?;
    check_kits(ctx, view, &selection).await?;
    let plan = Plan {
        kind,
        timeout: LIFECYCLE_TIMEOUT,
        steps: vec![Step::Marsh(verb)],
    };
    let op = ticket.launch(ctx, call.session, plan, None)?;
    Ok(WorkersResult {
        report: report_log(&op, wait, call).await,
        selection,
    })
}
