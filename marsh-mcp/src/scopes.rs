//! The scopes this server manages: where their lifecycle state lives (the managed
//! root's registry, or process memory in legacy mode), their admission gates, and the
//! identity checks every use of a home goes through.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use marsh_scope_registry::{
    AdmissionError, DirIdentity, Event, IDENTITY_RECOVERY, ManagedRoot, Next, Registry,
    RegistryError, ScopeId, ScopeRecord, ScopeState, TransitionError, transition,
    verify_owner_only_dir,
};
use uuid::Uuid;

use crate::error::{ErrorKind, ToolError};
use crate::lock::lock;
use crate::operations::now_ms;
use crate::scope_gate::ScopeGate;

#[derive(Debug)]
enum Store {
    /// Legacy single-scope mode: only the default scope, state in process memory.
    Legacy {
        home: PathBuf,
        record: Mutex<ScopeRecord>,
    },
    /// Managed mode: the leased root's registry is the truth.
    Managed(Mutex<ManagedRoot>),
}

/// One scope as a call sees it at one moment.
#[derive(Debug, Clone)]
pub struct ScopeView {
    pub id: ScopeId,
    pub home: PathBuf,
    /// `None` for a malformed record: its identity is unknown.
    pub record: Option<ScopeRecord>,
}

impl ScopeView {
    pub fn state(&self) -> ScopeState {
        self.record.as_ref().map_or(ScopeState::Failed, |r| r.state)
    }

    pub fn identity_invalid(&self) -> bool {
        self.record.as_ref().is_none_or(|r| r.identity_invalid)
    }
}

#[derive(Debug)]
pub struct ScopeSet {
    store: Store,
    gates: Mutex<HashMap<ScopeId, Arc<ScopeGate>>>,
}

/// A registry failure as a caller sees it: no path (the full error goes to the log),
/// and a displaced root is an identity failure, not a backend one.
fn registry_failure(e: RegistryError) -> ToolError {
    tracing::error!("scope registry: {e}");
    let kind = match e {
        RegistryError::RootDisplaced { .. } => ErrorKind::IdentityInvalid,
        _ => ErrorKind::BackendFailed,
    };
    ToolError::new(kind, format!("scope registry: {}", e.caller_message()))
}

fn transition_failure(id: ScopeId, e: TransitionError) -> ToolError {
    match e {
        TransitionError::Refused { from, event } => ToolError::new(
            ErrorKind::ScopeNotReady,
            format!("scope {id} is {from}; {}", way_out(from, &event)),
        ),
        TransitionError::RecoverFirst { .. } => {
            ToolError::new(ErrorKind::ScopeNotReady, format!("scope {id}: {e}"))
        }
        TransitionError::Admission(a) => admission_failure(a),
    }
}

/// The call that gets a scope in state `from` out of a refused lifecycle `event`.
fn way_out(from: &str, event: &Event) -> &'static str {
    match (from, event) {
        ("ready", Event::BeginRemove) => {
            "only a stopped scope is removed: call scope_stop first, then scope_remove"
        }
        ("starting" | "resetting" | "stopping" | "removing", _) => {
            "another lifecycle step is running on it: wait until scope_status shows ready, stopped or failed (operation_list shows its operation), then call again"
        }
        ("failed", _) => "recover it with scope_reset first (then scope_stop before scope_remove)",
        _ => {
            "scope_status shows its state; scope_reset brings it to ready and scope_stop to stopped"
        }
    }
}

/// The operation name a stopped-scope receipt read records while it runs.
pub const STOPPED_READ: &str = "stopped_read";

/// What a default-scope alias answers while the default scope is stopped.
pub const DEFAULT_STOPPED: &str = "the default scope is stopped (scope_stop default), so its aliases \
(status, results_list, result_get, shell_run, prewarm, workers_reset) are disabled, across restarts too; \
scope_status and scope_results_list/scope_result_get with scope_id default still inspect it, \
and scope_reset default recreates and validates its project shell";

