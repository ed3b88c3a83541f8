//! The default-scope aliases: status, results_list, result_get, shell_run, prewarm,
//! workers_reset.

use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::args::{self, ResultGetArgs, ResultsListArgs, SelectionArgs, ShellRunArgs};
use super::envelope::{ErrorKind, ToolError, ToolResult};
use super::launch;
use super::views::ViewOptions;
use crate::admission::Lifecycle;
use crate::context::ServerContext;
use crate::marsh::Verb;
use crate::operations::{OpKind, SessionId};
use marsh_scope_registry::ScopeState;

/// Timeout of prewarm and worker resets (they boot workers, which can be slow).
const LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Runtime fields passed through from `marsh status`; anything else (host paths in
/// particular) stays on the host.
const RUNTIME_FIELDS: &[&str] = &["daemon", "shell", "workers", "active_jobs"];
/// Receipt fields that are never shown to a caller.
const HIDDEN_RECEIPT_FIELDS: &[&str] = &["workspace", "home"];

async fn read_permit(ctx: &ServerContext) -> Result<tokio::sync::SemaphorePermit<'_>, ToolError> {
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

pub async fn status(ctx: &ServerContext) -> ToolResult {
    let state = ctx.scope.state();
    let (runs, lifecycle) = ctx.scope.gate.snapshot();
    let runtime = match state {
        ScopeState::Ready => {
            let home = ctx.scope.verified_home()?;
            let _permit = read_permit(ctx).await?;
            let raw = ctx.driver.query_json(Verb::Status, home).await?;
            let mut kept = Map::new();
            for key in RUNTIME_FIELDS {
                if let Some(v) = raw.get(*key) {
                    kept.insert((*key).into(), v.clone());
                }
            }
            Value::Object(kept)
        }
        _ => Value::Null,
    };
    let runtime_state = match (&runtime, state) {
        (Value::Object(m), _)
            if m.get("daemon")
                .and_then(|d| d.get("state"))
                .and_then(Value::as_str)
                == Some("running") =>
        {
            "present"
        }
        (Value::Object(_), _) => "absent",
        (_, ScopeState::Stopped) => "absent",
        _ => "unknown",
    };
    Ok(json!({
        "scope_id": ctx.scope.id,
        "state": state.as_str(),
        "mode": ctx.scope.mode(),
        "runtime_state": runtime_state,
        "runtime": runtime,
        "active_runs": runs,
        "lifecycle_in_progress": lifecycle,
        "operation_slots_free": ctx.cap.available(),
        "workspace_hash": ctx.workspace_hash,
    }))
}

pub async fn results_list(ctx: &ServerContext, raw: Option<Map<String, Value>>) -> ToolResult {
    let a: ResultsListArgs = args::parse(raw)?;
    let limit = args::bounded("limit", a.limit, 1, 100, 20)? as usize;
    let home = ctx.scope.ready_home()?;
    let _permit = read_permit(ctx).await?;
    let listed = ctx.driver.query_json(Verb::Results, home).await?;
    let all = listed
        .get("results")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = all.len();
    let results: Vec<Value> = all.into_iter().take(limit).map(strip_receipt).collect();
    Ok(json!({
        "scope_id": ctx.scope.id,
        "results": results,
        "returned": results.len(),
        "truncated": total > limit,
    }))
}

pub async fn result_get(ctx: &ServerContext, raw: Option<Map<String, Value>>) -> ToolResult {
    let a: ResultGetArgs = args::parse(raw)?;
    let selector = args::selector(&a.selector)?;
    let home = ctx.scope.ready_home()?;
    let _permit = read_permit(ctx).await?;
    let receipt = ctx
        .driver
        .query_json(Verb::ResultShow(selector), home)
        .await?;
    Ok(json!({"scope_id": ctx.scope.id, "result": strip_receipt(receipt)}))
}

pub async fn shell_run(
    ctx: &ServerContext,
    session: SessionId,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let a: ShellRunArgs = args::parse(raw)?;
    let command = args::command(&a.command)?;
    let timeout = args::timeout(a.timeout_ms, args::TIMEOUT_DEFAULT_MS)?;
    let wait = args::wait(a.wait_ms, args::WAIT_DEFAULT_MS)?;
    let max_bytes = args::max_bytes(a.max_bytes)?;
    let home = ctx.scope.ready_home()?;
    let run = ctx.scope.gate.try_run()?;
    let permit = ctx.cap.try_admit()?;
    let cmd = ctx.driver.command(Verb::Run(command), home)?;
    let op = launch::start(
        ctx,
        session,
        OpKind::ShellRun,
        ctx.scope.id,
        timeout,
        cmd,
        (permit, Box::new(run)),
    )?;
    let opts = ViewOptions {
        include_base64: a.include_base64.unwrap_or(false),
    };
    Ok(launch::report(&op, wait, request, max_bytes, opts).await)
}

async fn lifecycle_op(
    ctx: &ServerContext,
    session: SessionId,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
    kind: OpKind,
) -> ToolResult {
    let a: SelectionArgs = args::parse(raw)?;
    let selection = args::selection(a.selection.as_deref())?;
    let wait = args::wait(a.wait_ms, args::WAIT_DEFAULT_MS)?;
    let home = ctx.scope.ready_home()?;
    let (lifecycle, verb) = match kind {
        OpKind::Prewarm => (
            Lifecycle::Prewarm,
            Verb::LoadRun {
                selection: &selection,
                command: "true",
            },
        ),
        OpKind::WorkersReset => (Lifecycle::WorkersReset, Verb::WorkersReset(&selection)),
        OpKind::ShellRun | OpKind::Qualify => {
            return Err(ToolError::new(
                ErrorKind::Internal,
                "not a scope lifecycle operation",
            ));
        }
    };
    let guard = ctx.scope.gate.try_lifecycle(lifecycle)?;
    let permit = ctx.cap.try_admit()?;
    let cmd = ctx.driver.command(verb, home)?;
    let op = launch::start(
        ctx,
        session,
        kind,
        ctx.scope.id,
        LIFECYCLE_TIMEOUT,
        cmd,
        (permit, Box::new(guard)),
    )?;
    let opts = ViewOptions {
        include_base64: false,
    };
    let mut data = launch::report(&op, wait, request, args::MAX_BYTES_DEFAULT as usize, opts).await;
    if let Some(map) = data.as_object_mut() {
        map.insert("selection".into(), Value::from(selection));
    }
    Ok(data)
}

pub async fn prewarm(
    ctx: &ServerContext,
    session: SessionId,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    lifecycle_op(ctx, session, raw, request, OpKind::Prewarm).await
}

pub async fn workers_reset(
    ctx: &ServerContext,
    session: SessionId,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    lifecycle_op(ctx, session, raw, request, OpKind::WorkersReset).await
}
