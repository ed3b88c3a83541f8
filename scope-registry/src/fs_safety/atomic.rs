use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, fsync, unlinkat};

use crate::RegistryError;

/// Flags of a directory descriptor used for `*at` calls.
pub(crate) const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Publishes `bytes` as `dir/name`; see [`write_atomically_at`].
pub fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), RegistryError> {
    let fd = File::options()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|source| RegistryError::Write {
            path: dir.to_owned(),
            source,
        })?;
    write_atomically_at(fd.as_fd(), dir, name, bytes)
}

/// Publishes `bytes` as `name` inside the directory `dir` (whose path, `dir_path`,
/// only names it in errors) so that a reader (or a crash) sees either the old file or
/// the complete new one: exclusive temp file (0600, no-follow) in the same directory,
/// fsync, rename over the target, fsync of the directory. Every step is relative to
/// the descriptor, so the file lands in that directory even if it was moved.
pub fn write_atomically_at(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    name: &str,
    bytes: &[u8],
) -> Result<(), RegistryError> {
    let target = dir_path.join(name);
    let tmp_name = format!(".{name}.tmp-{}", uuid::Uuid::new_v4().simple());
    let tmp = dir_path.join(&tmp_name);
    let write_err = |source| RegistryError::Write {
        path: tmp.clone(),
        source,
    };
    let result = (|| {
        let fd = openat(
            dir,
            tmp_name.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| write_err(e.into()))?;
        let mut file = File::from(fd);
        file.write_all(bytes).map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        renameat(dir, tmp_name.as_str(), dir, name).map_err(|e| RegistryError::Write {
            path: target.clone(),
            source: e.into(),
        })?;
        fsync(dir).map_err(|e| RegistryError::Write {
            path: dir_path.to_owned(),
            source: e.into(),
        })
    })();
    if result.is_err() {
        // The temp name is unique to this call; removing it cannot touch another file.
        let _ = unlinkat(dir, tmp_name.as_str(), UnlinkatFlags::NoRemoveDir);
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
