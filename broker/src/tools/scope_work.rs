//! Work inside one scope: status, receipts, runs, prewarm and worker resets. The
//! default-scope aliases and the `scope_*` tools share these implementations.

use std::sync::Arc;
use std::time::Duration;

use marsh_scope_registry::{Event, ScopeState};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::args::{self, ResultGetArgs, ResultsListArgs, SelectionArgs, ShellRunArgs};
use super::envelope::{ErrorKind, ToolError, ToolResult};
use super::launch::{self, Plan, Step};
use super::views::ViewOptions;
use crate::admission::Lifecycle;
use crate::context::ServerContext;
use crate::marsh::{EXIT_BUSY, Verb};
use crate::operations::{OpKind, SessionId};
use crate::scopes::ScopeView;

/// Timeout of prewarm and worker resets (they boot workers, which can be slow).
pub const LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Runtime fields passed through from `marsh status`; anything else (host paths in
/// particular) stays on the host.
const RUNTIME_FIELDS: &[&str] = &["daemon", "shell", "workers", "active_jobs"];
/// Receipt fields that are never shown to a caller.
const HIDDEN_RECEIPT_FIELDS: &[&str] = &["workspace", "home"];

fn read_permit(ctx: &ServerContext) -> Result<tokio::sync::SemaphorePermit<'_>, ToolError> {
    ctx.reads.try_acquire().map_err(|_| {
        ToolError::new(
            ErrorKind::CapacityExhausted,
            "too many concurrent status/result reads; retry shortly",
        )
    })
}

fn strip_receipt(mut receipt: Value) -> Value {
    if let Some(map) = receipt.as_object_mut() {
        for key in HIDDEN_RECEIPT_FIELDS {
            map.remove(*key);
        }
    }
    receipt
}

