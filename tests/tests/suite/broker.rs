//! The resident broker and its authenticated connect proxies.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server};
use serde_json::{Value, json};

fn started(sb: &Sandbox) {
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "broker-start failed: {stderr}");
}

fn token(sb: &Sandbox) -> String {
    fs::read_to_string(sb.broker_dir().unwrap().join("auth-token")).unwrap()
}

/// A raw HTTP request on the broker socket; returns the status code.
fn raw_status(sb: &Sandbox, request: &str) -> u16 {
    let mut stream = UnixStream::connect(sb.broker_dir().unwrap().join("broker.sock")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = [0u8; 512];
    let n = stream.read(&mut answer).unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    text.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn wait_exit(child: &mut Server, bound: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn two_proxies_share_scopes_and_the_global_cap_but_not_operations() {
    let sb = Sandbox::new();
    started(&sb);
    let mut a = sb.connect();
    let mut b = sb.connect();
    let scope = a.ok("scope_start", json!({}))["scope_id"]
        .as_str()
        .unwrap()
        .to_string();
    let listed = b.ok("scope_list", json!({}));
    assert!(
        listed.to_string().contains(&scope),
        "peers share the registry: {listed}"
    );

    let mut ids = Vec::new();
    for i in 0..4 {
        let s = if i < 2 { &mut a } else { &mut b };
        let run = s.ok("shell_run", json!({"command": "sleep 30", "wait_ms": 0}));
        ids.push(run["operation_id"].as_str().unwrap().to_string());
    }
    assert_eq!(
        a.err_kind("shell_run", json!({"command": "true"})),
        "capacity_exhausted"
    );
    assert_eq!(
        b.err_kind("scope_run", json!({"scope_id": scope, "command": "true"})),
        "capacity_exhausted"
    );

    // Neither session can read, wait on or cancel the other's operation, and a foreign
    // id is answered exactly like an id that never existed.
    let foreign = &ids[0];
    let never = "00000000-0000-4000-8000-000000000000";
    for tool in ["operation_get", "operation_output", "operation_cancel"] {
        let theirs = b.call(tool, json!({"operation_id": foreign}));
        let nobody = b.call(tool, json!({"operation_id": never}));
        assert_eq!(theirs["error"]["kind"], "not_owner", "{tool}");
        assert_eq!(theirs["error"], nobody["error"], "{tool} reveals existence");
    }
    assert_eq!(
        a.ok("operation_get", json!({"operation_id": foreign}))["state"],
        "running"
    );
    for (i, id) in ids.iter().enumerate() {
        let owner = if i < 2 { &mut a } else { &mut b };
        owner.ok("operation_cancel", json!({"operation_id": id}));
    }
}

#[test]
fn killing_one_proxy_cancels_only_its_operations() {
    let sb = Sandbox::new();
    started(&sb);
    let mut a = sb.connect();
    let mut b = sb.connect();
    for _ in 0..3 {
        a.ok("shell_run", json!({"command": "sleep 60", "wait_ms": 0}));
    }
    let kept = b.ok("shell_run", json!({"command": "sleep 60", "wait_ms": 0}))["operation_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        b.err_kind("shell_run", json!({"command": "true"})),
        "capacity_exhausted"
    );
    a.kill();
    // a's three slots come back; b's operation keeps running.
    let more = b.start_runs_when_free(
        3,
        "sleep 60",
        Duration::from_secs(20),
        "the killed proxy's operations were never cancelled",
    );
    assert_eq!(
        b.ok("operation_get", json!({"operation_id": kept}))["state"],
        "running"
    );
    for id in more.iter().chain([&kept]) {
        b.ok("operation_cancel", json!({"operation_id": id}));
    }
}

#[test]
fn kill_9_of_the_broker_ends_proxies_and_a_new_start_recovers_the_registry() {
    let sb = Sandbox::new();
    started(&sb);
    let mut a = sb.connect();
    let mut b = sb.connect();
    let scope = a.ok("scope_start", json!({}))["scope_id"]
        .as_str()
        .unwrap()
        .to_string();
    sb.kill_broker();
    for proxy in [&mut a, &mut b] {
        let status = wait_exit(proxy, Duration::from_secs(10))
            .expect("proxy did not exit after the broker died");
        assert!(
            !status.success(),
            "a proxy that lost its broker must exit non-zero"
        );
    }
    assert!(a.stderr().contains("marsh-mcp: "), "{}", a.stderr());
    started(&sb);
    let mut c = sb.connect();
    let listed = c.ok("scope_list", json!({}));
    assert!(
        listed.to_string().contains(&scope),
        "registry intact: {listed}"
    );
    assert_eq!(
        c.ok(
            "scope_run",
            json!({"scope_id": scope, "command": "echo again"})
        )["stdout_text"],
        "again\n"
    );
}

#[test]
fn broker_start_is_idempotent_and_stop_is_refused_while_a_proxy_is_attached() {
    let sb = Sandbox::new();
    started(&sb);
    let pid = sb.broker_pid();
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0));
    assert!(stderr.contains("already running"), "{stderr}");
    assert_eq!(sb.broker_pid(), pid);
    let proxy = sb.connect();
    let (code, stderr) = sb.startup(&sb.broker_args("broker-stop", &[]), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("session(s) attached"), "{stderr}");
    assert!(proxy.close().success(), "clean stdin EOF exits 0");
    let (code, stderr) = sb.startup(&sb.broker_args("broker-stop", &[]), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "broker exited"
    );
    let (code, _) = sb.startup(&sb.broker_args("connect", &[]), &[]);
    assert_eq!(code, Some(1), "connect without a broker fails");
}

#[test]
fn a_rebuilt_binary_replaces_an_idle_broker_and_is_refused_while_one_is_attached() {
    let sb = Sandbox::new();
    let marsh = sb.prefix.bin("marsh").display().to_string();
    let args = sb.broker_args("broker-start", &["--marsh", &marsh]);
    let start_with = |exe: &std::path::Path| {
        let out = sb.marsh_mcp_at(exe, &args, &[]).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = start_with(&sb.prefix.bin("marsh-mcp"));
    assert_eq!(code, Some(0), "{stderr}");
    let old = sb.broker_pid();
    // A "rebuilt" marsh-mcp: same code, different bytes, elsewhere.
    let rebuilt_dir = sb.state().join("rebuilt");
    fs::create_dir(&rebuilt_dir).unwrap();
    let rebuilt = rebuilt_dir.join("marsh-mcp");
    let mut bytes = fs::read(sb.prefix.bin("marsh-mcp")).unwrap();
    bytes.extend_from_slice(b"rebuilt");
    fs::write(&rebuilt, bytes).unwrap();
    fs::set_permissions(&rebuilt, fs::Permissions::from_mode(0o755)).unwrap();
    let run_rebuilt = || start_with(&rebuilt);
    let attached = sb.connect();
    let (code, stderr) = run_rebuilt();
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("another build or configuration"),
        "{stderr}"
    );
    assert_eq!(sb.broker_pid(), old);
    assert!(attached.close().success());
    let (code, stderr) = run_rebuilt();
    assert_eq!(code, Some(0), "{stderr}");
    assert_ne!(sb.broker_pid(), old, "the idle old broker was replaced");
    let mut fresh = sb.connect();
    assert_eq!(fresh.ok("status", json!({}))["state"], "ready");
}

#[test]
fn requests_without_the_right_token_are_refused() {
    let sb = Sandbox::new();
    started(&sb);
    let probe = |auth: &str| {
        format!("GET /v1/probe HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n")
    };
    assert_eq!(raw_status(&sb, &probe("")), 401);
    assert_eq!(
        raw_status(
            &sb,
            &probe(&format!("Authorization: Bearer {}\r\n", "0".repeat(64)))
        ),
        401
    );
    assert_eq!(
        raw_status(
            &sb,
            &probe(&format!("Authorization: Bearer {}\r\n", token(&sb)))
        ),
        200
    );
    let session =
        "POST /v1/session HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: mcp-lines\r\n\r\n";
    assert_eq!(raw_status(&sb, session), 401);
}

#[test]
fn another_uid_is_refused_even_with_a_loosened_socket() {
    if marsh_tests::skip_unless_root("setpriv to the uid nobody") {
        return;
    }
    let sb = Sandbox::new();
    started(&sb);
    loosen_socket(&sb);
    assert_eq!(curl_probe(&sb, true), "403", "another uid is refused");
    assert_eq!(
        curl_probe(&sb, false),
        "200",
        "the broker's own user passes"
    );
}

/// Opens the broker socket and the directories above it to every uid (as a careless
/// administrator might); returns the socket's path.
fn loosen_socket(sb: &Sandbox) -> std::path::PathBuf {
    let dir = sb.broker_dir().unwrap();
    for path in [sb.state(), sb.runtime_base(), dir.clone()] {
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let socket = dir.join("broker.sock");
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o777)).unwrap();
    socket
}

