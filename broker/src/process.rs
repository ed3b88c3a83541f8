//! Running one child for an operation: its own process group, null stdin, both output
//! pipes captured into the operation's log, and a bounded end under timeout or cancel
//! (SIGINT, then SIGTERM, then SIGKILL to the whole group).

use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::operations::Operation;
use crate::output::Stream;

/// Grace between escalation steps.
const ESCALATION_STEP: Duration = Duration::from_millis(1500);
/// How long pipes may stay open after the child ended (inherited by a straggler).
const DRAIN_BOUND: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 64 * 1024;

#[derive(Debug)]
pub enum Ending {
    Exited(ExitStatus),
    /// The timeout fired; the status is the child's once the escalation reaped it.
    TimedOut(Option<ExitStatus>),
    Cancelled(Option<ExitStatus>),
    SpawnFailed(std::io::Error),
}

#[derive(Debug)]
pub struct Supervised {
    pub ending: Ending,
    /// Both pipes reached end of file within the drain bound.
    pub drained: bool,
}

pub fn exit_parts(status: &ExitStatus) -> (Option<i32>, Option<i32>) {
    (status.code(), status.signal())
}

/// Spawns `cmd` and supervises it to the end. The operation must already be marked
/// running by the caller; this never changes its state.
pub async fn supervise(op: &Arc<Operation>, mut cmd: Command) -> Supervised {
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(err) => {
            return Supervised {
                ending: Ending::SpawnFailed(err),
                drained: true,
            };
        }
    };
    let pgid = child.id().map(|id| Pid::from_raw(id as i32));
    let readers = [
        child
            .stdout
            .take()
            .map(|p| tokio::spawn(pump(Arc::clone(op), Stream::Stdout, p))),
        child
            .stderr
            .take()
            .map(|p| tokio::spawn(pump(Arc::clone(op), Stream::Stderr, p))),
    ];
    let cancel = op.cancel_token().clone();
    let ending = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Ending::Exited(status),
            Err(_) => Ending::Exited(ExitStatus::from_raw(0x7f00)),
        },
        () = tokio::time::sleep(op.timeout) => Ending::TimedOut(escalate(&mut child, pgid).await),
        () = cancel.cancelled() => Ending::Cancelled(escalate(&mut child, pgid).await),
    };
    // Whatever is left of the group after its leader ended is not ours to keep.
    if let Some(pgid) = pgid {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    let drained = drain(readers).await;
    Supervised { ending, drained }
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(op: Arc<Operation>, stream: Stream, mut pipe: R) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => op.append(stream, &buf[..n]),
        }
    }
}

async fn drain(readers: [Option<tokio::task::JoinHandle<()>>; 2]) -> bool {
    let mut drained = true;
    for reader in readers.into_iter().flatten() {
        let abort = reader.abort_handle();
        if tokio::time::timeout(DRAIN_BOUND, reader).await.is_err() {
            abort.abort();
            drained = false;
        }
    }
    drained
}

/// SIGINT, SIGTERM, SIGKILL to the group, each followed by a bounded wait.
async fn escalate(child: &mut Child, pgid: Option<Pid>) -> Option<ExitStatus> {
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGKILL] {
        if let Some(pgid) = pgid {
            let _ = killpg(pgid, signal);
        }
        if let Ok(Ok(status)) = tokio::time::timeout(ESCALATION_STEP, child.wait()).await {
            return Some(status);
        }
    }
    let _ = child.start_kill();
    tokio::time::timeout(ESCALATION_STEP, child.wait())
        .await
        .ok()
        .and_then(Result::ok)
}
