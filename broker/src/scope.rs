//! The default scope: its home, its admission gate and where its lifecycle state
//! lives (the managed root's registry, or process memory in legacy mode).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use marsh_scope_registry::{DirIdentity, ManagedRoot, ScopeState, verify_owner_only_dir};

use crate::admission::ScopeGate;
use crate::tools::envelope::{ErrorKind, ToolError};

pub const DEFAULT_SCOPE_ID: &str = "default";

#[derive(Debug)]
pub enum StateStore {
    /// Legacy single-scope mode: lifecycle state lasts only for this process.
    ProcessLocal(Mutex<ScopeState>),
    /// Managed mode: the registry in the leased root is the truth.
    Managed(Mutex<ManagedRoot>),
}

#[derive(Debug)]
pub struct Scope {
    pub id: &'static str,
    home: PathBuf,
    /// Identity of `home` captured at startup; every use re-checks it.
    home_identity: DirIdentity,
    pub gate: Arc<ScopeGate>,
    store: StateStore,
}

impl Scope {
    pub fn new(home: PathBuf, home_identity: DirIdentity, store: StateStore) -> Self {
        Self {
            id: DEFAULT_SCOPE_ID,
            home,
            home_identity,
            gate: Arc::new(ScopeGate::default()),
            store,
        }
    }

    pub fn state(&self) -> ScopeState {
        match &self.store {
            StateStore::ProcessLocal(state) => *state.lock().unwrap_or_else(|p| p.into_inner()),
            StateStore::Managed(root) => {
                root.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .registry()
                    .default
                    .state
            }
        }
    }

    pub fn mode(&self) -> &'static str {
        match &self.store {
            StateStore::ProcessLocal(_) => "legacy",
            StateStore::Managed(_) => "managed",
        }
    }

    /// Verifies the home is still the directory recorded at startup.
    pub fn verified_home(&self) -> Result<&Path, ToolError> {
        let found = verify_owner_only_dir(&self.home).map_err(|e| {
            ToolError::new(
                ErrorKind::IdentityInvalid,
                format!("the scope home failed verification: {e}; restore the exact original directory, or restart marsh-mcp on a new empty root"),
            )
        })?;
        if found != self.home_identity {
            return Err(ToolError::new(
                ErrorKind::IdentityInvalid,
                "the scope home was replaced since marsh-mcp started; it is not used. Restore the exact original directory, or restart marsh-mcp on a new empty root",
            ));
        }
        Ok(&self.home)
    }

    /// The home, when the scope may run work now.
    pub fn ready_home(&self) -> Result<&Path, ToolError> {
        match self.state() {
            ScopeState::Ready => self.verified_home(),
            other => Err(ToolError::new(
                ErrorKind::ScopeNotReady,
                format!(
                    "the default scope is {}; the default-scope tools are disabled until scope_reset default revives it",
                    other.as_str()
                ),
            )),
        }
    }
}
