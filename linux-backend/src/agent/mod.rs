//! The agent inside the project shell: `marshd agent`, started by the daemon as the
//! sandbox's main process; it receives its daemon channel over a bootstrap socket on
//! fd 0 (see [`take_channel`]).
//!
//! It starts `/bin/sh -c CMD` per job (cwd = workspace, the fixed job environment,
//! stdin/stdout/stderr = the caller's descriptors) in the job's own container (see
//! [`container`]; unconfined, in its own process group), reports each exit, ends a
//! job's container (or group) on cancel, and relays kit and publication requests from a
//! sandbox-private socket to the daemon. It holds no daemon credential: its only
//! authority is the inherited channel, which can start jobs' kits, ask for publication
//! transactions and report exits, nothing more.

mod container;
pub mod init;
pub mod kit_client;
mod kit_server;
pub mod mcp_client;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, mpsc};

use nix::unistd::Pid;

use crate::error::{Context, Error, Result};
use crate::proto::{self, Bytes, EnvVar, FromAgent, KitReply, PublicationAnswer, ToAgent};
use crate::seqpacket::{Listener, SeqPacket};
use crate::util::{self, lock};
use crate::workers::Workers;

/// Where the agent serves kits and what its wrappers execute.
#[derive(Debug, Clone)]
pub struct AgentPaths {
    pub kit_socket: PathBuf,
    pub kit_dir: PathBuf,
    /// The shell's own commands (`mcp`), first on jobs' PATH.
    pub bin_dir: PathBuf,
    /// The agent binary as seen from inside the sandbox (wrappers exec it).
    pub self_exe: PathBuf,
    /// Each job in its own pid and mount namespace (bubblewrap only: it needs the
    /// agent's namespace-local capabilities).
    pub contain: bool,
    /// `RLIMIT_NPROC` of each job, when no control group bounds the scope.
    pub nproc: Option<u64>,
}

/// One job, from the moment the daemon asked for it.
struct JobSlot {
    /// The job's init (contained) or process-group leader; `None` while starting.
    pid: Option<Pid>,
    contained: bool,
    /// A cancel that arrived while the job was starting; honoured once `pid` is known.
    cancelled: bool,
    /// Set once the leader's (or init's) exit has been observed, before it is reaped:
    /// until then `pid` cannot have been recycled, and from then on no kill is sent.
    exited: bool,
}

impl JobSlot {
    /// Ends everything the job started: its whole pid namespace via init, or its
    /// process group.
    fn kill(&self) {
        match (self.pid, self.exited) {
            (Some(pid), false) if self.contained => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            (Some(pid), false) => util::kill_group(pid),
            _ => {}
        }
    }
}

pub(crate) struct Agent {
    chan: SeqPacket,
    paths: AgentPaths,
    jobs: Mutex<HashMap<u64, JobSlot>>,
    kit_waiters: Mutex<HashMap<u64, mpsc::Sender<KitReply>>>,
    publication_waiters: Mutex<HashMap<u64, mpsc::Sender<PublicationAnswer>>>,
    /// Request ids of kit and publication requests (one sequence for both).
    next_kit_req: AtomicU64,
    wrappers: Mutex<Vec<String>>,
    /// Spare job containers (only when jobs are contained).
    containers: Option<container::Pool>,
    /// Threads that run jobs, reused from one job to the next.
    workers: Workers,
}

/// How a job ended, as reported to the daemon.
enum JobEnd {
    Ended(container::Ending),
    /// It never started.
    NotStarted(String),
    /// Its container died under it, not by a cancel.
    Lost(String),
}

/// The ending of a job killed by a cancel.
const KILLED: container::Ending = container::Ending {
    exit_code: None,
    signal: Some(libc::SIGKILL),
};

