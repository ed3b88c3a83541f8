//! `marsh [--load SEL] -c CMD`: run one command in the project shell, with the job
//! writing straight into this process's stdout and stderr.
//!
//! Cancellation: SIGINT, SIGTERM and SIGHUP are blocked and taken synchronously by a
//! dedicated thread, which asks the daemon to cancel and then, once the job is known
//! to be over (or after a grace period), exits with 128+signal.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};

use super::daemon_link::{self, Link};
use crate::backend;
use crate::error::{Context, Error, Result};
use crate::home::Home;
use crate::inject::{self, Verb};
use crate::kits::Selection;
use crate::proto::{self, Bytes, EnvVar, Op, PROTO_VERSION, Reply, Request};
use crate::sandbox::CALLER_VARS;

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
    let workspace =
        std::fs::canonicalize(cwd).context(|| format!("resolving {}", cwd.display()))?;
    // A backend that cannot run a job is reported before a daemon is tried, and a daemon
    // that cannot start is the backend failing too: both exit 126 (spawn blocked).
    let user_home = env.iter().find(|(k, _)| k == "HOME").map(|(_, v)| v);
    backend::assess(home, user_home, Some(&workspace))?;
    let boot = || daemon_link::ensure_daemon(home, &workspace, env).map_err(Error::into_backend);
    if let Some(selection) = load {
        boot()?;
        inject::check(home, Verb::Load)?;
        let op = Op::Load {
            selection: selection.to_text(),
        };
        let link = daemon_link::send(home, op, &[])?.ok_or_else(daemon_vanished)?;
        link.reply()?;
    }

    let signals = cancel_signals();
    signals
        .thread_block()
        .context(|| "blocking cancellation signals".to_string())?;
    let op = || Op::Run {
        command: Bytes(command.as_bytes().to_vec()),
        cwd: Bytes(workspace.as_os_str().as_bytes().to_vec()),
        env: caller_env(env),
    };
    let (stdout, stderr) = (std::io::stdout(), std::io::stderr());
    let stdio = [stdout.as_fd(), stderr.as_fd()];
    // The fast path: a running daemon takes the run directly (no separate ping). Only
    // when none answers is one booted, and the run sent again.
    let link = match daemon_link::send(home, op(), &stdio)? {
        Some(link) => link,
        None => {
            // The daemon must not inherit the blocked cancellation signals. A signal
            // that arrives while unblocked ends this marsh before any job was sent.
            signals
                .thread_unblock()
                .context(|| "unblocking signals for the boot".to_string())?;
            boot()?;
            signals
                .thread_block()
                .context(|| "blocking cancellation signals".to_string())?;
            daemon_link::send(home, op(), &stdio)?.ok_or_else(daemon_vanished)?
        }
    };
    let link = Arc::new(link);
    let cancelled = Arc::new(AtomicI32::new(0));
    {
        let (link, cancelled) = (Arc::clone(&link), Arc::clone(&cancelled));
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || on_signal(&signals, &link, &cancelled))
            .context(|| "starting the signal thread".to_string())?;
    }

    let reply = link.reply();
    let sig = cancelled.load(Ordering::SeqCst);
    if sig != 0 {
        return Ok(128 + sig);
    }
    match reply? {
        Reply::Finished {
            exit_code, signal, ..
        } => Ok(match (exit_code, signal) {
            (Some(code), _) => code,
            (None, Some(sig)) => 128 + sig,
            (None, None) => 1,
        }),
        other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
    }
}

fn cancel_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    set
}

/// Waits for a cancellation signal, forwards the cancel, and bounds the wait for the
/// job's end. The main thread normally exits first, when the daemon answers.
fn on_signal(signals: &SigSet, link: &Link, cancelled: &AtomicI32) {
    let Ok(sig) = signals.wait() else {
        return;
    };
    cancelled.store(sig as i32, Ordering::SeqCst);
    let cancel = Request {
        proto: PROTO_VERSION,
        token: link.token.clone(),
        op: Op::Cancel,
    };
    if proto::send(&link.sock, &cancel, &[]).is_err() {
        // The daemon is unreachable; closing our end still cancels the job daemon-side.
        link.sock.shutdown();
    }
    std::thread::sleep(CANCEL_GRACE);
    std::process::exit(128 + sig as i32);
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
