//! Starting an operation: admission already granted, a record created, the child
//! supervised in the background, and the caller optionally waiting for the end.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::process::Command;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::envelope::{ErrorKind, ToolError};
use super::views::{ViewOptions, read_fields};
use crate::context::ServerContext;
use crate::marsh::EXIT_BUSY;
use crate::operations::{OpKind, OpState, Operation, SessionId};
use crate::process::{Ending, exit_parts, supervise};

/// Whatever must stay held until the child is reaped (cap permit, scope guards).
pub type Held = (OwnedSemaphorePermit, Box<dyn Send + 'static>);

pub fn start(
    ctx: &ServerContext,
    session: SessionId,
    kind: OpKind,
    scope: &'static str,
    timeout: Duration,
    cmd: Command,
    held: Held,
) -> Result<Arc<Operation>, ToolError> {
    let op = Operation::new(session, kind, scope, timeout);
    ctx.ops.insert(Arc::clone(&op))?;
    op.mark_running();
    let running = Arc::clone(&op);
    tokio::spawn(async move {
        let supervised = supervise(&running, cmd).await;
        let (state, code, signal, error) = interpret(&running, kind, &supervised.ending);
        running.finish(state, code, signal, error, supervised.drained);
        drop(held);
    });
    Ok(op)
}

fn stderr_tail(op: &Operation) -> String {
    let tail = op.output().tail(3, 2000);
    let text = String::from_utf8_lossy(&tail.stderr);
    let text = text.trim();
    if text.is_empty() {
        "no diagnostic on stderr".into()
    } else {
        text.to_owned()
    }
}

fn interpret(
    op: &Operation,
    kind: OpKind,
    ending: &Ending,
) -> (OpState, Option<i32>, Option<i32>, Option<ToolError>) {
    match ending {
        Ending::SpawnFailed(err) => (
            OpState::Failed,
            None,
            None,
            Some(ToolError::new(
                ErrorKind::BackendFailed,
                format!("cannot start the child: {err}"),
            )),
        ),
        Ending::TimedOut(status) => {
            let (code, signal) = status.as_ref().map_or((None, None), exit_parts);
            let error = ToolError::new(
                ErrorKind::TimedOut,
                format!(
                    "timed out after {} ms; the process group was signalled (SIGINT, SIGTERM, SIGKILL)",
                    op.timeout.as_millis()
                ),
            );
            (OpState::TimedOut, code, signal, Some(error))
        }
        Ending::Cancelled(status) => {
            let (code, signal) = status.as_ref().map_or((None, None), exit_parts);
            (OpState::CancellationUncertain, code, signal, None)
        }
        Ending::Exited(status) => {
            let (code, signal) = exit_parts(status);
            match (kind, code) {
                (_, Some(0)) => (OpState::Succeeded, code, signal, None),
                // A command's own failure is its result, not a server error.
                (OpKind::ShellRun | OpKind::Qualify, _) => (OpState::Failed, code, signal, None),
                (OpKind::Prewarm | OpKind::WorkersReset, Some(EXIT_BUSY)) => (
                    OpState::Failed,
                    code,
                    signal,
                    Some(ToolError::new(ErrorKind::ScopeBusy, stderr_tail(op))),
                ),
                (OpKind::Prewarm | OpKind::WorkersReset, _) => (
                    OpState::Failed,
                    code,
                    signal,
                    Some(ToolError::new(ErrorKind::BackendFailed, stderr_tail(op))),
                ),
            }
        }
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
