//! One client connection: authenticate (peer uid + token), then serve one request.
//! A `Run` or `KitRun` keeps the connection open for the job's lifetime: a `Cancel`
//! record or the connection closing (the client died) cancels the job.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::kit_jobs::{self, KitEnd, Launch, Sink};
use super::shell::JobOutcome;
use super::{Daemon, Shell};
use crate::error::{Error, Result};
use crate::kits;
use crate::proto::{self, Bytes, EnvVar, KitFailure, Op, PROTO_VERSION, Reply, Request};
use crate::receipt::Receipt;
use crate::sandbox;
use crate::seqpacket::SeqPacket;
use crate::token;
use crate::util::{self, log};

/// An unauthenticated peer gets this long to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) fn handle(daemon: &Arc<Daemon>, sock: SeqPacket) {
    let sock = Arc::new(sock);
    match serve(daemon, &sock) {
        Ok(Some(reply)) => send_reply(&sock, &reply),
        Ok(None) => {}
        Err(e) => send_reply(&sock, &Reply::from_error(&e)),
    }
    sock.shutdown();
}

fn send_reply(sock: &SeqPacket, reply: &Reply) {
    if let Err(e) = proto::send(sock, reply, &[]) {
        log!("marshd: replying: {e}");
    }
}

/// Serves one request; `Ok(None)` when there is nothing (more) to send.
fn serve(daemon: &Arc<Daemon>, sock: &Arc<SeqPacket>) -> Result<Option<Reply>> {
    if sock.peer_uid()? != util::euid() {
        // Another user: say nothing at all.
        return Ok(None);
    }
    sock.set_recv_timeout(Some(REQUEST_TIMEOUT))?;
    let Some((request, fds)) = proto::recv::<Request>(sock)? else {
        return Ok(None);
    };
    if request.proto != PROTO_VERSION {
        return Err(Error::failed(format!(
            "the daemon speaks protocol {PROTO_VERSION}, this marsh {}; run `marsh stop` and retry",
            request.proto
        )));
    }
    if !token::matches(&daemon.cfg.token, &request.token) {
        return Err(Error::failed("authentication with the daemon failed"));
    }
    let reply = match request.op {
        Op::Ping => Reply::Pong {
            pid: daemon.cfg.pid,
            version: env!("CARGO_PKG_VERSION").into(),
        },
        Op::Status => Reply::Status {
            status: Box::new(daemon.status()),
        },
        // The run path answers on the connection itself.
        Op::Run { command, cwd, env } => {
            return run(daemon, sock, &command, &cwd, &env, fds).map(|()| None);
        }
        Op::KitRun {
            kit,
            args,
            cwd,
            env,
        } => {
            return kit_run(daemon, sock, kit, args, &cwd, &env, fds).map(|()| None);
        }
        Op::Cancel => return Err(Error::Protocol("cancel outside a running job".into())),
        Op::Load { selection } => Reply::Loaded {
            names: daemon.load(&selection)?,
        },
        Op::Reset => {
            daemon.reset()?;
            Reply::Reset { was_running: true }
        }
        Op::WorkersReset { selection } => Reply::WorkersReset {
            names: daemon.workers_reset(&selection)?,
        },
        Op::Stop => stop(daemon, sock)?,
    };
    Ok(Some(reply))
}

/// Stops the sandboxes, answers, and exits the process.
fn stop(daemon: &Arc<Daemon>, sock: &SeqPacket) -> Result<Reply> {
    let shell = daemon.begin_stop()?;
    log!("marshd: stopping on request");
    daemon.unlink_own("marshd.sock");
    if let Some(shell) = shell {
        shell.kill_and_wait();
    }
    daemon.kill_all_kit_jobs();
    daemon.blanks.discard();
    daemon.cfg.confinement.limits.release();
    daemon.unlink_own("pid");
    send_reply(
        sock,
        &Reply::Stopped {
            pid: daemon.cfg.pid,
        },
    );
    sock.shutdown();
    std::process::exit(0)
}

