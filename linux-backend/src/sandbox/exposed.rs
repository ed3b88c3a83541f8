//! Host directories a person exposes read-only to the project shell's jobs (the
//! `expose` setting: toolchains such as `~/.rustup` or `~/.cargo/bin`), and the job
//! `PATH` entries of the `path` setting.
//!
//! Invariants, checked at every boot (and by `status` without a daemon):
//! - an exposed directory appears read-only at the path its entry names (`~/` being
//!   the caller's `HOME`, which is also the guest `HOME`'s path), whatever links lead
//!   from there to the directory on the host, so tools that find themselves through
//!   `$HOME` (rustup, pyenv, nvm) work unchanged; what is bound is the directory the
//!   entry resolved to at boot;
//! - never exposed: `/`, a home or any ancestor of one, a directory under or above one
//!   of the home's secret directories ([`SECRET_DIR_NAMES`], [`SECRET_HOME_SUBDIRS`]),
//!   the kernel and runtime trees ([`REFUSED_TREES`]), the shared scratch directories,
//!   anything overlapping the workspace (already writable) or the marsh home and its
//!   scope root (settings, receipts, tokens);
//! - inside an exposed directory, down to [`SCAN_DEPTH`] levels, files with a known
//!   secret name ([`is_secret_file`]), directories with a secret name and sockets are
//!   covered (an empty read-only file or tmpfs), as they are when present at boot, and
//!   so is the file a secret-named link there leads to when it lies in any exposed
//!   directory; a cover is placed wherever a job sees the covered file (every exposed
//!   directory holding it).
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
    /// Bound read-only in this order; no two share an `at`.
    pub dirs: Vec<ExposedDir>,
    /// What is covered inside them, at the paths jobs see.
    pub hidden: Vec<Hidden>,
    /// Directories put first on the job's `PATH`, in order.
    pub path: Vec<PathBuf>,
}

/// One exposed directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposedDir {
    /// The host directory, canonical.
    pub source: PathBuf,
    /// Where jobs see it: the entry as written, `~/` expanded (absolute, normal).
    pub at: PathBuf,
}

/// What an exposed directory must stay clear of.
pub struct Keep<'a> {
    /// The caller's `HOME` and the passwd home (either may be absent).
    pub homes: Vec<PathBuf>,
    /// The marsh home and, when managed, its scope root.
    pub marsh: Vec<&'a Path>,
    pub workspace: Option<&'a Path>,
}

/// A file or directory to cover, by its canonical host path; covered wherever an
/// exposed directory shows it (nowhere, for a link target outside them all).
enum Secret {
    File(PathBuf),
    Dir(PathBuf),
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
        let mut secrets = Vec::new();
        let mut budget = SCAN_LIMIT;
        let fenced = Fenced::of(keep);
        for entry in &config.expose {
            let refuse =
                |why: String| Error::Backend(format!("backend setting expose: {entry:?} {why}"));
            let at = config::expand_entry(entry, user_home)
                .ok_or_else(|| refuse("starts with ~/ but the caller has no HOME".into()))?;
            // As written first (a secret directory is refused whether or not it
            // exists), then as resolved (a link may lead into one).
            if let Some(why) = refusal(&at, &fenced) {
                return Err(refuse(why));
            }
            let source = fs::canonicalize(&at)
                .map_err(|e| refuse(format!("cannot be resolved: {}", e.kind())))?;
            if !source.is_dir() {
                return Err(refuse("is not a directory".into()));
            }
            if let Some(why) = refusal(&source, &fenced) {
                return Err(refuse(why));
            }
            scan(&source, 1, &mut budget, &mut secrets).map_err(|()| {
                refuse(format!(
                    "holds more than {SCAN_LIMIT} entries within {SCAN_DEPTH} levels; expose a narrower directory"
                ))
            })?;
            if !exposed.dirs.iter().any(|d| d.at == at) {
                exposed.dirs.push(ExposedDir { source, at });
            }
        }
        exposed.hidden = covers(&exposed.dirs, &secrets);
        exposed.path = path_entries(config, user_home)?;
        Ok(exposed)
    }

    /// The `path` setting alone, for settings that expose nothing.
    pub fn paths_only(config: &BackendConfig, user_home: Option<&Path>) -> Result<Self> {
        Ok(Exposed {
            path: path_entries(config, user_home)?,
            ..Exposed::default()
        })
    }
}

