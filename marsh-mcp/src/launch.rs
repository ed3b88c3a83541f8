//! Running an admitted operation: a record is created, its plan's steps are
//! supervised in the background, and a verdict ends it.
//!
//! An operation is a plan of one or more steps run in order; the first step that
//! fails (or a cancel) skips the rest, except `Step::Finally` steps, which always run. A finish callback turns the outcome into the
//! operation's verdict, after applying whatever registry transition it implies, so
//! the persisted scope state is written before the operation reports its end.
//! Only [`Ticket::launch`] starts a plan: nothing runs that was not admitted first.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use marsh_scope_registry::{DirIdentity, RemovalLimits, remove_scope_home};
use serde_json::Value;

use crate::admission::Ticket;
use crate::context::ServerContext;
use crate::error::{ErrorKind, ToolError};
use crate::marsh::{EXIT_BUSY, EXIT_SPAWN_BLOCKED, QUERY_TIMEOUT, Verb, answer};
use crate::operations::{OpKind, OpState, Operation, SessionId};
use crate::output::Stream;
use crate::supervisor::{Ending, Sink, supervise};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub(crate) enum Step {
    /// A marsh invocation against the plan's home (pins revalidated at spawn); its
    /// output goes to the operation's log.
    Marsh(Verb),
    /// A marsh read whose JSON answer becomes [`Outcome::read`] instead of output. It
    /// never ends the plan: the steps after it run whatever it answered.
    Read(Verb),
    /// A marsh invocation that runs whatever happened before it — an earlier failure or
    /// a cancel — and that a cancel does not interrupt (only the plan's timeout bounds
    /// it): the exact stop that must follow a stopped-scope read.
    Finally(Verb),
    /// A fixed host recipe (qualification).
    Host { program: PathBuf, args: Vec<String> },
    /// Safe deletion of a generated scope home.
    RemoveHome {
        parent: PathBuf,
        name: String,
        identity: DirIdentity,
    },
}

/// What an admitted operation runs; its scope and home come from the ticket.
#[derive(Debug)]
pub(crate) struct Plan {
    pub kind: OpKind,
    /// The bound of each child step.
    pub timeout: Duration,
    pub steps: Vec<Step>,
}

/// How a plan ended.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// The step that failed or was not reached because of a cancel, if any.
    pub failed: Option<Step>,
    /// The last child's ending.
    pub ending: Option<Ending>,
    /// A failure before or instead of a child (pins, removal checks).
    pub error: Option<ToolError>,
    /// The answer of the plan's [`Step::Read`], if it has one and reached it.
    pub read: Option<Result<Value, ToolError>>,
    /// A [`Step::Finally`] failed (it always runs, so `false` in a plan that has one
    /// means it succeeded).
    pub finally_failed: bool,
    pub drained: bool,
}

impl Outcome {
    pub fn succeeded(&self) -> bool {
        self.failed.is_none() && self.error.is_none()
    }

    pub fn exit_code(&self) -> Option<i32> {
        match &self.ending {
            Some(Ending::Exited(s)) => s.code(),
            _ => None,
        }
    }
}

/// The operation's end as the finish callback decides it.
#[derive(Debug)]
pub(crate) struct Verdict {
    pub state: OpState,
    pub error: Option<ToolError>,
}

pub(crate) type Finish =
    Box<dyn FnOnce(&ServerContext, &Operation, &Outcome) -> Verdict + Send + 'static>;

impl Ticket {
    /// Starts `plan` as an operation owned by `session`; the ticket's holds live until
    /// its last child is reaped. A launch that fails after admission persisted a
    /// transitional state marks the scope failed (recoverable), never leaves it in
    /// flight.
    pub(crate) fn launch(
        self,
        ctx: &Arc<ServerContext>,
        session: SessionId,
        plan: Plan,
        finish: Option<Finish>,
    ) -> Result<Arc<Operation>, ToolError> {
        let parts = self.into_parts();
        let command = plan.steps.iter().find_map(|step| match step {
            Step::Marsh(Verb::Run(command)) => Some(command.as_str()),
            _ => None,
        });
        let op = Operation::running_command(session, plan.kind, parts.label, plan.timeout, command);
        let launched = start(ctx, op, parts.home, plan, parts.held, finish);
        if let (Err(error), Some((id, name))) = (&launched, parts.begun) {
            let why = format!("the operation could not start: {}", error.message);
            let _ = ctx
                .scopes
                .apply(id, marsh_scope_registry::Event::Failed, name, Some(&why));
        }
        launched
    }
}

