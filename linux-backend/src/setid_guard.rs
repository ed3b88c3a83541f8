//! The set-id guard: no job opens a set-id or file-capability file in the workspace.
//!
//! The attack: the host puts a set-id root file in the workspace (root's `tar x` keeps
//! the bits, a host `make install` sets them). A job of a root server owns it, so it
//! may open it for writing; `write`, `truncate` and `fallocate` make the kernel clear
//! `S_ISUID`/`S_ISGID` and `security.capability`, but a shared writable mapping
//! (`mmap(MAP_SHARED)` + store + `msync`) changes the contents and keeps them all. The
//! next host user who runs the file runs the job's code as root.
//!
//! The mechanism: a fanotify group of class content (permission events, which need
//! `CAP_SYS_ADMIN` in the host's namespaces: a root daemon only) with an
//! `FAN_OPEN_PERM` mark on every mount a job reaches the workspace through: each job
//! container's copy of the workspace mount (and mounts below it), and each kit
//! container's. Their processes' opens through those mounts wait for
//! [`verdict`]: a regular file with `S_ISUID`, `S_ISGID` + group-execute, or a
//! `security.capability` attribute is refused (`EPERM`); anything else is allowed.
//!
//! Why that is complete: every route that changes a file's contents in place needs a
//! descriptor open for writing (`write`, `pwrite`, a writable shared mapping (the kernel
//! refuses `PROT_WRITE` on a shared mapping of a read-only descriptor, `mprotect`
//! included), `fallocate`, `copy_file_range`), and every open passes the mark; the one
//! path-based call, `truncate(2)`, clears the bits and the attribute before it changes
//! the size; `rename` and `link` over the file replace a name, never the set-id inode's
//! contents, and a job cannot make a new set-id file (the seccomp filter refuses the
//! bits; `CAP_SETFCAP` is held by nothing). Reads are refused too: the event does not
//! say how the file is being opened.
//!
//! Limits, stated rather than hidden: the guard needs a root daemon; a server of
//! another uid has none (its jobs can only write such a file if it belongs to that uid
//! or is writable by it: a set-id file of its own uid grants nothing new, a host
//! administrator's file capability on such a file is the residual). A descriptor a job
//! opened *before* the host made the file set-id stays usable (as on any shared
//! directory: the host gave the file's contents to the job first). `status` and
//! `doctor` report which holds.
//!
//! Rejected alternatives: a seccomp rule on `mmap` (cannot tell a set-id file from any
//! other; refusing shared writable file mappings breaks SQLite's WAL and Python's
//! multiprocessing); scanning the workspace for set-id files (misses files made set-id
//! later, and costs a walk per command); a filesystem-wide mark (every host process's
//! opens would wait on this daemon).

#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use nix::fcntl::OFlag;

use crate::admission;
use crate::error::{Context, Error, Result};
use crate::seqpacket::SeqPacket;
use crate::util::log;

/// Most mounts one container may name (the workspace and mounts below it).
pub const MAX_GUARDED_MOUNTS: usize = 64;

/// One daemon's fanotify group; its event thread answers every permission event.
pub struct SetIdGuard {
    group: OwnedFd,
}

impl SetIdGuard {
    /// The guard, when this daemon may have one; its event thread runs until the
    /// daemon exits (closing the group allows whatever is pending).
    pub fn start() -> std::result::Result<Arc<SetIdGuard>, String> {
        let group = new_group()?;
        let events = group
            .try_clone()
            .map_err(|e| format!("duplicating the fanotify group: {e}"))?;
        std::thread::Builder::new()
            .name("setid-guard".into())
            .spawn(move || answer_events(events))
            .map_err(|e| format!("starting the guard thread: {e}"))?;
        Ok(Arc::new(SetIdGuard { group }))
    }

    /// Whether [`SetIdGuard::start`] would succeed here (for `status` without a daemon).
    pub fn available() -> std::result::Result<(), String> {
        new_group().map(drop)
    }