fn run(
    daemon: &Arc<Daemon>,
    sock: &Arc<SeqPacket>,
    command: &Bytes,
    cwd: &Bytes,
    env: &[EnvVar],
    fds: Vec<OwnedFd>,
) -> Result<()> {
    let [stdin, stdout, stderr]: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|_| Error::Protocol("a run request must carry stdin, stdout and stderr".into()))?;
    check_workspace(daemon, cwd)?;
    let (shell, job_guard) = daemon.acquire_shell_job()?;
    // The shell's own commands, the kit wrappers, then the `path` setting's entries.
    let mut dirs = shell.path_dirs().to_vec();
    dirs.extend(daemon.cfg.exposed.path.iter().map(PathBuf::as_path));
    let job_env = sandbox::job_env(env, &dirs)
        .into_iter()
        .map(|(name, value)| EnvVar {
            name: Bytes(name.into_vec()),
            value: Bytes(value.into_vec()),
        })
        .collect();
    let kits = kits::registered(&daemon.cfg.home).unwrap_or_default();
    let started = util::now_ms();
    let stdio = [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()];
    let outcome = match shell.start_job(command, cwd, job_env, kits, stdio) {
        Ok((job, outcome)) => {
            drop((stdin, stdout, stderr));
            await_outcome(daemon, sock, &shell, job, &outcome)
        }
        Err(e) => JobOutcome::SpawnFailed(e.to_string()),
    };
    let reply = finish(daemon, command, started, outcome);
    // The job is over and recorded: a reset or stop after this reply must not see it.
    drop(job_guard);
    send_reply(sock, &reply);
    sock.shutdown();
    Ok(())
}

/// The client must run in the daemon's workspace.
fn check_workspace(daemon: &Daemon, cwd: &Bytes) -> Result<()> {
    let client_cwd = PathBuf::from(OsString::from_vec(cwd.0.clone()));
    if client_cwd != daemon.cfg.workspace {
        return Err(Error::failed(format!(
            "this home's daemon is bound to workspace {}; refusing a client in {}",
            daemon.cfg.workspace.display(),
            client_cwd.display()
        )));
    }
    Ok(())
}

/// `marsh kit run`: the registered kit with exactly `args`, in a fresh kit container
/// with the client's stdio, answered with its receipt and status.
fn kit_run(
    daemon: &Arc<Daemon>,
    sock: &Arc<SeqPacket>,
    kit: String,
    args: Vec<Bytes>,
    cwd: &Bytes,
    env: &[EnvVar],
    fds: Vec<OwnedFd>,
) -> Result<()> {
    let stdio: [OwnedFd; 3] = fds.try_into().map_err(|_| {
        Error::Protocol("a kit run request must carry stdin, stdout and stderr".into())
    })?;
    check_workspace(daemon, cwd)?;
    let definition = kits::load(&daemon.cfg.home, &kit)?;
    let key = daemon.host_kit_key();
    let (tx, rx) = mpsc::channel();
    let launch = Launch {
        key,
        name: kit,
        kit: definition,
        args,
        env: sandbox::kit_env(env, &[]),
        stdio,
        sink: Sink::Client(tx),
    };
    kit_jobs::launch_job(daemon, launch).map_err(|(_, message)| Error::failed(message))?;
    let cancel = {
        let daemon = Arc::clone(daemon);
        move || daemon.kit_job_cancel(key)
    };
    let end = await_end(daemon, sock, cancel, &rx).unwrap_or(KitEnd {
        receipt_id: None,
        status: Err(KitFailure {
            code: 1,
            message: "the kit job vanished without an outcome".into(),
        }),
    });
    let (exit_code, signal, failure) = match end.status {
        Ok((exit_code, signal)) => (exit_code, signal, None),
        Err(failure) => (None, None, Some(failure)),
    };
    send_reply(
        sock,
        &Reply::KitFinished {
            receipt_id: end.receipt_id,
            exit_code,
            signal,
            failure,
        },
    );
    sock.shutdown();
    Ok(())
}

