//! The one admission path. Every tool that starts work asks an [`Admitter`] (built by
//! `ServerContext::admission`) for a [`Ticket`], and only a ticket launches an
//! operation (`Ticket::launch`, in `launch`). The order of the checks is this module's
//! code, stated once:
//!
//! 1. the scope's gate — a scope held by a lifecycle operation is `scope_busy`
//!    (retryable) whatever its state, so the gate comes before any state check;
//! 2. the scope re-read under the gate — no other lifecycle step can change its
//!    persisted state while the gate is held;
//! 3. the state the work needs and the home re-verified against its recorded identity
//!    (`scope_not_ready`, `identity_invalid`, `live_scope_limit`, …);
//! 4. a global operation slot, when the work holds a child (`capacity_exhausted`);
//! 5. the pinned executables, when the work runs marsh (`executable_changed`);
//! 6. the transitional state persisted, last, so that every refusal above changed
//!    nothing on disk.
//!
//! A ticket owns what it took (gate guard, slot) until the operation it launches has
//! reaped its last child; a ticket dropped unlaunched releases them at once. A launch
//! that fails after step 6 marks the scope failed (recoverable), never leaves it in a
//! transitional state. Callers launch right after admitting, with no fallible step
//! between.
//!
//! Admission sees only what it decides on — the scopes, the global cap and a check of
//! the pinned executables — so its order is unit-tested without real executables (a
//! fake [`PinCheck`]). Rejected alternative: methods on the whole server context, which
//! made admission, the context, the scopes and the launcher import each other.

use std::path::{Path, PathBuf};

use marsh_scope_registry::{Event, ScopeId, ScopeState};
use tokio::sync::OwnedSemaphorePermit;

use crate::error::ToolError;
use crate::global_cap::GlobalCap;
use crate::scope_gate::{Lifecycle, LifecycleGuard, RunGuard};
use crate::scopes::ScopeSet;
use crate::tool_table::ToolName;

/// Step 5: the pinned executables are still the ones validated at startup.
pub(crate) trait PinCheck {
    fn revalidate(&self) -> Result<(), ToolError>;
}

impl PinCheck for crate::marsh::MarshDriver {
    fn revalidate(&self) -> Result<(), ToolError> {
        crate::marsh::MarshDriver::revalidate(self)
    }
}

/// What a tool asks to do in one scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// `shell_run`/`scope_run`: a command in a ready scope. Runs share the scope with
    /// each other; only the global cap limits them.
    Run,
    /// `prewarm`/`workers_reset`: the scope's lifecycle slot in a ready scope. Runs
    /// are refused meanwhile; reads continue.
    Workers(WorkerStep),
    /// `scope_reset`/`scope_stop`/`scope_remove`: exclusive (refused while runs are
    /// active); the step's event must be allowed from the current state.
    Lifecycle(LifecycleStep),
    /// A receipt read of a stopped scope: exclusive; the read is always followed by an
    /// exact stop, so the scope is persisted as stopping while it runs.
    StoppedRead,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkerStep {
    Prewarm,
    WorkersReset,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LifecycleStep {
    Reset,
    Stop,
    Remove,
}

impl LifecycleStep {
    /// The tool's name, which is also the operation name the registry records.
    fn name(self) -> &'static str {
        match self {
            Self::Reset => ToolName::ScopeReset,
            Self::Stop => ToolName::ScopeStop,
            Self::Remove => ToolName::ScopeRemove,
        }
        .as_str()
    }

    fn begin_event(self) -> Event {
        match self {
            Self::Reset => Event::BeginReset,
            Self::Stop => Event::BeginStop,
            Self::Remove => Event::BeginRemove,
        }
    }
}

impl Admission {
    /// What the scope's gate must grant.
    fn claim(self) -> Claim {
        match self {
            Self::Run => Claim::Run,
            Self::Workers(WorkerStep::Prewarm) => Claim::Lifecycle(Lifecycle::Prewarm),
            Self::Workers(WorkerStep::WorkersReset) => Claim::Lifecycle(Lifecycle::WorkersReset),
            Self::Lifecycle(step) => Claim::Lifecycle(Lifecycle::Exclusive(step.name())),
            Self::StoppedRead => {
                Claim::Lifecycle(Lifecycle::Exclusive("a stopped-scope receipt read"))
            }
        }
    }

    /// The transitional event persisted at admission, with the operation it names.
    fn begin(self) -> Option<(Event, &'static str)> {
        match self {
            Self::Run | Self::Workers(_) => None,
            Self::Lifecycle(step) => Some((step.begin_event(), step.name())),
            Self::StoppedRead => Some((Event::BeginStoppedRead, crate::scopes::STOPPED_READ)),
        }
    }

