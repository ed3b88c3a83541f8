//! Publication end to end with the stand-ins: `mcp publish` in the project shell (via
//! `shell_run`), the stock SBX registration, a gateway launch of the exporter, and
//! what republishing, unpublishing and a host `marsh mcp publish` do to it.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use marsh_tests::{Sandbox, Server};
use serde_json::{Value, json};

struct World {
    sb: Sandbox,
    control: PathBuf,
    sbx_state: PathBuf,
}

impl World {
    fn new() -> Self {
        let sb = Sandbox::new();
        let control = sb.state().join("control");
        let sbx_state = sb.state().join("sbx/state.json");
        Self {
            sb,
            control,
            sbx_state,
        }
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("MARSH_CONTROL_HOME", self.control.display().to_string()),
            ("SBX_SHIM_STATE", self.sbx_state.display().to_string()),
        ]
    }

    fn serve(&self) -> Server {
        let env = self.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Server::start(&self.sb, &self.sb.serve_home_args(&[]), &env)
    }

    /// A stand-in CLI from the prefix with this world's state, run from the workspace.
    fn tool(&self, name: &str, args: &[&str]) -> std::process::Output {
        Command::new(self.sb.prefix.bin(name))
            .args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.sb.state().join("user"))
            .env("MARSH_HOME", self.sb.home())
            .env("MARSH_CONTROL_HOME", &self.control)
            .env("SBX_SHIM_STATE", &self.sbx_state)
            .current_dir(self.sb.workspace())
            .output()
            .unwrap()
    }

    fn registrations(&self) -> Value {
        let out = self.tool("sbx", &["mcp", "ls", "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The exporter as the sandbox gateway launches it.
    fn gateway(&self, server: &str, sandbox: &str) -> Server {
        let mut cmd = Command::new(self.sb.prefix.bin("sbx"));
        cmd.args(["mcp", "gateway-exec", server, "--sandbox", sandbox])
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.sb.state().join("user"))
            .env("MARSH_CONTROL_HOME", &self.control)
            .env("SBX_SHIM_STATE", &self.sbx_state)
            .current_dir(self.sb.state());
        let mut s = Server::spawn(cmd);
        let init = s.initialize();
        assert!(init.get("result").is_some(), "{init}; {}", s.stderr());
        s
    }

    /// Publications belong to a workspace and home: this world's.
    fn key(&self) -> marsh_publication::PublisherKey {
        let canonical = |p: PathBuf| fs::canonicalize(&p).unwrap_or(p);
        marsh_publication::PublisherKey::of(
            &canonical(self.sb.workspace()),
            &canonical(self.sb.home()),
        )
    }

    /// The stock SBX server of this world's `name`.
    fn server(&self, name: &str) -> String {
        self.key().server_for(name)
    }

    fn declaration(&self, name: &str) -> PathBuf {
        self.control
            .join("mcp/published")
            .join(self.key().as_str())
            .join(format!("{name}.json"))
    }
}

/// Runs a publication command through `shell_run`; returns its JSON line and exit code.
fn in_shell(server: &mut Server, command: &str) -> (Value, i64) {
    let data = server.ok("shell_run", json!({"command": command, "wait_ms": 50000}));
    let line = data["stdout_text"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string();
    let parsed = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("{command}: not one JSON line ({e}): {data}"));
    (parsed, data["exit_code"].as_i64().unwrap_or(-1))
}

#[test]
fn a_command_published_in_the_shell_is_served_to_a_sandbox_until_republished_or_revoked() {
    let w = World::new();
    let mut dev = w.serve();

    let (published, code) = in_shell(
        &mut dev,
        "mcp publish hello --description 'Say hello' -- 'tr a-z A-Z'",
    );
    assert_eq!(published["result"], "committed", "{published}");
    assert_eq!(code, 0);
    assert_eq!(published["tool_name"], "hello");
    assert_eq!(published["server"], w.server("hello"));
    let generation = published["generation"].as_str().unwrap().to_string();

    // The stock registration pins the exporter and this publication.
    let regs = w.registrations();
    let reg = regs["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == w.server("hello"))
        .unwrap_or_else(|| panic!("{regs}"));
    assert_eq!(
        reg["command"],
        w.sb.prefix.bin("marsh-mcp").display().to_string()
    );
    let args: Vec<&str> = reg["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "export-serve");
    assert!(
        args.windows(2)
            .any(|p| p == ["--expected-generation", generation.as_str()])
    );
    let decl_path = w.declaration("hello");
    assert!(
        args.windows(2)
            .any(|p| p[0] == "--declaration" && p[1] == decl_path.to_str().unwrap())
    );

    // Loaded into a sandbox, the gateway's session has exactly that tool.
    let (loaded, _) = in_shell(&mut dev, "mcp load hello --sandbox box-1");
    assert_eq!(loaded["result"], "committed", "{loaded}");
    assert_eq!(loaded["sandbox"], "box-1");
    let mut gw = w.gateway(&w.server("hello"), "box-1");
    assert_eq!(gw.tool_names(), vec!["hello".to_string()]);
    let env = gw.call("hello", json!({"input": "abc"}));
    assert_eq!(env["data"]["outcome"], "success", "{env}");
    assert_eq!(env["data"]["stdout_text"], "ABC");

    // Republishing: a new generation; the running session lists nothing and refuses.
    let (again, _) = in_shell(
        &mut dev,
        "mcp publish hello --sandbox box-1 -- 'tr a-z A-Z'",
    );
    assert_eq!(again["result"], "committed", "{again}");
    assert_ne!(again["generation"].as_str().unwrap(), generation);
    assert!(gw.tool_names().is_empty());
    let env = gw.call("hello", json!({"input": "abc"}));
    assert_eq!(env["error"]["kind"], "publication_changed", "{env}");
    gw.close();

    // The new registration serves; unpublish empties it and later loads are rejected.
    let mut gw = w.gateway(&w.server("hello"), "box-1");
    assert_eq!(gw.tool_names(), vec!["hello".to_string()]);
    let (gone, code) = in_shell(&mut dev, "mcp unpublish hello");
    assert_eq!(gone["result"], "committed", "{gone}");
    assert_eq!(code, 0);
    assert!(gw.tool_names().is_empty());
    let env = gw.call("hello", json!({"input": "abc"}));
    assert_eq!(env["error"]["kind"], "publication_changed", "{env}");
    gw.close();
    assert!(!decl_path.exists());
    let (refused, code) = in_shell(&mut dev, "mcp load hello --sandbox box-2");
    assert_eq!(refused["result"], "rejected_before_effect", "{refused}");
    assert_ne!(code, 0);
    dev.close();
}

#[test]
fn publication_is_refused_without_effect_outside_its_rules() {
    let w = World::new();
    let mut dev = w.serve();
    for command in [
        "mcp publish -bad -- true",
        "mcp publish 'a b' -- true",
        "mcp publish ... -- true",
        &format!("mcp publish {} -- true", "x".repeat(65)),
        "mcp publish ok --timeout-ms 0 -- true",
        "mcp publish ok --max-output-bytes 262145 -- true",
        "mcp publish ok --kit codex -- true",
        "mcp publish ok --sandbox 'bad name' -- true",
        "mcp unpublish never-published",
    ] {
        let (answer, code) = in_shell(&mut dev, command);
        assert_eq!(
            answer["result"], "rejected_before_effect",
            "{command}: {answer}"
        );
        assert_ne!(code, 0, "{command}");
    }
    assert!(!w.declaration("ok").exists());
    dev.close();

    // A host `marsh mcp publish` touches neither files nor sbx.
    let before = fs::read(&w.sbx_state).ok();
    let out = w.tool("marsh", &["mcp", "publish", "hostile", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["result"], "rejected_before_effect", "{answer}");
    assert!(!w.declaration("hostile").exists());
    assert_eq!(fs::read(&w.sbx_state).ok(), before);
}

#[test]
fn host_load_and_unpublish_work_from_the_publishing_workspace() {
    let w = World::new();
    let mut dev = w.serve();
    let (published, _) = in_shell(&mut dev, "mcp publish hi -- 'cat'");
    assert_eq!(published["result"], "committed", "{published}");
    dev.close();

    let out = w.tool("marsh", &["mcp", "load", "hi", "--sandbox", "box-9"]);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["result"], "committed", "{answer} {out:?}");
    let regs = w.registrations();
    assert!(regs.to_string().contains("box-9"), "{regs}");
    let mut gw = w.gateway(&w.server("hi"), "box-9");
    assert_eq!(
        gw.call("hi", json!({"input": "same"}))["data"]["stdout_text"],
        "same"
    );
    gw.close();

    // A modified registration is rejected, never repaired.
    let out = w.tool("sbx", &["mcp", "rm", "--force", &w.server("hi")]);
    assert!(out.status.success());
    let out = w.tool(
        "sbx",
        &["mcp", "add", &w.server("hi"), "--command", "/bin/true"],
    );
    assert!(out.status.success());
    let out = w.tool("marsh", &["mcp", "load", "hi", "--sandbox", "box-9"]);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["result"], "rejected_before_effect", "{answer}");
    assert!(w.registrations().to_string().contains("/bin/true"));

    let out = w.tool("marsh", &["mcp", "unpublish", "hi"]);
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["result"], "committed", "{answer} {out:?}");
    assert!(!w.declaration("hi").exists());
}

#[test]
fn names_belong_to_their_publisher_and_foreign_registrations_are_left_alone() {
    let a = World::new();
    let mut dev_a = a.serve();
    let (published, _) = in_shell(&mut dev_a, "mcp publish hello -- 'tr a-z A-Z'");
    assert_eq!(published["result"], "committed", "{published}");
    let declaration = fs::read(a.declaration("hello")).unwrap();
    let registration = |w: &World, name: &str| {
        w.registrations()["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == w.server(name))
            .cloned()
    };
    let a_hello = registration(&a, "hello").unwrap();

    // Another workspace of the same user (same control directory and sbx state) has
    // names of its own: it can neither revoke nor load A's `hello`, and its own
    // `hello` is another server beside A's.
    let b = World {
        sb: Sandbox::new(),
        control: a.control.clone(),
        sbx_state: a.sbx_state.clone(),
    };
    let mut dev_b = b.serve();
    let state = fs::read(&a.sbx_state).unwrap();
    for (command, said) in [
        ("mcp unpublish hello", "nothing is published as hello"),
        ("mcp load hello --sandbox box-b", "hello is not published"),
    ] {
        let (answer, _) = in_shell(&mut dev_b, command);
        assert_eq!(
            answer["result"], "rejected_before_effect",
            "{command}: {answer}"
        );
        let reason = answer["reason"].as_str().unwrap();
        assert!(reason.contains(said), "{reason}");
        assert!(
            !reason.contains(&a.sb.workspace().display().to_string()),
            "{reason}"
        );
    }
    assert_eq!(fs::read(&a.sbx_state).unwrap(), state);
    let (answer, _) = in_shell(&mut dev_b, "mcp publish hello -- 'echo from-b'");
    assert_eq!(answer["result"], "committed", "{answer}");
    assert_eq!(answer["server"], b.server("hello"));
    assert_ne!(b.server("hello"), a.server("hello"));
    assert_eq!(fs::read(a.declaration("hello")).unwrap(), declaration);
    assert_eq!(registration(&a, "hello"), Some(a_hello));

    // A server of that name that is not a publication's is never replaced or removed.
    let out = a.tool(
        "sbx",
        &["mcp", "add", &a.server("other"), "--command", "/bin/true"],
    );
    assert!(out.status.success(), "{out:?}");
    let state = fs::read(&a.sbx_state).unwrap();
    for command in ["mcp publish other -- cat", "mcp unpublish other"] {
        let (answer, _) = in_shell(&mut dev_a, command);
        assert_eq!(
            answer["result"], "rejected_before_effect",
            "{command}: {answer}"
        );
    }
    assert_eq!(fs::read(&a.sbx_state).unwrap(), state);
    assert!(!a.declaration("other").exists());

    // At most 256 names per workspace and home: a new one beyond is refused, while
    // republishing an existing one still works, and the other workspace still
    // publishes new names.
    for i in 0..255 {
        fs::write(a.declaration(&format!("filler-{i}")), b"{}").unwrap();
    }
    let (answer, _) = in_shell(&mut dev_a, "mcp publish one-more -- cat");
    assert_eq!(answer["result"], "rejected_before_effect", "{answer}");
    assert!(
        answer["reason"].as_str().unwrap().contains("256"),
        "{answer}"
    );
    let (answer, _) = in_shell(&mut dev_a, "mcp publish hello -- cat");
    assert_eq!(answer["result"], "committed", "{answer}");
    let (answer, _) = in_shell(&mut dev_b, "mcp publish one-more -- cat");
    assert_eq!(answer["result"], "committed", "{answer}");
    dev_a.close();
    dev_b.close();
}

#[test]
fn publishing_from_a_development_scope_is_refused_before_any_effect() {
    let w = World::new();
    let env = w.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut s = Server::start(&w.sb, &w.sb.serve_root_args(&[]), &env);
    let generated = s.start_scope();
    for scope in ["default", generated.as_str()] {
        let data = s.ok(
            "scope_run",
            json!({"scope_id": scope, "command": "mcp publish hello -- cat"}),
        );
        let line = data["stdout_text"].as_str().unwrap().trim();
        let answer: Value = serde_json::from_str(line).unwrap();
        assert_eq!(answer["result"], "rejected_before_effect", "{answer}");
        let reason = answer["reason"].as_str().unwrap();
        assert!(
            reason.contains("development scope") && reason.contains("serve --home"),
            "{reason}"
        );
    }
    assert!(!w.declaration("hello").exists());
    assert!(!w.sbx_state.exists(), "sbx was never run");
}
