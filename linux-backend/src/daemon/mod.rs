//! `marshd`: the per-home daemon. It owns the home's one long-lived project shell
//! (a bubblewrap sandbox running the agent), the kit workers' warm/cold state, and the
//! owner-only socket `daemon/marshd.sock` through which `marsh` talks to it.
//!
//! Lifetime invariants:
//! - one daemon per home: it holds an exclusive flock on `daemon/daemon.lock` until exit;
//! - every sandbox dies with the daemon (`--die-with-parent`, and explicit kills on the
//!   orderly paths: stop, idle, home gone);
//! - the daemon exits when its home disappears or is replaced, or after the idle period
//!   (`idle_secs` of `backend.json`).

mod conn;
mod kit_jobs;
mod publish;
mod shell;
mod state;

use std::fs::{self, File};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use nix::sys::stat::Mode;

use crate::backend::{self, Assessment};
use crate::config::BackendConfig;
use crate::error::{Context, Error, Result};
use crate::home::Home;
use crate::limits::Limits;
use crate::publication::{Publisher, Settings};
use crate::receipt::{self, Receipt};
use crate::receipt_blanks::Blanks;
use crate::sandbox::{Confinement, Exposed, Isolation};
use crate::seqpacket::Listener;
use crate::setid_guard::SetIdGuard;
use crate::token;
use crate::util::{self, ensure_private_dir, log};
use crate::workers::Workers;

pub(crate) use shell::Shell;
use state::State;

/// The watchdog's period; it is also how long a new receipt may wait for the sync
/// of the results directory.
const WATCH_INTERVAL: Duration = receipt::RESULTS_SYNC_INTERVAL;
const LOCK_ATTEMPTS: u32 = 50;

/// Fixed at startup; never changes while the daemon lives.
pub(crate) struct Config {
    pub home: Home,
    /// `(dev, ino)` of the home directory at startup.
    home_id: (u64, u64),
    /// The daemon directory, held open so cleanup only ever touches this directory
    /// even if the home path is later replaced.
    daemon_dir: OwnedFd,
    pub workspace: PathBuf,
    pub isolation: Isolation,
    /// The settings in force (read once, at boot).
    pub backend: BackendConfig,
    /// The seccomp program, control group and `/etc` view every sandbox shares.
    pub confinement: Confinement,
    /// The set-id guard marking every sandbox's workspace mounts, or why there is none
    /// (a daemon that is not root, a kernel without permission events, or unconfined
    /// jobs, which no sandbox holds anyway).
    pub setid_guard: std::result::Result<Arc<SetIdGuard>, String>,
    pub token: String,
    pub idle: Duration,
    /// Where this marshd was started from (for messages and the unconfined agent's
    /// kit wrappers); `self_fd` is what is executed.
    pub self_exe: PathBuf,
    /// Invariant: this very process's executable (`/proc/self/exe` opened `O_PATH`),
    /// so the agent runs the inode this daemon runs even if the file at `self_exe`
    /// was replaced since.
    pub self_fd: OwnedFd,
    /// `HOME` of the booting client: in the project shell, the home's guest home is
    /// bound there; in a kit container, a private tmpfs.
    pub job_home: Option<PathBuf>,
    /// The `expose` and `path` settings, resolved and checked at boot.
    pub exposed: Exposed,
    /// The control home, sbx and programs of publication transactions.
    pub publication: Settings,
    pub pid: u32,
}

pub(crate) struct Daemon {
    pub cfg: Config,
    state: Mutex<State>,
    changed: Condvar,
    next_shell: AtomicU64,
    /// Request ids of host kit runs (`marsh kit run`), keyed under shell id 0 (shell
    /// ids start at 1, so these never meet an agent's requests).
    next_host_kit: AtomicU64,
    /// A receipt was renamed into `results/` since the directory was last synced. Set
    /// after every receipt; the watchdog syncs and clears it (at most
    /// [`receipt::RESULTS_SYNC_INTERVAL`] later), and so does a shutdown.
    results_unsynced: AtomicBool,
    /// Receipt files prepared off the reply path (kept filled by their own thread).
    blanks: Blanks,
    /// Threads for connections and their watchers, reused across `marsh` runs.
    pub(crate) workers: Workers,
}

/// The shell id under which host kit runs are registered.
pub(super) const HOST_KITS: u64 = 0;

