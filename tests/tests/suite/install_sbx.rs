//! `marsh-mcp install sbx` against the stand-in sbx, `start`/`stop`, and several
//! "sandboxes" attached to one broker through the one registration.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server};
use serde_json::{Value, json};

/// Runs `marsh-mcp <args>` the way a user does: from the workspace, with a private
/// HOME (so the SBX root and the stand-in's state live in the sandbox).
fn run(sb: &Sandbox, args: &[&str], sbx: Option<&PathBuf>) -> (Option<i32>, String) {
    let sbx = sbx.cloned().unwrap_or_else(|| sb.prefix.bin("sbx"));
    let out = sb
        .marsh_mcp(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>(), &[])
        .env("MARSH_SBX", &sbx)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn sbx(sb: &Sandbox, args: &[&str]) -> std::process::Output {
    Command::new(sb.prefix.bin("sbx"))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", sb.state().join("user"))
        .env("XDG_RUNTIME_DIR", sb.runtime_base())
        .env("SBX_SHIM_STATE", sb.sbx_state())
        .current_dir(sb.workspace())
        .output()
        .unwrap()
}

fn server_name(sb: &Sandbox) -> String {
    let out = sbx(sb, &["mcp", "ls", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    listed["servers"][0]["name"].as_str().unwrap().to_string()
}

/// A "sandbox" attached through the gateway verb of the stand-in.
fn attach(sb: &Sandbox, name: &str, sandbox: &str) -> Server {
    let mut cmd = Command::new(sb.prefix.bin("sbx"));
    cmd.args(["mcp", "gateway-exec", name, "--sandbox", sandbox])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", sb.state().join("user"))
        .env("XDG_RUNTIME_DIR", sb.runtime_base())
        .env("SBX_SHIM_STATE", sb.sbx_state())
        .current_dir(sb.workspace());
    let mut server = Server::spawn(cmd);
    let init = server.initialize();
    assert!(init.get("result").is_some(), "{init}; {}", server.stderr());
    server
}

#[test]
fn install_registers_the_connect_proxy_and_sandboxes_share_one_broker() {
    let sb = Sandbox::new();
    let (code, stderr) = run(&sb, &["install", "sbx"], None);
    assert_eq!(code, Some(0), "{stderr}");
    let name = server_name(&sb);
    assert!(
        name.starts_with("marsh-dev-") && name.len() == "marsh-dev-".len() + 12,
        "{name}"
    );
    let inspected: Value =
        serde_json::from_slice(&sbx(&sb, &["mcp", "inspect", &name, "--json"]).stdout).unwrap();
    assert_eq!(
        inspected["command"],
        sb.prefix.bin("marsh-mcp").display().to_string()
    );
    assert_eq!(inspected["args"][0], "connect");
    assert_eq!(inspected["dir"], sb.workspace().display().to_string());
    // Reinstalling is safe and ends in the same definition.
    let (code, stderr) = run(&sb, &["install", "sbx"], None);
    assert_eq!(code, Some(0), "{stderr}");
    let again: Value =
        serde_json::from_slice(&sbx(&sb, &["mcp", "inspect", &name, "--json"]).stdout).unwrap();
    assert_eq!(again["args"], inspected["args"]);

    for sandbox in ["one", "two"] {
        assert!(
            sbx(&sb, &["mcp", "load", &name, "--sandbox", sandbox])
                .status
                .success()
        );
    }
    let mut one = attach(&sb, &name, "one");
    let mut two = attach(&sb, &name, "two");
    let scope = one.ok("scope_start", json!({}))["scope_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        two.ok("scope_list", json!({})).to_string().contains(&scope),
        "one broker, shared scopes"
    );

    // stop refuses while a sandbox is attached.
    let (code, stderr) = run(&sb, &["stop"], None);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("attached"), "{stderr}");

    // After the broker dies, start brings it back and both sandboxes work again.
    sb.kill_broker();
    for proxy in [&mut one, &mut two] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while proxy.try_wait().is_none() {
            assert!(Instant::now() < deadline, "proxy outlived its broker");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let (code, stderr) = run(&sb, &["start"], None);
    assert_eq!(code, Some(0), "{stderr}");
    let mut one = attach(&sb, &name, "one");
    let mut two = attach(&sb, &name, "two");
    assert!(one.ok("scope_list", json!({})).to_string().contains(&scope));
    assert_eq!(
        two.ok(
            "scope_run",
            json!({"scope_id": scope, "command": "echo back"})
        )["stdout_text"],
        "back\n"
    );
    drop((one, two));
    // The registration was never touched by start/stop.
    let after: Value =
        serde_json::from_slice(&sbx(&sb, &["mcp", "inspect", &name, "--json"]).stdout).unwrap();
    assert_eq!(after["args"], inspected["args"]);
    let (code, stderr) = run(&sb, &["uninstall", "sbx"], None);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!sbx(&sb, &["mcp", "inspect", &name]).status.success());
}

/// A fake sbx whose `mcp rm` answers with `message` and `code`; everything else fails.
fn fake_sbx(sb: &Sandbox, message: &str, code: i32) -> PathBuf {
    let dir = sb.state().join("fake-sbx");
    fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sbx");
    fs::write(
        &path,
        format!("#!/bin/sh\nif [ \"$1 $2\" = \"mcp rm\" ]; then echo '{message}' >&2; exit {code}; fi\necho \"unexpected: $*\" >> {}/calls\nexit 9\n", dir.display()),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn install_aborts_on_a_lookalike_not_found_or_any_other_remove_failure() {
    let sb = Sandbox::new();
    for (message, why) in [
        (
            "MCP server \"marsh-dev-000000000000\" not found",
            "lookalike name",
        ),
        ("error: cannot reach the sbx daemon", "transport failure"),
    ] {
        let fake = fake_sbx(&sb, message, 1);
        let (code, stderr) = run(&sb, &["install", "sbx"], Some(&fake));
        assert_eq!(code, Some(1), "{why}: {stderr}");
        assert!(stderr.contains("nothing was added"), "{why}: {stderr}");
        assert!(
            !sb.state().join("fake-sbx/calls").exists(),
            "{why}: add must not run"
        );
        let _ = run(&sb, &["stop"], Some(&fake));
    }
}

#[test]
fn install_refuses_inside_a_marsh_guest_and_values_with_commas() {
    let sb = Sandbox::new();
    let out = sb
        .marsh_mcp(
            &["install".to_string(), "sbx".to_string()],
            &[("MARSHD_TOKEN", "x")],
        )
        .env("MARSH_SBX", sb.prefix.bin("sbx"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("inside a marsh guest"));
    let comma = sb.state().join("a,b");
    fs::create_dir(&comma).unwrap();
    fs::copy(sb.prefix.bin("sbx"), comma.join("sbx")).unwrap();
    let (code, stderr) = run(&sb, &["install", "sbx"], Some(&comma.join("sbx")));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("comma"), "{stderr}");
}

#[test]
fn marsh_mcp_subcommand_of_the_stand_in_reaches_the_installer() {
    let sb = Sandbox::new();
    let out = Command::new(sb.prefix.bin("marsh"))
        .args(["mcp", "install", "sbx"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", sb.state().join("user"))
        .env("XDG_RUNTIME_DIR", sb.runtime_base())
        .env("SBX_SHIM_STATE", sb.sbx_state())
        .env("MARSH_SBX", sb.prefix.bin("sbx"))
        .current_dir(sb.workspace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(server_name(&sb).starts_with("marsh-dev-"));
}

/// The registration `name` as `sbx mcp inspect` shows it.
fn inspect(sb: &Sandbox, name: &str) -> Value {
    let out = sbx(sb, &["mcp", "inspect", name, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The executable an attached session runs (the `sbx` process exec'd into it).
fn exe_of(server: &Server) -> PathBuf {
    fs::read_link(format!("/proc/{}/exe", server.pid())).unwrap()
}

/// Another path for the same `marsh-mcp` build (a hard link, else a copy) beside a
/// symlink to the prefix's `marsh`, which installs canonicalize back to the same pin:
/// an install run from it pins the same broker but registers another command.
fn relocated_marsh_mcp(sb: &Sandbox) -> PathBuf {
    let dir = sb.state().join("relocated");
    fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("marsh-mcp");
    if fs::hard_link(sb.prefix.bin("marsh-mcp"), &exe).is_err() {
        fs::copy(sb.prefix.bin("marsh-mcp"), &exe).unwrap();
    }
    std::os::unix::fs::symlink(sb.prefix.bin("marsh"), dir.join("marsh")).unwrap();
    exe
}

#[test]
fn reinstall_keeps_an_attached_sandbox_and_later_loads_get_the_new_registration() {
    let sb = Sandbox::new();
    let (code, stderr) = run(&sb, &["install", "sbx"], None);
    assert_eq!(code, Some(0), "{stderr}");
    let name = server_name(&sb);
    let first = inspect(&sb, &name);
    assert!(
        sbx(&sb, &["mcp", "load", &name, "--sandbox", "early"])
            .status
            .success()
    );
    let mut early = attach(&sb, &name, "early");
    assert_eq!(exe_of(&early), sb.prefix.bin("marsh-mcp"));
    let scope = early.start_scope();

    // Re-run the install from another marsh-mcp path: the same build and pins, so the
    // busy broker is reused, but another command, so `rm --force` + `add` replace the
    // registration.
    let relocated = relocated_marsh_mcp(&sb);
    let out = sb
        .marsh_mcp_at(&relocated, &["install".to_string(), "sbx".to_string()], &[])
        .env("MARSH_SBX", sb.prefix.bin("sbx"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let said = format!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(
        said.contains(&format!("registered {name} with sbx")),
        "it replaced the registration: {said}"
    );
    let second = inspect(&sb, &name);
    assert_eq!(second["command"], relocated.display().to_string());
    assert_eq!(second["args"], first["args"]);
    assert_eq!(second["loaded"], json!([]), "a replacement starts unloaded");

    // The attached session keeps working on the broker it was attached to.
    let tools = early.tool_names();
    assert!(tools.iter().any(|t| t == "shell_run"), "{tools:?}");
    assert_eq!(
        early.ok("shell_run", json!({"command": "echo still attached"}))["stdout_text"],
        "still attached\n"
    );
    // A new session of the same sandbox launches what that sandbox loaded.
    let mut early_again = attach(&sb, &name, "early");
    assert_eq!(exe_of(&early_again), sb.prefix.bin("marsh-mcp"));
    assert!(
        early_again
            .ok("scope_list", json!({}))
            .to_string()
            .contains(&scope)
    );

    // A sandbox loaded after the reinstall gets the new registration, on the same broker.
    assert!(
        sbx(&sb, &["mcp", "load", &name, "--sandbox", "late"])
            .status
            .success()
    );
    let mut late = attach(&sb, &name, "late");
    assert_eq!(exe_of(&late), relocated);
    assert_eq!(
        late.ok("shell_run", json!({"command": "echo late"}))["stdout_text"],
        "late\n"
    );
    assert!(
        late.ok("scope_list", json!({}))
            .to_string()
            .contains(&scope)
    );
    assert_eq!(inspect(&sb, &name)["loaded"], json!(["late"]));

    // A sandbox that never loaded it is still refused.
    let never = sbx(&sb, &["mcp", "gateway-exec", &name, "--sandbox", "never"]);
    assert_eq!(never.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&never.stderr),
        format!("sbx: MCP server \"{name}\" is not loaded into sandbox \"never\"\n")
    );
    drop((early, early_again, late));
}
