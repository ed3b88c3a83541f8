//! Safe removal of one scope home `<root>/<uuid>/`.
//!
//! Invariants:
//! - Every filesystem access below `parent` goes through a directory file descriptor
//!   (`openat` with `O_DIRECTORY|O_NOFOLLOW|O_CLOEXEC`, `fstatat` with
//!   `AT_SYMLINK_NOFOLLOW`, `unlinkat`); no path below `parent` is ever resolved twice and
//!   no symbolic link is ever followed. A symlink is removed itself, its target is never
//!   touched.
//! - Phase 1 (validation) is read-only and bounded by [`RemovalLimits`]: any violation
//!   returns an error before anything is deleted.
//! - Phase 2 (deletion) runs synchronously in the caller's thread, deepest first, and
//!   re-checks every entry's `(dev, ino)` against the phase-1 record right before
//!   unlinking it; it stops at the first discrepancy. Once an error is returned, no
//!   deletion continues anywhere.
//! - Memory, recursion depth and open descriptors are bounded by `max_entries` and
//!   `max_depth` (one open directory per level).
//! - The walk never crosses into another mount: every entry's mount id (`statx`) must be
//!   the home's, so a bind mount inside a home (even of the same filesystem, which
//!   `st_dev` cannot tell) refuses the removal before anything is deleted. A kernel that
//!   cannot report mount ids refuses every removal that has entries.

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{open, openat};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::DirIdentity;
use crate::fs_safety::atomic::DIR_FLAGS;
use crate::fs_safety::mount_id::{MountIdError, mount_id_at};

/// Bounds of the validation walk. Exceeding either refuses the whole removal.
#[derive(Debug, Clone, Copy)]
pub struct RemovalLimits {
    /// Maximum number of entries below the home (the home itself not counted).
    pub max_entries: usize,
    /// Maximum depth of an entry; the home's direct children are at depth 1.
    pub max_depth: usize,
}

impl Default for RemovalLimits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_depth: 64,
        }
    }
}

/// What a successful removal deleted. Counts are of entries below the home; the home
/// itself is counted in none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemovalReport {
    /// Every entry removed below the home (files, symlinks and directories).
    pub entries: usize,
    /// Symbolic links unlinked (never followed).
    pub symlinks_unlinked: usize,
    /// Directories removed below the home.
    pub directories: usize,
}

