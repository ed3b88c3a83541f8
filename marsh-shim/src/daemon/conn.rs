//! One client connection: authenticate (peer uid + token), then serve one request.
//! A `Run` keeps the connection open for the job's lifetime: a `Cancel` record or the
//! connection closing (the client died) cancels the job.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use super::shell::JobOutcome;
use super::{Daemon, Shell};
use crate::error::{Error, Result};
use crate::kits;
use crate::proto::{self, Bytes, EnvVar, Op, PROTO_VERSION, Reply, Request};
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
    let [stdout, stderr]: [OwnedFd; 2] = fds
        .try_into()
        .map_err(|_| Error::Protocol("a run request must carry stdout and stderr".into()))?;
    let client_cwd = PathBuf::from(OsString::from_vec(cwd.0.clone()));
    if client_cwd != daemon.cfg.workspace {
        return Err(Error::failed(format!(
            "this home's daemon is bound to workspace {}; refusing a client in {}",
            daemon.cfg.workspace.display(),
            client_cwd.display()
        )));
    }
    let (shell, job_guard) = daemon.acquire_shell_job()?;
    let job_env = sandbox::job_env(env, &shell.kit_dir)
        .into_iter()
        .map(|(name, value)| EnvVar {
            name: Bytes(name.into_vec()),
            value: Bytes(value.into_vec()),
        })
        .collect();
    let kits = kits::registered(&daemon.cfg.home).unwrap_or_default();
    let started = util::now_ms();
    let outcome = match shell.start_job(command, cwd, job_env, kits, stdout.as_fd(), stderr.as_fd())
    {
        Ok((job, outcome)) => {
            drop((stdout, stderr));
            await_outcome(sock, &shell, job, &outcome)
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

/// Waits for the job's outcome while watching the client: a cancel record, end of
/// stream (the client died) or anything else on the connection cancels the job.
fn await_outcome(
    sock: &Arc<SeqPacket>,
    shell: &Arc<Shell>,
    job: u64,
    outcome: &mpsc::Receiver<JobOutcome>,
) -> JobOutcome {
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (sock, shell, done) = (Arc::clone(sock), Arc::clone(shell), Arc::clone(&done));
        std::thread::Builder::new()
            .name("run-watch".into())
            .spawn(move || {
                let _ = sock.set_recv_timeout(None);
                let _ = sock.recv();
                if !done.load(Ordering::SeqCst) {
                    shell.cancel(job);
                }
            })
    };
    if watcher.is_err() {
        // Without a watcher a vanished client could not cancel: fail closed.
        shell.cancel(job);
    }
    let result = outcome.recv().unwrap_or(JobOutcome::ShellLost);
    done.store(true, Ordering::SeqCst);
    if let Ok(watcher) = watcher {
        // Wake the watcher (its recv sees end of stream); the reply can still be sent.
        sock.shutdown_read();
        let _ = watcher.join();
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
    let written = receipt.write(&daemon.cfg.home.results_dir());
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
