//! Backend settings: the one place the stand-in takes its knobs from.
//!
//! marsh-mcp clears its children's environment, so settings live in files, read field
//! by field, the first file naming a field winning: the home's `backend.json`; when
//! the home is a scope of a managed root (its parent holds the scope registry
//! `scopes.json`), the root's `backend.json`, which so applies to every scope,
//! new ones included; the per-user default `$HOME/.config/marsh-shim/backend.json`;
//! the built-in defaults below. Every file is optional; a file that exists must be a
//! JSON object of the known fields, or every boot and every `status` reports it as the
//! backend's problem (never a silent default).
//!
//! No file is reachable from a job: homes and roots are never mounted into a sandbox
//! (the guest `HOME` is a subdirectory of the home, [`crate::home::Home::guest_home`]),
//! and a file inside the workspace is refused ([`BackendConfig::ensure_outside`]).
//!
//! Rejected alternative: environment variables (`MARSH_SHIM_IDLE_SECS`, ...). They never
//! reached a daemon booted through marsh-mcp, so a setting appeared to work in a shell and
//! silently did nothing in production.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::home::Home;
use crate::util;

/// The file name in a home and in the per-user directory.
pub const FILE_NAME: &str = "backend.json";
/// A settings file larger than this is refused.
const MAX_FILE_BYTES: u64 = 64 * 1024;
/// The file in a home's parent that makes the parent a managed scope root.
const REGISTRY_FILE_NAME: &str = "scopes.json";
/// Bound on the entries of `expose` and of `path`.
pub const MAX_LIST_ENTRIES: usize = 32;
/// Bound on one entry of `expose` or `path`, in bytes.
const MAX_ENTRY_BYTES: usize = 1024;

pub const DEFAULT_IDLE_SECS: u64 = 900;
pub const DEFAULT_PIDS_MAX: u64 = 2048;
/// Bound on what a setting may ask for (the issue's ceiling for the default is 4096;
/// a larger explicit value is allowed up to this).
pub const PIDS_MAX_CEILING: u64 = 65_536;
pub const DEFAULT_MEMORY_MAX_MIB: u64 = 4096;

/// Whether jobs see the host's network or only their own loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// Own network namespace: loopback only (the default).
    Loopback,
    /// The host's network namespace.
    Host,
}

impl Network {
    pub fn label(self) -> &'static str {
        match self {
            Network::Loopback => "loopback",
            Network::Host => "host",
        }
    }
}

/// One settings file as written; every field optional.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    idle_secs: Option<u64>,
    network: Option<Network>,
    pids_max: Option<u64>,
    memory_max_mib: Option<u64>,
    unconfined: Option<bool>,
    bwrap: Option<PathBuf>,
    expose: Option<Vec<String>>,
    path: Option<Vec<String>>,
}

/// The settings in force. Invariant: every value is within its documented range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// The daemon exits after this long without connections or jobs (1..=86400 s).
    pub idle_secs: u64,
    pub network: Network,
    /// Processes (and threads) per scope: 16..=PIDS_MAX_CEILING.
    pub pids_max: u64,
    /// Memory per scope in MiB: 64..=1048576.
    pub memory_max_mib: u64,
    /// The explicit opt-in to run jobs without bubblewrap when it is missing.
    pub unconfined: bool,
    /// bubblewrap at this absolute path instead of the standard locations.
    pub bwrap: Option<PathBuf>,
    /// Host directories jobs of the project shell see read-only at their own paths
    /// (toolchains), as written: absolute or `~/`-relative, normal, at most
    /// [`MAX_LIST_ENTRIES`]. What may be exposed is decided at boot
    /// (`sandbox::Exposed`).
    pub expose: Vec<String>,
    /// Directories put first on the job's `PATH` (after the shell's own), as written;
    /// same form and bound as `expose`.
    pub path: Vec<String>,
    /// The settings files that exist, canonical (checked against the workspace).
    pub sources: Vec<PathBuf>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            idle_secs: DEFAULT_IDLE_SECS,
            network: Network::Loopback,
            pids_max: DEFAULT_PIDS_MAX,
            memory_max_mib: DEFAULT_MEMORY_MAX_MIB,
            unconfined: false,
            bwrap: None,
            expose: Vec::new(),
            path: Vec::new(),
            sources: Vec::new(),
        }
    }
}

