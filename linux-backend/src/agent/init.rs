//! `marshd container-init`: pid 1 of one job's container, started (ahead of need) by
//! the agent in a fresh pid namespace with its channel on fd 0.
//!
//! It makes the container's mount namespace with a `/proc` of its own (read-only
//! `/proc/sys` and friends, masked kernel files) and says `Ready`. Then, one `Run` at a
//! time: it starts the job with every capability dropped, reaps until the job's shell
//! exits, empties the namespace (SIGKILL to every process in it, reaped to the last),
//! and only then reports the job's status. So a container never holds two jobs'
//! processes, and a reported ending means nothing of the job is left. It exits when its
//! channel closes, or dies by the agent's SIGKILL (a cancel), and the kernel kills
//! whatever is left in the namespace with it.
//!
//! It is its own small program (not a fork of the agent), and it gives up every
//! privilege right after making its mounts, before any job exists: jobs inherit a
//! process with no capability in any set, locked securebits and `no_new_privs`, and
//! start by a plain spawn with no code of ours between fork and exec.

#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::mount::{MsFlags, mount};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::error::{Context, Error, Result};
use crate::proto::{self, EnvVar, FromInit, ToInit};
use crate::sandbox::{
    CONTAINER_OOM_SCORE_ADJ, JOB_OOM_SCORE_ADJ, JOB_UMASK, PROC_MASKED_DIRS, PROC_MASKED_FILES,
    PROC_READ_ONLY, SANDBOX_AGENT_DIR,
};
use crate::seqpacket::SeqPacket;
use crate::setid_guard;
use crate::util::log;

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
/// SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED.
const LOCKED_SECUREBITS: libc::c_ulong = 0x01 | 0x02 | 0x20 | 0x40 | 0x80;
/// Highest capability number tried when emptying the bounding set (the kernel's is
/// lower; the first drop past it fails with EINVAL and ends the loop).
const LAST_CAP_TRIED: libc::c_ulong = 63;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The mode's entry point; the exit status only matters to the agent's log.
pub fn main(admit: bool) -> i32 {
    // Jobs run as the same uid: without the dumpable flag (exec set it again) they could
    // ptrace init or take its channel to the agent with pidfd_getfd.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        log!("marshd container-init: clearing the dumpable flag: {e}");
        return 1;
    }
    let chan = match SeqPacket::take_stdin() {
        Ok(chan) => chan,
        Err(e) => {
            log!("marshd container-init: {e}");
            return 1;
        }
    };
    // A setup failure is reported (before `Ready`, so the agent never uses this
    // container); a failure later only ends init, which the agent sees as end of stream.
    if let Err(e) = set_up(&chan, admit) {
        let message = e.to_string();
        let _ = proto::send(&chan, &FromInit::Failed { message }, &[]);
        return 1;
    }
    match serve(&chan) {
        Ok(()) => 0,
        Err(e) => {
            log!("marshd container-init: {e}");
            1
        }
    }
}

fn set_up(chan: &SeqPacket, admit: bool) -> Result<()> {
    if nix::unistd::getpid() != Pid::from_raw(1) {
        return Err(Error::failed(
            "container-init must be the first process of a new pid namespace",
        ));
    }
    make_mounts()?;
    // For the daemon's admission, before any job runs here: this init itself (its OOM
    // score) and the workspace mounts (the set-id guard).
    let mut admission = Vec::new();
    if admit {
        admission.push(own_pidfd()?);
        admission.extend(setid_guard::workspace_mounts()?);
    }
    // From here init needs no privilege at all (forking jobs, `kill(-1)` on its own
    // uid's processes and reaping need none), so it drops everything once and its jobs
    // inherit that: a plain spawn (vfork-fast, no pre-exec code) then suffices per job.
    drop_privileges()?;
    // Raising needs no privilege; the daemon's admission then sets the same score with
    // privilege where it can, which also floors the jobs' scores at it.
    set_oom_score_adj(CONTAINER_OOM_SCORE_ADJ);
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(JOB_UMASK));
    let borrowed: Vec<_> = admission.iter().map(AsFd::as_fd).collect();
    proto::send(chan, &FromInit::Ready, &borrowed)
}

