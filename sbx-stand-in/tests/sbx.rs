//! Black-box tests of the `sbx` stand-in.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const SBX: &str = env!("CARGO_BIN_EXE_sbx");

fn sbx(dir: &std::path::Path, extra: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    // A private state file unless the test names one: the default is under the
    // passwd home, which a test never touches.
    Command::new(SBX)
        .env_clear()
        .env("HOME", dir)
        .env("SBX_SHIM_STATE", dir.join("default-state.json"))
        .envs(extra.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn version() {
    let dir = tempfile::tempdir().unwrap();
    let out = sbx(dir.path(), &[], &["version"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("sbx version ") && text.trim_end().ends_with("(marsh-shim)"),
        "{text}"
    );
}

#[test]
fn ls_reads_the_state_file_locations() {
    let dir = tempfile::tempdir().unwrap();
    let ls = |extra: &[(&str, &str)]| {
        let out = sbx(dir.path(), extra, &["ls", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let explicit = dir.path().join("explicit.json");
    let explicit_s = explicit.to_str().unwrap();
    assert_eq!(
        ls(&[("SBX_SHIM_STATE", explicit_s)]),
        serde_json::json!({"sandboxes": []}),
        "a missing file means none"
    );
    std::fs::write(&explicit, r#"{"sandboxes":[{"name":"e"}]}"#).unwrap();

    // SBX_SHIM_STATE wins over anything else; without it the file is under the passwd
    // home, never `$HOME` or `$XDG_STATE_HOME` (`sbx::tests::state_path_precedence`: a
    // black-box check would have to read the real home).
    let xdg = dir.path().join("xdg");
    let xdg_s = xdg.to_str().unwrap();
    assert_eq!(
        ls(&[("XDG_STATE_HOME", xdg_s), ("SBX_SHIM_STATE", explicit_s)]),
        serde_json::json!({"sandboxes": [{"name": "e"}]})
    );

    let out = sbx(dir.path(), &[], &["bogus"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Runs `sbx ARGS` with the state file at `state` (plus `extra` env), stdin empty.
fn mcp(state: &Path, extra: &[(&str, &str)], args: &[&str]) -> Output {
    let home = state.parent().unwrap();
    let mut all = vec![("SBX_SHIM_STATE", state.to_str().unwrap())];
    all.extend_from_slice(extra);
    sbx(home, &all, args)
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).unwrap()
}

#[track_caller]
fn ok(out: Output) -> Output {
    assert!(
        out.status.success(),
        "status {:?}, stderr {}",
        out.status,
        stderr(&out)
    );
    out
}

#[track_caller]
fn fails(out: &Output, code: i32, stderr_text: &str) {
    assert_eq!(out.status.code(), Some(code), "stderr {}", stderr(out));
    assert_eq!(stderr(out), stderr_text);
    assert!(out.stdout.is_empty(), "stdout {}", stdout(out));
}

fn ls_json(state: &Path) -> Value {
    serde_json::from_slice(&ok(mcp(state, &[], &["mcp", "ls", "--json"])).stdout).unwrap()
}

#[test]
fn mcp_add_ls_inspect_rm() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state/sbx.json");
    assert_eq!(ls_json(&state), json!({"servers": []}));
    assert_eq!(stdout(&ok(mcp(&state, &[], &["mcp", "ls"]))), "");

    let out = ok(mcp(
        &state,
        &[],
        &[
            "mcp",
            "add",
            "srv",
            "--command",
            "/bin/echo",
            "--args",
            "a,b c,,-d",
            "--dir",
            "/tmp",
        ],
    ));
    assert_eq!(stdout(&out), "MCP server \"srv\" added\n");
    ok(mcp(
        &state,
        &[],
        &["mcp", "add", "two", "--command=npx", "--args="],
    ));

    let dup = mcp(
        &state,
        &[],
        &["mcp", "add", "srv", "--command", "/bin/true"],
    );
    fails(&dup, 1, "MCP server \"srv\" already exists\n");

    let srv = json!({
        "name": "srv", "command": "/bin/echo", "args": ["a", "b c", "", "-d"],
        "dir": "/tmp", "loaded": [],
    });
    let two = json!({"name": "two", "command": "npx", "args": [], "dir": null, "loaded": []});
    assert_eq!(ls_json(&state), json!({"servers": [srv, two]}));
    let text = stdout(&ok(mcp(&state, &[], &["mcp", "ls"])));
    assert_eq!(
        text,
        "srv\t/bin/echo a 'b c' '' -d\t/tmp\t-\ntwo\tnpx\t-\t-\n"
    );
    for args in [
        &["mcp", "inspect", "srv"][..],
        &["mcp", "inspect", "srv", "--json"],
    ] {
        let out = ok(mcp(&state, &[], args));
        assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap(), srv);
    }

    // The file itself has the documented shape.
    let file: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(file["mcp"]["srv"]["args"], json!(["a", "b c", "", "-d"]));
    assert!(dir.path().join("state/sbx.json.lock").exists());

    let out = ok(mcp(&state, &[], &["mcp", "rm", "srv"]));
    assert_eq!(stdout(&out), "MCP server \"srv\" removed\n");
    assert_eq!(ls_json(&state), json!({"servers": [two]}));

    for args in [
        &["mcp", "rm", "srv"][..],
        &["mcp", "rm", "srv", "--force"],
        &["mcp", "inspect", "srv"],
        &["mcp", "inspect", "srv", "--json"],
        &["mcp", "load", "srv", "--sandbox", "s1"],
        &["mcp", "unload", "srv", "--sandbox", "s1"],
        &["mcp", "gateway-exec", "srv", "--sandbox", "s1"],
    ] {
        fails(&mcp(&state, &[], args), 1, "MCP server \"srv\" not found\n");
    }
}

#[test]
fn mcp_relative_dir_is_made_absolute() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let out = Command::new(SBX)
        .env_clear()
        .env("SBX_SHIM_STATE", &state)
        .current_dir(dir.path())
        .args(["mcp", "add", "rel", "--command", "x", "--dir", "sub"])
        .output()
        .unwrap();
    ok(out);
    let entry = &ls_json(&state)["servers"][0];
    assert_eq!(
        entry["dir"],
        json!(dir.path().join("sub").to_str().unwrap())
    );
}

#[test]
fn mcp_keeps_existing_state() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    std::fs::write(&state, r#"{"sandboxes":[{"name":"dev"}],"other":{"k":1}}"#).unwrap();
    assert_eq!(ls_json(&state), json!({"servers": []}));
    ok(mcp(&state, &[], &["mcp", "add", "a", "--command", "x"]));
    let file: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(file["other"], json!({"k": 1}));
    let out = ok(mcp(&state, &[], &["ls", "--json"]));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        json!({"sandboxes": [{"name": "dev"}]})
    );
}

#[test]
fn mcp_load_unload_and_rm_of_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    ok(mcp(
        &state,
        &[],
        &["mcp", "add", "srv", "--command", "/bin/echo"],
    ));
    let out = ok(mcp(&state, &[], &["mcp", "load", "srv", "--sandbox", "s2"]));
    assert_eq!(
        stdout(&out),
        "MCP server \"srv\" loaded into sandbox \"s2\"\n"
    );
    ok(mcp(&state, &[], &["mcp", "load", "srv", "--sandbox=s1"]));
    ok(mcp(&state, &[], &["mcp", "load", "--sandbox", "s2", "srv"]));
    assert_eq!(ls_json(&state)["servers"][0]["loaded"], json!(["s1", "s2"]));

    let out = mcp(&state, &[], &["mcp", "rm", "srv"]);
    fails(
        &out,
        1,
        "sbx: MCP server \"srv\" is loaded into sandboxes: s1, s2; use --force to remove it anyway\n",
    );
    assert_eq!(ls_json(&state)["servers"].as_array().unwrap().len(), 1);

    let out = ok(mcp(
        &state,
        &[],
        &["mcp", "unload", "srv", "--sandbox", "s2"],
    ));
    assert_eq!(
        stdout(&out),
        "MCP server \"srv\" unloaded from sandbox \"s2\"\n"
    );
    ok(mcp(
        &state,
        &[],
        &["mcp", "unload", "srv", "--sandbox", "s2"],
    ));
    assert_eq!(ls_json(&state)["servers"][0]["loaded"], json!(["s1"]));

    ok(mcp(&state, &[], &["mcp", "rm", "srv", "--force"]));
    assert_eq!(ls_json(&state), json!({"servers": []}));
}

#[test]
fn mcp_gateway_exec_runs_the_loaded_registration() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let work_s = work.to_str().unwrap();
    ok(mcp(
        &state,
        &[],
        &[
            "mcp",
            "add",
            "echo",
            "--command",
            "/bin/echo",
            "--args",
            "a,b",
        ],
    ));
    let script = "pwd; echo \"$SBX_TEST_VAR\"; cat";
    let sh_args = format!("-c,{script}");
    ok(mcp(
        &state,
        &[],
        &[
            "mcp",
            "add",
            "sh",
            "--command",
            "/bin/sh",
            "--args",
            &sh_args,
            "--dir",
            work_s,
        ],
    ));

    let not_loaded = mcp(
        &state,
        &[],
        &["mcp", "gateway-exec", "echo", "--sandbox", "s1"],
    );
    fails(
        &not_loaded,
        1,
        "sbx: MCP server \"echo\" is not loaded into sandbox \"s1\"\n",
    );

    ok(mcp(
        &state,
        &[],
        &["mcp", "load", "echo", "--sandbox", "s1"],
    ));
    let out = ok(mcp(
        &state,
        &[],
        &["mcp", "gateway-exec", "echo", "--sandbox", "s1"],
    ));
    assert_eq!(stdout(&out), "a b\n");
    let other = mcp(
        &state,
        &[],
        &["mcp", "gateway-exec", "echo", "--sandbox", "s2"],
    );
    assert_eq!(other.status.code(), Some(1));

    // dir, the caller's environment and stdio all reach the server.
    ok(mcp(&state, &[], &["mcp", "load", "sh", "--sandbox", "s1"]));
    let mut child = Command::new(SBX)
        .env_clear()
        .env("SBX_SHIM_STATE", &state)
        .env("SBX_TEST_VAR", "from-caller")
        .args(["mcp", "gateway-exec", "sh", "--sandbox", "s1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"ping\n").unwrap();
    let out = ok(child.wait_with_output().unwrap());
    let canonical = std::fs::canonicalize(&work).unwrap();
    assert_eq!(
        stdout(&out),
        format!("{}\nfrom-caller\nping\n", canonical.display())
    );

    // A command that cannot run is reported, exit 1.
    ok(mcp(
        &state,
        &[],
        &["mcp", "add", "gone", "--command", "/nonexistent/x"],
    ));
    ok(mcp(
        &state,
        &[],
        &["mcp", "load", "gone", "--sandbox", "s1"],
    ));
    let out = mcp(
        &state,
        &[],
        &["mcp", "gateway-exec", "gone", "--sandbox", "s1"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("sbx: cannot execute \"/nonexistent/x\""));
}

#[test]
fn mcp_concurrent_updates_are_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    ok(mcp(
        &state,
        &[],
        &["mcp", "add", "shared", "--command", "x"],
    ));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let state = state.clone();
            std::thread::spawn(move || {
                let name = format!("srv-{i}");
                ok(mcp(&state, &[], &["mcp", "add", &name, "--command", "x"]));
                let sandbox = format!("sb-{i}");
                ok(mcp(
                    &state,
                    &[],
                    &["mcp", "load", "shared", "--sandbox", &sandbox],
                ));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let servers = ls_json(&state)["servers"].as_array().unwrap().clone();
    let names: Vec<&str> = servers
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    let mut expected = vec!["shared".to_string()];
    expected.extend((0..8).map(|i| format!("srv-{i}")));
    expected.sort();
    assert_eq!(names, expected);
    let loaded = &servers.iter().find(|s| s["name"] == "shared").unwrap()["loaded"];
    let want: Vec<String> = (0..8).map(|i| format!("sb-{i}")).collect();
    assert_eq!(loaded, &json!(want));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn mcp_failure_injection() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    ok(mcp(&state, &[], &["mcp", "add", "srv", "--command", "x"]));
    let fail = [("SBX_SHIM_FAIL", "rm")];
    fails(
        &mcp(&state, &fail, &["mcp", "rm", "srv"]),
        1,
        "sbx: injected failure: rm\n",
    );
    // Before anything else: even before argument checks.
    fails(
        &mcp(&state, &fail, &["mcp", "rm"]),
        1,
        "sbx: injected failure: rm\n",
    );
    assert_eq!(ls_json(&state)["servers"].as_array().unwrap().len(), 1);
    ok(mcp(&state, &fail, &["mcp", "inspect", "srv"]));
    let both = [("SBX_SHIM_FAIL", "load,add")];
    fails(
        &mcp(&state, &both, &["mcp", "add", "b", "--command", "x"]),
        1,
        "sbx: injected failure: add\n",
    );
    fails(
        &mcp(&state, &both, &["mcp", "load", "srv", "--sandbox", "s"]),
        1,
        "sbx: injected failure: load\n",
    );
    ok(mcp(&state, &fail, &["ls", "--json"]));
}

/// What `make install` ships (built without the `test-hooks` feature, kept by `make
/// build-debug` in `target/shipped`) ignores `SBX_SHIM_FAIL`.
#[test]
fn the_shipped_build_ignores_failure_injection() {
    let shipped = Path::new(SBX)
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("shipped/sbx");
    assert!(
        shipped.exists(),
        "{} is missing: `make build-debug` builds it",
        shipped.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    let out = Command::new(&shipped)
        .env_clear()
        .env("HOME", dir.path())
        .env("SBX_SHIM_STATE", &state)
        .env("SBX_SHIM_FAIL", "add")
        .args(["mcp", "add", "srv", "--command", "x"])
        .output()
        .unwrap();
    ok(out);
    assert_eq!(ls_json(&state)["servers"].as_array().unwrap().len(), 1);
}

#[test]
fn mcp_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    for args in [
        &["mcp"][..],
        &["mcp", "bogus"],
        &["mcp", "ls", "--bogus"],
        &["mcp", "add", "srv"],
        &[
            "mcp",
            "add",
            "srv",
            "--command",
            "x",
            "--args",
            "a",
            "--args",
            "b",
        ],
        &["mcp", "add", "bad name", "--command", "x"],
        &["mcp", "rm", "srv", "extra"],
        &["mcp", "load", "srv"],
        &["mcp", "load", "srv", "--sandbox", "bad/sb"],
    ] {
        let out = mcp(&state, &[], args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stderr(&out).contains("usage: sbx mcp add"), "{args:?}");
    }
    assert!(!state.exists(), "usage errors write nothing");
    let help = ok(mcp(&state, &[], &["mcp", "--help"]));
    assert!(stdout(&help).starts_with("usage: sbx mcp add"));
}

/// The state file as JSON.
fn state_json(state: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(state).unwrap()).unwrap()
}

/// `/bin/echo WORDS` registered as `srv` (replacing any registration of that name).
fn register_echo(state: &Path, words: &str) {
    let _ = mcp(state, &[], &["mcp", "rm", "srv", "--force"]);
    ok(mcp(
        state,
        &[],
        &[
            "mcp",
            "add",
            "srv",
            "--command",
            "/bin/echo",
            "--args",
            words,
        ],
    ));
}

fn launched(state: &Path, sandbox: &str) -> Output {
    mcp(
        state,
        &[],
        &["mcp", "gateway-exec", "srv", "--sandbox", sandbox],
    )
}

#[test]
fn mcp_a_loaded_sandbox_keeps_its_definition_across_rm_and_add() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    register_echo(&state, "old");
    ok(mcp(&state, &[], &["mcp", "load", "srv", "--sandbox", "s1"]));
    assert_eq!(
        state_json(&state)["loads"],
        json!({"s1": {"srv": {"command": "/bin/echo", "args": ["old"], "dir": null}}}),
        "the load is a snapshot of the definition"
    );

    // Without --force a loaded registration is still refused, and nothing changes.
    let before = std::fs::read(&state).unwrap();
    fails(
        &mcp(&state, &[], &["mcp", "rm", "srv"]),
        1,
        "sbx: MCP server \"srv\" is loaded into sandboxes: s1; use --force to remove it anyway\n",
    );
    assert_eq!(std::fs::read(&state).unwrap(), before);

    // rm --force + add of another definition: what `marsh-mcp install sbx` does.
    register_echo(&state, "new");
    assert_eq!(ls_json(&state)["servers"][0]["loaded"], json!([]));
    assert_eq!(
        stdout(&ok(launched(&state, "s1"))),
        "old\n",
        "s1 keeps its load"
    );
    fails(
        &launched(&state, "s2"),
        1,
        "sbx: MCP server \"srv\" is not loaded into sandbox \"s2\"\n",
    );
    ok(mcp(&state, &[], &["mcp", "load", "srv", "--sandbox", "s2"]));
    assert_eq!(
        stdout(&ok(launched(&state, "s2"))),
        "new\n",
        "a new load gets the new one"
    );
    assert_eq!(stdout(&ok(launched(&state, "s1"))), "old\n");

    // Even with no registration left, s1 still launches what it loaded; s2 too.
    ok(mcp(&state, &[], &["mcp", "rm", "srv", "--force"]));
    assert_eq!(ls_json(&state), json!({"servers": []}));
    assert_eq!(stdout(&ok(launched(&state, "s1"))), "old\n");
    assert_eq!(stdout(&ok(launched(&state, "s2"))), "new\n");
    fails(&launched(&state, "s3"), 1, "MCP server \"srv\" not found\n");
    fails(
        &mcp(&state, &[], &["mcp", "load", "srv", "--sandbox", "s1"]),
        1,
        "MCP server \"srv\" not found\n",
    );

    // Reloading replaces the sandbox's snapshot with the current definition.
    register_echo(&state, "newest");
    ok(mcp(&state, &[], &["mcp", "load", "srv", "--sandbox", "s1"]));
    assert_eq!(stdout(&ok(launched(&state, "s1"))), "newest\n");
    assert_eq!(stdout(&ok(launched(&state, "s2"))), "new\n");

    // unload drops the sandbox's snapshot, registered or not; then it is never loaded.
    ok(mcp(
        &state,
        &[],
        &["mcp", "unload", "srv", "--sandbox", "s2"],
    ));
    fails(
        &launched(&state, "s2"),
        1,
        "sbx: MCP server \"srv\" is not loaded into sandbox \"s2\"\n",
    );
    ok(mcp(&state, &[], &["mcp", "rm", "srv", "--force"]));
    ok(mcp(
        &state,
        &[],
        &["mcp", "unload", "srv", "--sandbox", "s1"],
    ));
    fails(&launched(&state, "s1"), 1, "MCP server \"srv\" not found\n");
    fails(
        &mcp(&state, &[], &["mcp", "unload", "srv", "--sandbox", "s1"]),
        1,
        "MCP server \"srv\" not found\n",
    );
    assert!(
        state_json(&state).get("loads").is_none(),
        "no snapshot left: {}",
        state_json(&state)
    );
}

#[test]
fn mcp_a_load_recorded_before_snapshots_is_launched_and_kept_by_rm_force() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.json");
    // A file written before `loads` existed: the load is in `loaded` only.
    std::fs::write(
        &state,
        r#"{"other":true,"mcp":{"srv":{"command":"/bin/echo","args":["legacy"],"dir":null,"loaded":["s1"],"color":"red"}}}"#,
    )
    .unwrap();
    assert_eq!(stdout(&ok(launched(&state, "s1"))), "legacy\n");
    // Loading again changes nothing visible but records the snapshot.
    ok(mcp(&state, &[], &["mcp", "load", "srv", "--sandbox", "s1"]));
    assert_eq!(state_json(&state)["loads"]["s1"]["srv"]["color"], "red");
    std::fs::write(
        &state,
        r#"{"other":true,"mcp":{"srv":{"command":"/bin/echo","args":["legacy"],"dir":null,"loaded":["s1"]}}}"#,
    )
    .unwrap();
    // rm --force snapshots it first, so the sandbox keeps it.
    register_echo(&state, "new");
    let file = state_json(&state);
    assert_eq!(file["other"], true);
    assert_eq!(file["loads"]["s1"]["srv"]["args"], json!(["legacy"]));
    assert_eq!(stdout(&ok(launched(&state, "s1"))), "legacy\n");
}
