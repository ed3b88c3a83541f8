use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::RegistryError;

/// The exclusive lease on a development root: an advisory lock on `control.lock`
/// held for as long as this value lives. The kernel drops it when the process dies,
/// so a crashed owner never blocks its successor.
#[derive(Debug)]
pub struct Lease {
    path: PathBuf,
    /// Invariant: holds the exclusive lock; closing it releases the lease.
    _file: File,
}

pub const LEASE_FILE: &str = "control.lock";

impl Lease {
    pub fn acquire(root: &Path) -> Result<Self, RegistryError> {
        let path = root.join(LEASE_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|source| RegistryError::Lock {
                path: path.clone(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| RegistryError::Inspect {
            path: path.clone(),
            source,
        })?;
        let euid = nix::unistd::geteuid().as_raw();
        if !meta.is_file() {
            return Err(RegistryError::Corrupt {
                path,
                reason: "lease is not a regular file".into(),
            });
        }
        if meta.uid() != euid {
            return Err(RegistryError::ForeignOwner {
                path,
                owner: meta.uid(),
                euid,
            });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(RegistryError::Accessible {
                path,
                mode: meta.mode() & 0o7777,
            });
        }
        match file.try_lock() {
            Ok(()) => {
                record_holder(&file);
                Ok(Self { path, _file: file })
            }
            Err(TryLockError::WouldBlock) => Err(RegistryError::Leased {
                holder: read_holder(&file),
                path,
            }),
            Err(TryLockError::Error(source)) => Err(RegistryError::Lock { path, source }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes this process's pid into the held lease file, so a refused second server can
/// name the holder. Best effort: the lock, not the content, is the lease.
fn record_holder(mut file: &File) {
    let pid = format!("{}\n", std::process::id());
    let _ = file
        .set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(pid.as_bytes()));
}

/// The pid the holder recorded, when the file holds exactly one.
fn read_holder(mut file: &File) -> Option<u32> {
    let mut text = String::new();
    (&mut file).take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lease_is_refused_until_first_drops() {
        let tmp = tempfile::tempdir().unwrap();
        let first = Lease::acquire(tmp.path()).unwrap();
        assert!(matches!(
            Lease::acquire(tmp.path()),
            Err(RegistryError::Leased { holder: Some(pid), .. }) if pid == std::process::id()
        ));
        drop(first);
        Lease::acquire(tmp.path()).unwrap();
    }
}
