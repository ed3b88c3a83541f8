//! `marsh-mcp install codex|claude` with the real clients (installed by `make
//! npm-clients`), offline and without login, each with a private CODEX_HOME /
//! CLAUDE_CONFIG_DIR / HOME.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server, npm_bin};

use super::sessions::{BrokersUnder, broker_pids};
use serde_json::{Value, json};

pub(crate) struct Clients {
    pub(crate) path: String,
    pub(crate) codex_home: PathBuf,
    pub(crate) claude_dir: PathBuf,
}

pub(crate) fn clients(sb: &Sandbox) -> Clients {
    let bin = npm_bin("codex").parent().unwrap().to_path_buf();
    let codex_home = sb.state().join("codex");
    let claude_dir = sb.state().join("claude");
    fs::create_dir_all(&codex_home).unwrap();
    fs::create_dir_all(&claude_dir).unwrap();
    Clients {
        path: format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
        codex_home,
        claude_dir,
    }
}

pub(crate) fn marsh_mcp(sb: &Sandbox, c: &Clients, args: &[&str]) -> (Option<i32>, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = sb
        .marsh_mcp(&args, &[])
        .env("PATH", &c.path)
        .env("CODEX_HOME", &c.codex_home)
        .env("CLAUDE_CONFIG_DIR", &c.claude_dir)
        .env("MARSH_SBX", sb.prefix.bin("sbx"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) fn client(sb: &Sandbox, c: &Clients, program: &str, args: &[&str]) -> Output {
    Command::new(npm_bin(program))
        .args(args)
        .env_clear()
        .env("PATH", &c.path)
        .env("HOME", sb.state().join("user"))
        .env("CODEX_HOME", &c.codex_home)
        .env("CLAUDE_CONFIG_DIR", &c.claude_dir)
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .current_dir(sb.workspace())
        .output()
        .unwrap()
}

fn server_name(sb: &Sandbox) -> String {
    marsh_scope_registry::server_name(&marsh_scope_registry::workspace_hash(&sb.workspace()))
}

/// One JSON-RPC exchange with `codex app-server` (no `jsonrpc` member in its dialect);
/// server-initiated requests are refused so nothing blocks.
pub(crate) fn app_request(server: &mut Server, method: &str, params: Value) -> Value {
    let id = server.next_request_id();
    server.send(&json!({"id": id, "method": method, "params": params}));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = server
            .recv(left)
            .unwrap_or_else(|| panic!("no answer to {method}; stderr: {}", server.stderr()));
        if msg.get("method").is_some() {
            if let Some(rid) = msg.get("id") {
                server.send(&json!({"id": rid, "error": {"code": -32601, "message": "not handled by the test"}}));
            }
            continue;
        }
        if msg.get("id") == Some(&json!(id)) {
            return msg;
        }
    }
}

/// `codex app-server` offline (no model provider reachable) from `cmd` (environment
/// and cwd set), initialized, with one ephemeral thread in `cwd`: the session and the
/// thread id.
pub(crate) fn codex_app_thread(mut cmd: Command, cwd: &std::path::Path) -> (Server, String) {
    cmd.args(["app-server", "--disable", "plugins", "-c"])
        .arg(r#"model_providers.offline={name="offline",base_url="http://127.0.0.1:9/v1",wire_api="responses"}"#)
        .args(["-c", "model_provider=offline", "-c", "model=offline"]);
    let mut app = Server::spawn_group(cmd);
    let init = app_request(
        &mut app,
        "initialize",
        json!({"clientInfo": {"name": "marsh-tests", "title": null, "version": "0"}, "capabilities": null}),
    );
    assert!(init.get("result").is_some(), "{init}");
    app.send(&json!({"method": "initialized"}));
    let thread = app_request(
        &mut app,
        "thread/start",
        json!({"ephemeral": true, "cwd": cwd}),
    );
    let thread_id = thread["result"]["thread"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{thread}"))
        .to_string();
    (app, thread_id)
}

#[test]
fn codex_install_is_verified_idempotent_refuses_foreign_entries_and_serves_all_tools() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.state());
    let c = clients(&sb);
    let name = server_name(&sb);
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "codex"]);
    assert_eq!(code, Some(0), "{stderr}");
    let got: Value =
        serde_json::from_slice(&client(&sb, &c, "codex", &["mcp", "get", &name, "--json"]).stdout)
            .unwrap();
    assert_eq!(
        got["transport"]["command"],
        sb.prefix.bin("marsh-mcp").display().to_string()
    );
    assert_eq!(got["transport"]["args"][0], "connect");
    assert_eq!(got["transport"]["args"][1], "--start");
    let root = got["transport"]["args"][5].as_str().unwrap().to_string();
    assert!(
        root.starts_with(
            &c.codex_home
                .join("marsh/dev-mcp/codex")
                .display()
                .to_string()
        ),
        "{root}"
    );
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "codex"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("nothing changed"), "{stderr}");

    // codex app-server lists the server with all 23 tools and calls shell_run.
    let mut cmd = Command::new(npm_bin("codex"));
    cmd.env_clear()
        .env("PATH", &c.path)
        .env("HOME", sb.state().join("user"))
        .env("CODEX_HOME", &c.codex_home)
        .current_dir(sb.workspace());
    let (mut app, thread_id) = codex_app_thread(cmd, &sb.workspace());
    let status = app_request(
        &mut app,
        "mcpServerStatus/list",
        json!({"threadId": thread_id, "serverName": name}),
    );
    let entry = status["result"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        entry.get("toolsError").is_none_or(Value::is_null),
        "{entry}"
    );
    assert_eq!(
        entry["tools"].as_object().map(|t| t.len()),
        Some(23),
        "{entry}"
    );
    let call = app_request(
        &mut app,
        "mcpServer/tool/call",
        json!({"threadId": thread_id, "server": name, "tool": "shell_run", "arguments": {"command": "echo from-codex"}}),
    );
    assert!(call.to_string().contains("from-codex"), "{call}");
    eprintln!(
        "codex listed {} tools; call: {}",
        entry["tools"].as_object().map_or(0, |t| t.len()),
        call
    );
    drop(app);

    // A hand-modified entry is refused and left byte-identical; uninstall refuses it too.
    let config = c.codex_home.join("config.toml");
    let original = fs::read_to_string(&config).unwrap();
    let modified = original.replacen(
        "\"--start\"",
        "\"--start\", \"--allow-full-sbx-control\"",
        1,
    );
    assert_ne!(original, modified);
    fs::write(&config, &modified).unwrap();
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "codex"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("different entry"), "{stderr}");
    assert_eq!(fs::read_to_string(&config).unwrap(), modified);
    let (code, _) = marsh_mcp(&sb, &c, &["uninstall", "codex"]);
    assert_eq!(code, Some(1));
    assert_eq!(fs::read_to_string(&config).unwrap(), modified);
    // The exact entry is removed by uninstall.
    fs::write(&config, &original).unwrap();
    let (code, stderr) = marsh_mcp(&sb, &c, &["uninstall", "codex"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !client(&sb, &c, "codex", &["mcp", "get", &name, "--json"])
            .status
            .success()
    );
}

