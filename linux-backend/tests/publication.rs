//! Black-box tests of publication: `mcp publish|unpublish|load` in the project shell,
//! `marsh mcp ...` on the host, the declaration and the sbx registration they leave.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Bin, Env, code, stderr, stdout};
use serde_json::{Value, json};

/// One workspace + home with its own installation (`marsh-mcp` beside `marsh`), a
/// control home and an sbx state file, all temporary.
struct Pub {
    env: Env,
    bin: Bin,
    control: PathBuf,
    state: PathBuf,
}

impl Pub {
    fn new() -> Self {
        Self::with_bin(Bin::new(true))
    }

    fn with_bin(bin: Bin) -> Self {
        let mut env = Env::new();
        let control = env.dir.path().join("control");
        let state = env.dir.path().join("sbx/state.json");
        env.set_env("MARSH_CONTROL_HOME", control.to_str().unwrap());
        env.set_env("SBX_SHIM_STATE", state.to_str().unwrap());
        env.marsh = bin.path("marsh");
        Self {
            env,
            bin,
            control,
            state,
        }
    }

    /// This workspace and home's publisher key.
    fn key(&self) -> marsh_publication::PublisherKey {
        marsh_publication::PublisherKey::of(
            &self.env.ws.canonicalize().unwrap(),
            &self.env.home.canonicalize().unwrap(),
        )
    }

    /// The stock SBX server of this publisher's `name`.
    fn server(&self, name: &str) -> String {
        self.key().server_for(name)
    }

    fn published(&self) -> PathBuf {
        self.control
            .canonicalize()
            .unwrap_or_else(|_| self.control.clone())
            .join("mcp/published")
            .join(self.key().as_str())
    }

    fn declaration(&self, name: &str) -> PathBuf {
        self.published().join(format!("{name}.json"))
    }

    /// `mcp ARGS` in the project shell (one shell word each, quoted).
    fn shell_mcp(&self, args: &[&str]) -> Output {
        let words: Vec<String> = args.iter().map(|a| quote(a)).collect();
        self.env.run(&format!("mcp {}", words.join(" ")))
    }

    /// `marsh mcp ARGS` from a host terminal in the workspace.
    fn host_mcp(&self, args: &[&str]) -> Output {
        let mut all = vec!["mcp"];
        all.extend_from_slice(args);
        self.env.marsh(&all)
    }

    fn sbx(&self, args: &[&str]) -> Output {
        Command::new(self.bin.path("sbx"))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("SBX_SHIM_STATE", &self.state)
            .args(args)
            .output()
            .unwrap()
    }

    fn inspect(&self, server: &str) -> Option<Value> {
        let out = self.sbx(&["mcp", "inspect", server, "--json"]);
        match code(&out) {
            0 => Some(serde_json::from_slice(&out.stdout).unwrap()),
            _ => {
                assert_eq!(
                    stderr(&out).trim(),
                    format!("MCP server \"{server}\" not found")
                );
                None
            }
        }
    }

    /// The registration a publication of `name` at `generation` must have.
    fn expected_registration(&self, name: &str, generation: &str, loaded: &[&str]) -> Value {
        json!({
            "name": self.server(name),
            "command": self.bin.path("marsh-mcp").to_str().unwrap(),
            "args": [
                "export-serve",
                "--workspace", self.env.ws.to_str().unwrap(),
                "--home", self.env.home.canonicalize().unwrap().to_str().unwrap(),
                "--declaration", self.declaration(name).to_str().unwrap(),
                "--expected-generation", generation,
                "--marsh", self.bin.path("marsh").to_str().unwrap(),
                "--sbx", self.bin.path("sbx").to_str().unwrap(),
            ],
            "dir": null,
            "loaded": loaded,
        })
    }

    fn state_bytes(&self) -> Option<Vec<u8>> {
        std::fs::read(&self.state).ok()
    }
}

fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The one JSON line a publication command printed.
fn answer(out: &Output) -> Value {
    let text = stdout(out);
    let mut lines = text.lines();
    let line = lines
        .next()
        .unwrap_or_else(|| panic!("no output; stderr: {}", stderr(out)));
    assert_eq!(lines.next(), None, "one line only: {text}");
    serde_json::from_str(line).unwrap()
}

