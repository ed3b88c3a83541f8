//! Host directories a person exposes read-only to the project shell's jobs (the
//! `expose` setting: toolchains such as `~/.rustup` or `~/.cargo/bin`), and the job
//! `PATH` entries of the `path` setting.
//!
//! Invariants, checked at every boot (and by `status` without a daemon):
//! - an exposed directory appears at its own canonical path, read-only, so tools that
//!   find themselves through `$HOME` (rustup, pyenv, nvm) work unchanged: the guest
//!   `HOME` has the host home's path;
//! - never exposed: `/`, a home or any ancestor of one, a directory under or above one
//!   of the home's secret directories ([`SECRET_DIR_NAMES`], [`SECRET_HOME_SUBDIRS`]),
//!   the kernel and runtime trees ([`REFUSED_TREES`]), the shared scratch directories,
//!   anything overlapping the workspace (already writable) or the marsh home and its
//!   scope root (settings, receipts, tokens);
//! - inside an exposed directory, down to [`SCAN_DEPTH`] levels, files with a known
//!   secret name ([`is_secret_file`]), directories with a secret name and sockets are
//!   covered (an empty read-only file or tmpfs), as they are when present at boot.
//!
//! Rejected alternative: a full walk of every exposed tree. A rustup home holds over
//! 120,000 entries (0.25 s warm, 1.5 s cold per boot); the secrets a person keeps next
//! to a toolchain (cargo's `credentials.toml`, `.netrc`, npm and PyPI tokens, keys)
//! sit at fixed, shallow places. A tree with more than [`SCAN_LIMIT`] entries within
//! that depth is refused rather than partly checked.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use super::hidden::Hidden;
use crate::config::{self, BackendConfig};
use crate::error::{Error, Result};

/// Directories of a home, beside the [`SECRET_DIR_NAMES`], whose contents are
/// credentials or marsh state: never exposed, nor any directory holding them.
const SECRET_HOME_SUBDIRS: [&str; 6] = [
    ".config/gh",
    ".config/gcloud",
    ".config/marsh-shim",
    ".local/share/keyrings",
    ".local/state/marsh-mcp-run",
    ".marsh",
];
/// Trees never exposed, nor any directory inside them.
const REFUSED_TREES: [&str; 8] = [
    "/proc", "/sys", "/dev", "/run", "/etc", "/boot", "/var/run", "/var/lib",
];
/// Directories never exposed whole (their subdirectories may be).
const REFUSED_DIRS: [&str; 6] = ["/tmp", "/var/tmp", "/var", "/home", "/root", "/mnt"];
/// Credential directory names: covered wherever the scan meets them, and never
/// exposed (nor anything holding them) in a home.
const SECRET_DIR_NAMES: [&str; 7] = [
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".password-store",
];
/// Levels below an exposed directory that are checked for secrets.
pub const SCAN_DEPTH: usize = 3;
/// Bound on the entries checked within [`SCAN_DEPTH`] of all exposed directories.
const SCAN_LIMIT: usize = 20_000;

/// What the settings expose, resolved and checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exposed {
    /// Canonical host directories, each bound read-only at the same path.
    pub dirs: Vec<PathBuf>,
    /// What is covered inside them.
    pub hidden: Vec<Hidden>,
    /// Directories put first on the job's `PATH`, in order.
    pub path: Vec<PathBuf>,
}

/// What an exposed directory must stay clear of.
pub struct Keep<'a> {
    /// The caller's `HOME` and the passwd home (either may be absent).
    pub homes: Vec<PathBuf>,
    /// The marsh home and, when managed, its scope root.
    pub marsh: Vec<&'a Path>,
    pub workspace: Option<&'a Path>,
}

