//! The invocation log `.shim/invocations.jsonl`: one line per `marsh` run, recording
//! exactly what the caller passed (argv, cwd, the complete environment), so black-box
//! tests can prove what marsh-mcp hands its children.
//!
//! A test hook, compiled only with the `test-hooks` feature: the log holds every
//! variable of the caller's environment, secrets included, and grows without bound, so
//! nothing a user installs may write it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use serde::Serialize;

use crate::error::{Context, Result};
use crate::home::Home;
use crate::util;

#[derive(Serialize)]
struct Line {
    argv: Vec<String>,
    cwd: String,
    env: BTreeMap<String, String>,
    pid: u32,
    ts_ms: u64,
}

fn log_path(home: &Home) -> std::path::PathBuf {
    home.root().join(".shim/invocations.jsonl")
}

/// Appends one line (a single `write` on an `O_APPEND` descriptor, so concurrent
/// invocations never interleave within a line). Does nothing when the home is absent:
/// logging never creates a home. Non-UTF-8 text is recorded lossily.
pub fn record(
    home: &Home,
    argv: &[OsString],
    cwd: &Path,
    env: &[(OsString, OsString)],
) -> Result<()> {
    if !home.exists() {
        return Ok(());
    }
    util::ensure_private_dir(&home.root().join(".shim"))?;
    let line = Line {
        argv: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        cwd: cwd.to_string_lossy().into_owned(),
        env: env
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .collect(),
        pid: std::process::id(),
        ts_ms: util::now_ms(),
    };
    let mut bytes =
        serde_json::to_vec(&line).map_err(|e| crate::error::Error::Protocol(e.to_string()))?;
    bytes.push(b'\n');
    let path = log_path(home);
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .and_then(|mut f| f.write_all(&bytes))
        .context(|| format!("appending to {}", path.display()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn appends_json_lines_only_when_home_exists() {
        let dir = tempfile::tempdir().unwrap();
        let missing = Home::at(dir.path().join("missing"));
        record(&missing, &[], Path::new("/"), &[]).unwrap();
        assert!(!missing.exists());

        let home = Home::at(dir.path());
        let env = vec![(OsString::from("A"), OsString::from("1"))];
        record(
            &home,
            &["marsh".into(), "status".into()],
            Path::new("/w"),
            &env,
        )
        .unwrap();
        record(&home, &["marsh".into()], Path::new("/w"), &env).unwrap();
        let text = std::fs::read_to_string(log_path(&home)).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["argv"][1], "status");
        assert_eq!(lines[0]["env"]["A"], "1");
        assert_eq!(lines[0]["cwd"], "/w");
    }
}