#[track_caller]
fn committed(out: &Output) -> Value {
    let value = answer(out);
    assert_eq!(value["result"], "committed", "{value}; {}", stderr(out));
    assert_eq!(code(out), 0);
    assert!(value.get("reason").is_none(), "{value}");
    value
}

#[track_caller]
fn rejected(out: &Output, exit: i32, reason_part: &str) -> Value {
    let value = answer(out);
    assert_eq!(value["result"], "rejected_before_effect", "{value}");
    assert_eq!(code(out), exit, "{value}");
    let reason = value["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(reason_part),
        "{reason:?} lacks {reason_part:?}"
    );
    value
}

fn generation(value: &Value) -> String {
    let g = value["generation"].as_str().unwrap().to_string();
    let uuid: Vec<&str> = g.split('-').collect();
    assert_eq!(
        uuid.iter().map(|p| p.len()).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12],
        "{g}"
    );
    assert!(uuid[2].starts_with('4'), "a v4 uuid: {g}");
    assert!(
        g.bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{g}"
    );
    g
}

#[test]
fn publish_commits_an_owner_only_declaration_and_the_exact_registration() {
    let p = Pub::new();
    let out = p.shell_mcp(&[
        "publish",
        "hello",
        "--description",
        "Say hello",
        "--",
        "tr a-z A-Z",
    ]);
    let value = committed(&out);
    let g = generation(&value);
    assert_eq!(
        value,
        json!({"result": "committed", "tool_name": "hello", "server": p.server("hello"), "generation": g})
    );

    let path = p.declaration("hello");
    let meta = std::fs::symlink_metadata(&path).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.nlink(), 1);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    for dir in [p.control.clone(), p.control.join("mcp"), p.published()] {
        assert_eq!(
            std::fs::metadata(&dir).unwrap().mode() & 0o777,
            0o700,
            "{dir:?}"
        );
    }
    let ws_meta = std::fs::metadata(&p.env.ws).unwrap();
    let declared: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        declared,
        json!({
            "schema": "marsh.published_tool/v1",
            "tool_name": "hello",
            "description": "Say hello",
            "publication_generation": g,
            "pipeline": "tr a-z A-Z",
            "input_schema": {"type": "object", "properties": {"input": {"type": "string",
                "description": "Bytes given to the pipeline as stdin (UTF-8)."}},
                "additionalProperties": false},
            "max_output_bytes": 262144,
            "timeout_ms": 120000,
            "canonical_workspace": p.env.ws.to_str().unwrap(),
            "workspace_identity": {"device": ws_meta.dev(), "inode": ws_meta.ino()},
            "home": p.env.home.canonicalize().unwrap().to_str().unwrap(),
        })
    );
    assert_eq!(
        p.inspect(&p.server("hello")).unwrap(),
        p.expected_registration("hello", &g, &[])
    );
    let ls: Value = serde_json::from_slice(&p.sbx(&["mcp", "ls", "--json"]).stdout).unwrap();
    assert_eq!(ls["servers"].as_array().unwrap().len(), 1);
    assert_eq!(ls["servers"][0]["name"], p.server("hello"));

    // Defaults and bounds as given.
    let out = p.shell_mcp(&[
        "publish",
        "plain",
        "--timeout-ms",
        "900000",
        "--max-output-bytes=1",
        "--",
        "cat",
    ]);
    committed(&out);
    let declared: Value =
        serde_json::from_slice(&std::fs::read(p.declaration("plain")).unwrap()).unwrap();
    assert_eq!(
        declared["description"],
        "Runs a fixed pipeline in the marsh project ws; the input argument is its stdin."
    );
    assert_eq!(
        (
            declared["timeout_ms"].clone(),
            declared["max_output_bytes"].clone()
        ),
        (json!(900000), json!(1))
    );

    // A long name gets the shortened server name.
    let long = format!("{}-tail", "n".repeat(56));
    let value = committed(&p.shell_mcp(&["publish", &long, "--", "true"]));
    let server = value["server"].as_str().unwrap();
    assert_eq!(server.len(), 64);
    assert!(
        server.starts_with(&format!("marsh-pub-{}-{}-", p.key().as_str(), &long[..32])),
        "{server}"
    );
    assert!(p.inspect(server).is_some());
}

