//! Many sessions per workspace: `connect --start` proxies share one auto-started
//! broker that exits when idle, and Codex registrations launch it (upgrading the
//! previous release's `serve` entry).

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server, host_processes_with, npm_bin};
use serde_json::{Value, json};

use super::install_clients::{app_request, client, clients, codex_app_thread, marsh_mcp};

/// `connect --start` with the sandbox's broker arguments plus `extra`.
fn connect_start_args(sb: &Sandbox, extra: &[&str]) -> Vec<String> {
    let mut args = sb.broker_args("connect", extra);
    args.insert(1, "--start".into());
    args
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

/// The pids of `broker-run` processes whose command line names `marker`.
pub(crate) fn broker_pids(marker: &Path) -> Vec<i32> {
    host_processes_with(&marker.display().to_string())
        .iter()
        .filter(|line| line.contains(" broker-run "))
        .filter_map(|line| line.split(':').next()?.parse().ok())
        .collect()
}

/// On drop, SIGKILLs every broker whose command line names `marker` (brokers started
/// by a client's `connect --start`) and removes their runtime directories when those
/// fell back to `/tmp` (a client may not pass `XDG_RUNTIME_DIR` on).
pub(crate) struct BrokersUnder(pub std::path::PathBuf);

impl Drop for BrokersUnder {
    fn drop(&mut self) {
        for pid in broker_pids(&self.0) {
            let log = fs::read_link(format!("/proc/{pid}/fd/2")).ok();
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            if let Some(dir) = log.as_deref().and_then(Path::parent)
                && dir.starts_with("/tmp")
                && dir
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("marsh-mcp-"))
            {
                let _ = fs::remove_dir_all(dir);
            }
        }
    }
}

fn spawn_connect_start(sb: &Sandbox, extra: &[&str]) -> Server {
    Server::spawn(sb.marsh_mcp(&connect_start_args(sb, extra), &[]))
}

fn initialized(s: &mut Server) {
    let init = s.initialize();
    assert!(
        init.get("result").is_some(),
        "initialize failed: {init}; stderr: {}",
        s.stderr()
    );
}

#[test]
fn two_connect_start_sessions_share_one_broker_but_not_operations() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.root());
    // Both proxies start at once: they race to start the broker.
    let mut a = spawn_connect_start(&sb, &[]);
    let mut b = spawn_connect_start(&sb, &[]);
    initialized(&mut a);
    initialized(&mut b);
    for s in [&mut a, &mut b] {
        assert!(s.tool_names().contains(&"shell_run".to_string()));
    }
    let ran = a.ok("shell_run", json!({"command": "echo from-a"}));
    assert_eq!(ran["stdout_text"], "from-a\n", "{ran}");
    let ran = b.ok("shell_run", json!({"command": "echo from-b"}));
    assert_eq!(ran["stdout_text"], "from-b\n", "{ran}");

    let theirs = a.ok("shell_run", json!({"command": "sleep 30", "wait_ms": 0}))["operation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let mine = b.ok("shell_run", json!({"command": "sleep 30", "wait_ms": 0}))["operation_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        b.err_kind("operation_get", json!({"operation_id": theirs})),
        "not_owner"
    );
    assert_eq!(
        a.err_kind("operation_get", json!({"operation_id": mine})),
        "not_owner"
    );
    assert_eq!(
        a.ok("operation_get", json!({"operation_id": theirs}))["state"],
        "running"
    );
    b.ok("operation_cancel", json!({"operation_id": mine}));
    a.ok("operation_cancel", json!({"operation_id": theirs}));

    let brokers = broker_pids(&sb.root());
    assert_eq!(brokers.len(), 1, "one broker serves both: {brokers:?}");
    assert_eq!(brokers[0], sb.broker_pid());
    assert!(a.close().success());
    assert!(b.close().success());
}

