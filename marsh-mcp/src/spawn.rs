//! How marsh-mcp starts a process: one `clone(CLONE_VM | CLONE_VFORK)` per child, the
//! way `posix_spawn` does it, plus the two things `posix_spawn` cannot do — the
//! parent-death signal and handing over descriptors that are close-on-exec here.
//!
//! Invariants:
//! - the child's environment is exactly [`ChildCommand::env`]'s: nothing of
//!   marsh-mcp's own environment passes implicitly;
//! - the child leads its own process group, has `/dev/null` or a pipe on stdin and
//!   pipes on stdout and stderr, and carries `PR_SET_PDEATHSIG(SIGKILL)` tied to the
//!   spawning thread (a parent that died before the `prctl` fails the spawn);
//! - of marsh-mcp's descriptors, the child keeps only 0-2 and those named by
//!   [`ChildCommand::inherit_fd`]; every other one is close-on-exec here;
//! - it starts with no blocked signal, default dispositions for every signal that has
//!   a handler here, and SIGPIPE at its default (marsh-mcp ignores it);
//! - between `clone` and `execve` the child only makes system calls on memory
//!   prepared before the clone: no allocation, no lock, no unwinding. The parent
//!   thread is suspended until the child has exec'd or exited, and has every signal
//!   blocked meanwhile, so no handler of ours runs on the child's stack (a mapping of
//!   its own with a guard page below: an overflow kills the child, it cannot reach the
//!   server's memory);
//! - a [`ChildProcess`] dropped unreaped is SIGKILLed and reaped on a thread of its
//!   own: no zombie outlives it.
//!
//! Rejected alternatives: `std`/`tokio` `Command` forks whenever a `pre_exec` hook or a
//! working directory is set (a static glibc has no `posix_spawn_file_actions_addchdir_np`
//! for std to find), and copying then tearing down marsh-mcp's page tables cost
//! 0.3-0.5 ms of every `shell_run` (interleaved A/B, p50 4.19 -> 3.65 ms); `posix_spawn`
//! itself has no parent-death signal.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sched::CloneFlags;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, pipe2};
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The stack the child runs on until `execve`: its code path is a handful of system
/// calls with no recursion, far below this. A guard page below it makes an overflow a
/// SIGSEGV of the child, never a write into the server's memory.
const CHILD_STACK_BYTES: usize = 64 * 1024;
const GUARD_BYTES: usize = 4096;
/// Polling bounds for a kernel without `pidfd_open` (before Linux 5.3).
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(50);
/// Highest signal number + 1 on Linux.
const SIGNAL_LIMIT: libc::c_int = 65;

/// A process to start: program, arguments, the whole environment, a working directory
/// and the descriptors it keeps.
#[derive(Debug, Clone)]
pub(crate) struct ChildCommand {
    program: PathBuf,
    arg0: Option<OsString>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    cwd: Option<PathBuf>,
    inherit: Vec<RawFd>,
}

/// What the child reads on stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StdinKind {
    Null,
    Piped,
}

