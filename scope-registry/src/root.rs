use std::path::{Path, PathBuf};

use uuid::Uuid;

use crate::binding::WorkspaceBinding;
use crate::lease::LEASE_FILE;
use crate::registry::ScopeId;
use crate::{
    DirIdentity, Lease, Registry, RegistryError, ensure_owner_only_dir, verify_owner_only_dir,
};

/// The reserved home of the default scope inside a managed root.
pub const DEFAULT_HOME_NAME: &str = "default";

/// A managed development root, leased, bound to one workspace and with its registry
/// loaded and reconciled. Invariant: while this value lives, this process is the only
/// owner of the root (the lease), and `registry` equals `scopes.json`.
#[derive(Debug)]
pub struct ManagedRoot {
    path: PathBuf,
    identity: DirIdentity,
    lease: Lease,
    registry: Registry,
}

/// Whether the home at `path` is still exactly the recorded directory.
pub fn home_matches(path: &Path, recorded: &DirIdentity) -> bool {
    verify_owner_only_dir(path).is_ok_and(|found| found == *recorded)
}

impl ManagedRoot {
    /// Claims `root` for `workspace` in the only safe order: owner-only root, then the
    /// lease (so two starters cannot both pass the checks below), then the binding,
    /// then the default home, the registry and restart reconciliation.
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
        let registry = match Registry::load(root)? {
            Some(mut registry) => {
                // A recorded home is never recreated: a missing or replaced one becomes
                // an identity failure for the operator, not something to paper over.
                let changed = registry
                    .reconcile(|id, recorded| home_matches(&scope_home_path(root, id), recorded));
                if changed {
                    registry.publish(root)?;
                }
                registry
            }
            None => {
                let home = ensure_owner_only_dir(&root.join(DEFAULT_HOME_NAME))?;
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

    pub fn scope_home(&self, id: ScopeId) -> PathBuf {
        scope_home_path(&self.path, id)
    }

    /// Creates the owner-only home of a new generated scope. It must not exist yet:
    /// an existing directory is never adopted.
    pub fn create_generated_home(&self, id: Uuid) -> Result<DirIdentity, RegistryError> {
        use std::os::unix::fs::DirBuilderExt;
        let path = self.scope_home(ScopeId::Generated(id));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| RegistryError::Create {
                path: path.clone(),
                source,
            })?;
        verify_owner_only_dir(&path)
    }

    /// Applies `change` to a copy of the registry, publishes the copy, and only then
    /// makes it the in-memory state, so memory never runs ahead of disk. The change's
    /// own result is returned; a change that returns `Err` publishes nothing.
    pub fn update<T, E: From<RegistryError>>(
        &mut self,
        change: impl FnOnce(&mut Registry) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut next = self.registry.clone();
        let out = change(&mut next)?;
        if next != self.registry {
            next.publish(&self.path)?;
            self.registry = next;
        }
        Ok(out)
    }
}

fn scope_home_path(root: &Path, id: ScopeId) -> PathBuf {
    match id {
        ScopeId::Default => root.join(DEFAULT_HOME_NAME),
        ScopeId::Generated(uuid) => root.join(uuid.hyphenated().to_string()),
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
            .update(|r| {
                r.default.state = ScopeState::Stopped;
                Ok::<_, RegistryError>(())
            })
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
    fn refuses_unbound_root_and_isolates_a_replaced_home() {
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
        let reopened = ManagedRoot::open(&root2, "/ws", 1, 2).unwrap();
        let default = &reopened.registry().default;
        assert_eq!(default.state, ScopeState::Failed);
        assert!(default.identity_invalid);
        assert!(
            root2.join(DEFAULT_HOME_NAME).exists(),
            "the replacement is never touched"
        );
    }

    #[test]
    fn generated_homes_are_never_adopted() {
        let tmp = tempfile::tempdir().unwrap();
        let root = ManagedRoot::open(&tmp.path().join("root"), "/ws", 1, 2).unwrap();
        let id = Uuid::new_v4();
        root.create_generated_home(id).unwrap();
        assert!(matches!(
            root.create_generated_home(id),
            Err(RegistryError::Create { .. })
        ));
    }
}
