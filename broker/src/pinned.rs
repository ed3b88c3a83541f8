//! Executable identity pinning.
//!
//! At startup each trust anchor (`marsh`, its sibling `marshd`, `sbx`) is
//! canonicalized, checked (regular file, executable, owned by root or the euid, not
//! group/other-writable, outside the workspace, root and homes) and pinned: the full
//! `stat` identity plus the sha256 of its contents. Before every host invocation the
//! identity is revalidated with a fresh `lstat` of the same fields. The content hash is
//! not recomputed on that hot path (tens of milliseconds for a large binary): `ctime`
//! is part of the identity, and no unprivileged writer can set it back, so an in-place
//! rewrite whose `mtime` was restored still shows up.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("cannot resolve the {role} executable {path}: {source}")]
    Resolve {
        role: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {role} executable {path} is not a regular file")]
    NotRegular { role: &'static str, path: PathBuf },
    #[error("the {role} executable {path} is not executable")]
    NotExecutable { role: &'static str, path: PathBuf },
    #[error(
        "the {role} executable {path} is owned by uid {owner}; it must be owned by root or uid {euid}"
    )]
    ForeignOwner {
        role: &'static str,
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error("the {role} executable {path} is writable by group or others (mode {mode:o})")]
    Writable {
        role: &'static str,
        path: PathBuf,
        mode: u32,
    },
    #[error(
        "the {role} executable {path} lies inside the {area} {area_path}; install it outside the workspace, scope root and homes"
    )]
    InsideArea {
        role: &'static str,
        path: PathBuf,
        area: &'static str,
        area_path: PathBuf,
    },
    #[error("the {role} executable {path} has an untrusted ancestor {ancestor}: {why}")]
    UntrustedAncestor {
        role: &'static str,
        path: PathBuf,
        ancestor: PathBuf,
        why: String,
    },
    #[error("cannot hash the {role} executable {path}: {source}")]
    Hash {
        role: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the {role} executable {path} changed while it was being pinned")]
    ChangedWhilePinning { role: &'static str, path: PathBuf },
}

/// Every `stat` field that a replacement, rewrite or chmod changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl FileIdentity {
    fn of(meta: &fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// A directory on the trusted ancestor chain: `(dev, ino, uid, mode)` at pin time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AncestorPin {
    path: PathBuf,
    dev: u64,
    ino: u64,
    uid: u32,
    mode: u32,
}

/// Areas a trust anchor must not live in, with their names for error messages.
pub type ForbiddenAreas<'a> = [(&'static str, &'a Path)];

#[derive(Debug, Clone)]
pub struct PinnedExecutable {
    role: &'static str,
    path: PathBuf,
    identity: FileIdentity,
    /// Lowercase hex sha256 of the contents, taken at pin time.
    sha256: String,
    /// Empty unless the anchor requires a trusted ancestor chain.
    ancestors: Vec<AncestorPin>,
}

/// Why a revalidation failed; the message names the file and the way out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the pinned {role} executable {path} changed since marsh-mcp started ({what}); reinstall it if needed and restart marsh-mcp"
)]
pub struct ExecutableChanged {
    pub role: &'static str,
    pub path: PathBuf,
    pub what: String,
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

impl PinnedExecutable {
    pub fn pin(
        role: &'static str,
        requested: &Path,
        trusted_ancestors: bool,
        forbidden: &ForbiddenAreas<'_>,
    ) -> Result<Self, PinError> {
        let path = fs::canonicalize(requested).map_err(|source| PinError::Resolve {
            role,
            path: requested.to_owned(),
            source,
        })?;
        for (area, area_path) in forbidden {
            if path.starts_with(area_path) {
                return Err(PinError::InsideArea {
                    role,
                    path,
                    area,
                    area_path: area_path.to_path_buf(),
                });
            }
        }
        let meta = fs::symlink_metadata(&path).map_err(|source| PinError::Resolve {
            role,
            path: path.clone(),
            source,
        })?;
        check_file(role, &path, &meta)?;
        let ancestors = if trusted_ancestors {
            pin_ancestors(role, &path)?
        } else {
            Vec::new()
        };
        let identity = FileIdentity::of(&meta);
        let sha256 = hash_unchanged(role, &path, identity)?;
        Ok(Self {
            role,
            path,
            identity,
            sha256,
            ancestors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn role(&self) -> &'static str {
        self.role
    }

    pub fn sha256_hex(&self) -> &str {
        &self.sha256
    }

    /// The cheap per-invocation check: one `lstat` of the file and one per pinned
    /// ancestor, compared field by field with the pin.
    pub fn revalidate(&self) -> Result<(), ExecutableChanged> {
        let changed = |what: String| ExecutableChanged {
            role: self.role,
            path: self.path.clone(),
            what,
        };
        let meta = fs::symlink_metadata(&self.path)
            .map_err(|e| changed(format!("cannot stat it: {e}")))?;
        let now = FileIdentity::of(&meta);
        if now != self.identity {
            return Err(changed(describe_difference(&self.identity, &now)));
        }
        for pin in &self.ancestors {
            let meta = fs::symlink_metadata(&pin.path).map_err(|e| {
                changed(format!("cannot stat ancestor {}: {e}", pin.path.display()))
            })?;
            if (meta.dev(), meta.ino(), meta.uid(), meta.mode())
                != (pin.dev, pin.ino, pin.uid, pin.mode)
            {
                return Err(changed(format!("ancestor {} changed", pin.path.display())));
            }
        }
        Ok(())
    }
}

fn describe_difference(was: &FileIdentity, now: &FileIdentity) -> String {
    let mut fields = Vec::new();
    if (was.dev, was.ino) != (now.dev, now.ino) {
        fields.push("replaced (device/inode)");
    }
    if (was.uid, was.gid) != (now.uid, now.gid) {
        fields.push("owner");
    }
    if was.mode != now.mode {
        fields.push("mode");
    }
    if was.size != now.size {
        fields.push("size");
    }
    if was.mtime != now.mtime {
        fields.push("mtime");
    }
    if was.ctime != now.ctime {
        fields.push("ctime");
    }
    format!("changed: {}", fields.join(", "))
}

fn check_file(role: &'static str, path: &Path, meta: &fs::Metadata) -> Result<(), PinError> {
    if !meta.file_type().is_file() {
        return Err(PinError::NotRegular {
            role,
            path: path.to_owned(),
        });
    }
    if meta.mode() & 0o111 == 0 {
        return Err(PinError::NotExecutable {
            role,
            path: path.to_owned(),
        });
    }
    let euid = euid();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(PinError::ForeignOwner {
            role,
            path: path.to_owned(),
            owner: meta.uid(),
            euid,
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(PinError::Writable {
            role,
            path: path.to_owned(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

fn pin_ancestors(role: &'static str, path: &Path) -> Result<Vec<AncestorPin>, PinError> {
    let euid = euid();
    let mut pins = Vec::new();
    for ancestor in path.ancestors().skip(1) {
        let meta = fs::symlink_metadata(ancestor).map_err(|source| PinError::Resolve {
            role,
            path: ancestor.to_owned(),
            source,
        })?;
        let untrusted = |why: String| PinError::UntrustedAncestor {
            role,
            path: path.to_owned(),
            ancestor: ancestor.to_owned(),
            why,
        };
        if !meta.is_dir() {
            return Err(untrusted("not a directory".into()));
        }
        if meta.uid() != 0 && meta.uid() != euid {
            return Err(untrusted(format!("owned by uid {}", meta.uid())));
        }
        let sticky = meta.mode() & 0o1000 != 0;
        if meta.mode() & 0o022 != 0 && !sticky {
            return Err(untrusted(format!(
                "writable by group or others (mode {:o})",
                meta.mode() & 0o7777
            )));
        }
        pins.push(AncestorPin {
            path: ancestor.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
            uid: meta.uid(),
            mode: meta.mode(),
        });
    }
    Ok(pins)
}

/// Hashes through one no-follow descriptor and checks that the descriptor's identity
/// equals the pinned one before and after, so the hash belongs to the pinned inode.
fn hash_unchanged(
    role: &'static str,
    path: &Path,
    pinned: FileIdentity,
) -> Result<String, PinError> {
    let hash_err = |source| PinError::Hash {
        role,
        path: path.to_owned(),
        source,
    };
    let mut file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(hash_err)?;
    let before = FileIdentity::of(&file.metadata().map_err(hash_err)?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(hash_err)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let after = FileIdentity::of(&file.metadata().map_err(hash_err)?);
    if before != pinned || after != pinned {
        return Err(PinError::ChangedWhilePinning {
            role,
            path: path.to_owned(),
        });
    }
    Ok(format!("{:x}", hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn exe(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, b"#!/bin/sh\nexit 0\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn rewrite_with_restored_mtime_is_caught() {
        let tmp = tempfile::tempdir().unwrap();
        let p = exe(tmp.path(), "marsh");
        let pin = PinnedExecutable::pin("marsh", &p, false, &[]).unwrap();
        pin.revalidate().unwrap();
        let mtime = fs::metadata(&p).unwrap().modified().unwrap();
        fs::write(&p, b"#!/bin/sh\nexit 1\n").unwrap();
        File::options()
            .write(true)
            .open(&p)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let err = pin.revalidate().unwrap_err();
        assert!(err.what.contains("ctime"), "{err}");
    }

    #[test]
    fn refuses_writable_and_inside_areas() {
        let tmp = tempfile::tempdir().unwrap();
        let p = exe(tmp.path(), "sbx");
        fs::set_permissions(&p, fs::Permissions::from_mode(0o775)).unwrap();
        assert!(matches!(
            PinnedExecutable::pin("sbx", &p, false, &[]),
            Err(PinError::Writable { .. })
        ));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        let ws = fs::canonicalize(tmp.path()).unwrap();
        assert!(matches!(
            PinnedExecutable::pin("sbx", &p, false, &[("workspace", &ws)]),
            Err(PinError::InsideArea { .. })
        ));
    }
}