fn admission_failure(e: AdmissionError) -> ToolError {
    let kind = match e {
        AdmissionError::LiveLimit => ErrorKind::LiveScopeLimit,
        AdmissionError::RetainedLimit => ErrorKind::RetainedScopeLimit,
    };
    ToolError::new(kind, e.to_string())
}

pub fn identity_error(id: ScopeId) -> ToolError {
    ToolError::new(
        ErrorKind::IdentityInvalid,
        format!("scope {id}: {IDENTITY_RECOVERY}"),
    )
}

impl ScopeSet {
    pub fn legacy(home: PathBuf, identity: DirIdentity) -> Self {
        Self {
            store: Store::Legacy {
                home,
                record: Mutex::new(ScopeRecord::new(ScopeState::Ready, identity, now_ms())),
            },
            gates: Mutex::default(),
        }
    }

    pub fn managed(root: ManagedRoot) -> Self {
        Self {
            store: Store::Managed(Mutex::new(root)),
            gates: Mutex::default(),
        }
    }

    pub fn mode(&self) -> &'static str {
        match self.store {
            Store::Legacy { .. } => "legacy",
            Store::Managed(_) => "managed",
        }
    }

    pub fn is_managed(&self) -> bool {
        matches!(self.store, Store::Managed(_))
    }

    pub fn gate(&self, id: ScopeId) -> Arc<ScopeGate> {
        Arc::clone(lock(&self.gates).entry(id).or_default())
    }

    /// Parses a caller's `scope_id` and resolves it; unknown ids are `unknown_scope`.
    pub fn resolve(&self, scope_id: &str) -> Result<ScopeView, ToolError> {
        let id = ScopeId::parse(scope_id).ok_or_else(|| {
            ToolError::invalid("scope_id must be `default` or a canonical lowercase UUID")
        })?;
        self.view(id)
    }

    pub fn view(&self, id: ScopeId) -> Result<ScopeView, ToolError> {
        let unknown = || {
            ToolError::new(
                ErrorKind::UnknownScope,
                format!("no scope {id} in this server's registry"),
            )
        };
        match &self.store {
            Store::Legacy { home, record } => match id {
                ScopeId::Default => Ok(ScopeView {
                    id,
                    home: home.clone(),
                    record: Some(lock(record).clone()),
                }),
                ScopeId::Generated(_) => Err(unknown()),
            },
            Store::Managed(root) => {
                let root = lock(root);
                let home = root.scope_home(id);
                let registry = root.registry();
                if let Some(record) = registry.record(id) {
                    return Ok(ScopeView {
                        id,
                        home,
                        record: Some(record.clone()),
                    });
                }
                match id {
                    ScopeId::Generated(uuid) if registry.malformed.contains_key(&uuid) => {
                        Ok(ScopeView {
                            id,
                            home,
                            record: None,
                        })
                    }
                    _ => Err(unknown()),
                }
            }
        }
    }

    /// The default scope for one of its aliases (`status`, `results_list`,
    /// `result_get`, `shell_run`, `prewarm`, `workers_reset`). A stopped default scope
    /// disables every alias (`scope_not_ready`) rather than answering or silently
    /// booting its runtime; only `scope_status`, `scope_results_*` and `scope_reset`
    /// with `scope_id: default` reach it then.
    pub fn default_alias_view(&self) -> Result<ScopeView, ToolError> {
        let view = self.view(ScopeId::Default)?;
        // A receipt read of the stopped scope (`scope_results_*`) persists it as
        // stopping until its exact stop; it is still the stopped scope.
        let stopped_read = view.state() == ScopeState::Stopping
            && view
                .record
                .as_ref()
                .and_then(|r| r.last_operation.as_deref())
                == Some(STOPPED_READ);
        if view.state() == ScopeState::Stopped || stopped_read {
            return Err(ToolError::new(ErrorKind::ScopeNotReady, DEFAULT_STOPPED));
        }
        Ok(view)
    }

    /// Every caller-visible scope, default first. Invalid keys stay hidden.
    pub fn list(&self) -> Vec<ScopeView> {
        let mut ids = vec![ScopeId::Default];
        if let Store::Managed(root) = &self.store {
            let root = lock(root);
            let registry = root.registry();
            let mut generated: Vec<Uuid> = registry
                .scopes
                .keys()
                .chain(registry.malformed.keys())
                .copied()
                .collect();
            generated.sort();
            ids.extend(generated.into_iter().map(ScopeId::Generated));
        }
        ids.into_iter()
            .filter_map(|id| self.view(id).ok())
            .collect()
    }

    /// `(live, retained)` generated scopes and the number of hidden invalid keys.
    pub fn counts(&self) -> (usize, usize, usize) {
        match &self.store {
            Store::Legacy { .. } => (0, 0, 0),
            Store::Managed(root) => {
                let root = lock(root);
                let r = root.registry();
                (
                    r.live_generated(),
                    r.retained_generated(),
                    r.invalid_keys.len(),
                )
            }
        }
    }

    /// The home of `view`, re-verified against the recorded identity right now.
    pub fn verified_home(&self, view: &ScopeView) -> Result<PathBuf, ToolError> {
        let Some(record) = &view.record else {
            return Err(identity_error(view.id));
        };
        if record.identity_invalid {
            return Err(identity_error(view.id));
        }
        match verify_owner_only_dir(&view.home) {
            Ok(found) if found == record.home => Ok(view.home.clone()),
            _ => {
                self.isolate(view.id);
                Err(identity_error(view.id))
            }
        }
    }

    /// The verified home of a ready scope; anything else is a typed refusal.
    pub fn ready_home(&self, view: &ScopeView) -> Result<PathBuf, ToolError> {
        if view.identity_invalid() {
            return Err(identity_error(view.id));
        }
        match view.state() {
            ScopeState::Ready => self.verified_home(view),
            other => Err(ToolError::new(
                ErrorKind::ScopeNotReady,
                match view.id {
                    ScopeId::Default => format!(
                        "the default scope is {}; the default-scope tools are disabled until scope_reset default revives it",
                        other.as_str()
                    ),
                    id => format!(
                        "scope {id} is {}; only a ready scope runs work (scope_reset recovers it)",
                        other.as_str()
                    ),
                },
            )),
        }
    }

    /// A home that no longer verifies is isolated at once: failed, identity-invalid.
    fn isolate(&self, id: ScopeId) {
        let _ = self.update(id, |record| {
            if !record.identity_invalid {
                record.identity_invalid = true;
                record.fail("verify", &format!("the scope home changed identity while marsh-mcp was running; {IDENTITY_RECOVERY}"));
            }
            Ok(())
        });
    }

    fn update<T>(
        &self,
        id: ScopeId,
        change: impl FnOnce(&mut ScopeRecord) -> Result<T, ToolError>,
    ) -> Result<T, ToolError> {
        match &self.store {
            Store::Legacy { record, .. } => {
                let mut current = lock(record);
                let mut next = current.clone();
                let out = change(&mut next)?;
                *current = next;
                Ok(out)
            }
            Store::Managed(root) => lock(root).update(|registry: &mut Registry| {
                let record = registry.record_mut(id).ok_or_else(|| {
                    ToolError::new(ErrorKind::UnknownScope, format!("no scope {id}"))
                })?;
                change(record)
            }),
        }
    }

    /// Applies a lifecycle event and persists it before returning. `note` records the
    /// operation and, on failure, its diagnostic.
    pub fn apply(
        &self,
        id: ScopeId,
        event: Event,
        operation: &str,
        error: Option<&str>,
    ) -> Result<ScopeState, ToolError> {
        let apply_to = |registry: &mut Registry| -> Result<ScopeState, ToolError> {
            let next = registry
                .apply(id, event)
                .map_err(|e| transition_failure(id, e))?;
            match next {
                Next::Deleted => Ok(ScopeState::Removing),
                Next::State(state) => {
                    if let Some(record) = registry.record_mut(id) {
                        record.last_operation = Some(operation.to_owned());
                        if let Some(error) = error {
                            record.last_error = Some(
                                error
                                    .chars()
                                    .take(marsh_scope_registry::DIAGNOSTIC_LIMIT)
                                    .collect(),
                            );
                        } else if state != ScopeState::Failed {
                            record.last_error = None;
                        }
                    }
                    Ok(state)
                }
            }
        };
        match &self.store {
            Store::Legacy { record, .. } => {
                // Legacy mode has one record and no registry file; reuse the same
                // transition table on a throwaway registry around it.
                let mut current = lock(record);
                let mut registry = Registry::new(current.home);
                registry.default = current.clone();
                let state = apply_to(&mut registry)?;
                *current = registry.default;
                Ok(state)
            }
            Store::Managed(root) => lock(root).update(|registry: &mut Registry| apply_to(registry)),
        }
    }

    /// Whether `event` may be applied now, without applying it (checks before any child).
    pub fn check(&self, view: &ScopeView, event: Event) -> Result<(), ToolError> {
        let Some(record) = &view.record else {
            return Err(identity_error(view.id));
        };
        if record.identity_invalid {
            return Err(identity_error(view.id));
        }
        transition(record.state, event, record.identity_invalid)
            .map(|_| ())
            .map_err(|e| transition_failure(view.id, e))
    }

    /// Creates a generated scope: admission, a fresh owner-only home, and a persisted
    /// `starting` record, in that order. Nothing is created when admission fails.
    pub fn create(&self) -> Result<ScopeView, ToolError> {
        let Store::Managed(root) = &self.store else {
            return Err(ToolError::new(
                ErrorKind::Disabled,
                "scope_start needs managed mode (--scope-root); this server runs a single legacy scope",
            ));
        };
        let mut root = lock(root);
        root.registry().admit().map_err(admission_failure)?;
        let uuid = Uuid::new_v4();
        let identity = root.create_generated_home(uuid).map_err(registry_failure)?;
        root.update(|registry: &mut Registry| {
            registry
                .insert_starting(uuid, identity, now_ms())
                .map_err(admission_failure)
        })?;
        let id = ScopeId::Generated(uuid);
        Ok(ScopeView {
            id,
            home: root.scope_home(id),
            record: root.registry().record(id).cloned(),
        })
    }

    /// The legacy home, in legacy mode.
    pub fn legacy_home(&self) -> Option<PathBuf> {
        match &self.store {
            Store::Legacy { home, .. } => Some(home.clone()),
            Store::Managed(_) => None,
        }
    }

    /// Whether the managed root is still the directory claimed at startup (always
    /// true in legacy mode). A displaced root refuses every later write.
    pub fn root_in_place(&self) -> Result<(), ToolError> {
        match &self.store {
            Store::Legacy { .. } => Ok(()),
            Store::Managed(root) => lock(root).check_in_place().map_err(registry_failure),
        }
    }

    /// The directory holding generated homes (for removal), in managed mode.
    pub fn root_path(&self) -> Option<PathBuf> {
        match &self.store {
            Store::Legacy { .. } => None,
            Store::Managed(root) => Some(lock(root).path().to_path_buf()),
        }
    }
}

impl From<RegistryError> for ToolError {
    fn from(e: RegistryError) -> Self {
        registry_failure(e)
    }
}

/// The file name of a generated home inside the root.
pub fn home_name(home: &Path) -> Option<String> {
    home.file_name().and_then(|n| n.to_str()).map(str::to_owned)
}