/// Waits for the job's outcome while watching the client: a cancel record, end of
/// stream (the client died) or anything else on the connection cancels the job.
fn await_outcome(
    daemon: &Daemon,
    sock: &Arc<SeqPacket>,
    shell: &Arc<Shell>,
    job: u64,
    outcome: &mpsc::Receiver<JobOutcome>,
) -> JobOutcome {
    let shell = Arc::clone(shell);
    await_end(daemon, sock, move || shell.cancel(job), outcome).unwrap_or(JobOutcome::ShellLost)
}

/// Receives the one end of a job, calling `cancel` once if the client sends anything
/// or goes away first. `None` when the job's sender vanished.
fn await_end<T>(
    daemon: &Daemon,
    sock: &Arc<SeqPacket>,
    cancel: impl FnOnce() + Send + 'static,
    outcome: &mpsc::Receiver<T>,
) -> Option<T> {
    let done = Arc::new(AtomicBool::new(false));
    let cancel = Arc::new(std::sync::Mutex::new(Some(cancel)));
    let fire = {
        let cancel = Arc::clone(&cancel);
        move || {
            if let Some(cancel) = util::lock(&cancel).take() {
                cancel();
            }
        }
    };
    // The watcher runs on a pooled worker; `watched` says when it is done with `sock`.
    let (watched_tx, watched) = mpsc::channel::<()>();
    let watcher = {
        let (sock, done, fire) = (Arc::clone(sock), Arc::clone(&done), fire.clone());
        daemon.workers.run(move || {
            let _ = sock.set_recv_timeout(None);
            let _ = sock.recv();
            if !done.load(Ordering::SeqCst) {
                fire();
            }
            drop(watched_tx);
        })
    };
    if watcher.is_err() {
        // Without a watcher a vanished client could not cancel: fail closed.
        fire();
    }
    let result = outcome.recv().ok();
    done.store(true, Ordering::SeqCst);
    if watcher.is_ok() {
        // Wake the watcher (its recv sees end of stream); the reply can still be sent.
        sock.shutdown_read();
        let _ = watched.recv();
    }
    result
}

/// Writes the job's receipt and builds the client's reply.
fn finish(daemon: &Daemon, command: &Bytes, started: u64, outcome: JobOutcome) -> Reply {
    let finished = util::now_ms();
    let (exit_code, signal, failure) = match outcome {
        JobOutcome::Exited { exit_code, signal } => (exit_code, signal, None),
        JobOutcome::SpawnFailed(message) => (
            None,
            None,
            Some(Error::Backend(format!(
                "the job could not start: {message}"
            ))),
        ),
        // The backend failed under a running job: not the command's own result.
        JobOutcome::Lost(message) => (None, None, Some(Error::Backend(message))),
        JobOutcome::ShellLost => (
            None,
            None,
            Some(Error::Backend(
                "the project shell exited while the job was running".into(),
            )),
        ),
    };
    let receipt = Receipt {
        id: uuid::Uuid::new_v4().to_string(),
        kind: "shell".into(),
        kit: None,
        command: String::from_utf8_lossy(&command.0).into_owned(),
        exit_code,
        signal,
        started_at_ms: started,
        finished_at_ms: finished,
        duration_ms: finished.saturating_sub(started),
        workspace: daemon.cfg.workspace.to_string_lossy().into_owned(),
    };
    let written = daemon.write_receipt(&receipt);
    match (failure, written) {
        (Some(error), _) => Reply::from_error(&error),
        (None, Err(e)) => Reply::from_error(&Error::failed(format!(
            "the job finished but its receipt could not be written: {e}"
        ))),
        (None, Ok(())) => Reply::Finished {
            receipt_id: receipt.id,
            exit_code,
            signal,
        },
    }
}