/// One job as the daemon asked for it.
struct JobRequest {
    job: u64,
    command: Bytes,
    cwd: Bytes,
    env: Vec<EnvVar>,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

/// Runs the agent until the daemon channel closes; then kills every job and returns.
pub fn run(paths: AgentPaths) -> Result<()> {
    let (chan, admission) = take_channel()?;
    // Jobs run as the same uid; without the dumpable flag they cannot ptrace the agent
    // or open its descriptors through /proc.
    nix::sys::prctl::set_dumpable(false).context(|| "clearing the dumpable flag".to_string())?;

    let agent = Arc::new(Agent {
        chan,
        jobs: Mutex::new(HashMap::new()),
        kit_waiters: Mutex::new(HashMap::new()),
        publication_waiters: Mutex::new(HashMap::new()),
        next_kit_req: AtomicU64::new(1),
        wrappers: Mutex::new(Vec::new()),
        containers: paths
            .contain
            .then(|| container::Pool::new(paths.self_exe.clone(), admission)),
        workers: Workers::new("job"),
        paths,
    });
    agent.write_commands()?;
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

/// Receives the daemon channel (and, from a root daemon, the admission socket) over
/// the bootstrap socket on fd 0, then puts /dev/null on fd 0.
///
/// The channel never sits on an inherited descriptor: bubblewrap's own init process
/// keeps its stdio open for the sandbox's lifetime, and it is dumpable, so jobs could
/// take a copy of anything on it. All it keeps is the spent bootstrap socket, whose
/// daemon end is closed once the channel has been handed over.
fn take_channel() -> Result<(SeqPacket, Option<Arc<container::AdmissionLink>>)> {
    let bootstrap = SeqPacket::take_stdin()?;
    bootstrap.set_recv_timeout(Some(std::time::Duration::from_secs(10)))?;
    let message = bootstrap
        .recv()?
        .ok_or_else(|| Error::failed("the daemon closed the bootstrap socket"))?;
    let mut fds = message.fds.into_iter();
    match (fds.next(), fds.next(), fds.next()) {
        (Some(chan), admission, None) => Ok((
            SeqPacket::from_fd(chan),
            admission.map(|fd| Arc::new(Mutex::new(SeqPacket::from_fd(fd)))),
        )),
        _ => Err(Error::Protocol(
            "the bootstrap must carry the channel and at most the admission socket".into(),
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
                    match <[OwnedFd; 3]>::try_from(fds) {
                        Ok([stdin, stdout, stderr]) => self.start_job(JobRequest {
                            job,
                            command,
                            cwd,
                            env,
                            stdin,
                            stdout,
                            stderr,
                        }),
                        Err(_) => self.report(FromAgent::SpawnFailed {
                            job,
                            message: "job request without stdin, stdout and stderr".into(),
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
                ToAgent::PublicationDone { req, answer } => {
                    if let Some(waiter) = lock(&self.publication_waiters).remove(&req) {
                        let _ = waiter.send(answer);
                    }
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

    fn start_job(self: &Arc<Self>, request: JobRequest) {
        if let Some(home) = request
            .env
            .iter()
            .find(|v| v.name.0 == b"HOME")
            .map(|v| Path::new(OsStr::from_bytes(&v.value.0)))
            && home.is_absolute()
            && !home.exists()
        {
            // Best effort (the sandbox root is read-only): a later caller may bring a
            // HOME the sandbox was not booted with; under /tmp it can be created.
            let _ = fs::create_dir_all(home);
        }
        let job = request.job;
        lock(&self.jobs).insert(
            job,
            JobSlot {
                pid: None,
                contained: self.containers.is_some(),
                cancelled: false,
                exited: false,
            },
        );
        let agent = Arc::clone(self);
        // A worker per running job (reused across jobs): it starts the job (a
        // container may need a thread of its own, see `container::Pool::take`) and
        // waits for it.
        let runner = self.workers.run(move || agent.run_job(request));
        if let Err(e) = runner {
            lock(&self.jobs).remove(&job);
            self.report(FromAgent::SpawnFailed {
                job,
                message: format!("starting a job thread: {e}"),
            });
        }
    }

    fn run_job(&self, request: JobRequest) {
        let job = request.job;
        let Some(pool) = &self.containers else {
            let end = match self.run_grouped(request) {
                Ok(ending) => JobEnd::Ended(ending),
                Err(message) => JobEnd::NotStarted(message),
            };
            self.finish(job, end);
            return;
        };
        let mut contained = match self.start_contained(pool, &request) {
            Err(message) => {
                self.finish(job, JobEnd::NotStarted(message));
                return;
            }
            Ok(None) => {
                // Cancelled before it started: nothing ran.
                self.finish(job, JobEnd::Ended(KILLED));
                return;
            }
            Ok(Some(contained)) => contained,
        };
        drop(request);
        match contained.wait_report() {
            container::Report::Ended(ending) => {
                self.finish_and_recycle(pool, job, contained, JobEnd::Ended(ending));
            }
            container::Report::NotStarted(message) => {
                let end = JobEnd::NotStarted(format!("starting the job: {message}"));
                self.finish_and_recycle(pool, job, contained, end);
            }
            container::Report::Died => {
                // No kill may be sent from here on: once init is reaped its pid can be
                // reused. The ending is reported only once the namespace is empty.
                let cancelled = lock(&self.jobs).get_mut(&job).is_some_and(|slot| {
                    slot.exited = true;
                    slot.cancelled
                });
                contained.close();
                let end = if cancelled {
                    JobEnd::Ended(KILLED)
                } else {
                    JobEnd::Lost("the job's container died while the job ran".into())
                };
                self.finish(job, end);
            }
        }
    }

    /// Reports the end, then returns the (empty) container to the pool unless a kill
    /// may have reached it.
    fn finish_and_recycle(
        &self,
        pool: &container::Pool,
        job: u64,
        contained: container::Contained,
        end: JobEnd,
    ) {
        // After `finish` no cancel can reach this init any more.
        if self.finish(job, end) {
            contained.close();
            return;
        }
        match contained.into_warm() {
            Ok(warm) => {
                if let Some(surplus) = pool.give_back(warm) {
                    surplus.close();
                }
            }
            Err(dead) => dead.close(),
        }
    }

    /// Forgets the job (a later cancel is a no-op) and reports how it ended. Returns
    /// whether a kill was ever sent to it.
    fn finish(&self, job: u64, end: JobEnd) -> bool {
        let killed = lock(&self.jobs)
            .remove(&job)
            .is_some_and(|slot| slot.cancelled && slot.pid.is_some());
        self.report(match end {
            JobEnd::Ended(ending) => FromAgent::Exited {
                job,
                exit_code: ending.exit_code,
                signal: ending.signal,
            },
            JobEnd::NotStarted(message) => FromAgent::SpawnFailed { job, message },
            JobEnd::Lost(message) => FromAgent::Lost { job, message },
        });
        killed
    }

    /// Records the job's pid for cancels, honouring one that arrived while it started.
    fn started(&self, job: u64, pid: Pid) {
        if let Some(slot) = lock(&self.jobs).get_mut(&job) {
            slot.pid = Some(pid);
            if slot.cancelled {
                slot.kill();
            }
        }
    }

    /// Hands the job to a ready container; `Ok(None)` when it was cancelled before it
    /// could start. An idle container that died meanwhile is replaced once.
    fn start_contained(
        &self,
        pool: &container::Pool,
        request: &JobRequest,
    ) -> std::result::Result<Option<container::Contained>, String> {
        let starting = |e: Error| format!("starting the job's container: {e}");
        let warm = pool.take().map_err(starting)?;
        if lock(&self.jobs)
            .get(&request.job)
            .is_some_and(|s| s.cancelled)
        {
            if let Some(surplus) = pool.give_back(warm) {
                surplus.close();
            }
            return Ok(None);
        }
        let run = |warm: container::Warm| {
            warm.run(
                &request.command,
                &request.cwd,
                request.env.clone(),
                self.paths.nproc,
                [
                    request.stdin.as_fd(),
                    request.stdout.as_fd(),
                    request.stderr.as_fd(),
                ],
            )
        };
        let contained = match run(warm) {
            Ok(contained) => contained,
            Err(_) => pool.prepare_now().and_then(run).map_err(starting)?,
        };
        self.started(request.job, util::child_pid(&contained.init));
        Ok(Some(contained))
    }

    fn run_grouped(&self, request: JobRequest) -> std::result::Result<container::Ending, String> {
        let env = request
            .env
            .iter()
            .map(|v| (OsStr::from_bytes(&v.name.0), OsStr::from_bytes(&v.value.0)));
        let shell = crate::job_shell::JobShell::detect().program();
        let spawned = Command::new(shell)
            .arg("-c")
            .arg(OsStr::from_bytes(&request.command.0))
            .env_clear()
            .envs(env)
            .current_dir(OsStr::from_bytes(&request.cwd.0))
            .process_group(0)
            .stdin(Stdio::from(request.stdin))
            .stdout(Stdio::from(request.stdout))
            .stderr(Stdio::from(request.stderr))
            .spawn();
        let mut child = spawned.map_err(|e| format!("starting {shell}: {e}"))?;
        let pid = util::child_pid(&child);
        self.started(request.job, pid);
        util::wait_exit_unreaped(pid);
        if let Some(slot) = lock(&self.jobs).get_mut(&request.job) {
            slot.exited = true;
        }
        // The leader is still an unreaped zombie here, so the group id is ours: kill
        // whatever the job left behind in its process group.
        util::kill_group(pid);
        Ok(match child.wait() {
            Ok(status) => container::Ending {
                exit_code: status.code(),
                signal: status.signal(),
            },
            Err(_) => container::Ending {
                exit_code: None,
                signal: None,
            },
        })
    }

    fn cancel(&self, job: u64) {
        let mut jobs = lock(&self.jobs);
        if let Some(slot) = jobs.get_mut(&job) {
            slot.cancelled = true;
            slot.kill();
        }
    }

    fn kill_all(&self) {
        for slot in lock(&self.jobs).values_mut() {
            slot.cancelled = true;
            slot.kill();
        }
        for (_, waiter) in lock(&self.kit_waiters).drain() {
            let _ = waiter.send(KitReply::Failed {
                code: 1,
                message: "the project shell is shutting down".into(),
            });
        }
        // Dropping a publication waiter answers its command as uncertain: the daemon
        // may have carried the request out.
        lock(&self.publication_waiters).clear();
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

    /// Writes the shell's own commands into `bin_dir`: `mcp`, which hands its
    /// arguments to `marshd mcp-client` (publication requests over the agent socket).
    fn write_commands(&self) -> Result<()> {
        let dir = &self.paths.bin_dir;
        fs::create_dir_all(dir).context(|| format!("creating {}", dir.display()))?;
        let script = format!(
            "#!/bin/sh\nexec {} mcp-client --socket {} \"$@\"\n",
            util::shell_quote(&self.paths.self_exe.to_string_lossy()),
            util::shell_quote(&self.paths.kit_socket.to_string_lossy()),
        );
        install_script(dir, "mcp", &script).context(|| format!("writing {}/mcp", dir.display()))
    }

    fn write_wrapper(&self, kit: &str) -> std::io::Result<()> {
        let script = format!(
            "#!/bin/sh\nexec {} kit-client --socket {} {} \"$@\"\n",
            util::shell_quote(&self.paths.self_exe.to_string_lossy()),
            util::shell_quote(&self.paths.kit_socket.to_string_lossy()),
            util::shell_quote(kit),
        );
        install_script(&self.paths.kit_dir, kit, &script)
    }
}

/// Installs an executable script `dir/name` by rename, so a job never runs half of it.
fn install_script(dir: &Path, name: &str, script: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, script)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    fs::rename(&tmp, dir.join(name))
}
