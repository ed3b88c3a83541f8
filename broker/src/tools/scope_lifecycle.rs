//! Whole-scope lifecycle: scope_start, scope_list, scope_reset, scope_stop,
//! scope_remove. Each persists its transitional state before any child starts and its
//! outcome before the operation reports its end.

use std::sync::Arc;
use std::time::Duration;

use marsh_scope_registry::{Event, ScopeId, ScopeState};
use serde_json::{Map, Value, json};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::args::{self, WaitArgs};
use super::envelope::{ErrorKind, ToolError, ToolResult};
use super::launch::{self, Finish, Outcome, Plan, Step, Verdict};
use super::scope_work::is_busy;
use super::views::ViewOptions;
use crate::admission::{Lifecycle, LifecycleGuard};
use crate::context::ServerContext;
use crate::marsh::Verb;
use crate::operations::{OpKind, OpState, Operation, SessionId};
use crate::scopes::{ScopeView, home_name};
use marsh_scope_registry::{MAX_LIVE_SCOPES, MAX_RETAINED_SCOPES};

/// The bound of every exact whole-scope lifecycle step.
const SCOPE_LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Turns a lifecycle plan's outcome into the registry transition and the verdict.
/// A cancelled or failed step leaves the scope failed (inspectable, recoverable with
/// scope_reset); marsh's busy refusal after a proven boot leaves it ready.
fn lifecycle_finish(id: ScopeId, kind: OpKind) -> Finish {
    Box::new(
        move |ctx: &ServerContext, op: &Operation, outcome: &Outcome| {
            let name = kind.as_str();
            let cancelled = op.cancel_token().is_cancelled();
            let (event, error) = if outcome.succeeded() && !cancelled {
                (Event::Succeeded, None)
            } else if cancelled {
                (
                    Event::Failed,
                    Some(ToolError::new(
                        ErrorKind::BackendFailed,
                        format!("{name} was cancelled; the runtime state is uncertain"),
                    )),
                )
            } else if let Some(error) = &outcome.error {
                (Event::Failed, Some(error.clone()))
            } else if matches!(outcome.failed, Some(Step::Marsh(Verb::Reset | Verb::Stop)))
                && is_busy(outcome.exit_code())
            {
                (
                    Event::RefusedBusy,
                    Some(ToolError::new(
                        ErrorKind::ScopeBusy,
                        launch::stderr_tail(op),
                    )),
                )
            } else {
                let base = launch::default_verdict(op, outcome);
                let error = base.error.unwrap_or_else(|| {
                    ToolError::new(ErrorKind::BackendFailed, launch::stderr_tail(op))
                });
                (Event::Failed, Some(error))
            };
            let diagnostic = error.as_ref().map(|e| e.message.clone());
            let persisted = ctx.scopes.apply(id, event, name, diagnostic.as_deref());
            let state = match (&error, event) {
                (None, _) => OpState::Succeeded,
                (Some(e), _) if e.kind == ErrorKind::TimedOut => OpState::TimedOut,
                _ => OpState::Failed,
            };
            match persisted {
                Ok(_) => Verdict { state, error },
                Err(persist) => Verdict {
                    state: OpState::Failed,
                    error: Some(persist),
                },
            }
        },
    )
}

/// One whole-scope lifecycle operation to start: its steps and what it holds.
struct LifecycleCall<'a> {
    view: &'a ScopeView,
    kind: OpKind,
    steps: Vec<Step>,
    held: launch::Held,
}

async fn start_lifecycle(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    call: LifecycleCall<'_>,
    wait: Duration,
    request: &CancellationToken,
) -> ToolResult {
    let LifecycleCall {
        view,
        kind,
        steps,
        held,
    } = call;
    let plan = Plan {
        kind,
        scope: view.id.to_string(),
        home: view.home.clone(),
        timeout: SCOPE_LIFECYCLE_TIMEOUT,
        steps,
    };
    let op = launch::start(
        ctx,
        session,
        plan,
        held,
        Some(lifecycle_finish(view.id, kind)),
    )?;
    let mut data = launch::report(
        &op,
        wait,
        request,
        args::MAX_BYTES_DEFAULT as usize,
        ViewOptions {
            include_base64: false,
        },
    )
    .await;
    if let (Some(map), Ok(now)) = (data.as_object_mut(), ctx.scopes.view(view.id)) {
        map.insert("scope".into(), now.describe());
    }
    Ok(data)
}

pub async fn scope_start(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let _: args::NoArgs = args::parse(raw)?;
    if !ctx.scopes.is_managed() {
        return Err(ToolError::new(
            ErrorKind::Disabled,
            "scope_start needs managed mode (--scope-root); this server runs a single legacy scope",
        ));
    }
    let permit = ctx.cap.try_admit()?;
    ctx.driver.revalidate()?;
    let view = ctx.scopes.create()?;
    let guard = ctx
        .scopes
        .gate(view.id)
        .try_lifecycle(Lifecycle::Exclusive("scope_start"))?;
    let wait = Duration::from_millis(args::WAIT_DEFAULT_MS);
    let steps = vec![Step::Marsh(Verb::boot())];
    let mut data = start_lifecycle(
        ctx,
        session,
        LifecycleCall {
            view: &view,
            kind: OpKind::ScopeStart,
            steps,
            held: (Some(permit), Box::new(guard)),
        },
        wait,
        request,
    )
    .await?;
    if let Some(map) = data.as_object_mut() {
        map.insert("scope_id".into(), Value::from(view.id.to_string()));
    }
    Ok(data)
}

