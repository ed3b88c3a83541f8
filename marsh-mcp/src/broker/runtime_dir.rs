//! The broker's runtime directory: short, owner-only, derived from the scope root, and
//! never at a path another local user can take first.
//!
//! Unix socket paths are limited to about 104-108 bytes, and a scope root can be
//! deeper than that, so the socket never lives under the root. Candidates, in order:
//! 1. `$XDG_RUNTIME_DIR/marsh-mcp-<euid>-<16 hex of sha256(root)>/`: the login's own
//!    private directory, when set, absolute and short enough;
//! 2. `${XDG_STATE_HOME:-$HOME/.local/state}/marsh-mcp-run/<16 hex>/`: inside the
//!    user's own home, when the socket path fits and every existing directory on the
//!    way belongs to the user or root and no one else can write it (a sticky directory
//!    such as `/tmp` excepted): a `HOME` of `/tmp` does not make a shared path private;
//! 3. `/tmp/marsh-mcp-<euid>-<16 hex>/`: only when neither fits (a home deeper than
//!    about 50 bytes and no runtime directory). That path is predictable in a shared
//!    directory: another user can create it first, and then it fails verification and
//!    the start is refused with [`RuntimeDir::squat_advice`] naming the fix.
//!
//! Rejected alternative: a random name under `/tmp`. Clients started later by a
//! gateway (with their own environment) must find the broker's socket from the root
//! alone, so every candidate is a pure function of the root and the environment.

use std::path::{Path, PathBuf};

use marsh_scope_registry::{RegistryError, ensure_owner_only_dir};
use sha2::{Digest, Sha256};

/// The longest socket path used (`sun_path` holds 108 bytes with its NUL; macOS 104).
const SOCKET_PATH_MAX: usize = 100;
/// Longest `$XDG_RUNTIME_DIR` honoured (kept from the first release: clients and
/// brokers of one build must agree).
const XDG_RUNTIME_MAX: usize = 48;
const SOCKET_NAME: &str = "broker.sock";

/// Where a runtime directory lives, which decides how a failed check is explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    XdgRuntime,
    StateHome,
    SharedTmp,
}

#[derive(Debug, Clone)]
pub struct RuntimeDir {
    dir: PathBuf,
    base: Base,
}

impl RuntimeDir {
    /// Every place the runtime directory of `root` may be, most preferred first (the
    /// last is always the shared `/tmp` one). `lookup` gives an environment variable.
    pub fn candidates(root: &Path, lookup: impl Fn(&str) -> Option<PathBuf>) -> Vec<Self> {
        let digest = hex::encode(Sha256::digest(root.as_os_str().as_encoded_bytes()));
        let short = &digest[..16];
        let per_uid = format!("marsh-mcp-{}-{short}", nix::unistd::geteuid().as_raw());
        let mut out = Vec::new();
        if let Some(xdg) = lookup("XDG_RUNTIME_DIR")
            .filter(|d| d.is_absolute() && d.as_os_str().len() <= XDG_RUNTIME_MAX)
        {
            out.push(Self {
                dir: xdg.join(&per_uid),
                base: Base::XdgRuntime,
            });
        }
        let state = lookup("XDG_STATE_HOME")
            .filter(|d| d.is_absolute())
            .or_else(|| {
                lookup("HOME")
                    .filter(|d| d.is_absolute())
                    .map(|home| home.join(".local/state"))
            });
        if let Some(state) = state {
            let candidate = Self {
                dir: state.join("marsh-mcp-run").join(short),
                base: Base::StateHome,
            };
            if candidate.socket().as_os_str().len() <= SOCKET_PATH_MAX
                && ancestors_are_private(&candidate.dir)
            {
                out.push(candidate);
            }
        }
        out.push(Self {
            dir: Path::new("/tmp").join(per_uid),
            base: Base::SharedTmp,
        });
        out
    }

    /// The runtime directory a broker of `root` uses in this environment.
    pub fn preferred(root: &Path, lookup: impl Fn(&str) -> Option<PathBuf>) -> Self {
        let mut all = Self::candidates(root, lookup);
        all.swap_remove(0)
    }

    /// Creates it owner-only when absent and verifies it (no symlink, our uid, 0700).
    pub fn prepare(&self) -> Result<(), RegistryError> {
        ensure_owner_only_dir(&self.dir).map(|_| ())
    }

    /// Verifies an existing directory without creating it.
    pub fn verify(&self) -> Result<(), RegistryError> {
        marsh_scope_registry::verify_owner_only_dir(&self.dir).map(|_| ())
    }

