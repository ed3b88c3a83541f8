//! The MCP Inspector's CLI (`@modelcontextprotocol/inspector`, installed by `make
//! npm-clients`) drives `marsh-mcp serve --home` over stdio: it lists the tools and
//! calls `shell_run` with the optional integer and boolean arguments typed from the
//! command line. Its TypeScript SDK client validates every `structuredContent` against
//! the tool's `outputSchema` (successful results only; a schema it cannot compile is
//! skipped, not reported), so a result that does not match fails these tests.
//!
//! `--cli` mode is a plain stdio client: no browser, no listening port. Each Inspector
//! run is one fresh server process (one session), so nothing here relies on an
//! operation surviving from one run to the next. A two-line `tee` wrapper between the
//! Inspector and the server records the frames the Inspector sent, so the tests can
//! check the JSON types of the arguments on the wire.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, TOOLS, decode_b64, npm_bin};
use serde_json::Value;

/// How long one Inspector run may take before it is killed and the test fails.
const RUN_BOUND: Duration = Duration::from_secs(90);

/// One sandbox plus the wire log of the Inspector runs against it.
struct Inspected {
    sb: Sandbox,
    wrapper: PathBuf,
    wire: PathBuf,
    runs: usize,
}

impl Inspected {
    fn new() -> Self {
        let sb = Sandbox::new();
        // `tee` copies what the Inspector writes to the server's stdin into the log.
        let wrapper = sb.state().join("wire-tee.sh");
        fs::write(
            &wrapper,
            "#!/bin/sh\nlog=\"$1\"; shift\ntee -a \"$log\" | \"$@\"\n",
        )
        .unwrap();
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
        let wire = sb.state().join("wire.jsonl");
        Self {
            sb,
            wrapper,
            wire,
            runs: 0,
        }
    }

    /// `mcp-inspector --cli --format json <tee> <log> marsh-mcp serve --home … <args>`:
    /// the JSON object the Inspector printed on stdout. The server gets the sandbox's
    /// environment through `-e` (the SDK's stdio transport passes only a default set).
    fn run(&mut self, args: &[&str]) -> Value {
        self.runs += 1;
        let out_path = self.sb.state().join(format!("inspector-{}.out", self.runs));
        let err_path = self.sb.state().join(format!("inspector-{}.err", self.runs));
        let user = self.sb.state().join("user");
        let mut cmd = Command::new(npm_bin("mcp-inspector"));
        cmd.args(["--cli", "--format", "json"])
            .arg("-e")
            .arg(format!("SBX_SHIM_STATE={}", self.sb.sbx_state().display()))
            .arg("-e")
            .arg(format!(
                "XDG_RUNTIME_DIR={}",
                self.sb.runtime_base().display()
            ))
            .arg(&self.wrapper)
            .arg(&self.wire)
            .arg(self.sb.prefix.bin("marsh-mcp"))
            .args(self.sb.serve_home_args(&[]))
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            // The Inspector's own files (catalog, client config) stay in the fake home.
            .env("HOME", &user)
            .env("MCP_AUTO_OPEN_ENABLED", "false")
            .env("NO_COLOR", "1")
            .current_dir(self.sb.workspace())
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out_path).unwrap())
            .stderr(fs::File::create(&err_path).unwrap())
            // Its own process group: the Inspector, the wrapper and the server are
            // killed together if the run overstays.
            .process_group(0);
        let mut child = cmd.spawn().expect("spawn mcp-inspector");
        let group = nix::unistd::Pid::from_raw(child.id() as i32);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if started.elapsed() > RUN_BOUND {
                break None;
            }
            std::thread::sleep(Duration::from_millis(25));
        };
        // Whatever of the group is left (nothing, normally) goes with the run.
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        if status.is_none() {
            let _ = child.wait();
        }
        let stdout = fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = fs::read_to_string(&err_path).unwrap_or_default();
        let status = status.unwrap_or_else(|| {
            panic!("mcp-inspector {args:?} ran over {RUN_BOUND:?}; stderr: {stderr}")
        });
        assert!(
            status.success(),
            "mcp-inspector {args:?} failed ({status}); stdout: {stdout}; stderr: {stderr}"
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
            panic!("stdout is not one JSON object ({e}): {stdout:?}; stderr: {stderr}")
        })
    }

    /// `tools/call` of `shell_run` with `--tool-arg` pairs; the `structuredContent`
    /// after checking it is `{ok: true}` and described in the readable text content.
    fn shell_run(&mut self, tool_args: &[&str]) -> Value {
        let mut args = vec!["--method", "tools/call", "--tool-name", "shell_run"];
        for pair in tool_args {
            args.extend(["--tool-arg", pair]);
        }
        let out = self.run(&args);
        let result = &out["result"];
        assert_eq!(result["isError"], false, "{out}");
        let structured = &result["structuredContent"];
        assert_eq!(structured["ok"], true, "{out}");
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        let id = structured["data"]["operation_id"].as_str().unwrap_or("?");
        assert!(
            text.starts_with("shell_run ") && text.lines().next().unwrap_or("").contains(id),
            "the text's first line names the tool and the operation: {out}"
        );
        structured["data"].clone()
    }

    /// The `arguments` of every `tools/call` the Inspector sent, in order.
    fn sent_arguments(&self) -> Vec<Value> {
        fs::read_to_string(&self.wire)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|m| m["method"] == "tools/call")
            .map(|m| m["params"]["arguments"].clone())
            .collect()
    }

    fn home(&self) -> PathBuf {
        self.sb.home()
    }
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The server ran on this test's own legacy home (created owner-only at startup).
fn assert_used(home: &Path) {
    let mode = fs::metadata(home).map(|m| m.permissions().mode() & 0o777);
    assert_eq!(mode.ok(), Some(0o700), "the server used the test home");
}

