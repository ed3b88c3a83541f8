use std::os::fd::BorrowedFd;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::RegistryError;
use crate::fs_safety::atomic::{read_state_file, write_atomically_at};

pub const BINDING_FILE: &str = "workspace.json";
const BINDING_LIMIT: u64 = 64 * 1024;

/// `workspace.json`: the one workspace (canonical path and filesystem identity) a
/// development root serves. Written once, when the root is first claimed; never
/// rewritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceBinding {
    pub version: u32,
    pub workspace: String,
    pub dev: u64,
    pub ino: u64,
}

impl WorkspaceBinding {
    pub fn new(workspace: &str, dev: u64, ino: u64) -> Self {
        Self {
            version: 1,
            workspace: workspace.to_owned(),
            dev,
            ino,
        }
    }

    pub(crate) fn load(root: &Path) -> Result<Option<Self>, RegistryError> {
        let path = root.join(BINDING_FILE);
        let Some(bytes) = read_state_file(&path, BINDING_LIMIT)? else {
            return Ok(None);
        };
        let binding: Self = serde_json::from_slice(&bytes).map_err(|e| RegistryError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if binding.version != 1 {
            return Err(RegistryError::Corrupt {
                path,
                reason: format!("unsupported binding version {}", binding.version),
            });
        }
        Ok(Some(binding))
    }

    pub(crate) fn publish(&self, dir: BorrowedFd<'_>, root: &Path) -> Result<(), RegistryError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| RegistryError::Corrupt {
            path: root.join(BINDING_FILE),
            reason: e.to_string(),
        })?;
        write_atomically_at(dir, root, BINDING_FILE, &bytes)
    }

    pub(crate) fn verify(&self, root: &Path, wanted: &Self) -> Result<(), RegistryError> {
        if self == wanted {
            return Ok(());
        }
        Err(RegistryError::BoundElsewhere {
            path: root.join(BINDING_FILE),
            bound: self.workspace.clone(),
            bound_dev: self.dev,
            bound_ino: self.ino,
            requested: wanted.workspace.clone(),
        })
    }
}
