//! The project shell: one long-lived sandbox running the agent, plus the supervisor
//! thread that spawned it. The supervisor lives exactly as long as the sandbox, which
//! matters because `--die-with-parent` (PR_SET_PDEATHSIG) fires when the spawning
//! *thread* exits.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::{Config, Daemon, kit_jobs, publish};
use crate::admission::Admitter;
use crate::error::{Context, Error, Result};
use crate::proto::{self, Bytes, EnvVar, FromAgent, ToAgent};
use crate::sandbox::{
    self, Isolation, JobHome, Layout, Role, SANDBOX_AGENT, SANDBOX_BIN_DIR, SANDBOX_KIT_DIR,
    SANDBOX_KIT_SOCKET,
};
use crate::seqpacket::SeqPacket;
use crate::util::{self, lock, log};

/// How long a fresh sandbox may take to report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an agent whose channel closed may take to end its jobs and exit.
const AGENT_GRACE: Duration = Duration::from_secs(2);
/// How long a killed sandbox may take to be reaped.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a shell job ended.
pub(crate) enum JobOutcome {
    Exited {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    SpawnFailed(String),
    /// The job's container died under it (not by a cancel).
    Lost(String),
    ShellLost,
}

pub(crate) struct Shell {
    pub id: u64,
    chan: SeqPacket,
    /// The kit wrapper directory as jobs see it (on their PATH, after `bin_dir`).
    pub kit_dir: PathBuf,
    /// The shell's own commands (`mcp`) as jobs see them (first on their PATH).
    pub bin_dir: PathBuf,
    /// Jobs awaiting their outcome. Once `alive` is false (set under this lock) no
    /// entry is added, and every remaining one is failed with `ShellLost`.
    pending: Mutex<HashMap<u64, mpsc::Sender<JobOutcome>>>,
    alive: AtomicBool,
    next_job: AtomicU64,
    gone: Mutex<bool>,
    gone_cv: Condvar,
}

impl Shell {
    /// Starts a sandbox and its supervisor; returns once the agent reports ready.
    pub(crate) fn boot(daemon: &Arc<Daemon>) -> Result<Arc<Shell>> {
        let id = daemon.next_shell.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let supervisor = Arc::clone(daemon);
        std::thread::Builder::new()
            .name(format!("shell-{id}"))
            .spawn(move || supervise(&supervisor, id, &tx))
            .context(|| "starting the shell supervisor".to_string())?;
        // A shell that cannot boot means no job can run: a backend failure.
        rx.recv()
            .unwrap_or_else(|_| Err(Error::failed("the shell supervisor died during boot")))
            .map_err(Error::into_backend)
    }

