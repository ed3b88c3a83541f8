//! The per-scope gate: runs share a scope, lifecycle work serializes, and exclusive
//! lifecycle work also waits for the runs to end. Never waits: a held gate is a
//! `scope_busy` answer.

use std::sync::{Arc, Mutex};

use crate::error::{ErrorKind, ToolError};
use crate::lock::lock;

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
pub(crate) struct ScopeGate {
    state: Mutex<GateState>,
}

fn busy(message: String) -> ToolError {
    ToolError::new(ErrorKind::ScopeBusy, message)
}

impl ScopeGate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Every critical section is a single field write (see crate::lock).
        lock(&self.state)
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
