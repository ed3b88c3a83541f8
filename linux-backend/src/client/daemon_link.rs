//! Reaching the home's daemon from `marsh`: probing, authenticated requests, and
//! booting a daemon when none answers (one booter at a time, via `daemon/boot.lock`).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{Context, Error, Result};
use crate::home::Home;
use crate::inject::{self, Verb};
use crate::proto::{self, Op, PROTO_VERSION, Reply, Request};
use crate::publication;
use crate::seqpacket::SeqPacket;
use crate::{token, util};

/// How long a booting daemon may take to answer.
const BOOT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a `marsh` waits for another one to finish booting.
const BOOT_LOCK_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on answers to quick requests (ping, status).
const QUICK_TIMEOUT: Duration = Duration::from_secs(5);
/// Rotate the daemon log beyond this size at boot.
const LOG_ROTATE_BYTES: u64 = 1 << 20;
/// Variables a booted daemon inherits from `marsh`; everything else is dropped (its
/// settings come from `backend.json`, see `config`). The last two locate the
/// publication control directory and the stand-in sbx's state; `MARSH_SBX` is passed
/// resolved (see `spawn_daemon`), never as given.
const DAEMON_ENV: [&str; 7] = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "MARSH_CONTROL_HOME",
    "SBX_SHIM_STATE",
];

/// An authenticated connection with one request sent on it.
pub struct Link {
    pub sock: SeqPacket,
    pub token: String,
}

impl Link {
    /// Waits for the daemon's reply; an error reply becomes the error it reports.
    pub fn reply(&self) -> Result<Reply> {
        match proto::recv::<Reply>(&self.sock)? {
            Some((Reply::Error { class, message }, _)) => Err(Reply::into_error(class, message)),
            Some((reply, _)) => Ok(reply),
            None => Err(Error::failed(
                "the daemon closed the connection without answering",
            )),
        }
    }
}