#[test]
fn a_started_broker_exits_after_its_idle_period_and_a_plain_one_does_not() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.root());
    let mut a = spawn_connect_start(&sb, &["--idle-exit-secs", "2"]);
    let mut b = spawn_connect_start(&sb, &["--idle-exit-secs", "2"]);
    initialized(&mut a);
    initialized(&mut b);
    let pid = sb.broker_pid();
    // Attached sessions keep it, however long they stay quiet.
    a.ok("shell_run", json!({"command": "true"}));
    std::thread::sleep(Duration::from_secs(3));
    assert!(alive(pid), "sessions are attached: the broker stays");
    assert!(a.close().success());
    assert!(b.close().success());
    let closed = Instant::now();
    while alive(pid) && closed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(pid), "the broker outlived its idle period");
    let took = closed.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took <= Duration::from_secs(5),
        "exited {took:?} after the last session closed"
    );
    let dir = sb.broker_dir().unwrap();
    assert!(!dir.join("broker.sock").exists() && !dir.join("broker.pid").exists());

    // A later `connect --start` starts a fresh broker.
    let mut c = spawn_connect_start(&sb, &["--idle-exit-secs", "2"]);
    initialized(&mut c);
    let fresh = sb.broker_pid();
    assert_ne!(fresh, pid);
    assert!(c.close().success());
    let closed = Instant::now();
    while alive(fresh) && closed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(fresh));

    // Plain broker-start keeps today's behaviour: no idle exit.
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let plain = sb.broker_pid();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        alive(plain),
        "a broker-start broker never idles out by itself"
    );

    // The flag belongs to broker modes only.
    let mut serve = sb.serve_root_args(&["--idle-exit-secs", "5"]);
    serve[4] = sb.state().join("other-root").display().to_string();
    let (code, stderr) = sb.startup(&serve, &[]);
    assert_ne!(code, Some(0));
    assert!(
        stderr.contains("--idle-exit-secs is accepted only by"),
        "{stderr}"
    );
}

/// The first string under `key` anywhere in `v`, also inside JSON-encoded strings.
fn find_str(v: &Value, key: &str) -> Option<String> {
    match v {
        Value::Object(o) => o
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| o.values().find_map(|x| find_str(x, key))),
        Value::Array(a) => a.iter().find_map(|x| find_str(x, key)),
        Value::String(s) => serde_json::from_str::<Value>(s)
            .ok()
            .filter(|x| x.is_object())
            .and_then(|x| find_str(&x, key)),
        _ => None,
    }
}