    /// The directories put ahead of the caller's PATH in a job's environment (and
    /// removed from it for a kit's), in order.
    pub(crate) fn path_dirs(&self) -> [&std::path::Path; 2] {
        [&self.bin_dir, &self.kit_dir]
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Hands one job to the agent; the receiver yields its outcome exactly once.
    pub(crate) fn start_job(
        &self,
        command: &Bytes,
        cwd: &Bytes,
        env: Vec<EnvVar>,
        kits: Vec<String>,
        stdio: [BorrowedFd<'_>; 3],
    ) -> Result<(u64, mpsc::Receiver<JobOutcome>)> {
        let job = self.next_job.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        {
            let mut pending = lock(&self.pending);
            if !self.is_alive() {
                return Err(Error::failed("the project shell is down"));
            }
            pending.insert(job, tx);
        }
        let msg = ToAgent::Run {
            job,
            command: command.clone(),
            cwd: cwd.clone(),
            env,
            kits,
        };
        if let Err(e) = proto::send(&self.chan, &msg, &stdio) {
            lock(&self.pending).remove(&job);
            return Err(Error::failed(format!(
                "handing the job to the project shell: {e}"
            )));
        }
        Ok((job, rx))
    }

    pub(crate) fn cancel(&self, job: u64) {
        let _ = proto::send(&self.chan, &ToAgent::Cancel { job }, &[]);
    }

    pub(crate) fn send(&self, msg: &ToAgent) {
        if let Err(e) = proto::send(&self.chan, msg, &[]) {
            log!("marshd: shell {}: {e}", self.id);
        }
    }

    /// Ends the sandbox and every job in it, and waits (bounded) until the supervisor
    /// has reaped it: closing the channel makes the agent kill its jobs' process groups
    /// and exit; the supervisor SIGKILLs the sandbox if it lingers.
    pub(crate) fn kill_and_wait(&self) {
        self.chan.shutdown();
        let gone = lock(&self.gone);
        let _ = self
            .gone_cv
            .wait_timeout_while(gone, AGENT_GRACE + EXIT_TIMEOUT, |gone| !*gone);
    }

    fn complete(&self, job: u64, outcome: JobOutcome) {
        if let Some(tx) = lock(&self.pending).remove(&job) {
            let _ = tx.send(outcome);
        }
    }

    /// Marks the shell dead and fails every job still waiting on it.
    fn mark_dead(&self) {
        let mut pending = lock(&self.pending);
        self.alive.store(false, Ordering::SeqCst);
        for (_, tx) in pending.drain() {
            let _ = tx.send(JobOutcome::ShellLost);
        }
    }
}

/// The supervisor: spawn, await ready, relay agent messages until the channel
/// closes, then reap. Sends exactly one boot result on `boot`.
fn supervise(daemon: &Arc<Daemon>, id: u64, boot: &mpsc::Sender<Result<Arc<Shell>>>) {
    let (mut child, chan, AgentDirs { kit_dir, bin_dir }) = match spawn_agent(&daemon.cfg) {
        Ok(spawned) => spawned,
        Err(e) => {
            let _ = boot.send(Err(e));
            return;
        }
    };
    let pgid = util::child_pid(&child);
    let shell = Arc::new(Shell {
        id,
        chan,
        kit_dir,
        bin_dir,
        pending: Mutex::new(HashMap::new()),
        alive: AtomicBool::new(true),
        next_job: AtomicU64::new(1),
        gone: Mutex::new(false),
        gone_cv: Condvar::new(),
    });
    let ready = await_ready(&shell.chan);
    let booted = match ready {
        Ok(()) => boot.send(Ok(Arc::clone(&shell))).is_ok(),
        Err(e) => {
            let _ = boot.send(Err(e));
            false
        }
    };
    if booted {
        relay(daemon, &shell);
    }
    shell.mark_dead();
    // The agent kills its jobs and exits once its channel closes; unconfined, that is
    // the only way its jobs (each in its own process group) are reached. A sandbox
    // that lingers past the grace period is killed.
    shell.chan.shutdown();
    if !exits_within(&mut child, AGENT_GRACE) {
        util::kill_group(pgid);
    }
    let _ = child.wait();
    daemon.cancel_kit_jobs_of(id);
    *lock(&shell.gone) = true;
    shell.gone_cv.notify_all();
    daemon.on_shell_exit(id);
    if booted {
        log!("marshd: project shell {id} exited");
    }
}

/// True if `child` exits (it is then reaped) within `limit`.
fn exits_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(_)) | Err(_) => return true,
            Ok(None) if Instant::now() >= deadline => return false,
            Ok(None) => std::thread::sleep(pause),
        }
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

fn await_ready(chan: &SeqPacket) -> Result<()> {
    chan.set_recv_timeout(Some(READY_TIMEOUT))?;
    let ready = match proto::recv::<FromAgent>(chan) {
        Ok(Some((FromAgent::Ready { version }, _))) if version == env!("CARGO_PKG_VERSION") => {
            Ok(())
        }
        Ok(Some((FromAgent::Ready { version }, _))) => Err(Error::failed(format!(
            "the agent is version {version}, the daemon {}",
            env!("CARGO_PKG_VERSION")
        ))),
        Ok(Some(_)) => Err(Error::failed("the agent spoke before it was ready")),
        Ok(None) => Err(Error::failed(
            "the project shell exited during boot (see daemon/marshd.log)",
        )),
        Err(e) => Err(Error::failed(format!(
            "the project shell did not become ready: {e}"
        ))),
    };
    chan.set_recv_timeout(None)?;
    ready
}

/// Relays agent messages until the channel closes or the agent misbehaves.
fn relay(daemon: &Arc<Daemon>, shell: &Arc<Shell>) {
    loop {
        let (msg, fds) = match proto::recv::<FromAgent>(&shell.chan) {
            Ok(Some(got)) => got,
            Ok(None) => return,
            Err(e) => {
                log!("marshd: shell {}: {e}", shell.id);
                return;
            }
        };
        match msg {
            FromAgent::Ready { .. } => {}
            FromAgent::Exited {
                job,
                exit_code,
                signal,
            } => shell.complete(job, JobOutcome::Exited { exit_code, signal }),
            FromAgent::Lost { job, message } => shell.complete(job, JobOutcome::Lost(message)),
            FromAgent::SpawnFailed { job, message } => {
                shell.complete(job, JobOutcome::SpawnFailed(message))
            }
            FromAgent::KitRun {
                req,
                kit,
                args,
                env,
            } => kit_jobs::start(daemon, shell, req, kit, args, env, fds),
            FromAgent::KitCancel { req } => daemon.kit_job_cancel((shell.id, req)),
            FromAgent::Publication { req, request } => publish::start(daemon, shell, req, request),
        }
    }
}

/// The agent's directories as jobs see them.
struct AgentDirs {
    kit_dir: PathBuf,
    bin_dir: PathBuf,
}

/// Spawns the agent (inside bubblewrap unless unconfined) with the channel on its
/// fd 0, its stderr piped into the daemon log. Returns the child, the daemon's end of
/// the channel and the agent's directories as jobs see them.
fn spawn_agent(cfg: &Config) -> Result<(Child, SeqPacket, AgentDirs)> {
    // The agent is this daemon's own inode, bound or executed by descriptor. Once the
    // installed file was replaced that inode is unlinked, and bubblewrap cannot bind
    // an unlinked file: say so rather than let the sandbox fail obscurely. (What is
    // installed now is never used in its place.)
    let exe = format!("/proc/self/fd/{}", cfg.self_fd.as_raw_fd());
    if std::fs::read_link(&exe).is_ok_and(|p| p.to_string_lossy().ends_with(" (deleted)")) {
        return Err(Error::failed(
            "the marshd executable was replaced since this daemon started; stop the daemon (marsh stop) so the next run boots the installed one",
        )
        .into_backend());
    }
    let (ours, theirs) = SeqPacket::pair()?;
    // The channel itself is handed over on a bootstrap socket, never inherited: see
    // `agent::take_channel` for why.
    let (bootstrap, agent_bootstrap) = SeqPacket::pair()?;
    // The admission socket, for a root daemon whose jobs are contained: the agent asks
    // on it for each job container to be admitted before it takes a job.
    let admission = match &cfg.isolation {
        Isolation::Bwrap(_) if util::euid() == 0 => {
            let (ours, theirs) = SeqPacket::pair()?;
            let admitter = Admitter {
                guard: cfg.setid_guard.as_ref().ok().cloned(),
            };
            Some((Arc::new(admitter), ours, theirs))
        }
        _ => None,
    };
    let agent_env = [(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))];
    let (mut cmd, dirs, seccomp) = match &cfg.isolation {
        Isolation::Bwrap(bwrap) => {
            let guest_home = cfg.home.guest_home();
            let job_home = cfg.job_home.as_deref().map(|at| JobHome {
                at,
                backing: Some(&guest_home),
            });
            if let Some(JobHome { at, .. }) = job_home
                && sandbox::home_is_mountable(at)
                && sandbox::home_is_backable(at)
            {
                // No job of this scope runs while its shell starts (see `guest_home`).
                let mut targets: Vec<&Path> = vec![&cfg.workspace];
                targets.extend(cfg.exposed.dirs.iter().map(|d| d.at.as_path()));
                sandbox::prepare_mount_points(&guest_home, at, &targets)?;
            }
            let layout = Layout {
                role: Role::Shell,
                workspace: &cfg.workspace,
                job_home,
                exposed: Some(&cfg.exposed),
                hostname: "marsh-shell",
                ro_files: vec![(cfg.self_fd.as_raw_fd(), SANDBOX_AGENT)],
                pass_fds: Vec::new(),
            };
            let mut argv: Vec<OsString> = [
                SANDBOX_AGENT,
                "agent",
                "--kit-socket",
                SANDBOX_KIT_SOCKET,
                "--kit-dir",
                SANDBOX_KIT_DIR,
                "--bin-dir",
                SANDBOX_BIN_DIR,
                "--self",
                SANDBOX_AGENT,
                "--contain",
            ]
            .iter()
            .map(OsString::from)
            .collect();
            if let Some(nproc) = cfg.confinement.limits.nproc_limit() {
                argv.extend(["--nproc".into(), nproc.to_string().into()]);
            }
            let (cmd, seccomp) =
                sandbox::bwrap_command(bwrap, &cfg.confinement, &layout, &agent_env, &argv)?;
            let dirs = AgentDirs {
                kit_dir: PathBuf::from(SANDBOX_KIT_DIR),
                bin_dir: PathBuf::from(SANDBOX_BIN_DIR),
            };
            (cmd, dirs, Some(seccomp))
        }
        Isolation::Unconfined => {
            let dir = cfg.home.unconfined_agent_dir();
            // A previous shell's scratch is stale; it lives in our own daemon/ dir.
            let _ = std::fs::remove_dir_all(&dir);
            util::ensure_private_dir(&dir)?;
            let dirs = AgentDirs {
                kit_dir: dir.join("kits"),
                bin_dir: dir.join("bin"),
            };
            let mut cmd = Command::new(format!("/proc/self/fd/{}", cfg.self_fd.as_raw_fd()));
            cmd.arg0(&cfg.self_exe);
            cmd.arg("agent")
                .arg("--kit-socket")
                .arg(dir.join("kit.sock"))
                .arg("--kit-dir")
                .arg(&dirs.kit_dir)
                .arg("--bin-dir")
                .arg(&dirs.bin_dir)
                .arg("--self")
                .arg(&cfg.self_exe)
                .env_clear()
                .envs(agent_env.iter().cloned())
                .current_dir(&cfg.workspace);
            sandbox::prepare_unconfined(&mut cmd, &cfg.confinement);
            (cmd, dirs, None)
        }
    };
    cmd.process_group(0)
        .stdin(Stdio::from(agent_bootstrap.into_fd()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let spawned = cmd.spawn();
    // The Command holds the sandbox's end of the bootstrap socket: close it here, and
    // our copy of the seccomp program's descriptor.
    drop((cmd, seccomp));
    let mut child = spawned
        .context(|| "starting the project shell".to_string())
        .map_err(Error::into_backend)?;
    let mut handed: Vec<BorrowedFd<'_>> = vec![theirs.as_fd()];
    if let Some((_, _, agent_end)) = &admission {
        handed.push(agent_end.as_fd());
    }
    let handed_over = bootstrap.send(b"channel", &handed);
    drop(handed);
    // From here the agent is the only holder of its end of the channel (and of the
    // admission socket), so its death reads as end of stream; closing the bootstrap
    // leaves nothing on it.
    let admission_served = match admission {
        Some((admitter, ours_end, agent_end)) => {
            drop(agent_end);
            admitter.serve_link(ours_end)
        }
        None => Ok(()),
    };
    drop((theirs, bootstrap));
    let handed_over = handed_over.and(admission_served);
    if let Err(e) = handed_over {
        util::kill_group(util::child_pid(&child));
        let _ = child.wait();
        return Err(e);
    }
    if let Some(stderr) = child.stderr.take() {
        let _ = std::thread::Builder::new()
            .name("shell-log".into())
            .spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    match line {
                        Ok(line) => log!("shell: {line}"),
                        Err(_) => break,
                    }
                }
            });
    }
    Ok((child, ours, dirs))
}
