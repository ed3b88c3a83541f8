//! Black-box harness: installs the built binaries into a private prefix, creates an
//! isolated workspace and state directory per test, spawns `marsh-mcp`, and speaks
//! MCP (newline-delimited JSON-RPC) to it. Everything a test starts is killed by pid
//! when the test's values drop; nothing touches the real `$HOME`.

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]
// A harness failure is a test failure: panicking with a message is the intended way out.
#![allow(clippy::expect_used, clippy::unwrap_used)]
// A test harness panics on a poisoned lock; the product crates lock through their helpers.
#![allow(clippy::disallowed_methods)]

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod schemas;
pub use schemas::OutputSchemas;

pub const PROTOCOL_VERSION: &str = "2025-06-18";

/// Exactly the 23 tools of the catalog (docs/tools.md), in catalog order.
pub const TOOLS: [&str; 23] = [
    "doctor",
    "status",
    "results_list",
    "result_get",
    "shell_run",
    "prewarm",
    "workers_reset",
    "scope_start",
    "scope_list",
    "scope_status",
    "scope_run",
    "scope_results_list",
    "scope_result_get",
    "scope_prewarm",
    "scope_workers_reset",
    "scope_reset",
    "scope_stop",
    "scope_remove",
    "operation_list",
    "operation_get",
    "operation_output",
    "operation_cancel",
    "qualify",
];
const REPLY_TIMEOUT: Duration = Duration::from_secs(90);

/// True (and a line on stderr saying why the test is skipped) when this process is
/// not root: the caller needs a privilege only root has (another uid, a mount, a
/// file owned by someone else). `make test` runs as root in CI, where they all run.
pub fn skip_unless_root(needs: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return false;
    }
    eprintln!("skipped: needs root ({needs})");
    true
}

/// The passwd name of the effective uid (what marsh-mcp gives its children as `USER`).
pub fn passwd_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .expect("passwd lookup")
        .expect("a passwd entry for the effective uid")
        .name
}

/// `target/debug` (or whichever profile built this test).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

pub fn built(name: &str) -> PathBuf {
    let path = target_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace binaries first (`cargo build --workspace --bins`, done by `make test`)",
        path.display()
    );
    path
}

/// Runs `tests/clients/<script>` with the PyPI `mcp` client's venv (`make py-client`)
/// against `marsh-mcp serve --home` of `sb`; returns the JSON summary it prints.
pub fn python_client_summary(sb: &Sandbox, script: &str) -> Value {
    let python = target_dir()
        .parent()
        .expect("target")
        .join("py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make py-client` (done by `make test`)",
        python.display()
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("clients")
        .join(script);
    let out = Command::new(python)
        .arg(script)
        .arg(sb.prefix.bin("marsh-mcp"))
        .args(sb.serve_home_args(&[]))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", sb.state().join("user"))
        .current_dir(sb.workspace())
        .output()
        .expect("run the Python client");
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client prints one JSON summary")
}

/// A real client CLI installed by `make npm-clients` (codex, claude, mcp-inspector).
pub fn npm_bin(name: &str) -> PathBuf {
    let path = target_dir()
        .parent()
        .expect("target")
        .join("npm-clients/node_modules/.bin")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `make npm-clients` (done by `make test`)",
        path.display()
    );
    path
}

/// A private install prefix: copies of marsh-mcp, marsh, marshd and sbx, 0755, in a
/// root-or-euid-owned directory chain (the pinning rules refuse target/ paths only
/// when they sit inside the workspace, but a copy keeps replacement tests local).
pub struct Prefix {
    dir: tempfile::TempDir,
}

impl Prefix {
    pub fn install() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("marsh-prefix-")
            .tempdir()
            .expect("prefix");
        fs::create_dir(dir.path().join("bin")).expect("bin");
        for name in ["marsh-mcp", "marsh", "marshd", "sbx"] {
            let dst = dir.path().join("bin").join(name);
            fs::copy(built(name), &dst).expect("copy binary");
            fs::set_permissions(&dst, fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        Self { dir }
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        fs::canonicalize(self.dir.path())
            .expect("canonical prefix")
            .join("bin")
            .join(name)
    }
}

/// One test's world: prefix, workspace, and a state directory for homes, roots and
/// the fake user home.
pub struct Sandbox {
    pub prefix: Prefix,
    workspace: tempfile::TempDir,
    state: tempfile::TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        let prefix = Prefix::install();
        let workspace = tempfile::Builder::new()
            .prefix("marsh-ws-")
            .tempdir()
            .expect("workspace");
        let state = tempfile::Builder::new()
            .prefix("marsh-state-")
            .tempdir()
            .expect("state");
        fs::create_dir(state.path().join("user")).expect("user home");
        Self {
            prefix,
            workspace,
            state,
        }
    }

