//! Runs one bound call through the pinned marsh and reports what is known about it:
//! how it ended, the bounded output, and what cleanup was observed.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use tokio_util::sync::CancellationToken;

use super::bind::Invocation;
use crate::error::{ErrorKind, ToolError};
use crate::marsh::{EXIT_SPAWN_BLOCKED, MarshDriver, Verb};
use crate::supervisor::{CapturedRun, Ending, Input, run_captured_with};

/// How a run ended, as a published tool reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    ExitNonzero,
    Timeout,
    Cancelled,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::ExitNonzero => "exit_nonzero",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Certainty {
    Verified,
    Uncertain,
    /// Cleanup was requested and is in progress; nothing confirmed it yet.
    Pending,
}

impl Certainty {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Verified => "verified",
            Self::Uncertain => "uncertain",
            Self::Pending => "pending",
        }
    }
}

/// Everything a result reports about one run.
#[derive(Debug)]
pub struct RunReport {
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Both streams whole: nothing cut by the bound, both pipes reached end of file.
    pub output_complete: bool,
    pub cleanup: Certainty,
    /// Pipelines only: the host process group of the marsh client was seen empty.
    pub host_cleanup: Option<Certainty>,
    /// A receipt that marsh named and `results show` confirmed.
    pub receipt: Option<String>,
    pub duration_ms: u64,
    /// Why the outcome is `failed`, for people.
    pub failure: Option<String>,
}

/// A run's bounds, from the declaration.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_output_bytes: usize,
    pub timeout: Duration,
}

/// A receipt id as marsh prints it: `[0-9a-f-]{1,64}`, starting with a hex digit.
fn valid_receipt_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id.as_bytes()[0].is_ascii_hexdigit()
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
}

/// What marsh wrote on the receipt descriptor (it writes once, after the run). The
/// read end is non-blocking: marsh has exited by now, and a descriptor a straggler
/// still held must not stall the call (the id is then not claimed).
fn read_receipt_id(read_end: OwnedFd) -> Option<String> {
    nix::fcntl::fcntl(&read_end, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).ok()?;
    let mut file = std::fs::File::from(read_end);
    let mut buf = Vec::with_capacity(80);
    (&mut file).take(80).read_to_end(&mut buf).ok()?;
    let id = std::str::from_utf8(&buf).ok()?.trim_end_matches('\n');
    valid_receipt_id(id).then(|| id.to_string())
}

fn registered_kit(home: &Path, kit: &str) -> Result<(), ToolError> {
    let entry = home.join("kits").join(format!("{kit}.json"));
    match std::fs::symlink_metadata(&entry) {
        Ok(meta) if meta.file_type().is_file() => Ok(()),
        _ => Err(ToolError::new(
            ErrorKind::NotFound,
            format!("the command {kit:?} is not registered in the publishing home"),
        )),
    }
}

/// Runs `invocation` to its end, within `bounds`, or until `cancel`.
pub async fn run(
    driver: &MarshDriver,
    home: &Path,
    invocation: Invocation,
    bounds: Bounds,
    cancel: &CancellationToken,
) -> Result<RunReport, ToolError> {
    let started = Instant::now();
    let (verb, stdin, receipt_pipe) = match invocation {
        Invocation::Pipeline { pipeline, stdin } => (Verb::Run(pipeline), stdin, None),
        Invocation::Kit { kit, args, stdin } => {
            registered_kit(home, &kit)?;
            let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| {
                ToolError::new(ErrorKind::Internal, format!("cannot make a pipe: {e}"))
            })?;
            let verb = Verb::KitRun {
                kit,
                args,
                receipt_fd: write_end.as_raw_fd(),
            };
            (verb, stdin, Some((read_end, write_end)))
        }
    };
    let is_pipeline = receipt_pipe.is_none();
    let cmd = driver.command(&verb, home)?;
    let run = run_captured_with(
        cmd,
        Input::Bytes(stdin),
        bounds.max_output_bytes,
        bounds.timeout,
        cancel,
    )
    .await;
    let receipt_id = receipt_pipe.and_then(|(read_end, write_end)| {
        // The child holds its own copy; ours must close before the read can end.
        drop(write_end);
        read_receipt_id(read_end)
    });
    let receipt = match receipt_id {
        Some(id) => confirmed_receipt(driver, home, id).await,
        None => None,
    };
    Ok(report(run, is_pipeline, receipt, started.elapsed()))
}

