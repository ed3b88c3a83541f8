//! Shared harness: one temp home + workspace per test, `marsh` spawned with a cleared
//! environment, and the daemon it starts killed by pid when the test ends.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const MARSH: &str = env!("CARGO_BIN_EXE_marsh");
pub const MARSHD: &str = env!("CARGO_BIN_EXE_marshd");

/// `name` as `make install` ships it: built without the `test-hooks` feature, kept by
/// `make build-debug` in `target/shipped` beside the target directory's profiles.
pub fn shipped_bin(name: &str) -> PathBuf {
    let path = Path::new(MARSH)
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("shipped")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: `make build-debug` builds it",
        path.display()
    );
    path
}

/// The `sbx` stand-in, a binary of the `sbx-stand-in` crate: beside `marsh` in the
/// target directory (`cargo test --workspace` and `make build-debug` build it).
pub fn sbx_bin() -> PathBuf {
    let path = Path::new(MARSH).with_file_name("sbx");
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p sbx-stand-in`",
        path.display()
    );
    path
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    pub ws: PathBuf,
    pub user_home: PathBuf,
    /// The `marsh` that [`Env::cmd`] runs.
    pub marsh: PathBuf,
    extra_env: Vec<(String, String)>,
}

/// An installation directory of its own: links to (or copies of) the built `marsh`,
/// `marshd` and `sbx`, and optionally a stand-in `marsh-mcp` script (publication
/// registers the `marsh-mcp` beside `marsh`; the build directory's may not exist).
pub struct Bin {
    pub dir: tempfile::TempDir,
}

impl Bin {
    pub fn new(with_marsh_mcp: bool) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sbx = sbx_bin();
        for (name, built) in [
            ("marsh", Path::new(MARSH)),
            ("marshd", Path::new(MARSHD)),
            ("sbx", &sbx),
        ] {
            let target = dir.path().join(name);
            if std::fs::hard_link(built, &target).is_err() {
                std::fs::copy(built, &target).unwrap();
            }
        }
        if with_marsh_mcp {
            let script = dir.path().join("marsh-mcp");
            std::fs::write(&script, "#!/bin/sh\necho stand-in marsh-mcp \"$@\"\n").unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        Self { dir }
    }

    /// The canonical path of `name` in this directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().canonicalize().unwrap().join(name)
    }
}

impl Env {
    pub fn new() -> Self {
        Self::with_base(tempfile::tempdir().unwrap())
    }

    pub fn with_base(dir: tempfile::TempDir) -> Self {
        let home = dir.path().join("home");
        let ws = dir.path().join("ws");
        let user_home = dir.path().join("user");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::create_dir_all(&user_home).unwrap();
        let ws = ws.canonicalize().unwrap();
        let env = Self {
            dir,
            home,
            ws,
            user_home,
            marsh: PathBuf::from(MARSH),
            extra_env: Vec::new(),
        };
        // Safety net: a daemon a failed test leaves behind exits by itself.
        env.settings(r#"{"idle_secs": 60}"#);
        env
    }

    /// Replaces the per-user backend settings (`~/.config/marsh-shim/backend.json`).
    pub fn settings(&self, json: &str) {
        let dir = self.user_home.join(".config/marsh-shim");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("backend.json"), json).unwrap();
    }

    pub fn set_env(&mut self, name: &str, value: &str) {
        self.extra_env.push((name.into(), value.into()));
    }

    /// `marsh` with a cleared environment, cwd = the workspace.
    pub fn cmd(&self) -> Command {
        self.cmd_with(&self.marsh, &[])
    }

    /// `program ARGS` with the environment and cwd `marsh` gets from [`Env::cmd`].
    pub fn cmd_with(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.user_home)
            .env("MARSH_HOME", &self.home)
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.ws)
            .stdin(Stdio::null());
        cmd
    }

    pub fn marsh(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }

    pub fn run(&self, script: &str) -> Output {
        self.marsh(&["-c", script])
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.cmd()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.marsh(args);
        assert!(
            out.status.success(),
            "marsh {args:?} failed: {}",
            stderr(&out)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn status(&self) -> Value {
        self.json(&["status", "--json"])
    }

    pub fn daemon_pid(&self) -> Option<u32> {
        self.status()["daemon"]["pid"].as_u64().map(|p| p as u32)
    }

    /// Polls `status` until `pred` holds (bounded).
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = self.status();
            if pred(&status) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {status}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn write_kit(&self, name: &str, command: &[&str]) {
        let dir = self.home.join("kits");
        std::fs::create_dir_all(&dir).unwrap();
        let def = serde_json::json!({ "command": command, "description": "test kit" });
        std::fs::write(dir.join(format!("{name}.json")), def.to_string()).unwrap();
    }

    pub fn inject(&self, kind: &str, verb: &str, content: &str) {
        let dir = self.home.join(".shim").join(kind);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(verb), content).unwrap();
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Kill the daemon this test started, by the pid it recorded; its sandboxes die
        // with it (--die-with-parent).
        if let Ok(text) = std::fs::read_to_string(self.home.join("daemon/pid"))
            && let Ok(pid) = text.trim().parse::<i32>()
            && is_daemon_of(pid as u32, &self.home)
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            wait_gone(pid as u32);
        }
    }
}

fn is_daemon_of(pid: u32, home: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let home = home.canonicalize().unwrap_or_else(|_| home.to_path_buf());
    let text = String::from_utf8_lossy(&cmdline);
    text.contains("serve") && text.contains(&*home.to_string_lossy())
}

/// Fails the test when procfs is missing: without it no process could ever be seen
/// alive, and every "it is gone" check would pass blind.
fn require_procfs() {
    assert!(
        Path::new("/proc/self/stat").exists(),
        "these tests need /proc (procfs) to observe processes"
    );
}

pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => {
            require_procfs();
            false
        }
    }
}

pub fn wait_gone(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        assert!(Instant::now() < deadline, "pid {pid} did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True while any process's command line contains `needle` (used to prove a job died).
pub fn process_with_cmdline(needle: &str) -> bool {
    require_procfs();
    let entries = std::fs::read_dir("/proc").expect("reading /proc");
    entries.flatten().any(|e| {
        let pid: Option<u32> = e.file_name().to_str().and_then(|s| s.parse().ok());
        pid.is_some_and(|pid| {
            alive(pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| {
                        String::from_utf8_lossy(&c)
                            .replace('\0', " ")
                            .contains(needle)
                    })
                    .unwrap_or(false)
        })
    })
}

pub fn wait_no_process(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_with_cmdline(needle) {
        assert!(
            Instant::now() < deadline,
            "a process running {needle:?} survived"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}
