//! The programs a publication runs (sbx) or pins in a registration (marsh-mcp, marsh)
//! must be files no job could have written: a job of the project shell can ask for a
//! publication at any time, and the daemon then runs sbx on the host, unsandboxed.
//!
//! The rules are the server's pin rules (docs/security.md): a regular executable file owned by root or the
//! effective uid, writable by no one else, outside the workspace and the home, below
//! ancestors that are each owned by root or the effective uid and writable by no one
//! else (a sticky directory such as `/tmp` excepted). Checked before every use; a file
//! replaced after the check would have needed write access to a checked directory.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn trusted_owner(uid: u32, euid: u32) -> bool {
    uid == 0 || uid == euid
}

/// `None` when `path` (canonical) may be run or pinned; else what is wrong with it.
pub fn untrusted_program(path: &Path, workspace: &Path, home: &Path) -> Option<String> {
    if !path.is_absolute() {
        return Some("not an absolute path".into());
    }
    for (area, dir) in [("workspace", workspace), ("home", home)] {
        if path.starts_with(dir) {
            return Some(format!("it lies inside the {area}"));
        }
    }
    let euid = nix::unistd::geteuid().as_raw();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) => return Some(format!("cannot inspect it: {e}")),
    };
    if !meta.file_type().is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Some("not an executable regular file".into());
    }
    if !trusted_owner(meta.uid(), euid) || meta.mode() & 0o022 != 0 {
        return Some(format!(
            "owned by uid {} with mode {:o}: it must be root's or ours and writable by no one else",
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    for dir in path.ancestors().skip(1) {
        let meta = match std::fs::symlink_metadata(dir) {
            Ok(meta) => meta,
            Err(e) => return Some(format!("cannot inspect {}: {e}", dir.display())),
        };
        let sticky = meta.mode() & 0o1000 != 0;
        if !meta.is_dir()
            || !trusted_owner(meta.uid(), euid)
            || (meta.mode() & 0o022 != 0 && !sticky)
        {
            return Some(format!(
                "its directory {} is not root's or ours, or others can write it",
                dir.display()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::fs;

    use super::*;

    #[test]
    fn only_private_executables_outside_workspace_and_home_are_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        let (bin, ws, home) = (base.join("bin"), base.join("ws"), base.join("home"));
        for d in [&bin, &ws, &home] {
            fs::create_dir(d).unwrap();
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        let program = |dir: &Path, mode: u32| {
            let path = dir.join("sbx");
            fs::write(&path, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        let good = program(&bin, 0o755);
        assert_eq!(untrusted_program(&good, &ws, &home), None);
        assert!(untrusted_program(&program(&ws, 0o755), &ws, &home).is_some());
        assert!(untrusted_program(&program(&home, 0o755), &ws, &home).is_some());
        let writable = program(&bin, 0o775);
        assert!(untrusted_program(&writable, &ws, &home).is_some());
        fs::set_permissions(&writable, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(
            untrusted_program(&writable, &ws, &home).is_some(),
            "not executable"
        );
        fs::set_permissions(&writable, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(
            untrusted_program(&writable, &ws, &home).is_some(),
            "open directory"
        );
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(
            untrusted_program(&writable, &ws, &home),
            None,
            "sticky directory"
        );
    }
}