/// Connects and sends `op` with `fds` attached; `Ok(None)` when no daemon answers.
pub fn send(home: &Home, op: Op, fds: &[BorrowedFd<'_>]) -> Result<Option<Link>> {
    let sock = match SeqPacket::connect(&home.socket_path()) {
        Ok(sock) => sock,
        Err(Error::Io { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // The token goes only to a peer running as this user (the daemon directory is
    // owner-only as well, but the kernel's word is checked before trusting a path).
    let peer = sock.peer_uid()?;
    if peer != util::euid() {
        return Err(Error::failed(format!(
            "{} is served by uid {peer}, not by this user; refusing to authenticate",
            home.socket_path().display()
        )));
    }
    let token = token::read(home)?;
    let request = Request {
        proto: PROTO_VERSION,
        token: token.clone(),
        op,
    };
    proto::send(&sock, &request, fds)?;
    Ok(Some(Link { sock, token }))
}

/// Sends `op` and waits (bounded) for the reply; `Ok(None)` when no daemon answers.
pub fn quick(home: &Home, op: Op) -> Result<Option<Reply>> {
    match send(home, op, &[])? {
        None => Ok(None),
        Some(link) => {
            link.sock.set_recv_timeout(Some(QUICK_TIMEOUT))?;
            link.reply().map(Some)
        }
    }
}

/// The pid of the answering daemon, if one answers.
pub fn ping(home: &Home) -> Option<u32> {
    match quick(home, Op::Ping) {
        Ok(Some(Reply::Pong { pid, .. })) => Some(pid),
        _ => None,
    }
}

/// True while some process holds the daemon lock (a daemon is alive, maybe hung).
pub fn daemon_lock_held(home: &Home) -> bool {
    match File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(home.daemon_lock_path())
    {
        Ok(file) => file.try_lock_shared().is_err(),
        Err(_) => false,
    }
}

/// The pid recorded in `daemon/pid`.
pub fn recorded_pid(home: &Home) -> Option<u32> {
    let bytes = util::read_bounded(&home.pid_path(), 32).ok()?;
    String::from_utf8_lossy(&bytes).trim().parse().ok()
}

/// Makes sure a daemon for `home` answers, booting one bound to `workspace` if not.
pub fn ensure_daemon(home: &Home, workspace: &Path, env: &[(OsString, OsString)]) -> Result<()> {
    if ping(home).is_some() {
        return Ok(());
    }
    util::ensure_private_dir(&home.daemon_dir())?;
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(home.boot_lock_path())
        .context(|| format!("opening {}", home.boot_lock_path().display()))?;
    let deadline = Instant::now() + BOOT_LOCK_TIMEOUT;
    while lock.try_lock().is_err() {
        if Instant::now() >= deadline {
            return Err(Error::failed(
                "timed out waiting for another marsh to boot the daemon",
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Another marsh may have booted it while we waited for the lock.
    if ping(home).is_some() {
        return Ok(());
    }
    inject::check(home, Verb::Boot)?;
    if daemon_lock_held(home) && wait_for_booting(home)? {
        return Ok(());
    }
    let child = spawn_daemon(home, workspace, env)?;
    wait_for_answer(home, child)
}

fn spawn_daemon(
    home: &Home,
    workspace: &Path,
    env: &[(OsString, OsString)],
) -> Result<std::process::Child> {
    let (marshd, marshd_name) = marshd_program(env)?;
    let log_path = home.log_path();
    if fs::metadata(&log_path)
        .map(|m| m.len() > LOG_ROTATE_BYTES)
        .unwrap_or(false)
    {
        let _ = fs::rename(&log_path, home.daemon_dir().join("marshd.log.1"));
    }
    let log = File::options()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log_path)
        .context(|| format!("opening {}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .context(|| "duplicating the log descriptor".to_string())?;
    // marsh-mcp names its pinned sbx by a descriptor only this process holds: the
    // daemon gets the file's path. An unresolvable sbx is left out (publication then
    // reports it); it never stops a boot.
    let sbx_var = env
        .iter()
        .find(|(k, _)| k == publication::SBX_VAR)
        .map(|(_, v)| v.as_os_str());
    let sbx = publication::resolve_sbx(sbx_var).ok();
    let mut cmd = Command::new(&marshd);
    cmd.arg0(&marshd_name)
        .arg("serve")
        .arg("--home")
        .arg(home.root())
        .arg("--workspace")
        .arg(workspace)
        .env_clear()
        .envs(
            env.iter()
                .filter(|(k, _)| DAEMON_ENV.iter().any(|d| k == d))
                .cloned(),
        )
        .envs(sbx.map(|path| (publication::SBX_VAR, path)))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err));
    cmd.spawn()
        .context(|| format!("starting {}", marshd_name.display()))
}

/// The variable naming a descriptor of the `marshd` to run, open in this process.
pub const MARSHD_FD_VAR: &str = "MARSH_MARSHD_FD";

/// The marshd to start and its name (for `argv[0]`): the descriptor a caller verified
/// and handed down in `MARSH_MARSHD_FD` (marsh-mcp does), executed through
/// `/proc/self/fd` so a file renamed over the installed one since never runs; else the
/// sibling of this `marsh`.
fn marshd_program(env: &[(OsString, OsString)]) -> Result<(PathBuf, PathBuf)> {
    let Some((_, value)) = env.iter().find(|(k, _)| k == MARSHD_FD_VAR) else {
        let path = sibling("marshd")?;
        return Ok((path.clone(), path));
    };
    let fd: u32 = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| Error::failed(format!("{MARSHD_FD_VAR} is not a descriptor number")))?;
    let exec = PathBuf::from(format!("/proc/self/fd/{fd}"));
    let meta = fs::metadata(&exec)
        .context(|| format!("{MARSHD_FD_VAR} names no open descriptor ({fd})"))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(Error::failed(format!(
            "{MARSHD_FD_VAR} ({fd}) is not an executable file"
        )));
    }
    let name = fs::read_link(&exec).unwrap_or_else(|_| PathBuf::from("marshd"));
    Ok((exec, name))
}

/// Polls until the daemon answers; fails early when the spawned daemon exits.
/// A daemon process exists but does not answer (yet): gives it the boot window. `false`
/// when it went away meanwhile (killed while booting): the caller, holding the boot
/// lock, boots one itself instead of waiting out the window for a process that is gone.
fn wait_for_booting(home: &Home) -> Result<bool> {
    poll_boot(home, || {
        (!daemon_lock_held(home)).then(|| Ok(ping(home).is_some()))
    })
}

/// Waits for the daemon this marsh spawned; its early exit is the boot's failure.
fn wait_for_answer(home: &Home, mut child: std::process::Child) -> Result<()> {
    let answered = poll_boot(home, || {
        let status = child.try_wait().ok().flatten()?;
        let reason =
            last_daemon_error(home).unwrap_or_else(|| format!("marshd exited with {status}"));
        Some(Err(Error::failed(format!(
            "the daemon failed to start: {reason}"
        ))))
    });
    if answered.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
    answered.map(drop)
}

/// Polls until the daemon answers (`true`), `settled` has an outcome (the booting
/// process is gone), or the boot window ends (an error naming the log).
fn poll_boot(home: &Home, mut settled: impl FnMut() -> Option<Result<bool>>) -> Result<bool> {
    let deadline = Instant::now() + BOOT_TIMEOUT;
    let mut pause = Duration::from_millis(2);
    loop {
        if ping(home).is_some() {
            return Ok(true);
        }
        if let Some(outcome) = settled() {
            return outcome;
        }
        if Instant::now() >= deadline {
            return Err(Error::failed(format!(
                "the daemon did not answer within {} s (see {})",
                BOOT_TIMEOUT.as_secs(),
                home.log_path().display()
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// The last `marshd: ` line of the daemon log (its fatal error, after a failed boot).
fn last_daemon_error(home: &Home) -> Option<String> {
    let mut file = File::open(home.log_path()).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(8192))).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    String::from_utf8_lossy(&tail)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("marshd: "))
        .map(|l| {
            l.strip_prefix("backend unavailable: ")
                .unwrap_or(l)
                .to_string()
        })
}

/// A binary installed beside the running `marsh`.
pub fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context(|| "locating the marsh executable".to_string())?;
    let path = exe
        .parent()
        .map(|dir| dir.join(name))
        .ok_or_else(|| Error::failed("the marsh executable has no directory"))?;
    if !path.is_file() {
        return Err(Error::failed(format!(
            "{name} is not installed beside marsh ({})",
            path.display()
        )));
    }
    Ok(path)
}