/// The `path` setting's directories, `~/` expanded, in order.
fn path_entries(config: &BackendConfig, user_home: Option<&Path>) -> Result<Vec<PathBuf>> {
    config
        .path
        .iter()
        .map(|entry| {
            config::expand_entry(entry, user_home).ok_or_else(|| {
                Error::Backend(format!(
                    "backend setting path: {entry:?} starts with ~/ but the caller has no HOME"
                ))
            })
        })
        .collect()
}

/// The covers of `secrets`, at every place a job sees them.
fn covers(dirs: &[ExposedDir], secrets: &[Secret]) -> Vec<Hidden> {
    let mut hidden = Vec::new();
    for secret in secrets {
        let (path, is_dir) = match secret {
            Secret::File(p) => (p, false),
            Secret::Dir(p) => (p, true),
        };
        for dir in dirs {
            let Ok(rest) = path.strip_prefix(&dir.source) else {
                continue;
            };
            let at = dir.at.join(rest);
            let cover = if is_dir {
                Hidden::Dir(at)
            } else {
                Hidden::File(at)
            };
            if !hidden.contains(&cover) {
                hidden.push(cover);
            }
        }
    }
    hidden
}

/// The places an exposed directory must stay clear of, each as written and, where it
/// resolves, as resolved (a home's `.ssh` may be a link to a directory elsewhere).
struct Fenced<'a> {
    homes: Vec<PathBuf>,
    secret_dirs: Vec<PathBuf>,
    keep: &'a Keep<'a>,
}

impl<'a> Fenced<'a> {
    fn of(keep: &'a Keep<'a>) -> Self {
        let with_resolved = |paths: &mut Vec<PathBuf>, path: PathBuf| {
            if let Ok(resolved) = fs::canonicalize(&path)
                && resolved != path
            {
                paths.push(resolved);
            }
            paths.push(path);
        };
        let mut homes = Vec::new();
        let mut secret_dirs = Vec::new();
        for home in &keep.homes {
            with_resolved(&mut homes, home.clone());
            for name in SECRET_DIR_NAMES.iter().chain(&SECRET_HOME_SUBDIRS) {
                with_resolved(&mut secret_dirs, home.join(name));
            }
        }
        Fenced {
            homes,
            secret_dirs,
            keep,
        }
    }
}

/// Why `dir` (as written or canonical) may not be exposed, if it may not.
fn refusal(dir: &Path, fenced: &Fenced<'_>) -> Option<String> {
    let overlaps = |other: &Path| dir.starts_with(other) || other.starts_with(dir);
    if dir == Path::new("/") || REFUSED_DIRS.iter().any(|d| dir == Path::new(d)) {
        return Some("is too broad: expose the toolchain's own directory".into());
    }
    if REFUSED_TREES.iter().any(|t| dir.starts_with(t)) {
        return Some("lies in a system tree that is never exposed".into());
    }
    if fenced.homes.iter().any(|home| home.starts_with(dir)) {
        return Some("is a home or holds one: expose the toolchain's own directory".into());
    }
    if fenced.secret_dirs.iter().any(|s| overlaps(s)) {
        return Some(
            "is under, is or holds a directory of credentials, which is never exposed".into(),
        );
    }
    if fenced.keep.marsh.iter().any(|m| overlaps(m)) {
        return Some("overlaps the marsh home or scope root, which jobs never see".into());
    }
    if fenced.keep.workspace.is_some_and(overlaps) {
        return Some("overlaps the workspace, which jobs see writable already".into());
    }
    None
}

