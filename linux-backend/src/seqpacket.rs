//! `AF_UNIX` `SOCK_SEQPACKET` endpoints: record boundaries are preserved, and file
//! descriptors (SCM_RIGHTS) travel attached to the record they belong to.
//!
//! Invariants: every descriptor this module creates or receives is close-on-exec
//! (`SOCK_CLOEXEC`, `MSG_CMSG_CLOEXEC`), so a child spawned by any thread of a
//! multi-threaded process inherits nothing but what it is explicitly given.

use std::fs::OpenOptions;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr, sockopt,
};
use nix::sys::time::TimeVal;

use crate::error::{Context, Error, Result};

/// Largest record accepted in either direction.
pub const MAX_MESSAGE: usize = 512 * 1024;
/// Room for this many descriptors per record: the most the protocol sends is a
/// container's admission (its init's pidfd and up to
/// [`crate::setid_guard::MAX_GUARDED_MOUNTS`] workspace mounts).
const FD_ROOM: usize = crate::setid_guard::MAX_GUARDED_MOUNTS + 1;
/// `sun_path` holds 108 bytes; longer paths are reached through `/proc/self/fd`.
const SUN_PATH_BUDGET: usize = 100;

/// One received record.
pub struct Message {
    pub data: Vec<u8>,
    pub fds: Vec<OwnedFd>,
}

#[derive(Debug)]
pub struct SeqPacket {
    fd: OwnedFd,
}

impl SeqPacket {
    /// A connected pair (both ends close-on-exec).
    pub fn pair() -> Result<(Self, Self)> {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .context(|| "creating a socket pair".to_string())?;
        let (a, b) = (Self::from_fd(a), Self::from_fd(b));
        a.grow_send_buffer();
        b.grow_send_buffer();
        Ok((a, b))
    }

    /// Takes the socket a parent left on fd 0 (close-on-exec from now on) and puts
    /// `/dev/null` on fd 0, so that nothing this process starts inherits the socket.
    pub fn take_stdin() -> Result<Self> {
        let fd = nix::unistd::dup(std::io::stdin().as_fd())
            .context(|| "duplicating the socket on fd 0".to_string())?;
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .context(|| "marking the socket close-on-exec".to_string())?;
        let null = std::fs::File::open("/dev/null").context(|| "opening /dev/null".to_string())?;
        nix::unistd::dup2_stdin(&null).context(|| "replacing fd 0".to_string())?;
        Ok(Self::from_fd(fd))
    }

    /// Wraps an already connected `SOCK_SEQPACKET` descriptor.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }

    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Connects to the listener at `path` (any length).
    pub fn connect(path: &Path) -> Result<Self> {
        let fd = new_socket()?;
        with_short_path(path, |addr| socket::connect(fd.as_raw_fd(), addr))
            .context(|| format!("connecting to {}", path.display()))?;
        let sock = Self::from_fd(fd);
        sock.grow_send_buffer();
        Ok(sock)
    }

    /// Sends one record with `fds` attached.
    pub fn send(&self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        if payload.is_empty() || payload.len() > MAX_MESSAGE {
            return Err(Error::Protocol(format!(
                "record of {} bytes",
                payload.len()
            )));
        }
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        let rights = [ControlMessage::ScmRights(&raw)];
        let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &rights };
        loop {
            match socket::sendmsg::<()>(
                self.fd.as_raw_fd(),
                &[IoSlice::new(payload)],
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(n) if n == payload.len() => return Ok(()),
                Ok(n) => return Err(Error::Protocol(format!("short send of {n} bytes"))),
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::sys("sending", e)),
            }
        }
    }

    /// Receives one record; `None` at end of stream (the peer closed or shut down).
    /// A receive timeout (see [`SeqPacket::set_recv_timeout`]) is an error.
    pub fn recv(&self) -> Result<Option<Message>> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut cmsg_space = nix::cmsg_space!([RawFd; FD_ROOM]);
        loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let received = socket::recvmsg::<()>(
                self.fd.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg_space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            );
            let msg = match received {
                Ok(msg) => msg,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => {
                    return Err(Error::Protocol("timed out waiting for the peer".into()));
                }
                Err(Errno::ECONNRESET) => return Ok(None),
                Err(e) => return Err(Error::sys("receiving", e)),
            };
            let (bytes, flags) = (msg.bytes, msg.flags);
            let mut fds = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for cmsg in cmsgs {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        fds.extend(raw.into_iter().map(own_received_fd));
                    }
                }
            }
            if flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC) {
                return Err(Error::Protocol("oversized record".into()));
            }
            if bytes == 0 && fds.is_empty() {
                return Ok(None);
            }
            buf.truncate(bytes);
            return Ok(Some(Message { data: buf, fds }));
        }
    }

    /// Uid of the connected peer, from the kernel (SO_PEERCRED).
    pub fn peer_uid(&self) -> Result<u32> {
        let creds = socket::getsockopt(&self.fd, sockopt::PeerCredentials)
            .context(|| "reading peer credentials".to_string())?;
        Ok(creds.uid())
    }

    /// Bounds every later `recv`; `None` waits forever.
    pub fn set_recv_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        let tv = match timeout {
            Some(d) => TimeVal::new(
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                i64::from(d.subsec_micros()).max(if d.is_zero() { 1 } else { 0 }),
            ),
            None => TimeVal::new(0, 0),
        };
        socket::setsockopt(&self.fd, sockopt::ReceiveTimeout, &tv)
            .context(|| "setting a receive timeout".to_string())
    }

    /// Shuts both directions down; a thread blocked in `recv` on this socket wakes
    /// with end of stream.
    pub fn shutdown(&self) {
        // ENOTCONN after the peer left is the only expected error; nothing to do then.
        let _ = socket::shutdown(self.fd.as_raw_fd(), socket::Shutdown::Both);
    }

    /// Shuts the receiving direction down: a thread blocked in `recv` on this socket
    /// wakes with end of stream, while sending still works.
    pub fn shutdown_read(&self) {
        let _ = socket::shutdown(self.fd.as_raw_fd(), socket::Shutdown::Read);
    }

    /// Records up to `MAX_MESSAGE` must fit in the send buffer of a seqpacket socket.
    fn grow_send_buffer(&self) {
        // Best effort: the kernel clamps to wmem_max, which still fits realistic records.
        let _ = socket::setsockopt(&self.fd, sockopt::SndBuf, &(2 * MAX_MESSAGE));
    }
}