/// Runs the daemon for `home`, bound to `workspace`, until it stops.
pub(crate) fn serve(home: &Path, workspace: &Path) -> Result<()> {
    // Detach from the booting client's session; failure means we already lead one.
    let _ = nix::unistd::setsid();
    // Start from an empty signal mask whatever the booting client had blocked, so that
    // SIGTERM ends the daemon (its sandboxes die with it).
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
    nix::sys::stat::umask(Mode::from_bits_truncate(0o077));

    let home = Home::at(home);
    if !home.exists() {
        return Err(Error::failed(format!(
            "home {} does not exist",
            home.root().display()
        )));
    }
    ensure_private_dir(&home.daemon_dir())?;
    let lock = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(home.daemon_lock_path())
        .context(|| format!("opening {}", home.daemon_lock_path().display()))?;
    // Clients probe this lock with a momentary shared lock; retry briefly so a probe
    // never makes a boot fail. A daemon that owns the home keeps it for good.
    let mut attempts = 0;
    while lock.try_lock().is_err() {
        attempts += 1;
        if attempts >= LOCK_ATTEMPTS {
            return Err(Error::failed("another daemon already owns this home"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }

    let cfg = configure(home, workspace)?;
    let results_dir = cfg.home.results_dir();
    ensure_private_dir(&results_dir)?;
    // A daemon killed mid-write leaves at most a temp file (never a partial receipt);
    // this daemon owns the home now, so no writer is still using one.
    remove_stale_temp_files(&results_dir);
    let daemon = Arc::new(Daemon {
        cfg,
        state: Mutex::new(State::new()),
        changed: Condvar::new(),
        next_shell: AtomicU64::new(1),
        next_host_kit: AtomicU64::new(1),
        results_unsynced: AtomicBool::new(false),
        blanks: Blanks::new(&results_dir),
        workers: Workers::new("conn"),
    });
    if let Err(e) = daemon.boot_shell() {
        daemon.cfg.confinement.limits.release();
        return Err(e);
    }

    let socket = daemon.cfg.home.socket_path();
    daemon.unlink_own("marshd.sock");
    let listener = Listener::bind(&socket)?;
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o600))
        .context(|| format!("restricting {}", socket.display()))?;
    util::write_durable(
        &daemon.cfg.home.daemon_dir(),
        "pid",
        format!("{}\n", daemon.cfg.pid).as_bytes(),
    )?;
    log!(
        "marshd: pid {} serving {} for workspace {} ({})",
        daemon.cfg.pid,
        daemon.cfg.home.root().display(),
        daemon.cfg.workspace.display(),
        daemon.cfg.isolation.label()
    );
    {
        let daemon = Arc::clone(&daemon);
        std::thread::Builder::new()
            .name("receipt-blanks".into())
            .spawn(move || daemon.blanks.keep_filled())
            .context(|| "starting the receipt file preparer".to_string())?;
    }
    {
        let daemon = Arc::clone(&daemon);
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || daemon.watch())
            .context(|| "starting the watchdog".to_string())?;
    }
    daemon.accept_loop(&listener);
    drop(lock);
    Ok(())
}

fn configure(home: Home, workspace: &Path) -> Result<Config> {
    let meta =
        fs::metadata(home.root()).context(|| format!("inspecting {}", home.root().display()))?;
    let daemon_dir: OwnedFd = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(home.daemon_dir())
        .context(|| format!("opening {}", home.daemon_dir().display()))?
        .into();
    let workspace = fs::canonicalize(workspace)
        .context(|| format!("resolving workspace {}", workspace.display()))?;
    if !workspace.is_dir() || workspace == Path::new("/") {
        return Err(Error::failed(format!(
            "{} cannot be a workspace",
            workspace.display()
        )));
    }
    // The workspace is bound writable into every sandbox: it must not expose the home.
    if home.root().starts_with(&workspace) {
        return Err(Error::failed(format!(
            "home {} lies inside workspace {}; refusing to expose it to the sandbox",
            home.root().display(),
            workspace.display()
        )));
    }
    let user_home = std::env::var_os("HOME");
    let Assessment {
        config: backend,
        isolation,
        exposed,
    } = backend::assess(&home, user_home.as_ref(), Some(&workspace))?;
    prepare_guest_home(&home)?;
    let confinement = Confinement::new(&backend, Limits::establish(&backend), &isolation)?;
    let setid_guard = match isolation {
        Isolation::Bwrap(_) => SetIdGuard::start(),
        Isolation::Unconfined => Err("jobs run unconfined".to_string()),
    };
    if let Err(reason) = &setid_guard {
        log!("set-id guard off: {reason}");
    }
    let self_exe =
        std::env::current_exe().context(|| "locating the marshd executable".to_string())?;
    let self_fd = File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open("/proc/self/exe")
        .context(|| "opening the marshd executable".to_string())?
        .into();
    let token = token::mint(&home)?;
    Ok(Config {
        home_id: (meta.dev(), meta.ino()),
        home,
        daemon_dir,
        workspace,
        isolation,
        token,
        idle: Duration::from_secs(backend.idle_secs),
        backend,
        confinement,
        setid_guard,
        self_exe,
        self_fd,
        job_home: user_home.map(PathBuf::from),
        exposed,
        publication: Settings::for_daemon(),
        pid: std::process::id(),
    })
}

impl Daemon {
    /// The publisher of this daemon's project shell.
    pub(crate) fn publisher(&self) -> Publisher {
        Publisher {
            settings: self.cfg.publication.clone(),
            workspace: self.cfg.workspace.clone(),
            home: self.cfg.home.root().to_path_buf(),
            may_publish: true,
        }
    }

