//! `marsh [--load SEL] -c CMD` and `marsh kit run NAME ARGS...`: run one command in
//! the project shell, or one registered kit in a fresh kit container, with the job
//! reading this process's stdin and writing straight into its stdout and stderr.
//!
//! Cancellation: SIGINT, SIGTERM and SIGHUP are blocked and read from a signalfd that
//! is polled beside the daemon connection; the first one asks the daemon to cancel,
//! and once the job is known to be over (or after a grace period) `marsh` exits with
//! 128+signal.
//!
//! Rejected alternative: a thread waiting in `sigwait` (the earlier way). A run's
//! start-up then paid for a thread it almost never used.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::daemon_link::{self, Link};
use crate::backend;
use crate::error::{Context, Error, Result};
use crate::home::Home;
use crate::inject::{self, Verb};
use crate::kits::{self, Selection};
use crate::proto::{self, Bytes, EnvVar, KitFailure, Op, PROTO_VERSION, Reply, Request};
use crate::sandbox::CALLER_VARS;
use crate::util::log;

/// After a cancel, how long to wait for the daemon to confirm the job is over.
const CANCEL_GRACE: Duration = Duration::from_secs(5);

pub fn run(
    home: &Home,
    cwd: &Path,
    env: &[(OsString, OsString)],
    command: &OsString,
    load: Option<&Selection>,
) -> Result<i32> {
    inject::check(home, Verb::Run)?;
    let workspace = ready_backend(home, cwd, env)?;
    if let Some(selection) = load {
        boot(home, &workspace, env)?;
        inject::check(home, Verb::Load)?;
        let op = Op::Load {
            selection: selection.to_text(),
        };
        let link = daemon_link::send(home, op, &[])?.ok_or_else(daemon_vanished)?;
        link.reply()?;
    }
    let op = || Op::Run {
        command: Bytes(command.as_bytes().to_vec()),
        cwd: Bytes(workspace.as_os_str().as_bytes().to_vec()),
        env: caller_env(env),
    };
    let attached = attached(home, &workspace, env, &op)?;
    if let Some(sig) = attached.cancelled {
        return Ok(128 + sig);
    }
    match attached.reply? {
        Reply::Finished {
            exit_code, signal, ..
        } => Ok(status_code(exit_code, signal)),
        other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
    }
}

/// `marsh kit run`: the kit's own status; with a receipt sink, the receipt id and a
/// newline are written to it once the receipt exists (nothing otherwise), and it is
/// closed.
pub fn kit_run(
    home: &Home,
    cwd: &Path,
    env: &[(OsString, OsString)],
    kit: &str,
    args: &[OsString],
    receipt_sink: Option<File>,
) -> Result<i32> {
    inject::check(home, Verb::KitRun)?;
    if !kits::valid_name(kit) || !home.exists() {
        return Err(Error::failed(format!("unknown kit {kit}")));
    }
    kits::load(home, kit)?;
    let workspace = ready_backend(home, cwd, env)?;
    let op = || Op::KitRun {
        kit: kit.to_string(),
        args: args.iter().map(|a| Bytes(a.as_bytes().to_vec())).collect(),
        cwd: Bytes(workspace.as_os_str().as_bytes().to_vec()),
        env: caller_env(env),
    };
    let attached = attached(home, &workspace, env, &op)?;
    let reply = match (attached.reply, attached.cancelled) {
        (Ok(reply), _) => reply,
        (Err(_), Some(sig)) => return Ok(128 + sig),
        (Err(e), None) => return Err(e),
    };
    let Reply::KitFinished {
        receipt_id,
        exit_code,
        signal,
        failure,
    } = reply
    else {
        return match attached.cancelled {
            Some(sig) => Ok(128 + sig),
            None => Err(Error::Protocol(format!("unexpected reply {reply:?}"))),
        };
    };
    if let (Some(id), Some(mut sink)) = (receipt_id, receipt_sink)
        && let Err(e) = sink.write_all(format!("{id}\n").as_bytes())
    {
        // The caller's channel is broken; the kit's status still stands.
        log!("marsh: writing the receipt id to its descriptor: {e}");
    }
    if let Some(sig) = attached.cancelled {
        return Ok(128 + sig);
    }
    if let Some(KitFailure { code, message }) = failure {
        log!("marsh: {message}");
        return Ok(code);
    }
    Ok(status_code(exit_code, signal))
}

/// Takes the inherited descriptor `fd` as the receipt sink of `marsh kit run`.
#[allow(unsafe_code)]
pub fn adopt_receipt_fd(fd: RawFd) -> Result<File> {
    // SAFETY: F_GETFL only reads the flags of whatever `fd` names, if anything.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(Error::Usage(format!(
            "--receipt-fd {fd} is not an open descriptor"
        )));
    }
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(Error::Usage(format!(
            "--receipt-fd {fd} is not open for writing"
        )));
    }
    // SAFETY: `fd` is open (checked above) and was inherited: `marsh` has opened no
    // descriptor of its own that it keeps by the time it parses its arguments, so
    // nothing else in this process owns this number.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Checks the backend (a backend that cannot run a job is reported before a daemon
