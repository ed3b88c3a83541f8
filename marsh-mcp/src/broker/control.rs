//! `broker-start`, `broker-stop`, `connect` and the resident `broker-run` itself.

use std::ffi::OsString;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, StatusCode};
use marsh_connect_proxy::{BrokerClient, ClientError, RelayEnd, relay};
use marsh_framing::{client_stdin, client_stdout};
use marsh_scope_registry::RegistryError;

use super::fingerprint::BrokerIdentity;
use super::http::Broker;
use super::runtime_dir::RuntimeDir;
use super::token::{TokenError, create_or_read_token, read_token};
use crate::cli::{DEFAULT_IDLE_EXIT_SECS, ServeArgs};
use crate::startup::{StartupError, Validated, Workspace, default_broker_root, validate};

/// How long `broker-start` waits for a spawned broker to answer, and `broker-stop`
/// (or a replacement) for an old one to go away.
const START_BOUND: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(50);
/// How often an idle-exiting broker looks at its sessions and operations.
const IDLE_POLL: Duration = Duration::from_millis(250);
/// How many times `connect --start` tries a session with a broker that may go away
/// (idle exit) between its probe and the session request, and, counted apart, how
/// many starts it makes of a broker that exits as it starts.
const START_ATTEMPTS: usize = 3;
/// How long `connect --start` waits before starting again a broker that exited as it
/// started (the lease of the broker it replaces not yet released).
const RESTART_PAUSE: Duration = Duration::from_millis(300);

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error("the broker runtime directory failed verification: {source}{}", advice.as_deref().map(|a| format!("; {a}")).unwrap_or_default())]
    RuntimeDir {
        #[source]
        source: RegistryError,
        /// How to move off a squatted shared path, when that is where it was.
        advice: Option<String>,
    },
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("broker modes use a managed scope root; --home is for `serve` only")]
    HomeNotAllowed,
    #[error(
        "a broker of another build or configuration (pid {pid}) has {sessions} session(s) attached; stop the loaded sandboxes (their proxies) and run broker-start again"
    )]
    BusyIncompatible { pid: u64, sessions: u64 },
    #[error("broker-stop refused: {0}")]
    StopRefused(String),
    #[error("no broker is running for this workspace and root (start one with broker-start)")]
    NotRunning,
    #[error("cannot start the broker: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the broker did not come up within {bound:?}; its log ({log}) ends with: {tail}")]
    NotAnswering {
        bound: Duration,
        log: String,
        tail: String,
    },
    /// The started broker exited before it answered: a start-time failure, most often
    /// the root's lease still held by a broker that is itself exiting.
    #[error("the broker exited as it started ({status}); its log ({log}) ends with: {tail}")]
    ExitedAtStart {
        status: String,
        log: String,
        tail: String,
    },
    #[error("the old broker (pid {pid}) did not exit within {bound:?}")]
    StuckOld { pid: u64, bound: Duration },
    #[error("cannot bind the broker socket {path}: {source}")]
    Bind {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot determine the broker identity: {0}")]
    Identity(#[source] std::io::Error),
    #[error("connect: {0}")]
    Lost(String),
    #[error("cannot take the broker start lock {path}: {source}")]
    StartLock {
        path: String,
        source: std::io::Error,
    },
}

/// `path` made absolute against this process's cwd (nothing resolved or created).
fn absolute(path: &mut Option<PathBuf>, cwd: &Path) {
    if let Some(p) = path.as_mut()
        && p.is_relative()
    {
        *p = cwd.join(&*p);
    }
}

/// The arguments broker modes use: every path absolute against this process's cwd
/// (the spawned broker runs in the workspace, so a relative `--marsh ./bin/marsh` or
/// `--scope-root r` would otherwise name something else there), the workspace
/// canonical, and the root `--scope-root`, else the generated SBX root.
fn with_root(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<(ServeArgs, Workspace), ControlError> {
    if args.home.is_some() {
        return Err(ControlError::HomeNotAllowed);
    }
    let workspace = Workspace::resolve(args.workspace.as_deref())?;
    let mut args = args.clone();
    let cwd = std::env::current_dir().map_err(StartupError::CurrentDir)?;
    for path in [&mut args.scope_root, &mut args.marsh, &mut args.sbx] {
        absolute(path, &cwd);
    }
    if args.scope_root.is_none() {
        args.scope_root = Some(default_broker_root(env, &workspace)?);
    }
    args.workspace = Some(workspace.path.clone());
    Ok((args, workspace))
}

fn env_lookup(env: &[(OsString, OsString)]) -> impl Fn(&str) -> Option<PathBuf> + '_ {
    move |name| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| PathBuf::from(v))
    }
}

