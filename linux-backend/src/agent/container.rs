//! Each job's own process container inside the project shell: a pid namespace and
//! mount namespace whose pid 1 is `marshd container-init` ([`super::init`]), holding
//! one job at a time.
//!
//! Invariants:
//! - A container holds one job's processes at a time: init empties the namespace
//!   (SIGKILL to every process in it, reaped to the last) before it reports a job's
//!   end, and only then may the container take another job. So a job sees (`/proc` is
//!   mounted for the container's pid namespace) and signals only its own processes;
//!   another session's command can neither `kill` it nor open `/proc/PID/fd/1` of it.
//! - A reported ending means every process of the job is gone (setsid, double fork and
//!   nohup included). A cancel SIGKILLs init: the kernel kills the whole namespace, and
//!   the container is never reused.
//! - Job code never holds a capability: init drops the agent's two (`CAP_SYS_ADMIN`,
//!   `CAP_SETPCAP`, held inside the sandbox's user namespace only) from every set, the
//!   bounding set included, and locks securebits, before the job execs. `no_new_privs`
//!   and the seccomp filter are inherited from bubblewrap.
//!
//! Speed: creating and destroying a pid and a mount namespace costs about 2 ms here
//! (destruction waits for RCU grace periods), as much as a whole fast command. So
//! containers are made ahead of need and reused: idle ones wait in a small pool, and a
//! job that ends normally hands its container back.
//!
//! Rejected alternatives: a fresh container per job (the 2 ms above on every command's
//! round trip, or on the other core while the next command runs); `sh` as the
//! namespace's init (it would not reap orphans, and signals from inside the namespace to
//! an init without handlers are dropped); forking init from the agent (it copies the
//! agent's address space, twice per job); a bubblewrap per command (a fresh root per
//! command would lose the shell's `/tmp` and home between commands, and costs more than
//! the command).

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use crate::admission;
use crate::error::{Context, Error, Result};
use crate::proto::{self, Bytes, EnvVar, FromInit, ToInit};
use crate::seqpacket::SeqPacket;
use crate::util::lock;

/// How long a fresh container may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How a contained job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
}

/// What init said about a job it was given.
#[derive(Debug)]
pub enum Report {
    /// The job ended; the container is empty and may take another job.
    Ended(Ending),
    /// The job could not start; the container is empty and may take another job.
    NotStarted(String),
    /// init is gone (killed by a cancel, or it died): the container must be closed.
    Died,
}

/// A container whose init is set up and waits for its job.
pub struct Warm {
    init: Child,
    chan: SeqPacket,
}

/// A container running its job: `init` is the child to signal (SIGKILL ends the whole
/// job) and to reap.
pub struct Contained {
    pub init: Child,
    chan: SeqPacket,
}

/// Starts a container and waits until its init is ready.
///
/// Must run on a thread that starts nothing else, ever: `unshare(CLONE_NEWPID)` makes
/// this thread's next child the init of a new namespace, and the thread cannot start a
/// second one.
fn prepare(agent_exe: &Path, admission: Option<&AdmissionLink>) -> Result<Warm> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWPID)
        .context(|| "making the job's pid namespace".to_string())?;
    let (ours, theirs) = SeqPacket::pair()?;
    // init inherits the agent's working directory, the workspace: it names the
    // workspace mounts by it.
    let mut command = Command::new(agent_exe);
    command.arg("container-init");
    if admission.is_some() {
        command.arg("--admit");
    }
    let spawned = command
        .env_clear()
        .stdin(Stdio::from(theirs.into_fd()))
        .stdout(Stdio::null())
        .spawn();
    let mut init = spawned.context(|| "starting the container's init".to_string())?;
    ours.set_recv_timeout(Some(READY_TIMEOUT))?;
    let ready = match proto::recv::<FromInit>(&ours) {
        // Ready carries a pidfd of init, then the container's workspace mounts.
        Ok(Some((FromInit::Ready, fds))) => match admission {
            Some(link) => {
                let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
                admission::request(&lock(link), admission::Kind::Container, &borrowed)
            }
            None => Ok(()),
        },
        Ok(Some((FromInit::Failed { message }, _))) => Err(Error::failed(message)),
        Ok(Some(_)) => Err(Error::Protocol(
            "the container's init spoke out of turn".into(),
        )),
        Ok(None) => Err(Error::failed("the container's init exited during setup")),
        Err(e) => Err(e),
    };
    if let Err(e) = ready.and_then(|()| ours.set_recv_timeout(None)) {
        let _ = init.kill();
        let _ = init.wait();
        return Err(e);
    }
    Ok(Warm { init, chan: ours })
}

/// The agent's end of the daemon's admission socket, one request at a time.
pub type AdmissionLink = Mutex<SeqPacket>;

/// Idle containers, plus one being prepared when none is idle.
pub struct Pool {
    agent_exe: PathBuf,
    /// Present for a root daemon: then no container is handed out before the daemon
    /// has admitted it (its OOM score set, its workspace mounts guarded).
    admission: Option<Arc<AdmissionLink>>,
    idle: Mutex<Vec<Warm>>,
    preparing: Mutex<Option<mpsc::Receiver<Result<Warm>>>>,
}

