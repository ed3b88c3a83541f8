//! Admission control: the global cap on child-holding operations and the per-scope
//! gate that serializes lifecycle work.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::tools::envelope::{ErrorKind, ToolError};

/// At most this many operations hold a child process at once, across every scope and
/// session.
pub const GLOBAL_OPERATION_CAP: usize = 4;

/// The global cap. A permit is owned by the operation and dropped only after its
/// child has been reaped, so the count is of live children, not of requests.
#[derive(Debug, Clone)]
pub struct GlobalCap {
    slots: Arc<Semaphore>,
}

impl Default for GlobalCap {
    fn default() -> Self {
        Self::new(GLOBAL_OPERATION_CAP)
    }
}

impl GlobalCap {
    pub fn new(slots: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(slots)),
        }
    }

    /// Never waits: a full cap is an answer, not a queue.
    pub fn try_admit(&self) -> Result<OwnedSemaphorePermit, ToolError> {
        Arc::clone(&self.slots).try_acquire_owned().map_err(|_| {
            ToolError::new(
                ErrorKind::CapacityExhausted,
                format!(
                    "all {GLOBAL_OPERATION_CAP} operation slots are in use; wait for one to finish or cancel one"
                ),
            )
        })
    }

    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

/// What holds a scope's lifecycle slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Warms workers; runs wait, reads continue.
    Prewarm,
    /// Resets selected workers; runs wait, reads continue.
    WorkersReset,
    /// Whole-scope reset, stop or removal: also refuses while runs are active.
    Exclusive(&'static str),
}

impl Lifecycle {
    fn name(self) -> &'static str {
        match self {
            Self::Prewarm => "prewarm",
            Self::WorkersReset => "workers_reset",
            Self::Exclusive(what) => what,
        }
    }
}

#[derive(Debug, Default)]
struct GateState {
    runs: usize,
    lifecycle: Option<Lifecycle>,
}

/// Per-scope admission. Invariant: `lifecycle` is `Some` for exactly as long as a
/// [`LifecycleGuard`] lives, and `runs` counts live [`RunGuard`]s; an exclusive
/// lifecycle never coexists with a run.
#[derive(Debug, Default)]
pub struct ScopeGate {
    state: Mutex<GateState>,
}

fn busy(message: String) -> ToolError {
    ToolError::new(ErrorKind::ScopeBusy, message)
}

impl ScopeGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // A panic while holding this lock cannot leave the counters half-updated
        // (every critical section is a single field write), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn try_run(self: &Arc<Self>) -> Result<RunGuard, ToolError> {
        let mut state = self.lock();
        if let Some(held) = state.lifecycle {
            return Err(busy(format!(
                "the scope is busy with {}; retry when it finishes",
                held.name()
            )));
        }
        state.runs += 1;
        Ok(RunGuard {
            gate: Arc::clone(self),
        })
    }

    pub fn try_lifecycle(self: &Arc<Self>, what: Lifecycle) -> Result<LifecycleGuard, ToolError> {
        let mut state = self.lock();
        if let Some(held) = state.lifecycle {
            return Err(busy(format!(
                "the scope is busy with {}; {} must wait for it",
                held.name(),
                what.name()
            )));
        }
        if matches!(what, Lifecycle::Exclusive(_)) && state.runs > 0 {
            return Err(busy(format!(
                "{} active command(s) in this scope; {} refuses while work is active",
                state.runs,
                what.name()
            )));
        }
        state.lifecycle = Some(what);
        Ok(LifecycleGuard {
            gate: Arc::clone(self),
        })
    }

    pub fn snapshot(&self) -> (usize, Option<&'static str>) {
        let state = self.lock();
        (state.runs, state.lifecycle.map(Lifecycle::name))
    }
}

#[derive(Debug)]
pub struct RunGuard {
    gate: Arc<ScopeGate>,
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.runs = state.runs.saturating_sub(1);
    }
}

#[derive(Debug)]
pub struct LifecycleGuard {
    gate: Arc<ScopeGate>,
}

impl Drop for LifecycleGuard {
    fn drop(&mut self) {
        self.gate.lock().lifecycle = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_refuses_the_fifth_at_once() {
        let cap = GlobalCap::default();
        let held: Vec<_> = (0..4).map(|_| cap.try_admit().unwrap()).collect();
        assert_eq!(
            cap.try_admit().unwrap_err().kind,
            ErrorKind::CapacityExhausted
        );
        drop(held);
        assert!(cap.try_admit().is_ok());
    }

    #[test]
    fn lifecycle_excludes_runs_and_other_lifecycles() {
        let gate = Arc::new(ScopeGate::default());
        let run = gate.try_run().unwrap();
        assert!(gate.try_lifecycle(Lifecycle::Exclusive("reset")).is_err());
        let warm = gate.try_lifecycle(Lifecycle::Prewarm).unwrap();
        assert_eq!(gate.try_run().unwrap_err().kind, ErrorKind::ScopeBusy);
        assert!(gate.try_lifecycle(Lifecycle::WorkersReset).is_err());
        drop((run, warm));
        assert!(gate.try_lifecycle(Lifecycle::Exclusive("reset")).is_ok());
    }
}
