//! The agent inside the project shell: `marshd agent`, started by the daemon as the
//! sandbox's main process; it receives its daemon channel over a bootstrap socket on
//! fd 0 (see [`take_channel`]).
//!
//! It forks `/bin/sh -c CMD` per job (own process group, cwd = workspace, the fixed
//! job environment, stdout/stderr = the caller's descriptors), reports each exit, kills
//! a job's process group on cancel, and relays kit requests from a sandbox-private
//! socket to the daemon. It holds no daemon credential: its only authority is the
//! inherited channel, which can start jobs' kits and report exits, nothing more.

pub mod kit_client;
mod kit_server;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, mpsc};

use nix::unistd::Pid;

use crate::error::{Context, Error, Result};
use crate::proto::{self, Bytes, EnvVar, FromAgent, KitReply, ToAgent};
use crate::seqpacket::{Listener, SeqPacket};
use crate::util::{self, lock};

/// Where the agent serves kits and what its wrappers execute.
#[derive(Debug, Clone)]
pub struct AgentPaths {
    pub kit_socket: PathBuf,
    pub kit_dir: PathBuf,
    /// The agent binary as seen from inside the sandbox (wrappers exec it).
    pub self_exe: PathBuf,
}

struct JobSlot {
    pgid: Pid,
    /// Set once the leader's exit has been observed. Until then the leader is at
    /// worst an unreaped zombie, so `pgid` cannot have been recycled.
    exited: bool,
}

pub(crate) struct Agent {
    chan: SeqPacket,
    paths: AgentPaths,
    jobs: Mutex<HashMap<u64, JobSlot>>,
    kit_waiters: Mutex<HashMap<u64, mpsc::Sender<KitReply>>>,
    next_kit_req: AtomicU64,
    wrappers: Mutex<Vec<String>>,
}

/// Runs the agent until the daemon channel closes; then kills every job and returns.
pub fn run(paths: AgentPaths) -> Result<()> {
    let chan = take_channel()?;
    // Jobs run as the same uid; without the dumpable flag they cannot ptrace the agent
    // or open its descriptors through /proc.
    nix::sys::prctl::set_dumpable(false).context(|| "clearing the dumpable flag".to_string())?;

    let agent = Arc::new(Agent {
        chan,
        paths,
        jobs: Mutex::new(HashMap::new()),
        kit_waiters: Mutex::new(HashMap::new()),
        next_kit_req: AtomicU64::new(1),
        wrappers: Mutex::new(Vec::new()),
    });
    let listener = agent.prepare_kit_socket()?;
    {
        let agent = Arc::clone(&agent);
        std::thread::Builder::new()
            .name("kit-server".into())
            .spawn(move || kit_server::serve(&agent, &listener))
            .context(|| "starting the kit server".to_string())?;
    }
    proto::send(
        &agent.chan,
        &FromAgent::Ready {
            version: env!("CARGO_PKG_VERSION").to_string(),
        },
        &[],
    )?;
    let result = agent.serve_daemon();
    agent.kill_all();
    result
}

