//! `sbx`: a stand-in for the stock sandbox CLI of another vendor, so that the SBX
//! installer and published commands can be exercised on machines without it (its
//! contract: docs/sbx-stand-in.md). `sbx version`, `sbx ls --json` (read from a JSON
//! state file) and the `sbx mcp ...` verbs of [`mcp`]. The binary in `main.rs` only
//! calls [`main`].

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod mcp;
mod state;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use serde_json::{Value, json};

use state::StateFile;

/// Failures of `sbx version` and `sbx ls`; `sbx mcp` has its own ([`mcp::McpError`]).
#[derive(Debug, thiserror::Error)]
enum Error {
    #[error("usage: {0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
}

type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    fn failed(message: impl Into<String>) -> Self {
        Error::Failed(message.into())
    }

    /// `2` for usage, `1` otherwise (the stock CLI's codes).
    fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            Error::Failed(_) => 1,
        }
    }
}

/// One diagnostic line on stderr.
fn log(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The passwd home of the effective uid (never `$HOME`).
fn passwd_home() -> Option<PathBuf> {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|user| user.dir)
}

/// Entry point of the `sbx` binary; returns the process exit code.
pub fn main() -> i32 {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let explicit = std::env::var_os("SBX_SHIM_STATE").filter(|v| !v.is_empty());
    let state = state_path(explicit, passwd_home);
    if let Some((verb, rest)) = args.split_first()
        && verb == "mcp"
    {
        return mcp::main(rest, state);
    }
    match dispatch(&args, state) {
        Ok(line) => match writeln!(std::io::stdout().lock(), "{line}") {
            Ok(()) => 0,
            Err(_) => 1,
        },
        Err(e) => {
            log(format_args!("sbx: {e}"));
            e.exit_code()
        }
    }
}

/// `$SBX_SHIM_STATE` when set, else `<passwd home>/.local/state/sbx-shim/state.json`:
/// never `$HOME` or `$XDG_STATE_HOME`, which callers (marsh-mcp, the daemon, a
/// terminal) set differently, so that every caller of one user finds one file.
fn state_path(
    explicit: Option<OsString>,
    passwd_home: impl FnOnce() -> Option<PathBuf>,
) -> Option<PathBuf> {
    match explicit {
        Some(path) => Some(PathBuf::from(path)),
        None => passwd_home().map(|home| home.join(".local/state/sbx-shim/state.json")),
    }
}

fn dispatch(args: &[OsString], state: Option<PathBuf>) -> Result<String> {
    let words: Vec<&str> = args
        .iter()
        .map(|a| {
            a.to_str()
                .ok_or_else(|| Error::Usage("arguments must be UTF-8".into()))
        })
        .collect::<Result<_>>()?;
    match words.as_slice() {
        ["version"] | ["--version"] => Ok(format!(
            "sbx version {} (marsh-shim)",
            env!("CARGO_PKG_VERSION")
        )),
        ["ls", rest @ ..] if rest.iter().all(|w| *w == "--json") => {
            let state = state.ok_or_else(|| {
                Error::failed(
                    "cannot locate the state file: SBX_SHIM_STATE is unset and the user has no passwd entry",
                )
            })?;
            Ok(json!({ "sandboxes": sandboxes(&state)? }).to_string())
        }
        _ => Err(Error::Usage(
            "sbx version | sbx ls --json | sbx mcp VERB ... (see sbx mcp --help)".into(),
        )),
    }
}

/// The `sandboxes` array of the state file; a missing file means none.
fn sandboxes(path: &std::path::Path) -> Result<Vec<Value>> {
    StateFile::new(path.to_path_buf())
        .read()
        .and_then(|state| state.sandboxes())
        .map_err(|e| Error::failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn state_path_precedence() {
        let passwd = || Some(PathBuf::from("/pw"));
        assert_eq!(
            state_path(Some("/s.json".into()), passwd),
            Some(PathBuf::from("/s.json"))
        );
        assert_eq!(
            state_path(None, passwd),
            Some(PathBuf::from("/pw/.local/state/sbx-shim/state.json"))
        );
        assert_eq!(state_path(None, || None), None);
    }

    #[test]
    fn ls_reads_the_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let ls = |p: &PathBuf| dispatch(&["ls".into(), "--json".into()], Some(p.clone()));
        assert_eq!(ls(&path).unwrap(), r#"{"sandboxes":[]}"#);
        std::fs::write(&path, r#"{"sandboxes":[{"name":"a"}]}"#).unwrap();
        assert_eq!(ls(&path).unwrap(), r#"{"sandboxes":[{"name":"a"}]}"#);
        assert_eq!(dispatch(&["nope".into()], None).unwrap_err().exit_code(), 2);
    }
}