#[test]
fn republish_replaces_the_registration_and_sandbox_loads_it() {
    let p = Pub::new();
    let first = generation(&committed(&p.shell_mcp(&[
        "publish",
        "hello",
        "--",
        "tr a-z A-Z",
    ])));
    assert_eq!(
        code(&p.sbx(&[
            "mcp",
            "load",
            p.server("hello").as_str(),
            "--sandbox",
            "old"
        ])),
        0
    );

    let value = committed(&p.shell_mcp(&["publish", "hello", "--sandbox", "dev", "--", "rev"]));
    let second = generation(&value);
    assert_ne!(first, second);
    assert_eq!(value["sandbox"], "dev");
    assert_eq!(
        p.inspect(&p.server("hello")).unwrap(),
        p.expected_registration("hello", &second, &["dev"]),
        "the old registration (loaded into `old`) was replaced"
    );
    let declared: Value =
        serde_json::from_slice(&std::fs::read(p.declaration("hello")).unwrap()).unwrap();
    assert_eq!(declared["publication_generation"], second);
    assert_eq!(declared["pipeline"], "rev");
}

#[test]
fn load_and_unpublish_from_the_shell_and_from_the_host() {
    let p = Pub::new();
    let g = generation(&committed(&p.shell_mcp(&["publish", "hello", "--", "cat"])));

    let value = committed(&p.shell_mcp(&["load", "hello", "--sandbox", "dev"]));
    assert_eq!(
        value,
        json!({"result": "committed", "tool_name": "hello", "server": p.server("hello"),
               "generation": g, "sandbox": "dev"})
    );
    let value = committed(&p.host_mcp(&["load", "hello", "--sandbox=host1"]));
    assert_eq!(value["sandbox"], "host1");
    assert_eq!(
        p.inspect(&p.server("hello")).unwrap()["loaded"],
        json!(["dev", "host1"])
    );

    let value = committed(&p.host_mcp(&["unpublish", "hello"]));
    assert_eq!(value["generation"], g.as_str());
    assert!(!p.declaration("hello").exists());
    assert!(!p.published().join("hello.revoking").exists());
    assert_eq!(p.inspect(&p.server("hello")), None);
    rejected(
        &p.host_mcp(&["load", "hello", "--sandbox", "dev"]),
        1,
        "hello is not published",
    );
    rejected(
        &p.shell_mcp(&["load", "hello", "--sandbox", "dev"]),
        1,
        "hello is not published",
    );
    rejected(
        &p.shell_mcp(&["unpublish", "hello"]),
        1,
        "nothing is published as hello",
    );

    // From the shell too.
    committed(&p.shell_mcp(&["publish", "hello", "--", "cat"]));
    committed(&p.shell_mcp(&["unpublish", "hello"]));
    assert!(!p.declaration("hello").exists());
    assert_eq!(p.inspect(&p.server("hello")), None);
}

#[test]
fn a_pending_revocation_blocks_load_and_publish_until_unpublish() {
    let p = Pub::new();
    let g = generation(&committed(&p.shell_mcp(&["publish", "hello", "--", "cat"])));
    let marker = p.published().join("hello.revoking");
    std::fs::write(&marker, "").unwrap();
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o600)).unwrap();
    let before = p.state_bytes();

    rejected(
        &p.shell_mcp(&["load", "hello", "--sandbox", "dev"]),
        1,
        "pending",
    );
    rejected(
        &p.host_mcp(&["load", "hello", "--sandbox", "dev"]),
        1,
        "pending",
    );
    rejected(
        &p.shell_mcp(&["publish", "hello", "--", "rev"]),
        1,
        "pending",
    );
    assert_eq!(p.state_bytes(), before, "no sbx change");
    let declared: Value =
        serde_json::from_slice(&std::fs::read(p.declaration("hello")).unwrap()).unwrap();
    assert_eq!(declared["publication_generation"], g.as_str());

    committed(&p.shell_mcp(&["unpublish", "hello"]));
    assert!(!marker.exists());
    assert_eq!(p.inspect(&p.server("hello")), None);
    committed(&p.shell_mcp(&["publish", "hello", "--", "rev"]));
}