/// Idle containers kept beyond this many are let go (their init exits).
const MAX_IDLE: usize = 4;

impl Pool {
    /// A pool that starts preparing its first container at once.
    pub fn new(agent_exe: PathBuf, admission: Option<Arc<AdmissionLink>>) -> Pool {
        let pool = Pool {
            agent_exe,
            admission,
            idle: Mutex::new(Vec::new()),
            preparing: Mutex::new(None),
        };
        pool.prepare_in_background();
        pool
    }

    /// A ready container: an idle one, else the one being prepared (waiting for it),
    /// else a fresh one. When the pool runs dry, the next one is prepared in the
    /// background.
    pub fn take(&self) -> Result<Warm> {
        let idle = lock(&self.idle).pop();
        let warm = match idle {
            Some(warm) => Ok(warm),
            None => {
                let pending = lock(&self.preparing).take();
                match pending.and_then(|rx| rx.recv().ok()) {
                    Some(Ok(warm)) => Ok(warm),
                    Some(Err(_)) | None => self.prepare_now(),
                }
            }
        };
        if lock(&self.idle).is_empty() {
            self.prepare_in_background();
        }
        warm
    }

    /// A fresh container, made on a throwaway thread: the thread that unshares a pid
    /// namespace can start no further thread, so the caller's thread must not.
    pub fn prepare_now(&self) -> Result<Warm> {
        let exe = self.agent_exe.clone();
        let admission = self.admission.clone();
        std::thread::Builder::new()
            .name("container-prep".into())
            .spawn(move || prepare(&exe, admission.as_deref()))
            .context(|| "starting a container thread".to_string())?
            .join()
            .unwrap_or_else(|_| Err(Error::failed("the container thread panicked")))
    }

    /// Takes back a container whose job ended normally (init is alive and empty).
    /// Returns it when the pool is full, for the caller to close and reap.
    pub fn give_back(&self, warm: Warm) -> Option<Warm> {
        let mut idle = lock(&self.idle);
        if idle.len() >= MAX_IDLE {
            return Some(warm);
        }
        idle.push(warm);
        None
    }

    /// Prepares one container on a thread of its own (it exits once the container is
    /// ready; the container outlives it), unless one is already being prepared.
    fn prepare_in_background(&self) {
        let mut preparing = lock(&self.preparing);
        if preparing.is_some() {
            return;
        }
        let (tx, rx) = mpsc::channel();
        let exe = self.agent_exe.clone();
        let admission = self.admission.clone();
        let started = std::thread::Builder::new()
            .name("container-prep".into())
            .spawn(move || {
                let _ = tx.send(prepare(&exe, admission.as_deref()));
            });
        if started.is_ok() {
            *preparing = Some(rx);
        }
    }
}

impl Warm {
    /// Hands the job to init; it starts at once.
    pub fn run(
        self,
        command: &Bytes,
        cwd: &Bytes,
        env: Vec<EnvVar>,
        nproc: Option<u64>,
        stdio: [BorrowedFd<'_>; 3],
    ) -> Result<Contained> {
        let msg = ToInit::Run {
            command: command.clone(),
            cwd: cwd.clone(),
            env,
            nproc,
        };
        let Warm { mut init, chan } = self;
        if let Err(e) = proto::send(&chan, &msg, &stdio) {
            let _ = init.kill();
            let _ = init.wait();
            return Err(e);
        }
        Ok(Contained { init, chan })
    }
}

impl Contained {
    /// Blocks until init reports on the job, or is gone.
    pub fn wait_report(&mut self) -> Report {
        match proto::recv::<FromInit>(&self.chan) {
            Ok(Some((FromInit::Ended { exit_code, signal }, _))) => {
                Report::Ended(Ending { exit_code, signal })
            }
            Ok(Some((FromInit::NotStarted { message }, _))) => Report::NotStarted(message),
            Ok(Some((FromInit::Ready | FromInit::Failed { .. }, _))) | Ok(None) | Err(_) => {
                Report::Died
            }
        }
    }

    /// The container again, ready for another job, if init is still alive. Only call
    /// after a report of `Ended` or `NotStarted` and when no kill can have been sent.
    pub fn into_warm(mut self) -> std::result::Result<Warm, Contained> {
        match self.init.try_wait() {
            Ok(None) => Ok(Warm {
                init: self.init,
                chan: self.chan,
            }),
            _ => Err(self),
        }
    }

    /// Ends the container (if it still runs) and reaps init. init is reaped only once
    /// every other process of its namespace is gone, so when this returns nothing of
    /// the job is left.
    pub fn close(mut self) {
        let _ = self.init.kill();
        let _ = self.init.wait();
    }
}

impl Warm {
    /// Closes the channel (init exits when it sees that) and reaps init.
    pub fn close(mut self) {
        self.chan.shutdown();
        let _ = self.init.wait();
    }
}