#[test]
fn two_codex_sessions_share_the_workspace_and_install_upgrades_the_old_serve_entry() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.state());
    let c = clients(&sb);
    let name =
        marsh_scope_registry::server_name(&marsh_scope_registry::workspace_hash(&sb.workspace()));
    let get = |sb: &Sandbox| -> Value {
        let out = client(sb, &c, "codex", &["mcp", "get", &name, "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    };
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "codex"]);
    assert_eq!(code, Some(0), "{stderr}");
    let installed = get(&sb);
    let args: Vec<String> = serde_json::from_value(installed["transport"]["args"].clone()).unwrap();
    assert_eq!(args[..2], ["connect", "--start"], "{installed}");

    let app = || {
        let mut cmd = Command::new(npm_bin("codex"));
        cmd.env_clear()
            .env("PATH", &c.path)
            .env("HOME", sb.state().join("user"))
            .env("CODEX_HOME", &c.codex_home)
            .current_dir(sb.workspace());
        codex_app_thread(cmd, &sb.workspace())
    };
    let mut apps = [app(), app()];
    let mut ids = Vec::new();
    for (i, (app, thread)) in apps.iter_mut().enumerate() {
        let status = app_request(
            app,
            "mcpServerStatus/list",
            json!({"threadId": thread, "serverName": name}),
        );
        let entry = status["result"]["data"]
            .as_array()
            .and_then(|d| d.iter().find(|s| s["name"] == name.as_str()).cloned())
            .unwrap_or_else(|| panic!("session {i}: {status}"));
        assert!(
            entry.get("toolsError").is_none_or(Value::is_null),
            "session {i}: {entry}"
        );
        assert!(
            entry["tools"]
                .as_object()
                .is_some_and(|t| t.contains_key("shell_run")),
            "session {i}: {entry}"
        );
        let marker = format!("from-codex-{i}");
        let call = app_request(
            app,
            "mcpServer/tool/call",
            json!({"threadId": thread, "server": name, "tool": "shell_run",
                   "arguments": {"command": format!("echo {marker}")}}),
        );
        assert!(call.to_string().contains(&marker), "session {i}: {call}");
        let long = app_request(
            app,
            "mcpServer/tool/call",
            json!({"threadId": thread, "server": name, "tool": "shell_run",
                   "arguments": {"command": "sleep 30", "wait_ms": 0}}),
        );
        ids.push(find_str(&long, "operation_id").unwrap_or_else(|| panic!("session {i}: {long}")));
    }
    // Each session sees only its own operations.
    for (i, (app, thread)) in apps.iter_mut().enumerate() {
        let other = &ids[1 - i];
        let got = app_request(
            app,
            "mcpServer/tool/call",
            json!({"threadId": thread, "server": name, "tool": "operation_get",
                   "arguments": {"operation_id": other}}),
        );
        assert!(got.to_string().contains("not_owner"), "session {i}: {got}");
        let own = app_request(
            app,
            "mcpServer/tool/call",
            json!({"threadId": thread, "server": name, "tool": "operation_cancel",
                   "arguments": {"operation_id": ids[i]}}),
        );
        assert!(!own.to_string().contains("not_owner"), "session {i}: {own}");
    }
    assert_eq!(
        broker_pids(&sb.state()).len(),
        1,
        "one broker serves both Codex sessions"
    );
    drop(apps);

    // The previous release's `serve` entry is upgraded in place.
    let at = |flag: &str| args[args.iter().position(|a| a == flag).unwrap() + 1].clone();
    let command = installed["transport"]["command"]
        .as_str()
        .unwrap()
        .to_string();
    let old = |program: &str| {
        let mut add = vec![
            "mcp".to_string(),
            "add".into(),
            name.clone(),
            "--".into(),
            program.into(),
            "serve".into(),
        ];
        for flag in ["--workspace", "--scope-root", "--marsh", "--sbx"] {
            add.push(flag.into());
            add.push(at(flag));
        }
        add
    };
    let codex = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = client(&sb, &c, "codex", &args);
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    let remove = ["mcp", "remove", &name].map(String::from);
    codex(&remove);
    codex(&old(&command));
    assert_eq!(get(&sb)["transport"]["args"][0], "serve");
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "codex"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("replaced our earlier entry"), "{stderr}");
    assert_eq!(get(&sb), installed);

    // A foreign entry (another program, same shape) is refused and left as it is.
    codex(&remove);
    codex(&old("/usr/bin/somebody-else"));
    let foreign = get(&sb);
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "codex"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("different entry"), "{stderr}");
    assert_eq!(get(&sb), foreign);
}

/// A direct `serve` whose root another server holds answers its client's `initialize`
/// with the reason — naming the holder's pid, not the root's path — and exits 1.
#[test]
fn a_second_serve_on_a_leased_root_says_so_in_the_initialize_reply() {
    let sb = Sandbox::new();
    let args = sb.serve_root_args(&[]);
    let first = Server::start(&sb, &args, &[]);
    let mut second = Server::spawn(sb.marsh_mcp(&args, &[]));
    // Only the request: the refused server exits once it answered, so a following
    // `notifications/initialized` could meet a closed pipe.
    let reply = second.request(
        "initialize",
        json!({"protocolVersion": marsh_tests::PROTOCOL_VERSION, "capabilities": {},
               "clientInfo": {"name": "marsh-tests", "version": "0"}}),
    );
    let message = reply["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{reply}"));
    assert!(
        message.contains(&format!("pid {}", first.pid())),
        "{message}"
    );
    assert!(message.contains("connect --start"), "{message}");
    assert!(
        !message.contains(&sb.root().display().to_string()),
        "{message}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = second.try_wait() {
            break status;
        }
        assert!(Instant::now() < deadline, "the refused serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(1));
    // The stderr reader thread may still be collecting the last bytes after the exit.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !second.stderr().contains("leased") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(second.stderr().contains("leased"), "{}", second.stderr());
    first.close();
}

