//! The daemon's mutable state and every transition on it: shell acquisition and
//! boot, reset, stop, worker warm/cold, kit job bookkeeping, idleness.
//!
//! Busy invariant: reset, stop and a worker reset check for active jobs and commit
//! their transition under one lock acquisition, and a job is registered under the same
//! lock only while no transition is in progress, so "busy" never races a new job.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use nix::unistd::Pid;

use super::{Daemon, Shell};
use crate::backend::BackendReport;
use crate::error::{Error, Result};
use crate::kits::{self, Selection};
use crate::proto::{DaemonState, ShellState, StatusReport, WorkerReport};
use crate::util::{self, lock};

/// Connections served at once; more are refused until one ends.
const MAX_CONNECTIONS: usize = 256;

pub(super) enum ShellSlot {
    Down,
    Booting,
    Up(Arc<Shell>),
}

#[derive(Default)]
struct Worker {
    warm: bool,
    active: usize,
}

struct KitJob {
    kit: String,
    /// Process group of the kit's container while it runs. Cleared (under the state
    /// lock) once its leader's exit is observed and before it is reaped, so a cancel
    /// never signals a recycled group id.
    pgid: Option<Pid>,
    cancelled: bool,
}

pub(super) struct State {
    shell: ShellSlot,
    resetting: bool,
    stopping: bool,
    shell_jobs: usize,
    /// Keyed by (shell id, agent request id).
    kit_jobs: HashMap<(u64, u64), KitJob>,
    workers: BTreeMap<String, Worker>,
    connections: usize,
    /// Publication transactions in progress (the daemon does not idle out under one).
    publications: usize,
    last_activity: Instant,
}

impl State {
    pub(super) fn new() -> Self {
        Self {
            shell: ShellSlot::Down,
            resetting: false,
            stopping: false,
            shell_jobs: 0,
            kit_jobs: HashMap::new(),
            workers: BTreeMap::new(),
            connections: 0,
            publications: 0,
            last_activity: Instant::now(),
        }
    }

    fn active_jobs(&self) -> usize {
        self.shell_jobs + self.kit_jobs.len()
    }

    fn busy_text(&self) -> String {
        let n = self.active_jobs();
        format!(
            "{n} active job{} ({} shell, {} kit)",
            if n == 1 { "" } else { "s" },
            self.shell_jobs,
            self.kit_jobs.len()
        )
    }
}

/// Releases one shell job registration when dropped.
pub(super) struct ShellJobGuard<'a>(&'a Daemon);

impl Drop for ShellJobGuard<'_> {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.shell_jobs = st.shell_jobs.saturating_sub(1);
        st.last_activity = Instant::now();
    }
}

/// The one publication transaction in flight, while it lives.
pub(super) struct PublicationGuard(Arc<Daemon>);

impl Drop for PublicationGuard {
    fn drop(&mut self) {
        let mut st = lock(&self.0.state);
        st.publications = st.publications.saturating_sub(1);
        st.last_activity = Instant::now();
    }
}

impl Daemon {
    /// Registers a publication transaction until the guard drops; `None` while one is
    /// in flight. One at a time per daemon: a job cannot pile up host threads and sbx
    /// runs by asking again and again (it gets `busy` at once instead).
    pub(super) fn try_publication_guard(self: &Arc<Self>) -> Option<PublicationGuard> {
        let mut st = lock(&self.state);
        if st.publications > 0 {
            return None;
        }
        st.publications += 1;
        st.last_activity = Instant::now();
        Some(PublicationGuard(Arc::clone(self)))
    }

    /// Boots the project shell at daemon start.
    pub(super) fn boot_shell(self: &Arc<Self>) -> Result<()> {
        self.shell_for(false).map(|_| ())
    }

    /// The live project shell with one job registered on it (booting it if it is
    /// down); waits while a boot or reset is in progress.
    pub(super) fn acquire_shell_job(self: &Arc<Self>) -> Result<(Arc<Shell>, ShellJobGuard<'_>)> {
        let shell = self.shell_for(true)?;
        Ok((shell, ShellJobGuard(self)))
    }

    fn shell_for(self: &Arc<Self>, register_job: bool) -> Result<Arc<Shell>> {
        let mut st = lock(&self.state);
        loop {
            if st.stopping {
                return Err(Error::failed("the daemon is stopping"));
            }
            if st.resetting || matches!(st.shell, ShellSlot::Booting) {
                st = self
                    .changed
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                continue;
            }
            if let ShellSlot::Up(shell) = &st.shell
                && shell.is_alive()
            {
                let shell = Arc::clone(shell);
                if register_job {
                    st.shell_jobs += 1;
                    st.last_activity = Instant::now();
                }
                return Ok(shell);
            }
            st.shell = ShellSlot::Booting;
            drop(st);
            let booted = Shell::boot(self);
            st = lock(&self.state);
            st.shell = match &booted {
                Ok(shell) => ShellSlot::Up(Arc::clone(shell)),
                Err(_) => ShellSlot::Down,
            };
            self.changed.notify_all();
            booted?;
        }
    }