    /// Whether the work runs marsh children (and so needs a slot and fresh pins).
    /// Removal is an in-process walk and holds no child.
    fn runs_marsh(self) -> bool {
        match self {
            Self::Run
            | Self::Workers(_)
            | Self::StoppedRead
            | Self::Lifecycle(LifecycleStep::Reset | LifecycleStep::Stop) => true,
            Self::Lifecycle(LifecycleStep::Remove) => false,
        }
    }
}

enum Claim {
    Run,
    Lifecycle(Lifecycle),
}

/// What a ticket holds on its scope; the guards are held only to be dropped.
#[derive(Debug)]
pub(crate) enum ScopeHold {
    /// Host work (qualification) holds no scope.
    Nothing,
    Run {
        _guard: RunGuard,
    },
    Lifecycle {
        _guard: LifecycleGuard,
    },
}

/// Admitted work, not yet launched.
#[derive(Debug)]
pub(crate) struct Ticket {
    /// The verified home (the workspace for host work).
    pub home: PathBuf,
    /// `default`, a scope UUID, or `host`.
    label: String,
    /// The scope's persisted state as admission found it under the gate (`None` for a
    /// new scope or host work): a lifecycle step's outcome may depend on it.
    pub from: Option<ScopeState>,
    /// The scope whose transitional state this admission persisted, with the operation
    /// name: if the launch fails, that state is failed rather than left in flight.
    begun: Option<(ScopeId, &'static str)>,
    permit: Option<OwnedSemaphorePermit>,
    hold: ScopeHold,
}

/// What a ticket hands the launcher: the operation's home and label, its holds, and
/// the scope whose transitional state must become failed if the launch fails.
pub(crate) struct TicketParts {
    pub home: PathBuf,
    pub label: String,
    pub begun: Option<(ScopeId, &'static str)>,
    pub held: (Option<OwnedSemaphorePermit>, ScopeHold),
}

impl Ticket {
    pub(crate) fn into_parts(self) -> TicketParts {
        TicketParts {
            home: self.home,
            label: self.label,
            begun: self.begun,
            held: (self.permit, self.hold),
        }
    }
}

/// Admission over the three things it decides on. Borrowed for one call.
pub(crate) struct Admitter<'a> {
    pub scopes: &'a ScopeSet,
    pub cap: &'a GlobalCap,
    pub pins: &'a dyn PinCheck,
    /// Where host work runs.
    pub workspace: &'a Path,
}

impl Admitter<'_> {
    /// Admits `admission` in scope `id`; see the module doc for the order of checks.
    pub(crate) fn admit(&self, id: ScopeId, admission: Admission) -> Result<Ticket, ToolError> {
        // 1. The gate.
        let gate = self.scopes.gate(id);
        let hold = match admission.claim() {
            Claim::Run => ScopeHold::Run {
                _guard: gate.try_run()?,
            },
            Claim::Lifecycle(what) => ScopeHold::Lifecycle {
                _guard: gate.try_lifecycle(what)?,
            },
        };
        // 2. The scope as it is now.
        let view = self.scopes.view(id)?;
        // 3. The state the work needs, and the verified home.
        let home = match admission {
            Admission::Run | Admission::Workers(_) => self.scopes.ready_home(&view)?,
            Admission::Lifecycle(_) | Admission::StoppedRead => {
                if let Some((event, _)) = admission.begin() {
                    self.scopes.check(&view, event)?;
                }
                self.scopes.verified_home(&view)?
            }
        };
        // 4. and 5. A slot and fresh pins for work that runs marsh.
        let permit = if admission.runs_marsh() {
            let permit = self.cap.try_admit()?;
            self.pins.revalidate()?;
            Some(permit)
        } else {
            None
        };
        // 6. The transitional state, persisted last.
        if let Some((event, name)) = admission.begin() {
            self.scopes.apply(id, event, name, None)?;
        }
        Ok(Ticket {
            label: id.to_string(),
            from: Some(view.state()),
            begun: admission.begin().map(|(_, name)| (id, name)),
            home,
            permit,
            hold,
        })
    }

