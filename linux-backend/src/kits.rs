//! Registered kits (`kits/<name>.json`) and worker selections (`all` or `a,b,c`).

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::home::Home;
use crate::util;

/// At most this many directory entries are examined when listing kits.
const MAX_KIT_ENTRIES: usize = 4096;
const MAX_KIT_FILE: u64 = 64 * 1024;

/// `[a-z0-9-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// One registered kit: its command runs with the caller's arguments appended.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Kit {
    pub command: Vec<String>,
    #[serde(default)]
    pub description: String,
}

/// Names of the registered kits, sorted. A missing `kits/` means none.
pub fn registered(home: &Home) -> Result<Vec<String>> {
    registered_in(&home.kits_dir())
}

fn registered_in(dir: &Path) -> Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
    };
    let mut names = BTreeSet::new();
    for entry in entries.take(MAX_KIT_ENTRIES).flatten() {
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        if valid_name(name) && entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
            names.insert(name.to_string());
        }
    }
    Ok(names.into_iter().collect())
}

/// Loads and validates one kit definition.
pub fn load(home: &Home, name: &str) -> Result<Kit> {
    if !valid_name(name) {
        return Err(Error::failed(format!("invalid kit name {name:?}")));
    }
    let path = home.kits_dir().join(format!("{name}.json"));
    let bytes = match util::read_bounded(&path, MAX_KIT_FILE) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::failed(format!("unknown kit {name}")));
        }
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    let kit: Kit = serde_json::from_slice(&bytes)
        .map_err(|e| Error::failed(format!("kit {name} is invalid: {e}")))?;
    match kit.command.first() {
        Some(argv0) if !argv0.is_empty() => {}
        _ => return Err(Error::failed(format!("kit {name} has an empty command"))),
    }
    if kit.command.iter().any(|a| a.contains('\0')) {
        return Err(Error::failed(format!(
            "kit {name} has a NUL in its command"
        )));
    }
    Ok(kit)
}

/// A worker selection as written on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    All,
    Names(Vec<String>),
}

impl Selection {
    /// Parses `all` or a comma list of kit names (duplicates collapse). Syntax errors
    /// are usage errors.
    pub fn parse(text: &str) -> Result<Self> {
        if text == "all" {
            return Ok(Selection::All);
        }
        let mut names = Vec::new();
        for name in text.split(',') {
            if !valid_name(name) {
                return Err(Error::Usage(format!(
                    "invalid worker selection {text:?}: expected `all` or names matching [a-z0-9-]{{1,64}} separated by commas"
                )));
            }
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        Ok(Selection::Names(names))
    }

    /// The selection as written on the command line (and sent to the daemon).
    pub fn to_text(&self) -> String {
        match self {
            Selection::All => "all".into(),
            Selection::Names(names) => names.join(","),
        }
    }

    /// The selected names among `registered`; an unregistered name is an error.
    pub fn resolve(&self, registered: &[String]) -> Result<Vec<String>> {
        match self {
            Selection::All => Ok(registered.to_vec()),
            Selection::Names(names) => {
                if let Some(unknown) = names.iter().find(|n| !registered.contains(n)) {
                    return Err(Error::failed(format!("unknown kit {unknown}")));
                }
                Ok(names.clone())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("a-1"));
        assert!(!valid_name(""));
        assert!(!valid_name("A"));
        assert!(!valid_name("a.b"));
        assert!(!valid_name(&"a".repeat(65)));
    }

    #[test]
    fn selections() {
        assert_eq!(Selection::parse("all").unwrap(), Selection::All);
        assert_eq!(
            Selection::parse("b,a,b").unwrap(),
            Selection::Names(vec!["b".into(), "a".into()])
        );
        assert_eq!(Selection::parse("a,,b").unwrap_err().exit_code(), 2);
        let reg = vec!["a".to_string(), "b".to_string()];
        assert_eq!(Selection::All.resolve(&reg).unwrap(), reg);
        let err = Selection::parse("c").unwrap().resolve(&reg).unwrap_err();
        assert_eq!(err.to_string(), "unknown kit c");
    }

    #[test]
    fn registry_lists_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        fs::create_dir(home.kits_dir()).unwrap();
        fs::write(
            home.kits_dir().join("echo.json"),
            r#"{"command":["echo","hi"]}"#,
        )
        .unwrap();
        fs::write(home.kits_dir().join("Bad.json"), "{}").unwrap();
        fs::write(home.kits_dir().join("empty.json"), r#"{"command":[]}"#).unwrap();
        assert_eq!(
            registered(&home).unwrap(),
            vec!["echo".to_string(), "empty".to_string()]
        );
        assert_eq!(load(&home, "echo").unwrap().command, vec!["echo", "hi"]);
        assert!(load(&home, "empty").is_err());
        assert_eq!(
            load(&home, "nope").unwrap_err().to_string(),
            "unknown kit nope"
        );
    }
}