#[test]
fn a_stale_or_modified_registration_is_refused_and_left_as_it_is() {
    let p = Pub::new();
    let g = generation(&committed(&p.shell_mcp(&["publish", "hello", "--", "cat"])));
    let expected = p.expected_registration("hello", &g, &[]);
    let args: Vec<String> = expected["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let command = expected["command"].as_str().unwrap();
    let server = p.server("hello");
    let reregister = |args: &[String], extra: &[&str]| {
        // Absent (already removed) or present, it is replaced.
        let _ = p.sbx(&["mcp", "rm", "--force", &server]);
        let joined = args.join(",");
        let mut add = vec![
            "mcp",
            "add",
            server.as_str(),
            "--command",
            command,
            "--args",
            &joined,
        ];
        add.extend_from_slice(extra);
        assert_eq!(code(&p.sbx(&add)), 0);
    };

    // Another generation, an extra dir, another command: each refused, never repaired.
    let mut stale = args.clone();
    let at = stale.iter().position(|a| a == &g).unwrap();
    stale[at] = "00000000-0000-4000-8000-000000000000".into();
    for (args, extra) in [(stale, &[][..]), (args.clone(), &["--dir", "/tmp"][..])] {
        reregister(&args, extra);
        let before = p.state_bytes();
        rejected(
            &p.shell_mcp(&["load", "hello", "--sandbox", "dev"]),
            1,
            "stale or modified registration; republish",
        );
        rejected(
            &p.host_mcp(&["load", "hello", "--sandbox", "dev"]),
            1,
            "stale or modified registration; republish",
        );
        assert_eq!(p.state_bytes(), before, "left as it is");
    }
    assert_eq!(
        code(&p.sbx(&["mcp", "rm", "--force", p.server("hello").as_str()])),
        0
    );
    rejected(
        &p.shell_mcp(&["load", "hello", "--sandbox", "dev"]),
        1,
        "republish",
    );

    // A declaration that no longer parses is refused too.
    reregister(&args, &[]);
    committed(&p.shell_mcp(&["load", "hello", "--sandbox", "dev"]));
    let path = p.declaration("hello");
    let mut declared: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    declared["unexpected"] = json!(true);
    std::fs::write(&path, declared.to_string()).unwrap();
    rejected(
        &p.shell_mcp(&["load", "hello", "--sandbox", "dev2"]),
        1,
        "malformed",
    );
    assert_eq!(
        p.inspect(&p.server("hello")).unwrap()["loaded"],
        json!(["dev"])
    );
}

#[test]
fn bad_commands_are_rejected_before_any_effect() {
    let p = Pub::new();
    for args in [
        &["publish", "-bad", "--", "x"][..],
        &["publish", "..", "--", "x"],
        &["publish", "a b", "--", "x"],
        &["publish", &"n".repeat(65), "--", "x"],
        &["publish", "hello"],
        &["publish", "hello", "--", ""],
        &["publish", "hello", "--", "a", "b"],
        &["publish", "hello", "--timeout-ms", "0", "--", "x"],
        &["publish", "hello", "--timeout-ms", "900001", "--", "x"],
        &[
            "publish",
            "hello",
            "--max-output-bytes",
            "262145",
            "--",
            "x",
        ],
        &["publish", "hello", "--max-output-bytes", "-1", "--", "x"],
        &[
            "publish",
            "hello",
            "--description",
            &"d".repeat(1025),
            "--",
            "x",
        ],
        &["publish", "hello", "--sandbox", "bad sandbox", "--", "x"],
        &[
            "publish",
            "hello",
            "--sandbox",
            "a",
            "--sandbox",
            "b",
            "--",
            "x",
        ],
        &["publish", "hello", "--frobnicate", "--", "x"],
        &["publish", "hello", "--", &"x".repeat(65_537)],
        &["unpublish"],
        &["unpublish", "a", "b"],
        &["load", "hello"],
        &["load", "hello", "--sandbox", "a/b"],
        &["frobnicate"],
        &[],
    ] {
        let out = p.shell_mcp(args);
        let value = rejected(&out, 2, "usage: mcp publish NAME");
        assert_eq!(value["generation"], Value::Null);
    }
    for args in [
        &["publish", "hello", "--kit", "codex", "--", "x"][..],
        &["load", "hello", "--kit", "codex"],
        &["load", "hello", "--sandbox", "s", "--kit=codex"],
    ] {
        let value = rejected(
            &p.shell_mcp(args),
            2,
            "--kit targets are not supported by this stand-in",
        );
        assert_eq!(value["tool_name"], "hello");
        // Refused before the daemon: no publisher, so no server.
        assert_eq!(value["server"], Value::Null);
    }
    assert!(!p.control.exists(), "no control directory was created");
    assert_eq!(p.state_bytes(), None, "sbx was never written");

    // The daemon checks a request again whoever sends it: a forged one straight on
    // the agent socket is refused before any effect as well.
    let forged = json!({"kind": "publication", "request": {"verb": "publish", "tool_name": "-x",
        "description": null, "sandbox": null, "timeout_ms": 0, "max_output_bytes": 1, "pipeline": "x"}});
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\ns.connect('/run/marsh/kit.sock')\ns.send({:?}.encode())\nprint(s.recv(65536).decode())\n",
        forged.to_string()
    );
    std::fs::write(p.env.ws.join("forge.py"), script).unwrap();
    let out = p.env.run("python3 forge.py");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let wire: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(wire["usage"], true);
    assert_eq!(wire["result"]["result"], "rejected_before_effect");
    assert!(!p.control.exists());
}