/// is tried) and returns the canonical workspace.
fn ready_backend(home: &Home, cwd: &Path, env: &[(OsString, OsString)]) -> Result<PathBuf> {
    let workspace =
        std::fs::canonicalize(cwd).context(|| format!("resolving {}", cwd.display()))?;
    let user_home = env.iter().find(|(k, _)| k == "HOME").map(|(_, v)| v);
    backend::assess(home, user_home, Some(&workspace))?;
    Ok(workspace)
}

/// A daemon that cannot start is the backend failing: exit 126 (spawn blocked).
fn boot(home: &Home, workspace: &Path, env: &[(OsString, OsString)]) -> Result<()> {
    daemon_link::ensure_daemon(home, workspace, env).map_err(Error::into_backend)
}

/// The reply to an attached op, and the cancellation signal taken meanwhile.
struct Attached {
    cancelled: Option<i32>,
    reply: Result<Reply>,
}

/// Sends `op` with this process's stdin, stdout and stderr attached, booting a daemon
/// when none answers, and waits for the reply while cancellation signals are turned
/// into a cancel.
fn attached(
    home: &Home,
    workspace: &Path,
    env: &[(OsString, OsString)],
    op: &dyn Fn() -> Op,
) -> Result<Attached> {
    let signals = cancel_signals();
    signals
        .thread_block()
        .context(|| "blocking cancellation signals".to_string())?;
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    // The fast path: a running daemon takes the op directly (no separate ping). Only
    // when none answers is one booted, and the op sent again.
    let link = match daemon_link::send(home, op(), &stdio)? {
        Some(link) => link,
        None => {
            // The daemon must not inherit the blocked cancellation signals. A signal
            // that arrives while unblocked ends this marsh before any job was sent.
            signals
                .thread_unblock()
                .context(|| "unblocking signals for the boot".to_string())?;
            boot(home, workspace, env)?;
            signals
                .thread_block()
                .context(|| "blocking cancellation signals".to_string())?;
            daemon_link::send(home, op(), &stdio)?.ok_or_else(daemon_vanished)?
        }
    };
    let (reply, cancelled) = await_reply(&link, &signals)?;
    Ok(Attached { cancelled, reply })
}

/// Waits for the daemon's reply while taking the blocked cancellation `signals`: the
/// first one sends a cancel and bounds the rest of the wait by [`CANCEL_GRACE`], after
/// which this process exits with 128+signal.
fn await_reply(link: &Link, signals: &SigSet) -> Result<(Result<Reply>, Option<i32>)> {
    let signal_fd = SignalFd::with_flags(signals, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .context(|| "watching cancellation signals".to_string())?;
    let mut cancelled: Option<(i32, Instant)> = None;
    loop {
        let timeout = match cancelled {
            None => PollTimeout::NONE,
            Some((sig, at)) => {
                let left = CANCEL_GRACE.saturating_sub(at.elapsed());
                if left.is_zero() {
                    std::process::exit(128 + sig);
                }
                PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
            }
        };
        let mut fds = [
            PollFd::new(link.sock.as_fd(), PollFlags::POLLIN),
            PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(Error::io("waiting for the daemon", e.into())),
        }
        let answered = fds[0].revents().is_some_and(|r| !r.is_empty());
        let signalled = fds[1].revents().is_some_and(|r| !r.is_empty());
        if signalled && let Ok(Some(info)) = signal_fd.read_signal() {
            // Later signals only repeat the request: the first one started the grace.
            if cancelled.is_none() {
                let sig = i32::try_from(info.ssi_signo).unwrap_or(libc::SIGTERM);
                cancelled = Some((sig, Instant::now()));
                request_cancel(link);
            }
        }
        if answered {
            return Ok((link.reply(), cancelled.map(|(sig, _)| sig)));
        }
    }
}

/// Asks the daemon to cancel the running job.
fn request_cancel(link: &Link) {
    let cancel = Request {
        proto: PROTO_VERSION,
        token: link.token.clone(),
        op: Op::Cancel,
    };
    if proto::send(&link.sock, &cancel, &[]).is_err() {
        // The daemon is unreachable; closing our end still cancels the job daemon-side.
        link.sock.shutdown();
    }
}

/// A job's status as an exit code: its code, or 128+N for death by signal N.
fn status_code(exit_code: Option<i32>, signal: Option<i32>) -> i32 {
    match (exit_code, signal) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => 1,
    }
}

fn cancel_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    set
}

/// The caller variables the job environment takes from `marsh`'s own environment.
fn caller_env(env: &[(OsString, OsString)]) -> Vec<EnvVar> {
    CALLER_VARS
        .iter()
        .filter_map(|name| {
            env.iter().find(|(k, _)| k == name).map(|(k, v)| EnvVar {
                name: Bytes(k.as_bytes().to_vec()),
                value: Bytes(v.as_bytes().to_vec()),
            })
        })
        .collect()
}

fn daemon_vanished() -> Error {
    Error::failed("the daemon stopped answering")
}
