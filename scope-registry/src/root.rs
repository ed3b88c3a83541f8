use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, open};
use nix::sys::stat::{Mode, fstat, fstatat, mkdirat};
use uuid::Uuid;

use crate::binding::{BINDING_FILE, WorkspaceBinding};
use crate::fs_safety::atomic::DIR_FLAGS;
use crate::lease::LEASE_FILE;
use crate::registry::{REGISTRY_FILE, ScopeId};
use crate::removal::identity_of;
use crate::{
    DirIdentity, Lease, Registry, RegistryError, TrustedAncestors, ensure_owner_only_dir,
    verify_owner_only_dir,
};

/// The reserved home of the default scope inside a managed root.
pub const DEFAULT_HOME_NAME: &str = "default";

/// A managed development root, leased, bound to one workspace and with its registry
/// loaded and reconciled.
///
/// Invariants:
/// - While this value lives, this process is the only owner of the root (the lease),
///   and `registry` equals `scopes.json`.
/// - Every write below the root (registry, generated homes) goes through `dir`, the
///   descriptor of the directory claimed at startup, and is preceded by
///   [`ManagedRoot::check_in_place`]: the path still names that directory and no
///   ancestor changed. So a root moved away while serving (by anyone who could write an
///   ancestor) never receives a file at its old path, and the original directory is
///   the only place the server ever writes.
/// - Once a check fails, `displaced` is set for good: a root that moved while serving
///   is suspect even if it moves back, so writes stay refused until a restart.
#[derive(Debug)]
pub struct ManagedRoot {
    path: PathBuf,
    identity: DirIdentity,
    dir: OwnedFd,
    ancestors: TrustedAncestors,
    displaced: Option<String>,
    lease: Lease,
    registry: Registry,
}

/// Whether the home at `path` is still exactly the recorded directory.
pub fn home_matches(path: &Path, recorded: &DirIdentity) -> bool {
    verify_owner_only_dir(path).is_ok_and(|found| found == *recorded)
}

