//! Whole-scope lifecycle: scope_start, scope_list, scope_reset, scope_stop,
//! scope_remove. Each is admitted on the one path (which persists its transitional
//! state before any child starts) and persists its outcome before the operation
//! reports its end.

use std::sync::Arc;
use std::time::Duration;

use super::Call;
use super::args::{self, NoArgs, WaitArgs};
use super::operation_reply::report_log;
use super::result_data::{
    LifecycleResult, ScopeCounts, ScopeListResult, ScopeStopResult, ScopeSummary,
};
use crate::admission::{Admission, LifecycleStep, Ticket};
use crate::context::ServerContext;
use crate::error::{ErrorKind, ToolError};
use crate::launch::{Finish, Outcome, Plan, Step, Verdict, default_verdict, stderr_tail};
use crate::marsh::{EXIT_BUSY, Verb};
use crate::operations::{OpKind, OpState, Operation};
use crate::scopes::{ScopeView, home_name, identity_error};
use marsh_scope_registry::{Event, MAX_LIVE_SCOPES, MAX_RETAINED_SCOPES, ScopeId, ScopeState};

/// The bound of every exact whole-scope lifecycle step.
const SCOPE_LIFECYCLE_TIMEOUT: Duration = Duration::from_secs(600);

/// Turns a lifecycle plan's outcome into the registry transition and the verdict.
/// A cancelled or failed step leaves the scope failed (inspectable, recoverable with
/// scope_reset); marsh's busy refusal after a proven boot leaves it ready — unless the
/// scope was failed (`from`): only a reset that succeeds recovers a failed scope.
fn lifecycle_finish(id: ScopeId, kind: OpKind, from: Option<ScopeState>) -> Finish {
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
                && outcome.exit_code() == Some(EXIT_BUSY)
            {
                let busy = stderr_tail(op);
                if from == Some(ScopeState::Failed) {
                    (
                        Event::Failed,
                        Some(ToolError::new(
                            ErrorKind::ScopeBusy,
                            format!(
                                "{busy}; the scope stays failed: only a scope_reset that succeeds recovers it (retry once its work has ended)"
                            ),
                        )),
                    )
                } else {
                    (
                        Event::RefusedBusy,
                        Some(ToolError::new(ErrorKind::ScopeBusy, busy)),
                    )
                }
            } else {
                let base = default_verdict(op, outcome);
                let error = base
                    .error
                    .unwrap_or_else(|| ToolError::new(ErrorKind::BackendFailed, stderr_tail(op)));
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

/// Launches an admitted whole-scope operation and reports it, with the scope as it
/// is afterwards.
async fn launch_lifecycle(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    ticket: Ticket,
    id: ScopeId,
    kind: OpKind,
    steps: Vec<Step>,
    wait: Duration,
) -> Result<LifecycleResult, ToolError> {
    let plan = Plan {
        kind,
        timeout: SCOPE_LIFECYCLE_TIMEOUT,
        steps,
    };
    let from = ticket.from;
    let op = ticket.launch(
        ctx,
        call.session,
        plan,
        Some(lifecycle_finish(id, kind, from)),
    )?;
    let report = report_log(&op, wait, call).await;
    Ok(LifecycleResult {
        report,
        scope: ctx.scopes.view(id).ok().as_ref().map(ScopeSummary::of),
    })
}

/// The operation's `scope_id` is the new scope's id.
pub(crate) async fn scope_start(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
) -> Result<LifecycleResult, ToolError> {
    let _: NoArgs = call.parse()?;
    if !ctx.scopes.is_managed() {
        return Err(ToolError::new(
            ErrorKind::Disabled,
            "scope_start needs managed mode (--scope-root); this server runs a single legacy scope",
        ));
    }
    let (id, ticket) = ctx.admission().admit_new_scope()?;
    let wait = Duration::from_millis(args::WAIT.default);
    let steps = vec![Step::Marsh(Verb::boot())];
    launch_lifecycle(ctx, call, ticket, id, OpKind::ScopeStart, steps, wait).await
}

pub(crate) fn scope_list(
    ctx: &ServerContext,
    call: Call<'_>,
) -> Result<ScopeListResult, ToolError> {
    let _: NoArgs = call.parse()?;
    let (live, retained, _) = ctx.scopes.counts();
    Ok(ScopeListResult {
        mode: ctx.scopes.mode(),
        scopes: ctx.scopes.list().iter().map(ScopeSummary::of).collect(),
        counts: ScopeCounts {
            live_generated: live,
            retained_generated: retained,
        },
        limits: ScopeCounts {
            live_generated: MAX_LIVE_SCOPES,
            retained_generated: MAX_RETAINED_SCOPES,
        },
    })
}

pub(crate) async fn scope_reset(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
) -> Result<LifecycleResult, ToolError> {
    let a: WaitArgs = call.parse()?;
    let wait = args::WAIT.duration(a.wait_ms)?;
    let ticket = ctx
        .admission()
        .admit(view.id, Admission::Lifecycle(LifecycleStep::Reset))?;
    // Boot so the exact control daemon exists, reset it, then validate the boot.
    let steps = vec![
        Step::Marsh(Verb::boot()),
        Step::Marsh(Verb::Reset),
        Step::Marsh(Verb::boot()),
    ];
    launch_lifecycle(ctx, call, ticket, view.id, OpKind::ScopeReset, steps, wait).await
}

pub(crate) async fn scope_stop(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
) -> Result<ScopeStopResult, ToolError> {
    let a: WaitArgs = call.parse()?;
    let wait = args::WAIT.duration(a.wait_ms)?;
    // A stopped scope's persisted state is only ever left under its gate, by an
    // admission that first persists a transitional state; so a fresh view that says
    // stopped is the truth, and stopping it again would only boot it.
    let now = ctx.scopes.view(view.id)?;
    if now.state() == ScopeState::Stopped && !now.identity_invalid() {
        return Ok(ScopeStopResult {
            report: None,
            scope: Some(ScopeSummary::of(&now)),
            note: Some("the scope is already stopped; nothing was run"),
        });
    }
    let ticket = ctx
        .admission()
        .admit(view.id, Admission::Lifecycle(LifecycleStep::Stop))?;
    // Boot/validate the exact runtime first so the stop addresses a proven daemon.
    let steps = vec![Step::Marsh(Verb::boot()), Step::Marsh(Verb::Stop)];
    launch_lifecycle(ctx, call, ticket, view.id, OpKind::ScopeStop, steps, wait)
        .await
        .map(ScopeStopResult::from)
}

pub(crate) async fn scope_remove(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
    view: &ScopeView,
) -> Result<LifecycleResult, ToolError> {
    let a: WaitArgs = call.parse()?;
    let wait = args::WAIT.duration(a.wait_ms)?;
    if view.id == ScopeId::Default {
        return Err(ToolError::invalid(
            "the default scope cannot be removed (scope_stop stops it)",
        ));
    }
    let (Some(parent), Some(name)) = (ctx.scopes.root_path(), home_name(&view.home)) else {
        return Err(ToolError::new(
            ErrorKind::Internal,
            "generated scope without a root",
        ));
    };
    // A record's home identity never changes, so the one read before the gate is the
    // one admission re-checks; nothing fallible stands between admission and launch.
    let Some(record) = view.record.clone() else {
        return Err(identity_error(view.id));
    };
    let ticket = ctx
        .admission()
        .admit(view.id, Admission::Lifecycle(LifecycleStep::Remove))?;
    let steps = vec![Step::RemoveHome {
        parent,
        name,
        identity: record.home,
    }];
    launch_lifecycle(ctx, call, ticket, view.id, OpKind::ScopeRemove, steps, wait).await
}