#[test]
fn claude_install_connects_is_idempotent_and_refuses_a_foreign_entry() {
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.state());
    let c = clients(&sb);
    let name = server_name(&sb);
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "claude"]);
    assert_eq!(code, Some(0), "{stderr}");
    // Two concurrent Claude connections, each through its own `connect --start`.
    let gets: Vec<Output> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| client(&sb, &c, "claude", &["mcp", "get", &name])))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for get in &gets {
        let text = String::from_utf8_lossy(&get.stdout);
        assert!(
            text.contains("✔ Connected"),
            "{text}\n{}",
            String::from_utf8_lossy(&get.stderr)
        );
        assert!(text.contains("Local"), "{text}");
        assert!(text.contains("connect --start"), "{text}");
    }
    assert_eq!(broker_pids(&sb.state()).len(), 1, "one broker for both");
    assert!(
        !sb.workspace().join(".mcp.json").exists(),
        "never the shared project file"
    );
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "claude"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("nothing changed"), "{stderr}");

    let config = c.claude_dir.join(".claude.json");
    let mut doc: Value = serde_json::from_str(&fs::read_to_string(&config).unwrap()).unwrap();
    let key = sb.workspace().display().to_string();
    doc["projects"][&key]["mcpServers"][&name]["command"] = json!("/usr/bin/somebody-else");
    let foreign = serde_json::to_string_pretty(&doc).unwrap();
    fs::write(&config, &foreign).unwrap();
    let (code, stderr) = marsh_mcp(&sb, &c, &["install", "claude"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("different entry"), "{stderr}");
    assert_eq!(fs::read_to_string(&config).unwrap(), foreign);
    let (code, _) = marsh_mcp(&sb, &c, &["uninstall", "claude"]);
    assert_eq!(code, Some(1));
    assert_eq!(fs::read_to_string(&config).unwrap(), foreign);
}

#[test]
fn a_missing_client_cli_says_what_to_install() {
    let sb = Sandbox::new();
    let c = Clients {
        path: "/usr/bin:/bin".into(),
        codex_home: sb.state().join("codex"),
        claude_dir: sb.state().join("claude"),
    };
    for (client, hint) in [
        ("codex", "@openai/codex"),
        ("claude", "@anthropic-ai/claude-code"),
    ] {
        let (code, stderr) = marsh_mcp(&sb, &c, &["install", client]);
        assert_eq!(code, Some(1));
        assert!(stderr.contains(hint), "{stderr}");
    }
}

