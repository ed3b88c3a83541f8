//! Executable identity pinning.
//!
//! At startup each trust anchor (`marsh`, its sibling `marshd`, `sbx`) is
//! canonicalized, checked (regular file, executable, owned by root or the euid, not
//! group/other-writable, outside the workspace, root and homes) and pinned: the full
//! `stat` identity, held through an open descriptor whose own identity matches it.
//! Before every host invocation the identity is revalidated with a fresh `lstat` of
//! the same fields: `ctime` is part of it, and no unprivileged writer can set it back,
//! so an in-place rewrite whose `mtime` was restored still shows up.
//!
//! The sha256 of the contents (reported by `doctor`, part of a broker's identity) is
//! taken on first use, through the pinned descriptor, and counts only if the
//! descriptor's identity equals the pin before and after hashing; it is never
//! recomputed. Rejected alternative: hashing at startup, which was half of a `serve`
//! start (the three stand-ins are about 10 MB) for a figure most sessions never read.
//!
//! The descriptor stays open for the server's life, and every execution goes through
//! it ([`PinnedExecutable::exec_path`]): checking a path and then executing the same
//! path are two steps, and a file renamed over the pinned one between them would run.
//! Through the descriptor, what runs is the verified inode whatever the path names by
//! then.
//!
//! Caller-facing messages ([`ExecutableChanged`]'s `Display`) name the role, never the
//! path: the path is for the operator's log.