    pub fn workspace(&self) -> PathBuf {
        fs::canonicalize(self.workspace.path()).expect("canonical workspace")
    }

    pub fn state(&self) -> PathBuf {
        fs::canonicalize(self.state.path()).expect("canonical state")
    }

    /// The legacy home used by [`Sandbox::serve_home`].
    pub fn home(&self) -> PathBuf {
        self.state().join("home")
    }

    pub fn root(&self) -> PathBuf {
        self.state().join("root")
    }

    /// The stand-in sbx's state file of this sandbox (`SBX_SHIM_STATE`): without it
    /// the stand-in uses the passwd home's, which a test must never touch.
    pub fn sbx_state(&self) -> PathBuf {
        self.state().join("sbx-shim-state.json")
    }

    /// The `XDG_RUNTIME_DIR` every marsh-mcp of this sandbox gets (short, private).
    pub fn runtime_base(&self) -> PathBuf {
        self.state().join("run")
    }

    /// The broker runtime directory (`marsh-mcp-<euid>-<hash>`), once created.
    pub fn broker_dir(&self) -> Option<PathBuf> {
        fs::read_dir(self.runtime_base())
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("marsh-mcp-"))
            })
    }

    /// The pid recorded by the running broker.
    pub fn broker_pid(&self) -> i32 {
        fs::read_to_string(self.broker_dir().expect("a broker dir").join("broker.pid"))
            .expect("broker.pid")
            .trim()
            .parse()
            .expect("a pid")
    }

    /// SIGKILLs the running broker.
    pub fn kill_broker(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.broker_pid()),
            nix::sys::signal::Signal::SIGKILL,
        )
        .expect("kill the broker");
    }

    /// `<verb> --workspace W --scope-root R --sbx S` (plus `extra`) for broker modes.
    pub fn broker_args(&self, verb: &str, extra: &[&str]) -> Vec<String> {
        let mut args = self.serve_root_args(extra);
        args[0] = verb.to_string();
        args
    }

    /// Runs `broker-start` to completion: (exit code, stderr).
    pub fn broker_start(&self) -> (Option<i32>, String) {
        self.startup(&self.broker_args("broker-start", &[]), &[])
    }

    /// A `connect` proxy with the handshake done.
    pub fn connect(&self) -> Server {
        Server::start(self, &self.broker_args("connect", &[]), &[])
    }

    /// `serve --workspace W --home H --sbx S` (plus `extra`).
    pub fn serve_home_args(&self, extra: &[&str]) -> Vec<String> {
        self.serve_args("--home", &self.home(), extra)
    }

    /// `serve --workspace W --scope-root R --sbx S` (plus `extra`).
    pub fn serve_root_args(&self, extra: &[&str]) -> Vec<String> {
        self.serve_args("--scope-root", &self.root(), extra)
    }

    /// Index 2 is the workspace, 4 the home or root, 6 the sbx: tests edit them in place.
    fn serve_args(&self, flag: &str, place: &Path, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "serve".to_string(),
            "--workspace".into(),
            self.workspace().display().to_string(),
            flag.into(),
            place.display().to_string(),
            "--sbx".into(),
            self.prefix.bin("sbx").display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// A `marsh-mcp` command with a cleared environment pointing at the fake user home.
    pub fn marsh_mcp(&self, args: &[String], env: &[(&str, &str)]) -> Command {
        self.marsh_mcp_at(&self.prefix.bin("marsh-mcp"), args, env)
    }

    /// Like [`Sandbox::marsh_mcp`], for another `marsh-mcp` executable.
    pub fn marsh_mcp_at(&self, exe: &Path, args: &[String], env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.state().join("user"))
            .env("XDG_RUNTIME_DIR", self.runtime_base())
            .env("SBX_SHIM_STATE", self.sbx_state())
            .current_dir(self.workspace());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs a `marsh-mcp` invocation expected to refuse startup; returns its exit code
    /// and stderr. Stdin is closed, so a server that wrongly starts exits at EOF.
    pub fn startup(&self, args: &[String], env: &[(&str, &str)]) -> (Option<i32>, String) {
        let out = self
            .marsh_mcp(args, env)
            .stdin(Stdio::null())
            .output()
            .expect("run marsh-mcp");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Every line of the stand-in's invocation log in `home`.
    pub fn invocations(&self, home: &Path) -> Vec<Value> {
        let Ok(text) = fs::read_to_string(home.join(".shim/invocations.jsonl")) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn daemon_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        let mut stack = vec![self.state()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(ft) = entry.file_type() else { continue };
                if ft.is_dir() && !ft.is_symlink() {
                    stack.push(path);
                } else if (path.ends_with("daemon/pid") || path.ends_with("broker.pid"))
                    && let Some(pid) = fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                {
                    pids.push(pid);
                }
            }
        }
        pids
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        for pid in self.daemon_pids() {
            if pid > 1 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// A running `marsh-mcp` speaking MCP on its stdio.
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    replies: Receiver<Value>,
    stderr: Arc<Mutex<Vec<u8>>>,
    next_id: u64,
    /// The child leads its own process group, killed whole on drop.
    group: bool,
    /// The server's published output schemas, read by the first [`Server::call`]; every
    /// result `call` returns has been checked against its tool's.
    schemas: Option<OutputSchemas>,
}

impl Server {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn marsh-mcp");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let mut stderr_pipe = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line:?}"));
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = stderr_pipe.read(&mut buf) {
                if n == 0 {
                    return;
                }
                sink.lock()
                    .expect("stderr sink")
                    .extend_from_slice(&buf[..n]);
            }
        });
        Self {
            child,
            stdin,
            replies: rx,
            stderr,
            next_id: 1,
            group: false,
            schemas: None,
        }
    }

    /// Like [`Server::spawn`], in a process group of its own that is killed whole on
    /// drop (for wrappers such as the npm `codex` script that spawn the real binary).
    pub fn spawn_group(mut cmd: Command) -> Self {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let mut server = Self::spawn(cmd);
        server.group = true;
        server
    }

    /// Spawns and completes the `initialize` handshake.
    pub fn start(sandbox: &Sandbox, args: &[String], env: &[(&str, &str)]) -> Self {
        Self::spawn_initialized(sandbox.marsh_mcp(args, env))
    }

    /// Spawns `cmd` (a server however it is wrapped) and completes the handshake.
    pub fn spawn_initialized(cmd: Command) -> Self {
        let mut server = Self::spawn(cmd);
        let init = server.initialize();
        assert!(
            init.get("result").is_some(),
            "initialize failed: {init}; stderr: {}",
            server.stderr()
        );
        server
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("stderr")).into_owned()
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("write frame");
        stdin.flush().expect("flush");
    }

    pub fn send(&mut self, message: &Value) {
        let mut line = serde_json::to_vec(message).expect("encode");
        line.push(b'\n');
        self.send_raw(&line);
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// Closes the server's stdin (MCP's stdio shutdown begins) without waiting; replies
    /// can still be read.
    pub fn close_input(&mut self) {
        drop(self.stdin.take());
    }

    /// The next message from the server, whatever it is.
    pub fn recv(&self, timeout: Duration) -> Option<Value> {
        self.replies.recv_timeout(timeout).ok()
    }

    /// Sends a request and returns the reply with the same id (skipping notifications).
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.reply_to(id)
    }

    pub fn reply_to(&self, id: u64) -> Value {
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self
                .recv(left)
                .unwrap_or_else(|| panic!("no reply to request {id}; stderr: {}", self.stderr()));
            if msg.get("id") == Some(&json!(id)) {
                return msg;
            }
        }
    }

    /// Sends a request and returns its reply with every notification (a message
    /// with a `method` and no `id`) that arrived before it, in order.
    pub fn request_with_notifications(
        &mut self,
        method: &str,
        params: Value,
    ) -> (Value, Vec<Value>) {
        let id = self.next_request_id();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let mut notifications = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let msg = self
                .recv(left)
                .unwrap_or_else(|| panic!("no reply to request {id}; stderr: {}", self.stderr()));
            if msg.get("id") == Some(&json!(id)) {
                return (msg, notifications);
            }
            if msg.get("id").is_none() && msg.get("method").is_some() {
                notifications.push(msg);
            }
        }
    }

    pub fn next_request_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn initialize(&mut self) -> Value {
        let reply = self.request(
            "initialize",
            json!({"protocolVersion": PROTOCOL_VERSION, "capabilities": {}, "clientInfo": {"name": "marsh-tests", "version": "0"}}),
        );
        self.notify("notifications/initialized", json!({}));
        reply
    }

    /// The names `tools/list` answers with.
    pub fn tool_names(&mut self) -> Vec<String> {
        let list = self.request("tools/list", json!({}));
        list["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("tools/list failed: {list}"))
            .iter()
            .map(|t| t["name"].as_str().expect("tool name").to_string())
            .collect()
    }

    /// The output schemas this server publishes (one `tools/list`, then cached).
    pub fn output_schemas(&mut self) -> &OutputSchemas {
        if self.schemas.is_none() {
            let list = self.request("tools/list", json!({}));
            let result = list
                .get("result")
                .unwrap_or_else(|| panic!("tools/list failed: {list}"));
            self.schemas = Some(OutputSchemas::from_tools_list(result));
        }
        self.schemas.get_or_insert_with(OutputSchemas::default)
    }

    /// Calls a tool and returns its `structuredContent` envelope, after checking it
    /// against the tool's published `outputSchema` ([`OutputSchemas::check`]).
    pub fn call(&mut self, name: &str, arguments: Value) -> Value {
        self.output_schemas();
        let reply = self.request("tools/call", json!({"name": name, "arguments": arguments}));
        let result = reply
            .get("result")
            .unwrap_or_else(|| panic!("tools/call {name} failed at protocol level: {reply}"));
        let envelope = result["structuredContent"].clone();
        assert_eq!(
            result
                .get("isError")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            envelope["ok"] == json!(false),
            "isError must mirror ok: {result}"
        );
        if let Some(schemas) = &self.schemas {
            schemas.check(name, &envelope);
        }
        envelope
    }

    /// Calls a tool expecting success and returns `data`.
    pub fn ok(&mut self, name: &str, arguments: Value) -> Value {
        let envelope = self.call(name, arguments);
        assert_eq!(envelope["ok"], json!(true), "{name} failed: {envelope}");
        envelope["data"].clone()
    }

    /// Starts a generated scope (managed mode) and returns its id.
    pub fn start_scope(&mut self) -> String {
        self.ok("scope_start", json!({}))["scope_id"]
            .as_str()
            .expect("scope id")
            .to_string()
    }

    /// Calls a tool expecting failure and returns `error.kind`.
    pub fn err_kind(&mut self, name: &str, arguments: Value) -> String {
        let envelope = self.call(name, arguments);
        assert_eq!(
            envelope["ok"],
            json!(false),
            "{name} unexpectedly succeeded: {envelope}"
        );
        envelope["error"]["kind"]
            .as_str()
            .expect("kind")
            .to_string()
    }

    /// SIGKILLs the process (it is reaped on drop).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Starts `count` background runs of `command`, retrying while the global cap is
    /// full (slots of cancelled work come back asynchronously); panics with `why` when
    /// they do not fit within `bound`. Returns the operation ids.
    pub fn start_runs_when_free(
        &mut self,
        count: usize,
        command: &str,
        bound: Duration,
        why: &str,
    ) -> Vec<String> {
        let deadline = Instant::now() + bound;
        let mut ids = Vec::new();
        while ids.len() < count {
            let envelope = self.call("shell_run", json!({"command": command, "wait_ms": 0}));
            if envelope["ok"] == true {
                ids.push(
                    envelope["data"]["operation_id"]
                        .as_str()
                        .expect("operation id")
                        .to_string(),
                );
            } else {
                assert!(Instant::now() < deadline, "{why}: {envelope}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        ids
    }

    /// Closes stdin and waits (bounded) for a clean exit.
    pub fn close(mut self) -> ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "marsh-mcp did not exit after stdin EOF"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.group {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Host processes whose command line contains `marker` ("pid: cmdline" each).
pub fn host_processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmdline) = fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push(format!("{}: {text}", name.to_string_lossy()));
            }
        }
    }
    found
}

/// Polls `operation_get` until the operation ends.
pub fn wait_op(server: &mut Server, id: &str) -> Value {
    for _ in 0..40 {
        let data = server.ok(
            "operation_get",
            json!({"operation_id": id, "wait_ms": 5000}),
        );
        if data["wait_result"] == "ended" {
            return data;
        }
    }
    panic!("operation {id} did not end");
}

pub fn decode_b64(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

/// splitmix64: a small seedable generator, the same on every machine, for the seeded
/// harnesses (the fuzzer and the fault injection) whose seeds must replay exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform enough below `n` (at least 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// The seed a harness prints first: `var` when set, else the clock.
    pub fn seed_from(var: &str) -> u64 {
        std::env::var(var)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            })
    }
}