impl AsFd for SeqPacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A listening `SOCK_SEQPACKET` socket bound to a filesystem path.
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Binds `path` (any length; the file is created with the process umask) and listens.
    pub fn bind(path: &Path) -> Result<Self> {
        let fd = new_socket()?;
        with_short_path(path, |addr| socket::bind(fd.as_raw_fd(), addr))
            .context(|| format!("binding {}", path.display()))?;
        let backlog = Backlog::new(128).context(|| "listen backlog".to_string())?;
        socket::listen(&fd, backlog).context(|| format!("listening on {}", path.display()))?;
        Ok(Self { fd })
    }

    /// Accepts one connection (close-on-exec).
    pub fn accept(&self) -> Result<SeqPacket> {
        loop {
            match socket::accept4(self.fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
                Ok(raw) => {
                    let sock = SeqPacket::from_fd(own_received_fd(raw));
                    sock.grow_send_buffer();
                    return Ok(sock);
                }
                Err(Errno::EINTR | Errno::ECONNABORTED) => continue,
                Err(e) => return Err(Error::sys("accepting a connection", e)),
            }
        }
    }
}

fn new_socket() -> Result<OwnedFd> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context(|| "creating a socket".to_string())
}

/// Calls `f` with an address that reaches `path`: the path itself when it fits in
/// `sun_path`, else `/proc/self/fd/<dirfd>/<name>` through a descriptor on its parent
/// directory, which keeps deep homes usable.
fn with_short_path<T>(
    path: &Path,
    f: impl FnOnce(&UnixAddr) -> nix::Result<T>,
) -> std::io::Result<T> {
    if path.as_os_str().len() < SUN_PATH_BUDGET {
        let addr = UnixAddr::new(path)?;
        return Ok(f(&addr)?);
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("socket path has no parent directory"));
    };
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(parent)?;
    let mut short = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    short.extend_from_slice(name.as_bytes());
    if short.len() >= SUN_PATH_BUDGET {
        return Err(std::io::Error::other("socket file name is too long"));
    }
    let addr = UnixAddr::new(std::ffi::OsStr::from_bytes(&short))?;
    let result = f(&addr)?;
    drop(dir);
    Ok(result)
}

#[allow(unsafe_code)]
fn own_received_fd(raw: RawFd) -> OwnedFd {
    // SAFETY: `raw` was installed into this process's descriptor table by the kernel
    // moments ago (accept4, or SCM_RIGHTS delivery in recvmsg); nothing else refers to
    // it, and each such descriptor passes through this function exactly once.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn records_and_descriptors_round_trip() {
        let (a, b) = SeqPacket::pair().unwrap();
        let (mut r, w) = std::io::pipe().unwrap();
        a.send(b"hello", &[w.as_fd()]).unwrap();
        drop(w);
        let msg = b.recv().unwrap().unwrap();
        assert_eq!(msg.data, b"hello");
        assert_eq!(msg.fds.len(), 1);
        let mut f = std::fs::File::from(msg.fds.into_iter().next().unwrap());
        f.write_all(b"via fd").unwrap();
        drop(f);
        let mut out = String::new();
        r.read_to_string(&mut out).unwrap();
        assert_eq!(out, "via fd");
        drop(a);
        assert!(b.recv().unwrap().is_none());
    }

    #[test]
    fn long_paths_bind_and_connect() {
        let dir = tempfile::tempdir().unwrap();
        let mut deep = dir.path().to_path_buf();
        for i in 0..12 {
            deep.push(format!("a-rather-long-directory-name-{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        let path = deep.join("marshd.sock");
        assert!(path.as_os_str().len() > 200);
        let listener = Listener::bind(&path).unwrap();
        let client = SeqPacket::connect(&path).unwrap();
        let server = listener.accept().unwrap();
        client.send(b"x", &[]).unwrap();
        assert_eq!(server.recv().unwrap().unwrap().data, b"x");
        assert_eq!(server.peer_uid().unwrap(), crate::util::euid());
    }

    #[test]
    fn shutdown_read_wakes_a_reader_but_keeps_sending() {
        let (a, b) = SeqPacket::pair().unwrap();
        let a = std::sync::Arc::new(a);
        let reader = {
            let a = std::sync::Arc::clone(&a);
            std::thread::spawn(move || a.recv().unwrap().is_none())
        };
        std::thread::sleep(Duration::from_millis(20));
        a.shutdown_read();
        assert!(
            reader.join().unwrap(),
            "the blocked reader sees end of stream"
        );
        a.send(b"reply", &[]).unwrap();
        assert_eq!(b.recv().unwrap().unwrap().data, b"reply");
    }

    #[test]
    fn receive_timeout_is_an_error() {
        let (a, _b) = SeqPacket::pair().unwrap();
        a.set_recv_timeout(Some(Duration::from_millis(20))).unwrap();
        assert!(a.recv().is_err());
    }
}