use std::fs::{self, File};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use marsh_scope_registry::{AncestryError, TrustedAncestors, VerifyRound};

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
    #[error("the {role} executable {path} has an untrusted ancestor: {source}")]
    UntrustedAncestor {
        role: &'static str,
        path: PathBuf,
        source: AncestryError,
    },
    #[error("cannot open the {role} executable {path}: {source}")]
    Open {
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

/// Areas a trust anchor must not live in, with their names for error messages.
pub type ForbiddenAreas<'a> = [(&'static str, &'a Path)];

#[derive(Debug, Clone)]
pub struct PinnedExecutable {
    role: &'static str,
    path: PathBuf,
    identity: FileIdentity,
    /// Lowercase hex sha256 of the contents, taken on first use through `file` while
    /// its identity equalled `identity` (see [`PinnedExecutable::sha256_hex`]).
    sha256: Arc<OnceLock<String>>,
    /// `None` unless the anchor requires a trusted ancestor chain.
    ancestors: Option<TrustedAncestors>,
    /// Invariant: the read-only, close-on-exec descriptor the contents were hashed
    /// through, whose identity equalled `identity` before and after hashing.
    file: Arc<OwnedFd>,
}

/// Why a revalidation failed. The message names the role and the way out, never a
/// path; `path` and `detail` are for the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the pinned {role} executable changed since marsh-mcp started ({what}); reinstall it if needed and restart marsh-mcp"
)]
pub struct ExecutableChanged {
    pub role: &'static str,
    pub path: PathBuf,
    /// What changed, without any path.
    pub what: String,
    /// The underlying error, paths included.
    pub detail: String,
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
            let chain =
                TrustedAncestors::check(&path).map_err(|source| PinError::UntrustedAncestor {
                    role,
                    path: path.clone(),
                    source,
                })?;
            Some(chain)
        } else {
            None
        };
        let identity = FileIdentity::of(&meta);
        let file = open_unchanged(role, &path, identity)?;
        Ok(Self {
            role,
            path,
            identity,
            sha256: Arc::new(OnceLock::new()),
            ancestors,
            file: Arc::new(file),
        })
    }

    /// What to execute: the verified descriptor, as a path the kernel resolves to that
    /// very inode (`/proc/self/fd/N`, valid in the forked child, which inherits the
    /// descriptor until its `execve` has opened the file). Off Linux there is no such
    /// path and the pinned path is returned (checked just before, not race-free).
    pub fn exec_path(&self) -> PathBuf {
        if cfg!(target_os = "linux") {
            PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
        } else {
            self.path.clone()
        }
    }

    /// The verified descriptor's number, for handing it to a child.
    pub fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn role(&self) -> &'static str {
        self.role
    }

    /// The sha256 of the pinned contents, hashed through the pinned descriptor on
    /// first use. An error when the file changed since it was pinned (then no hash
    /// can be attributed to the pin).
    pub fn sha256_hex(&self) -> Result<&str, ExecutableChanged> {
        if let Some(hash) = self.sha256.get() {
            return Ok(hash);
        }
        let hash = hash_pinned(&self.file, self.identity).map_err(|detail| ExecutableChanged {
            role: self.role,
            path: self.path.clone(),
            what: "its contents could not be hashed as pinned".into(),
            detail,
        })?;
        Ok(self.sha256.get_or_init(|| hash))
    }

    /// The cheap per-invocation check: one `lstat` of the file and one per pinned
    /// ancestor, compared field by field with the pin.
    pub fn revalidate(&self) -> Result<(), ExecutableChanged> {
        self.revalidate_in(&mut VerifyRound::default())
    }

    /// [`Self::revalidate`] as part of `round`, which re-reads an ancestor shared
    /// with another pin of the round once.
    pub fn revalidate_in(&self, round: &mut VerifyRound) -> Result<(), ExecutableChanged> {
        let changed = |what: String, detail: String| ExecutableChanged {
            role: self.role,
            path: self.path.clone(),
            what,
            detail,
        };
        let meta = fs::symlink_metadata(&self.path).map_err(|e| {
            changed(
                format!("cannot stat it: {}", e.kind()),
                format!("{}: {e}", self.path.display()),
            )
        })?;
        let now = FileIdentity::of(&meta);
        if now != self.identity {
            let what = describe_difference(&self.identity, &now);
            return Err(changed(what.clone(), what));
        }
        if let Some(chain) = &self.ancestors {
            chain
                .verify_in(round)
                .map_err(|e| changed("a directory above it changed".into(), e.to_string()))?;
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

/// Opens the pinned file without following a link and checks that the descriptor
/// names the inode whose identity was pinned.
fn open_unchanged(
    role: &'static str,
    path: &Path,
    pinned: FileIdentity,
) -> Result<OwnedFd, PinError> {
    let open_err = |source| PinError::Open {
        role,
        path: path.to_owned(),
        source,
    };
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(open_err)?;
    if FileIdentity::of(&file.metadata().map_err(open_err)?) != pinned {
        return Err(PinError::ChangedWhilePinning {
            role,
            path: path.to_owned(),
        });
    }
    Ok(file.into())
}

/// Hashes the contents behind `fd` from its start; the hash counts only if the
/// descriptor's identity equals `pinned` before and after.
fn hash_pinned(fd: &OwnedFd, pinned: FileIdentity) -> Result<String, String> {
    let file = File::from(fd.try_clone().map_err(|e| e.to_string())?);
    let identity = || {
        file.metadata()
            .map(|m| FileIdentity::of(&m))
            .map_err(|e| e.to_string())
    };
    if identity()? != pinned {
        return Err("it changed since it was pinned".into());
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut offset = 0u64;
    loop {
        let n = file.read_at(&mut buf, offset).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        offset += n as u64;
    }
    if identity()? != pinned {
        return Err("it changed while it was being hashed".into());
    }
    Ok(hex::encode(hasher.finalize()))
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
    fn the_hash_is_of_the_pinned_contents_and_refused_once_they_changed() {
        let tmp = tempfile::tempdir().unwrap();
        let p = exe(tmp.path(), "marsh");
        let pin = PinnedExecutable::pin("marsh", &p, false, &[]).unwrap();
        let expected = hex::encode(Sha256::digest(fs::read(&p).unwrap()));
        assert_eq!(pin.sha256_hex().unwrap(), expected);
        // Taken once: a later rewrite does not change what was attributed to the pin.
        let other = PinnedExecutable::pin("sbx", &exe(tmp.path(), "sbx"), false, &[]).unwrap();
        fs::write(tmp.path().join("sbx"), b"#!/bin/sh\nexit 7\n").unwrap();
        let err = other.sha256_hex().unwrap_err();
        assert!(err.what.contains("hashed"), "{err}");
        assert_eq!(pin.sha256_hex().unwrap(), expected);
    }

    #[test]
    fn execution_goes_to_the_pinned_inode_after_a_rename_over_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("marsh");
        fs::copy("/bin/true", &path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        let pin = PinnedExecutable::pin("marsh", &path, false, &[]).unwrap();
        let swapped = tmp.path().join("swapped");
        fs::copy("/bin/false", &swapped).unwrap();
        fs::set_permissions(&swapped, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&swapped, &path).unwrap();
        assert!(pin.revalidate().is_err());
        // Past the check (the race window), what runs is still the pinned `true`.
        let status = std::process::Command::new(pin.exec_path())
            .status()
            .unwrap();
        assert!(status.success(), "the swapped file ran");
        assert!(
            !std::process::Command::new(&path)
                .status()
                .unwrap()
                .success()
        );
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