impl Exposed {
    /// Resolves `config.expose` and `config.path`; every refusal is
    /// [`Error::Backend`] naming the entry as written.
    pub fn resolve(
        config: &BackendConfig,
        user_home: Option<&Path>,
        keep: &Keep<'_>,
    ) -> Result<Self> {
        let mut exposed = Exposed::default();
        let mut budget = SCAN_LIMIT;
        for entry in &config.expose {
            let refuse =
                |why: String| Error::Backend(format!("backend setting expose: {entry:?} {why}"));
            let path = config::expand_entry(entry, user_home)
                .ok_or_else(|| refuse("starts with ~/ but the caller has no HOME".into()))?;
            // As written first (a secret directory is refused whether or not it
            // exists), then as resolved (a link may lead into one).
            if let Some(why) = refusal(&path, keep) {
                return Err(refuse(why));
            }
            let dir = fs::canonicalize(&path)
                .map_err(|e| refuse(format!("cannot be resolved: {}", e.kind())))?;
            if !dir.is_dir() {
                return Err(refuse("is not a directory".into()));
            }
            if let Some(why) = refusal(&dir, keep) {
                return Err(refuse(why));
            }
            scan(&dir, &dir, 1, &mut budget, &mut exposed.hidden).map_err(|()| {
                refuse(format!(
                    "holds more than {SCAN_LIMIT} entries within {SCAN_DEPTH} levels; expose a narrower directory"
                ))
            })?;
            if !exposed.dirs.contains(&dir) {
                exposed.dirs.push(dir);
            }
        }
        for entry in &config.path {
            let dir = config::expand_entry(entry, user_home).ok_or_else(|| {
                Error::Backend(format!(
                    "backend setting path: {entry:?} starts with ~/ but the caller has no HOME"
                ))
            })?;
            exposed.path.push(dir);
        }
        Ok(exposed)
    }
}

/// Why `dir` (canonical) may not be exposed, if it may not.
fn refusal(dir: &Path, keep: &Keep<'_>) -> Option<String> {
    let overlaps = |other: &Path| dir.starts_with(other) || other.starts_with(dir);
    if dir == Path::new("/") || REFUSED_DIRS.iter().any(|d| dir == Path::new(d)) {
        return Some("is too broad: expose the toolchain's own directory".into());
    }
    if REFUSED_TREES.iter().any(|t| dir.starts_with(t)) {
        return Some("lies in a system tree that is never exposed".into());
    }
    for home in &keep.homes {
        if home.starts_with(dir) {
            return Some("is a home or holds one: expose the toolchain's own directory".into());
        }
        let mut secret = SECRET_DIR_NAMES.iter().chain(&SECRET_HOME_SUBDIRS);
        if secret.any(|s| overlaps(&home.join(s))) {
            return Some("is or holds a directory of credentials, which is never exposed".into());
        }
    }
    if keep.marsh.iter().any(|m| overlaps(m)) {
        return Some("overlaps the marsh home or scope root, which jobs never see".into());
    }
    if keep.workspace.is_some_and(overlaps) {
        return Some("overlaps the workspace, which jobs see writable already".into());
    }
    None
}

/// Whether a file name is a known credential: cargo's `credentials[.toml]`, netrc,
/// git's credential store, npm/PyPI/PostgreSQL tokens, SSH private keys, cloud CLI
/// credential stores.
pub fn is_secret_file(name: &str) -> bool {
    const NAMES: [&str; 9] = [
        ".netrc",
        "_netrc",
        ".git-credentials",
        ".npmrc",
        ".pypirc",
        ".pgpass",
        "application_default_credentials.json",
        "access_tokens.db",
        "credentials.db",
    ];
    const KEY_KINDS: [&str; 4] = ["rsa", "dsa", "ecdsa", "ed25519"];
    NAMES.contains(&name)
        || name.starts_with("credentials")
        || name
            .strip_prefix("id_")
            .is_some_and(|rest| KEY_KINDS.iter().any(|k| rest.starts_with(k)))
}