impl ChildCommand {
    /// `program` must be absolute: it is never searched for, nor resolved against the
    /// child's working directory.
    pub(crate) fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            arg0: None,
            args: Vec::new(),
            env: Vec::new(),
            cwd: None,
            inherit: Vec::new(),
        }
    }

    /// What the child sees as `argv[0]` (the program path by default).
    pub(crate) fn arg0(&mut self, arg0: impl AsRef<OsStr>) -> &mut Self {
        self.arg0 = Some(arg0.as_ref().to_owned());
        self
    }

    pub(crate) fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets one variable; a later value for the same name replaces the earlier one.
    pub(crate) fn env(&mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> &mut Self {
        let key = key.as_ref();
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.as_ref().to_owned()));
        self
    }

    pub(crate) fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    pub(crate) fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.cwd = Some(dir.as_ref().to_owned());
        self
    }

    /// Lets the child keep `fd` (close-on-exec here, so no other child receives it).
    /// It must not be 0, 1 or 2, which the child's stdio replaces.
    pub(crate) fn inherit_fd(&mut self, fd: RawFd) -> &mut Self {
        self.inherit.push(fd);
        self
    }

    /// Starts the child. Must be called inside the tokio runtime (its pipes and pidfd
    /// register with the reactor) and, for the parent-death signal to mean "marsh-mcp
    /// died", from a thread that lives as long as the process: a runtime worker or a
    /// `block_on` caller.
    pub(crate) fn spawn(&self, stdin: StdinKind) -> io::Result<Spawned> {
        // Checked first: registering the pidfd outside a runtime would panic with the
        // child already running and owned by nobody.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other(
                "a child can only be started inside the async runtime",
            ));
        }
        if !self.program.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not an absolute path", self.program.display()),
            ));
        }
        if let Some(&fd) = self.inherit.iter().find(|&&fd| fd <= 2) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("descriptor {fd} cannot be inherited: stdio replaces it"),
            ));
        }
        let (stdin_child, stdin_ours) = match stdin {
            StdinKind::Null => (
                nix::fcntl::open(
                    "/dev/null",
                    OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )?,
                None,
            ),
            StdinKind::Piped => {
                let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
                (read, Some(write))
            }
        };
        let (stdout_ours, stdout_child) = pipe2(OFlag::O_CLOEXEC)?;
        let (stderr_ours, stderr_child) = pipe2(OFlag::O_CLOEXEC)?;
        let stdio = [
            above_stdio(stdin_child)?,
            above_stdio(stdout_child)?,
            above_stdio(stderr_child)?,
        ];
        // The plan (and with it the child's ends) is dropped once the child exec'd.
        let pid = ExecPlan::new(self, stdio)?.run()?;
        let child = ChildProcess::adopt(pid);
        Ok(Spawned {
            child,
            stdin: stdin_ours.map(pipe::Sender::from_owned_fd).transpose()?,
            stdout: pipe::Receiver::from_owned_fd(stdout_ours)?,
            stderr: pipe::Receiver::from_owned_fd(stderr_ours)?,
        })
    }
}

/// A started child and our ends of its pipes.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub child: ChildProcess,
    pub stdin: Option<pipe::Sender>,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
}

/// Moves `fd` to a number above 2 (close-on-exec), so that placing the child's stdio
/// with `dup2` never overwrites a source still to be placed.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    let moved = fcntl(&fd, FcntlArg::F_DUPFD_CLOEXEC(3))?;
    // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor that nothing else owns.
    #[allow(unsafe_code)]
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// Everything the child touches between `clone` and `execve`, built before the clone.
struct ExecPlan {
    program: CString,
    /// Keep the strings alive: `argv`/`envp` point into them.
    _strings: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    cwd: Option<CString>,
    /// Sources for the child's 0, 1, 2: all above 2 and close-on-exec, closed here
    /// when the plan is dropped.
    stdio: [OwnedFd; 3],
    inherit: Vec<RawFd>,
    parent: libc::pid_t,
    /// The child's errno when it failed before `execve` (0: it exec'd).
    failure: AtomicI32,
}

fn c_string(bytes: &[u8], what: &str) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        )
    })
}

impl ExecPlan {
    fn new(cmd: &ChildCommand, stdio: [OwnedFd; 3]) -> io::Result<Self> {
        let program = c_string(cmd.program.as_os_str().as_bytes(), "the program path")?;
        let mut strings = Vec::with_capacity(1 + cmd.args.len() + cmd.env.len());
        let arg0 = cmd.arg0.as_deref().unwrap_or(cmd.program.as_os_str());
        strings.push(c_string(arg0.as_bytes(), "argv[0]")?);
        for arg in &cmd.args {
            strings.push(c_string(arg.as_bytes(), "an argument")?);
        }
        let argc = strings.len();
        for (k, v) in &cmd.env {
            let mut pair = k.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(v.as_bytes());
            strings.push(c_string(&pair, "an environment variable")?);
        }
        let pointers = |strings: &[CString]| -> Vec<*const libc::c_char> {
            strings
                .iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect()
        };
        let cwd = match &cmd.cwd {
            Some(dir) => Some(c_string(
                dir.as_os_str().as_bytes(),
                "the working directory",
            )?),
            None => None,
        };
        Ok(Self {
            program,
            argv: pointers(&strings[..argc]),
            envp: pointers(&strings[argc..]),
            _strings: strings,
            cwd,
            stdio,
            inherit: cmd.inherit.clone(),
            parent: std::process::id() as libc::pid_t,
            failure: AtomicI32::new(0),
        })
    }

