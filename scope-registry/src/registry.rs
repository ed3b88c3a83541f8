use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::atomic::{read_state_file, write_atomically};
use crate::{DirIdentity, RegistryError};

pub const REGISTRY_FILE: &str = "scopes.json";
pub const REGISTRY_VERSION: u32 = 1;
/// A registry of 128 records with bounded diagnostics stays far below this.
const REGISTRY_LIMIT: u64 = 4 * 1024 * 1024;

/// The persisted lifecycle state of a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeState {
    Starting,
    Ready,
    Resetting,
    Stopping,
    Stopped,
    Removing,
    Failed,
}

impl ScopeState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Ready => "ready",
            Self::Resetting => "resetting",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Removing => "removing",
            Self::Failed => "failed",
        }
    }
}

/// One scope as the registry records it: its state and the identity of its home.
/// Never a path: the path of a scope home is derived from the root and the scope id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeRecord {
    pub state: ScopeState,
    pub home: DirIdentity,
    /// Bounded operator-facing diagnostic of the last failure, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// `scopes.json`. Invariant: the file on disk equals the last value published with
/// [`Registry::publish`]; callers publish after every transition before reporting it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registry {
    pub version: u32,
    pub default: ScopeRecord,
    /// Generated scopes by lowercase UUID.
    #[serde(default)]
    pub scopes: BTreeMap<String, ScopeRecord>,
}

impl Registry {
    pub fn new(default_home: DirIdentity) -> Self {
        Self {
            version: REGISTRY_VERSION,
            default: ScopeRecord {
                state: ScopeState::Ready,
                home: default_home,
                last_error: None,
            },
            scopes: BTreeMap::new(),
        }
    }

    pub fn load(root: &Path) -> Result<Option<Self>, RegistryError> {
        let path = root.join(REGISTRY_FILE);
        let Some(bytes) = read_state_file(&path, REGISTRY_LIMIT)? else {
            return Ok(None);
        };
        let registry: Self =
            serde_json::from_slice(&bytes).map_err(|e| RegistryError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        if registry.version != REGISTRY_VERSION {
            return Err(RegistryError::Corrupt {
                path,
                reason: format!("unsupported registry version {}", registry.version),
            });
        }
        Ok(Some(registry))
    }

    pub fn publish(&self, root: &Path) -> Result<(), RegistryError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| RegistryError::Corrupt {
            path: root.join(REGISTRY_FILE),
            reason: e.to_string(),
        })?;
        write_atomically(root, REGISTRY_FILE, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident() -> DirIdentity {
        DirIdentity {
            dev: 1,
            ino: 2,
            uid: 3,
            mode: 0o40700,
        }
    }

    #[test]
    fn round_trips_and_rejects_unknown_fields() {
        let tmp = tempfile::tempdir().unwrap();
        let mut reg = Registry::new(ident());
        reg.default.state = ScopeState::Stopped;
        reg.publish(tmp.path()).unwrap();
        assert_eq!(Registry::load(tmp.path()).unwrap(), Some(reg));
        std::fs::write(
            tmp.path().join(REGISTRY_FILE),
            br#"{"version":1,"default":{"state":"ready","home":{"dev":1,"ino":2,"uid":3,"mode":1},"path":"/x"}}"#,
        )
        .unwrap();
        assert!(matches!(
            Registry::load(tmp.path()),
            Err(RegistryError::Corrupt { .. })
        ));
    }
}
