//! The one child supervisor. Every process marsh-mcp starts — operation steps, marsh
//! queries, the installers' client CLIs — goes through [`supervise`]: its own process
//! group, stdin null (or a fixed input, see [`Input`]), both pipes pumped into a [`Sink`], a bounded end under timeout
//! or cancel (SIGINT, then SIGTERM, then SIGKILL to the whole group), and a reap.
//!
//! Invariants:
//! - the child is always reaped before `supervise` returns, except when even SIGKILL
//!   left it unreaped for a whole escalation step (then `kill_on_drop` still kills it);
//! - after the leader ends, whatever is left of its group is SIGKILLed: nothing the
//!   child started in its group outlives the supervision;
//! - pipes are drained for at most [`DRAIN_BOUND`] after the end (a straggler outside
//!   the group may hold them), and the result says whether they reached end of file;
//! - memory is bounded by the sink: [`Capture`] keeps a fixed prefix per stream;
//! - the child dies with marsh-mcp: [`ChildCommand::spawn`] gives it
//!   `PR_SET_PDEATHSIG(SIGKILL)`, so a `marsh -c` (and through the daemon, its job)
//!   never outlives a killed server. The signal follows the *thread* that spawned the
//!   child, so children are only spawned from runtime worker threads or a `block_on`
//!   caller, never from `spawn_blocking` or `block_in_place` threads, which the runtime
//!   retires while children still run.
//!
//! Rejected alternative: one runner per caller. The queries used to kill only the
//! leader on timeout and the installers polled `try_wait` from a thread; a stuck
//! grandchild then kept pipes and resources alive past every bound.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::lock::lock;
use crate::output::Stream;
use crate::spawn::{ChildCommand, ChildProcess, Spawned, StdinKind};

/// Grace between escalation steps.
const ESCALATION_STEP: Duration = Duration::from_millis(1500);
/// How long pipes may stay open after the child ended (inherited by a straggler).
const DRAIN_BOUND: Duration = Duration::from_secs(2);
const READ_CHUNK: usize = 64 * 1024;

/// Where a child's output goes as it arrives.
pub(crate) trait Sink: Send + Sync + 'static {
    fn append(&self, stream: Stream, data: &[u8]);
}

/// How a supervised child ended.
#[derive(Debug)]
pub(crate) enum Ending {
    Exited(ExitStatus),
    /// The timeout fired; the status is the child's once the escalation reaped it.
    TimedOut(Option<ExitStatus>),
    Cancelled(Option<ExitStatus>),
    SpawnFailed(std::io::Error),
}

impl Ending {
    /// `(exit code, signal)` of the reaped child, when there is one.
    pub(crate) fn exit_parts(&self) -> (Option<i32>, Option<i32>) {
        match self {
            Self::Exited(s) | Self::TimedOut(Some(s)) | Self::Cancelled(Some(s)) => {
                (s.code(), s.signal())
            }
            Self::TimedOut(None) | Self::Cancelled(None) | Self::SpawnFailed(_) => (None, None),
        }
    }

    pub(crate) fn succeeded(&self) -> bool {
        matches!(self, Self::Exited(s) if s.success())
    }
}

#[derive(Debug)]
pub(crate) struct Supervised {
    pub ending: Ending,
    /// Both pipes reached end of file within the drain bound.
    pub drained: bool,
    /// After the final SIGKILL, the child's process group was observed empty (`kill(-pgid, 0)`
    /// answered `ESRCH`) within [`GROUP_GONE_BOUND`]. Says nothing about processes that
    /// left the group (a new session, a sandbox's own namespace).
    pub group_gone: bool,
}

/// What the child reads on stdin.
#[derive(Debug, Default)]
pub(crate) enum Input {
    #[default]
    Null,
    /// These bytes, then end of file. A child that stops reading early does not block
    /// the supervision: the writer gives up on a broken pipe.
    Bytes(Vec<u8>),
}

/// How long the emptiness of a finished child's group is awaited.
const GROUP_GONE_BOUND: Duration = Duration::from_secs(1);

