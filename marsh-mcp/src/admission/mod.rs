//! The one admission path. Every tool that starts work asks [`ServerContext::admit`]
//! (or its two scope-less siblings) for a [`Ticket`], and only a ticket launches an
//! operation. The order of the checks is this module's code, stated once:
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

mod cap;
mod gate;

use std::path::PathBuf;
use std::sync::Arc;

use marsh_scope_registry::{Event, ScopeId, ScopeState};
use tokio::sync::OwnedSemaphorePermit;

use crate::context::ServerContext;
use crate::error::ToolError;
use crate::launch::{self, Finish, Plan};
use crate::operations::{Operation, SessionId};
use crate::tool_name::ToolName;

pub(crate) use cap::{GLOBAL_OPERATION_CAP, GlobalCap};
pub(crate) use gate::{Lifecycle, ScopeGate};
use gate::{LifecycleGuard, RunGuard};

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
enum ScopeHold {
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

impl Ticket {
    /// Starts `plan` as an operation owned by `session`; the ticket's holds live until
    /// its last child is reaped.
    pub(crate) fn launch(
        self,
        ctx: &Arc<ServerContext>,
        session: SessionId,
        plan: Plan,
        finish: Option<Finish>,
    ) -> Result<Arc<Operation>, ToolError> {
        let Ticket {
            home,
            label,
            from: _,
            begun,
            permit,
            hold,
        } = self;
        let op = Operation::new(session, plan.kind, label, plan.timeout);
        let launched = launch::start(ctx, op, home, plan, (permit, hold), finish);
        if let (Err(error), Some((id, name))) = (&launched, begun) {
            let why = format!("the operation could not start: {}", error.message);
            let _ = ctx.scopes.apply(id, Event::Failed, name, Some(&why));
        }
        launched
    }
}

impl ServerContext {
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
            self.driver.revalidate()?;
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
        self.driver.revalidate()?;
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
            home: self.workspace.clone(),
            permit: Some(permit),
            hold: ScopeHold::Nothing,
        })
    }
}
