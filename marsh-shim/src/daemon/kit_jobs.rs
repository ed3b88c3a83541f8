//! Kit jobs: each invocation of a registered kit runs the kit's command plus the
//! caller's arguments in a fresh sandbox (the "fresh job container") with the caller's
//! stdio, on the kit's worker, and leaves a receipt.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::Arc;

use super::{Daemon, Shell};
use crate::kits::{self, Kit};
use crate::proto::{Bytes, EnvVar, ToAgent};
use crate::receipt::Receipt;
use crate::sandbox::{self, Isolation, Layout, Role};
use crate::util::{self, log};

/// Validates a kit request from `shell`'s agent and runs it on its own thread (which
/// also owns the container: `--die-with-parent` follows the spawning thread).
pub(super) fn start(
    daemon: &Arc<Daemon>,
    shell: &Arc<Shell>,
    req: u64,
    kit_name: String,
    args: Vec<Bytes>,
    env: Vec<EnvVar>,
    fds: Vec<OwnedFd>,
) {
    let fail = |code: i32, message: String| shell.send(&ToAgent::KitFailed { req, code, message });
    let Ok::<[OwnedFd; 3], _>(stdio) = fds.try_into() else {
        return fail(1, "kit request without stdin, stdout and stderr".into());
    };
    let kit = match kits::load(&daemon.cfg.home, &kit_name) {
        Ok(kit) => kit,
        Err(e) => return fail(127, e.to_string()),
    };
    let key = (shell.id, req);
    if let Err(e) = daemon.kit_job_begin(key, &kit_name) {
        return fail(1, e.to_string());
    }
    let job = KitJob {
        daemon: Arc::clone(daemon),
        shell: Arc::clone(shell),
        req,
        name: kit_name,
        kit,
        args,
        env,
    };
    let spawned = std::thread::Builder::new()
        .name(format!("kit-{}", job.name))
        .spawn(move || job.run(stdio));
    if let Err(e) = spawned {
        daemon.kit_job_end(key);
        fail(1, format!("starting the kit thread: {e}"));
    }
}

struct KitJob {
    daemon: Arc<Daemon>,
    shell: Arc<Shell>,
    req: u64,
    name: String,
    kit: Kit,
    args: Vec<Bytes>,
    env: Vec<EnvVar>,
}

impl KitJob {
    fn key(&self) -> (u64, u64) {
        (self.shell.id, self.req)
    }

    fn run(self, stdio: [OwnedFd; 3]) {
        let started = util::now_ms();
        let argv: Vec<OsString> = self
            .kit
            .command
            .iter()
            .map(OsString::from)
            .chain(self.args.iter().map(|a| OsString::from_vec(a.0.clone())))
            .collect();
        let outcome = self.execute(&argv, stdio);
        let finished = util::now_ms();
        let (exit_code, signal) = match &outcome {
            Ok(status) => *status,
            Err(_) => (None, None),
        };
        let receipt = Receipt {
            id: uuid::Uuid::new_v4().to_string(),
            kind: "kit".into(),
            kit: Some(self.name.clone()),
            command: argv
                .iter()
                .map(|a| util::shell_quote(&a.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(" "),
            exit_code,
            signal,
            started_at_ms: started,
            finished_at_ms: finished,
            duration_ms: finished.saturating_sub(started),
            workspace: self.daemon.cfg.workspace.to_string_lossy().into_owned(),
        };
        let written = receipt.write(&self.daemon.cfg.home.results_dir());
        self.daemon.kit_job_end(self.key());
        let reply = match (outcome, written) {
            (Err(message), _) => ToAgent::KitFailed {
                req: self.req,
                code: 126,
                message,
            },
            (Ok(_), Err(e)) => ToAgent::KitFailed {
                req: self.req,
                code: 1,
                message: format!("the kit finished but its receipt could not be written: {e}"),
            },
            (Ok((exit_code, signal)), Ok(())) => ToAgent::KitDone {
                req: self.req,
                exit_code,
                signal,
            },
        };
        self.shell.send(&reply);
    }

    /// Runs the container to completion: `(exit_code, signal)`, or why it never ran.
    fn execute(
        &self,
        argv: &[OsString],
        stdio: [OwnedFd; 3],
    ) -> Result<(Option<i32>, Option<i32>), String> {
        let cfg = &self.daemon.cfg;
        let env = sandbox::kit_env(&self.env, &self.shell.kit_dir);
        // The seccomp descriptor (bwrap only) must outlive the spawn.
        let (mut cmd, _seccomp) = match &cfg.isolation {
            Isolation::Bwrap(bwrap) => {
                let home = sandbox::env_home(&env);
                let layout = Layout {
                    role: Role::Kit,
                    workspace: &cfg.workspace,
                    job_home: home.as_deref(),
                    hostname: "marsh-kit",
                    ro_files: Vec::new(),
                };
                let (cmd, seccomp) =
                    sandbox::bwrap_command(bwrap, &cfg.confinement, &layout, &env, argv)
                        .map_err(|e| e.to_string())?;
                (cmd, Some(seccomp))
            }
            Isolation::Unconfined => {
                let (program, rest) = argv.split_first().ok_or("empty kit command")?;
                let mut cmd = Command::new(program);
                cmd.args(rest)
                    .env_clear()
                    .envs(env)
                    .current_dir(&cfg.workspace);
                sandbox::prepare_unconfined(&mut cmd, &cfg.confinement);
                (cmd, None)
            }
        };
        let [stdin, stdout, stderr] = stdio;
        cmd.process_group(0)
            .stdin(Stdio::from(stdin))
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        let spawned = cmd.spawn();
        // Close our copies of the caller's stdio so only the container holds them.
        drop(cmd);
        let mut child = spawned.map_err(|e| format!("starting kit {}: {e}", self.name))?;
        let pid = util::child_pid(&child);
        if !self.daemon.kit_job_started(self.key(), pid) {
            util::kill_container(pid);
        }
        util::wait_exit_unreaped(pid);
        // The leader is an unreaped zombie: its group id is still ours to signal.
        self.daemon.kit_job_exited(self.key());
        util::kill_group(pid);
        match child.wait() {
            Ok(status) => Ok((status.code(), status.signal())),
            Err(e) => {
                log!("marshd: waiting for kit {}: {e}", self.name);
                Ok((None, None))
            }
        }
    }
}
