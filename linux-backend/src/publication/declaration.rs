//! The declaration file (`marsh.published_tool/v1`): written by `publish`, read and
//! checked by `load` and `unpublish`. Readers refuse unknown fields.
//!
//! A written declaration is owner-only (0600), has one link, and appears atomically:
//! temp file in the same directory + fsync + rename + directory fsync. A reader only
//! trusts a regular file (never a symlink) owned by the effective uid with no
//! group/other bits and one link.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::TxError;
use super::control::sync_dir;
use super::names::{MAX_OUTPUT_BYTES, MAX_TIMEOUT_MS};
use crate::util;

pub const SCHEMA: &str = "marsh.published_tool/v1";
/// Largest declaration read.
const MAX_DECLARATION_BYTES: u64 = 256 * 1024;

/// `(st_dev, st_ino)` of the canonical workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub device: u64,
    pub inode: u64,
}

/// One declaration; field order is the file's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declaration {
    pub schema: String,
    pub tool_name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publication_generation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandSpec>,
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    pub canonical_workspace: String,
    pub workspace_identity: Identity,
    pub home: String,
}

/// Command mode (hand-written declarations; `mcp publish` writes pipelines only). Its
/// bindings are checked in full by the exporter; here only their shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandSpec {
    pub kit: String,
    pub bindings: Bindings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bindings {
    pub argv: Vec<ArgBinding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<StdinBinding>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ArgBinding {
    Literal(String),
    Positional(String),
    NamedOption { option: String, field: String },
    Flag { option: String, field: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinBinding {
    pub field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// The input schema of every pipeline: one string property, `input`.
pub fn pipeline_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "input": {
                "type": "string",
                "description": "Bytes given to the pipeline as stdin (UTF-8)."
            }
        },
        "additionalProperties": false
    })
}

/// A lowercase hyphenated UUID.
pub fn valid_generation(text: &str) -> bool {
    text.len() == 36
        && text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// Why a declaration on disk is not usable, or not this publisher's.
#[derive(Debug, thiserror::Error)]
pub enum DeclarationError {
    #[error("cannot open the declaration {}: {source}", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot inspect {}: {source}", .path.display())]
    Inspect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the declaration {} is unsafe: {why}", .path.display())]
    Unsafe { path: PathBuf, why: &'static str },
    #[error("the declaration {} is malformed: {source}", .path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the declaration {} is malformed: {problem}", .path.display())]
    Invalid {
        path: PathBuf,
        problem: InvalidDeclaration,
    },
    #[error(
        "{tool} was published from the workspace {found} (device {found_device}, inode {found_inode}), not from {} (device {}, inode {})",
        .workspace.display(), .identity.device, .identity.inode
    )]
    OtherWorkspace {
        tool: String,
        found: String,
        found_device: u64,
        found_inode: u64,
        workspace: PathBuf,
        identity: Identity,
    },
    #[error("{tool} was published with the marsh home {found}, not {}", .home.display())]
    OtherHome {
        tool: String,
        found: String,
        home: PathBuf,
    },
}

/// The rule a declaration's content breaks.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDeclaration {
    #[error("schema {found:?} is not {SCHEMA:?}")]
    Schema { found: String },
    #[error("it declares the tool {found:?}, not {expected:?}")]
    OtherTool { found: String, expected: String },
    #[error("it must declare exactly one of pipeline and command")]
    NotExactlyOneAction,
    #[error("generation {0:?} is not a UUID")]
    Generation(String),
    #[error("a bound is out of range")]
    BoundOutOfRange,
}