/// One HTTP/1.1 request on the broker socket with the right token (`Connection:
/// close`): the status and the body.
fn broker_http(sb: &Sandbox, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let dir = sb.broker_dir().unwrap();
    let token = fs::read_to_string(dir.join("auth-token")).unwrap();
    let mut stream = std::os::unix::net::UnixStream::connect(dir.join("broker.sock")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: b\r\nauthorization: Bearer {}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        token.trim()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
    (status, body.unwrap_or_default())
}

/// How a [`vanishing_broker`] answers the session request it gets after its probe.
#[derive(Clone, Copy, Debug)]
enum Vanish {
    /// Closes the connection without a word, like a broker that exits with a request
    /// in flight (or in its listen backlog).
    Silently,
    /// Answers 503 `stopping`, like a broker whose idle timer fired a moment earlier.
    Stopping,
}

/// A stand-in for a broker caught between `connect --start`'s probe and its session
/// request, on the runtime directory's socket: it answers probes exactly as `probe`
/// (the identity of a real broker of this configuration), and at the first session
/// request removes its socket and goes away as `how` says. Returns the request lines
/// it saw (bounded: it gives up after 60 s).
fn vanishing_broker(
    sb: &Sandbox,
    probe: Value,
    how: Vanish,
) -> std::thread::JoinHandle<Vec<String>> {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::fs::PermissionsExt;
    let socket = sb.broker_dir().unwrap().join("broker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o600)).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let mut stream = match listener.accept() {
                Ok((stream, _)) => stream,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            };
            stream.set_nonblocking(false).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push(line.trim_end().to_string());
            }
            let first = head.first().cloned().unwrap_or_default();
            seen.push(first.clone());
            if first.starts_with("GET /v1/probe ") {
                let body = probe.to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                continue;
            }
            // The session request: this broker is gone from here on.
            let _ = fs::remove_file(&socket);
            if let Vanish::Stopping = how {
                let body = json!({"error": {"kind": "stopping", "message": "the broker is stopping; start it again"}}).to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
            break;
        }
        seen
    })
}

/// The race `connect --start` must survive: its probe finds a compatible broker, which
/// idles out before the session request reaches it. A stand-in answers the probe with a
/// real broker's identity and vanishes at the session request (both ways a real one
/// can); the proxy starts a broker again and its client never notices.
#[test]
fn connect_start_starts_a_broker_again_when_the_probed_one_is_gone_before_the_session() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.root());
    // A real broker of this configuration, to learn the identity a probe answers with.
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let (status, body) = broker_http(&sb, "GET", "/v1/probe");
    assert_eq!(status, 200, "{body}");
    let mut probe: Value = serde_json::from_str(&body).unwrap();
    let stop = sb.broker_args("broker-stop", &[]);
    let (code, stderr) = sb.startup(&stop, &[]);
    assert_eq!(code, Some(0), "{stderr}");

    for how in [Vanish::Silently, Vanish::Stopping] {
        probe["pid"] = json!(0);
        let fake = vanishing_broker(&sb, probe.clone(), how);
        let mut s = Server::spawn(sb.marsh_mcp(
            &connect_start_args(&sb, &["--idle-exit-secs", "30"]),
            &[("MARSH_MCP_LOG", "info")],
        ));
        initialized(&mut s);
        assert_eq!(s.tool_names().len(), 23, "{how:?}");
        let ran = s.ok("shell_run", json!({"command": "echo after-the-race"}));
        assert_eq!(ran["stdout_text"], "after-the-race\n", "{how:?}: {ran}");
        let seen = fake.join().unwrap();
        assert_eq!(seen.len(), 2, "{how:?}: the stand-in saw {seen:?}");
        assert!(seen[0].starts_with("GET /v1/probe "), "{seen:?}");
        assert!(seen[1].starts_with("POST /v1/session "), "{seen:?}");
        let stderr = s.stderr();
        assert!(
            stderr.contains("broker already running (pid 0)")
                && stderr.contains("went away before the session opened; starting again")
                && stderr.contains("broker started (pid "),
            "{how:?}: {stderr}"
        );
        let fresh = sb.broker_pid();
        assert!(fresh > 0 && alive(fresh), "{how:?}");
        assert_eq!(broker_pids(&sb.root()), vec![fresh], "{how:?}");
        assert!(s.close().success(), "{how:?}");
        let (code, stderr) = sb.startup(&stop, &[]);
        assert_eq!(code, Some(0), "{how:?}: {stderr}");
    }
}

