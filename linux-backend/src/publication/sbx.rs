//! Driving the stock `sbx` (docs/sbx-stand-in.md has the verbs). Every run is bounded in time (a
//! run that outlives [`SBX_TIMEOUT`] is killed with its process group) and in captured
//! output, with exactly the given environment, stdin `/dev/null`, cwd = workspace.

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStderr, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use serde::Deserialize;

use crate::util;

/// Longest one sbx invocation may run.
const SBX_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes kept of each output stream (the rest is read and dropped).
const MAX_CAPTURE: usize = 64 * 1024;

/// One failing step of an sbx run, naming the command or verb.
#[derive(Debug, thiserror::Error)]
pub enum SbxError {
    #[error("cannot run {command}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} did not finish within {secs} s and was killed")]
    TimedOut { command: String, secs: u64 },
    #[error("waiting for {command}: {source}")]
    Wait {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// `last` is the last non-empty line of its stderr.
    #[error("sbx mcp {verb} exited with {code}: {last}")]
    Exited {
        verb: &'static str,
        code: i32,
        last: String,
    },
    #[error("sbx mcp {verb} was killed by a signal: {last}")]
    Killed { verb: &'static str, last: String },
    #[error("sbx mcp inspect {server} printed no registration: {source}")]
    NoRegistration {
        server: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A registration as `sbx mcp inspect --json` shows it (only what a match compares).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Registration {
    pub command: String,
    pub args: Vec<String>,
    pub dir: Option<String>,
}

/// One sbx executable with the environment and cwd of every run.
pub struct Sbx<'a> {
    pub program: &'a Path,
    pub env: &'a [(OsString, OsString)],
    pub cwd: &'a Path,
}

struct Ran {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Ran {
    fn not_found(&self, server: &str) -> bool {
        self.code == Some(1)
            && String::from_utf8_lossy(&self.stderr).trim()
                == format!("MCP server \"{server}\" not found")
    }
}

impl Sbx<'_> {
    /// The registration of `server`, `None` when sbx says it is not found.
    pub fn inspect(&self, server: &str) -> Result<Option<Registration>, SbxError> {
        let ran = self.run(&["mcp", "inspect", server, "--json"])?;
        if ran.not_found(server) {
            return Ok(None);
        }
        if ran.code != Some(0) {
            return Err(self.failure("inspect", &ran));
        }
        serde_json::from_slice(&ran.stdout)
            .map(Some)
            .map_err(|source| SbxError::NoRegistration {
                server: server.to_string(),
                source,
            })
    }

    /// Removes `server` whether or not it is loaded; absent is fine.
    pub fn remove(&self, server: &str) -> Result<(), SbxError> {
        let ran = self.run(&["mcp", "rm", "--force", server])?;
        if ran.code == Some(0) || ran.not_found(server) {
            Ok(())
        } else {
            Err(self.failure("rm", &ran))
        }
    }

    /// `sbx mcp add SERVER --command COMMAND --args A,B,...` (no argument may hold a
    /// comma; the caller checked).
    pub fn add(&self, server: &str, command: &str, args: &[String]) -> Result<(), SbxError> {
        let joined = args.join(",");
        let ran = self.run(&[
            "mcp",
            "add",
            server,
            "--command",
            command,
            "--args",
            &joined,
        ])?;
        match ran.code {
            Some(0) => Ok(()),
            _ => Err(self.failure("add", &ran)),
        }
    }

    pub fn load(&self, server: &str, sandbox: &str) -> Result<(), SbxError> {
        let ran = self.run(&["mcp", "load", server, "--sandbox", sandbox])?;
        match ran.code {
            Some(0) => Ok(()),
            _ => Err(self.failure("load", &ran)),
        }
    }

    fn failure(&self, verb: &'static str, ran: &Ran) -> SbxError {
        let stderr = String::from_utf8_lossy(&ran.stderr);
        let last = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .to_string();
        match ran.code {
            Some(code) => SbxError::Exited { verb, code, last },
            None => SbxError::Killed { verb, last },
        }
    }

    fn run(&self, args: &[&str]) -> Result<Ran, SbxError> {
        let what = || format!("{} {}", self.program.display(), args.join(" "));
        let mut child = Command::new(self.program)
            .args(args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| SbxError::Spawn {
                command: what(),
                source,
            })?;
        let pid = util::child_pid(&child);
        let stdout = child.stdout.take().map(|s| capture(Stream::Out(s)));
        let stderr = child.stderr.take().map(|s| capture(Stream::Err(s)));
        let deadline = Instant::now() + SBX_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        let timed_out = loop {
            // WNOWAIT: the exited leader stays a zombie, so its group id cannot be
            // reused before the group is killed below.
            match waitid(
                Id::Pid(pid),
                WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG,
            ) {
                Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Ok(WaitStatus::StillAlive) => break true,
                Err(nix::errno::Errno::EINTR) => {}
                Ok(_) | Err(_) => break false,
            }
        };
        // Whatever it left in its group (and itself, on timeout) ends here.
        util::kill_group(pid);
        let status = child.wait();
        let stdout = stdout.and_then(|h| h.join().ok()).unwrap_or_default();
        let stderr = stderr.and_then(|h| h.join().ok()).unwrap_or_default();
        if timed_out {
            return Err(SbxError::TimedOut {
                command: what(),
                secs: SBX_TIMEOUT.as_secs(),
            });
        }
        let status = status.map_err(|source| SbxError::Wait {
            command: what(),
            source,
        })?;
        Ok(Ran {
            code: status.code(),
            stdout,
            stderr,
        })
    }
}

enum Stream {
    Out(ChildStdout),
    Err(ChildStderr),
}

/// Reads a stream to its end on a thread, keeping the first [`MAX_CAPTURE`] bytes.
fn capture(stream: Stream) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut reader: Box<dyn Read + Send> = match stream {
            Stream::Out(s) => Box::new(s),
            Stream::Err(s) => Box::new(s),
        };
        let mut kept = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = MAX_CAPTURE.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        kept
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, body: &str) -> std::path::PathBuf {
        let path = dir.join("fake-sbx");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn outcomes_are_classified() {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))];
        let program = script(
            dir.path(),
            r#"case "$2" in
inspect) [ "$3" = known ] && echo '{"name":"known","command":"c","args":["a"],"dir":null,"loaded":[]}' && exit 0
         echo "MCP server \"$3\" not found" >&2; exit 1;;
rm) echo "MCP server \"$4\" not found" >&2; exit 1;;
add) [ "$6" = --args ] && [ "$7" = "x,y" ] && exit 0; exit 3;;
load) echo 'sbx: broken' >&2; exit 1;;
esac"#,
        );
        let sbx = Sbx {
            program: &program,
            env: &env,
            cwd: dir.path(),
        };
        assert_eq!(
            sbx.inspect("known").unwrap(),
            Some(Registration {
                command: "c".into(),
                args: vec!["a".into()],
                dir: None
            })
        );
        assert_eq!(sbx.inspect("other").unwrap(), None);
        sbx.remove("absent").unwrap();
        sbx.add("s", "cmd", &["x".into(), "y".into()]).unwrap();
        assert!(sbx.add("s", "cmd", &["z".into()]).is_err());
        let err = sbx.load("s", "dev").unwrap_err();
        assert_eq!(err.to_string(), "sbx mcp load exited with 1: sbx: broken");
    }

    #[test]
    fn output_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let program = script(dir.path(), "head -c 1000000 /dev/zero; exit 1");
        let env = vec![(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))];
        let sbx = Sbx {
            program: &program,
            env: &env,
            cwd: dir.path(),
        };
        let ran = sbx.run(&["x"]).unwrap();
        assert_eq!(ran.stdout.len(), MAX_CAPTURE);
        assert_eq!(ran.code, Some(1));
    }
}
