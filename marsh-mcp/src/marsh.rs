//! The only place that knows marsh's command line. Every invocation goes through
//! [`MarshDriver::command`], which revalidates the pinned executables first and gives
//! the child a cleared, rebuilt environment with cwd = the workspace.
//!
//! marsh runs through its pinned descriptor, and receives the pinned `marshd` and
//! `sbx` descriptors (inherited by marsh only, named by `MARSH_MARSHD_FD` and by
//! `MARSH_SBX` as a `/proc/self/fd` path), so the three trust anchors run as the inodes
//! that were verified even if a file is renamed over one after the check. The stand-in
//! marks inherited descriptors close-on-exec at once, so none reaches its daemon.

use std::ffi::OsString;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use marsh_scope_registry::VerifyRound;
use tokio_util::sync::CancellationToken;

use crate::child_env::{ChildEnv, MARSHD_FD_VAR};
use crate::error::{ErrorKind, ToolError};
use crate::pinned::PinnedExecutable;
use crate::spawn::ChildCommand;
use crate::supervisor::{Ending, run_captured};

/// marsh's exit status for "refused: work is active".
pub(crate) const EXIT_BUSY: i32 = 125;
/// marsh could not run a job: the backend is missing or failed (spawn blocked).
pub(crate) const EXIT_SPAWN_BLOCKED: i32 = 126;
/// `results show SEL`: no receipt matches the selector.
pub(crate) const EXIT_NO_MATCH: i32 = 3;
/// `results show SEL`: the selector matches several receipts.
pub(crate) const EXIT_AMBIGUOUS: i32 = 4;
/// Reads (status, results) end within this bound.
pub(crate) const QUERY_TIMEOUT: Duration = Duration::from_secs(60);
/// Kept per stream of a query; a longer answer is refused, never parsed cut.
const QUERY_STDOUT_LIMIT: usize = 4 * 1024 * 1024;

/// A marsh invocation. The only argv marsh-mcp ever builds comes from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verb {
    Status,
    Results,
    ResultShow(String),
    Run(String),
    LoadRun {
        selection: String,
        command: String,
    },
    WorkersReset(String),
    Reset,
    Stop,
    /// One registered kit with exactly these arguments, no shell (export command
    /// mode); marsh writes the kit receipt's id to `receipt_fd`, which the child
    /// inherits at the same number.
    KitRun {
        kit: String,
        args: Vec<String>,
        receipt_fd: RawFd,
    },
}

impl Verb {
    /// The pinned project-shell boot (and boot validation): a no-op command that
    /// needs the daemon and the project shell up.
    pub fn boot() -> Self {
        Self::Run("true".into())
    }

    fn argv(&self) -> Vec<OsString> {
        if let Self::KitRun {
            kit,
            args,
            receipt_fd,
        } = self
        {
            let mut argv: Vec<OsString> = ["kit", "run", kit.as_str(), "--receipt-fd"]
                .into_iter()
                .map(OsString::from)
                .collect();
            argv.push(receipt_fd.to_string().into());
            argv.push("--".into());
            argv.extend(args.iter().map(OsString::from));
            return argv;
        }
        let v: Vec<&str> = match self {
            Self::Status => vec!["status", "--json"],
            Self::Results => vec!["results", "--json"],
            Self::ResultShow(sel) => vec!["results", "show", sel, "--json"],
            Self::Run(cmd) => vec!["-c", cmd],
            Self::LoadRun { selection, command } => vec!["--load", selection, "-c", command],
            Self::WorkersReset(sel) => vec!["workers", "reset", sel],
            Self::Reset => vec!["reset", "--json"],
            Self::Stop => vec!["stop", "--json"],
            Self::KitRun { .. } => Vec::new(),
        };
        v.into_iter().map(OsString::from).collect()
    }
}

#[derive(Debug)]
pub struct MarshDriver {
    marsh: PinnedExecutable,
    marshd: PinnedExecutable,
    sbx: PinnedExecutable,
    env: ChildEnv,
    workspace: PathBuf,
}

/// A finished short query.
#[derive(Debug)]
pub struct Captured {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Captured {
    pub fn stderr_line(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        let line = text.trim();
        if line.is_empty() {
            format!("marsh exited with {:?} and no message", self.code)
        } else {
            line.chars().take(2000).collect()
        }
    }
}

impl MarshDriver {
    pub fn new(
        marsh: PinnedExecutable,
        marshd: PinnedExecutable,
        sbx: PinnedExecutable,
        env: ChildEnv,
        workspace: PathBuf,
    ) -> Self {
        Self {
            marsh,
            marshd,
            sbx,
            env,
            workspace,
        }
    }

    pub fn pins(&self) -> [&PinnedExecutable; 3] {
        [&self.marsh, &self.marshd, &self.sbx]
    }

    pub fn env(&self) -> &ChildEnv {
        &self.env
    }

    /// Revalidates the three pins, reading their shared ancestors once.
    pub fn revalidate(&self) -> Result<(), ToolError> {
        let mut round = VerifyRound::default();
        for pin in self.pins() {
            pin.revalidate_in(&mut round).map_err(|e| {
                tracing::error!("{}: {} ({})", e.path.display(), e.what, e.detail);
                ToolError::new(ErrorKind::ExecutableChanged, e.to_string())
            })?;
        }
        Ok(())
    }

