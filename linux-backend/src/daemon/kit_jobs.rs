//! Kit jobs: each invocation of a registered kit (a kit wrapper in the project shell,
//! or a host `marsh kit run`) runs the kit's command plus the caller's arguments in a
//! fresh sandbox (the "fresh job container") with the caller's stdio, on the kit's
//! worker, and leaves a receipt. A host run is keyed under shell id
//! [`super::HOST_KITS`], so a shell's exit never cancels it.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::{Arc, mpsc};

use super::{Daemon, Shell};
use crate::admission::{self, Admitter};
use crate::kits::{self, Kit};
use crate::proto::{Bytes, EnvVar, KitFailure, ToAgent};
use crate::receipt::Receipt;
use crate::sandbox::{self, Isolation, JobHome, Layout, Role, SANDBOX_GUARD_EXEC};
use crate::seqpacket::SeqPacket;
use crate::util::{self, log};

/// How a kit job ended: its receipt (once durable) and its status, or why it has none
/// (the exit code to report and a message).
#[derive(Debug)]
pub(super) struct KitEnd {
    pub receipt_id: Option<String>,
    pub status: Result<(Option<i32>, Option<i32>), KitFailure>,
}

/// Where a kit job's end is delivered.
pub(super) enum Sink {
    /// A kit wrapper in the project shell, through its agent.
    Agent { shell: Arc<Shell>, req: u64 },
    /// A host `marsh kit run`, through its connection thread.
    Client(mpsc::Sender<KitEnd>),
}

impl Sink {
    fn deliver(self, end: KitEnd) {
        match self {
            Sink::Agent { shell, req } => shell.send(&match end.status {
                Ok((exit_code, signal)) => ToAgent::KitDone {
                    req,
                    exit_code,
                    signal,
                },
                Err(KitFailure { code, message }) => ToAgent::KitFailed { req, code, message },
            }),
            Sink::Client(tx) => {
                let _ = tx.send(end);
            }
        }
    }
}

/// One kit job to run: which kit, with what, for whom.
pub(super) struct Launch {
    pub key: (u64, u64),
    pub name: String,
    pub kit: Kit,
    pub args: Vec<Bytes>,
    /// The kit's complete environment.
    pub env: Vec<(OsString, OsString)>,
    pub stdio: [OwnedFd; 3],
    pub sink: Sink,
}

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
    let mut strip = shell.path_dirs().to_vec();
    strip.extend(
        daemon
            .cfg
            .exposed
            .path
            .iter()
            .map(std::path::PathBuf::as_path),
    );
    let launch = Launch {
        key: (shell.id, req),
        name: kit_name,
        kit,
        args,
        // Neither the shell's directories nor exposed ones exist in a kit container.
        env: sandbox::kit_env(&env, &strip),
        stdio,
        sink: Sink::Agent {
            shell: Arc::clone(shell),
            req,
        },
    };
    if let Err((code, message)) = launch_job(daemon, launch) {
        fail(code, message);
    }
}

/// Registers the job (its worker becomes warm) and runs it on its own thread; the end
/// goes to the launch's sink. On `Err` nothing ran and the sink was not used.
pub(super) fn launch_job(daemon: &Arc<Daemon>, launch: Launch) -> Result<(), (i32, String)> {
    let key = launch.key;
    daemon
        .kit_job_begin(key, &launch.name)
        .map_err(|e| (1, e.to_string()))?;
    let Launch {
        name,
        kit,
        args,
        env,
        stdio,
        sink,
        ..
    } = launch;
    let job = KitJob {
        daemon: Arc::clone(daemon),
        key,
        name,
        kit,
        args,
        env,
    };
    let spawned = std::thread::Builder::new()
        .name(format!("kit-{}", job.name))
        .spawn(move || {
            let end = job.run(stdio);
            sink.deliver(end);
        });
    if let Err(e) = spawned {
        daemon.kit_job_end(key);
        return Err((1, format!("starting the kit thread: {e}")));
    }
    Ok(())
}

struct KitJob {
    daemon: Arc<Daemon>,
    key: (u64, u64),
    name: String,
    kit: Kit,
    args: Vec<Bytes>,
    env: Vec<(OsString, OsString)>,
}

