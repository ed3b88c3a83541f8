//! Admission: what the daemon does to a container before it may take a job, asked for
//! over a socket of its own.
//!
//! A project shell's agent holds one such socket (handed over with its channel) and
//! sends, for each job container it prepares, a [`Kind::Container`] request carrying a
//! pidfd of the container's init and the container's workspace mounts; a kit
//! container's first program (`marshd guard-exec`) sends a [`Kind::Kit`] request with
//! its workspace mounts. The daemon, which holds the privileges the sandbox lacks:
//! - marks the mounts for the set-id guard ([`crate::setid_guard`]), when it runs one;
//! - gives a container's init the OOM score [`CONTAINER_OOM_SCORE_ADJ`]; written with
//!   `CAP_SYS_RESOURCE` (where root holds it) that is also the floor the init's jobs
//!   inherit, so no job can make itself a less likely victim than its init (the shell
//!   around it stays at -1000 there: an OOM kill in the scope takes a job, never the
//!   shell).
//!
//! Invariant: the asker runs nothing of a job before the answer [`ADMITTED`]; any other
//! answer, or none within [`REQUEST_TIMEOUT`], and the container is discarded. The
//! socket exists only for a root daemon (both effects need root), so without it no
//! admission is asked for.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Context, Error, Result};
use crate::sandbox::CONTAINER_OOM_SCORE_ADJ;
use crate::seqpacket::SeqPacket;
use crate::setid_guard::{MAX_GUARDED_MOUNTS, SetIdGuard};
use crate::util::log;

/// How long an admission may take to be asked for and answered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The answer to an admission that succeeded.
pub const ADMITTED: &[u8] = b"admitted";

/// Who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A project shell's job container: a pidfd of its init, then its mounts.
    Container,
    /// A kit container: its mounts.
    Kit,
}

impl Kind {
    fn tag(self) -> &'static [u8] {
        match self {
            Kind::Container => b"container",
            Kind::Kit => b"kit",
        }
    }
}

/// Asks for admission on `link` and waits for the answer. `fds` as [`Kind`] says.
pub fn request(link: &SeqPacket, kind: Kind, fds: &[BorrowedFd<'_>]) -> Result<()> {
    link.send(kind.tag(), fds)?;
    link.set_recv_timeout(Some(REQUEST_TIMEOUT))?;
    let answer = link.recv();
    link.set_recv_timeout(None)?;
    match answer? {
        Some(reply) if reply.data == ADMITTED => Ok(()),
        Some(reply) => Err(Error::failed(format!(
            "the daemon refused the container: {}",
            String::from_utf8_lossy(&reply.data)
        ))),
        None => Err(Error::failed(
            "the daemon went away before admitting the container",
        )),
    }
}

/// The daemon's side.
pub struct Admitter {
    /// The set-id guard, when this daemon runs one.
    pub guard: Option<Arc<SetIdGuard>>,
}

impl Admitter {
    /// Answers one request on `link`; `Ok(false)` at end of stream.
    pub fn serve_one(&self, link: &SeqPacket) -> Result<bool> {
        let Some(request) = link.recv()? else {
            return Ok(false);
        };
        let outcome = match request.data.as_slice() {
            b"container" => self.admit_container(&request.fds),
            b"kit" => self.guard_mounts(&request.fds),
            other => Err(Error::Protocol(format!(
                "unknown admission request {:?}",
                String::from_utf8_lossy(other)
            ))),
        };
        match outcome {
            Ok(()) => link.send(ADMITTED, &[])?,
            Err(e) => {
                log!("admission: {e}");
                link.send(e.to_string().as_bytes(), &[])?;
            }
        }
        Ok(true)
    }

    /// Serves `link` (a project shell agent's) on a thread of its own until the agent
    /// closes it.
    pub fn serve_link(self: Arc<Self>, link: SeqPacket) -> Result<()> {
        std::thread::Builder::new()
            .name("admission".into())
            .spawn(move || {
                loop {
                    match self.serve_one(&link) {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(e) => {
                            log!("admission link: {e}");
                            break;
                        }
                    }
                }
            })
            .map(|_| ())
            .context(|| "starting the admission thread".to_string())
    }

    fn admit_container(&self, fds: &[OwnedFd]) -> Result<()> {
        let (init, mounts) = fds
            .split_first()
            .ok_or_else(|| Error::Protocol("a container admission carries its init".into()))?;
        set_oom_floor(init.as_fd(), CONTAINER_OOM_SCORE_ADJ)?;
        self.guard_mounts(mounts)
    }

    fn guard_mounts(&self, mounts: &[OwnedFd]) -> Result<()> {
        let Some(guard) = &self.guard else {
            return Ok(());
        };
        if mounts.is_empty() || mounts.len() > MAX_GUARDED_MOUNTS {
            return Err(Error::Protocol(format!(
                "an admission names 1 to {MAX_GUARDED_MOUNTS} workspace mounts, not {}",
                mounts.len()
            )));
        }
        mounts
            .iter()
            .try_for_each(|fd| guard.guard_mount(fd.as_fd()))
    }
}

/// Writes `score` as the OOM score of the process behind `pidfd` (its pid here read
/// from the pidfd's fdinfo). Written with `CAP_SYS_RESOURCE`, it is also the floor
/// below which neither the process nor its later children may go.
fn set_oom_floor(pidfd: BorrowedFd<'_>, score: i32) -> Result<()> {
    let info_path = format!(
        "/proc/self/fdinfo/{}",
        std::os::fd::AsRawFd::as_raw_fd(&pidfd)
    );
    let info = std::fs::read_to_string(&info_path)
        .context(|| "reading the container init's pidfd".to_string())?;
    let pid: i32 = info
        .lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|pid| *pid > 1)
        .ok_or_else(|| Error::failed("the container's init is gone"))?;
    std::fs::write(format!("/proc/{pid}/oom_score_adj"), score.to_string())
        .context(|| format!("setting the OOM score of the container init (pid {pid})"))
}