impl ManagedRoot {
    /// Claims `root` for `workspace` in the only safe order: trusted ancestors (checked
    /// before anything is created in them), owner-only root, its descriptor, then the
    /// lease (so two starters cannot both pass the checks below), then the binding and
    /// registry, restart reconciliation last.
    pub fn open(
        root: &Path,
        workspace: &str,
        workspace_dev: u64,
        workspace_ino: u64,
    ) -> Result<Self, RegistryError> {
        let untrusted = |source| RegistryError::UntrustedAncestor {
            path: root.to_owned(),
            source,
        };
        TrustedAncestors::check_existing(root).map_err(untrusted)?;
        let identity = ensure_owner_only_dir(root)?;
        let ancestors = TrustedAncestors::check(root).map_err(untrusted)?;
        let dir = open(root, DIR_FLAGS, Mode::empty()).map_err(|e| RegistryError::Inspect {
            path: root.to_owned(),
            source: e.into(),
        })?;
        let opened = fstat(&dir).map_err(|e| RegistryError::Inspect {
            path: root.to_owned(),
            source: e.into(),
        })?;
        if identity_of(&opened) != identity {
            return Err(RegistryError::IdentityChanged {
                path: root.to_owned(),
            });
        }
        // A populated root without a binding is refused before the lease file exists,
        // so the refusal leaves the root as it was. (The same check runs again under
        // the lease, where it decides: this one only spares the common case an effect.)
        let bound = std::fs::symlink_metadata(root.join(BINDING_FILE)).is_ok();
        if !bound && !holds_only_first_claim_leftovers(root)? {
            return Err(RegistryError::Unbound {
                path: root.to_owned(),
            });
        }
        let lease = Lease::acquire(root)?;
        let wanted = WorkspaceBinding::new(workspace, workspace_dev, workspace_ino);
        let registry = match WorkspaceBinding::load(root)? {
            Some(bound) => {
                bound.verify(root, &wanted)?;
                // The binding is published only after the first registry (see
                // `first_claim`), so a bound root without one has lost it.
                let mut registry =
                    Registry::load(root)?.ok_or_else(|| RegistryError::RegistryLost {
                        path: root.join(REGISTRY_FILE),
                        workspace: bound.workspace.clone(),
                    })?;
                // A recorded home is never recreated: a missing or replaced one becomes
                // an identity failure for the operator, not something to paper over.
                let changed = registry
                    .reconcile(|id, recorded| home_matches(&scope_home_path(root, id), recorded));
                if changed {
                    registry.publish(dir.as_fd(), root)?;
                }
                registry
            }
            None => first_claim(root, &dir, &wanted)?,
        };
        Ok(Self {
            path: root.to_owned(),
            identity,
            dir,
            ancestors,
            displaced: None,
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

    /// Whether the root is still where and what it was when claimed: its path names the
    /// claimed directory (`lstat` and the held descriptor agree with the recorded
    /// identity) and no ancestor changed. A failure is remembered for good.
    pub fn check_in_place(&mut self) -> Result<(), RegistryError> {
        if self.displaced.is_none()
            && let Err(what) = self.find_displacement()
        {
            self.displaced = Some(what);
        }
        match &self.displaced {
            None => Ok(()),
            Some(what) => Err(RegistryError::RootDisplaced {
                path: self.path.clone(),
                what: what.clone(),
            }),
        }
    }

    fn find_displacement(&self) -> Result<(), String> {
        let held = fstat(&self.dir).map_err(|e| format!("cannot stat the claimed root: {e}"))?;
        if identity_of(&held) != self.identity {
            return Err("the claimed directory changed owner or mode".into());
        }
        match verify_owner_only_dir(&self.path) {
            Ok(found) if found == self.identity => {}
            Ok(_) => return Err("its path now names another directory".into()),
            Err(e) => return Err(e.to_string()),
        }
        self.ancestors.verify().map_err(|e| format!("ancestor {e}"))
    }

    /// Creates the owner-only home of a new generated scope inside the claimed root. It
    /// must not exist yet: an existing directory is never adopted.
    pub fn create_generated_home(&mut self, id: Uuid) -> Result<DirIdentity, RegistryError> {
        self.check_in_place()?;
        let name = id.hyphenated().to_string();
        let path = self.scope_home(ScopeId::Generated(id));
        mkdirat(&self.dir, name.as_str(), Mode::from_bits_truncate(0o700)).map_err(|e| {
            RegistryError::Create {
                path: path.clone(),
                source: e.into(),
            }
        })?;
        let made =
            fstatat(&self.dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| {
                RegistryError::Inspect {
                    path: path.clone(),
                    source: e.into(),
                }
            })?;
        let identity = identity_of(&made);
        let euid = nix::unistd::geteuid().as_raw();
        if identity.uid != euid {
            return Err(RegistryError::ForeignOwner {
                path,
                owner: identity.uid,
                euid,
            });
        }
        if identity.mode & libc::S_IFMT != libc::S_IFDIR || identity.mode & 0o077 != 0 {
            return Err(RegistryError::Accessible {
                path,
                mode: identity.mode & 0o7777,
            });
        }
        Ok(identity)
    }

    /// Applies `change` to a copy of the registry, publishes the copy into the claimed
    /// root, and only then makes it the in-memory state, so memory never runs ahead of
    /// disk. The change's own result is returned; a change that returns `Err`, or a root
    /// that is no longer in place, publishes nothing.
    pub fn update<T, E: From<RegistryError>>(
        &mut self,
        change: impl FnOnce(&mut Registry) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut next = self.registry.clone();
        let out = change(&mut next)?;
        if next != self.registry {
            self.check_in_place()?;
            next.publish(self.dir.as_fd(), &self.path)?;
            self.registry = next;
        }
        Ok(out)
    }
}

/// The first claim of an unbound root: default home, registry, and the binding last,
/// so a bound root always had a registry. A root holding anything else than the
/// leftovers of an interrupted first claim is refused.
fn first_claim(
    root: &Path,
    dir: &OwnedFd,
    wanted: &WorkspaceBinding,
) -> Result<Registry, RegistryError> {
    if !holds_only_first_claim_leftovers(root)? {
        return Err(RegistryError::Unbound {
            path: root.to_owned(),
        });
    }
    let home = ensure_owner_only_dir(&root.join(DEFAULT_HOME_NAME))?;
    let registry = Registry::new(home);
    registry.publish(dir.as_fd(), root)?;
    wanted.publish(dir.as_fd(), root)?;
    Ok(registry)
}

fn scope_home_path(root: &Path, id: ScopeId) -> PathBuf {
    match id {
        ScopeId::Default => root.join(DEFAULT_HOME_NAME),
        ScopeId::Generated(uuid) => root.join(uuid.hyphenated().to_string()),
    }
}

/// An unbound root may hold the lease, and what a first claim that stopped before its
/// binding leaves: an empty default home, a registry, temp files of either. No server
/// ever served from an unbound root, so none of these holds anything of value.
fn holds_only_first_claim_leftovers(root: &Path) -> Result<bool, RegistryError> {
    let inspect = |source| RegistryError::Inspect {
        path: root.to_owned(),
        source,
    };
    for entry in std::fs::read_dir(root).map_err(inspect)? {
        let name = entry.map_err(inspect)?.file_name();
        let leftover = name == LEASE_FILE
            || name == REGISTRY_FILE
            || is_temp_of(&name, REGISTRY_FILE)
            || is_temp_of(&name, BINDING_FILE)
            || (name == DEFAULT_HOME_NAME && is_empty_dir(&root.join(DEFAULT_HOME_NAME)));
        if !leftover {
            return Ok(false);
        }
    }
    Ok(true)
}

fn is_temp_of(name: &OsStr, file: &str) -> bool {
    name.to_str()
        .is_some_and(|n| n.starts_with(&format!(".{file}.tmp-")))
}

fn is_empty_dir(path: &Path) -> bool {
    verify_owner_only_dir(path).is_ok()
        && std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_none())
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
        let left: Vec<_> = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["stray"], "the refused root is left as it was");
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
        let mut root = ManagedRoot::open(&tmp.path().join("root"), "/ws", 1, 2).unwrap();
        let id = Uuid::new_v4();
        root.create_generated_home(id).unwrap();
        assert!(matches!(
            root.create_generated_home(id),
            Err(RegistryError::Create { .. })
        ));
    }

