//! Small helpers shared by the binaries: time, locks, durable files, process probes.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Context, Error, Result};

/// Writes one line to stderr, ignoring failure: diagnostics must never abort the
/// process (`eprintln!` panics when stderr is gone).
pub fn write_stderr(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}

/// `log!("...", args)`: one diagnostic line on stderr (the daemon log for `marshd`).
macro_rules! log {
    ($($arg:tt)*) => {
        $crate::util::write_stderr(format_args!($($arg)*))
    };
}
pub(crate) use log;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
/// Marks every descriptor from 3 up close-on-exec, so nothing a caller left open (such
/// as the pinned descriptors marsh-mcp hands to `marsh`) reaches a daemon or a sandbox.
/// A kernel without `close_range` (before 5.11) is left as is.
#[allow(unsafe_code)]
pub fn seal_inherited_descriptors() {
    // SAFETY: `close_range` with `CLOSE_RANGE_CLOEXEC` only changes descriptor flags.
    let _ = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it: every
/// critical section in this crate leaves the guarded state consistent at each step.
#[allow(clippy::disallowed_methods)]
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Effective uid of this process.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// `n` bytes from the kernel CSPRNG, lowercase hex.
pub fn random_hex(n: usize) -> Result<String> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| Error::failed(format!("drawing random bytes: {e}")))?;
    Ok(hex::encode(buf))
}

/// Writes `bytes` to `dir/name` so that a reader sees either the old file or the
/// complete new one, and the new one survives a crash (power loss included) once this
/// returns: [`write_whole`], then a sync of the directory.
pub fn write_durable(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    write_whole(dir, name, bytes)?;
    sync_dir(dir).context(|| format!("syncing {}", dir.display()))
}

/// Writes `bytes` to `dir/name` so that, whatever crash interrupts it, a reader sees
/// either no file or the complete one, with ONE synchronous flush: temp file (0600,
/// exclusive create) + `fdatasync` + rename. The directory is not synced here: after a
/// power loss the newest renames may be missing (never partial) until the caller's
/// next directory sync ([`sync_dir`]). Receipts use it (the daemon syncs the results
/// directory in the background); [`write_durable`] is for files that must survive a
/// power loss the moment it returns.
pub fn write_whole(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", random_hex(6)?));
    let target = dir.join(name);
    let result = (|| -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        file.write_all(bytes)?;
        // The data reaches the disk before the name does: a rename that survives a
        // crash never names a file with missing contents.
        file.sync_data()?;
        fs::rename(&tmp, &target)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.context(|| format!("writing {}", target.display()))
}

/// Flushes a directory's entries (the renames [`write_whole`] left unsynced).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Reads at most `limit` bytes of a regular file without following a final symlink.
pub fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut buf = Vec::new();
    file.take(limit).read_to_end(&mut buf)?;
    Ok(buf)
}

/// True while `pid` names a process that has not yet exited (zombies count as gone).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state field follows the parenthesised command, which may contain spaces.
        Ok(stat) => match stat.rfind(')') {
            Some(end) => !matches!(stat[end + 1..].trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        Err(_) => false,
    }
}

/// The pid of a spawned child (which leads its own process group when spawned with
/// `process_group(0)`).
pub fn child_pid(child: &std::process::Child) -> nix::unistd::Pid {
    // Linux pids fit in i32 (pid_max <= 2^22).
    nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
}

/// SIGKILLs every process in the process group `pgid`. ESRCH (group already empty)
/// is not an error worth reporting.
pub fn kill_group(pgid: nix::unistd::Pid) {
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
}

/// SIGKILLs a sandbox started as `pid` (bubblewrap, leading its own process group):
/// first its direct children, then the whole group. bubblewrap's in-sandbox init may
/// already have moved to a session of its own (`--new-session`), out of the group's
/// reach; it is pid 1 of the sandbox's pid namespace, so its death ends everything in
/// the sandbox even if bubblewrap's parent-death signal was not armed yet. The caller
/// must not have reaped `pid`, so the children listed are still its own.
pub fn kill_container(pid: nix::unistd::Pid) {
    let children = format!("/proc/{pid}/task/{pid}/children");
    if let Ok(text) = fs::read_to_string(children) {
        for child in text
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    kill_group(pid);
}

/// Blocks until the child `pid` has exited, without reaping it: the zombie keeps its
/// pid and process group id reserved until the caller reaps it, so signalling the
/// group in between can never hit a recycled id.
pub fn wait_exit_unreaped(pid: nix::unistd::Pid) {
    use nix::sys::wait::{Id, WaitPidFlag, waitid};
    while let Err(nix::errno::Errno::EINTR) =
        waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
    {}
}

/// Creates `path` as an owner-only directory if missing, and verifies that it is a
/// real directory (not a symlink) owned by the effective uid; tightens its mode to 0700.
pub fn ensure_private_dir(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(path)
                .or_else(|e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })
                .context(|| format!("creating {}", path.display()))?;
        }
        Err(e) => return Err(Error::io(format!("inspecting {}", path.display()), e)),
    }
    let meta = fs::symlink_metadata(path).context(|| format!("inspecting {}", path.display()))?;
    if !meta.file_type().is_dir() {
        return Err(Error::failed(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    if meta.uid() != euid() {
        return Err(Error::failed(format!(
            "{} is owned by uid {}, not by this user",
            path.display(),
            meta.uid()
        )));
    }
    if meta.mode() & 0o777 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))
            .context(|| format!("restricting {}", path.display()))?;
    }
    Ok(())
}

/// Quotes one word for a POSIX shell when it needs quoting (used for receipt text).
pub fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn durable_write_replaces_atomically() {
        let dir = tempfile::tempdir().unwrap();
        write_durable(dir.path(), "a.json", b"one").unwrap();
        write_durable(dir.path(), "a.json", b"two").unwrap();
        assert_eq!(fs::read(dir.path().join("a.json")).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temp file is left behind");
        let mode = fs::metadata(dir.path().join("a.json")).unwrap().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn private_dir_is_created_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d");
        ensure_private_dir(&p).unwrap();
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o777, 0o700);
        std::os::unix::fs::symlink(&p, dir.path().join("l")).unwrap();
        assert!(ensure_private_dir(&dir.path().join("l")).is_err());
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc"), "abc");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn own_process_is_alive() {
        assert!(process_alive(std::process::id()));
    }

    #[test]
    fn random_hex_is_lowercase_hex_of_twice_the_length() {
        let a = random_hex(32).unwrap();
        assert_eq!(a.len(), 64);
        assert!(
            a.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{a}"
        );
        assert_ne!(a, random_hex(32).unwrap());
        assert_eq!(random_hex(0).unwrap(), "");
    }
}