impl Declaration {
    /// Whether it names this workspace (path and identity) and this home; the
    /// problem otherwise.
    pub fn check_owner(
        &self,
        workspace: &Path,
        identity: Identity,
        home: &Path,
    ) -> Result<(), DeclarationError> {
        if Path::new(&self.canonical_workspace) != workspace || self.workspace_identity != identity
        {
            return Err(DeclarationError::OtherWorkspace {
                tool: self.tool_name.clone(),
                found: self.canonical_workspace.clone(),
                found_device: self.workspace_identity.device,
                found_inode: self.workspace_identity.inode,
                workspace: workspace.to_path_buf(),
                identity,
            });
        }
        if Path::new(&self.home) != home {
            return Err(DeclarationError::OtherHome {
                tool: self.tool_name.clone(),
                found: self.home.clone(),
                home: home.to_path_buf(),
            });
        }
        Ok(())
    }

    /// The rules every declaration meets; the problem otherwise.
    fn validate(&self, expected_name: &str) -> Result<(), InvalidDeclaration> {
        if self.schema != SCHEMA {
            return Err(InvalidDeclaration::Schema {
                found: self.schema.clone(),
            });
        }
        if self.tool_name != expected_name {
            return Err(InvalidDeclaration::OtherTool {
                found: self.tool_name.clone(),
                expected: expected_name.to_string(),
            });
        }
        if self.pipeline.is_some() == self.command.is_some() {
            return Err(InvalidDeclaration::NotExactlyOneAction);
        }
        if let Some(generation) = &self.publication_generation
            && !valid_generation(generation)
        {
            return Err(InvalidDeclaration::Generation(generation.clone()));
        }
        if self
            .max_output_bytes
            .is_some_and(|n| !(1..=MAX_OUTPUT_BYTES).contains(&n))
            || self
                .timeout_ms
                .is_some_and(|n| !(1..=MAX_TIMEOUT_MS).contains(&n))
        {
            return Err(InvalidDeclaration::BoundOutOfRange);
        }
        Ok(())
    }
}

/// Writes `declaration` as `dir/name` atomically and durably. A failure before the
/// rename changed nothing (rejected); once renamed, a failure is uncertain.
pub fn write(dir: &Path, name: &str, declaration: &Declaration) -> Result<(), TxError> {
    let mut bytes = serde_json::to_vec_pretty(declaration)
        .map_err(|e| TxError::Rejected(format!("encoding the declaration: {e}")))?;
    bytes.push(b'\n');
    let tmp = dir.join(format!(
        ".{name}.{}.tmp",
        util::random_hex(6).map_err(|e| TxError::Rejected(e.to_string()))?
    ));
    let target = dir.join(name);
    let staged = (|| -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, &target)
    })();
    if let Err(e) = staged {
        // The temp name is ours alone (random, exclusive create).
        let _ = fs::remove_file(&tmp);
        return Err(TxError::Rejected(format!(
            "writing {}: {e}",
            target.display()
        )));
    }
    sync_dir(dir).map_err(|e| TxError::Uncertain(format!("syncing {}: {e}", dir.display())))
}

