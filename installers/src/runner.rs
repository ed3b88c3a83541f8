//! Running a client CLI (codex, claude, sbx, marsh-mcp itself) bounded in time and
//! output, with an explicit environment: nothing is inherited that is not listed.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::InstallError;

/// Output kept per stream; the rest is read and discarded so the child never blocks.
const OUTPUT_LIMIT: usize = 256 * 1024;

#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// The trimmed stderr (or stdout when stderr is empty) for error messages.
    pub fn diagnostic(&self) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        text.trim().chars().take(2000).collect()
    }
}

/// One client invocation: program (absolute), arguments, environment, cwd.
#[derive(Debug, Clone)]
pub struct ClientCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub timeout: Duration,
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            match pipe.read(&mut buf) {
                Ok(0) | Err(_) => return kept,
                Ok(n) => {
                    let room = OUTPUT_LIMIT.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
    })
}

impl ClientCommand {
    pub fn new(program: &Path, cwd: &Path, env: Vec<(String, String)>, timeout: Duration) -> Self {
        Self {
            program: program.to_path_buf(),
            args: Vec::new(),
            env,
            cwd: cwd.to_path_buf(),
            timeout,
        }
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// How the command is shown in errors.
    pub fn display(&self) -> String {
        let name = self.program.file_name().map_or_else(
            || self.program.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        format!("{name} {}", self.args.join(" "))
    }

    /// The error for a finished run that did not exit 0.
    pub fn failure(&self, done: &Finished) -> InstallError {
        InstallError::ClientFailed {
            command: self.display(),
            code: done.code,
            diagnostic: done.diagnostic(),
        }
    }

    /// Runs and requires exit status 0.
    pub fn run_ok(&self) -> Result<Finished, InstallError> {
        let done = self.run()?;
        if done.ok() {
            Ok(done)
        } else {
            Err(self.failure(&done))
        }
    }

    pub fn run(&self) -> Result<Finished, InstallError> {
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| InstallError::Spawn {
                command: self.display(),
                source,
            })?;
        let out = child.stdout.take().map(drain);
        let err = child.stderr.take().map(drain);
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            if let Some(status) = child.try_wait().map_err(|source| InstallError::Spawn {
                command: self.display(),
                source,
            })? {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(child.id() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                return Err(InstallError::TimedOut {
                    command: self.display(),
                    after: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The group may hold the pipes open after the leader exited; it is done now.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let text = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.and_then(|h| h.join().ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        Ok(Finished {
            code: status.code(),
            stdout: text(out),
            stderr: text(err),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_explicit() {
        let dir = tempfile::tempdir().unwrap();
        let env = vec![("ONLY".to_string(), "this".to_string())];
        let done = ClientCommand::new(
            Path::new("/bin/sh"),
            dir.path(),
            env.clone(),
            Duration::from_secs(5),
        )
        .args(["-c", "echo $ONLY; echo ${HOME:-unset} >&2; exit 3"])
        .run()
        .unwrap();
        assert_eq!(
            (done.code, done.stdout.as_str(), done.stderr.as_str()),
            (Some(3), "this\n", "unset\n")
        );
        let slow = ClientCommand::new(
            Path::new("/bin/sleep"),
            dir.path(),
            env,
            Duration::from_millis(200),
        )
        .args(["5"])
        .run();
        assert!(matches!(slow, Err(InstallError::TimedOut { .. })));
    }
}