fn runtime_dir(root: &Path, env: &[(OsString, OsString)]) -> RuntimeDir {
    RuntimeDir::preferred(root, env_lookup(env))
}

/// The runtime directory a client should use: the first candidate for this environment
/// that holds a token, else the preferred one (a client launched by a gateway may not
/// share the starter's `XDG_RUNTIME_DIR` or `HOME`).
fn client_runtime_dir(root: &Path, env: &[(OsString, OsString)]) -> RuntimeDir {
    let mut candidates = RuntimeDir::candidates(root, env_lookup(env));
    match candidates.iter().position(|d| d.token().exists()) {
        Some(found) => candidates.swap_remove(found),
        None => candidates.swap_remove(0),
    }
}

/// The pid of a live resident broker serving `root` (from its runtime directory's
/// `broker.pid`), for messages that name who holds the root's lease.
pub(crate) fn broker_pid_of_root(root: &Path, env: &[(OsString, OsString)]) -> Option<u64> {
    let dir = client_runtime_dir(root, env);
    dir.verify().ok()?;
    let pid: i32 = std::fs::read_to_string(dir.pid())
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (pid > 1 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok())
        .then_some(pid as u64)
}

fn canonical_root(args: &ServeArgs) -> PathBuf {
    // The root may not exist yet; validation resolves it the same way, so a broker and
    // its clients always agree on the runtime directory.
    let root = args.scope_root.clone().unwrap_or_default();
    std::fs::canonicalize(&root).unwrap_or(root)
}

fn identity_of(validated: &Validated, root: &Path) -> Result<BrokerIdentity, ControlError> {
    BrokerIdentity::for_config(
        &validated.workspace.path,
        root,
        validated.driver(),
        validated.allow_full_sbx_control(),
    )
    .map_err(ControlError::Identity)
}

/// How long `POST /v1/stop` may take: the broker first waits up to 15 s for sessions
/// whose proxies have gone to finish their cleanup.
const STOP_ANSWER_LIMIT: Duration = Duration::from_secs(25);

/// `POST /v1/stop`, with the broker's refusal (sessions attached) as the error.
async fn stop_running(client: &BrokerClient) -> Result<(), ControlError> {
    let (status, body) = client
        .call_within(
            Method::POST,
            marsh_connect_proxy::STOP_PATH,
            STOP_ANSWER_LIMIT,
        )
        .await?;
    if status == StatusCode::OK {
        return Ok(());
    }
    let message = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(|m| m.as_str())
                .map(str::to_owned)
        })
        .unwrap_or(body);
    Err(ControlError::StopRefused(message))
}

/// A broker configuration, validated: what `broker-start` compares and `broker-run`
/// serves.
struct Configured {
    args: ServeArgs,
    validated: Validated,
    identity: BrokerIdentity,
    dir: RuntimeDir,
}

fn configured(args: &ServeArgs, env: &[(OsString, OsString)]) -> Result<Configured, ControlError> {
    let (mut args, _) = with_root(args, env)?;
    let validated = validate(&args, env)?;
    // What was pinned, not the defaults it came from: a spawned broker then depends
    // on neither its environment ($MARSH_SBX, PATH) nor its cwd.
    for pin in validated.driver().pins() {
        match pin.role() {
            "marsh" => args.marsh = Some(pin.path().to_path_buf()),
            "sbx" => args.sbx = Some(pin.path().to_path_buf()),
            _ => {}
        }
    }
    let root = validated
        .root()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| canonical_root(&args));
    let identity = identity_of(&validated, &root)?;
    let dir = runtime_dir(&root, env);
    Ok(Configured {
        args,
        validated,
        identity,
        dir,
    })
}

fn pid_of(probe: &serde_json::Value) -> u64 {
    probe["pid"].as_u64().unwrap_or(0)
}