    /// Clones, lets the child exec, and returns its pid once it has (or the child's
    /// errno, after reaping it).
    fn run(self) -> io::Result<Pid> {
        let mut stack = ChildStack::map()?;
        let mut blocked = SigSet::empty();
        let all = SigSet::all();
        let cloned = {
            // Every signal stays blocked in this thread until the child has exec'd: no
            // handler may run on memory the child shares.
            pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&all), Some(&mut blocked))?;
            let plan = &self;
            // SAFETY: CLONE_VM | CLONE_VFORK suspends this thread until the child calls
            // `execve` or `_exit`; the child runs `child_main` on `stack`, which only
            // makes system calls on `plan`, prepared above and alive until we resume.
            #[allow(unsafe_code)]
            let cloned = unsafe {
                nix::sched::clone(
                    Box::new(move || child_main(plan)),
                    stack.usable(),
                    CloneFlags::CLONE_VM | CloneFlags::CLONE_VFORK,
                    Some(libc::SIGCHLD),
                )
            };
            let restored = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&blocked), None);
            let cloned = cloned?;
            if let Err(e) = restored {
                // Not reachable with a valid mask; never leave a child nobody tracks.
                let _ = kill(cloned, Signal::SIGKILL);
                let _ = waitpid(cloned, None);
                return Err(e.into());
            }
            cloned
        };
        match self.failure.load(Ordering::Acquire) {
            0 => Ok(cloned),
            errno => {
                // The child is exiting: its exit is certain and immediate.
                let _ = waitpid(cloned, None);
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }
}

/// An anonymous mapping for the child's stack with a `PROT_NONE` guard page at its low
/// end (stacks grow down), unmapped on drop.
struct ChildStack {
    base: *mut libc::c_void,
}

impl ChildStack {
    const LEN: usize = GUARD_BYTES + CHILD_STACK_BYTES;

    fn map() -> io::Result<Self> {
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        #[allow(unsafe_code)]
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self { base };
        // SAFETY: the first page of the mapping made above.
        #[allow(unsafe_code)]
        if unsafe { libc::mprotect(base, GUARD_BYTES, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The writable part, above the guard page.
    fn usable(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is LEN bytes long and lives as long as `self`; the range
        // starts past the guard page and is readable and writable.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.cast::<u8>().add(GUARD_BYTES),
                CHILD_STACK_BYTES,
            )
        }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; no slice of it outlives `self`.
        #[allow(unsafe_code)]
        unsafe {
            libc::munmap(self.base, Self::LEN);
        }
    }
}

/// The child, between `clone` and `execve`. Async-signal-safe: raw system calls on
/// `plan` only; any failure records errno and `_exit`s.
#[allow(unsafe_code)]
fn child_main(plan: &ExecPlan) -> isize {
    let fail = |plan: &ExecPlan| -> isize {
        plan.failure
            .store(Errno::last_raw().max(1), Ordering::Release);
        // SAFETY: `_exit` ends the child without running anything of the parent's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY (whole block): each call is a plain system call wrapper on integers or on
    // pointers into `plan`, whose strings are NUL-terminated and whose pointer arrays
    // end with a null pointer.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return fail(plan);
        }
        if libc::getppid() != plan.parent {
            Errno::set_raw(libc::ESRCH);
            return fail(plan);
        }
        if libc::setpgid(0, 0) != 0 {
            return fail(plan);
        }
        for (target, source) in plan.stdio.iter().enumerate() {
            if libc::dup2(source.as_raw_fd(), target as libc::c_int) < 0 {
                return fail(plan);
            }
        }
        for &fd in &plan.inherit {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return fail(plan);
            }
        }
        if let Some(cwd) = &plan.cwd
            && libc::chdir(cwd.as_ptr()) != 0
        {
            return fail(plan);
        }
        // Handlers of ours must not run in the child, and SIGPIPE (ignored here) is
        // the child's own business again. The signal table is the child's own copy
        // (no CLONE_SIGHAND).
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..SIGNAL_LIMIT {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue; // glibc's reserved signals
            }
            let handled =
                current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN;
            if handled || signal == libc::SIGPIPE {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
            return fail(plan);
        }
        libc::execve(
            plan.program.as_ptr(),
            plan.argv.as_ptr(),
            plan.envp.as_ptr(),
        );
    }
    fail(plan)
}

