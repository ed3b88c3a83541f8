//! Starting an operation: admission already granted, a record created, its steps
//! supervised in the background, and the caller optionally waiting for the end.
//!
//! An operation is a plan of one or more steps run in order; the first step that
//! fails (or a cancel) ends it. A finish callback turns the outcome into the
//! operation's verdict, after applying whatever registry transition it implies, so
//! the persisted scope state is written before the operation reports its end.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use marsh_scope_registry::{DirIdentity, RemovalLimits, remove_scope_home};
use serde_json::{Map, Value};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::envelope::{ErrorKind, ToolError};
use super::views::{ViewOptions, read_fields};
use crate::context::ServerContext;
use crate::marsh::{EXIT_BUSY, Verb};
use crate::operations::{OpKind, OpState, Operation, SessionId};
use crate::output::Stream;
use crate::process::{Ending, exit_parts, supervise};

/// Whatever must stay held until the last child is reaped (cap permit, scope guards).
pub type Held = (Option<OwnedSemaphorePermit>, Box<dyn Send + 'static>);

#[derive(Debug, Clone)]
pub enum Step {
    /// A marsh invocation against the plan's home (pins revalidated at spawn).
    Marsh(Verb),
    /// A fixed host recipe (qualification).
    Host { program: PathBuf, args: Vec<String> },
    /// Safe deletion of a generated scope home.
    RemoveHome {
        parent: PathBuf,
        name: String,
        identity: DirIdentity,
    },
}

#[derive(Debug)]
pub struct Plan {
    pub kind: OpKind,
    pub scope: String,
    pub home: PathBuf,
    pub timeout: Duration,
    pub steps: Vec<Step>,
}

/// How a plan ended.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The step that failed or was not reached because of a cancel, if any.
    pub failed: Option<Step>,
    /// The last child's ending.
    pub ending: Option<Ending>,
    /// A failure before or instead of a child (pins, removal checks).
    pub error: Option<ToolError>,
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
pub struct Verdict {
    pub state: OpState,
    pub error: Option<ToolError>,
}

pub type Finish = Box<dyn FnOnce(&ServerContext, &Operation, &Outcome) -> Verdict + Send + 'static>;

pub fn start(
    ctx: &Arc<ServerContext>,
    session: SessionId,
    plan: Plan,
    held: Held,
    finish: Option<Finish>,
) -> Result<Arc<Operation>, ToolError> {
    let op = Operation::new(session, plan.kind, plan.scope.clone(), plan.timeout);
    ctx.ops.insert(Arc::clone(&op))?;
    op.mark_running();
    let running = Arc::clone(&op);
    let ctx = Arc::clone(ctx);
    tokio::spawn(async move {
        let outcome = run_plan(&ctx, &running, plan).await;
        let verdict = match finish {
            Some(finish) => finish(&ctx, &running, &outcome),
            None => default_verdict(&running, &outcome),
        };
        let (code, signal) = match &outcome.ending {
            Some(Ending::Exited(s)) => exit_parts(s),
            Some(Ending::TimedOut(Some(s)) | Ending::Cancelled(Some(s))) => exit_parts(s),
            _ => (None, None),
        };
        running.finish(verdict.state, code, signal, verdict.error, outcome.drained);
        drop(held);
    });
    Ok(op)
}

async fn run_plan(ctx: &ServerContext, op: &Arc<Operation>, plan: Plan) -> Outcome {
    let mut outcome = Outcome {
        drained: true,
        ..Outcome::default()
    };
    for step in plan.steps {
        if op.cancel_token().is_cancelled() {
            outcome.failed = Some(step);
            break;
        }
        let cmd = match &step {
            Step::Marsh(verb) => ctx.driver.command(verb, &plan.home),
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
                outcome.error = Some(e);
                outcome.failed = Some(step);
                break;
            }
        };
        let supervised = supervise(op, cmd).await;
        outcome.drained &= supervised.drained;
        let ok = matches!(&supervised.ending, Ending::Exited(s) if s.success());
        outcome.ending = Some(supervised.ending);
        if !ok {
            outcome.failed = Some(step);
            break;
        }
    }
    outcome
}

pub fn stderr_tail(op: &Operation) -> String {
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
pub fn default_verdict(op: &Operation, outcome: &Outcome) -> Verdict {
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
                    "timed out after {} ms; the process group was signalled (SIGINT, SIGTERM, SIGKILL)",
                    op.timeout.as_millis()
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
            // A command's own failure is its result, not a server error.
            (OpKind::ShellRun | OpKind::Qualify, _) => Verdict {
                state: OpState::Failed,
                error: None,
            },
            (_, Some(EXIT_BUSY)) => failed(ToolError::new(ErrorKind::ScopeBusy, stderr_tail(op))),
            (_, _) => failed(ToolError::new(ErrorKind::BackendFailed, stderr_tail(op))),
        },
    }
}

/// Waits up to `wait` (or until the request is cancelled, which cancels the
/// operation too), then reports the operation with its output from the start.
pub async fn report(
    op: &Arc<Operation>,
    wait: Duration,
    request: &CancellationToken,
    max_bytes: usize,
    opts: ViewOptions,
) -> Value {
    let status = op.wait_for_end(wait, request).await;
    if request.is_cancelled() {
        op.request_cancel();
    }
    let mut data = match op.describe() {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let read = op.output().read_since(0, max_bytes);
    let complete =
        status.state.is_terminal() && status.output_drained && !read.capped && !read.evicted;
    data.extend(read_fields(&read, opts));
    data.insert("output_complete".into(), Value::from(complete));
    if !status.state.is_terminal() {
        data.insert(
            "hint".into(),
            Value::from("still running: poll operation_get (wait_ms) and read operation_output from next_seq"),
        );
    } else if read.capped {
        data.insert(
            "hint".into(),
            Value::from("more output is retained: call operation_output with since_seq = next_seq"),
        );
    }
    Value::Object(data)
}