    /// Marks the mount `dir` lies on: from now on every open through it is checked.
    pub fn guard_mount(&self, dir: BorrowedFd<'_>) -> Result<()> {
        // SAFETY: plain system call on descriptors we hold; a null path marks `dir`'s
        // own mount.
        let rc = unsafe {
            libc::fanotify_mark(
                self.group.as_raw_fd(),
                libc::FAN_MARK_ADD | libc::FAN_MARK_MOUNT,
                libc::FAN_OPEN_PERM,
                dir.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(Error::io(
                "marking a workspace mount for the set-id guard",
                io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
}

/// A new fanotify group of class content, or why this daemon cannot have one.
fn new_group() -> std::result::Result<OwnedFd, String> {
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_CONTENT
                | libc::FAN_CLOEXEC
                | libc::FAN_UNLIMITED_QUEUE
                | libc::FAN_UNLIMITED_MARKS,
            // Non-blocking: on kernels that send permission events for FIFOs, the event
            // descriptor of one would otherwise wait for a writer inside this thread's
            // read, and stall every open in the workspace.
            (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_LARGEFILE) as u32,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) => {
                "fanotify permission events need a daemon running as root".to_string()
            }
            Some(libc::EINVAL | libc::ENOSYS) => {
                "this kernel has no fanotify permission events".to_string()
            }
            _ => format!("fanotify_init: {e}"),
        });
    }
    // SAFETY: `fd` was just returned to us and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Descriptors of the mounts a job reaches the workspace through, taken inside its
/// container (whose working directory is the workspace): the workspace's own mount and
/// every mount below it, in this mount namespace.
pub fn workspace_mounts() -> Result<Vec<OwnedFd>> {
    let workspace =
        std::env::current_dir().context(|| "reading the container's workspace".to_string())?;
    let open = |path: &Path| {
        nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| Error::sys(format!("opening the mount {}", path.display()), e))
    };
    let mut fds = vec![open(Path::new("."))?];
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .context(|| "reading the container's mount table".to_string())?;
    for line in table.lines() {
        let Some(point) = line.split(' ').nth(4) else {
            continue;
        };
        let point = unescape_mount_point(point);
        let point = Path::new(OsStr::from_bytes(&point));
        if point != workspace && point.starts_with(&workspace) {
            if fds.len() >= MAX_GUARDED_MOUNTS {
                return Err(Error::failed(format!(
                    "more than {MAX_GUARDED_MOUNTS} mounts lie below the workspace; the set-id guard cannot cover them"
                )));
            }
            fds.push(open(point)?);
        }
    }
    Ok(fds)
}

/// A mount point as `/proc/self/mountinfo` writes it: space, tab, newline and
/// backslash as three-digit octal escapes.
fn unescape_mount_point(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes.get(i + 1..i + 4).filter(|_| bytes[i] == b'\\');
        match escape
            .and_then(|digits| std::str::from_utf8(digits).ok())
            .and_then(|digits| u8::from_str_radix(digits, 8).ok())
        {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// `marshd guard-exec --fd N -- ARGV`: the first program of a kit container. Asks the
/// daemon on fd `N` to guard this container's workspace mounts, closes it, then
/// executes `ARGV` in its place; 126 when the guard fails (no kit runs unguarded), 127
/// when `ARGV` cannot be executed.
pub fn exec_guarded(fd: RawFd, argv: &[std::ffi::OsString]) -> i32 {
    use std::os::unix::process::CommandExt;
    // SAFETY: fcntl only reads the descriptor table entry.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        eprintln!("marshd guard-exec: --fd {fd} is not an open descriptor");
        return 126;
    }
    // SAFETY: the daemon handed this open descriptor over for this purpose; nothing
    // else in this process refers to it.
    let link = SeqPacket::from_fd(unsafe { OwnedFd::from_raw_fd(fd) });
    let guarded = workspace_mounts().and_then(|mounts| {
        let borrowed: Vec<_> = mounts.iter().map(AsFd::as_fd).collect();
        admission::request(&link, admission::Kind::Kit, &borrowed)
    });
    drop(link);
    if let Err(e) = guarded {
        eprintln!("marshd guard-exec: {e}");
        return 126;
    }
    let Some((program, rest)) = argv.split_first() else {
        eprintln!("marshd guard-exec: no command");
        return 127;
    };
    let e = std::process::Command::new(program).args(rest).exec();
    eprintln!("marshd guard-exec: {}: {e}", program.to_string_lossy());
    127
}

/// Whether an open of the file behind `fd` may proceed.
fn verdict(fd: RawFd) -> u32 {
    // SAFETY: `st` is plain data filled by fstat on a descriptor we hold.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return libc::FAN_DENY;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return libc::FAN_ALLOW;
    }
    let set_gid = st.st_mode & libc::S_ISGID != 0 && st.st_mode & libc::S_IXGRP != 0;
    if st.st_mode & libc::S_ISUID != 0 || set_gid {
        return libc::FAN_DENY;
    }
    // SAFETY: size query only (null buffer, length 0).
    let caps =
        unsafe { libc::fgetxattr(fd, c"security.capability".as_ptr(), std::ptr::null_mut(), 0) };
    if caps >= 0 {
        return libc::FAN_DENY;
    }
    match io::Error::last_os_error().raw_os_error() {
        Some(libc::ENODATA) | Some(libc::ENOTSUP) => libc::FAN_ALLOW,
        _ => libc::FAN_DENY,
    }
}

/// The event loop: read a batch of events, answer each, close its descriptor. Every
/// permission event is answered (a missed one would leave its opener waiting until
/// the daemon exits).
fn answer_events(group: OwnedFd) {
    const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut buf = vec![0u8; 64 * 1024];
    let mut failures: u64 = 0;
    loop {
        // SAFETY: reading into a buffer we own, within its length.
        let n = unsafe { libc::read(group.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            // The kernel reports an event whose descriptor it could not open (EMFILE,
            // ENFILE, an LSM or FUSE refusing root) as a read error, after denying that
            // event itself. The loop must go on: while marks exist, an exited thread
            // would leave every later open in the workspace waiting.
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                failures += 1;
                // The first failure and then one in a thousand, so a lasting cause
                // cannot flood the log; the pause lets a descriptor shortage pass.
                if failures % 1000 == 1 {
                    log!("set-id guard: reading events ({failures} failed so far): {e}");
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        let n = n as usize;
        let mut offset = 0;
        while offset + META <= n {
            // SAFETY: at least META bytes are available at `offset`; the kernel writes
            // whole records, and read_unaligned copes with the byte buffer's alignment.
            let meta: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(buf[offset..].as_ptr().cast()) };
            let len = meta.event_len as usize;
            if len < META || offset + len > n {
                break;
            }
            if meta.fd >= 0 {
                let response = libc::fanotify_response {
                    fd: meta.fd,
                    response: if meta.mask & libc::FAN_OPEN_PERM != 0 {
                        verdict(meta.fd)
                    } else {
                        libc::FAN_ALLOW
                    },
                };
                // SAFETY: writing a plain struct we own to the group; closing the
                // event's descriptor, which the kernel gave us.
                unsafe {
                    let size = std::mem::size_of::<libc::fanotify_response>();
                    if libc::write(
                        group.as_raw_fd(),
                        (&response as *const libc::fanotify_response).cast(),
                        size,
                    ) != size as isize
                    {
                        log!(
                            "set-id guard: answering an event: {}",
                            io::Error::last_os_error()
                        );
                    }
                    libc::close(meta.fd);
                }
            }
            offset += len;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape_mount_point("/w/a\\040b"), b"/w/a b");
        assert_eq!(unescape_mount_point("/w/x\\134y\\011"), b"/w/x\\y\t");
        assert_eq!(unescape_mount_point("/w/\\9zz"), b"/w/\\9zz");
    }

    #[test]
    fn set_id_and_capability_files_are_refused_and_others_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let verdict_of = |name: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, "x").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let file = std::fs::File::open(&path).unwrap();
            verdict(file.as_raw_fd())
        };
        assert_eq!(verdict_of("plain", 0o755), libc::FAN_ALLOW);
        assert_eq!(verdict_of("setuid", 0o4755), libc::FAN_DENY);
        assert_eq!(verdict_of("setgid", 0o2755), libc::FAN_DENY);
        // Set-gid without group execute marks mandatory locking, not a set-gid program.
        assert_eq!(verdict_of("locking", 0o2644), libc::FAN_ALLOW);
        let dir_file = std::fs::File::open(dir.path()).unwrap();
        assert_eq!(verdict(dir_file.as_raw_fd()), libc::FAN_ALLOW);
    }
}
