//! The `sbx` stand-in's state file: one JSON object holding the
//! `sandboxes` list, the MCP registrations under `mcp`, and under `loads` what each
//! sandbox loaded (a snapshot of the registration's definition at load time). Every
//! other key, and every unknown field of a registration or snapshot, is kept as found.
//!
//! Readers need no lock: writers replace the file atomically (temp file + fsync +
//! rename + directory fsync). Writers serialize their read-modify-write cycles with an
//! exclusive flock on the sibling `<state file>.lock`, so no update is ever lost.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Largest state file read or written.
pub const MAX_STATE_FILE: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not valid JSON: {source}", .path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {what}", .path.display())]
    Malformed { path: PathBuf, what: String },
    #[error("{} would exceed {MAX_STATE_FILE} bytes", .path.display())]
    TooLarge { path: PathBuf },
    #[error("{0}")]
    Write(#[source] marsh_scope_registry::RegistryError),
}

type Result<T, E = StateError> = std::result::Result<T, E>;

/// One MCP registration as stored under `mcp.<name>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Working directory of the launched server; `None` means the launcher's cwd.
    #[serde(default)]
    pub dir: Option<String>,
    /// Sandboxes this registration (since its `add`) is loaded into, sorted, without
    /// duplicates. A sandbox that loaded an earlier registration of the same name is
    /// not listed here; its snapshot is under `loads`.
    #[serde(default)]
    pub loaded: Vec<String>,
    /// Fields this stand-in does not know, kept on rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Registration {
    /// The definition a load snapshots: everything but `loaded`.
    pub fn definition(&self) -> Definition {
        Definition {
            command: self.command.clone(),
            args: self.args.clone(),
            dir: self.dir.clone(),
            extra: self.extra.clone(),
        }
    }
}

/// What a sandbox loaded, as stored under `loads.<sandbox>.<name>`: the registration's
/// definition when it was loaded, launched by `gateway-exec` whatever happened to the
/// registration since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Definition {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub dir: Option<String>,
    /// Fields this stand-in does not know, kept on rewrite.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// The snapshots of every sandbox: sandbox name → server name → definition.
pub type Loads = BTreeMap<String, BTreeMap<String, Definition>>;

/// The parsed state file.
#[derive(Debug, Clone)]
pub struct State {
    path: PathBuf,
    root: Map<String, Value>,
}

impl State {
    fn parse(path: &Path, bytes: &[u8]) -> Result<Self> {
        let path = path.to_path_buf();
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self {
                path,
                root: Map::new(),
            });
        }
        match serde_json::from_slice(bytes) {
            Ok(Value::Object(root)) => Ok(Self { path, root }),
            Ok(_) => Err(StateError::Malformed {
                path,
                what: "the state is not a JSON object".into(),
            }),
            Err(source) => Err(StateError::Json { path, source }),
        }
    }

    fn malformed(&self, what: impl Into<String>) -> StateError {
        StateError::Malformed {
            path: self.path.clone(),
            what: what.into(),
        }
    }

    /// The `sandboxes` array; absent or null means none.
    pub fn sandboxes(&self) -> Result<Vec<Value>> {
        match self.root.get("sandboxes") {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items.clone()),
            Some(_) => Err(self.malformed("`sandboxes` is not an array")),
        }
    }

    /// The MCP registrations by name; an absent or null `mcp` key means none.
    pub fn registrations(&self) -> Result<BTreeMap<String, Registration>> {
        match self.root.get("mcp") {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(entries)) => entries
                .iter()
                .map(|(name, entry)| {
                    Registration::deserialize(entry)
                        .map(|reg| (name.clone(), reg))
                        .map_err(|e| self.malformed(format!("MCP server {name:?}: {e}")))
                })
                .collect(),
            Some(_) => Err(self.malformed("`mcp` is not an object")),
        }
    }

    /// The snapshots under `loads`; an absent or null `loads` key means none.
    pub fn loads(&self) -> Result<Loads> {
        match self.root.get("loads") {
            None | Some(Value::Null) => Ok(Loads::new()),
            Some(value @ Value::Object(_)) => {
                Loads::deserialize(value).map_err(|e| self.malformed(format!("`loads`: {e}")))
            }
            Some(_) => Err(self.malformed("`loads` is not an object")),
        }
    }

    /// Replaces the `loads` key with `loads`, without the sandboxes that hold nothing;
    /// when none is left the key is removed (a state that never loaded has none).
    pub fn set_loads(&mut self, loads: &Loads) -> Result<()> {
        let kept: Loads = loads
            .iter()
            .filter(|(_, servers)| !servers.is_empty())
            .map(|(sandbox, servers)| (sandbox.clone(), servers.clone()))
            .collect();
        if kept.is_empty() {
            self.root.remove("loads");
            return Ok(());
        }
        let value = serde_json::to_value(&kept)
            .map_err(|e| self.malformed(format!("encoding `loads`: {e}")))?;
        self.root.insert("loads".into(), value);
        Ok(())
    }

    /// Replaces the `mcp` key with `registrations`.
    pub fn set_registrations(
        &mut self,
        registrations: &BTreeMap<String, Registration>,
    ) -> Result<()> {
        let value = serde_json::to_value(registrations)
            .map_err(|e| self.malformed(format!("encoding `mcp`: {e}")))?;
        self.root.insert("mcp".into(), value);
        Ok(())
    }
}