/// Creates the record, marks it running and supervises `plan` in the background.
/// `held` (cap permit, scope guards) is dropped only after the last step ended and the
/// verdict is decided (a `finish` has persisted the scope's state), and before the
/// terminal state is published: whoever sees the operation end (an `operation_get`,
/// an `operation_cancel`) may start the next one at once and must find the slot and the
/// scope free. The other order let a caller that had just seen the end be refused
/// `capacity_exhausted`.
fn start<H: Send + 'static>(
    ctx: &Arc<ServerContext>,
    op: Arc<Operation>,
    home: PathBuf,
    plan: Plan,
    held: H,
    finish: Option<Finish>,
) -> Result<Arc<Operation>, ToolError> {
    ctx.ops.insert(Arc::clone(&op))?;
    op.mark_running();
    let running = Arc::clone(&op);
    let ctx = Arc::clone(ctx);
    tokio::spawn(async move {
        let outcome = run_plan(&ctx, &running, &home, plan.steps).await;
        let verdict = match finish {
            Some(finish) => finish(&ctx, &running, &outcome),
            None => default_verdict(&running, &outcome),
        };
        let (code, signal) = outcome
            .ending
            .as_ref()
            .map_or((None, None), Ending::exit_parts);
        drop(held);
        running.finish(verdict.state, code, signal, verdict.error, outcome.drained);
    });
    Ok(op)
}

async fn run_plan(
    ctx: &ServerContext,
    op: &Arc<Operation>,
    home: &Path,
    steps: Vec<Step>,
) -> Outcome {
    let mut outcome = Outcome {
        drained: true,
        ..Outcome::default()
    };
    let never = CancellationToken::new();
    for step in steps {
        let finally = matches!(step, Step::Finally(_));
        if !finally && (outcome.failed.is_some() || op.cancel_token().is_cancelled()) {
            // Skipped: after a failure or a cancel only `Finally` steps run.
            outcome.failed.get_or_insert(step);
            continue;
        }
        let cmd = match &step {
            Step::Marsh(verb) | Step::Finally(verb) => ctx.driver.command(verb, home),
            Step::Read(verb) => {
                let captured = ctx
                    .driver
                    .query_within(verb, home, QUERY_TIMEOUT, op.cancel_token())
                    .await;
                outcome.read = Some(captured.and_then(answer));
                continue;
            }
            Step::Host { program, args } => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Ok(ctx.driver.host_command(program, &args))
            }
            Step::RemoveHome {
                parent,
                name,
                identity,
            } => {
                let (parent, name, identity) = (parent.clone(), name.clone(), *identity);
                let removed = tokio::task::spawn_blocking(move || {
                    remove_scope_home(&parent, &name, identity, RemovalLimits::default())
                })
                .await;
                match removed {
                    Ok(Ok(report)) => {
                        op.append(
                            Stream::Stdout,
                            format!(
                                "removed the scope home: {} entries ({} directories, {} symlinks unlinked, none followed)\n",
                                report.entries, report.directories, report.symlinks_unlinked
                            )
                            .as_bytes(),
                        );
                        continue;
                    }
                    Ok(Err(e)) => Err(ToolError::new(
                        ErrorKind::BackendFailed,
                        format!("scope home removal refused: {e}"),
                    )),
                    Err(e) => Err(ToolError::new(
                        ErrorKind::Internal,
                        format!("removal task failed: {e}"),
                    )),
                }
            }
        };
        let cmd = match cmd {
            Ok(cmd) => cmd,
            Err(e) => {
                outcome.finally_failed |= finally;
                outcome.error.get_or_insert(e);
                outcome.failed.get_or_insert(step);
                continue;
            }
        };
        let sink: Arc<dyn Sink> = Arc::clone(op) as Arc<dyn Sink>;
        let cancel = if finally { &never } else { op.cancel_token() };
        let supervised = supervise(cmd, sink, op.timeout, cancel).await;
        outcome.drained &= supervised.drained;
        let ok = supervised.ending.succeeded();
        outcome.ending = Some(supervised.ending);
        if !ok {
            outcome.finally_failed |= finally;
            outcome.failed.get_or_insert(step);
        }
    }
    outcome
}

/// marsh's own diagnostic: the last stderr line, when it carries marsh's `marsh: `
/// prefix (marsh prints it last, after the job's bytes, if any).
fn marsh_diagnostic(op: &Operation) -> Option<String> {
    let tail = op.output().tail(1, 2000);
    let text = String::from_utf8_lossy(&tail.stderr);
    text.trim()
        .strip_prefix("marsh: ")
        .map(|line| line.to_owned())
}

/// Exit 126 is marsh's "spawn blocked", but also what a shell exits with for a command
/// it found and could not execute. Only an exit 126 whose last stderr line is marsh's
/// own diagnostic is the backend failing; any other 126 is the command's own result.
fn spawn_blocked(op: &Operation) -> bool {
    match op.kind {
        OpKind::ShellRun | OpKind::Qualify => marsh_diagnostic(op).is_some(),
        _ => true,
    }
}

pub(crate) fn stderr_tail(op: &Operation) -> String {
    let tail = op.output().tail(3, 2000);
    let text = String::from_utf8_lossy(&tail.stderr);
    let text = text.trim();
    if text.is_empty() {
        "no diagnostic on stderr".into()
    } else {
        text.to_owned()
    }
}

