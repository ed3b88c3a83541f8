use std::path::{Path, PathBuf};

use crate::binding::WorkspaceBinding;
use crate::lease::LEASE_FILE;
use crate::{
    DirIdentity, Lease, Registry, RegistryError, ensure_owner_only_dir, verify_owner_only_dir,
};

/// The reserved home of the default scope inside a managed root.
pub const DEFAULT_HOME_NAME: &str = "default";

/// A managed development root, leased, bound to one workspace and with its registry
/// loaded. Invariant: while this value lives, this process is the only owner of the
/// root (the lease), and `registry` equals `scopes.json`.
#[derive(Debug)]
pub struct ManagedRoot {
    path: PathBuf,
    identity: DirIdentity,
    lease: Lease,
    registry: Registry,
}

impl ManagedRoot {
    /// Claims `root` for `workspace` in the only safe order: owner-only root, then the
    /// lease (so two starters cannot both pass the checks below), then the binding,
    /// then the default home and the registry.
    pub fn open(
        root: &Path,
        workspace: &str,
        workspace_dev: u64,
        workspace_ino: u64,
    ) -> Result<Self, RegistryError> {
        let identity = ensure_owner_only_dir(root)?;
        let lease = Lease::acquire(root)?;
        let wanted = WorkspaceBinding::new(workspace, workspace_dev, workspace_ino);
        match WorkspaceBinding::load(root)? {
            Some(bound) => bound.verify(root, &wanted)?,
            None => {
                if has_entries_besides_lease(root)? {
                    return Err(RegistryError::Unbound {
                        path: root.to_owned(),
                    });
                }
                wanted.publish(root)?;
            }
        }
        let default_home = root.join(DEFAULT_HOME_NAME);
        let registry = match Registry::load(root)? {
            Some(registry) => {
                // A recorded home is never recreated: a missing or replaced one is an
                // identity failure for the operator, not something to paper over.
                let found = verify_owner_only_dir(&default_home)?;
                if found != registry.default.home {
                    return Err(RegistryError::IdentityChanged { path: default_home });
                }
                registry
            }
            None => {
                let home = ensure_owner_only_dir(&default_home)?;
                let registry = Registry::new(home);
                registry.publish(root)?;
                registry
            }
        };
        Ok(Self {
            path: root.to_owned(),
            identity,
            lease,
            registry,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn identity(&self) -> DirIdentity {
        self.identity
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn default_home(&self) -> PathBuf {
        self.path.join(DEFAULT_HOME_NAME)
    }

    /// Applies `change` to a copy of the registry, publishes the copy, and only then
    /// makes it the in-memory state, so memory never runs ahead of disk.
    pub fn update(&mut self, change: impl FnOnce(&mut Registry)) -> Result<(), RegistryError> {
        let mut next = self.registry.clone();
        change(&mut next);
        next.publish(&self.path)?;
        self.registry = next;
        Ok(())
    }
}

fn has_entries_besides_lease(root: &Path) -> Result<bool, RegistryError> {
    let entries = std::fs::read_dir(root).map_err(|source| RegistryError::Inspect {
        path: root.to_owned(),
        source,
    })?;
    for entry in entries {
        let entry = entry.map_err(|source| RegistryError::Inspect {
            path: root.to_owned(),
            source,
        })?;
        if entry.file_name() != LEASE_FILE {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScopeState;

    #[test]
    fn claims_binds_and_reopens() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let mut opened = ManagedRoot::open(&root, "/ws", 1, 2).unwrap();
        opened
            .update(|r| r.default.state = ScopeState::Stopped)
            .unwrap();
        assert!(matches!(
            ManagedRoot::open(&root, "/ws", 1, 2),
            Err(RegistryError::Leased { .. })
        ));
        drop(opened);
        let again = ManagedRoot::open(&root, "/ws", 1, 2).unwrap();
        assert_eq!(again.registry().default.state, ScopeState::Stopped);
        drop(again);
        assert!(matches!(
            ManagedRoot::open(&root, "/other", 1, 3),
            Err(RegistryError::BoundElsewhere { .. })
        ));
    }

    #[test]
    fn refuses_populated_unbound_root_and_replaced_default_home() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        ensure_owner_only_dir(&root).unwrap();
        std::fs::write(root.join("stray"), b"x").unwrap();
        assert!(matches!(
            ManagedRoot::open(&root, "/ws", 1, 2),
            Err(RegistryError::Unbound { .. })
        ));
        let root2 = tmp.path().join("root2");
        drop(ManagedRoot::open(&root2, "/ws", 1, 2).unwrap());
        // Build the impostor while the original still exists so its inode differs.
        let impostor = root2.join("impostor");
        ensure_owner_only_dir(&impostor).unwrap();
        std::fs::remove_dir(root2.join(DEFAULT_HOME_NAME)).unwrap();
        std::fs::rename(&impostor, root2.join(DEFAULT_HOME_NAME)).unwrap();
        assert!(matches!(
            ManagedRoot::open(&root2, "/ws", 1, 2),
            Err(RegistryError::IdentityChanged { .. })
        ));
    }
}