#[test]
fn host_publish_is_refused_before_touching_anything() {
    let p = Pub::new();
    let out = p.host_mcp(&["publish", "hello", "--", "tr a-z A-Z"]);
    let value = rejected(&out, 2, "publication needs an attached project shell");
    assert_eq!(value["tool_name"], "hello");
    assert!(!p.control.exists(), "no declaration directory");
    assert_eq!(p.state_bytes(), None);
    assert_eq!(
        p.env.status()["daemon"]["state"],
        "absent",
        "nothing was booted"
    );

    // With a publication in place, nothing changes either.
    committed(&p.shell_mcp(&["publish", "hello", "--", "cat"]));
    let (state, declared) = (
        p.state_bytes(),
        std::fs::read(p.declaration("hello")).unwrap(),
    );
    rejected(
        &p.host_mcp(&["publish", "hello", "--", "rev"]),
        2,
        "attached project shell",
    );
    rejected(
        &p.host_mcp(&["publish", "-bad"]),
        2,
        "attached project shell",
    );
    assert_eq!(p.state_bytes(), state);
    assert_eq!(std::fs::read(p.declaration("hello")).unwrap(), declared);

    // Other `marsh mcp` verbs still go to the marsh-mcp beside marsh.
    let out = p.host_mcp(&["install-published", "codex", "hello"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "stand-in marsh-mcp install-published codex hello\n"
    );
}

#[test]
fn host_load_and_unpublish_need_the_publishing_workspace() {
    let p = Pub::new();
    committed(&p.shell_mcp(&["publish", "hello", "--", "cat"]));
    let elsewhere = p.env.dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let from = |args: &[&str]| {
        let mut all = vec!["mcp"];
        all.extend_from_slice(args);
        p.env
            .cmd()
            .current_dir(&elsewhere)
            .args(all)
            .output()
            .unwrap()
    };
    // Names are per workspace and home: elsewhere `hello` is another publisher's name,
    // not published there, and nothing of this one's is touched.
    let before = p.state_bytes();
    rejected(
        &from(&["load", "hello", "--sandbox", "dev"]),
        1,
        "hello is not published",
    );
    assert_eq!(p.state_bytes(), before);
    assert!(p.declaration("hello").exists());

    // Another home is another publisher too.
    let other_home = p.env.dir.path().join("other-home");
    std::fs::create_dir(&other_home).unwrap();
    let out = p
        .env
        .cmd()
        .env("MARSH_HOME", &other_home)
        .args(["mcp", "load", "hello", "--sandbox", "dev"])
        .output()
        .unwrap();
    rejected(&out, 1, "hello is not published");
    assert_eq!(p.state_bytes(), before);
    committed(&p.host_mcp(&["unpublish", "hello"]));
}

#[test]
fn publication_is_refused_without_marsh_mcp_beside_marsh() {
    let p = Pub::with_bin(Bin::new(false));
    let out = p.shell_mcp(&["publish", "hello", "--", "cat"]);
    rejected(&out, 1, "marsh-mcp this marsh would use is missing");
    assert!(!p.published().join("hello.json").exists());
    assert_eq!(p.state_bytes(), None);
}

#[test]
fn a_busy_control_lock_is_refused() {
    let p = Pub::new();
    committed(&p.shell_mcp(&["publish", "hello", "--", "cat"]));
    let lock = std::fs::File::options()
        .read(true)
        .write(true)
        .open(p.control.join("mcp/publication.lock"))
        .unwrap();
    lock.lock().unwrap();
    let before = p.state_bytes();
    let started = std::time::Instant::now();
    rejected(
        &p.shell_mcp(&["load", "hello", "--sandbox", "dev"]),
        1,
        "busy: another publication transaction is running",
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(5));
    assert_eq!(p.state_bytes(), before);
    drop(lock);
    committed(&p.shell_mcp(&["load", "hello", "--sandbox", "dev"]));
}

/// Unpublish marks the revocation before it waits for the lock: held by a slow
/// transaction, the unpublish answers busy (uncertain: the marker is an effect) and
/// leaves the marker, a load after it is refused, and the retried unpublish commits.
#[test]
fn unpublish_marks_the_revocation_before_waiting_for_the_lock() {
    let p = Pub::new();
    committed(&p.shell_mcp(&["publish", "hello", "--", "cat"]));
    let marker = p.published().join("hello.revoking");
    let lock = std::fs::File::options()
        .read(true)
        .write(true)
        .open(p.control.join("mcp/publication.lock"))
        .unwrap();
    lock.lock().unwrap();
    let busy = answer(&p.host_mcp(&["unpublish", "hello"]));
    assert_eq!(busy["result"], "uncertain", "{busy}");
    let reason = busy["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("busy: another publication transaction is running")
            && reason.contains("run `mcp unpublish hello` again"),
        "{reason}"
    );
    assert!(marker.exists(), "the marker was written before the wait");
    drop(lock);
    rejected(
        &p.host_mcp(&["load", "hello", "--sandbox", "dev"]),
        1,
        "pending",
    );
    committed(&p.host_mcp(&["unpublish", "hello"]));
    assert!(!marker.exists());
    assert_eq!(p.inspect(&p.server("hello")), None);
}

#[test]
fn kit_jobs_have_no_publication_authority() {
    let p = Pub::new();
    p.env.write_kit(
        "probe",
        &[
            "/bin/sh",
            "-c",
            "mcp publish evil -- true; echo mcp=$?; test -e /run/marsh; echo agent-dir=$?; \
             ls /run/marsh/kit.sock /run/marsh/agent 2>/dev/null | wc -l",
        ],
    );
    let expected = "mcp=127\nagent-dir=1\n0\n";
    let out = p.env.run("probe");
    assert_eq!(stdout(&out), expected, "{}", stderr(&out));
    let out = p.env.marsh(&["kit", "run", "probe"]);
    assert_eq!(stdout(&out), expected, "{}", stderr(&out));
    assert!(!p.control.exists(), "no effect at all");
    assert_eq!(p.state_bytes(), None);
}

#[test]
fn unconfined_shells_publish_too() {
    let p = Pub::new();
    p.env
        .settings(r#"{"idle_secs": 60, "bwrap": "/nonexistent/bwrap", "unconfined": true}"#);
    let out = p.env.run("command -v mcp");
    assert!(
        stdout(&out).trim_end().ends_with("/bin/mcp"),
        "{}",
        stdout(&out)
    );
    let g = generation(&committed(&p.shell_mcp(&["publish", "hello", "--", "cat"])));
    assert_eq!(
        p.inspect(&p.server("hello")).unwrap(),
        p.expected_registration("hello", &g, &[])
    );
    committed(&p.shell_mcp(&["unpublish", "hello"]));
}

#[test]
fn the_daemon_drives_the_sbx_marsh_was_given() {
    // MARSH_SBX names a descriptor (as marsh-mcp passes it): the daemon gets its path.
    let mut p = Pub::new();
    let other = Bin::new(true);
    let sbx = other.path("sbx");
    p.env.set_env("MARSH_SBX", "/proc/self/fd/7");
    let script = format!(
        "exec 7<{} && exec {} -c \"mcp publish hello -- cat\"",
        quote(sbx.to_str().unwrap()),
        quote(p.env.marsh.to_str().unwrap())
    );
    let out = p
        .env
        .cmd_with("/bin/sh", &["-c", &script])
        .output()
        .unwrap();
    let g = generation(&committed(&out));
    let registration = p.inspect(&p.server("hello")).unwrap();
    let args = registration["args"].as_array().unwrap();
    assert_eq!(
        args.last().unwrap(),
        sbx.to_str().unwrap(),
        "{registration}"
    );
    assert!(args.iter().any(|a| a == g.as_str()));
    assert_eq!(
        Path::new(registration["command"].as_str().unwrap()),
        p.bin.path("marsh-mcp")
    );
}

/// A job in workspace W2 publishes 256 names, `hello` among them, before W1 publishes
/// anything: W2's next new name is refused at its own cap, while W1 still publishes
/// `hello` (its own server, beside W2's) and a further name. Names and the cap are per
/// workspace and home.
#[test]
fn one_workspace_neither_exhausts_nor_pre_claims_anothers_names() {
    let w1 = Pub::new();
    let mut w2 = Env::new();
    w2.set_env("MARSH_CONTROL_HOME", w1.control.to_str().unwrap());
    w2.set_env("SBX_SHIM_STATE", w1.state.to_str().unwrap());
    w2.marsh = w1.bin.path("marsh");
    let flood = w2.run(
        "mcp publish hello -- cat >/dev/null || echo failed hello; \
         i=1; while [ $i -le 255 ]; do mcp publish t$i -- true >/dev/null || echo failed t$i; i=$((i+1)); done; \
         mcp publish one-more -- true",
    );
    let out = stdout(&flood);
    assert!(!out.contains("failed"), "{out}");
    assert!(
        out.contains("256 tools are published from this workspace and home already"),
        "{out}"
    );
    let w2_hello = committed(&w2_publish_answer(&w2, "hello"));
    let mine = committed(&w1.shell_mcp(&["publish", "hello", "--", "cat"]));
    assert_ne!(mine["server"], w2_hello["server"]);
    assert_eq!(mine["server"], w1.server("hello"));
    committed(&w1.shell_mcp(&["publish", "another", "--", "true"]));
    assert!(w1.inspect(&w1.server("hello")).is_some());
    assert!(
        w1.inspect(w2_hello["server"].as_str().unwrap()).is_some(),
        "W2's hello is untouched"
    );
}

/// W2 republishing its `hello` (an existing name: not counted against the cap).
fn w2_publish_answer(w2: &Env, name: &str) -> Output {
    w2.run(&format!("mcp publish {name} -- cat"))
}

/// A publication left by an earlier release (declaration directly in `published/`,
/// server `marsh-pub-NAME`) is still revoked by `unpublish` from its workspace and home.
#[test]
fn unpublish_revokes_a_publication_of_the_earlier_layout() {
    let p = Pub::new();
    committed(&p.shell_mcp(&["publish", "hello", "--", "cat"]));
    let keyed = p.declaration("hello");
    let legacy = p.published().parent().unwrap().join("hello.json");
    std::fs::rename(&keyed, &legacy).unwrap();
    let registration = p.inspect(&p.server("hello")).unwrap();
    let args: Vec<String> = registration["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let a = a.as_str().unwrap();
            if a == keyed.to_str().unwrap() {
                legacy.to_str().unwrap().to_string()
            } else {
                a.to_string()
            }
        })
        .collect();
    assert_eq!(
        code(&p.sbx(&["mcp", "rm", "--force", &p.server("hello")])),
        0
    );
    let joined = args.join(",");
    let command = registration["command"].as_str().unwrap();
    assert_eq!(
        code(&p.sbx(&[
            "mcp",
            "add",
            "marsh-pub-hello",
            "--command",
            command,
            "--args",
            &joined
        ])),
        0
    );
    committed(&p.shell_mcp(&["unpublish", "hello"]));
    assert!(!legacy.exists());
    assert_eq!(p.inspect("marsh-pub-hello"), None);
}
