//! The host side of starting a sandbox: the seccomp program's descriptor and the
//! pre-exec hook that puts bubblewrap in the scope's control group, sets its rlimits,
//! the jobs' umask, a fresh session keyring and (for the project shell) the OOM
//! killer's exemption, and hands it the seccomp descriptor.
//!
//! The hook runs between fork and exec in a multi-threaded daemon, so it only makes
//! system calls on values prepared before the fork (no allocation, no locks).

#![allow(unsafe_code)]

use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use crate::error::{Context, Result};
use crate::limits::Limits;
use crate::seccomp;

/// A container init's OOM score: above the shell's (-1000, or 0 without
/// `CAP_SYS_RESOURCE`), below the jobs' [`JOB_OOM_SCORE_ADJ`]. Where the daemon holds
/// `CAP_SYS_RESOURCE` its admission write makes it also the floor the container's jobs
/// inherit (an unprivileged process may lower its score only down to that floor).
pub const CONTAINER_OOM_SCORE_ADJ: i32 = 500;
/// What a container init gives each job (it raises itself for the spawn, then returns
/// to [`CONTAINER_OOM_SCORE_ADJ`]): the top score, so a job using memory is always the
/// victim before its init or the shell.
pub const JOB_OOM_SCORE_ADJ: i32 = 1000;

/// Jobs create files readable by others (0644/0755), like a login shell; the daemon's
/// own files stay owner-only under its 077 umask.
pub const JOB_UMASK: libc::mode_t = 0o022;

/// The seccomp program in a sealed-by-convention memory file, close-on-exec until the
/// hook clears that flag in the child that becomes bubblewrap.
pub struct SeccompFd(OwnedFd);

impl SeccompFd {
    pub fn new() -> Result<SeccompFd> {
        let bytes = seccomp::program_bytes()?;
        let fd =
            nix::sys::memfd::memfd_create(c"marsh-seccomp", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .context(|| "creating the seccomp program file".to_string())?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&bytes)
            .context(|| "writing the seccomp program".to_string())?;
        Ok(SeccompFd(file.into()))
    }

    /// A fresh descriptor on the program, positioned at its start (bubblewrap reads the
    /// descriptor to its end, so each sandbox needs its own offset).
    pub fn reopen(&self) -> Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.0.as_raw_fd());
        let file =
            std::fs::File::open(&path).context(|| "reopening the seccomp program".to_string())?;
        Ok(file.into())
    }
}

/// Installs the pre-exec hook on a sandbox command (bubblewrap, or an unconfined
/// process, which has no seccomp program). `inherited` (bubblewrap's seccomp program
/// and bound files) are close-on-exec here and inherited by this child only; they must
/// stay open until the command has been spawned.
///
/// `oom_exempt` (the project shell): bubblewrap, the agent and (until they raise
/// themselves) container inits start with `oom_score_adj` -1000, so an out-of-memory
/// kill in the scope never takes the shell. That needs `CAP_SYS_RESOURCE`: a server
/// that is not root, or root without it (some containers drop it), keeps the default 0,
/// and the write's failure is ignored; jobs still run at [`JOB_OOM_SCORE_ADJ`] and
/// container inits at [`CONTAINER_OOM_SCORE_ADJ`], so a job using memory is always the
/// likelier victim.
pub fn prepare(cmd: &mut Command, inherited: Vec<RawFd>, limits: &Limits, oom_exempt: bool) {
    let procs: Vec<RawFd> = limits.procs_fds();
    let data = limits.data_limit();
    let hook = move || -> io::Result<()> {
        // SAFETY (whole hook): only async-signal-safe system calls on integers and
        // buffers that were allocated before the fork.
        unsafe {
            libc::umask(JOB_UMASK);
            if oom_exempt {
                let fd = libc::open(
                    c"/proc/self/oom_score_adj".as_ptr(),
                    libc::O_WRONLY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    libc::write(fd, b"-1000".as_ptr().cast(), 5);
                    libc::close(fd);
                }
            }
            // A fresh anonymous session keyring: the one inherited from the server's
            // login would otherwise be readable by jobs (they run as its uid). The
            // filter then refuses every keyring call inside the sandbox.
            if libc::syscall(libc::SYS_keyctl, libc::KEYCTL_JOIN_SESSION_KEYRING, 0) < 0
                && io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
            {
                return Err(io::Error::last_os_error());
            }
            for fd in &procs {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(bytes) = data {
                let limit = libc::rlimit {
                    rlim_cur: bytes,
                    rlim_max: bytes,
                };
                if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for fd in &inherited {
                if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    };
    // SAFETY: the hook above is async-signal-safe.
    unsafe {
        cmd.pre_exec(hook);
    }
}