/// Spawns `cmd` and supervises it to the end: `timeout` and `cancel` both end it by
/// escalation on its group.
pub(crate) async fn supervise(
    cmd: ChildCommand,
    sink: Arc<dyn Sink>,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Supervised {
    supervise_with(cmd, Input::Null, sink, timeout, cancel).await
}

/// [`supervise`] with `input` on the child's stdin.
pub(crate) async fn supervise_with(
    cmd: ChildCommand,
    input: Input,
    sink: Arc<dyn Sink>,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Supervised {
    let stdin = match input {
        Input::Null => StdinKind::Null,
        Input::Bytes(_) => StdinKind::Piped,
    };
    let Spawned {
        mut child,
        stdin,
        stdout,
        stderr,
    } = match cmd.spawn(stdin) {
        Ok(spawned) => spawned,
        Err(err) => {
            return Supervised {
                ending: Ending::SpawnFailed(err),
                drained: true,
                group_gone: true,
            };
        }
    };
    // The child leads its own group.
    let pgid = child.id();
    let writer = match (input, stdin) {
        (Input::Bytes(bytes), Some(mut stdin)) => Some(tokio::spawn(async move {
            // A child that exits without reading all of it closes the pipe: not an error.
            let _ = stdin.write_all(&bytes).await;
        })),
        _ => None,
    };
    let readers = [
        tokio::spawn(pump(Arc::clone(&sink), Stream::Stdout, stdout)),
        tokio::spawn(pump(Arc::clone(&sink), Stream::Stderr, stderr)),
    ];
    let ending = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Ending::Exited(status),
            // wait() fails only if the child was already reaped elsewhere, which
            // nothing here does; report it as exit status 127.
            Err(_) => Ending::Exited(ExitStatus::from_raw(0x7f00)),
        },
        () = tokio::time::sleep(timeout) => Ending::TimedOut(escalate(&mut child, pgid).await),
        () = cancel.cancelled() => Ending::Cancelled(escalate(&mut child, pgid).await),
    };
    // Whatever is left of the group after its leader ended is not ours to keep.
    let _ = killpg(pgid, Signal::SIGKILL);
    if let Some(writer) = writer {
        writer.abort();
    }
    let group_gone = group_emptied(pgid).await;
    let drained = drain(readers).await;
    Supervised {
        ending,
        drained,
        group_gone,
    }
}

/// Polls until no process is left in group `pgid`, within [`GROUP_GONE_BOUND`].
async fn group_emptied(pgid: Pid) -> bool {
    let deadline = tokio::time::Instant::now() + GROUP_GONE_BOUND;
    loop {
        if killpg(pgid, None) == Err(nix::errno::Errno::ESRCH) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn pump<R: tokio::io::AsyncRead + Unpin>(sink: Arc<dyn Sink>, stream: Stream, mut pipe: R) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => sink.append(stream, &buf[..n]),
        }
    }
}

async fn drain(readers: [tokio::task::JoinHandle<()>; 2]) -> bool {
    let mut drained = true;
    for reader in readers {
        let abort = reader.abort_handle();
        if tokio::time::timeout(DRAIN_BOUND, reader).await.is_err() {
            abort.abort();
            drained = false;
        }
    }
    drained
}

/// SIGINT, SIGTERM, SIGKILL to the group, each followed by a bounded wait.
async fn escalate(child: &mut ChildProcess, pgid: Pid) -> Option<ExitStatus> {
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGKILL] {
        let _ = killpg(pgid, signal);
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

/// A sink that keeps the first `limit` bytes of each stream and counts the rest.
/// Invariant: never holds more than `limit` bytes per stream.
#[derive(Debug)]
pub(crate) struct Capture {
    limit: usize,
    streams: Mutex<[CapturedStream; 2]>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct CapturedStream {
    pub kept: Vec<u8>,
    /// Bytes read and discarded past the limit.
    pub discarded: u64,
}

impl Capture {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            streams: Mutex::default(),
        })
    }

    /// What was captured of `(stdout, stderr)`.
    pub(crate) fn take(&self) -> (CapturedStream, CapturedStream) {
        let [out, err] = std::mem::take(&mut *lock(&self.streams));
        (out, err)
    }
}