/// The verdict of plans without lifecycle bookkeeping.
pub(crate) fn default_verdict(op: &Operation, outcome: &Outcome) -> Verdict {
    let failed = |error| Verdict {
        state: OpState::Failed,
        error: Some(error),
    };
    if let Some(error) = &outcome.error {
        return failed(error.clone());
    }
    match &outcome.ending {
        None => Verdict {
            state: if op.cancel_token().is_cancelled() {
                OpState::CancellationUncertain
            } else {
                OpState::Succeeded
            },
            error: None,
        },
        Some(Ending::SpawnFailed(err)) => failed(ToolError::new(
            ErrorKind::BackendFailed,
            format!("cannot start the child: {err}"),
        )),
        Some(Ending::TimedOut(_)) => Verdict {
            state: OpState::TimedOut,
            error: Some(ToolError::new(
                ErrorKind::TimedOut,
                format!(
                    "timed out after {} ms; the process group was signalled (SIGINT, SIGTERM, SIGKILL). The same call would time out again: give it a larger timeout_ms (at most {}), or start it with wait_ms 0 and poll operation_get",
                    op.timeout.as_millis(),
                    crate::tools::TIMEOUT_MAX_MS,
                ),
            )),
        },
        Some(Ending::Cancelled(_)) => Verdict {
            state: OpState::CancellationUncertain,
            error: None,
        },
        Some(Ending::Exited(status)) => match (op.kind, status.code()) {
            (_, Some(0)) => Verdict {
                state: OpState::Succeeded,
                error: None,
            },
            // marsh could not run the job at all (spawn blocked).
            (_, Some(EXIT_SPAWN_BLOCKED)) if spawn_blocked(op) => failed(ToolError::new(
                ErrorKind::BackendFailed,
                marsh_diagnostic(op).unwrap_or_else(|| stderr_tail(op)),
            )),
            // A command's own failure is its result, not a server error.
            (OpKind::ShellRun | OpKind::Qualify, _) => Verdict {
                state: OpState::Exited,
                error: None,
            },
            (_, Some(EXIT_BUSY)) => failed(ToolError::new(ErrorKind::ScopeBusy, stderr_tail(op))),
            (_, _) => failed(ToolError::new(ErrorKind::BackendFailed, stderr_tail(op))),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;

    use super::*;

    fn op(kind: OpKind) -> Arc<Operation> {
        Operation::new(1, kind, "default".into(), Duration::from_millis(250))
    }

    fn exited(code: i32) -> Outcome {
        Outcome {
            ending: Some(Ending::Exited(ExitStatus::from_raw(code << 8))),
            ..Outcome::default()
        }
    }

    #[test]
    fn a_command_failure_is_its_result_but_a_marsh_failure_is_an_error() {
        let run = default_verdict(&op(OpKind::ShellRun), &exited(7));
        assert_eq!((run.state, run.error), (OpState::Exited, None));
        let ok = default_verdict(&op(OpKind::Prewarm), &exited(0));
        assert_eq!((ok.state, ok.error), (OpState::Succeeded, None));
        let busy = default_verdict(&op(OpKind::WorkersReset), &exited(EXIT_BUSY));
        assert_eq!(busy.error.map(|e| e.kind), Some(ErrorKind::ScopeBusy));
        let broken = default_verdict(&op(OpKind::Prewarm), &exited(1));
        assert_eq!(broken.error.map(|e| e.kind), Some(ErrorKind::BackendFailed));
    }

    #[test]
    fn timeouts_cancels_spawn_failures_and_pre_child_errors() {
        let timed_out = Outcome {
            ending: Some(Ending::TimedOut(None)),
            ..Outcome::default()
        };
        let v = default_verdict(&op(OpKind::ShellRun), &timed_out);
        assert_eq!(v.state, OpState::TimedOut);
        assert!(v.error.is_some_and(|e| e.message.contains("250 ms")));
        let cancelled = Outcome {
            ending: Some(Ending::Cancelled(None)),
            ..Outcome::default()
        };
        let v = default_verdict(&op(OpKind::ShellRun), &cancelled);
        assert_eq!((v.state, v.error), (OpState::CancellationUncertain, None));
        let spawn = Outcome {
            ending: Some(Ending::SpawnFailed(std::io::Error::other("gone"))),
            ..Outcome::default()
        };
        let v = default_verdict(&op(OpKind::ShellRun), &spawn);
        assert_eq!(v.error.map(|e| e.kind), Some(ErrorKind::BackendFailed));
        let pinned = Outcome {
            error: Some(ToolError::new(ErrorKind::ExecutableChanged, "swapped")),
            ..Outcome::default()
        };
        let v = default_verdict(&op(OpKind::ShellRun), &pinned);
        assert_eq!(v.error.map(|e| e.kind), Some(ErrorKind::ExecutableChanged));
        // No child ran and nothing failed (a removal): success, unless cancelled.
        let none = Outcome::default();
        assert_eq!(
            default_verdict(&op(OpKind::ScopeRemove), &none).state,
            OpState::Succeeded
        );
        let cancelled_op = op(OpKind::ScopeRemove);
        cancelled_op.request_cancel();
        assert_eq!(
            default_verdict(&cancelled_op, &none).state,
            OpState::CancellationUncertain
        );
    }
}