impl BackendConfig {
    /// The settings for `home`: its file over its managed root's over the per-user
    /// default over the built-ins. `user_home` is the caller's `HOME` (absolute), when
    /// it has one.
    pub fn load(home: &Home, user_home: Option<&OsString>) -> Result<Self> {
        let user = user_home
            .map(PathBuf::from)
            .filter(|h| h.is_absolute())
            .map(|h| h.join(".config/marsh-shim").join(FILE_NAME));
        let mut sources = Vec::new();
        let user = match user {
            Some(path) => read(&path, &mut sources)?,
            None => SettingsFile::default(),
        };
        let own = read(&home.root().join(FILE_NAME), &mut sources)?;
        let root = match managed_root(home) {
            Some(root) => read(&root.join(FILE_NAME), &mut sources)?,
            None => SettingsFile::default(),
        };
        let mut config = Self::merge(&[own, root, user])?;
        config.sources = sources;
        Ok(config)
    }

    /// Refuses settings a job could have written: a settings file or the `bwrap`
    /// setting inside the workspace (jobs write the workspace; the next boot would run
    /// their `bwrap` unsandboxed, or turn host networking on).
    pub fn ensure_outside(&self, workspace: &Path) -> Result<()> {
        let bwrap = self
            .bwrap
            .as_ref()
            .map(|b| fs::canonicalize(b).unwrap_or(b.clone()));
        let inside = self
            .sources
            .iter()
            .chain(bwrap.iter())
            .any(|p| p.starts_with(workspace));
        if inside {
            return Err(Error::Backend(
                "a backend setting (the settings file or bwrap) lies inside the workspace, where jobs can write it; move it out"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The first file naming a field wins; then range checks.
    fn merge(files: &[SettingsFile]) -> Result<Self> {
        let pick = |f: fn(&SettingsFile) -> Option<u64>, default: u64| {
            files.iter().find_map(f).unwrap_or(default)
        };
        let defaults = Self::default();
        let config = Self {
            idle_secs: pick(|f| f.idle_secs, defaults.idle_secs),
            network: files
                .iter()
                .find_map(|f| f.network)
                .unwrap_or(defaults.network),
            pids_max: pick(|f| f.pids_max, defaults.pids_max),
            memory_max_mib: pick(|f| f.memory_max_mib, defaults.memory_max_mib),
            unconfined: files
                .iter()
                .find_map(|f| f.unconfined)
                .unwrap_or(defaults.unconfined),
            bwrap: files.iter().find_map(|f| f.bwrap.clone()),
            expose: files
                .iter()
                .find_map(|f| f.expose.clone())
                .unwrap_or_default(),
            path: files
                .iter()
                .find_map(|f| f.path.clone())
                .unwrap_or_default(),
            sources: Vec::new(),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<()> {
        let check = |name: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(Error::Backend(format!(
                    "backend setting {name} = {value} is outside {min}..={max}"
                )))
            }
        };
        check("idle_secs", self.idle_secs, 1, 86_400)?;
        check("pids_max", self.pids_max, 16, PIDS_MAX_CEILING)?;
        check("memory_max_mib", self.memory_max_mib, 64, 1 << 20)?;
        if let Some(bwrap) = &self.bwrap
            && !bwrap.is_absolute()
        {
            return Err(Error::Backend(
                "backend setting bwrap must be an absolute path".into(),
            ));
        }
        for (name, list) in [("expose", &self.expose), ("path", &self.path)] {
            if list.len() > MAX_LIST_ENTRIES {
                return Err(Error::Backend(format!(
                    "backend setting {name} has {} entries; at most {MAX_LIST_ENTRIES}",
                    list.len()
                )));
            }
            for entry in list {
                check_entry(name, entry)?;
            }
        }
        Ok(())
    }

    /// Whether the files now would give other settings than these (which a daemon put
    /// in force at boot): a change takes effect at the next boot only.
    pub fn differs_from_files(&self, home: &Home, user_home: Option<&OsString>) -> bool {
        Self::load(home, user_home).map_or(true, |now| now != *self)
    }

    pub fn memory_max_bytes(&self) -> u64 {
        self.memory_max_mib << 20
    }
}

/// The managed scope root `home` belongs to: its parent, when that holds the registry.
pub fn managed_root(home: &Home) -> Option<&Path> {
    let parent = home.root().parent()?;
    fs::symlink_metadata(parent.join(REGISTRY_FILE_NAME))
        .is_ok_and(|m| m.is_file())
        .then_some(parent)
}

/// An `expose` or `path` entry: `~/REL` or `/ABS`, with no empty, `.` or `..`
/// component, no `:` (it would split `PATH`), no control character.
fn check_entry(name: &str, entry: &str) -> Result<()> {
    let bad = |why: &str| {
        Err(Error::Backend(format!(
            "backend setting {name}: entry {entry:?} {why}"
        )))
    };
    if entry.len() > MAX_ENTRY_BYTES {
        return bad(&format!("is longer than {MAX_ENTRY_BYTES} bytes"));
    }
    if entry.contains(':') || entry.chars().any(char::is_control) {
        return bad("contains ':' or a control character");
    }
    let rest = match (entry.strip_prefix("~/"), entry.strip_prefix('/')) {
        (Some(rest), _) | (None, Some(rest)) => rest,
        (None, None) => return bad("must be absolute or start with ~/"),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return bad("must be a normal path (no empty, . or .. component)");
    }
    Ok(())
}

/// `entry` (checked by [`check_entry`]) as a path: `~/` is `user_home`.
pub fn expand_entry(entry: &str, user_home: Option<&Path>) -> Option<PathBuf> {
    match entry.strip_prefix("~/") {
        Some(rest) => user_home
            .filter(|h| h.is_absolute())
            .map(|home| home.join(rest)),
        None => Some(PathBuf::from(entry)),
    }
}

/// A missing file is empty settings; anything else unreadable, malformed, or writable
/// by another user is an error naming the file's role, not its path (status output
/// must not carry host paths). An existing file's canonical path goes to `sources`.
fn read(path: &Path, sources: &mut Vec<PathBuf>) -> Result<SettingsFile> {
    match fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SettingsFile::default()),
        Err(e) => {
            return Err(Error::Backend(format!(
                "the backend settings file cannot be read: {e}"
            )));
        }
        Ok(meta) => {
            let owner_ok = meta.uid() == util::euid() || meta.uid() == 0;
            if !owner_ok || meta.mode() & 0o022 != 0 {
                return Err(Error::Backend(
                    "the backend settings file must be owned by this user (or root) and writable by no one else"
                        .into(),
                ));
            }
        }
    }
    sources.push(fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()));
    let bytes = match util::read_bounded(path, MAX_FILE_BYTES + 1) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SettingsFile::default()),
        Err(e) => {
            return Err(Error::Backend(format!(
                "the backend settings file cannot be read: {e}"
            )));
        }
    };
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(Error::Backend(format!(
            "the backend settings file is larger than {MAX_FILE_BYTES} bytes"
        )));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::Backend(format!("the backend settings file is malformed: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(text: &str) -> Result<SettingsFile> {
        serde_json::from_str(text).map_err(|e| Error::Backend(e.to_string()))
    }

    #[test]
    fn home_fields_override_user_fields_one_by_one() {
        let own = parse(r#"{"idle_secs": 5}"#).unwrap();
        let user = parse(r#"{"idle_secs": 60, "network": "host", "pids_max": 100}"#).unwrap();
        let config = BackendConfig::merge(&[own, user]).unwrap();
        assert_eq!(config.idle_secs, 5);
        assert_eq!(config.network, Network::Host);
        assert_eq!(config.pids_max, 100);
        assert_eq!(config.memory_max_mib, DEFAULT_MEMORY_MAX_MIB);
        assert!(!config.unconfined);
    }

    #[test]
    fn the_root_file_applies_to_its_scopes_under_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let scope = Home::at(root.join("scope"));
        std::fs::create_dir_all(scope.root()).unwrap();
        std::fs::write(
            root.join(FILE_NAME),
            r#"{"network": "host", "idle_secs": 30, "expose": ["~/.rustup"]}"#,
        )
        .unwrap();
        // Not a managed root until it holds the registry.
        let config = BackendConfig::load(&scope, None).unwrap();
        assert_eq!(config.network, Network::Loopback);
        std::fs::write(root.join(REGISTRY_FILE_NAME), "{}").unwrap();
        std::fs::write(scope.root().join(FILE_NAME), r#"{"idle_secs": 5}"#).unwrap();
        let config = BackendConfig::load(&scope, None).unwrap();
        assert_eq!((config.network, config.idle_secs), (Network::Host, 5));
        assert_eq!(config.expose, ["~/.rustup"]);
        assert_eq!(config.sources.len(), 2);
        assert!(!config.differs_from_files(&scope, None));
        std::fs::write(scope.root().join(FILE_NAME), r#"{"network": "loopback"}"#).unwrap();
        assert!(config.differs_from_files(&scope, None));
        for bad in [
            r#"{"expose": ["rel"]}"#,
            r#"{"expose": ["~/a/../b"]}"#,
            r#"{"expose": ["/"]}"#,
            r#"{"path": ["/a:/b"]}"#,
            r#"{"path": ["~/"]}"#,
        ] {
            let file = parse(bad).unwrap();
            assert!(BackendConfig::merge(&[file]).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_without_files() {
        let config = BackendConfig::merge(&[]).unwrap();
        assert_eq!(config, BackendConfig::default());
        assert_eq!(config.network, Network::Loopback);
        assert!(config.pids_max <= 4096);
    }

    #[test]
    fn unknown_fields_bad_values_and_ranges_are_refused() {
        assert!(parse(r#"{"idle": 5}"#).is_err());
        assert!(parse(r#"{"network": "bridge"}"#).is_err());
        assert!(parse(r#"[]"#).is_err());
        for bad in [
            r#"{"idle_secs": 0}"#,
            r#"{"pids_max": 1}"#,
            r#"{"memory_max_mib": 1}"#,
            r#"{"bwrap": "bin/bwrap"}"#,
        ] {
            let file = parse(bad).unwrap();
            let err = BackendConfig::merge(&[file]).expect_err(bad);
            assert_eq!(err.exit_code(), 126, "{bad}");
        }
    }

    #[test]
    fn files_are_read_from_home_and_user_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path().join("home"));
        std::fs::create_dir_all(home.root()).unwrap();
        let user = dir.path().join("user");
        std::fs::create_dir_all(user.join(".config/marsh-shim")).unwrap();
        std::fs::write(
            user.join(".config/marsh-shim").join(FILE_NAME),
            r#"{"network": "host", "idle_secs": 30}"#,
        )
        .unwrap();
        std::fs::write(home.root().join(FILE_NAME), r#"{"idle_secs": 2}"#).unwrap();
        let config = BackendConfig::load(&home, Some(&user.clone().into_os_string())).unwrap();
        assert_eq!((config.idle_secs, config.network), (2, Network::Host));
        assert_eq!(config.sources.len(), 2);
        assert!(config.ensure_outside(&dir.path().join("elsewhere")).is_ok());
        let inside = config.ensure_outside(&user).unwrap_err();
        assert_eq!(inside.exit_code(), 126);
        std::fs::write(home.root().join(FILE_NAME), "{").unwrap();
        let err = BackendConfig::load(&home, None).unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");
        assert!(!err.to_string().contains(dir.path().to_str().unwrap()));
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(home.root().join(FILE_NAME), "{}").unwrap();
        std::fs::set_permissions(
            home.root().join(FILE_NAME),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        let err = BackendConfig::load(&home, None).unwrap_err();
        assert!(err.to_string().contains("writable by no one else"), "{err}");
    }
}
