//! Running a client CLI (codex, claude, sbx, marsh-mcp itself) bounded in time and
//! output, with an explicit environment: nothing is inherited that is not listed. This
//! crate never spawns a process itself; a [`Runner`] does (the broker's child supervisor
//! in the product, fakes in tests).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::InstallError;

/// Output a runner keeps per stream; the rest is read and discarded so the child never
/// blocks on a full pipe.
pub const CLIENT_OUTPUT_LIMIT: usize = 256 * 1024;

/// Runs client CLIs. The `marsh-mcp` binary supplies the broker's child supervisor;
/// tests supply fakes.
pub trait Runner {
    /// Runs `command` to its end: its own process group, stdin null, exactly
    /// `command.env` as the environment, cwd `command.cwd`, at most
    /// `command.timeout` (then the group is signalled and reaped), each stream kept
    /// up to CLIENT_OUTPUT_LIMIT bytes (the rest read and discarded).
    ///
    /// Errors: [`InstallError::Spawn`] when the program cannot be started (or waited
    /// for), [`InstallError::TimedOut`] when the timeout elapsed; both carry
    /// `command.display()`. A run that finished with any status is `Ok`.
    fn run(&self, command: &ClientCommand) -> Result<Finished, InstallError>;
}

/// How a client command ended. `code` is `None` when it was killed by a signal.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// One client invocation: program (absolute), arguments, environment, cwd, timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCommand {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub timeout: Duration,
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

    /// Runs through `runner` and requires exit status 0.
    pub fn run_ok(&self, runner: &dyn Runner) -> Result<Finished, InstallError> {
        let done = self.run(runner)?;
        if done.ok() {
            Ok(done)
        } else {
            Err(self.failure(&done))
        }
    }

    /// Runs through `runner`; any exit status is `Ok`.
    pub fn run(&self, runner: &dyn Runner) -> Result<Finished, InstallError> {
        runner.run(self)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::test_support::{Scripted, finished};

    fn command() -> ClientCommand {
        ClientCommand::new(
            Path::new("/opt/bin/codex"),
            Path::new("/work/ws"),
            Vec::new(),
            Duration::from_secs(1),
        )
        .args(["mcp", "get"])
    }

    #[test]
    fn run_ok_delegates_and_turns_a_failed_exit_into_client_failed() {
        let ok = Scripted::new(|_: &ClientCommand| finished(0, "out", ""));
        assert_eq!(command().run_ok(&ok).unwrap().stdout, "out");
        assert_eq!(ok.take(), [["codex", "mcp", "get"]]);

        let failed = Scripted::new(|_: &ClientCommand| finished(3, "  fallback \n", " "));
        let err = command().run_ok(&failed).unwrap_err();
        assert!(
            matches!(&err, InstallError::ClientFailed { command, code: Some(3), diagnostic }
                if command == "codex mcp get" && diagnostic == "fallback"),
            "{err:?}"
        );
        assert!(command().run(&failed).is_ok(), "run accepts any exit");
    }

    #[test]
    fn runner_errors_pass_through() {
        struct Slow;
        impl Runner for Slow {
            fn run(&self, command: &ClientCommand) -> Result<Finished, InstallError> {
                Err(InstallError::TimedOut {
                    command: command.display(),
                    after: command.timeout,
                })
            }
        }
        assert!(matches!(
            command().run_ok(&Slow),
            Err(InstallError::TimedOut { command, .. }) if command == "codex mcp get"
        ));
    }
}