impl KitJob {
    fn run(self, stdio: [OwnedFd; 3]) -> KitEnd {
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
        let written = self.daemon.write_receipt(&receipt);
        self.daemon.kit_job_end(self.key);
        match (outcome, written) {
            (Err(message), Ok(())) => KitEnd {
                receipt_id: Some(receipt.id),
                status: Err(KitFailure { code: 126, message }),
            },
            (Err(message), Err(_)) => KitEnd {
                receipt_id: None,
                status: Err(KitFailure { code: 126, message }),
            },
            (Ok(_), Err(e)) => KitEnd {
                receipt_id: None,
                status: Err(KitFailure {
                    code: 1,
                    message: format!("the kit finished but its receipt could not be written: {e}"),
                }),
            },
            (Ok(status), Ok(())) => KitEnd {
                receipt_id: Some(receipt.id),
                status: Ok(status),
            },
        }
    }

    /// Runs the container to completion: `(exit_code, signal)`, or why it never ran.
    fn execute(
        &self,
        argv: &[OsString],
        stdio: [OwnedFd; 3],
    ) -> Result<(Option<i32>, Option<i32>), String> {
        let cfg = &self.daemon.cfg;
        let env = &self.env;
        // The seccomp descriptor (bwrap only) must outlive the spawn, as must the kit's
        // end of the guard socket.
        let mut guard_link = None;
        let (mut cmd, _seccomp) = match &cfg.isolation {
            Isolation::Bwrap(bwrap) => {
                let home = sandbox::env_home(env);
                let mut layout = Layout {
                    role: Role::Kit,
                    workspace: &cfg.workspace,
                    job_home: home.as_deref().map(|at| JobHome { at, backing: None }),
                    exposed: None,
                    hostname: "marsh-kit",
                    ro_files: Vec::new(),
                    pass_fds: Vec::new(),
                };
                // With the set-id guard, the kit's first program is `guard-exec`: it has
                // this container's workspace mounts marked, then becomes the kit.
                let guarded_argv;
                let argv = match &cfg.setid_guard {
                    Ok(guard) => {
                        let (ours, theirs) = SeqPacket::pair().map_err(|e| e.to_string())?;
                        let fd = theirs.as_fd().as_raw_fd();
                        layout
                            .ro_files
                            .push((cfg.self_fd.as_raw_fd(), SANDBOX_GUARD_EXEC));
                        layout.pass_fds.push(fd);
                        guarded_argv = guard_exec_argv(fd, argv);
                        let admitter = Admitter {
                            guard: Some(Arc::clone(guard)),
                        };
                        guard_link = Some((admitter, ours, theirs));
                        &guarded_argv[..]
                    }
                    Err(_) => argv,
                };
                let (cmd, seccomp) =
                    sandbox::bwrap_command(bwrap, &cfg.confinement, &layout, env, argv)
                        .map_err(|e| e.to_string())?;
                (cmd, Some(seccomp))
            }
            Isolation::Unconfined => {
                let (program, rest) = argv.split_first().ok_or("empty kit command")?;
                let mut cmd = Command::new(program);
                cmd.args(rest)
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)))
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
        if let Some((admitter, ours, theirs)) = guard_link {
            // Only the container holds its end now (the wrapper, and bubblewrap's outer
            // process, which keeps its copy: a wrapper that dies before asking costs
            // the full timeout here, never an unguarded kit). The wrapper runs nothing
            // before the answer.
            drop(theirs);
            let served = ours
                .set_recv_timeout(Some(admission::REQUEST_TIMEOUT))
                .and_then(|()| admitter.serve_one(&ours));
            if let Err(e) = served {
                log!("kit {}: set-id guard: {e}", self.name);
            }
        }
        let pid = util::child_pid(&child);
        if !self.daemon.kit_job_started(self.key, pid) {
            util::kill_container(pid);
        }
        util::wait_exit_unreaped(pid);
        // The leader is an unreaped zombie: its group id is still ours to signal.
        self.daemon.kit_job_exited(self.key);
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

/// The kit's command behind `marshd guard-exec`, which asks on `fd` first.
fn guard_exec_argv(fd: RawFd, argv: &[OsString]) -> Vec<OsString> {
    let mut out: Vec<OsString> = vec![
        SANDBOX_GUARD_EXEC.into(),
        "guard-exec".into(),
        "--fd".into(),
        fd.to_string().into(),
        "--".into(),
    ];
    out.extend(argv.iter().cloned());
    out
}
