//! The project shell's guest `HOME`: a directory of the marsh home
//! ([`crate::home::Home::guest_home`]) bound writable at the caller's `HOME` path, so
//! caches (cargo, pip, npm) and dotfiles survive commands, stops and resets.
//!
//! Jobs write this directory, and later mounts (the workspace, exposed directories)
//! may land inside it, where bubblewrap creates their mount points and follows
//! symlinks on the way. A link left there by a job would move a mount to a place the
//! job chose (the writable workspace over `/run/marsh`, say). So before each shell
//! starts, while no job of this scope runs, every mount point under the guest `HOME`
//! is made a real directory, walking by descriptor with `O_NOFOLLOW` from the backing
//! directory: a missing component is created, anything else that is not a directory
//! (a link, a file) is renamed aside to `NAME.displaced-<unix seconds>-<inode>` first.
//!
//! A job may leave a set-id file there (bubblewrap binds with `nosuid`, which holds
//! inside the sandbox only), and may change its `HOME`'s mode. Unlike the workspace,
//! which the set-id guard covers, the guest `HOME` lies inside
//! [`crate::home::Home::guest_dir`], owner-only and never mounted, so no other host
//! user can reach such a file to run it.
//!
//! Rejected alternative: refusing the boot instead. Only a person on the host could
//! then repair the scope, while what is renamed aside stays in the guest `HOME`.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, open, openat, renameat};
use nix::sys::stat::{Mode, fstatat, mkdirat};

use crate::error::{Error, Result};

/// Makes every mount point in `targets` that lies under `at` (the guest `HOME` path)
/// a real directory under `backing`, which is bound at `at`.
pub fn prepare_mount_points(backing: &Path, at: &Path, targets: &[&Path]) -> Result<()> {
    for target in targets {
        let Ok(rest) = target.strip_prefix(at) else {
            continue;
        };
        let fail = |step: &str, e: Errno| {
            Error::failed(format!(
                "preparing the mount point ~/{} in the guest HOME: {step}: {e}",
                rest.display()
            ))
        };
        let mut dir = open(
            backing,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail("opening the guest HOME", e))?;
        for component in rest.components() {
            let Component::Normal(name) = component else {
                return Err(fail("a component is not a plain name", Errno::EINVAL));
            };
            dir = descend(&dir, name).map_err(|(step, e)| fail(step, e))?;
        }
    }
    Ok(())
}

/// Opens `name` in `dir` as a real directory, creating it or first renaming aside
/// whatever else is there.
fn descend(dir: &OwnedFd, name: &OsStr) -> std::result::Result<OwnedFd, (&'static str, Errno)> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(dir.as_fd(), name, flags, Mode::empty()) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) => {}
        Err(Errno::ENOTDIR | Errno::ELOOP) => {
            // O_PATH|O_NOFOLLOW on a link opens the link itself (no ELOOP); the
            // O_DIRECTORY check then fails with ENOTDIR, as for a file.
            let stat = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| ("inspecting an entry", e))?;
            let seconds = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let mut aside = OsString::from(name);
            aside.push(format!(".displaced-{seconds}-{}", stat.st_ino));
            renameat(dir.as_fd(), name, dir.as_fd(), aside.as_os_str())
                .map_err(|e| ("renaming aside what is not a directory", e))?;
        }
        Err(e) => return Err(("opening a directory", e)),
    }
    match mkdirat(dir.as_fd(), name, Mode::from_bits_truncate(0o700)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(("creating a directory", e)),
    }
    openat(dir.as_fd(), name, flags, Mode::empty()).map_err(|e| ("opening a directory", e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::fs;

    #[test]
    fn links_and_files_on_the_way_are_renamed_aside_and_directories_made() {
        let dir = tempfile::tempdir().unwrap();
        let backing = dir.path().join("guest");
        let elsewhere = dir.path().join("elsewhere");
        fs::create_dir_all(backing.join("keep/inner")).unwrap();
        fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, backing.join("project")).unwrap();
        fs::write(backing.join(".rustup"), "a file").unwrap();
        let at = Path::new("/home/u");
        prepare_mount_points(
            &backing,
            at,
            &[
                Path::new("/home/u/project/ws"),
                Path::new("/home/u/.rustup"),
                Path::new("/home/u/keep/inner"),
                Path::new("/opt/elsewhere"),
            ],
        )
        .unwrap();
        for made in ["project/ws", ".rustup", "keep/inner"] {
            let meta = fs::symlink_metadata(backing.join(made)).unwrap();
            assert!(meta.is_dir(), "{made}");
        }
        assert!(fs::read_dir(&elsewhere).unwrap().next().is_none());
        let aside: Vec<String> = fs::read_dir(&backing)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".displaced-"))
            .collect();
        assert_eq!(aside.len(), 2, "{aside:?}");
    }
}