/// Covers secrets under `dir` of the exposed tree `root` (at `depth`, 1 = its entries); `Err` when the budget
/// of entries runs out. A covered directory is not descended into.
fn scan(
    root: &Path,
    dir: &Path,
    depth: usize,
    budget: &mut usize,
    found: &mut Vec<Hidden>,
) -> std::result::Result<(), ()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        *budget = budget.checked_sub(1).ok_or(())?;
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if kind.is_dir() {
            if SECRET_DIR_NAMES.contains(&name.as_ref()) {
                found.push(Hidden::Dir(path));
            } else if depth < SCAN_DEPTH {
                scan(root, &path, depth + 1, budget, found)?;
            }
        } else if kind.is_symlink() {
            // A cover is mounted where the link leads (bubblewrap follows it): cover
            // a secret-named link's target when it lies in this exposed tree. A target
            // elsewhere shows whatever the sandbox shows at that path (nothing of the
            // host's home unless exposed, where it is checked by its own name).
            if is_secret_file(&name)
                && let Ok(target) = fs::canonicalize(&path)
                && target.starts_with(root)
                && target.is_file()
            {
                found.push(Hidden::File(target));
            }
        } else if kind.is_socket() || is_secret_file(&name) {
            found.push(Hidden::File(path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn config(expose: &[&str], path: &[&str]) -> BackendConfig {
        BackendConfig {
            expose: expose.iter().map(|s| s.to_string()).collect(),
            path: path.iter().map(|s| s.to_string()).collect(),
            ..BackendConfig::default()
        }
    }

    #[test]
    fn secret_names() {
        for name in [
            "credentials",
            "credentials.toml",
            ".netrc",
            "id_ed25519",
            "id_rsa.pub",
            ".npmrc",
        ] {
            assert!(is_secret_file(name), "{name}");
        }
        for name in [
            "cargo",
            "rustc",
            "id",
            "id_card",
            "settings.toml",
            "cacert.pem",
        ] {
            assert!(!is_secret_file(name), "{name}");
        }
    }

    #[test]
    fn a_toolchain_under_home_is_exposed_with_its_secrets_covered() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let tool = home.join(".cargo");
        fs::create_dir_all(tool.join("bin")).unwrap();
        fs::create_dir_all(tool.join("registry/.ssh")).unwrap();
        fs::write(tool.join("bin/cargo"), "").unwrap();
        fs::write(tool.join("credentials.toml"), "token").unwrap();
        fs::write(tool.join("bin/.netrc"), "x").unwrap();
        let keep = Keep {
            homes: vec![home.clone()],
            marsh: vec![],
            workspace: None,
        };
        let exposed = Exposed::resolve(
            &config(&["~/.cargo"], &["~/.cargo/bin"]),
            Some(&home),
            &keep,
        )
        .unwrap();
        let tool = fs::canonicalize(&tool).unwrap();
        assert_eq!(exposed.dirs, std::slice::from_ref(&tool));
        assert_eq!(exposed.path, [home.join(".cargo/bin")]);
        let mut hidden = exposed.hidden.clone();
        hidden.sort_by_key(|h| format!("{h:?}"));
        assert_eq!(
            hidden,
            [
                Hidden::Dir(tool.join("registry/.ssh")),
                Hidden::File(tool.join("bin/.netrc")),
                Hidden::File(tool.join("credentials.toml")),
            ]
        );
    }

    #[test]
    fn secret_dirs_homes_system_trees_and_marsh_dirs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let home = fs::canonicalize(dir.path()).unwrap().join("home");
        for d in [".ssh/keys", ".config/gh", "marsh-root/scope", "ws", "tools"] {
            fs::create_dir_all(home.join(d)).unwrap();
        }
        let root = home.join("marsh-root");
        let ws = home.join("ws");
        let keep = Keep {
            homes: vec![home.clone()],
            marsh: vec![&root],
            workspace: Some(&ws),
        };
        let refused = |entry: &str| {
            let err = Exposed::resolve(&config(&[entry], &[]), Some(&home), &keep).unwrap_err();
            assert_eq!(err.exit_code(), 126, "{entry}");
            err.to_string()
        };
        assert!(refused("~/.ssh").contains("credentials"));
        assert!(refused("~/.ssh/keys").contains("credentials"));
        assert!(refused("~/.config").contains("credentials"));
        assert!(refused("/").contains("too broad"));
        assert!(refused("/proc/self").contains("system tree"));
        assert!(refused("/etc").contains("system tree"));
        assert!(refused("~/marsh-root/scope").contains("marsh home"));
        assert!(refused("~/ws").contains("workspace"));
        assert!(refused("~/missing").contains("cannot be resolved"));
        assert!(refused("~/.aws/absent").contains("credentials"));
        let whole_home = home.to_str().unwrap().to_string();
        assert!(refused(&whole_home).contains("home"));
        assert!(Exposed::resolve(&config(&["~/tools"], &[]), Some(&home), &keep).is_ok());
        assert!(Exposed::resolve(&config(&["~/tools"], &[]), None, &keep).is_err());
    }
}