    /// Admits the creation of a generated scope: a slot and fresh pins first, then the
    /// scope (live/retained limits, a fresh owner-only home, a persisted `starting`
    /// record), then its gate — so a refusal creates nothing.
    pub(crate) fn admit_new_scope(&self) -> Result<(ScopeId, Ticket), ToolError> {
        let permit = self.cap.try_admit()?;
        self.pins.revalidate()?;
        let view = self.scopes.create()?;
        let id = view.id;
        let guard = self
            .scopes
            .gate(id)
            .try_lifecycle(Lifecycle::Exclusive(ToolName::ScopeStart.as_str()))?;
        let ticket = Ticket {
            label: id.to_string(),
            from: None,
            begun: Some((id, ToolName::ScopeStart.as_str())),
            home: view.home,
            permit: Some(permit),
            hold: ScopeHold::Lifecycle { _guard: guard },
        };
        Ok((id, ticket))
    }

    /// Admits host work (qualification) in the workspace: a slot only. It runs no
    /// marsh and touches no scope.
    pub(crate) fn admit_host(&self) -> Result<Ticket, ToolError> {
        let permit = self.cap.try_admit()?;
        Ok(Ticket {
            label: "host".into(),
            from: None,
            begun: None,
            home: self.workspace.to_path_buf(),
            permit: Some(permit),
            hold: ScopeHold::Nothing,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use marsh_scope_registry::ManagedRoot;

    use super::*;
    use crate::error::ErrorKind;

    /// Counts revalidations; fails them when `changed`.
    #[derive(Default)]
    struct FakePins {
        calls: AtomicUsize,
        changed: bool,
    }

    impl PinCheck for FakePins {
        fn revalidate(&self) -> Result<(), ToolError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.changed {
                true => Err(ToolError::new(ErrorKind::ExecutableChanged, "changed")),
                false => Ok(()),
            }
        }
    }

    /// A managed root in a temp dir (its default scope ready), a cap of 4 and fake pins.
    struct Fixture {
        _dir: tempfile::TempDir,
        workspace: PathBuf,
        scopes: ScopeSet,
        cap: GlobalCap,
        pins: FakePins,
    }

    impl Fixture {
        fn new(pins: FakePins) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let workspace = dir.path().join("ws");
            std::fs::create_dir(&workspace).unwrap();
            let meta = std::fs::metadata(&workspace).unwrap();
            let root = ManagedRoot::open(
                &dir.path().join("root"),
                workspace.to_str().unwrap(),
                meta.dev(),
                meta.ino(),
            )
            .unwrap();
            let fixture = Self {
                _dir: dir,
                workspace,
                scopes: ScopeSet::managed(root),
                cap: GlobalCap::default(),
                pins,
            };
            assert_eq!(fixture.state(ScopeId::Default), ScopeState::Ready);
            fixture
        }

        fn admitter(&self) -> Admitter<'_> {
            Admitter {
                scopes: &self.scopes,
                cap: &self.cap,
                pins: &self.pins,
                workspace: &self.workspace,
            }
        }

        fn admit(&self, id: ScopeId, admission: Admission) -> Result<Ticket, ErrorKind> {
            self.admitter().admit(id, admission).map_err(|e| e.kind)
        }

        fn state(&self, id: ScopeId) -> ScopeState {
            self.scopes.view(id).unwrap().state()
        }

        fn revalidations(&self) -> usize {
            self.pins.calls.load(Ordering::SeqCst)
        }
    }

    const STOP: Admission = Admission::Lifecycle(LifecycleStep::Stop);

    #[test]
    fn a_held_gate_is_busy_before_any_state_check() {
        let fx = Fixture::new(FakePins::default());
        let (id, starting) = fx.admitter().admit_new_scope().unwrap();
        assert_eq!(fx.state(id), ScopeState::Starting);
        // The gate answers first: busy (retryable), not "not ready".
        assert_eq!(
            fx.admit(id, Admission::Run).unwrap_err(),
            ErrorKind::ScopeBusy
        );
        assert_eq!(fx.admit(id, STOP).unwrap_err(), ErrorKind::ScopeBusy);
        drop(starting);
        assert_eq!(
            fx.admit(id, Admission::Run).unwrap_err(),
            ErrorKind::ScopeNotReady
        );
        assert_eq!(
            fx.revalidations(),
            1,
            "only the admitted start checked pins"
        );
        assert_eq!(fx.cap.available(), 4);
    }

    #[test]
    fn a_full_cap_refuses_before_pins_and_persists_nothing() {
        let fx = Fixture::new(FakePins::default());
        let held: Vec<_> = (0..4).map(|_| fx.cap.try_admit().unwrap()).collect();
        assert_eq!(
            fx.admit(ScopeId::Default, STOP).unwrap_err(),
            ErrorKind::CapacityExhausted
        );
        assert_eq!(
            fx.admitter().admit_new_scope().unwrap_err().kind,
            ErrorKind::CapacityExhausted
        );
        assert_eq!(
            fx.admitter().admit_host().unwrap_err().kind,
            ErrorKind::CapacityExhausted
        );
        assert_eq!(fx.revalidations(), 0);
        assert_eq!(fx.state(ScopeId::Default), ScopeState::Ready);
        assert_eq!(fx.scopes.list().len(), 1, "no scope was created");
        drop(held);
        // The refused step released the gate it had taken.
        assert!(fx.admit(ScopeId::Default, Admission::Run).is_ok());
    }

