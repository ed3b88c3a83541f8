//! The `marsh` verbs other than `-c`: status, results, show, reset, stop, workers reset.
//! None of them boots a daemon.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use super::daemon_link;
use crate::backend::BackendReport;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::inject::{self, Verb};
use crate::kits::{self, Selection};
use crate::proto::{DaemonState, Op, Reply, ShellState, StatusReport, WorkerReport};
use crate::receipt;
use crate::util;

/// How long a stopped daemon may take to disappear.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// `user_home` is the caller's `HOME`, where the per-user backend settings live.
pub fn status(home: &Home, user_home: Option<&OsString>) -> Result<String> {
    inject::check(home, Verb::Status)?;
    // Without a daemon, the backend is reported as a boot would find it (a running
    // daemon reports what it put in force instead).
    let predicted = || BackendReport::predicted(home, user_home);
    if !home.exists() {
        return to_json(&absent_status("absent", Vec::new(), None, predicted()));
    }
    match daemon_link::quick(home, Op::Status)? {
        Some(Reply::Status { status }) => to_json(&status),
        Some(other) => Err(unexpected(&other)),
        None => {
            let workers = kits::registered(home)?;
            // A daemon that holds its lock but does not answer is still running.
            let pid = daemon_link::daemon_lock_held(home)
                .then(|| daemon_link::recorded_pid(home))
                .flatten();
            to_json(&absent_status("present", workers, pid, predicted()))
        }
    }
}

fn absent_status(
    home_state: &str,
    workers: Vec<String>,
    pid: Option<u32>,
    backend: BackendReport,
) -> StatusReport {
    StatusReport {
        home_state: home_state.into(),
        daemon: DaemonState {
            state: if pid.is_some() { "running" } else { "absent" }.into(),
            pid,
        },
        shell: ShellState {
            state: "down".into(),
            isolation: None,
        },
        workers: workers
            .into_iter()
            .map(|name| WorkerReport {
                name,
                state: "cold".into(),
                active_jobs: 0,
            })
            .collect(),
        active_jobs: 0,
        workspace: None,
        backend,
    }
}

pub fn results(home: &Home) -> Result<String> {
    inject::check(home, Verb::Results)?;
    #[derive(serde::Serialize)]
    struct Listing {
        results: Vec<receipt::Receipt>,
    }
    to_json(&Listing {
        results: receipt::list(&home.results_dir())?,
    })
}

pub fn show(home: &Home, selector: &str) -> Result<String> {
    inject::check(home, Verb::Show)?;
    to_json(&receipt::find(&home.results_dir(), selector)?)
}

pub fn reset(home: &Home) -> Result<String> {
    inject::check(home, Verb::Reset)?;
    if !home.exists() {
        return Ok(json!({ "reset": true, "was_running": false }).to_string());
    }
    match daemon_link::send(home, Op::Reset, &[])? {
        Some(link) => match link.reply()? {
            Reply::Reset { was_running } => {
                Ok(json!({ "reset": true, "was_running": was_running }).to_string())
            }
            other => Err(unexpected(&other)),
        },
        None if daemon_link::daemon_lock_held(home) => Err(Error::failed(
            "the daemon is running but does not answer; run `marsh stop`",
        )),
        None => Ok(json!({ "reset": true, "was_running": false }).to_string()),
    }
}

pub fn stop(home: &Home) -> Result<String> {
    inject::check(home, Verb::Stop)?;
    if !home.exists() {
        return Ok(json!({ "stopped": true, "was_running": false }).to_string());
    }
    let was_running = match daemon_link::send(home, Op::Stop, &[])? {
        Some(link) => match link.reply()? {
            Reply::Stopped { pid } => {
                await_exit(home, Some(pid))?;
                true
            }
            other => return Err(unexpected(&other)),
        },
        None => stop_unanswering(home)?,
    };
    Ok(json!({ "stopped": true, "was_running": was_running }).to_string())
}

/// Proves that no daemon runs for `home`: the daemon lock is free, or the process
/// holding it is this home's marshd, which is then killed. Returns whether one ran.
fn stop_unanswering(home: &Home) -> Result<bool> {
    if !daemon_link::daemon_lock_held(home) {
        return Ok(false);
    }
    let pid = daemon_link::recorded_pid(home)
        .filter(|pid| is_daemon_of(*pid, home))
        .ok_or_else(|| {
            Error::failed(
                "a daemon holds this home's lock but cannot be identified; it was not stopped",
            )
        })?;
    let raw = i32::try_from(pid).map_err(|_| Error::failed("invalid daemon pid"))?;
    let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
    await_exit(home, Some(pid))?;
    Ok(true)
}

/// True when `pid` runs `marshd serve --home <this home>`.
fn is_daemon_of(pid: u32, home: &Home) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.len() >= 4
        && args[0].ends_with(b"marshd")
        && args[1] == b"serve"
        && args[2] == b"--home"
        && args[3] == home.root().as_os_str().as_bytes()
}

/// Waits (bounded) until the daemon process is gone and its lock is free.
fn await_exit(home: &Home, pid: Option<u32>) -> Result<()> {
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        let alive = pid.is_some_and(util::process_alive);
        if !alive && !daemon_link::daemon_lock_held(home) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::failed("the daemon did not exit"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn workers_reset(home: &Home, selection: &Selection) -> Result<String> {
    inject::check(home, Verb::WorkersReset)?;
    let op = Op::WorkersReset {
        selection: selection.to_text(),
    };
    let names = match home
        .exists()
        .then(|| daemon_link::send(home, op, &[]))
        .transpose()?
        .flatten()
    {
        Some(link) => match link.reply()? {
            Reply::WorkersReset { names } => names,
            other => return Err(unexpected(&other)),
        },
        // No daemon: every worker is already cold.
        None => selection.resolve(&kits::registered(home)?)?,
    };
    Ok(json!({ "reset": names }).to_string())
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| Error::Protocol(e.to_string()))
}

fn unexpected(reply: &Reply) -> Error {
    Error::Protocol(format!("unexpected reply {reply:?}"))
}
