//! The layout of a marsh home (`$MARSH_HOME`, else `~/.marsh`) as the README fixes it.

use std::ffi::OsString;
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::error::{Context, Error, Result};
use crate::util;

/// A home directory path. Holding one proves nothing about the directory; callers that
/// need it to exist call [`Home::ensure`] (creation) or [`Home::exists`] (probe).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// Resolves the home from `MARSH_HOME` (made absolute against `cwd`), else
    /// `$HOME/.marsh`, else the passwd home of the effective uid + `/.marsh`.
    pub fn from_env(
        marsh_home: Option<OsString>,
        home: Option<OsString>,
        cwd: &Path,
    ) -> Result<Self> {
        let root = match marsh_home.filter(|v| !v.is_empty()) {
            Some(v) => cwd.join(PathBuf::from(v)),
            None => {
                let base = match home.filter(|v| !v.is_empty()) {
                    Some(h) => PathBuf::from(h),
                    None => passwd_home()?,
                };
                base.join(".marsh")
            }
        };
        Ok(Self::at(lexically_normal(&root)))
    }

    /// A home at an explicit path, canonicalized when it already exists.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let root = fs::canonicalize(&path).unwrap_or(path);
        Self { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// True when the home exists as a directory (symlinks to directories count, as
    /// they did when the path was canonicalized).
    pub fn exists(&self) -> bool {
        fs::metadata(&self.root)
            .map(|m| m.is_dir())
            .unwrap_or(false)
    }

    /// Creates the home (owner-only) when missing and re-canonicalizes its path.
    pub fn ensure(&mut self) -> Result<()> {
        if !self.exists() {
            if let Some(parent) = self.root.parent() {
                fs::create_dir_all(parent).context(|| format!("creating {}", parent.display()))?;
            }
            util::ensure_private_dir(&self.root)?;
        }
        self.root = fs::canonicalize(&self.root)
            .context(|| format!("resolving {}", self.root.display()))?;
        Ok(())
    }

    pub fn daemon_dir(&self) -> PathBuf {
        self.root.join("daemon")
    }
    pub fn socket_path(&self) -> PathBuf {
        self.daemon_dir().join(SOCKET_NAME)
    }
    pub fn token_path(&self) -> PathBuf {
        self.daemon_dir().join("token")
    }
    pub fn pid_path(&self) -> PathBuf {
        self.daemon_dir().join("pid")
    }
    pub fn log_path(&self) -> PathBuf {
        self.daemon_dir().join("marshd.log")
    }
    /// Held (flock) by a `marsh` while it boots a daemon, so only one boots.
    pub fn boot_lock_path(&self) -> PathBuf {
        self.daemon_dir().join("boot.lock")
    }
    /// Held (flock) by the daemon for its whole life: free means no daemon.
    pub fn daemon_lock_path(&self) -> PathBuf {
        self.daemon_dir().join("daemon.lock")
    }
    /// Private scratch of an unconfined project shell (kit socket and wrappers).
    pub fn unconfined_agent_dir(&self) -> PathBuf {
        self.daemon_dir().join("agent")
    }
    pub fn results_dir(&self) -> PathBuf {
        self.root.join("results")
    }
    pub fn kits_dir(&self) -> PathBuf {
        self.root.join("kits")
    }
    /// The owner-only directory holding [`Home::guest_home`], never mounted into a
    /// sandbox: whatever mode a job gives its `HOME` (a job may `chmod 755 ~`), no
    /// other host user passes this one to reach what the job left there (a set-id
    /// file made by a root server's job, say).
    pub fn guest_dir(&self) -> PathBuf {
        self.root.join("guest")
    }
    /// What the project shell's jobs see as their `HOME`: kept across commands, stops
    /// and resets, removed with the home. The only part of the home a job ever sees;
    /// settings, receipts and the daemon's files stay outside it.
    pub fn guest_home(&self) -> PathBuf {
        self.guest_dir().join("home")
    }
    /// Where an earlier layout kept the guest `HOME` (directly in the home, with no
    /// directory of its own around it); moved to [`Home::guest_home`] at boot.
    pub fn legacy_guest_home(&self) -> PathBuf {
        self.root.join("guest-home")
    }
}

pub const SOCKET_NAME: &str = "marshd.sock";

/// The passwd home of the effective uid (never `$HOME`).
pub(crate) fn passwd_home() -> Result<PathBuf> {
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .context(|| "looking up the passwd entry of the effective uid".to_string())?
        .ok_or_else(|| Error::failed("no passwd entry for the effective uid; set MARSH_HOME"))?;
    Ok(user.dir)
}

/// Removes `.` components and resolves `..` lexically, so a home path never carries
/// traversal components into the sandbox layout or the socket path.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn marsh_home_wins_and_is_made_absolute() {
        let h = Home::from_env(
            Some("rel/./h".into()),
            Some("/nonexistent-home".into()),
            Path::new("/base"),
        )
        .unwrap();
        assert_eq!(h.root(), Path::new("/base/rel/h"));
        let h = Home::from_env(None, Some("/nonexistent-home".into()), Path::new("/base")).unwrap();
        assert_eq!(h.root(), Path::new("/nonexistent-home/.marsh"));
        assert_eq!(
            h.socket_path(),
            Path::new("/nonexistent-home/.marsh/daemon/marshd.sock")
        );
    }

    #[test]
    fn ensure_creates_owner_only_home() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let mut h = Home::at(dir.path().join("a/b/home"));
        assert!(!h.exists());
        h.ensure().unwrap();
        assert!(h.exists());
        assert_eq!(fs::metadata(h.root()).unwrap().mode() & 0o777, 0o700);
    }
}