/// A pidfd of this process (pid 1 of its namespace), by which the daemon finds it.
fn own_pidfd() -> Result<OwnedFd> {
    // SAFETY: plain system call; the result is checked and owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, 1, 0) };
    if fd < 0 {
        return Err(Error::io(
            "opening init's own pidfd",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

/// One job at a time until the agent closes the channel.
fn serve(chan: &SeqPacket) -> Result<()> {
    while let Some((
        ToInit::Run {
            command,
            cwd,
            env,
            nproc,
        },
        fds,
    )) = proto::recv::<ToInit>(chan)?
    {
        let report = match run_one(&command.0, &cwd.0, &env, nproc, fds) {
            Ok((exit_code, signal)) => FromInit::Ended { exit_code, signal },
            Err(e) => FromInit::NotStarted {
                message: e.to_string(),
            },
        };
        empty_namespace();
        proto::send(chan, &report, &[])?;
    }
    // The agent closed the channel: this container is no longer wanted.
    Ok(())
}

/// Starts one job and waits for its shell: `(exit_code, signal)`.
fn run_one(
    command: &[u8],
    cwd: &[u8],
    env: &[EnvVar],
    nproc: Option<u64>,
    fds: Vec<OwnedFd>,
) -> Result<(Option<i32>, Option<i32>)> {
    let [stdin, stdout, stderr]: [OwnedFd; 3] = fds
        .try_into()
        .map_err(|_| Error::Protocol("a run must carry stdin, stdout and stderr".into()))?;
    let shell = crate::job_shell::JobShell::detect().program();
    // Init moves to the job's directory itself rather than asking the spawn to: a
    // spawn that changes directory needs `posix_spawn_file_actions_addchdir_np`, which
    // the standard library finds only in a dynamically linked process, and without it
    // falls back to copying init with fork() for every job.
    std::env::set_current_dir(OsStr::from_bytes(cwd))
        .context(|| "entering the job's directory".to_string())?;
    let mut cmd = Command::new(shell);
    cmd.arg("-c")
        .arg(OsStr::from_bytes(command))
        .env_clear()
        .envs(
            env.iter()
                .map(|v| (OsStr::from_bytes(&v.name.0), OsStr::from_bytes(&v.value.0))),
        )
        .process_group(0)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    if let Some(n) = nproc {
        // On init itself: its only child is the job, which inherits the limit.
        nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, n, n)
            .context(|| "limiting the job's processes".to_string())?;
    }
    // The job inherits init's OOM score: raised for the spawn, init's own restored after
    // (down to the floor the daemon set, which the job inherits too and cannot go under).
    set_oom_score_adj(JOB_OOM_SCORE_ADJ);
    let job = cmd.spawn();
    set_oom_score_adj(CONTAINER_OOM_SCORE_ADJ);
    let job = job.map_err(|e| Error::failed(format!("starting {shell}: {e}")))?;
    // Dropping `cmd` closes our copies of the job's stdio: only the job holds it now.
    drop(cmd);
    Ok(reap_until(Pid::from_raw(job.id() as i32)))
}

/// Sets this process's OOM score; best effort (the score orders victims, it bounds
/// nothing).
fn set_oom_score_adj(score: i32) {
    if let Err(e) = std::fs::write("/proc/self/oom_score_adj", score.to_string()) {
        log!("marshd container-init: setting the OOM score {score}: {e}");
    }
}

/// Reaps every child (orphans are re-parented to us) until `job` ends.
fn reap_until(job: Pid) -> (Option<i32>, Option<i32>) {
    loop {
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == job => return (Some(code), None),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == job => {
                return (None, Some(sig as i32));
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            // No child left to wait for: the job is gone without a status.
            Err(_) => return (None, None),
        }
    }
}

/// SIGKILLs every other process of the namespace and reaps them all. `kill(-1)` from
/// the namespace's init reaches every process in it but init; repeating it until no
/// child is left also catches a process forked while the previous round was delivered
/// (a process that dies hands its children to init before it can be reaped, so "no
/// child of init" means "no process but init").
fn empty_namespace() {
    loop {
        let _ = nix::sys::signal::kill(Pid::from_raw(-1), nix::sys::signal::Signal::SIGKILL);
        match waitpid(None, Some(WaitPidFlag::__WALL)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// The container's own `/proc`, with what could change the host kernel read-only and
/// what reveals kernel internals masked.
fn make_mounts() -> Result<()> {
    let none: Option<&str> = None;
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .context(|| "making the container's mount namespace".to_string())?;
    // Nothing mounted here may propagate back into the shell's namespace.
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
        .context(|| "making the container's mounts private".to_string())?;
    let hardened = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), "/proc", Some("proc"), hardened, none)
        .context(|| "mounting the container's /proc".to_string())?;
    let skip_missing = |path: &str, result: nix::Result<()>| match result {
        Err(nix::errno::Errno::ENOENT) => Ok(false),
        Err(e) => Err(Error::sys(format!("covering {path}"), e)),
        Ok(()) => Ok(true),
    };
    for name in PROC_READ_ONLY {
        let path = format!("/proc/{name}");
        let bound = mount(
            Some(path.as_str()),
            path.as_str(),
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        );
        if skip_missing(&path, bound)? {
            let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | hardened;
            mount(none, path.as_str(), none, flags, none)
                .context(|| format!("making {path} read-only"))?;
        }
    }
    // The agent's directory (kit wrappers, kit socket) is shared by every container:
    // read-only here, so one job cannot replace a wrapper or the socket another job's
    // kit call goes through. Connecting to the socket needs no write access to it.
    let agent_dir = SANDBOX_AGENT_DIR;
    if Path::new(agent_dir).is_dir() {
        mount(
            Some(agent_dir),
            agent_dir,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        )
        .context(|| format!("binding {agent_dir}"))?;
        let flags = MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV;
        mount(none, agent_dir, none, flags, none)
            .context(|| format!("making {agent_dir} read-only"))?;
    }
    for name in PROC_MASKED_FILES {
        let path = format!("/proc/{name}");
        let masked = mount(
            Some("/dev/null"),
            path.as_str(),
            none,
            MsFlags::MS_BIND,
            none,
        );
        skip_missing(&path, masked)?;
    }
    for name in PROC_MASKED_DIRS {
        let path = format!("/proc/{name}");
        if !Path::new(&path).is_dir() {
            continue;
        }
        let masked = mount(
            Some("tmpfs"),
            path.as_str(),
            Some("tmpfs"),
            MsFlags::MS_RDONLY | hardened,
            none,
        );
        skip_missing(&path, masked)?;
    }
    Ok(())
}

/// Drops every capability from every set (the bounding set included), locks securebits
/// so that no exec can bring one back, and sets `no_new_privs` (bubblewrap already did;
/// this does not depend on it).
fn drop_privileges() -> Result<()> {
    let check = |what: &str, ret: libc::c_long| {
        if ret < 0 {
            Err(Error::io(what.to_string(), io::Error::last_os_error()))
        } else {
            Ok(())
        }
    };
    // SAFETY (whole block): plain system calls on integers and stack values.
    unsafe {
        check(
            "locking securebits",
            libc::prctl(libc::PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0).into(),
        )?;
        // Capability numbers are dense: the first EINVAL is past the kernel's last.
        for cap in 0..=LAST_CAP_TRIED {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                    break;
                }
                check("emptying the bounding set", -1)?;
            }
        }
        check(
            "clearing ambient capabilities",
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
            .into(),
        )?;
        let header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let none = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        check(
            "dropping capabilities",
            libc::syscall(libc::SYS_capset, &header, none.as_ptr()),
        )?;
        check(
            "setting no_new_privs",
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into(),
        )?;
    }
    Ok(())
}