/// Receives the daemon channel over the bootstrap socket on fd 0, then puts
/// /dev/null on fd 0.
///
/// The channel never sits on an inherited descriptor: bubblewrap's own init process
/// keeps its stdio open for the sandbox's lifetime, and it is dumpable, so jobs could
/// take a copy of anything on it. All it keeps is the spent bootstrap socket, whose
/// daemon end is closed once the channel has been handed over.
fn take_channel() -> Result<SeqPacket> {
    let bootstrap = nix::unistd::dup(std::io::stdin().as_fd())
        .context(|| "duplicating the bootstrap socket".to_string())?;
    nix::fcntl::fcntl(
        &bootstrap,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .context(|| "marking the bootstrap socket close-on-exec".to_string())?;
    let null = fs::File::open("/dev/null").context(|| "opening /dev/null".to_string())?;
    nix::unistd::dup2_stdin(&null).context(|| "replacing fd 0".to_string())?;
    let bootstrap = SeqPacket::from_fd(bootstrap);
    bootstrap.set_recv_timeout(Some(std::time::Duration::from_secs(10)))?;
    let message = bootstrap
        .recv()?
        .ok_or_else(|| Error::failed("the daemon closed the bootstrap socket"))?;
    let mut fds = message.fds.into_iter();
    match (fds.next(), fds.next()) {
        (Some(chan), None) => Ok(SeqPacket::from_fd(chan)),
        _ => Err(Error::Protocol(
            "the bootstrap must carry exactly the channel".into(),
        )),
    }
}

impl Agent {
    fn prepare_kit_socket(&self) -> Result<Listener> {
        fs::create_dir_all(&self.paths.kit_dir)
            .context(|| format!("creating {}", self.paths.kit_dir.display()))?;
        match fs::remove_file(&self.paths.kit_socket) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Error::io(
                    format!("removing {}", self.paths.kit_socket.display()),
                    e,
                ));
            }
        }
        Listener::bind(&self.paths.kit_socket)
    }

    fn serve_daemon(self: &Arc<Self>) -> Result<()> {
        while let Some((msg, fds)) = proto::recv::<ToAgent>(&self.chan)? {
            match msg {
                ToAgent::Run {
                    job,
                    command,
                    cwd,
                    env,
                    kits,
                } => {
                    self.sync_wrappers(&kits);
                    let mut fds = fds.into_iter();
                    match (fds.next(), fds.next()) {
                        (Some(stdout), Some(stderr)) => {
                            self.start_job(job, &command, &cwd, &env, stdout, stderr)
                        }
                        _ => self.report(FromAgent::SpawnFailed {
                            job,
                            message: "job request without stdout and stderr".into(),
                        }),
                    }
                }
                ToAgent::Cancel { job } => self.cancel(job),
                ToAgent::KitDone {
                    req,
                    exit_code,
                    signal,
                } => self.finish_kit(req, KitReply::Done { exit_code, signal }),
                ToAgent::KitFailed { req, code, message } => {
                    self.finish_kit(req, KitReply::Failed { code, message })
                }
            }
        }
        Ok(())
    }

    pub(crate) fn report(&self, msg: FromAgent) {
        if let Err(e) = proto::send(&self.chan, &msg, &[]) {
            util::log!("marshd agent: reporting to the daemon: {e}");
        }
    }

    fn start_job(
        self: &Arc<Self>,
        job: u64,
        command: &Bytes,
        cwd: &Bytes,
        env: &[EnvVar],
        stdout: OwnedFd,
        stderr: OwnedFd,
    ) {
        let env: Vec<(&OsStr, &OsStr)> = env
            .iter()
            .map(|v| (OsStr::from_bytes(&v.name.0), OsStr::from_bytes(&v.value.0)))
            .collect();
        if let Some((_, home)) = env.iter().find(|(k, _)| *k == "HOME") {
            let home = Path::new(home);
            if home.is_absolute() && !home.exists() {
                // Best effort (the sandbox root is read-only): a later caller may bring
                // a HOME the sandbox was not booted with; under /tmp it can be created.
                let _ = fs::create_dir_all(home);
            }
        }
        let spawned = Command::new("/bin/sh")
            .arg("-c")
            .arg(OsStr::from_bytes(&command.0))
            .env_clear()
            .envs(env)
            .current_dir(OsStr::from_bytes(&cwd.0))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                self.report(FromAgent::SpawnFailed {
                    job,
                    message: format!("starting /bin/sh: {e}"),
                });
                return;
            }
        };
        let pgid = util::child_pid(&child);
        lock(&self.jobs).insert(
            job,
            JobSlot {
                pgid,
                exited: false,
            },
        );
        let agent = Arc::clone(self);
        let waiter = std::thread::Builder::new()
            .name(format!("job-{job}"))
            .spawn(move || agent.wait_job(job, child));
        if let Err(e) = waiter {
            // Without a waiter nobody would report this job: kill it and report now.
            util::kill_group(pgid);
            lock(&self.jobs).remove(&job);
            self.report(FromAgent::SpawnFailed {
                job,
                message: format!("starting a job waiter: {e}"),
            });
        }
    }

    fn wait_job(&self, job: u64, mut child: Child) {
        let pid = util::child_pid(&child);
        util::wait_exit_unreaped(pid);
        if let Some(slot) = lock(&self.jobs).get_mut(&job) {
            slot.exited = true;
        }
        // The leader is still an unreaped zombie here, so the group id is ours: kill
        // whatever the job left behind in its process group.
        util::kill_group(pid);
        let (exit_code, signal) = match child.wait() {
            Ok(status) => (status.code(), status.signal()),
            Err(_) => (None, None),
        };
        lock(&self.jobs).remove(&job);
        self.report(FromAgent::Exited {
            job,
            exit_code,
            signal,
        });
    }

    fn cancel(&self, job: u64) {
        let jobs = lock(&self.jobs);
        if let Some(slot) = jobs.get(&job).filter(|s| !s.exited) {
            util::kill_group(slot.pgid);
        }
    }

    fn kill_all(&self) {
        for slot in lock(&self.jobs).values().filter(|s| !s.exited) {
            util::kill_group(slot.pgid);
        }
        for (_, waiter) in lock(&self.kit_waiters).drain() {
            let _ = waiter.send(KitReply::Failed {
                code: 1,
                message: "the project shell is shutting down".into(),
            });
        }
    }

    fn finish_kit(&self, req: u64, reply: KitReply) {
        if let Some(waiter) = lock(&self.kit_waiters).remove(&req) {
            let _ = waiter.send(reply);
        }
    }

    /// Makes the wrapper directory hold exactly one executable per registered kit.
    fn sync_wrappers(&self, kits: &[String]) {
        let mut current = lock(&self.wrappers);
        if current.as_slice() == kits {
            return;
        }
        for stale in current.iter().filter(|k| !kits.contains(k)) {
            let _ = fs::remove_file(self.paths.kit_dir.join(stale));
        }
        for kit in kits.iter().filter(|k| crate::kits::valid_name(k)) {
            if let Err(e) = self.write_wrapper(kit) {
                util::log!("marshd agent: writing the wrapper for kit {kit}: {e}");
            }
        }
        *current = kits.to_vec();
    }

    fn write_wrapper(&self, kit: &str) -> std::io::Result<()> {
        let script = format!(
            "#!/bin/sh\nexec {} kit-client --socket {} {} \"$@\"\n",
            util::shell_quote(&self.paths.self_exe.to_string_lossy()),
            util::shell_quote(&self.paths.kit_socket.to_string_lossy()),
            util::shell_quote(kit),
        );
        let tmp = self.paths.kit_dir.join(format!(".{kit}.tmp"));
        fs::write(&tmp, script)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, self.paths.kit_dir.join(kit))
    }
}