/// Why a removal was refused or stopped. Every variant names the path it failed on.
#[derive(Debug, thiserror::Error)]
pub enum RemovalError {
    #[error("invalid scope home name {path:?}: must be a single path component")]
    InvalidName { path: PathBuf },
    #[error("cannot open {path:?} without following links: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot inspect {path:?}: {source}")]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot list directory {path:?}: {source}")]
    ReadDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path:?} is a symbolic link, not a scope home")]
    IsSymlink { path: PathBuf },
    #[error("{path:?} is not a directory")]
    NotADirectory { path: PathBuf },
    #[error("scope home {path:?} was replaced: expected {expected:?}, found {found:?}")]
    HomeReplaced {
        path: PathBuf,
        expected: DirIdentity,
        found: DirIdentity,
    },
    #[error("{path:?} exceeds the limit of {limit} entries")]
    TooManyEntries { path: PathBuf, limit: usize },
    #[error("{path:?} exceeds the depth limit of {limit}")]
    TooDeep { path: PathBuf, limit: usize },
    #[error("{path:?} is owned by uid {uid}, not by the effective uid {euid}")]
    ForeignOwner { path: PathBuf, uid: u32, euid: u32 },
    #[error("{path:?} is a special file ({kind})")]
    SpecialFile { path: PathBuf, kind: &'static str },
    #[error(
        "{path:?} is a mount point (mount {mount}, the home's {home_mount}); refusing to remove across it"
    )]
    MountPoint {
        path: PathBuf,
        mount: u64,
        home_mount: u64,
    },
    #[error("cannot read the mount id of {path:?}: {reason}")]
    MountUnknown { path: PathBuf, reason: String },
    #[error("{path:?} is on another filesystem (dev {dev}, home dev {home_dev})")]
    CrossDevice {
        path: PathBuf,
        dev: u64,
        home_dev: u64,
    },
    #[error("{path:?} changed between validation and deletion: {what}")]
    Changed { path: PathBuf, what: &'static str },
    #[error("cannot delete {path:?}: {source}")]
    Delete {
        path: PathBuf,
        source: std::io::Error,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Symlink,
    Dir,
}

/// One entry recorded by the validation walk.
#[derive(Debug)]
struct Node {
    name: CString,
    dev: u64,
    ino: u64,
    kind: Kind,
    /// Empty unless `kind == Kind::Dir`.
    children: Vec<Node>,
}

/// The outcome of phase 1: the open parent and home plus the validated tree.
struct Validated {
    parent: OwnedFd,
    name: CString,
    home_path: PathBuf,
    home: Dir,
    expected: DirIdentity,
    tree: Vec<Node>,
}

/// Removes the directory `parent/name`, which must be exactly `expected` (dev, ino, uid,
/// mode via `fstat` of a no-follow descriptor).
///
/// Phase 1 walks the tree without following anything and refuses — deleting nothing —
/// on excess depth or entries, special files, foreign owners, other filesystems, or any
/// replacement. Phase 2 deletes the recorded tree deepest first, re-checking each entry's
/// `(dev, ino)` right before unlinking it, and finally removes the home after re-checking
/// its identity. Everything runs synchronously; an `Err` means nothing more is deleted.
pub fn remove_scope_home(
    parent: &Path,
    name: &str,
    expected: DirIdentity,
    limits: RemovalLimits,
) -> Result<RemovalReport, RemovalError> {
    let validated = validate(parent, name, expected, limits)?;
    delete(validated)
}

#[allow(clippy::unnecessary_cast)] // `dev_t`/`ino_t` are not `u64` on every target.
pub(crate) fn identity_of(st: &FileStat) -> DirIdentity {
    DirIdentity {
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
        uid: st.st_uid,
        mode: st.st_mode as u32,
    }
}

fn kind_of(st: &FileStat, path: &Path) -> Result<Kind, RemovalError> {
    let special = |kind| RemovalError::SpecialFile {
        path: path.to_owned(),
        kind,
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Ok(Kind::File),
        libc::S_IFLNK => Ok(Kind::Symlink),
        libc::S_IFDIR => Ok(Kind::Dir),
        libc::S_IFIFO => Err(special("fifo")),
        libc::S_IFSOCK => Err(special("socket")),
        libc::S_IFCHR => Err(special("character device")),
        libc::S_IFBLK => Err(special("block device")),
        _ => Err(special("unknown file type")),
    }
}

impl RemovalError {
    fn open(path: &Path, errno: Errno) -> Self {
        let (path, source) = (path.to_owned(), errno.into());
        Self::Open { path, source }
    }
    fn stat(path: &Path, errno: Errno) -> Self {
        let (path, source) = (path.to_owned(), errno.into());
        Self::Stat { path, source }
    }
    fn changed(path: &Path, what: &'static str) -> Self {
        let path = path.to_owned();
        Self::Changed { path, what }
    }
}

fn child_path(path: &Path, name: &CStr) -> PathBuf {
    path.join(OsStr::from_bytes(name.to_bytes()))
}

/// `fstatat(AT_SYMLINK_NOFOLLOW)`; a vanished entry is reported as `Changed`.
fn stat_at(dir: impl AsFd, name: &CStr, path: &Path) -> Result<FileStat, RemovalError> {
    fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|e| match e {
        Errno::ENOENT => RemovalError::changed(path, "entry vanished"),
        e => RemovalError::stat(path, e),
    })
}

/// Opens the subdirectory `name` of `dir` without following it and checks that the
/// opened directory is the inode `(dev, ino)` that was just inspected.
fn open_subdir(
    dir: &Dir,
    name: &CStr,
    path: &Path,
    dev: u64,
    ino: u64,
) -> Result<Dir, RemovalError> {
    let fd =
        openat(dir, name, DIR_FLAGS, Mode::empty()).map_err(|e| RemovalError::open(path, e))?;
    let found = identity_of(&fstat(&fd).map_err(|e| RemovalError::stat(path, e))?);
    if (found.dev, found.ino) != (dev, ino) {
        return Err(RemovalError::changed(
            path,
            "directory swapped while being opened",
        ));
    }
    Dir::from_fd(fd).map_err(|e| RemovalError::open(path, e))
}

/// Lists `dir` (without `.` and `..`), calling `check` on every name before keeping it.
fn list(
    dir: &mut Dir,
    path: &Path,
    mut check: impl FnMut(&CStr) -> Result<(), RemovalError>,
) -> Result<Vec<CString>, RemovalError> {
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|e| RemovalError::ReadDir {
            path: path.to_owned(),
            source: e.into(),
        })?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        check(name)?;
        names.push(name.to_owned());
    }
    Ok(names)
}