    /// Called by a shell's supervisor thread once its sandbox is gone.
    pub(super) fn on_shell_exit(&self, id: u64) {
        let mut st = lock(&self.state);
        if matches!(&st.shell, ShellSlot::Up(s) if s.id == id) {
            st.shell = ShellSlot::Down;
        }
        self.changed.notify_all();
    }

    /// Restarts the project shell and makes every worker cold; busy with active jobs.
    pub(super) fn reset(self: &Arc<Self>) -> Result<()> {
        let old = {
            let mut st = self.wait_quiescent()?;
            if st.active_jobs() > 0 {
                return Err(Error::Busy(st.busy_text()));
            }
            st.resetting = true;
            for worker in st.workers.values_mut() {
                worker.warm = false;
            }
            std::mem::replace(&mut st.shell, ShellSlot::Down)
        };
        if let ShellSlot::Up(shell) = old {
            shell.kill_and_wait();
        }
        let booted = Shell::boot(self);
        let mut st = lock(&self.state);
        st.resetting = false;
        st.shell = match &booted {
            Ok(shell) => ShellSlot::Up(Arc::clone(shell)),
            Err(_) => ShellSlot::Down,
        };
        st.last_activity = Instant::now();
        self.changed.notify_all();
        booted
            .map(|_| ())
            .map_err(|e| Error::failed(format!("restarting the project shell: {e}")))
    }

    /// Marks the daemon as stopping and hands back the shell to kill; busy with
    /// active jobs (then nothing changes).
    pub(super) fn begin_stop(&self) -> Result<Option<Arc<Shell>>> {
        let mut st = self.wait_quiescent()?;
        if st.active_jobs() > 0 {
            return Err(Error::Busy(st.busy_text()));
        }
        Ok(Self::take_for_exit(&mut st))
    }

    /// Like [`Daemon::begin_stop`] but unconditional (idle exit, home gone).
    pub(super) fn begin_shutdown(&self) -> Option<Arc<Shell>> {
        let mut st = lock(&self.state);
        Self::take_for_exit(&mut st)
    }

    fn take_for_exit(st: &mut State) -> Option<Arc<Shell>> {
        st.stopping = true;
        match std::mem::replace(&mut st.shell, ShellSlot::Down) {
            ShellSlot::Up(shell) => Some(shell),
            _ => None,
        }
    }