    #[test]
    fn changed_pins_release_the_slot_and_persist_nothing() {
        let fx = Fixture::new(FakePins {
            changed: true,
            ..FakePins::default()
        });
        assert_eq!(
            fx.admit(ScopeId::Default, STOP).unwrap_err(),
            ErrorKind::ExecutableChanged
        );
        assert_eq!(
            fx.admitter().admit_new_scope().unwrap_err().kind,
            ErrorKind::ExecutableChanged
        );
        assert_eq!(fx.revalidations(), 2);
        assert_eq!(fx.cap.available(), 4);
        assert_eq!(fx.state(ScopeId::Default), ScopeState::Ready);
        assert_eq!(fx.scopes.list().len(), 1, "no scope was created");
    }

    #[test]
    fn removal_runs_no_marsh_and_needs_neither_a_slot_nor_pins() {
        let mut fx = Fixture::new(FakePins::default());
        let (id, started) = fx.admitter().admit_new_scope().unwrap();
        drop(started);
        for event in [Event::Succeeded, Event::BeginStop, Event::Succeeded] {
            fx.scopes.apply(id, event, "test", None).unwrap();
        }
        assert_eq!(fx.state(id), ScopeState::Stopped);
        fx.pins.changed = true;
        let held: Vec<_> = (0..4).map(|_| fx.cap.try_admit().unwrap()).collect();
        let removal = fx
            .admit(id, Admission::Lifecycle(LifecycleStep::Remove))
            .unwrap();
        assert!(
            removal.into_parts().held.0.is_none(),
            "removal holds no slot"
        );
        assert_eq!(fx.state(id), ScopeState::Removing);
        assert_eq!(fx.revalidations(), 1, "only the start checked pins");
        drop(held);
    }

    #[test]
    fn a_lifecycle_step_persists_its_state_last_and_holds_the_scope_and_a_slot() {
        let fx = Fixture::new(FakePins::default());
        let stop = fx.admit(ScopeId::Default, STOP).unwrap();
        assert_eq!(stop.from, Some(ScopeState::Ready));
        assert_eq!(fx.state(ScopeId::Default), ScopeState::Stopping);
        assert_eq!(fx.cap.available(), 3);
        assert_eq!(fx.revalidations(), 1);
        assert_eq!(
            fx.admit(ScopeId::Default, Admission::Run).unwrap_err(),
            ErrorKind::ScopeBusy
        );
        let parts = stop.into_parts();
        assert_eq!(parts.begun, Some((ScopeId::Default, "scope_stop")));
        drop(parts);
        assert_eq!(fx.cap.available(), 4);
    }

    #[test]
    fn runs_share_a_scope_and_exclusive_steps_wait_for_them() {
        let fx = Fixture::new(FakePins::default());
        let runs = [
            fx.admit(ScopeId::Default, Admission::Run).unwrap(),
            fx.admit(ScopeId::Default, Admission::Run).unwrap(),
        ];
        assert_eq!(fx.cap.available(), 2);
        assert_eq!(
            fx.admit(ScopeId::Default, Admission::Lifecycle(LifecycleStep::Reset))
                .unwrap_err(),
            ErrorKind::ScopeBusy
        );
        // A worker step may join running commands; new runs then wait for it.
        let prewarm = fx
            .admit(ScopeId::Default, Admission::Workers(WorkerStep::Prewarm))
            .unwrap();
        assert_eq!(
            fx.admit(
                ScopeId::Default,
                Admission::Workers(WorkerStep::WorkersReset)
            )
            .unwrap_err(),
            ErrorKind::ScopeBusy
        );
        drop(runs);
        assert_eq!(
            fx.state(ScopeId::Default),
            ScopeState::Ready,
            "prewarm persists nothing"
        );
        assert_eq!(
            fx.admit(ScopeId::Default, Admission::Run).unwrap_err(),
            ErrorKind::ScopeBusy
        );
        drop(prewarm);
        let host = fx.admitter().admit_host().unwrap();
        assert_eq!(host.home, fx.workspace);
        assert_eq!(fx.cap.available(), 3);
    }
}