/// `curl --unix-socket … /v1/probe` with the right token, optionally as `nobody`
/// (through `setpriv`); returns the HTTP status curl saw.
fn curl_probe(sb: &Sandbox, as_nobody: bool) -> String {
    curl_probe_with_scheme(sb, as_nobody, "Bearer")
}

/// [`curl_probe`] with the `Authorization` scheme name written as `scheme`.
fn curl_probe_with_scheme(sb: &Sandbox, as_nobody: bool, scheme: &str) -> String {
    let dir = sb.broker_dir().unwrap();
    let mut cmd = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "curl"]);
        c
    } else {
        Command::new("curl")
    };
    let out = cmd
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--unix-socket",
        ])
        .arg(dir.join("broker.sock"))
        .args([
            "-H",
            &format!("Authorization: {scheme} {}", token(sb)),
            "http://broker/v1/probe",
        ])
        .output()
        .expect("setpriv and curl");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn a_two_mib_frame_through_the_proxy_is_answered_and_the_session_continues() {
    let sb = Sandbox::new();
    started(&sb);
    let mut proxy = sb.connect();
    let mut frame = br#"{"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"shell_run","arguments":{"command":""#.to_vec();
    frame.extend(std::iter::repeat_n(b'y', 2 * 1024 * 1024));
    frame.extend_from_slice(b"\"}}}\n");
    proxy.send_raw(&frame);
    let reply: Value = proxy.recv(Duration::from_secs(30)).expect("an answer");
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(
        proxy.ok("shell_run", json!({"command": "echo fine"}))["stdout_text"],
        "fine\n"
    );
}