#[test]
fn inspector_cli_lists_all_23_tools_with_titles() {
    let mut t = Inspected::new();
    let out = t.run(&["--method", "tools/list"]);
    let tools = out["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{out}"));
    let mut names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    names.sort_unstable();
    let mut expected = TOOLS.to_vec();
    expected.sort_unstable();
    assert_eq!(names, expected);
    for tool in tools {
        let title = tool["title"].as_str().unwrap_or_default();
        assert!(!title.trim().is_empty(), "a tool without a title: {tool}");
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert!(tool["outputSchema"].is_object(), "{tool}");
    }
    // The optional knobs are plain JSON Schema types a generic client can coerce to.
    let shell_run = tools.iter().find(|t| t["name"] == "shell_run").unwrap();
    let props = &shell_run["inputSchema"]["properties"];
    for integer in ["wait_ms", "timeout_ms", "max_bytes"] {
        assert_eq!(props[integer]["type"], "integer", "{integer}: {props}");
    }
    assert_eq!(props["include_base64"]["type"], "boolean", "{props}");
    assert_used(&t.home());
}

#[test]
fn inspector_cli_shell_run_takes_typed_optional_arguments() {
    let mut t = Inspected::new();

    // (2) A quick command within wait_ms: the whole result inline (a generous wait: the
    // first command of a fresh server on a loaded machine).
    let quick = t.shell_run(&["command=printf inspector-hi", "wait_ms=30000"]);
    assert_eq!(quick["state"], "succeeded", "{quick}");
    assert_eq!(quick["exit_code"], 0, "{quick}");
    assert_eq!(quick["stdout_text"], "inspector-hi", "{quick}");

    // (3) A long command with wait_ms=500: answered while it runs, with an operation id.
    // Had the 500 been refused or ignored, this would be an error or a 3 s inline result.
    let long = t.shell_run(&["command=sleep 3; echo late", "wait_ms=500"]);
    assert_eq!(long["state"], "running", "{long}");
    assert!(long["operation_id"].as_str().is_some_and(is_uuid), "{long}");
    assert!(long["exit_code"].is_null(), "{long}");

    // (5) include_base64=true: the base64 view decodes to the exact bytes.
    let b64 = t.shell_run(&[r"command=printf 'a\001b\n'", "include_base64=true"]);
    assert_eq!(b64["state"], "succeeded", "{b64}");
    let encoded = b64["stdout_base64"]
        .as_str()
        .unwrap_or_else(|| panic!("{b64}"));
    assert_eq!(decode_b64(encoded), b"a\x01b\n");

    // On the wire the optional arguments were JSON integers and booleans, not strings.
    let sent = t.sent_arguments();
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[0]["command"], "printf inspector-hi");
    assert!(
        sent[0]["wait_ms"].is_u64() && sent[0]["wait_ms"] == 30000,
        "{sent:?}"
    );
    assert!(
        sent[1]["wait_ms"].is_u64() && sent[1]["wait_ms"] == 500,
        "{sent:?}"
    );
    assert_eq!(sent[2]["include_base64"], Value::Bool(true), "{sent:?}");
    assert_used(&t.home());
}

#[test]
fn inspector_cli_sees_a_timeout_inline() {
    let mut t = Inspected::new();
    // (4) Operations belong to one session and every Inspector run is a new one, so the
    // call waits longer than the timeout and the inline result carries the outcome (a
    // broken timeout would answer `succeeded` after 5 s).
    let out = t.shell_run(&["command=sleep 5", "timeout_ms=1000", "wait_ms=30000"]);
    assert_eq!(out["state"], "timed_out", "{out}");
    assert_eq!(out["timeout_ms"], 1000, "{out}");
    assert_eq!(out["error"]["kind"], "timed_out", "{out}");
    assert!(out["operation_id"].as_str().is_some_and(is_uuid), "{out}");
    let sent = t.sent_arguments();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        sent[0]["timeout_ms"].is_u64() && sent[0]["timeout_ms"] == 1000,
        "{sent:?}"
    );
    assert!(
        sent[0]["wait_ms"].is_u64() && sent[0]["wait_ms"] == 30000,
        "{sent:?}"
    );
    assert_used(&t.home());
}
