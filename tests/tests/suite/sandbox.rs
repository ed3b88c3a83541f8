//! The Linux project shell as a boundary, tried the way a hostile agent would, through
//! `shell_run` only: no host privilege, no escaped processes, no view of another
//! session's jobs, bounded resources, and honest backend failures. CI runs these as
//! root, where the boundary matters most.

use std::fs;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server, host_processes_with, wait_op};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// How long every process of an ended operation may take to disappear.
const GONE_BOUND: Duration = Duration::from_secs(5);

/// `serve --home` with `settings` written to the home's `backend.json` first.
pub(crate) fn server_with(sb: &Sandbox, settings: &str) -> Server {
    let home = sb.home();
    fs::create_dir_all(&home).unwrap();
    fs::set_permissions(&home, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(home.join("backend.json"), settings).unwrap();
    Server::start(sb, &sb.serve_home_args(&[]), &[])
}

fn run(s: &mut Server, command: &str) -> Value {
    s.ok("shell_run", json!({ "command": command }))
}

fn stdout(data: &Value) -> &str {
    data["stdout_text"].as_str().unwrap_or_default()
}

/// Asserts that no host process carries any of `markers` within [`GONE_BOUND`].
fn assert_gone(markers: &[String], after: &str) {
    let deadline = Instant::now() + GONE_BOUND;
    loop {
        let left: Vec<String> = markers
            .iter()
            .flat_map(|m| host_processes_with(m))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still running {GONE_BOUND:?} after {after}: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts that every marker is running on the host (the escape attempt happened).
fn assert_running(markers: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while markers.iter().any(|m| host_processes_with(m).is_empty()) {
        assert!(
            Instant::now() < deadline,
            "markers never started: {markers:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command that leaves three escapees (setsid, double fork, nohup) and then runs
/// `tail`; returns it and the markers (unique sleep durations).
fn escapees(base: u32, tail: &str) -> (String, Vec<String>) {
    let markers: Vec<String> = (0..3).map(|i| format!("sleep {}", base + i)).collect();
    let command = format!(
        "setsid {} >/dev/null 2>&1 & ( {} >/dev/null 2>&1 & ) ; nohup {} >/dev/null 2>&1 & {tail}",
        markers[0], markers[1], markers[2]
    );
    (command, markers)
}

#[test]
fn host_kernel_settings_and_secrets_are_out_of_reach() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");
    let before = fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let data = run(
        &mut s,
        "printf '%s\\n' \"$(cat /proc/sys/kernel/core_pattern)\" > /proc/sys/kernel/core_pattern && echo WROTE-SYSCTL; \
         echo 1 > /proc/sys/vm/drop_caches && echo WROTE-VM; \
         [ -w /proc/sysrq-trigger ] && echo SYSRQ-WRITABLE; \
         cat /etc/shadow /etc/gshadow 2>/dev/null | grep -q : && echo READ-SHADOW; \
         ls /sys 2>/dev/null | grep -q . && touch /sys/kernel/x 2>/dev/null && echo WROTE-SYS; \
         for f in /proc/1/fd/*; do readlink $f >/dev/null 2>&1 && echo INIT-FD-OPENED; done; \
         touch /run/marsh/planted 2>/dev/null && echo AGENT-DIR-WRITABLE; \
         rm -f /run/marsh/kit.sock 2>/dev/null; [ -S /run/marsh/kit.sock ] || echo KIT-SOCKET-GONE; \
         [ \"$(uname -m)\" != x86_64 ] || python3 -c 'import ctypes; l = ctypes.CDLL(None); print(\"KEYRING-REACHABLE\" if l.syscall(250, 0, -3, 0) >= 0 else \"\", end=\"\")'; \
         cat /proc/1/environ >/dev/null 2>&1 && echo INIT-ENVIRON; \
         grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status",
    );
    assert_eq!(
        stdout(&data),
        "CapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n",
        "{}",
        data["stderr_text"]
    );
    assert_eq!(
        fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap(),
        before
    );
}

#[test]
fn setuid_setgid_bits_and_file_capabilities_are_refused() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");
    let data = run(
        &mut s,
        "cp /bin/true ./t; \
         chmod u+s ./t 2>/dev/null && echo U+S; \
         chmod g+s ./t 2>/dev/null && echo G+S; \
         chmod 4755 ./t 2>/dev/null && echo 4755; \
         install -m 4755 /bin/true ./i 2>/dev/null && echo INSTALL; \
         if [ -u /usr/bin/passwd ]; then cp -p /usr/bin/passwd ./p 2>/dev/null; [ -u ./p ] && echo CP-P; fi; \
         mkdir -m 2755 ./d 2>/dev/null && echo MKDIR; \
         python3 -c 'import os; os.close(os.open(\"o\", os.O_CREAT|os.O_WRONLY, 0o6755))' 2>/dev/null && echo OPEN; \
         python3 -c 'import os; os.mknod(\"n\", 0o4644)' 2>/dev/null && echo MKNOD; \
         python3 -c 'import os; os.setxattr(\"t\", \"security.capability\", bytes.fromhex(\"01000002000000000000000000000000000000000000\"))' 2>/dev/null && echo SETCAP; \
         find . -perm /6000 | grep -q . && echo SETID-FILE-EXISTS; \
         echo checked",
    );
    assert_eq!(stdout(&data), "checked\n", "{}", data["stderr_text"]);
    let t = fs::metadata(sb.workspace().join("t")).unwrap();
    assert_eq!(t.mode() & 0o6000, 0);
    assert_eq!(
        t.uid(),
        nix::unistd::geteuid().as_raw(),
        "files keep the server's owner"
    );
    for entry in fs::read_dir(sb.workspace()).unwrap().flatten() {
        let mode = entry.metadata().unwrap().mode();
        assert_eq!(mode & 0o6000, 0, "{:?} carries a set-id bit", entry.path());
    }
}

#[test]
fn created_files_are_0644_and_directories_0755() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");
    run(&mut s, "echo x > made.txt; mkdir made.d");
    let file = fs::metadata(sb.workspace().join("made.txt")).unwrap();
    let dir = fs::metadata(sb.workspace().join("made.d")).unwrap();
    assert_eq!(file.mode() & 0o777, 0o644);
    assert_eq!(dir.mode() & 0o777, 0o755);
}

/// A host listener on 127.0.0.1 and a job that tries to reach it.
fn reach_host_listener(settings: &str) -> (String, Value) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let sb = Sandbox::new();
    let mut s = server_with(&sb, settings);
    let data = run(
        &mut s,
        &format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=3); print(\"REACHED\")' 2>/dev/null || echo REFUSED; \
             grep -c marshd.sock /proc/net/unix || true"
        ),
    );
    let mut accepted = String::new();
    if let Ok((mut conn, _)) = listener.accept() {
        let _ = conn.read_to_string(&mut accepted);
    }
    let status = s.ok("status", json!({}));
    let mut text = stdout(&data).to_string();
    text.push_str(&format!(
        "network={}\n",
        status["runtime"]["backend"]["network"]
            .as_str()
            .unwrap_or("?")
    ));
    (text, s.ok("doctor", json!({})))
}

#[test]
fn the_network_is_loopback_only_unless_the_setting_says_host() {
    let (own, doctor) = reach_host_listener("{}");
    assert_eq!(own, "REFUSED\n0\nnetwork=loopback\n");
    assert!(doctor.to_string().contains("network loopback"), "{doctor}");
    let (host, doctor) = reach_host_listener(r#"{"network": "host"}"#);
    assert!(host.starts_with("REACHED\n"), "{host}");
    assert!(host.ends_with("network=host\n"), "{host}");
    assert!(doctor.to_string().contains("network host"), "{doctor}");
}

#[test]
fn escaped_processes_end_with_exit_cancel_and_timeout() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");

    let (command, markers) = escapees(71_000, "echo started");
    assert_eq!(stdout(&run(&mut s, &command)), "started\n");
    assert_gone(&markers, "a normal exit");

    let (command, markers) = escapees(71_100, "sleep 120");
    let id = s.ok("shell_run", json!({"command": command, "wait_ms": 0}))["operation_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_running(&markers);
    s.ok("operation_cancel", json!({"operation_id": id}));
    let ended = wait_op(&mut s, &id);
    assert_eq!(ended["state"], "cancellation_uncertain");
    assert_gone(&markers, "a cancel");

    let (command, markers) = escapees(71_200, "sleep 120");
    let data = s.call(
        "shell_run",
        json!({"command": command, "timeout_ms": 1500, "wait_ms": 20000}),
    );
    assert_eq!(data["data"]["state"], "timed_out", "{data}");
    assert_gone(&markers, "a timeout");
}

#[test]
fn kill_9_of_serve_ends_every_job_process_and_the_scope_stops_after_a_restart() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let scope = s.start_scope();
    // Markers are unique to this test: other tests run their own `sleep`s meanwhile.
    let (command, mut markers) = escapees(72_000, "sleep 301.72");
    markers.push("sleep 301.72".into());
    s.ok(
        "scope_run",
        json!({"scope_id": scope, "command": command, "timeout_ms": 20000, "wait_ms": 0}),
    );
    assert_running(&markers);
    s.kill();
    assert_gone(&markers, "kill -9 of serve");
    let mut again = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let stopped = again.ok("scope_stop", json!({"scope_id": scope}));
    assert_eq!(stopped["state"], "succeeded", "{stopped}");
}

#[test]
fn a_second_session_cannot_see_or_signal_the_first_sessions_job() {
    let sb = Sandbox::new();
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let mut a = sb.connect();
    let mut b = sb.connect();
    // A's job; the pattern `slee[p]` keeps B's own grep from matching itself.
    let id = a.ok(
        "shell_run",
        json!({"command": "sleep 3.0741; echo A-DONE", "wait_ms": 0}),
    )["operation_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_running(&["sleep 3.0741".to_string()]);
    let seen = run(
        &mut b,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'slee[p] 3.0741' || true; \
         pkill -9 -f 'slee[p] 3.0741' && echo KILLED; \
         for f in /proc/[0-9]*/fd/1; do case $f in /proc/$$/*) ;; *) echo FORGED > $f ;; esac; done 2>/dev/null; \
         echo probed",
    );
    assert_eq!(stdout(&seen), "0\nprobed\n", "{}", seen["stderr_text"]);
    let ended = wait_op(&mut a, &id);
    assert_eq!(ended["state"], "succeeded", "{ended}");
    let out = a.ok("operation_output", json!({"operation_id": id}));
    assert_eq!(out["stdout_text"], "A-DONE\n", "{out}");
}

#[test]
fn killing_a_proxy_or_the_broker_ends_every_job_process() {
    let sb = Sandbox::new();
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let mut proxy = sb.connect();
    let (command, markers) = escapees(73_000, "sleep 300");
    proxy.ok("shell_run", json!({"command": command, "wait_ms": 0}));
    assert_running(&markers);
    proxy.kill();
    assert_gone(&markers, "the proxy was killed");

    let mut proxy = sb.connect();
    let (command, markers) = escapees(73_100, "sleep 300");
    proxy.ok("shell_run", json!({"command": command, "wait_ms": 0}));
    assert_running(&markers);
    sb.kill_broker();
    assert_gone(&markers, "kill -9 of the broker");
}

#[test]
fn a_fork_bomb_is_contained_and_the_server_keeps_answering() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, r#"{"pids_max": 64}"#);
    let doctor = s.ok("doctor", json!({})).to_string();
    assert!(doctor.contains("64 processes"), "{doctor}");
    if nix::unistd::geteuid().is_root() {
        assert!(
            !doctor.contains("limits by rlimit"),
            "a root server needs a control group to bound processes: {doctor}"
        );
    }
    let bomb = s.call(
        "shell_run",
        json!({"command": "b() { b | b & }; b; sleep 3", "timeout_ms": 6000, "wait_ms": 20000}),
    );
    assert_eq!(bomb["ok"], true, "{bomb}");
    assert_ne!(bomb["data"]["state"], "running", "{bomb}");
    assert_eq!(stdout(&run(&mut s, "echo alive")), "alive\n");
    let status = s.ok("status", json!({}));
    assert_eq!(status["runtime"]["backend"]["healthy"], true, "{status}");
}

#[test]
fn without_bwrap_shell_run_is_backend_failed_and_doctor_names_the_package() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, r#"{"bwrap": "/nonexistent/bwrap"}"#);
    let envelope = s.call("shell_run", json!({"command": "echo never"}));
    assert_eq!(envelope["ok"], false, "{envelope}");
    assert_eq!(envelope["error"]["kind"], "backend_failed");
    let message = envelope["error"]["message"].as_str().unwrap();
    assert!(message.contains("apt-get install bubblewrap"), "{message}");
    assert!(!message.contains("/nonexistent"), "no host path: {message}");
    let doctor = s.ok("doctor", json!({}));
    assert_eq!(doctor["healthy"], false, "{doctor}");
    let isolation = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "isolation")
        .unwrap()
        .clone();
    assert_eq!(isolation["ok"], false);
    assert!(
        isolation["detail"]
            .as_str()
            .unwrap()
            .contains("apt-get install bubblewrap"),
        "{isolation}"
    );
    let status = s.ok("status", json!({}));
    assert_eq!(status["runtime"]["backend"]["healthy"], false, "{status}");
}

#[test]
fn a_126_of_the_command_itself_is_its_result() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");
    let data = run(&mut s, "echo not-marsh >&2; exit 126");
    assert_eq!(
        (data["state"].as_str(), data["exit_code"].as_i64()),
        (Some("exited"), Some(126))
    );
}

#[test]
fn the_idle_setting_ends_an_idle_daemon() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, r#"{"idle_secs": 1}"#);
    run(&mut s, "true");
    let pid: i32 = fs::read_to_string(sb.home().join("daemon/pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the daemon outlived its idle setting"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_reused_container_holds_one_command_at_a_time() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");
    let (command, markers) = escapees(74_000, "echo left-behind");
    assert_eq!(stdout(&run(&mut s, &command)), "left-behind\n");
    // Not "within 5 s": the container is emptied before the command is reported ended.
    let left: Vec<String> = markers
        .iter()
        .flat_map(|m| host_processes_with(m))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // A root daemon admits each container (`--admit`: OOM score, set-id guard).
    let init = if nix::unistd::geteuid().is_root() {
        "/run/marsh/agent container-init --admit"
    } else {
        "/run/marsh/agent container-init"
    };
    // Commands run in bash when the host has it.
    let shell = if std::path::Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    for _ in 0..3 {
        let seen = run(&mut s, "ps -e -o args= | grep -v '^ps ' | sort");
        assert_eq!(
            stdout(&seen),
            format!(
                "{shell} -c ps -e -o args= | grep -v '^ps ' | sort\n{init}\ngrep -v ^ps \nsort\n"
            ),
            "{}",
            seen["stderr_text"]
        );
    }
}

/// Files that are root-only on the host (0400) are readable by a job of a root server
/// (its uid owns them) unless masked: the allocator, page tables and serial lines.
#[test]
fn root_only_kernel_files_are_masked_in_jobs() {
    if marsh_tests::skip_unless_root("a job of a root server owns the host's 0400 /proc files") {
        return;
    }
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");
    let data = run(
        &mut s,
        "for f in slabinfo vmallocinfo pagetypeinfo kpageflags kpagecount kpagecgroup \
                  kcore timer_list sched_debug tty/driver/serial; do \
           [ -e /proc/$f ] || continue; \
           n=$(head -c 64 /proc/$f 2>/dev/null | wc -c); [ \"$n\" -gt 0 ] && echo READABLE:$f; \
         done; echo checked",
    );
    assert_eq!(stdout(&data), "checked\n", "{}", data["stderr_text"]);
}