#[test]
fn a_scope_root_of_two_hundred_characters_still_works() {
    let sb = Sandbox::new();
    let long_root = sb.state().join("r".repeat(100)).join("s".repeat(100));
    let mut args = sb.broker_args("broker-start", &[]);
    args[4] = long_root.display().to_string();
    let (code, stderr) = sb.startup(&args, &[]);
    assert_eq!(code, Some(0), "{stderr}");
    args[0] = "connect".into();
    let mut proxy = Server::start(&sb, &args, &[]);
    assert_eq!(
        proxy.ok("shell_run", json!({"command": "echo long"}))["stdout_text"],
        "long\n"
    );
    assert!(long_root.join("scopes.json").exists());
}

/// A process of another uid on a loosened socket holds 300 connections open without
/// sending a byte: the broker refuses each at accept (`SO_PEERCRED`), so its own user's
/// probe still gets through at once instead of finding every slot taken.
#[test]
fn a_foreign_uid_cannot_hold_the_broker_connection_slots() {
    if marsh_tests::skip_unless_root("setpriv to the uid nobody") {
        return;
    }
    let sb = Sandbox::new();
    started(&sb);
    let socket = loosen_socket(&sb);
    let hold = format!(
        "import socket, sys, time\n\
         held = []\n\
         for _ in range(300):\n\
         \x20   s = socket.socket(socket.AF_UNIX)\n\
         \x20   s.connect({:?})\n\
         \x20   held.append(s)\n\
         print('held', flush=True)\n\
         time.sleep(20)\n",
        socket.display().to_string()
    );
    let mut holder = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            &hold,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = [0u8; 5];
    holder
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut line)
        .unwrap();
    assert_eq!(&line, b"held\n");
    let asked = Instant::now();
    let status = curl_probe(&sb, false);
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(
        status, "200",
        "the owner's probe while another uid holds 300 connections"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
}

/// The `Bearer` scheme name is case-insensitive (RFC 7235).
#[test]
fn the_bearer_scheme_name_is_case_insensitive() {
    let sb = Sandbox::new();
    started(&sb);
    for scheme in ["bearer", "BEARER", "Bearer"] {
        assert_eq!(
            curl_probe_with_scheme(&sb, false, scheme),
            "200",
            "{scheme}"
        );
    }
}

/// The `/tmp` runtime directory a broker of this root would have used without
/// `XDG_RUNTIME_DIR` (`/tmp/marsh-mcp-<euid>-<hash>`) is created first by another user.
/// The broker starts anyway, in the user's own state directory, and a proxy started
/// with the same environment finds it; the squatted directory is left untouched.
#[test]
fn a_runtime_dir_squatted_in_tmp_does_not_stop_the_broker() {
    if marsh_tests::skip_unless_root("chown to the uid nobody") {
        return;
    }
    let sb = Sandbox::new();
    let root = fs::canonicalize(sb.state()).unwrap().join("root");
    let mut hasher = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    hasher
        .stdin
        .take()
        .unwrap()
        .write_all(root.as_os_str().as_encoded_bytes())
        .unwrap();
    let digest = String::from_utf8(hasher.wait_with_output().unwrap().stdout).unwrap();
    let squatted = std::path::PathBuf::from(format!("/tmp/marsh-mcp-0-{}", &digest[..16]));
    let _ = fs::remove_dir_all(&squatted);
    fs::create_dir(&squatted).unwrap();
    fs::set_permissions(&squatted, fs::Permissions::from_mode(0o777)).unwrap();
    nix::unistd::chown(
        &squatted,
        Some(nix::unistd::Uid::from_raw(65534)),
        Some(nix::unistd::Gid::from_raw(65534)),
    )
    .unwrap();
    struct Cleanup(std::path::PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    let _cleanup = Cleanup(squatted.clone());

    let without_runtime = |verb: &str| {
        let mut cmd = sb.marsh_mcp(&sb.broker_args(verb, &[]), &[]);
        cmd.env_remove("XDG_RUNTIME_DIR");
        cmd
    };
    let out = without_runtime("broker-start")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "broker-start failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let own = sb.state().join("user/.local/state/marsh-mcp-run");
    assert!(
        own.join(&digest[..16]).join("broker.sock").exists(),
        "the broker's socket is in the user's own state directory"
    );
    let mut proxy = Server::spawn(without_runtime("connect"));
    assert!(proxy.initialize().get("result").is_some());
    assert_eq!(
        proxy.ok("shell_run", json!({"command": "echo unsquatted"}))["stdout_text"],
        "unsquatted\n"
    );
    assert_eq!(fs::read_dir(&squatted).unwrap().count(), 0);
}
