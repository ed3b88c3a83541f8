use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::RegistryError;

/// Publishes `bytes` as `dir/name` so that a reader (or a crash) sees either the old
/// file or the complete new one: exclusive temp file (0600, no-follow) in the same
/// directory, fsync, rename over the target, fsync of the directory.
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), RegistryError> {
    let target = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp-{}", uuid::Uuid::new_v4().simple()));
    let write_err = |source| RegistryError::Write {
        path: tmp.clone(),
        source,
    };
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(write_err)?;
        file.write_all(bytes).map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        std::fs::rename(&tmp, &target).map_err(|source| RegistryError::Write {
            path: target.clone(),
            source,
        })?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| RegistryError::Write {
                path: dir.to_owned(),
                source,
            })
    })();
    if result.is_err() {
        // The temp name is unique to this call; removing it cannot touch another file.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Reads a small owner-only state file without following symlinks. `None` when absent.
pub(crate) fn read_state_file(path: &Path, limit: u64) -> Result<Option<Vec<u8>>, RegistryError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RegistryError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let meta = file.metadata().map_err(|source| RegistryError::Read {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() {
        return Err(RegistryError::Corrupt {
            path: path.to_owned(),
            reason: "not a regular file".into(),
        });
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(RegistryError::ForeignOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            euid,
        });
    }
    if meta.len() > limit {
        return Err(RegistryError::Corrupt {
            path: path.to_owned(),
            reason: format!("{} bytes exceeds the {limit}-byte limit", meta.len()),
        });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| RegistryError::Read {
            path: path.to_owned(),
            source,
        })?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_file_and_leaves_no_temp() {
        let tmp = tempfile::tempdir().unwrap();
        write_atomically(tmp.path(), "x.json", b"one").unwrap();
        write_atomically(tmp.path(), "x.json", b"two").unwrap();
        assert_eq!(std::fs::read(tmp.path().join("x.json")).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn read_refuses_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("real"), b"{}").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("link")).unwrap();
        assert!(read_state_file(&tmp.path().join("link"), 100).is_err());
        assert!(
            read_state_file(&tmp.path().join("absent"), 100)
                .unwrap()
                .is_none()
        );
    }
}