/// The same race with the real idle timer: a broker with a 1 s idle period, and new
/// `connect --start` sessions begun at offsets around its expiry (each one's end starts
/// the next idle period). Whether the broker is still there, half gone or gone, every
/// session initializes and lists the tools.
#[test]
fn connect_start_sessions_begun_around_the_idle_expiry_all_work() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.root());
    let idle = ["--idle-exit-secs", "1"];
    let mut first = spawn_connect_start(&sb, &idle);
    initialized(&mut first);
    assert!(first.close().success());
    let mut brokers = vec![sb.broker_pid()];
    let mut retried = 0;
    for offset_ms in (100..=900).step_by(50) {
        std::thread::sleep(Duration::from_millis(offset_ms));
        let mut s = Server::spawn(sb.marsh_mcp(
            &connect_start_args(&sb, &idle),
            &[("MARSH_MCP_LOG", "info")],
        ));
        let init = s.initialize();
        assert!(
            init.get("result").is_some(),
            "offset {offset_ms} ms: initialize failed: {init}; stderr: {}",
            s.stderr()
        );
        assert_eq!(s.tool_names().len(), 23, "offset {offset_ms} ms");
        let pid = sb.broker_pid();
        if brokers.last() != Some(&pid) {
            brokers.push(pid);
        }
        let so_far = s.stderr();
        if so_far.contains("starting again") {
            retried += 1;
        }
        let status = s.close();
        assert!(
            status.success(),
            "offset {offset_ms} ms: {status}; stderr before the close: {so_far}"
        );
    }
    // Informational, not asserted: how often the timer won (a new broker) and how often
    // it won between a session's probe and its request (a retry).
    eprintln!("brokers across the offsets: {brokers:?}; sessions that retried: {retried}");
}

/// A broker `connect --start` starts can find the root's lease still held — by a broker
/// that is itself exiting (idle, or stopped as incompatible) — and exit at once.
/// `connect --start` then waits a moment and starts it again instead of failing with a
/// "did not come up" that names the old pid. Here the test holds the lease itself until
/// the first started broker has exited.
#[test]
fn connect_start_waits_out_a_lease_still_held_as_its_broker_starts() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.root());
    // The root exists (and with it control.lock) once a broker has run on it.
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let stop = sb.broker_args("broker-stop", &[]);
    let (code, stderr) = sb.startup(&stop, &[]);
    assert_eq!(code, Some(0), "{stderr}");

    let lease = fs::File::open(sb.root().join("control.lock")).unwrap();
    lease.lock().unwrap();
    let mut s = Server::spawn(sb.marsh_mcp(
        &connect_start_args(&sb, &["--idle-exit-secs", "30"]),
        &[("MARSH_MCP_LOG", "info")],
    ));
    // Held until the first started broker has met it and exited.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !s.stderr().contains("the started broker exited at once") {
        assert!(Instant::now() < deadline, "{}", s.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(lease);
    initialized(&mut s);
    assert_eq!(s.tool_names().len(), 23);
    let ran = s.ok("shell_run", json!({"command": "echo after-the-lease"}));
    assert_eq!(ran["stdout_text"], "after-the-lease\n", "{ran}");
    let stderr = s.stderr();
    assert!(
        stderr.contains("the started broker exited at once")
            && stderr.contains("starting again in")
            && stderr.contains("broker started (pid "),
        "{stderr}"
    );
    assert!(s.close().success());
    let (code, stderr) = sb.startup(&stop, &[]);
    assert_eq!(code, Some(0), "{stderr}");
}