/// A started child, reaped by [`ChildProcess::wait`]. Until it is reaped its pid
/// cannot be reused, so signalling it by pid is safe.
#[derive(Debug)]
pub(crate) struct ChildProcess {
    pid: Pid,
    /// Readable once the child has exited; `None` on kernels without `pidfd_open`,
    /// where [`ChildProcess::wait`] polls instead.
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl ChildProcess {
    fn adopt(pid: Pid) -> Self {
        Self {
            pid,
            pidfd: open_pidfd(pid),
            status: None,
        }
    }

    /// A child waited for by polling, as on kernels without `pidfd_open`.
    #[cfg(test)]
    fn without_pidfd(mut self) -> Self {
        self.pidfd = None;
        self
    }

    pub(crate) fn id(&self) -> Pid {
        self.pid
    }

    /// Waits for the child's end and reaps it. Cancel-safe: a status is recorded in
    /// the same poll that reaps it.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = reap(self.pid, self.pidfd.as_ref()).await?;
        self.status = Some(status);
        self.pidfd = None;
        Ok(status)
    }

    /// The child's status if it has ended (reaping it), `None` while it runs.
    pub(crate) fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = reap_now(self.pid)?;
        }
        Ok(self.status)
    }

    /// SIGKILL to the child (not its group), unless it was already reaped.
    pub(crate) fn start_kill(&mut self) -> io::Result<()> {
        if self.status.is_none() {
            kill(self.pid, Signal::SIGKILL)?;
        }
        Ok(())
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let _ = kill(self.pid, Signal::SIGKILL);
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        // SIGKILLed but not yet gone. A blocking reap on a thread of its own, not a
        // runtime task: a runtime shutting down drops its tasks unrun.
        let pid = self.pid;
        let reaper = std::thread::Builder::new()
            .name("marsh-mcp-reap".into())
            .spawn(move || waitpid(pid, None));
        if let Err(e) = reaper {
            tracing::warn!("cannot reap child {pid}: {e}");
        }
    }
}

/// Waits until `pid` (our unreaped child) has ended and reaps it: on `pidfd`
/// readiness, or by polling without one.
async fn reap(pid: Pid, pidfd: Option<&AsyncFd<OwnedFd>>) -> io::Result<ExitStatus> {
    let mut pause = POLL_FIRST;
    loop {
        if let Some(status) = reap_now(pid)? {
            return Ok(status);
        }
        match pidfd {
            Some(pidfd) => pidfd.readable().await?.clear_ready(),
            None => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(POLL_MAX);
            }
        }
    }
}

/// `pid`'s status if it has ended (reaping it), `None` while it runs.
fn reap_now(pid: Pid) -> io::Result<Option<ExitStatus>> {
    Ok(match waitpid(pid, Some(WaitPidFlag::WNOHANG))? {
        WaitStatus::Exited(_, code) => Some(ExitStatus::from_raw((code & 0xff) << 8)),
        WaitStatus::Signaled(_, signal, core) => Some(ExitStatus::from_raw(
            signal as i32 | if core { 0x80 } else { 0 },
        )),
        _ => None,
    })
}

fn open_pidfd(pid: Pid) -> Option<AsyncFd<OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    #[allow(unsafe_code)]
    // (A pidfd is always close-on-exec; the only flag is PIDFD_NONBLOCK, not needed.)
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor returned by the kernel, owned by nothing else.
    #[allow(unsafe_code)]
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: the AsyncFd owns `fd` for its whole life, so the number it registers
    // stays open and names the same pidfd until it is dropped.
    #[allow(unsafe_code)]
    let registered = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
    registered.ok()
}

#[cfg(test)]
#[path = "spawn_tests.rs"]
mod tests;