    /// A ready-to-spawn marsh invocation against `home`.
    ///
    /// The child keeps the three pinned descriptors (close-on-exec here, so no other
    /// child receives them). marsh's own is among them: an interpreted marsh (`#!`) is
    /// reopened by its interpreter through the same `/proc/self/fd` path after
    /// `execve`, so it must survive the exec.
    pub fn command(&self, verb: &Verb, home: &Path) -> Result<ChildCommand, ToolError> {
        self.revalidate()?;
        let mut cmd = ChildCommand::new(self.marsh.exec_path());
        cmd.arg0(self.marsh.path())
            .args(verb.argv())
            .current_dir(&self.workspace);
        self.env.apply(&mut cmd, Some(home));
        cmd.env(MARSHD_FD_VAR, self.marshd.raw_fd().to_string());
        for pin in self.pins() {
            cmd.inherit_fd(pin.raw_fd());
        }
        if let Verb::KitRun { receipt_fd, .. } = verb {
            cmd.inherit_fd(*receipt_fd);
        }
        Ok(cmd)
    }

    /// A host recipe (qualification): same cleared environment, no marsh state.
    pub fn host_command(&self, program: &Path, args: &[&str]) -> ChildCommand {
        let mut cmd = ChildCommand::new(program);
        cmd.args(args).current_dir(&self.workspace);
        self.env.apply(&mut cmd, None);
        cmd
    }

    /// Runs a short read-only verb with bounded capture and time.
    pub(crate) async fn query(&self, verb: &Verb, home: &Path) -> Result<Captured, ToolError> {
        self.query_within(verb, home, QUERY_TIMEOUT, &CancellationToken::new())
            .await
    }

    /// Runs a verb to completion within `limit` (or until `cancel`) under the child
    /// supervisor, which escalates on the whole group, capturing bounded output.
    pub(crate) async fn query_within(
        &self,
        verb: &Verb,
        home: &Path,
        limit: Duration,
        cancel: &CancellationToken,
    ) -> Result<Captured, ToolError> {
        let cmd = self.command(verb, home)?;
        let run = run_captured(cmd, QUERY_STDOUT_LIMIT, limit, cancel).await;
        if run.stdout.discarded > 0 {
            return Err(ToolError::new(
                ErrorKind::BackendFailed,
                format!("marsh printed more than {QUERY_STDOUT_LIMIT} bytes"),
            ));
        }
        match run.ending {
            Ending::Exited(status) => Ok(Captured {
                code: status.code(),
                stdout: run.stdout.kept,
                stderr: run.stderr.kept,
            }),
            Ending::TimedOut(_) => Err(ToolError::new(
                ErrorKind::TimedOut,
                format!("marsh did not answer within {} s", limit.as_secs()),
            )),
            Ending::Cancelled(_) => Err(ToolError::new(
                ErrorKind::BackendFailed,
                "the query was cancelled before marsh answered",
            )),
            Ending::SpawnFailed(e) => Err(ToolError::new(
                ErrorKind::BackendFailed,
                format!("cannot start marsh: {e}"),
            )),
        }
    }

    /// Runs a read verb and parses its JSON answer, mapping marsh's exit statuses to
    /// kinds (never its message text).
    pub(crate) async fn query_json(
        &self,
        verb: &Verb,
        home: &Path,
    ) -> Result<serde_json::Value, ToolError> {
        answer(self.query(verb, home).await?)
    }
}

/// A read verb's JSON answer, or its failure classified by exit status (never by
/// message text).
pub(crate) fn answer(out: Captured) -> Result<serde_json::Value, ToolError> {
    let kind = match out.code {
        Some(0) => {
            return serde_json::from_slice(&out.stdout).map_err(|e| {
                ToolError::new(
                    ErrorKind::BackendFailed,
                    format!("marsh printed malformed JSON: {e}"),
                )
            });
        }
        Some(EXIT_BUSY) => ErrorKind::ScopeBusy,
        Some(EXIT_NO_MATCH) => ErrorKind::NotFound,
        Some(EXIT_AMBIGUOUS) => ErrorKind::InvalidArgument,
        Some(_) | None => ErrorKind::BackendFailed,
    };
    Err(ToolError::new(kind, out.stderr_line()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32, stdout: &str) -> Captured {
        Captured {
            code: Some(code),
            stdout: stdout.as_bytes().to_vec(),
            stderr: b"marsh: some words that must not matter".to_vec(),
        }
    }

    #[test]
    fn answers_are_classified_by_exit_status_only() {
        assert_eq!(answer(exited(0, "{\"a\":1}")).unwrap()["a"], 1);
        let kind = |code| answer(exited(code, "")).unwrap_err().kind;
        assert_eq!(kind(EXIT_BUSY), ErrorKind::ScopeBusy);
        assert_eq!(kind(EXIT_NO_MATCH), ErrorKind::NotFound);
        assert_eq!(kind(EXIT_AMBIGUOUS), ErrorKind::InvalidArgument);
        assert_eq!(kind(1), ErrorKind::BackendFailed);
        assert_eq!(
            answer(exited(0, "not json")).unwrap_err().kind,
            ErrorKind::BackendFailed
        );
    }
}