fn io_error(action: &'static str, path: &Path, source: std::io::Error) -> StateError {
    StateError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// At most `limit` bytes of the regular file at `path`, opened without following a
/// symlink and without blocking on a FIFO planted there.
fn read_limited(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The state file at one path.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// The sibling lock file: the state path with `.lock` appended.
    pub fn lock_path(&self) -> PathBuf {
        let mut name = OsString::from(self.path.as_os_str());
        name.push(".lock");
        PathBuf::from(name)
    }

    /// The current state, without locking; a missing file is the empty state.
    pub fn read(&self) -> Result<State> {
        let bytes = match read_limited(&self.path, MAX_STATE_FILE + 1) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_error("reading", &self.path, e)),
        };
        if bytes.len() as u64 > MAX_STATE_FILE {
            return Err(StateError::TooLarge {
                path: self.path.clone(),
            });
        }
        State::parse(&self.path, &bytes)
    }

    /// Runs one read-modify-write cycle under the lock: `change` edits the state and
    /// the file is rewritten (atomically) only when the state changed. An error from
    /// `change` leaves the file untouched.
    pub fn update<T, E: From<StateError>>(
        &self,
        change: impl FnOnce(&mut State) -> Result<T, E>,
    ) -> Result<T, E> {
        let (dir, name) = self.split()?;
        if !dir.as_os_str().is_empty() && dir != Path::new(".") {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(|e| io_error("creating", &dir, e))?;
        }
        let _lock = self.lock()?;
        let mut state = self.read()?;
        let before = state.root.clone();
        let value = change(&mut state)?;
        if state.root != before {
            let bytes = serde_json::to_vec_pretty(&state.root)
                .map_err(|e| state.malformed(format!("encoding the state: {e}")))?;
            if bytes.len() as u64 > MAX_STATE_FILE {
                return Err(StateError::TooLarge {
                    path: self.path.clone(),
                }
                .into());
            }
            marsh_scope_registry::write_atomically(&dir, &name, &bytes)
                .map_err(StateError::Write)?;
        }
        Ok(value)
    }

    /// The state file's directory and UTF-8 file name.
    fn split(&self) -> Result<(PathBuf, String)> {
        let name = self
            .path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| StateError::Malformed {
                path: self.path.clone(),
                what: "the state path must end in a UTF-8 file name".into(),
            })?;
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        Ok((dir, name.to_string()))
    }

    /// Takes the exclusive flock on the lock file; released when the file is dropped.
    fn lock(&self) -> Result<File> {
        let path = self.lock_path();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| io_error("opening", &path, e))?;
        file.lock().map_err(|e| io_error("locking", &path, e))?;
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn keeps_unknown_keys_and_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested/state.json");
        let file = StateFile::new(path.clone());
        assert!(file.read().unwrap().registrations().unwrap().is_empty());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            r#"{"sandboxes":[{"name":"dev"}],"other":1,"mcp":{"a":{"command":"x","color":"red"}}}"#,
        )
        .unwrap();
        file.update(|state| -> Result<()> {
            let mut regs = state.registrations()?;
            regs.get_mut("a").unwrap().loaded.push("dev".into());
            state.set_registrations(&regs)
        })
        .unwrap();
        let value: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(value["other"], 1);
        assert_eq!(value["sandboxes"][0]["name"], "dev");
        assert_eq!(value["mcp"]["a"]["color"], "red");
        assert_eq!(value["mcp"]["a"]["loaded"][0], "dev");
        assert_eq!(value["mcp"]["a"]["args"], serde_json::json!([]));
        assert!(file.lock_path().ends_with("state.json.lock"));
    }

    #[test]
    fn loads_round_trip_keep_unknown_fields_and_drop_empty_sandboxes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let file = StateFile::new(path.clone());
        std::fs::write(
            &path,
            r#"{"mcp":{"a":{"command":"new","loaded":[]}},"loads":{"s1":{"a":{"command":"old","args":["x"],"dir":null,"env":{"K":"v"}}},"s2":{"a":{"command":"old"}}}}"#,
        )
        .unwrap();
        let state = file.read().unwrap();
        let loads = state.loads().unwrap();
        let old = &loads["s1"]["a"];
        assert_eq!(
            (old.command.as_str(), old.args.as_slice()),
            ("old", &["x".to_string()][..])
        );
        assert_eq!(old.extra["env"], serde_json::json!({"K": "v"}));
        let reg = &state.registrations().unwrap()["a"];
        assert_eq!(reg.definition().command, "new");
        file.update(|state| -> Result<()> {
            let mut loads = state.loads()?;
            loads.get_mut("s2").unwrap().clear();
            state.set_loads(&loads)
        })
        .unwrap();
        let value: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(value["loads"]["s1"]["a"]["env"]["K"], "v");
        assert!(value["loads"].get("s2").is_none(), "{value}");
        file.update(|state| -> Result<()> { state.set_loads(&Loads::new()) })
            .unwrap();
        let value: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert!(value.get("loads").is_none(), "{value}");
        assert_eq!(value["mcp"]["a"]["command"], "new");
    }

    #[test]
    fn rejects_malformed_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let file = StateFile::new(path.clone());
        std::fs::write(&path, "[]").unwrap();
        assert!(matches!(file.read(), Err(StateError::Malformed { .. })));
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(file.read(), Err(StateError::Json { .. })));
        std::fs::write(&path, r#"{"mcp":[]}"#).unwrap();
        assert!(file.read().unwrap().registrations().is_err());
        for bad in [
            r#"{"loads":[]}"#,
            r#"{"loads":{"s":[]}}"#,
            r#"{"loads":{"s":{"a":{}}}}"#,
        ] {
            std::fs::write(&path, bad).unwrap();
            assert!(
                matches!(
                    file.read().unwrap().loads(),
                    Err(StateError::Malformed { .. })
                ),
                "{bad}"
            );
        }
        std::fs::write(&path, "  \n").unwrap();
        assert!(file.read().unwrap().sandboxes().unwrap().is_empty());
    }
}