    /// The state lock once no boot or reset is in progress.
    fn wait_quiescent(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        let mut st = lock(&self.state);
        loop {
            if st.stopping {
                return Err(Error::failed("the daemon is stopping"));
            }
            if !st.resetting && !matches!(st.shell, ShellSlot::Booting) {
                return Ok(st);
            }
            st = self
                .changed
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Makes the selected workers cold; busy if any selected worker has active jobs.
    pub(super) fn workers_reset(&self, selection: &str) -> Result<Vec<String>> {
        let names = Selection::parse(selection)?.resolve(&kits::registered(&self.cfg.home)?)?;
        let mut st = lock(&self.state);
        let busy: Vec<String> = names
            .iter()
            .filter_map(|n| {
                let active = st.workers.get(n).map_or(0, |w| w.active);
                (active > 0).then(|| {
                    format!(
                        "worker {n} has {active} active job{}",
                        if active == 1 { "" } else { "s" }
                    )
                })
            })
            .collect();
        if !busy.is_empty() {
            return Err(Error::Busy(busy.join(", ")));
        }
        for name in &names {
            if let Some(worker) = st.workers.get_mut(name) {
                worker.warm = false;
            }
        }
        Ok(names)
    }

    /// Warms the selected workers.
    pub(super) fn load(&self, selection: &str) -> Result<Vec<String>> {
        let names = Selection::parse(selection)?.resolve(&kits::registered(&self.cfg.home)?)?;
        for name in &names {
            kits::load(&self.cfg.home, name)?;
        }
        let mut st = lock(&self.state);
        for name in &names {
            st.workers.entry(name.clone()).or_default().warm = true;
        }
        Ok(names)
    }

    pub(super) fn status(&self) -> StatusReport {
        let registered = kits::registered(&self.cfg.home).unwrap_or_default();
        let st = lock(&self.state);
        let shell_up = matches!(&st.shell, ShellSlot::Up(s) if s.is_alive());
        StatusReport {
            home_state: "present".into(),
            daemon: DaemonState {
                state: "running".into(),
                pid: Some(self.cfg.pid),
            },
            shell: ShellState {
                state: if shell_up { "up" } else { "down" }.into(),
                isolation: Some(self.cfg.isolation.label().into()),
            },
            workers: registered
                .into_iter()
                .map(|name| {
                    let worker = st.workers.get(&name);
                    WorkerReport {
                        state: if worker.is_some_and(|w| w.warm) {
                            "warm"
                        } else {
                            "cold"
                        }
                        .into(),
                        active_jobs: worker.map_or(0, |w| w.active),
                        name,
                    }
                })
                .collect(),
            active_jobs: st.active_jobs(),
            workspace: Some(self.cfg.workspace.to_string_lossy().into_owned()),
            backend: BackendReport::in_force(
                &self.cfg.backend,
                &self.cfg.isolation,
                self.cfg.confinement.limits.report(),
                &self.cfg.confinement.etc,
                self.cfg
                    .setid_guard
                    .as_ref()
                    .map(|_| ())
                    .map_err(String::as_str),
                self.cfg.backend.differs_from_files(
                    &self.cfg.home,
                    self.cfg
                        .job_home
                        .as_ref()
                        .map(|h| h.as_os_str().to_owned())
                        .as_ref(),
                ),
            ),
        }
    }

    /// Registers a kit job; its worker becomes warm.
    pub(super) fn kit_job_begin(&self, key: (u64, u64), kit: &str) -> Result<()> {
        let mut st = lock(&self.state);
        if st.stopping {
            return Err(Error::failed("the daemon is stopping"));
        }
        let worker = st.workers.entry(kit.to_string()).or_default();
        worker.warm = true;
        worker.active += 1;
        st.kit_jobs.insert(
            key,
            KitJob {
                kit: kit.to_string(),
                pgid: None,
                cancelled: false,
            },
        );
        st.last_activity = Instant::now();
        Ok(())
    }

    /// Records the running container's process group; false if the job was
    /// cancelled before it started (the caller then kills it).
    pub(super) fn kit_job_started(&self, key: (u64, u64), pgid: Pid) -> bool {
        let mut st = lock(&self.state);
        match st.kit_jobs.get_mut(&key) {
            Some(job) if !job.cancelled => {
                job.pgid = Some(pgid);
                true
            }
            _ => false,
        }
    }

    /// The container's leader has exited (not yet reaped): forget its group.
    pub(super) fn kit_job_exited(&self, key: (u64, u64)) {
        if let Some(job) = lock(&self.state).kit_jobs.get_mut(&key) {
            job.pgid = None;
        }
    }

    pub(super) fn kit_job_end(&self, key: (u64, u64)) {
        let mut st = lock(&self.state);
        if let Some(job) = st.kit_jobs.remove(&key)
            && let Some(worker) = st.workers.get_mut(&job.kit)
        {
            worker.active = worker.active.saturating_sub(1);
        }
        st.last_activity = Instant::now();
    }

    pub(super) fn kit_job_cancel(&self, key: (u64, u64)) {
        let mut st = lock(&self.state);
        if let Some(job) = st.kit_jobs.get_mut(&key) {
            job.cancelled = true;
            if let Some(pgid) = job.pgid {
                util::kill_container(pgid);
            }
        }
    }

    /// Cancels every kit job of one shell (its callers died with it).
    pub(super) fn cancel_kit_jobs_of(&self, shell_id: u64) {
        let keys: Vec<_> = lock(&self.state)
            .kit_jobs
            .keys()
            .filter(|(s, _)| *s == shell_id)
            .copied()
            .collect();
        for key in keys {
            self.kit_job_cancel(key);
        }
    }

    pub(super) fn kill_all_kit_jobs(&self) {
        let keys: Vec<_> = lock(&self.state).kit_jobs.keys().copied().collect();
        for key in keys {
            self.kit_job_cancel(key);
        }
    }

    /// Counts a new connection; false (refuse it) when at the limit or stopping.
    pub(super) fn connection_opened(&self) -> bool {
        let mut st = lock(&self.state);
        if st.connections >= MAX_CONNECTIONS || st.stopping {
            return false;
        }
        st.connections += 1;
        st.last_activity = Instant::now();
        true
    }

    pub(super) fn connection_closed(&self) {
        let mut st = lock(&self.state);
        st.connections = st.connections.saturating_sub(1);
        st.last_activity = Instant::now();
    }

    /// True once nothing has happened for the idle period; marks the daemon stopping
    /// in the same critical section so no job can slip in.
    pub(super) fn idle_expired(&self) -> bool {
        let mut st = lock(&self.state);
        let idle = st.connections == 0
            && st.active_jobs() == 0
            && st.publications == 0
            && !st.resetting
            && !matches!(st.shell, ShellSlot::Booting)
            && st.last_activity.elapsed() >= self.cfg.idle;
        if idle {
            st.stopping = true;
        }
        idle
    }
}
