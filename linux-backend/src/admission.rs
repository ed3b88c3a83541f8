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
//! Invariant: the asker runs nothing of a job before the answer `admitted <id>` to its
//! own request `<kind> <id>`; any other answer, or none within [`REQUEST_TIMEOUT`], and
//! the container is discarded. Answers carry the request's id because the shell's
//! socket is shared by every container it prepares: an answer that comes after its
//! asker gave up is skipped by the next asker instead of being taken for its own. The
//! socket exists only for a root daemon (both effects need root), so without it no
//! admission is asked for.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::{Context, Error, Result};
use crate::sandbox::CONTAINER_OOM_SCORE_ADJ;
use crate::seqpacket::SeqPacket;
use crate::setid_guard::{MAX_GUARDED_MOUNTS, SetIdGuard};
use crate::util::log;

/// How long an admission may take to be asked for and answered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The verb of an answer to an admission that succeeded (`admitted <id>`).
const ADMITTED: &str = "admitted";
/// The verb of an answer to one that failed (`refused <id>: <why>`).
const REFUSED: &str = "refused";

/// Ids of this process's requests.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Who asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A project shell's job container: a pidfd of its init, then its mounts.
    Container,
    /// A kit container: its mounts.
    Kit,
}

impl Kind {
    fn tag(self) -> &'static str {
        match self {
            Kind::Container => "container",
            Kind::Kit => "kit",
        }
    }
}

/// Asks for admission on `link` and waits for the answer to this request (answers to
/// earlier, abandoned requests are skipped). `fds` as [`Kind`] says.
pub fn request(link: &SeqPacket, kind: Kind, fds: &[BorrowedFd<'_>]) -> Result<()> {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    link.send(format!("{} {id}", kind.tag()).as_bytes(), fds)?;
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break Err(Error::failed(format!(
                "the daemon did not admit the container within {REQUEST_TIMEOUT:?}"
            )));
        }
        link.set_recv_timeout(Some(left))?;
        match link.recv() {
            Ok(Some(reply)) => {
                let text = String::from_utf8_lossy(&reply.data).into_owned();
                match parse_answer(&text) {
                    Some((answer_id, verdict)) if answer_id == id => break verdict,
                    Some(_) => continue,
                    None => {
                        break Err(Error::Protocol(format!(
                            "an admission answer that does not parse: {text:?}"
                        )));
                    }
                }
            }
            Ok(None) => {
                break Err(Error::failed(
                    "the daemon went away before admitting the container",
                ));
            }
            Err(e) => break Err(e),
        }
    };
    link.set_recv_timeout(None)?;
    answer
}

/// `admitted <id>` or `refused <id>: <why>`.
fn parse_answer(text: &str) -> Option<(u64, Result<()>)> {
    let (verb, rest) = text.split_once(' ')?;
    let (id, why) = match rest.split_once(": ") {
        Some((id, why)) => (id, Some(why)),
        None => (rest, None),
    };
    let id = id.parse().ok()?;
    match (verb, why) {
        (ADMITTED, None) => Some((id, Ok(()))),
        (REFUSED, Some(why)) => Some((
            id,
            Err(Error::failed(format!(
                "the daemon refused the container: {why}"
            ))),
        )),
        _ => None,
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
        let text = String::from_utf8_lossy(&request.data).into_owned();
        let (tag, id) = text.split_once(' ').unwrap_or((text.as_str(), "0"));
        let outcome = match tag {
            "container" => self.admit_container(&request.fds),
            "kit" => self.guard_mounts(&request.fds),
            other => Err(Error::Protocol(format!(
                "unknown admission request {other:?}"
            ))),
        };
        let answer = match outcome {
            Ok(()) => format!("{ADMITTED} {id}"),
            Err(e) => {
                log!("admission: {e}");
                format!("{REFUSED} {id}: {e}")
            }
        };
        link.send(answer.as_bytes(), &[])?;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn an_answer_is_taken_only_for_its_own_request() {
        let (agent, daemon) = SeqPacket::pair().unwrap();
        // A late answer to an abandoned request 0 waits on the socket first.
        daemon.send(b"admitted 0", &[]).unwrap();
        let admitter = Admitter { guard: None };
        let serving = std::thread::spawn(move || {
            // The request for a kit carries no mounts here: with no guard, nothing to do.
            admitter.serve_one(&daemon).unwrap();
            daemon
        });
        request(&agent, Kind::Kit, &[]).unwrap();
        drop(serving.join().unwrap());
        assert_eq!(
            parse_answer("refused 7: the mounts").map(|(id, v)| (id, v.is_ok())),
            Some((7, false))
        );
        assert!(parse_answer("admitted x").is_none());
    }
}