/// Whether a file name is a known credential: cargo's `credentials[.toml]`, netrc,
/// git's credential store, npm/Yarn/PyPI/PostgreSQL/Vault tokens, SSH private keys,
/// cloud CLI credential stores (gcloud, s3cmd, boto).
pub fn is_secret_file(name: &str) -> bool {
    const NAMES: [&str; 13] = [
        ".netrc",
        ".vault-token",
        ".s3cfg",
        ".boto",
        ".yarnrc.yml",
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

/// Collects the secrets under `dir` of an exposed tree (at `depth`, 1 = its
/// entries); `Err` when the budget of entries runs out. A secret directory is not
/// descended into.
fn scan(
    dir: &Path,
    depth: usize,
    budget: &mut usize,
    found: &mut Vec<Secret>,
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
                found.push(Secret::Dir(path));
            } else if depth < SCAN_DEPTH {
                scan(&path, depth + 1, budget, found)?;
            }
        } else if kind.is_symlink() {
            // A job following the link reads its target: cover the target when an
            // exposed directory shows it (a target elsewhere shows whatever the
            // sandbox shows at that path, nothing of the host's home unless exposed).
            if is_secret_file(&name)
                && let Ok(target) = fs::canonicalize(&path)
                && target.is_file()
            {
                found.push(Secret::File(target));
            }
        } else if kind.is_socket() || is_secret_file(&name) {
            found.push(Secret::File(path));
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
            ".vault-token",
            ".s3cfg",
            ".boto",
            ".yarnrc.yml",
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
        assert_eq!(
            exposed.dirs,
            [ExposedDir {
                source: fs::canonicalize(&tool).unwrap(),
                at: tool.clone(),
            }]
        );
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

    #[test]
    fn a_linked_toolchain_is_seen_at_its_written_path_with_covers_there() {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        let home = base.join("home");
        let real = base.join("disk/rustup");
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(real.join("toolchains")).unwrap();
        fs::write(real.join("credentials.toml"), "token").unwrap();
        std::os::unix::fs::symlink(&real, home.join(".rustup")).unwrap();
        let keep = Keep {
            homes: vec![home.clone()],
            marsh: vec![],
            workspace: None,
        };
        let exposed = Exposed::resolve(&config(&["~/.rustup"], &[]), Some(&home), &keep).unwrap();
        assert_eq!(
            exposed.dirs,
            [ExposedDir {
                source: real,
                at: home.join(".rustup"),
            }]
        );
        assert_eq!(
            exposed.hidden,
            [Hidden::File(home.join(".rustup/credentials.toml"))]
        );
    }

    #[test]
    fn a_secret_named_link_into_another_exposed_tree_is_covered_there() {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        let (one, two) = (base.join("one"), base.join("two"));
        fs::create_dir_all(&one).unwrap();
        fs::create_dir_all(&two).unwrap();
        fs::write(two.join("token-store"), "secret").unwrap();
        std::os::unix::fs::symlink(two.join("token-store"), one.join(".netrc")).unwrap();
        let keep = Keep {
            homes: vec![],
            marsh: vec![],
            workspace: None,
        };
        let entries = [one.to_str().unwrap(), two.to_str().unwrap()];
        let exposed = Exposed::resolve(&config(&entries, &[]), None, &keep).unwrap();
        assert_eq!(exposed.hidden, [Hidden::File(two.join("token-store"))]);
        let alone = Exposed::resolve(&config(&entries[..1], &[]), None, &keep).unwrap();
        assert_eq!(alone.hidden, []);
    }

    #[test]
    fn a_directory_a_homes_secret_directory_links_to_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let base = fs::canonicalize(dir.path()).unwrap();
        let home = base.join("home");
        let keys = base.join("vault/keys");
        fs::create_dir_all(&home).unwrap();
        fs::create_dir_all(keys.join("inner")).unwrap();
        std::os::unix::fs::symlink(&keys, home.join(".ssh")).unwrap();
        let keep = Keep {
            homes: vec![home.clone()],
            marsh: vec![],
            workspace: None,
        };
        for entry in [keys.clone(), keys.join("inner"), base.join("vault")] {
            let err = Exposed::resolve(&config(&[entry.to_str().unwrap()], &[]), None, &keep)
                .unwrap_err();
            assert!(err.to_string().contains("credentials"), "{entry:?}: {err}");
        }
    }
}