/// The clients the installers run get the passwd identity and a fixed `PATH` (after the
/// client's own directory), whatever the caller's environment says; the caller's other
/// variables never reach them.
#[test]
fn installer_children_get_the_passwd_identity_and_a_fixed_path() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let bin = sb.state().join("fake-bin");
    fs::create_dir_all(&bin).unwrap();
    let dump = sb.state().join("codex-env");
    let codex = bin.join("codex");
    fs::write(
        &codex,
        format!("#!/bin/sh\nenv > '{}'\nexit 3\n", dump.display()),
    )
    .unwrap();
    fs::set_permissions(&codex, fs::Permissions::from_mode(0o755)).unwrap();
    let args: Vec<String> = ["install", "codex"].iter().map(|s| s.to_string()).collect();
    let out = sb
        .marsh_mcp(&args, &[])
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("USER", "mallory")
        .env("LOGNAME", "mallory")
        .env("DEPLOY_TOKEN", "must-not-leak")
        .env("CODEX_HOME", sb.state().join("codex"))
        .env("MARSH_SBX", sb.prefix.bin("sbx"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the fake codex fails the install"
    );
    let env = fs::read_to_string(&dump).unwrap_or_else(|e| {
        panic!(
            "codex did not run ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .map(str::to_string)
    };
    let user = marsh_tests::passwd_user();
    assert_eq!(var("USER").as_deref(), Some(user.as_str()), "{env}");
    assert_eq!(var("LOGNAME").as_deref(), Some(user.as_str()), "{env}");
    assert_eq!(
        var("PATH"),
        Some(format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display())),
        "{env}"
    );
    assert_eq!(
        var("CODEX_HOME"),
        Some(sb.state().join("codex").display().to_string())
    );
    assert_eq!(var("DEPLOY_TOKEN"), None, "{env}");
}

/// After an sbx upgrade (a new canonical sbx path) `install codex|claude` replace
/// their own earlier entries (verified by the real CLIs), `uninstall` removes a stale
/// own entry, and an entry of ours with anything added stays refused, byte-identical.
#[test]
fn reinstall_after_an_sbx_upgrade_replaces_our_entries_and_uninstall_removes_stale_ones() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new();
    let _brokers = BrokersUnder(sb.state());
    let c = clients(&sb);
    let name = server_name(&sb);
    for client_name in ["codex", "claude"] {
        let (code, stderr) = marsh_mcp(&sb, &c, &["install", client_name]);
        assert_eq!(code, Some(0), "{stderr}");
    }
    let prefix = sb
        .prefix
        .bin("sbx")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let upgrade = |version: &str| {
        let dir = prefix.join(format!("sbx-{version}"));
        fs::create_dir_all(&dir).unwrap();
        let sbx = dir.join("sbx");
        fs::copy(sb.prefix.bin("sbx"), &sbx).unwrap();
        fs::set_permissions(&sbx, fs::Permissions::from_mode(0o755)).unwrap();
        sbx.canonicalize().unwrap()
    };
    let with_sbx = |sbx: &std::path::Path, args: &[&str]| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        sb.marsh_mcp(&args, &[])
            .env("PATH", &c.path)
            .env("CODEX_HOME", &c.codex_home)
            .env("CLAUDE_CONFIG_DIR", &c.claude_dir)
            .env("MARSH_SBX", sbx)
            .output()
            .unwrap()
    };

    let sbx_11 = upgrade("1.1");
    for client_name in ["codex", "claude"] {
        let out = with_sbx(&sbx_11, &["install", client_name]);
        let said = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{said}");
        assert!(said.contains("replaced our earlier entry"), "{said}");
    }
    let got: Value =
        serde_json::from_slice(&client(&sb, &c, "codex", &["mcp", "get", &name, "--json"]).stdout)
            .unwrap();
    let args = got["transport"]["args"].as_array().unwrap();
    assert_eq!(args.last().unwrap(), sbx_11.to_str().unwrap(), "{got}");
    let shown = client(&sb, &c, "claude", &["mcp", "get", &name]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains(sbx_11.to_str().unwrap()), "{text}");

    // Another upgrade: uninstall removes the now stale own entries.
    let sbx_12 = upgrade("1.2");
    for client_name in ["codex", "claude"] {
        let out = with_sbx(&sbx_12, &["uninstall", client_name]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let gone = client(&sb, &c, "codex", &["mcp", "get", &name, "--json"]);
    assert!(!gone.status.success(), "codex still has {name}");

    // Ours with something added is not ours: refused, the config byte-identical.
    let mut edited = vec!["mcp", "add", &name, "--"];
    let marsh_mcp = sb.prefix.bin("marsh-mcp");
    let mut rest: Vec<String> = args
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    rest.push("--allow-full-sbx-control".into());
    let marsh_mcp = marsh_mcp.to_str().unwrap().to_string();
    edited.push(&marsh_mcp);
    edited.extend(rest.iter().map(String::as_str));
    assert!(client(&sb, &c, "codex", &edited).status.success());
    let config = c.codex_home.join("config.toml");
    let before = fs::read(&config).unwrap();
    let out = with_sbx(&sbx_12, &["install", "codex"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(fs::read(&config).unwrap(), before, "left byte-identical");
    let out = with_sbx(&sbx_12, &["uninstall", "codex"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(fs::read(&config).unwrap(), before, "left byte-identical");
}
