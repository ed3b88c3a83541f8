//! The stand-in's control directory: `<control>/mcp/published/<key>/` holds one
//! publisher's declarations (`<NAME>.json`) and revocation markers (`<NAME>.revoking`),
//! `<key>` being the [`PublisherKey`] of its workspace and home; `<control>/mcp/
//! publication.lock` is held (flock, exclusive) for each whole transaction.
//!
//! Invariants: the control directory lies outside the marsh home and the workspace and
//! contains neither (compared on canonical paths, the missing tail of a path kept as
//! written); every directory on the way is created 0700 when missing, and must be a
//! real directory owned by the effective uid that no one else can write.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use marsh_publication::PublisherKey;

use super::TxError;
use crate::util;

/// How long a transaction waits for the lock before it is refused as busy.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(5);
const LOCK_POLL: Duration = Duration::from_millis(10);

/// One failing step on a control-directory path, naming the path.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{} is not a normal absolute path", .path.display())]
    NotNormal { path: PathBuf },
    #[error("cannot resolve {}", .path.display())]
    Unresolvable { path: PathBuf },
    #[error("cannot resolve {}: {source}", .path.display())]
    Resolve {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot inspect {}: {source}", .path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a directory", .path.display())]
    NotDirectory { path: PathBuf },
    #[error("{} is owned by uid {uid}, not by this user", .path.display())]
    ForeignOwner { path: PathBuf, uid: u32 },
    #[error("{} is writable by group or others (mode {mode:o})", .path.display())]
    Writable { path: PathBuf, mode: u32 },
    #[error("cannot list the published declarations: {source}")]
    List {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove {}: {source}", .path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("syncing {}: {source}", .path.display())]
    Sync {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<ControlError> for TxError {
    /// A failing check or listing changed nothing.
    fn from(e: ControlError) -> Self {
        TxError::Rejected(e.to_string())
    }
}

/// An opened (created, checked) control directory, for one publisher.
#[derive(Debug)]
pub struct ControlDir {
    /// Canonical `<control>/mcp/published/<key>`: this publisher's declarations only.
    published: PathBuf,
    /// Canonical `<control>/mcp/publication.lock`.
    lock: PathBuf,
}

/// Creates (when missing) and checks the control directory at `base`, which must not
/// overlap `home` or `workspace`, with the directory of their publisher (`workspace`
/// and `home` as the publisher holds them: canonical).
pub fn open(base: &Path, home: &Path, workspace: &Path) -> Result<ControlDir, TxError> {
    let key = PublisherKey::of(workspace, home);
    let control = canonical_prefix(base)?;
    for (what, area) in [("marsh home", home), ("workspace", workspace)] {
        let area = canonical_prefix(area)?;
        if control.starts_with(&area) || area.starts_with(&control) {
            return Err(TxError::Rejected(format!(
                "the control directory {} overlaps the {what} {}; set MARSH_CONTROL_HOME to a directory outside both",
                control.display(),
                area.display()
            )));
        }
    }
    let published = control.join("mcp").join("published").join(key.as_str());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&published)
        .map_err(|e| TxError::Rejected(format!("cannot create {}: {e}", published.display())))?;
    for dir in [
        control.as_path(),
        &control.join("mcp"),
        &control.join("mcp").join("published"),
        &published,
    ] {
        check_private_dir(dir)?;
    }
    let mcp = fs::canonicalize(control.join("mcp"))
        .map_err(|e| TxError::Rejected(format!("cannot resolve the control directory: {e}")))?;
    Ok(ControlDir {
        published: mcp.join("published").join(key.as_str()),
        lock: mcp.join("publication.lock"),
    })
}

impl ControlDir {
    /// The same control directory as an earlier release laid it out (declarations
    /// directly in `published/`, one namespace for every workspace), for revoking what
    /// that release published.
    pub fn legacy(&self) -> ControlDir {
        ControlDir {
            published: self
                .published
                .parent()
                .map_or_else(|| self.published.clone(), Path::to_path_buf),
            lock: self.lock.clone(),
        }
    }

    /// The declaration of tool `name` (a valid tool name: no `/`, not dots only).
    pub fn declaration_path(&self, name: &str) -> PathBuf {
        self.published.join(format!("{name}.json"))
    }

    pub fn published_dir(&self) -> &Path {
        &self.published
    }

    /// How many declarations this publisher holds (every `*.json` of its directory).
    pub fn declaration_count(&self) -> Result<usize, ControlError> {
        let entries =
            fs::read_dir(&self.published).map_err(|source| ControlError::List { source })?;
        Ok(entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .count())
    }

    fn marker_path(&self, name: &str) -> PathBuf {
        self.published.join(format!("{name}.revoking"))
    }

    /// Takes the transaction lock (held until the file is dropped); busy after
    /// [`LOCK_TIMEOUT`].
    pub fn lock(&self) -> Result<File, TxError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&self.lock)
            .map_err(|e| TxError::Rejected(format!("cannot open {}: {e}", self.lock.display())))?;
        let deadline = Instant::now() + LOCK_TIMEOUT;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(file),
                Err(fs::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(LOCK_POLL);
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(TxError::Rejected(
                        "busy: another publication transaction is running".into(),
                    ));
                }
                Err(fs::TryLockError::Error(e)) => {
                    return Err(TxError::Rejected(format!(
                        "cannot lock {}: {e}",
                        self.lock.display()
                    )));
                }
            }
        }
    }

    /// True while an unpublish of `name` is pending (its marker exists).
    pub fn revocation_pending(&self, name: &str) -> Result<bool, TxError> {
        let path = self.marker_path(name);
        match fs::symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(TxError::Rejected(format!(
                "cannot inspect {}: {e}",
                path.display()
            ))),
        }
    }

    /// Writes the revocation marker durably. Nothing changed when creating it fails
    /// (rejected); a failure once it exists is uncertain.
    pub fn mark_revocation(&self, name: &str) -> Result<(), TxError> {
        let path = self.marker_path(name);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| TxError::Rejected(format!("cannot create {}: {e}", path.display())))?;
        file.sync_all()
            .and_then(|()| sync_dir(&self.published))
            .map_err(|e| TxError::Uncertain(format!("syncing {}: {e}", path.display())))
    }

    /// Removes the revocation marker (absent is fine) durably.
    pub fn clear_revocation(&self, name: &str) -> Result<(), ControlError> {
        remove_durably(&self.marker_path(name), &self.published)
    }

    /// Removes the declaration (absent is fine) durably.
    pub fn remove_declaration(&self, name: &str) -> Result<(), ControlError> {
        remove_durably(&self.declaration_path(name), &self.published)
    }
}

