use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::Path;

use crate::{DirIdentity, RegistryError};

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Checks, without following a final symlink, that `path` is a directory owned by the
/// effective uid and closed to group and others.
pub fn verify_owner_only_dir(path: &Path) -> Result<DirIdentity, RegistryError> {
    let meta = fs::symlink_metadata(path).map_err(|source| RegistryError::Inspect {
        path: path.to_owned(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(RegistryError::Symlink {
            path: path.to_owned(),
        });
    }
    if !meta.is_dir() {
        return Err(RegistryError::NotDirectory {
            path: path.to_owned(),
        });
    }
    let euid = euid();
    if meta.uid() != euid {
        return Err(RegistryError::ForeignOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            euid,
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(RegistryError::Accessible {
            path: path.to_owned(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(DirIdentity::of(&meta))
}

/// Creates `path` (and missing parents) owner-only when absent, then verifies it.
/// An existing directory is never loosened or tightened: a wrong mode is an error the
/// operator must look at, not something to repair silently.
pub fn ensure_owner_only_dir(path: &Path) -> Result<DirIdentity, RegistryError> {
    match fs::symlink_metadata(path) {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|source| RegistryError::Create {
                    path: path.to_owned(),
                    source,
                })?;
        }
        Err(source) => {
            return Err(RegistryError::Inspect {
                path: path.to_owned(),
                source,
            });
        }
    }
    verify_owner_only_dir(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn creates_owner_only_and_rejects_loose_modes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        let id = ensure_owner_only_dir(&dir).unwrap();
        assert_eq!(id.mode & 0o777, 0o700);
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
        assert!(matches!(
            verify_owner_only_dir(&dir),
            Err(RegistryError::Accessible { .. })
        ));
    }

    #[test]
    fn refuses_symlinked_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        ensure_owner_only_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(
            verify_owner_only_dir(&link),
            Err(RegistryError::Symlink { .. })
        ));
    }
}