/// Reads and checks the declaration of `expected_name` at `path`; `Ok(None)` when
/// there is none.
pub fn read(path: &Path, expected_name: &str) -> Result<Option<Declaration>, DeclarationError> {
    let at = || path.to_path_buf();
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(DeclarationError::Open { path: at(), source }),
    };
    let unsafe_file = |why| DeclarationError::Unsafe { path: at(), why };
    let meta = file
        .metadata()
        .map_err(|source| DeclarationError::Inspect { path: at(), source })?;
    if !meta.is_file() {
        return Err(unsafe_file("not a regular file"));
    }
    if meta.uid() != util::euid() {
        return Err(unsafe_file("owned by another user"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_file("readable or writable by group or others"));
    }
    if meta.nlink() != 1 {
        return Err(unsafe_file("it has several links"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_DECLARATION_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| DeclarationError::Read { path: at(), source })?;
    if bytes.len() as u64 > MAX_DECLARATION_BYTES {
        return Err(unsafe_file("larger than 256 KiB"));
    }
    let declaration: Declaration = serde_json::from_slice(&bytes)
        .map_err(|source| DeclarationError::Json { path: at(), source })?;
    declaration
        .validate(expected_name)
        .map_err(|problem| DeclarationError::Invalid {
            path: at(),
            problem,
        })?;
    Ok(Some(declaration))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn sample() -> Declaration {
        Declaration {
            schema: SCHEMA.into(),
            tool_name: "hello".into(),
            description: "Say hello".into(),
            publication_generation: Some("0f8fad5b-d9cb-469f-a165-70867728950e".into()),
            pipeline: Some("tr a-z A-Z".into()),
            command: None,
            input_schema: pipeline_input_schema(),
            max_output_bytes: Some(262_144),
            timeout_ms: Some(120_000),
            canonical_workspace: "/w".into(),
            workspace_identity: Identity {
                device: 1,
                inode: 2,
            },
            home: "/h".into(),
        }
    }

    #[test]
    fn written_declarations_read_back_and_are_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "hello.json", &sample()).unwrap();
        let path = dir.path().join("hello.json");
        let meta = fs::metadata(&path).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.nlink()), (0o600, 1));
        assert_eq!(read(&path, "hello").unwrap(), Some(sample()));
        let text = fs::read_to_string(&path).unwrap();
        let keys: Vec<String> = serde_json::from_str::<serde_json::Map<String, Value>>(&text)
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert!(keys.contains(&"pipeline".to_string()) && !keys.contains(&"command".to_string()));
        assert_eq!(
            read(&dir.path().join("absent.json"), "absent").unwrap(),
            None
        );
        assert!(read(&path, "other").is_err(), "the name must match");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read(&path, "hello").unwrap_err(),
            DeclarationError::Unsafe { why, .. } if why.contains("group or others")
        ));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::hard_link(&path, dir.path().join("second")).unwrap();
        assert!(matches!(
            read(&path, "hello").unwrap_err(),
            DeclarationError::Unsafe { why, .. } if why.contains("links")
        ));
    }

    #[test]
    fn readers_refuse_unknown_fields_and_two_modes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hello.json");
        let mut value = serde_json::to_value(sample()).unwrap();
        value["extra"] = json!(1);
        util::write_durable(dir.path(), "hello.json", value.to_string().as_bytes()).unwrap();
        assert!(read(&path, "hello").is_err());
        let mut value = serde_json::to_value(sample()).unwrap();
        value["command"] = json!({"kit": "k", "bindings": {"argv": [{"literal": "--x"}, {"positional": "a"},
            {"named_option": {"option": "--lang", "field": "b"}}, {"flag": {"option": "-n", "field": "c"}}],
            "stdin": {"field": "d", "max_bytes": 10}}});
        util::write_durable(dir.path(), "hello.json", value.to_string().as_bytes()).unwrap();
        assert!(matches!(
            read(&path, "hello").unwrap_err(),
            DeclarationError::Invalid {
                problem: InvalidDeclaration::NotExactlyOneAction,
                ..
            }
        ));
        value.as_object_mut().unwrap().remove("pipeline");
        util::write_durable(dir.path(), "hello.json", value.to_string().as_bytes()).unwrap();
        let read_back = read(&path, "hello").unwrap().unwrap();
        assert_eq!(read_back.command.unwrap().bindings.argv.len(), 4);
    }

    #[test]
    fn owner_check_compares_workspace_identity_and_home() {
        let d = sample();
        let id = Identity {
            device: 1,
            inode: 2,
        };
        assert!(d.check_owner(Path::new("/w"), id, Path::new("/h")).is_ok());
        assert!(d.check_owner(Path::new("/x"), id, Path::new("/h")).is_err());
        assert!(
            d.check_owner(
                Path::new("/w"),
                Identity {
                    device: 1,
                    inode: 3
                },
                Path::new("/h")
            )
            .is_err()
        );
        assert!(d.check_owner(Path::new("/w"), id, Path::new("/g")).is_err());
    }
}