struct Walk {
    limits: RemovalLimits,
    euid: u32,
    home_dev: u64,
    home_mount: u64,
    entries: usize,
}

/// The mount id of `name` in `dir` (empty name: `dir`), as a removal error on failure.
fn mount_of(dir: impl AsFd, name: &CStr, path: &Path) -> Result<u64, RemovalError> {
    mount_id_at(dir, name).map_err(|e| RemovalError::MountUnknown {
        path: path.to_owned(),
        reason: match e {
            MountIdError::Sys(errno) => errno.desc().to_owned(),
            MountIdError::Unsupported => "the kernel does not report mount ids (Linux 5.8+)".into(),
        },
    })
}

/// Phase 1 for the directory `dir` at `depth` (the home is depth 0). Read-only.
fn prewalk(
    dir: &mut Dir,
    path: &Path,
    depth: usize,
    walk: &mut Walk,
) -> Result<Vec<Node>, RemovalError> {
    let names = list(dir, path, |name| {
        walk.entries += 1;
        if walk.entries > walk.limits.max_entries {
            return Err(RemovalError::TooManyEntries {
                path: child_path(path, name),
                limit: walk.limits.max_entries,
            });
        }
        if depth + 1 > walk.limits.max_depth {
            return Err(RemovalError::TooDeep {
                path: child_path(path, name),
                limit: walk.limits.max_depth,
            });
        }
        Ok(())
    })?;
    let mut nodes = Vec::with_capacity(names.len());
    for name in names {
        let entry_path = child_path(path, &name);
        let st = stat_at(&*dir, &name, &entry_path)?;
        let id = identity_of(&st);
        if id.uid != walk.euid {
            return Err(RemovalError::ForeignOwner {
                path: entry_path,
                uid: id.uid,
                euid: walk.euid,
            });
        }
        if id.dev != walk.home_dev {
            return Err(RemovalError::CrossDevice {
                path: entry_path,
                dev: id.dev,
                home_dev: walk.home_dev,
            });
        }
        let mount = mount_of(&*dir, &name, &entry_path)?;
        if mount != walk.home_mount {
            return Err(RemovalError::MountPoint {
                path: entry_path,
                mount,
                home_mount: walk.home_mount,
            });
        }
        let kind = kind_of(&st, &entry_path)?;
        let children = if kind == Kind::Dir {
            let mut sub = open_subdir(dir, &name, &entry_path, id.dev, id.ino)?;
            prewalk(&mut sub, &entry_path, depth + 1, walk)?
        } else {
            Vec::new()
        };
        nodes.push(Node {
            name,
            dev: id.dev,
            ino: id.ino,
            kind,
            children,
        });
    }
    Ok(nodes)
}

/// Phase 1: opens `parent/name` without following links, checks it is exactly
/// `expected` and owned by the effective uid, then validates the whole tree.
fn validate(
    parent: &Path,
    name: &str,
    expected: DirIdentity,
    limits: RemovalLimits,
) -> Result<Validated, RemovalError> {
    let home_path = parent.join(name);
    let c_name = match CString::new(name) {
        Ok(c) if !name.is_empty() && !name.contains('/') && name != "." && name != ".." => c,
        _ => return Err(RemovalError::InvalidName { path: home_path }),
    };
    let parent_fd =
        open(parent, DIR_FLAGS, Mode::empty()).map_err(|e| RemovalError::open(parent, e))?;
    let st = stat_at(&parent_fd, &c_name, &home_path)?;
    match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => {}
        libc::S_IFLNK => return Err(RemovalError::IsSymlink { path: home_path }),
        _ => return Err(RemovalError::NotADirectory { path: home_path }),
    }
    let open_err = |e| RemovalError::open(&home_path, e);
    let home_fd =
        openat(&parent_fd, c_name.as_c_str(), DIR_FLAGS, Mode::empty()).map_err(open_err)?;
    let found = identity_of(&fstat(&home_fd).map_err(|e| RemovalError::stat(&home_path, e))?);
    if found != expected {
        return Err(RemovalError::HomeReplaced {
            path: home_path,
            expected,
            found,
        });
    }
    let euid = nix::unistd::geteuid().as_raw();
    if found.uid != euid {
        return Err(RemovalError::ForeignOwner {
            path: home_path,
            uid: found.uid,
            euid,
        });
    }
    let home_mount = mount_of(&home_fd, c"", &home_path)?;
    let mut home = Dir::from_fd(home_fd).map_err(open_err)?;
    let mut walk = Walk {
        limits,
        euid,
        home_dev: found.dev,
        home_mount,
        entries: 0,
    };
    let tree = prewalk(&mut home, &home_path, 0, &mut walk)?;
    Ok(Validated {
        parent: parent_fd,
        name: c_name,
        home_path,
        home,
        expected,
        tree,
    })
}