fn remove_durably(path: &Path, dir: &Path) -> Result<(), ControlError> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ControlError::Remove {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    sync_dir(dir).map_err(|source| ControlError::Sync {
        path: dir.to_path_buf(),
        source,
    })
}

pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A real directory owned by the effective uid, not writable by group or others.
fn check_private_dir(dir: &Path) -> Result<(), ControlError> {
    let path = || dir.to_path_buf();
    let meta = fs::symlink_metadata(dir).map_err(|source| ControlError::Inspect {
        path: path(),
        source,
    })?;
    if !meta.file_type().is_dir() {
        return Err(ControlError::NotDirectory { path: path() });
    }
    if meta.uid() != util::euid() {
        return Err(ControlError::ForeignOwner {
            path: path(),
            uid: meta.uid(),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(ControlError::Writable {
            path: path(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(())
}

/// `path` with its longest existing ancestor canonicalized and the missing rest kept
/// as written. `path` must be absolute and free of `.`/`..` components.
pub fn canonical_prefix(path: &Path) -> Result<PathBuf, ControlError> {
    if !path.is_absolute()
        || path
            .components()
            .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(ControlError::NotNormal {
            path: path.to_path_buf(),
        });
    }
    let mut existing = path.to_path_buf();
    let mut missing: Vec<OsString> = Vec::new();
    loop {
        match fs::canonicalize(&existing) {
            Ok(mut found) => {
                found.extend(missing.iter().rev());
                return Ok(found);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                match (existing.file_name(), existing.parent()) {
                    (Some(name), Some(parent)) => {
                        missing.push(name.to_os_string());
                        existing = parent.to_path_buf();
                    }
                    _ => {
                        return Err(ControlError::Unresolvable {
                            path: path.to_path_buf(),
                        });
                    }
                }
            }
            Err(source) => {
                return Err(ControlError::Resolve {
                    path: existing,
                    source,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn canonical_prefix_keeps_the_missing_tail() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
        assert_eq!(
            canonical_prefix(&dir.path().join("link/a/b")).unwrap(),
            real.join("a/b")
        );
        assert!(canonical_prefix(Path::new("rel")).is_err());
        assert!(canonical_prefix(&dir.path().join("a/../b")).is_err());
    }

    #[test]
    fn open_creates_private_dirs_and_refuses_overlaps() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (home, ws) = (dir.path().join("home"), dir.path().join("ws"));
        fs::create_dir(&ws).unwrap();
        let control = dir.path().join("ctl");
        let opened = open(&control, &home, &ws).unwrap();
        for d in [
            &control,
            &control.join("mcp"),
            &control.join("mcp/published"),
        ] {
            assert_eq!(fs::metadata(d).unwrap().mode() & 0o777, 0o700, "{d:?}");
        }
        let key = PublisherKey::of(&ws, &home);
        assert!(
            opened
                .declaration_path("x")
                .ends_with(format!("mcp/published/{}/x.json", key.as_str()))
        );
        for (base, h, w) in [
            (home.join("ctl"), &home, &ws),
            (ws.join("ctl"), &home, &ws),
            (dir.path().to_path_buf(), &home, &ws),
        ] {
            assert!(
                matches!(open(&base, h, w), Err(TxError::Rejected(_))),
                "{base:?}"
            );
        }
        fs::set_permissions(&control, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            open(&control, &home, &ws),
            Err(TxError::Rejected(_))
        ));
    }

    #[test]
    fn markers_and_lock() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        fs::create_dir(&ws).unwrap();
        let opened = open(&dir.path().join("ctl"), &dir.path().join("h"), &ws).unwrap();
        assert!(!opened.revocation_pending("t").unwrap());
        opened.mark_revocation("t").unwrap();
        assert!(opened.revocation_pending("t").unwrap());
        let mode = fs::metadata(opened.published_dir().join("t.revoking"))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        opened.clear_revocation("t").unwrap();
        opened.clear_revocation("t").unwrap();
        assert!(!opened.revocation_pending("t").unwrap());
        let held = opened.lock().unwrap();
        let started = Instant::now();
        match opened.lock() {
            Err(TxError::Rejected(reason)) => {
                assert_eq!(reason, "busy: another publication transaction is running")
            }
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() >= LOCK_TIMEOUT);
        drop(held);
        opened.lock().unwrap();
    }
}