    /// A fresh key for a host kit run.
    pub(super) fn host_kit_key(&self) -> (u64, u64) {
        (
            HOST_KITS,
            self.next_host_kit.fetch_add(1, Ordering::Relaxed),
        )
    }

    fn accept_loop(self: &Arc<Self>, listener: &Listener) {
        loop {
            let conn = match listener.accept() {
                Ok(conn) => conn,
                Err(e) => {
                    log!("marshd: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            if !self.connection_opened() {
                continue;
            }
            let daemon = Arc::clone(self);
            let spawned = self.workers.run(move || {
                conn::handle(&daemon, conn);
                daemon.connection_closed();
            });
            if let Err(e) = spawned {
                log!("marshd: starting a connection thread: {e}");
                self.connection_closed();
            }
        }
    }

    /// Polls for the two self-exit conditions: home gone or replaced, and idleness.
    fn watch(self: &Arc<Self>) {
        loop {
            std::thread::sleep(WATCH_INTERVAL);
            self.sync_results();
            if !self.home_intact() {
                self.shutdown("the home disappeared or was replaced");
            }
            if self.idle_expired() {
                self.shutdown("idle timeout");
            }
        }
    }

    fn home_intact(&self) -> bool {
        fs::metadata(self.cfg.home.root())
            .map(|m| (m.dev(), m.ino()) == self.cfg.home_id)
            .unwrap_or(false)
    }

    /// Writes a receipt whole (one synchronous write, [`Receipt::write`]) and leaves
    /// the directory sync to the watchdog: the reply never waits for a second flush.
    pub(crate) fn write_receipt(&self, receipt: &Receipt) -> Result<()> {
        receipt.write(&self.cfg.home.results_dir(), Some(&self.blanks))?;
        self.results_unsynced.store(true, Ordering::Release);
        Ok(())
    }

    /// Syncs the results directory if a receipt was added since the last sync.
    fn sync_results(&self) {
        if self.results_unsynced.swap(false, Ordering::AcqRel)
            && let Err(e) = util::sync_dir(&self.cfg.home.results_dir())
        {
            log!("marshd: syncing the results directory: {e}");
            self.results_unsynced.store(true, Ordering::Release);
        }
    }

    /// Stops everything and exits the process.
    pub(crate) fn shutdown(self: &Arc<Self>, reason: &str) -> ! {
        log!("marshd: shutting down: {reason}");
        self.unlink_own("marshd.sock");
        if let Some(shell) = self.begin_shutdown() {
            shell.kill_and_wait();
        }
        self.kill_all_kit_jobs();
        self.blanks.discard();
        self.sync_results();
        self.cfg.confinement.limits.release();
        self.unlink_own("pid");
        std::process::exit(0)
    }

    /// Removes `name` from this daemon's own `daemon/` directory (never from a
    /// replacement home at the same path).
    pub(crate) fn unlink_own(&self, name: &str) {
        let _ = nix::unistd::unlinkat(
            &self.cfg.daemon_dir,
            name,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
}

/// Makes the owner-only [`Home::guest_dir`] and the guest `HOME` inside it, moving a
/// guest `HOME` of the earlier layout there first (a rename within the home: nothing
/// is copied, and a crash leaves either layout whole for the next boot to finish).
fn prepare_guest_home(home: &Home) -> Result<()> {
    ensure_private_dir(&home.guest_dir())?;
    let legacy = home.legacy_guest_home();
    let guest_home = home.guest_home();
    let legacy_is_dir = fs::symlink_metadata(&legacy).is_ok_and(|m| m.file_type().is_dir());
    if legacy_is_dir && fs::symlink_metadata(&guest_home).is_err() {
        fs::rename(&legacy, &guest_home).context(|| {
            format!(
                "moving the guest HOME {} to {}",
                legacy.display(),
                guest_home.display()
            )
        })?;
    }
    ensure_private_dir(&guest_home)
}

/// Removes the temp files (`.NAME.RANDOM.tmp`) a killed daemon may have left in `dir`.
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let _ = fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_guest_home_sits_in_an_owner_only_directory_and_an_earlier_one_moves_in() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        fs::create_dir(home.legacy_guest_home()).unwrap();
        fs::write(home.legacy_guest_home().join(".bashrc"), "kept").unwrap();
        prepare_guest_home(&home).unwrap();
        assert!(!home.legacy_guest_home().exists());
        let kept = fs::read_to_string(home.guest_home().join(".bashrc")).unwrap();
        assert_eq!(kept, "kept");
        // A job may open up its HOME; the directory around it stays closed.
        fs::set_permissions(home.guest_home(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(home.guest_dir(), fs::Permissions::from_mode(0o755)).unwrap();
        prepare_guest_home(&home).unwrap();
        for dir in [home.guest_dir(), home.guest_home()] {
            assert_eq!(fs::metadata(&dir).unwrap().mode() & 0o777, 0o700, "{dir:?}");
        }
    }
}