/// Phase 2 for one directory: refuses entries that appeared since phase 1, then removes
/// the recorded children deepest first, each re-checked right before its unlink.
fn delete_children(
    dir: &mut Dir,
    path: &Path,
    nodes: &[Node],
    report: &mut RemovalReport,
) -> Result<(), RemovalError> {
    let known: HashSet<&CStr> = nodes.iter().map(|n| n.name.as_c_str()).collect();
    list(dir, path, |name| {
        if known.contains(name) {
            Ok(())
        } else {
            Err(RemovalError::changed(
                &child_path(path, name),
                "entry appeared",
            ))
        }
    })?;
    for node in nodes {
        let entry_path = child_path(path, &node.name);
        let id = identity_of(&stat_at(&*dir, &node.name, &entry_path)?);
        if (id.dev, id.ino) != (node.dev, node.ino) {
            let what = "dev/ino differ from the validated entry";
            return Err(RemovalError::changed(&entry_path, what));
        }
        let flag = if node.kind == Kind::Dir {
            let mut sub = open_subdir(dir, &node.name, &entry_path, node.dev, node.ino)?;
            delete_children(&mut sub, &entry_path, &node.children, report)?;
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        // Only the name inside the verified directory `dir` is removed: unlinkat never
        // follows a symlink, and RemoveDir only succeeds on an empty directory.
        unlinkat(&*dir, node.name.as_c_str(), flag).map_err(|e| RemovalError::Delete {
            path: entry_path.clone(),
            source: e.into(),
        })?;
        report.entries += 1;
        match node.kind {
            Kind::Dir => report.directories += 1,
            Kind::Symlink => report.symlinks_unlinked += 1,
            Kind::File => {}
        }
    }
    Ok(())
}

/// Phase 2: deletes the validated tree, re-checks the home's identity, removes the home.
fn delete(v: Validated) -> Result<RemovalReport, RemovalError> {
    let Validated {
        parent,
        name,
        home_path,
        mut home,
        expected,
        tree,
    } = v;
    let mut report = RemovalReport::default();
    delete_children(&mut home, &home_path, &tree, &mut report)?;
    drop(home);
    let found = identity_of(&stat_at(&parent, &name, &home_path)?);
    if found != expected {
        return Err(RemovalError::HomeReplaced {
            path: home_path,
            expected,
            found,
        });
    }
    unlinkat(&parent, name.as_c_str(), UnlinkatFlags::RemoveDir).map_err(|e| {
        RemovalError::Delete {
            path: home_path,
            source: e.into(),
        }
    })?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{DirBuilderExt, symlink};

    fn make_home(parent: &Path, name: &str) -> DirIdentity {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(parent.join(name))
            .unwrap();
        DirIdentity::of(&fs::symlink_metadata(parent.join(name)).unwrap())
    }

    fn write(path: &Path, content: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn remove(parent: &Path, id: DirIdentity) -> Result<RemovalReport, RemovalError> {
        remove_scope_home(parent, "home", id, RemovalLimits::default())
    }

    #[test]
    fn removes_a_normal_tree_entirely() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&home.join("a/b/c/deep.txt"), "deep");
        write(&home.join("a/one.txt"), "1");
        write(&home.join("top.txt"), "top");
        fs::create_dir(home.join("empty")).unwrap();
        let report = remove(tmp.path(), id).unwrap();
        assert_eq!(
            report,
            RemovalReport {
                entries: 7,
                symlinks_unlinked: 0,
                directories: 4
            }
        );
        assert!(!home.exists());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn symlinks_to_outside_are_unlinked_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&tmp.path().join("outside/secret.txt"), "keep me");
        write(&tmp.path().join("outside/dir/inner.txt"), "inner");
        symlink(tmp.path().join("outside/secret.txt"), home.join("to_file")).unwrap();
        fs::create_dir(home.join("sub")).unwrap();
        symlink(tmp.path().join("outside/dir"), home.join("sub/to_dir")).unwrap();
        symlink(tmp.path().join("outside/dir/"), home.join("to_dir_slash")).unwrap();
        let report = remove(tmp.path(), id).unwrap();
        assert_eq!(report.symlinks_unlinked, 3);
        assert_eq!(report.entries, 4);
        assert!(!home.exists());
        let outside = tmp.path().join("outside");
        assert_eq!(
            fs::read_to_string(outside.join("secret.txt")).unwrap(),
            "keep me"
        );
        assert_eq!(
            fs::read_to_string(outside.join("dir/inner.txt")).unwrap(),
            "inner"
        );
    }

    /// Asserts nothing below the home was touched by a refused removal.
    fn assert_intact(home: &Path, files: &[&str]) {
        assert!(home.is_dir());
        for f in files {
            assert!(
                fs::symlink_metadata(home.join(f)).is_ok(),
                "{f} was deleted"
            );
        }
    }

    #[test]
    fn special_files_refuse_and_delete_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&home.join("a.txt"), "a");
        write(&home.join("sub/b.txt"), "b");
        nix::unistd::mkfifo(&home.join("sub/fifo"), Mode::S_IRWXU).unwrap();
        let err = remove(tmp.path(), id).unwrap_err();
        assert!(
            matches!(&err, RemovalError::SpecialFile { kind: "fifo", path } if path.ends_with("sub/fifo")),
            "{err}"
        );
        assert_intact(&home, &["a.txt", "sub/b.txt", "sub/fifo"]);

        fs::remove_file(home.join("sub/fifo")).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(home.join("sock")).unwrap();
        let err = remove(tmp.path(), id).unwrap_err();
        assert!(
            matches!(err, RemovalError::SpecialFile { kind: "socket", .. }),
            "{err}"
        );
        assert_intact(&home, &["a.txt", "sub/b.txt", "sock"]);
    }

    #[test]
    fn too_many_entries_refuses_and_deletes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        let files = ["1", "2", "3", "d/4", "d/5"];
        for f in files {
            write(&home.join(f), f);
        }
        let limits = RemovalLimits {
            max_entries: 5,
            max_depth: 64,
        };
        let err = remove_scope_home(tmp.path(), "home", id, limits).unwrap_err();
        assert!(
            matches!(err, RemovalError::TooManyEntries { limit: 5, .. }),
            "{err}"
        );
        assert_intact(&home, &files);
        let limits = RemovalLimits {
            max_entries: 6,
            ..limits
        };
        assert_eq!(
            remove_scope_home(tmp.path(), "home", id, limits)
                .unwrap()
                .entries,
            6
        );
    }

    #[test]
    fn too_deep_refuses_and_deletes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&home.join("a/b/c.txt"), "c");
        write(&home.join("top.txt"), "t");
        let limits = RemovalLimits {
            max_entries: 100,
            max_depth: 2,
        };
        let err = remove_scope_home(tmp.path(), "home", id, limits).unwrap_err();
        assert!(
            matches!(&err, RemovalError::TooDeep { limit: 2, path } if path.ends_with("a/b/c.txt")),
            "{err}"
        );
        assert_intact(&home, &["top.txt", "a/b/c.txt"]);
        let limits = RemovalLimits {
            max_depth: 3,
            ..limits
        };
        remove_scope_home(tmp.path(), "home", id, limits).unwrap();
        assert!(!home.exists());
    }

    #[test]
    fn replaced_home_refuses_and_deletes_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        fs::rename(&home, tmp.path().join("original")).unwrap();
        make_home(tmp.path(), "home");
        write(&home.join("victim.txt"), "v");
        let err = remove(tmp.path(), id).unwrap_err();
        assert!(matches!(err, RemovalError::HomeReplaced { .. }), "{err}");
        assert_intact(&home, &["victim.txt"]);
        assert!(tmp.path().join("original").is_dir());
    }

    #[test]
    fn symlinked_or_non_directory_home_refuses() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "real");
        write(&tmp.path().join("real/keep.txt"), "k");
        symlink(tmp.path().join("real"), tmp.path().join("home")).unwrap();
        let err = remove(tmp.path(), id).unwrap_err();
        assert!(matches!(err, RemovalError::IsSymlink { .. }), "{err}");
        assert_intact(&tmp.path().join("real"), &["keep.txt"]);

        write(&tmp.path().join("file"), "f");
        let err = remove_scope_home(tmp.path(), "file", id, RemovalLimits::default()).unwrap_err();
        assert!(matches!(err, RemovalError::NotADirectory { .. }), "{err}");
    }

    #[test]
    fn invalid_names_are_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        for name in ["", ".", "..", "home/", "a/b", "nul\0byte"] {
            let err =
                remove_scope_home(tmp.path(), name, id, RemovalLimits::default()).unwrap_err();
            assert!(
                matches!(err, RemovalError::InvalidName { .. }),
                "{name:?}: {err}"
            );
        }
        assert!(tmp.path().join("home").is_dir());
    }

    #[test]
    #[ignore = "needs root to chown an entry to another uid; `make test` runs it with --ignored when root"]
    fn foreign_owned_entry_refuses_and_deletes_nothing() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test chowns an entry to uid 65534 and must run as root (`make test` as root runs it)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&home.join("mine.txt"), "m");
        write(&home.join("sub/theirs.txt"), "t");
        std::os::unix::fs::chown(home.join("sub/theirs.txt"), Some(65534), Some(65534)).unwrap();
        let err = remove(tmp.path(), id).unwrap_err();
        assert!(
            matches!(&err, RemovalError::ForeignOwner { uid: 65534, path, .. } if path.ends_with("theirs.txt")),
            "{err}"
        );
        assert_intact(&home, &["mine.txt", "sub/theirs.txt"]);
    }

    #[test]
    #[ignore = "needs root to bind-mount; `make test` runs it with --ignored when root"]
    fn a_bind_mount_inside_the_home_refuses_and_deletes_nothing() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test bind-mounts a directory and must run as root (`make test` as root runs it)"
        );
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&home.join("mine.txt"), "m");
        write(&home.join("mnt/.keep"), "k");
        // Same filesystem as the home: st_dev cannot tell the mount apart.
        let outside = tmp.path().join("outside");
        write(&outside.join("precious.txt"), "p");
        let status = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&outside)
            .arg(home.join("mnt"))
            .status()
            .unwrap();
        assert!(status.success(), "mount --bind failed");
        let err = remove(tmp.path(), id);
        let _ = std::process::Command::new("umount")
            .arg(home.join("mnt"))
            .status();
        let err = err.unwrap_err();
        assert!(
            matches!(&err, RemovalError::MountPoint { path, .. } if path.ends_with("mnt")),
            "{err}"
        );
        assert_intact(&home, &["mine.txt", "mnt/.keep"]);
        assert_eq!(
            std::fs::read_to_string(outside.join("precious.txt")).unwrap(),
            "p"
        );
    }

    #[test]
    fn entry_swapped_after_validation_stops_deletion() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&home.join("sub/file.txt"), "original");
        let validated = validate(tmp.path(), "home", id, RemovalLimits::default()).unwrap();
        // Created before the original is freed, so the planted inode cannot reuse its number.
        write(&tmp.path().join("planted"), "planted");
        fs::remove_file(home.join("sub/file.txt")).unwrap();
        fs::hard_link(tmp.path().join("planted"), home.join("sub/file.txt")).unwrap();
        let err = delete(validated).unwrap_err();
        assert!(matches!(err, RemovalError::Changed { .. }), "{err}");
        assert_eq!(
            fs::read_to_string(home.join("sub/file.txt")).unwrap(),
            "planted"
        );
        assert_eq!(
            fs::read_to_string(tmp.path().join("planted")).unwrap(),
            "planted"
        );
    }

    #[test]
    fn entry_appearing_after_validation_stops_deletion() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let home = tmp.path().join("home");
        write(&home.join("sub/file.txt"), "f");
        let validated = validate(tmp.path(), "home", id, RemovalLimits::default()).unwrap();
        symlink(tmp.path(), home.join("sub/new_link")).unwrap();
        let err = delete(validated).unwrap_err();
        assert!(
            matches!(&err, RemovalError::Changed { what: "entry appeared", path } if path.ends_with("new_link")),
            "{err}"
        );
        assert_intact(&home, &["sub/file.txt", "sub/new_link"]);
    }

    #[test]
    fn home_swapped_after_validation_is_not_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let id = make_home(tmp.path(), "home");
        let validated = validate(tmp.path(), "home", id, RemovalLimits::default()).unwrap();
        fs::rename(tmp.path().join("home"), tmp.path().join("moved")).unwrap();
        make_home(tmp.path(), "home");
        let err = delete(validated).unwrap_err();
        assert!(matches!(err, RemovalError::HomeReplaced { .. }), "{err}");
        assert!(tmp.path().join("home").is_dir());
        assert!(tmp.path().join("moved").is_dir());
    }
}
