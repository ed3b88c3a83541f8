//! The only place that knows marsh's command line. Every invocation goes through
//! [`MarshDriver::command`], which revalidates the pinned executables first and gives
//! the child a cleared, rebuilt environment with cwd = the workspace.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::child_env::ChildEnv;
use crate::pinned::PinnedExecutable;
use crate::tools::envelope::{ErrorKind, ToolError};

/// marsh's exit status for "refused: work is active".
pub const EXIT_BUSY: i32 = 125;
/// Reads (status, results) end within this bound.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(60);
const QUERY_STDOUT_LIMIT: usize = 4 * 1024 * 1024;
const QUERY_STDERR_LIMIT: usize = 16 * 1024;

/// A marsh invocation. The only argv marsh-mcp ever builds comes from here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verb {
    Status,
    Results,
    ResultShow(String),
    Run(String),
    LoadRun { selection: String, command: String },
    WorkersReset(String),
    Reset,
    Stop,
}

impl Verb {
    /// The pinned project-shell boot (and boot validation): a no-op command that
    /// needs the daemon and the project shell up.
    pub fn boot() -> Self {
        Self::Run("true".into())
    }

    fn argv(&self) -> Vec<OsString> {
        let v: Vec<&str> = match self {
            Self::Status => vec!["status", "--json"],
            Self::Results => vec!["results", "--json"],
            Self::ResultShow(sel) => vec!["results", "show", sel, "--json"],
            Self::Run(cmd) => vec!["-c", cmd],
            Self::LoadRun { selection, command } => vec!["--load", selection, "-c", command],
            Self::WorkersReset(sel) => vec!["workers", "reset", sel],
            Self::Reset => vec!["reset", "--json"],
            Self::Stop => vec!["stop", "--json"],
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

    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    pub fn revalidate(&self) -> Result<(), ToolError> {
        for pin in self.pins() {
            pin.revalidate()
                .map_err(|e| ToolError::new(ErrorKind::ExecutableChanged, e.to_string()))?;
        }
        Ok(())
    }

    /// A ready-to-spawn marsh invocation against `home`.
    pub fn command(&self, verb: &Verb, home: &Path) -> Result<Command, ToolError> {
        self.revalidate()?;
        let mut cmd = Command::new(self.marsh.path());
        cmd.args(verb.argv()).current_dir(&self.workspace);
        self.env.apply(&mut cmd, Some(home));
        Ok(cmd)
    }

    /// A host recipe (qualification): same cleared environment, no marsh state.
    pub fn host_command(&self, program: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.args(args).current_dir(&self.workspace);
        self.env.apply(&mut cmd, None);
        cmd
    }

    /// Runs a short read-only verb with bounded capture and time.
    pub async fn query(&self, verb: &Verb, home: &Path) -> Result<Captured, ToolError> {
        self.query_within(verb, home, QUERY_TIMEOUT).await
    }

    /// Runs a verb to completion within `limit`, capturing bounded output.
    pub async fn query_within(
        &self,
        verb: &Verb,
        home: &Path,
        limit: Duration,
    ) -> Result<Captured, ToolError> {
        let mut cmd = self.command(verb, home)?;
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            ToolError::new(ErrorKind::BackendFailed, format!("cannot start marsh: {e}"))
        })?;
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let work = async {
            let (out, err) = tokio::join!(
                read_limited(stdout, QUERY_STDOUT_LIMIT),
                read_limited(stderr, QUERY_STDERR_LIMIT)
            );
            let status = child.wait().await;
            (out, err, status)
        };
        match tokio::time::timeout(limit, work).await {
            Ok((Ok(stdout), Ok(stderr), Ok(status))) => Ok(Captured {
                code: status.code(),
                stdout,
                stderr,
            }),
            Ok((Err(e), _, _)) | Ok((_, Err(e), _)) => {
                Err(ToolError::new(ErrorKind::BackendFailed, e))
            }
            Ok((_, _, Err(e))) => Err(ToolError::new(
                ErrorKind::BackendFailed,
                format!("cannot wait for marsh: {e}"),
            )),
            Err(_) => Err(ToolError::new(
                ErrorKind::TimedOut,
                format!("marsh did not answer within {} s", limit.as_secs()),
            )),
        }
    }

    /// Runs a read verb and parses its JSON answer, mapping marsh's failures to kinds.
    pub async fn query_json(
        &self,
        verb: &Verb,
        home: &Path,
    ) -> Result<serde_json::Value, ToolError> {
        let out = self.query(verb, home).await?;
        match out.code {
            Some(0) => serde_json::from_slice(&out.stdout).map_err(|e| {
                ToolError::new(
                    ErrorKind::BackendFailed,
                    format!("marsh printed malformed JSON: {e}"),
                )
            }),
            Some(EXIT_BUSY) => Err(ToolError::new(ErrorKind::ScopeBusy, out.stderr_line())),
            _ => {
                let message = out.stderr_line();
                let kind = if message.contains("no result matches") {
                    ErrorKind::NotFound
                } else if message.contains("ambiguous") {
                    ErrorKind::InvalidArgument
                } else {
                    ErrorKind::BackendFailed
                };
                Err(ToolError::new(kind, message))
            }
        }
    }
}

async fn read_limited<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    limit: usize,
) -> Result<Vec<u8>, String> {
    let Some(pipe) = pipe else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut limited = pipe.take(limit as u64 + 1);
    limited
        .read_to_end(&mut out)
        .await
        .map_err(|e| format!("cannot read marsh output: {e}"))?;
    if out.len() > limit {
        return Err(format!("marsh printed more than {limit} bytes"));
    }
    Ok(out)
}