    /// What to do when [`RuntimeDir::prepare`] failed: for the shared `/tmp` fallback,
    /// how to move off it; elsewhere nothing (the error names the path).
    pub fn squat_advice(&self) -> Option<String> {
        (self.base == Base::SharedTmp).then(|| {
            format!(
                "{} is in a directory every local user can write, and another user may \
                 have created it first; set XDG_RUNTIME_DIR to a private directory of at \
                 most {XDG_RUNTIME_MAX} bytes, or give a HOME (or XDG_STATE_HOME) short \
                 enough for a socket path, and start again",
                self.dir.display()
            )
        })
    }

    #[cfg(test)]
    fn base(&self) -> Base {
        self.base
    }

    #[cfg(test)]
    fn path(&self) -> &Path {
        &self.dir
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join(SOCKET_NAME)
    }

    pub fn token(&self) -> PathBuf {
        self.dir.join("auth-token")
    }

    /// Held (flock) by a starter from its probe until its broker answers, so
    /// concurrent starters spawn one broker and agree on one token.
    pub fn start_lock(&self) -> PathBuf {
        self.dir.join("start.lock")
    }

    pub fn pid(&self) -> PathBuf {
        self.dir.join("broker.pid")
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join("broker.log")
    }
}

/// Whether every existing directory above `dir` belongs to this user or root and is
/// writable by no one else, or is sticky (where no one can move another's entry).
fn ancestors_are_private(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid().as_raw();
    dir.ancestors().skip(1).all(|ancestor| {
        match std::fs::metadata(ancestor) {
            Ok(meta) => {
                let owner_ok = meta.uid() == euid || meta.uid() == 0;
                let sticky = meta.mode() & 0o1000 != 0;
                meta.is_dir() && owner_ok && (meta.mode() & 0o022 == 0 || sticky)
            }
            // Created by us, owner-only, when the directory is prepared.
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<PathBuf> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| PathBuf::from(v))
        }
    }

    #[test]
    fn long_roots_still_give_short_socket_paths() {
        let root = PathBuf::from(format!("/{}", "r".repeat(300)));
        for dir in RuntimeDir::candidates(&root, env(&[("HOME", "/root")])) {
            assert!(
                dir.socket().as_os_str().len() <= SOCKET_PATH_MAX,
                "{}",
                dir.socket().display()
            );
        }
        let a = RuntimeDir::preferred(&root, env(&[]));
        let b = RuntimeDir::preferred(Path::new("/other"), env(&[]));
        assert_ne!(a.dir, b.dir);
    }

    #[test]
    fn without_a_runtime_dir_the_users_own_state_dir_comes_before_tmp() {
        let root = Path::new("/r");
        let dir = RuntimeDir::preferred(root, env(&[("HOME", "/home/u")]));
        assert_eq!(dir.base(), Base::StateHome);
        assert!(dir.path().starts_with("/home/u/.local/state/marsh-mcp-run"));
        let state =
            RuntimeDir::preferred(root, env(&[("HOME", "/home/u"), ("XDG_STATE_HOME", "/s")]));
        assert!(state.path().starts_with("/s/marsh-mcp-run"));
        let xdg = RuntimeDir::preferred(
            root,
            env(&[("HOME", "/home/u"), ("XDG_RUNTIME_DIR", "/run/user/1")]),
        );
        assert_eq!(xdg.base(), Base::XdgRuntime);
        assert!(xdg.squat_advice().is_none());
    }

    #[test]
    fn a_home_below_another_users_directory_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let home = shared.join("home");
        let home = home.to_str().unwrap();
        let dir = RuntimeDir::preferred(Path::new("/r"), env(&[("HOME", home)]));
        assert_eq!(dir.base(), Base::SharedTmp, "{}", dir.path().display());
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let dir = RuntimeDir::preferred(Path::new("/r"), env(&[("HOME", home)]));
        assert_eq!(dir.base(), Base::StateHome);
    }

    #[test]
    fn only_a_home_too_deep_for_a_socket_falls_back_to_tmp_with_advice() {
        let deep = format!("/{}", "h".repeat(80));
        let dir = RuntimeDir::preferred(Path::new("/r"), env(&[("HOME", &deep)]));
        assert_eq!(dir.base(), Base::SharedTmp);
        assert!(dir.squat_advice().unwrap().contains("XDG_RUNTIME_DIR"));
        let relative = RuntimeDir::preferred(
            Path::new("/r"),
            env(&[("XDG_RUNTIME_DIR", "run"), ("HOME", "rel")]),
        );
        assert_eq!(relative.base(), Base::SharedTmp);
    }
}
