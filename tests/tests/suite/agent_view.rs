//! What an agent meets in the project shell, read cold: the shell and the network are
//! stated in the instructions and the run tools' descriptions, bash runs commands,
//! `$HOME` persists per scope, settings a person writes once (on the scope root, for
//! every scope) apply at a scope's next boot, exposed toolchains are read-only with
//! their credentials covered, and a loopback-only failure says why.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use marsh_tests::{Sandbox, Server};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::sandbox::server_with;

fn run(s: &mut Server, command: &str) -> Value {
    s.ok("shell_run", json!({ "command": command }))
}

fn stdout(data: &Value) -> String {
    data["stdout_text"].as_str().unwrap_or_default().to_string()
}

/// A server on a home with `settings`, its `initialize` instructions, and the
/// shell_run and scope_run descriptions.
fn stated(sb: &Sandbox, settings: &str) -> (Server, String, String, String) {
    let home = sb.home();
    fs::create_dir_all(&home).unwrap();
    fs::set_permissions(&home, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(home.join("backend.json"), settings).unwrap();
    let mut s = Server::spawn(sb.marsh_mcp(&sb.serve_home_args(&[]), &[]));
    let init = s.initialize();
    let instructions = init["result"]["instructions"].as_str().unwrap().to_string();
    let tools = s.request("tools/list", json!({}));
    let description = |name: &str| {
        tools["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()["description"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (shell_run, scope_run) = (description("shell_run"), description("scope_run"));
    (s, instructions, shell_run, scope_run)
}

#[test]
fn commands_run_in_bash_and_the_shell_and_network_in_force_are_stated() {
    for (settings, network) in [
        ("{}", "network: loopback only"),
        (r#"{"network": "host"}"#, "network: the host's"),
    ] {
        let sb = Sandbox::new();
        let (mut s, instructions, shell_run, scope_run) = stated(&sb, settings);
        for text in [&instructions, &shell_run, &scope_run] {
            assert!(text.contains("Commands run in bash"), "{text}");
            assert!(text.contains(network), "{settings}: {text}");
        }
        assert!(
            instructions.contains("Background processes end"),
            "{instructions}"
        );
        assert!(
            shell_run.contains("background processes end with the command"),
            "{shell_run}"
        );
        let data = run(&mut s, "echo $BASH_VERSION; [[ 1 == 1 ]] && echo ok");
        let out = stdout(&data);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{data}");
        assert!(lines[0].starts_with(|c: char| c.is_ascii_digit()), "{out}");
        assert_eq!(lines[1], "ok");
    }
}

#[test]
fn a_loopback_only_network_failure_says_so_and_how_a_person_enables_it() {
    let resolve =
        "python3 -c 'import socket; socket.getaddrinfo(\"marsh-mcp-test.invalid-tld-x\", 80)'";
    let sb = Sandbox::new();
    let mut s = server_with(&sb, "{}");
    let data = run(&mut s, resolve);
    assert_eq!(data["state"], "exited", "{data}");
    let hint = data["hint"].as_str().unwrap_or_default();
    assert!(hint.contains("no network"), "{data}");
    assert!(
        hint.contains(r#""network": "host""#) && hint.contains("scope_reset"),
        "{hint}"
    );
    // An ordinary failure gets no such hint.
    let data = run(&mut s, "echo broken >&2; exit 3");
    assert!(data.get("hint").is_none(), "{data}");
    // Under host networking the same failure (this machine may have no resolver) is
    // the command's own: no hint.
    let sb = Sandbox::new();
    let mut s = server_with(&sb, r#"{"network": "host"}"#);
    let data = run(&mut s, resolve);
    assert!(
        !data["hint"]
            .as_str()
            .unwrap_or_default()
            .contains("no network"),
        "{data}"
    );
}

#[test]
fn home_files_survive_stop_and_reset_and_root_settings_apply_to_new_scopes() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let data = run(&mut s, "echo kept > ~/note; chmod 755 ~; cat ~/note; pwd");
    assert_eq!(
        stdout(&data),
        format!("kept\n{}\n", sb.workspace().display())
    );
    // The HOME a job opened up sits in a directory of the scope's home that no job
    // sees, and that stays owner-only.
    let guest = sb.root().join("default/guest");
    assert_eq!(
        fs::read_to_string(guest.join("home/note")).unwrap(),
        "kept\n"
    );
    assert_eq!(
        fs::metadata(&guest).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        s.ok("scope_stop", json!({"scope_id": "default"}))["state"],
        "succeeded"
    );
    assert_eq!(
        s.ok("scope_reset", json!({"scope_id": "default"}))["scope"]["state"],
        "ready"
    );
    assert_eq!(stdout(&run(&mut s, "cat ~/note")), "kept\n");
    assert!(!sb.workspace().join("note").exists());

    // A person enables the network once, on the root: a new scope has it; the
    // running default scope keeps what it booted with and says how to apply it.
    let settings = sb.root().join("backend.json");
    fs::write(&settings, r#"{"network": "host"}"#).unwrap();
    fs::set_permissions(&settings, fs::Permissions::from_mode(0o600)).unwrap();
    let scope = s.start_scope();
    let status = s.ok("scope_status", json!({"scope_id": scope}));
    assert_eq!(status["runtime"]["backend"]["network"], "host", "{status}");
    let status = s.ok("status", json!({}));
    assert_eq!(
        status["runtime"]["backend"]["network"], "loopback",
        "{status}"
    );
    assert_eq!(
        status["runtime"]["backend"]["settings_changed"], true,
        "{status}"
    );
    let doctor = s.ok("doctor", json!({}));
    let shell = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "project_shell")
        .unwrap()
        .clone();
    assert_eq!(shell["ok"], false, "{shell}");
    assert!(
        shell["detail"]
            .as_str()
            .unwrap()
            .contains("scope_stop, then scope_reset"),
        "{shell}"
    );
    // The new scope's HOME is its own.
    let other = s.ok(
        "scope_run",
        json!({"scope_id": scope, "command": "cat ~/note || echo none"}),
    );
    assert_eq!(stdout(&other), "none\n", "{other}");
}

#[test]
fn an_exposed_toolchain_is_on_path_read_only_with_its_credentials_covered() {
    let sb = Sandbox::new();
    let tool = sb.state().join("toolchain");
    fs::create_dir_all(tool.join("bin")).unwrap();
    fs::write(tool.join("bin/hello-tool"), "#!/bin/sh\necho tool-ran\n").unwrap();
    fs::set_permissions(
        tool.join("bin/hello-tool"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fs::write(tool.join("credentials.toml"), "token = \"SECRET-TOKEN\"\n").unwrap();
    fs::set_permissions(
        tool.join("credentials.toml"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let settings = json!({
        "expose": [tool.display().to_string()],
        "path": [tool.join("bin").display().to_string()],
    });
    let mut s = server_with(&sb, &settings.to_string());
    let t = tool.display();
    let data = run(
        &mut s,
        &format!(
            "hello-tool; cat {t}/credentials.toml 2>/dev/null || echo unreadable; \
             touch {t}/new 2>/dev/null || echo read-only; command -v hello-tool"
        ),
    );
    assert_eq!(
        stdout(&data),
        format!("tool-ran\nunreadable\nread-only\n{t}/bin/hello-tool\n"),
        "{data}"
    );
    assert!(!data.to_string().contains("SECRET-TOKEN"));
    assert!(!tool.join("new").exists());
}

#[test]
fn a_directory_under_the_homes_secret_directories_is_refused() {
    let sb = Sandbox::new();
    let mut s = server_with(&sb, r#"{"expose": ["~/.ssh"]}"#);
    let reply = s.call("shell_run", json!({"command": "true"}));
    let error = &reply["error"];
    assert_eq!(error["kind"], "backend_failed", "{reply}");
    assert!(
        error["message"].as_str().unwrap().contains("credentials"),
        "{reply}"
    );
}