/// Status of one scope. Only a ready scope's runtime is probed; a stopped one is
/// `absent`, and failed or transitioning ones report their persisted state only.
pub async fn status(ctx: &ServerContext, view: &ScopeView) -> ToolResult {
    let state = view.state();
    let (runs, lifecycle) = ctx.scopes.gate(view.id).snapshot();
    let (runtime_state, runtime) = match state {
        ScopeState::Ready if !view.identity_invalid() => {
            let home = ctx.scopes.verified_home(view)?;
            let _permit = read_permit(ctx)?;
            let raw = ctx.driver.query_json(&Verb::Status, &home).await?;
            let mut kept = Map::new();
            for key in RUNTIME_FIELDS {
                if let Some(v) = raw.get(*key) {
                    kept.insert((*key).into(), v.clone());
                }
            }
            let running = raw.pointer("/daemon/state").and_then(Value::as_str) == Some("running");
            (
                if running { "present" } else { "absent" },
                Value::Object(kept),
            )
        }
        ScopeState::Stopped => ("absent", Value::Null),
        _ => ("unknown", Value::Null),
    };
    let mut data = match view.describe() {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    data.insert("mode".into(), Value::from(ctx.scopes.mode()));
    data.insert("runtime_state".into(), Value::from(runtime_state));
    data.insert("runtime".into(), runtime);
    data.insert("active_runs".into(), Value::from(runs));
    data.insert("lifecycle_in_progress".into(), json!(lifecycle));
    data.insert(
        "operation_slots_free".into(),
        Value::from(ctx.cap.available()),
    );
    data.insert(
        "workspace_hash".into(),
        Value::from(ctx.workspace_hash.clone()),
    );
    Ok(Value::Object(data))
}

/// Runs a receipt read against `view`: directly when ready; for a stopped scope under
/// exclusive access, always followed by an exact stop (600 s bound) whose failure
/// marks the scope failed.
async fn read_receipts(
    ctx: &ServerContext,
    view: &ScopeView,
    verb: Verb,
) -> Result<Value, ToolError> {
    if view.state() != ScopeState::Stopped || view.identity_invalid() {
        let home = ctx.scopes.ready_home(view)?;
        let _permit = read_permit(ctx)?;
        return ctx.driver.query_json(&verb, &home).await;
    }
    let home = ctx.scopes.verified_home(view)?;
    let _guard = ctx
        .scopes
        .gate(view.id)
        .try_lifecycle(Lifecycle::Exclusive("a stopped-scope receipt read"))?;
    let _permit = read_permit(ctx)?;
    ctx.scopes
        .apply(view.id, Event::BeginStoppedRead, "stopped_read", None)?;
    let read = ctx.driver.query_json(&verb, &home).await;
    let stop = ctx
        .driver
        .query_within(&Verb::Stop, &home, LIFECYCLE_TIMEOUT)
        .await;
    match stop {
        Ok(out) if out.code == Some(0) => {
            ctx.scopes
                .apply(view.id, Event::Succeeded, "stopped_read", None)?;
        }
        Ok(out) => {
            let why = format!(
                "exact stop after a stopped-scope read was not proven: {}",
                out.stderr_line()
            );
            ctx.scopes
                .apply(view.id, Event::Failed, "stopped_read", Some(&why))?;
        }
        Err(e) => {
            let why = format!(
                "exact stop after a stopped-scope read failed: {}",
                e.message
            );
            ctx.scopes
                .apply(view.id, Event::Failed, "stopped_read", Some(&why))?;
        }
    }
    read
}

pub async fn results_list(
    ctx: &ServerContext,
    view: &ScopeView,
    raw: Option<Map<String, Value>>,
) -> ToolResult {
    let a: ResultsListArgs = args::parse(raw)?;
    let limit = args::bounded("limit", a.limit, 1, 100, 20)? as usize;
    let listed = read_receipts(ctx, view, Verb::Results).await?;
    let all = listed
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = all.len();
    let results: Vec<Value> = all.into_iter().take(limit).map(strip_receipt).collect();
    Ok(json!({
        "scope_id": view.id.to_string(),
        "results": results,
        "returned": results.len(),
        "truncated": total > limit,
    }))
}

pub async fn result_get(
    ctx: &ServerContext,
    view: &ScopeView,
    raw: Option<Map<String, Value>>,
) -> ToolResult {
    let a: ResultGetArgs = args::parse(raw)?;
    let selector = args::selector(&a.selector)?;
    let receipt = read_receipts(ctx, view, Verb::ResultShow(selector.to_owned())).await?;
    Ok(json!({"scope_id": view.id.to_string(), "result": strip_receipt(receipt)}))
}

pub async fn run(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    view: &ScopeView,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let a: ShellRunArgs = args::parse(raw)?;
    let command = args::command(&a.command)?;
    let timeout = args::timeout(a.timeout_ms, args::TIMEOUT_DEFAULT_MS)?;
    let wait = args::wait(a.wait_ms, args::WAIT_DEFAULT_MS)?;
    let max_bytes = args::max_bytes(a.max_bytes)?;
    // The gate first: a scope held by a lifecycle operation is busy (retryable), not
    // merely "not ready".
    let run = ctx.scopes.gate(view.id).try_run()?;
    // Re-read under the guard: no lifecycle step can change the state while it is held.
    let view = &ctx.scopes.view(view.id)?;
    let home = ctx.scopes.ready_home(view)?;
    let permit = ctx.cap.try_admit()?;
    let plan = Plan {
        kind: OpKind::ShellRun,
        scope: view.id.to_string(),
        home,
        timeout,
        steps: vec![Step::Marsh(Verb::Run(command.to_owned()))],
    };
    // Pins are checked before the record exists: a changed binary is a refusal.
    ctx.driver.revalidate()?;
    let op = launch::start(ctx, session, plan, (Some(permit), Box::new(run)), None)?;
    let opts = ViewOptions {
        include_base64: a.include_base64.unwrap_or(false),
    };
    Ok(launch::report(&op, wait, request, max_bytes, opts).await)
}

pub async fn workers(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    view: &ScopeView,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
    kind: OpKind,
) -> ToolResult {
    let a: SelectionArgs = args::parse(raw)?;
    let selection = args::selection(a.selection.as_deref())?;
    let wait = args::wait(a.wait_ms, args::WAIT_DEFAULT_MS)?;
    let (lifecycle, verb) = match kind {
        OpKind::Prewarm => (
            Lifecycle::Prewarm,
            Verb::LoadRun {
                selection: selection.clone(),
                command: "true".into(),
            },
        ),
        OpKind::WorkersReset => (
            Lifecycle::WorkersReset,
            Verb::WorkersReset(selection.clone()),
        ),
        _ => {
            return Err(ToolError::new(
                ErrorKind::Internal,
                "not a worker operation",
            ));
        }
    };
    let guard = ctx.scopes.gate(view.id).try_lifecycle(lifecycle)?;
    let view = &ctx.scopes.view(view.id)?;
    let home = ctx.scopes.ready_home(view)?;
    let permit = ctx.cap.try_admit()?;
    ctx.driver.revalidate()?;
    let plan = Plan {
        kind,
        scope: view.id.to_string(),
        home,
        timeout: LIFECYCLE_TIMEOUT,
        steps: vec![Step::Marsh(verb)],
    };
    let op = launch::start(ctx, session, plan, (Some(permit), Box::new(guard)), None)?;
    let opts = ViewOptions {
        include_base64: false,
    };
    let mut data = launch::report(&op, wait, request, args::MAX_BYTES_DEFAULT as usize, opts).await;
    if let Some(map) = data.as_object_mut() {
        map.insert("selection".into(), Value::from(selection));
    }
    Ok(data)
}

/// Whether an exit status is marsh's busy refusal.
pub fn is_busy(code: Option<i32>) -> bool {
    code == Some(EXIT_BUSY)
}
