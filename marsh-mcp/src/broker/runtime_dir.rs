//! The broker's runtime directory: short, owner-only, derived from the scope root.
//!
//! Unix socket paths are limited to about 104-108 bytes, and a scope root can be
//! deeper than that, so the socket never lives under the root: it lives in
//! `$XDG_RUNTIME_DIR/marsh-mcp-<euid>-<16 hex of sha256(root)>/` (or under `/tmp`).

use std::path::{Path, PathBuf};

use marsh_scope_registry::{RegistryError, ensure_owner_only_dir};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone)]
pub struct RuntimeDir {
    dir: PathBuf,
}

impl RuntimeDir {
    /// Where the runtime directory of `root` is. `xdg_runtime` is honoured only when it
    /// is absolute and short enough to keep the socket path within the limit.
    pub fn locate(root: &Path, xdg_runtime: Option<&Path>) -> Self {
        let digest = hex::encode(Sha256::digest(root.as_os_str().as_encoded_bytes()));
        let name = format!(
            "marsh-mcp-{}-{}",
            nix::unistd::geteuid().as_raw(),
            &digest[..16]
        );
        let base = match xdg_runtime {
            Some(dir) if dir.is_absolute() && dir.as_os_str().len() <= 48 => dir.to_path_buf(),
            _ => PathBuf::from("/tmp"),
        };
        Self {
            dir: base.join(name),
        }
    }

    /// Creates it owner-only when absent and verifies it (no symlink, our uid, 0700).
    pub fn prepare(&self) -> Result<(), RegistryError> {
        ensure_owner_only_dir(&self.dir).map(|_| ())
    }

    /// Verifies an existing directory without creating it.
    pub fn verify(&self) -> Result<(), RegistryError> {
        marsh_scope_registry::verify_owner_only_dir(&self.dir).map(|_| ())
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("broker.sock")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_roots_still_give_short_socket_paths() {
        let root = PathBuf::from(format!("/{}", "r".repeat(300)));
        let dir = RuntimeDir::locate(&root, None);
        assert!(
            dir.socket().as_os_str().len() < 100,
            "{}",
            dir.socket().display()
        );
        let other = RuntimeDir::locate(Path::new("/other"), None);
        assert_ne!(dir.dir, other.dir);
        let relative = RuntimeDir::locate(&root, Some(Path::new("run")));
        assert!(relative.dir.starts_with("/tmp"));
    }
}