pub fn scope_list(ctx: &ServerContext, raw: Option<Map<String, Value>>) -> ToolResult {
    let _: args::NoArgs = args::parse(raw)?;
    let scopes: Vec<Value> = ctx.scopes.list().iter().map(ScopeView::describe).collect();
    let (live, retained, _) = ctx.scopes.counts();
    Ok(json!({
        "mode": ctx.scopes.mode(),
        "scopes": scopes,
        "live_generated": live,
        "retained_generated": retained,
        "limits": {"live_generated": MAX_LIVE_SCOPES, "retained_generated": MAX_RETAINED_SCOPES},
    }))
}

/// A scope's lifecycle slot, held, with the scope as re-read under it. The gate is
/// taken first (a scope held by another lifecycle operation is busy), and no other
/// lifecycle step can change the state while the guard lives.
fn exclusive(
    ctx: &ServerContext,
    view: &ScopeView,
    name: &'static str,
) -> Result<(LifecycleGuard, ScopeView), ToolError> {
    let guard = ctx
        .scopes
        .gate(view.id)
        .try_lifecycle(Lifecycle::Exclusive(name))?;
    let view = ctx.scopes.view(view.id)?;
    Ok((guard, view))
}

/// Checks `event` is allowed and the home verifies, takes an operation slot when the
/// plan runs children, and persists the transitional state: in that order, so a
/// refusal changes nothing.
fn begin(
    ctx: &ServerContext,
    view: &ScopeView,
    event: Event,
    name: &str,
    runs_children: bool,
) -> Result<Option<OwnedSemaphorePermit>, ToolError> {
    ctx.scopes.check(view, event)?;
    ctx.scopes.verified_home(view)?;
    let permit = if runs_children {
        let permit = ctx.cap.try_admit()?;
        ctx.driver.revalidate()?;
        Some(permit)
    } else {
        None
    };
    ctx.scopes.apply(view.id, event, name, None)?;
    Ok(permit)
}

pub async fn scope_reset(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    view: &ScopeView,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let a: WaitArgs = args::parse(raw)?;
    let wait = args::wait(a.wait_ms, args::WAIT_DEFAULT_MS)?;
    let (guard, view) = exclusive(ctx, view, "scope_reset")?;
    let permit = begin(ctx, &view, Event::BeginReset, "scope_reset", true)?;
    // Boot so the exact control daemon exists, reset it, then validate the boot.
    let steps = vec![
        Step::Marsh(Verb::boot()),
        Step::Marsh(Verb::Reset),
        Step::Marsh(Verb::boot()),
    ];
    let call = LifecycleCall {
        view: &view,
        kind: OpKind::ScopeReset,
        steps,
        held: (permit, Box::new(guard)),
    };
    start_lifecycle(ctx, session, call, wait, request).await
}

pub async fn scope_stop(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    view: &ScopeView,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let a: WaitArgs = args::parse(raw)?;
    let wait = args::wait(a.wait_ms, args::WAIT_DEFAULT_MS)?;
    let (guard, view) = exclusive(ctx, view, "scope_stop")?;
    if view.state() == ScopeState::Stopped && !view.identity_invalid() {
        return Ok(
            json!({"scope": view.describe(), "note": "the scope is already stopped; nothing was run"}),
        );
    }
    let permit = begin(ctx, &view, Event::BeginStop, "scope_stop", true)?;
    // Boot/validate the exact runtime first so the stop addresses a proven daemon.
    let steps = vec![Step::Marsh(Verb::boot()), Step::Marsh(Verb::Stop)];
    let call = LifecycleCall {
        view: &view,
        kind: OpKind::ScopeStop,
        steps,
        held: (permit, Box::new(guard)),
    };
    start_lifecycle(ctx, session, call, wait, request).await
}

pub async fn scope_remove(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    view: &ScopeView,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let a: WaitArgs = args::parse(raw)?;
    let wait = args::wait(a.wait_ms, args::WAIT_DEFAULT_MS)?;
    if view.id == ScopeId::Default {
        return Err(ToolError::invalid(
            "the default scope cannot be removed (scope_stop stops it)",
        ));
    }
    let (guard, view) = exclusive(ctx, view, "scope_remove")?;
    let Some(record) = view.record.clone() else {
        return Err(crate::scopes::identity_error(view.id));
    };
    let (Some(parent), Some(name)) = (ctx.scopes.root_path(), home_name(&view.home)) else {
        return Err(ToolError::new(
            ErrorKind::Internal,
            "generated scope without a root",
        ));
    };
    // Removal holds no child process, so it takes no operation slot.
    let permit = begin(ctx, &view, Event::BeginRemove, "scope_remove", false)?;
    let steps = vec![Step::RemoveHome {
        parent,
        name,
        identity: record.home,
    }];
    let call = LifecycleCall {
        view: &view,
        kind: OpKind::ScopeRemove,
        steps,
        held: (permit, Box::new(guard)),
    };
    start_lifecycle(ctx, session, call, wait, request).await
}