async fn wait_gone(client: &BrokerClient, pid: u64) -> Result<(), ControlError> {
    let deadline = tokio::time::Instant::now() + START_BOUND;
    while tokio::time::Instant::now() < deadline {
        let alive =
            pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
        if !alive && client.probe().await.is_err() {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    Err(ControlError::StuckOld {
        pid,
        bound: START_BOUND,
    })
}

/// Takes the runtime directory's start lock (blocking, off the reactor); released when
/// the returned file is dropped. The file is close-on-exec, so a spawned broker never
/// holds it.
async fn start_lock(dir: &RuntimeDir) -> Result<std::fs::File, ControlError> {
    let path = dir.start_lock();
    let failed = |source| ControlError::StartLock {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(failed)?;
    tokio::task::spawn_blocking(move || file.lock().map(|()| file))
        .await
        .map_err(|e| failed(std::io::Error::other(e)))?
        .map_err(failed)
}

/// `broker-start`: validate, prepare the runtime directory and token, then reuse a
/// compatible broker, replace an idle incompatible one, refuse a busy one, or spawn.
pub async fn broker_start(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<String, ControlError> {
    let Configured {
        args,
        validated,
        identity: wanted,
        dir,
    } = configured(args, env)?;
    dir.prepare().map_err(|source| ControlError::RuntimeDir {
        source,
        advice: dir.squat_advice(),
    })?;
    let _starting = start_lock(&dir).await?;
    let token = create_or_read_token(&dir.token())?;
    let client = BrokerClient::new(&dir.socket(), token);
    if let Ok(probe) = client.probe().await {
        let running = BrokerIdentity {
            build: probe["build"].as_str().unwrap_or_default().to_owned(),
            fingerprint: probe["fingerprint"].as_str().unwrap_or_default().to_owned(),
        };
        let pid = pid_of(&probe);
        if running == wanted {
            return Ok(format!("broker already running (pid {pid})"));
        }
        let sessions = probe["sessions"].as_u64().unwrap_or(0);
        if sessions > 0 {
            return Err(ControlError::BusyIncompatible { pid, sessions });
        }
        stop_running(&client).await?;
        wait_gone(&client, pid).await?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(dir.log())
        .map_err(ControlError::Spawn)?;
    let exe = std::env::current_exe().map_err(ControlError::Spawn)?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.arg("broker-run")
        .args(args.to_argv())
        .current_dir(&validated.workspace.path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    let mut child = cmd.spawn().map_err(ControlError::Spawn)?;
    let deadline = tokio::time::Instant::now() + START_BOUND;
    let mut exited = None;
    while tokio::time::Instant::now() < deadline {
        if let Ok(probe) = client.probe().await
            && probe["build"].as_str() == Some(wanted.build.as_str())
            && probe["fingerprint"].as_str() == Some(wanted.fingerprint.as_str())
        {
            return Ok(format!("broker started (pid {})", pid_of(&probe)));
        }
        if let Ok(Some(status)) = child.try_wait() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    let text = std::fs::read_to_string(dir.log()).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    let log = dir.log().display().to_string();
    let tail = tail.into_iter().rev().collect::<Vec<_>>().join(" | ");
    Err(match exited {
        Some(status) => ControlError::ExitedAtStart {
            status: status.to_string(),
            log,
            tail,
        },
        None => ControlError::NotAnswering {
            bound: START_BOUND,
            log,
            tail,
        },
    })
}

/// `broker-stop`: refused while a session is attached; waits (bounded) for the exit.
pub async fn broker_stop(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<String, ControlError> {
    let (args, _) = with_root(args, env)?;
    let dir = client_runtime_dir(&canonical_root(&args), env);
    const NONE: &str = "no broker is running for this workspace and root; nothing to stop";
    let token = match read_token(&dir.token()) {
        Ok(token) => token,
        Err(TokenError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(NONE.into());
        }
        Err(e) => return Err(e.into()),
    };
    let client = BrokerClient::new(&dir.socket(), token);
    let probe = match client.probe().await {
        Ok(probe) => probe,
        Err(ClientError::Unreachable { .. }) => return Ok(NONE.into()),
        Err(e) => return Err(e.into()),
    };
    stop_running(&client).await?;
    let pid = pid_of(&probe);
    wait_gone(&client, pid).await?;
    Ok(format!("broker stopped (pid {pid})"))
}

type Session = hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>;

/// One session on the running broker of `args`' root. Never creates the token.
async fn open_session(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<Session, ControlError> {
    let (args, _) = with_root(args, env)?;
    let dir = client_runtime_dir(&canonical_root(&args), env);
    dir.verify().map_err(|_| ControlError::NotRunning)?;
    let token = read_token(&dir.token())?;
    Ok(BrokerClient::new(&dir.socket(), token)
        .open_session()
        .await?)
}

/// `connect`: one stdio client to one broker session. Never creates the token.
pub async fn connect(args: &ServeArgs, env: &[(OsString, OsString)]) -> Result<(), ControlError> {
    relay_session(open_session(args, env).await?).await
}

/// `connect --start`: [`broker_start`] (reuse a compatible broker or start one, which
/// exits after `--idle-exit-secs`, default [`DEFAULT_IDLE_EXIT_SECS`], when idle), then
/// [`connect`]. A broker that idles out between the two, or that exits as it starts
/// (the lease of the one it replaces not yet released), is started again.
pub async fn connect_start(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<(), ControlError> {
    let mut args = args.clone();
    args.idle_exit_secs.get_or_insert(DEFAULT_IDLE_EXIT_SECS);
    // Counted apart: an idle race can meet both in one connect (503 `stopping`, then a
    // replacement that finds the lease still held).
    let mut attempt = 0;
    let mut exited_at_start = 0;
    let session = loop {
        let started = match broker_start(&args, env).await {
            Ok(started) => started,
            // The broker it replaces (one that idled out, or was stopped as
            // incompatible) can still hold the root's lease for a moment after its
            // socket is gone; the new one then exits at once. Give the old one time to
            // finish exiting and start again. A start that fails for any other reason
            // fails the same way each time and costs at most two pauses more.
            Err(ControlError::ExitedAtStart { status, .. })
                if exited_at_start + 1 < START_ATTEMPTS =>
            {
                exited_at_start += 1;
                tracing::info!(
                    "the started broker exited at once ({status}); starting again in {RESTART_PAUSE:?}"
                );
                tokio::time::sleep(RESTART_PAUSE).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        tracing::info!("{started}");
        attempt += 1;
        match open_session(&args, env).await {
            Ok(session) => break session,
            Err(ControlError::Client(
                ClientError::Unreachable { .. }
                | ClientError::Handshake(_)
                | ClientError::Refused { status: 503, .. },
            )) if attempt < START_ATTEMPTS => {
                tracing::info!("the broker went away before the session opened; starting again");
            }
            Err(e) => return Err(e),
        }
    };
    relay_session(session).await
}

async fn relay_session(session: Session) -> Result<(), ControlError> {
    match relay(client_stdin(), client_stdout(), session).await {
        RelayEnd::Clean | RelayEnd::ClientGone => Ok(()),
        RelayEnd::Lost(why) => Err(ControlError::Lost(why)),
    }
}

/// Stops `broker` once it has had no session attached and no operation running for
/// `period` without a break.
async fn exit_when_idle(broker: Arc<Broker>, period: Duration) {
    let mut idle_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(IDLE_POLL).await;
        let (running, _) = broker.ctx.ops.counts();
        if broker.sessions() > 0 || running > 0 {
            idle_since = tokio::time::Instant::now();
        } else if idle_since.elapsed() >= period {
            // Checked again under the broker's session gate, so a session request
            // racing this decision is either counted first (and keeps the broker) or
            // refused as `stopping` (and its `connect --start` starts a new one).
            if broker.stop_if_idle(|| broker.ctx.ops.counts().0 == 0) {
                tracing::info!(?period, "no session and no running operation; exiting");
                return;
            }
            idle_since = tokio::time::Instant::now();
        }
    }
}

/// `broker-run`: the resident broker. Takes the lease, binds the socket, serves until
/// stopped (HTTP stop, SIGTERM or SIGINT, or `--idle-exit-secs` of idleness), then
/// removes its socket and pid file.
pub async fn broker_run(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<(), ControlError> {
    // Leave the starter's session so its terminal and signals are not ours.
    let _ = nix::unistd::setsid();
    let Configured {
        args,
        validated,
        identity,
        dir,
    } = configured(args, env)?;
    dir.verify().map_err(|source| ControlError::RuntimeDir {
        source,
        advice: dir.squat_advice(),
    })?;
    let token = read_token(&dir.token())?;
    let ctx = Arc::new(validated.open()?);
    // The lease is ours, so any socket left here belongs to a dead broker.
    let socket = dir.socket();
    let _ = std::fs::remove_file(&socket);
    let listener =
        tokio::net::UnixListener::bind(&socket).map_err(|source| ControlError::Bind {
            path: socket.display().to_string(),
            source,
        })?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600)).map_err(
        |source| ControlError::Bind {
            path: socket.display().to_string(),
            source,
        },
    )?;
    std::fs::write(dir.pid(), format!("{}\n", std::process::id())).map_err(ControlError::Spawn)?;
    let broker = Broker::new(ctx, token, identity);
    let signals = Arc::clone(&broker);
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        if let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            signals.request_stop();
        }
    });
    if let Some(secs) = args.idle_exit_secs.filter(|s| *s > 0) {
        tokio::spawn(exit_when_idle(
            Arc::clone(&broker),
            Duration::from_secs(secs),
        ));
    }
    tracing::info!(pid = std::process::id(), "broker serving");
    broker.serve(listener).await;
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(dir.pid());
    Ok(())
}