    #[test]
    fn a_lost_registry_is_refused_but_an_interrupted_first_claim_is_redone() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        drop(ManagedRoot::open(&root, "/ws", 1, 2).unwrap());
        std::fs::remove_file(root.join(REGISTRY_FILE)).unwrap();
        let err = ManagedRoot::open(&root, "/ws", 1, 2).unwrap_err();
        assert!(matches!(err, RegistryError::RegistryLost { .. }), "{err}");
        assert!(err.to_string().contains("restoring scopes.json"), "{err}");
        assert!(!root.join(REGISTRY_FILE).exists(), "nothing is re-adopted");
        // A first claim that stopped before its binding left a registry and an empty
        // default home: claiming again completes it.
        std::fs::remove_file(root.join(BINDING_FILE)).unwrap();
        std::fs::write(root.join(REGISTRY_FILE), b"{}").unwrap();
        drop(ManagedRoot::open(&root, "/ws", 1, 2).unwrap());
        // A populated default home is not a leftover.
        std::fs::remove_file(root.join(BINDING_FILE)).unwrap();
        std::fs::write(root.join(DEFAULT_HOME_NAME).join("state"), b"x").unwrap();
        assert!(matches!(
            ManagedRoot::open(&root, "/ws", 1, 2),
            Err(RegistryError::Unbound { .. })
        ));
    }

    #[test]
    fn an_untrusted_ancestor_is_refused_before_anything_is_created() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let ww = std::fs::canonicalize(tmp.path()).unwrap().join("ww");
        std::fs::create_dir(&ww).unwrap();
        std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = ManagedRoot::open(&ww.join("root"), "/ws", 1, 2).unwrap_err();
        assert!(
            matches!(err, RegistryError::UntrustedAncestor { .. }),
            "{err}"
        );
        assert!(!ww.join("root").exists());
        std::fs::set_permissions(&ww, std::fs::Permissions::from_mode(0o1777)).unwrap();
        drop(ManagedRoot::open(&ww.join("root"), "/ws", 1, 2).unwrap());
    }

    #[test]
    fn a_root_moved_while_serving_gets_no_write_at_its_old_path() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let root = base.join("root");
        let mut opened = ManagedRoot::open(&root, "/ws", 1, 2).unwrap();
        std::fs::rename(&root, base.join("stolen")).unwrap();
        ensure_owner_only_dir(&root).unwrap();
        let err = opened.create_generated_home(Uuid::new_v4()).unwrap_err();
        assert!(matches!(err, RegistryError::RootDisplaced { .. }), "{err}");
        let err = opened
            .update(|r| {
                r.default.state = ScopeState::Stopped;
                Ok::<_, RegistryError>(())
            })
            .unwrap_err();
        assert!(matches!(err, RegistryError::RootDisplaced { .. }), "{err}");
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        // Moving it back does not make it trusted again before a restart.
        std::fs::remove_dir(&root).unwrap();
        std::fs::rename(base.join("stolen"), &root).unwrap();
        assert!(opened.check_in_place().is_err());
        assert_eq!(opened.registry().default.state, ScopeState::Ready);
    }
}
