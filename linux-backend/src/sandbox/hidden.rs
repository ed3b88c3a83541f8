//! What a job must not read inside a directory its `/etc` allows ([`super::etc`]).
//!
//! Jobs run as the server's uid. When that is root, owner permissions let a job read
//! root-owned files (the user namespace removes capabilities, not ownership). So every
//! entry of an allowed directory that an unprivileged host user could not read is
//! covered: files by an empty read-only file, directories by an empty read-only tmpfs.
//! The scan runs once per daemon boot.
//!
//! Scope: the allowed directories of `/etc` only. `/usr`, `/bin`, `/sbin` and `/lib*`
//! hold package-managed software, world-readable by Debian policy; walking them (over
//! 100,000 entries) at every daemon start was rejected as too slow for what it would
//! find.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A path to cover inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hidden {
    File(PathBuf),
    Dir(PathBuf),
}

impl Hidden {
    /// The bubblewrap arguments covering it: an empty read-only file (`/dev/null`)
    /// over a file, an empty read-only tmpfs over a directory.
    pub fn cover_args(&self) -> Vec<&std::ffi::OsStr> {
        match self {
            Hidden::File(path) => {
                vec!["--ro-bind".as_ref(), "/dev/null".as_ref(), path.as_os_str()]
            }
            Hidden::Dir(path) => vec![
                "--tmpfs".as_ref(),
                path.as_os_str(),
                "--remount-ro".as_ref(),
                path.as_os_str(),
            ],
        }
    }
}

/// Bound on the entries scanned, so a pathological `/etc` cannot stall a boot.
const SCAN_LIMIT: usize = 100_000;

/// Entries under `root` (itself excluded) that others cannot read; a covered directory
/// is not descended into.
pub fn unreadable_under(root: &Path) -> Vec<Hidden> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = pending.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > SCAN_LIMIT {
                return found;
            }
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            let mode = meta.permissions().mode();
            let file_type = meta.file_type();
            if file_type.is_dir() {
                // Others need r to list and x to reach anything inside.
                // Mounts below /etc are descended into too: the recursive bind exposes them.
                if mode & 0o005 != 0o005 {
                    found.push(Hidden::Dir(path));
                } else {
                    pending.push(path);
                }
            } else if file_type.is_file() && mode & 0o004 == 0 {
                found.push(Hidden::File(path));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn unreadable_files_and_dirs_are_found_and_readable_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("open"), "x").unwrap();
        fs::write(root.join("secret"), "x").unwrap();
        fs::set_permissions(root.join("secret"), fs::Permissions::from_mode(0o640)).unwrap();
        fs::create_dir(root.join("private")).unwrap();
        fs::write(root.join("private/inner"), "x").unwrap();
        fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o710)).unwrap();
        fs::create_dir(root.join("sub")).unwrap();
        fs::write(root.join("sub/key"), "x").unwrap();
        fs::set_permissions(root.join("sub/key"), fs::Permissions::from_mode(0o600)).unwrap();
        let mut found = unreadable_under(root);
        found.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        assert_eq!(
            found,
            vec![
                Hidden::Dir(root.join("private")),
                Hidden::File(root.join("secret")),
                Hidden::File(root.join("sub/key")),
            ]
        );
    }
}