impl Sink for Capture {
    fn append(&self, stream: Stream, data: &[u8]) {
        let mut streams = lock(&self.streams);
        let slot = &mut streams[match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }];
        let room = self.limit.saturating_sub(slot.kept.len());
        let kept = data.len().min(room);
        slot.kept.extend_from_slice(&data[..kept]);
        slot.discarded += (data.len() - kept) as u64;
    }
}

/// A finished run with bounded capture (queries and client CLIs).
#[derive(Debug)]
pub(crate) struct CapturedRun {
    pub ending: Ending,
    pub stdout: CapturedStream,
    pub stderr: CapturedStream,
    /// As [`Supervised::drained`].
    pub drained: bool,
    /// As [`Supervised::group_gone`].
    pub group_gone: bool,
}

/// Runs `cmd` to its end (or `timeout`, or `cancel`) with at most `limit` bytes kept
/// per stream.
pub(crate) async fn run_captured(
    cmd: ChildCommand,
    limit: usize,
    timeout: Duration,
    cancel: &CancellationToken,
) -> CapturedRun {
    run_captured_with(cmd, Input::Null, limit, timeout, cancel).await
}

/// [`run_captured`] with `input` on the child's stdin.
pub(crate) async fn run_captured_with(
    cmd: ChildCommand,
    input: Input,
    limit: usize,
    timeout: Duration,
    cancel: &CancellationToken,
) -> CapturedRun {
    let capture = Capture::new(limit);
    let sink: Arc<dyn Sink> = Arc::clone(&capture) as Arc<dyn Sink>;
    let supervised = supervise_with(cmd, input, sink, timeout, cancel).await;
    let (stdout, stderr) = capture.take();
    CapturedRun {
        ending: supervised.ending,
        stdout,
        stderr,
        drained: supervised.drained,
        group_gone: supervised.group_gone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> ChildCommand {
        let mut cmd = ChildCommand::new("/bin/sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[tokio::test]
    async fn captures_both_streams_bounded_and_reports_the_exit() {
        let run = run_captured(
            sh("printf 0123456789; printf err >&2; exit 3"),
            4,
            Duration::from_secs(10),
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(run.ending.exit_parts(), (Some(3), None));
        assert_eq!(run.stdout.kept, b"0123");
        assert_eq!(run.stdout.discarded, 6);
        assert_eq!(run.stderr.kept, b"err");
    }

    #[tokio::test]
    async fn timeout_escalates_on_the_whole_group_and_reaps() {
        // The shell ignores SIGINT and SIGTERM; its background child would outlive a
        // leader-only kill. Both must be gone once the run returns.
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("bg");
        let script = format!(
            "trap '' INT TERM; sleep 300 & echo $! > {}; wait",
            pidfile.display()
        );
        let started = std::time::Instant::now();
        let run = run_captured(
            sh(&script),
            1024,
            Duration::from_millis(300),
            &CancellationToken::new(),
        )
        .await;
        assert!(
            matches!(run.ending, Ending::TimedOut(Some(_))),
            "{:?}",
            run.ending
        );
        assert!(started.elapsed() < Duration::from_secs(10));
        let bg: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Reaped by init or gone: either way no longer signalable as a live process
        // once its zombie is collected; give init a moment.
        let gone = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            let stat = std::fs::read_to_string(format!("/proc/{bg}/stat")).unwrap_or_default();
            stat.is_empty() || stat.split_whitespace().nth(2) == Some("Z")
        });
        assert!(gone, "background child {bg} survived the timeout");
    }

    #[tokio::test]
    async fn cancel_ends_the_child_and_spawn_failure_is_typed() {
        let cancel = CancellationToken::new();
        let capture = Capture::new(16);
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            trigger.cancel();
        });
        let done = supervise(sh("sleep 300"), capture, Duration::from_secs(60), &cancel).await;
        assert!(
            matches!(done.ending, Ending::Cancelled(Some(_))),
            "{:?}",
            done.ending
        );
        let missing = run_captured(
            ChildCommand::new("/nonexistent/marsh-mcp-test"),
            16,
            Duration::from_secs(1),
            &cancel,
        )
        .await;
        assert!(matches!(missing.ending, Ending::SpawnFailed(_)));
    }
}
