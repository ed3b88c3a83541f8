//! The ancestor chain of a trusted location (a development root, a pinned executable).
//!
//! A directory can be renamed by anyone who may write its parent, so the contents of a
//! path are only as trustworthy as its least trusted ancestor. Every strict ancestor
//! must therefore be a real directory (never a symbolic link: callers pass canonical
//! paths, and a link appearing later is a change) owned by root or the effective uid,
//! and not writable by group or others unless it has the sticky bit (`/tmp`), where
//! only an entry's owner may rename it.
//!
//! The chain is recorded as `(dev, ino, uid, mode)` per ancestor; [`TrustedAncestors::
//! verify`] re-reads it with `lstat`, so a replaced, re-owned or loosened ancestor is
//! a change even when the new state would also pass the rules.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why an ancestor is not trusted. Each variant names the ancestor.
#[derive(Debug, thiserror::Error)]
pub enum AncestryError {
    #[error("cannot inspect {path}: {source}")]
    Inspect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a directory (symbolic links are never trusted)")]
    NotDirectory { path: PathBuf },
    #[error("{path} is owned by uid {owner}; it must be owned by root or uid {euid}")]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error(
        "{path} is writable by group or others without the sticky bit (mode {mode:o}); anyone who can write it can swap what lies below"
    )]
    Writable { path: PathBuf, mode: u32 },
    #[error("{path} changed since it was checked ({what})")]
    Changed { path: PathBuf, what: &'static str },
}

impl AncestryError {
    /// The ancestor the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Inspect { path, .. }
            | Self::NotDirectory { path }
            | Self::ForeignOwner { path, .. }
            | Self::Writable { path, .. }
            | Self::Changed { path, .. } => path,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Link {
    path: PathBuf,
    dev: u64,
    ino: u64,
    uid: u32,
    mode: u32,
}

/// The checked strict ancestors of one path, nearest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedAncestors {
    links: Vec<Link>,
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn inspect(path: &Path) -> Result<Option<fs::Metadata>, AncestryError> {
    match fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AncestryError::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

fn trusted(path: &Path, meta: &fs::Metadata) -> Result<Link, AncestryError> {
    if !meta.is_dir() {
        return Err(AncestryError::NotDirectory {
            path: path.to_owned(),
        });
    }
    let euid = euid();
    if meta.uid() != 0 && meta.uid() != euid {
        return Err(AncestryError::ForeignOwner {
            path: path.to_owned(),
            owner: meta.uid(),
            euid,
        });
    }
    let sticky = meta.mode() & 0o1000 != 0;
    if meta.mode() & 0o022 != 0 && !sticky {
        return Err(AncestryError::Writable {
            path: path.to_owned(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(Link {
        path: path.to_owned(),
        dev: meta.dev(),
        ino: meta.ino(),
        uid: meta.uid(),
        mode: meta.mode(),
    })
}

impl TrustedAncestors {
    /// Checks and records every strict ancestor of the absolute, canonical `path`.
    /// Every ancestor must exist.
    pub fn check(path: &Path) -> Result<Self, AncestryError> {
        let mut links = Vec::new();
        for ancestor in path.ancestors().skip(1) {
            let meta = inspect(ancestor)?.ok_or_else(|| AncestryError::Inspect {
                path: ancestor.to_owned(),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
            links.push(trusted(ancestor, &meta)?);
        }
        Ok(Self { links })
    }

    /// Checks the ancestors of `path` that exist, before the missing ones are created:
    /// a directory is never made below an untrusted one.
    pub fn check_existing(path: &Path) -> Result<(), AncestryError> {
        for ancestor in path.ancestors().skip(1) {
            if let Some(meta) = inspect(ancestor)? {
                trusted(ancestor, &meta)?;
            }
        }
        Ok(())
    }

    /// Re-reads every recorded ancestor; the first one that differs is the error.
    pub fn verify(&self) -> Result<(), AncestryError> {
        self.verify_in(&mut VerifyRound::default())
    }

    /// [`Self::verify`] as part of `round`: an ancestor another chain of the round
    /// recorded identically was just re-read and is not read again (pinned executables
    /// side by side share every ancestor).
    pub fn verify_in(&self, round: &mut VerifyRound) -> Result<(), AncestryError> {
        for link in &self.links {
            if round.verified.contains(link) {
                continue;
            }
            let changed = |what| AncestryError::Changed {
                path: link.path.clone(),
                what,
            };
            let meta = inspect(&link.path)?.ok_or_else(|| changed("it is gone"))?;
            if (meta.dev(), meta.ino()) != (link.dev, link.ino) {
                return Err(changed("replaced"));
            }
            if meta.uid() != link.uid {
                return Err(changed("owner"));
            }
            if meta.mode() != link.mode {
                return Err(changed("mode"));
            }
            round.verified.push(link.clone());
        }
        Ok(())
    }
}

/// The ancestors re-read so far in one check of several chains, each as recorded.
#[derive(Debug, Default)]
pub struct VerifyRound {
    verified: Vec<Link>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn writable_ancestor_is_refused_unless_sticky() {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        let ww = base.join("ww");
        fs::create_dir(&ww).unwrap();
        chmod(&ww, 0o777);
        let err = TrustedAncestors::check_existing(&ww.join("root/deeper")).unwrap_err();
        assert!(matches!(err, AncestryError::Writable { .. }), "{err}");
        assert_eq!(err.path(), ww);
        chmod(&ww, 0o1777);
        fs::create_dir(ww.join("root")).unwrap();
        let chain = TrustedAncestors::check(&ww.join("root/deeper")).unwrap();
        chain.verify().unwrap();
        chmod(&ww, 0o777);
        assert!(matches!(
            chain.verify(),
            Err(AncestryError::Changed { what: "mode", .. })
        ));
    }

    #[test]
    fn a_round_reads_a_shared_ancestor_once_and_still_sees_a_change() {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        fs::create_dir(base.join("bin")).unwrap();
        let one = TrustedAncestors::check(&base.join("bin/marsh")).unwrap();
        let two = TrustedAncestors::check(&base.join("bin/marshd")).unwrap();
        let mut round = VerifyRound::default();
        one.verify_in(&mut round).unwrap();
        let read = round.verified.len();
        two.verify_in(&mut round).unwrap();
        assert_eq!(
            round.verified.len(),
            read,
            "the shared chain was read twice"
        );
        chmod(&base.join("bin"), 0o777);
        let mut round = VerifyRound::default();
        assert!(matches!(
            one.verify_in(&mut round),
            Err(AncestryError::Changed { what: "mode", .. })
        ));
        assert!(two.verify_in(&mut round).is_err());
    }

    #[test]
    fn replaced_or_symlinked_ancestor_is_a_change() {
        let tmp = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(tmp.path()).unwrap();
        fs::create_dir(base.join("a")).unwrap();
        let chain = TrustedAncestors::check(&base.join("a/root")).unwrap();
        fs::rename(base.join("a"), base.join("b")).unwrap();
        std::os::unix::fs::symlink(base.join("b"), base.join("a")).unwrap();
        assert!(matches!(
            chain.verify(),
            Err(AncestryError::Changed {
                what: "replaced",
                ..
            })
        ));
        assert!(matches!(
            TrustedAncestors::check(&base.join("a/root")),
            Err(AncestryError::NotDirectory { .. })
        ));
    }
}