/// The id, if `results show` finds exactly that kit receipt.
async fn confirmed_receipt(driver: &MarshDriver, home: &Path, id: String) -> Option<String> {
    let answer = driver
        .query_json(&Verb::ResultShow(id.clone()), home)
        .await
        .ok()?;
    (answer.get("id").and_then(|v| v.as_str()) == Some(id.as_str())
        && answer.get("kind").and_then(|v| v.as_str()) == Some("kit"))
    .then_some(id)
}

/// marsh's own spawn-blocked diagnostic is its last stderr line (docs/linux-backend.md).
fn marsh_refused(stderr: &[u8]) -> bool {
    String::from_utf8_lossy(stderr)
        .trim_end()
        .rsplit('\n')
        .next()
        .is_some_and(|line| line.starts_with("marsh: "))
}

fn report(
    run: CapturedRun,
    is_pipeline: bool,
    receipt: Option<String>,
    took: Duration,
) -> RunReport {
    let (exit_code, signal) = run.ending.exit_parts();
    let stdout_truncated = run.stdout.discarded > 0;
    let stderr_truncated = run.stderr.discarded > 0;
    let output_complete = !stdout_truncated && !stderr_truncated && run.drained;
    let host = if run.group_gone {
        Certainty::Verified
    } else {
        Certainty::Uncertain
    };
    let ended_by_us = matches!(run.ending, Ending::TimedOut(_) | Ending::Cancelled(_));
    let cleanup = match (&run.ending, is_pipeline) {
        // Work inside the project shell's sandbox is never observed from here.
        (_, true) => Certainty::Uncertain,
        (Ending::SpawnFailed(_), false) => Certainty::Verified,
        // marsh was told to cancel; the daemon ends the kit job after it is gone.
        (_, false) if ended_by_us => Certainty::Pending,
        // marsh reports a kit run's end only after its container is empty.
        (_, false) => host,
    };
    let mut failure = None;
    let outcome = match &run.ending {
        Ending::SpawnFailed(e) => {
            failure = Some(format!("cannot start marsh: {e}"));
            Outcome::Failed
        }
        Ending::TimedOut(_) => Outcome::Timeout,
        Ending::Cancelled(_) => Outcome::Cancelled,
        Ending::Exited(_)
            if exit_code == Some(EXIT_SPAWN_BLOCKED) && marsh_refused(&run.stderr.kept) =>
        {
            failure = Some("marsh could not start the job (backend unavailable)".into());
            Outcome::Failed
        }
        Ending::Exited(_) if exit_code != Some(0) => Outcome::ExitNonzero,
        Ending::Exited(_) => {
            let cleaned = if is_pipeline { host } else { cleanup };
            if !output_complete {
                failure = Some("the command exited 0 but its output is incomplete".into());
                Outcome::Failed
            } else if cleaned != Certainty::Verified {
                failure = Some("the command exited 0 but its cleanup was not verified".into());
                Outcome::Failed
            } else {
                Outcome::Success
            }
        }
    };
    RunReport {
        outcome,
        exit_code,
        signal,
        stdout: run.stdout.kept,
        stderr: run.stderr.kept,
        stdout_truncated,
        stderr_truncated,
        output_complete,
        cleanup,
        host_cleanup: is_pipeline.then_some(host),
        receipt,
        duration_ms: took.as_millis() as u64,
        failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_ids_are_checked() {
        assert!(valid_receipt_id("0f2b6c1e-8d3a-4b5c-9e7f-112233445566"));
        for bad in ["", "-x", "ABC", "g1", "1 2", &"a".repeat(65)] {
            assert!(!valid_receipt_id(bad), "{bad}");
        }
        assert!(marsh_refused(
            b"job said hi\nmarsh: backend unavailable: x\n"
        ));
        assert!(!marsh_refused(b"marsh: early\njob line\n"));
    }
}
