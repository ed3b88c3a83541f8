//! `marsh-mcp install-published codex NAME` / `remove-published codex NAME` with the
//! real Codex CLI (installed by `make npm-clients`; private CODEX_HOME, offline, no
//! login) against a publication made by hand, exactly as `mcp publish` leaves one: an
//! owner-only declaration in a private control directory (`MARSH_CONTROL_HOME`) and the
//! stock SBX registration added with the stand-in sbx (its state in `SBX_SHIM_STATE`).
//!
//! The helpers are `pub(crate)` so that other suites (e.g. a `codex app-server` session
//! calling the published tool through `export-serve`) can build the same publication.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use marsh_tests::{Sandbox, npm_bin};

use super::install_clients::{app_request, codex_app_thread};
use serde_json::{Value, json};

pub(crate) const TOOL: &str = "hello";
thread_local! {
    /// The stock SBX server of [`TOOL`] for this test's [`Publishing`] world (whose
    /// workspace and home it belongs to).
    static SERVER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// The stock SBX server of [`TOOL`] for this test's world.
pub(crate) fn server() -> String {
    SERVER.with(|s| s.borrow().clone())
}
pub(crate) const PIPELINE: &str = "tr a-z A-Z";
pub(crate) const G1: &str = "3f2a9c1e-7b4d-4e8f-9a1b-2c3d4e5f6a7b";
pub(crate) const G2: &str = "8e7d6c5b-4a39-4281-b7c6-d5e4f3a2b1c0";

/// One publishing world: the black-box sandbox (workspace, prefix, fake user home), a
/// marsh home, a control directory, the stand-in sbx's state file and a private
/// CODEX_HOME, all below the sandbox's state directory.
pub(crate) struct Publishing {
    pub(crate) sb: Sandbox,
    /// `MARSH_HOME` of every command (the publishing home).
    pub(crate) home: PathBuf,
    /// `MARSH_CONTROL_HOME`.
    pub(crate) control: PathBuf,
    /// `SBX_SHIM_STATE`.
    pub(crate) sbx_state: PathBuf,
    pub(crate) codex_home: PathBuf,
    /// `PATH` with the npm clients first.
    pub(crate) path: String,
}

fn private_dir(path: &Path) {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).unwrap();
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

impl Publishing {
    pub(crate) fn new() -> Self {
        let sb = Sandbox::new();
        let state = sb.state();
        let home = state.join("marsh-home");
        let control = state.join("control");
        let codex_home = state.join("codex");
        private_dir(&home);
        let key = marsh_publication::PublisherKey::of(
            &fs::canonicalize(sb.workspace()).unwrap(),
            &fs::canonicalize(&home).unwrap(),
        );
        SERVER.with(|s| *s.borrow_mut() = key.server_for(TOOL));
        for dir in [
            control.clone(),
            control.join("mcp"),
            control.join("mcp/published"),
            control.join("mcp/published").join(key.as_str()),
        ] {
            private_dir(&dir);
        }
        fs::create_dir_all(&codex_home).unwrap();
        let bin = npm_bin("codex").parent().unwrap().to_path_buf();
        Self {
            home,
            control,
            sbx_state: state.join("sbx-state.json"),
            codex_home,
            path: format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
            sb,
        }
    }

    /// `<control>/mcp/published/<key>/<tool>.json`.
    pub(crate) fn declaration(&self, tool: &str) -> PathBuf {
        let key = marsh_publication::PublisherKey::of(
            &fs::canonicalize(self.sb.workspace()).unwrap(),
            &fs::canonicalize(&self.home).unwrap(),
        );
        self.control
            .join("mcp/published")
            .join(key.as_str())
            .join(format!("{tool}.json"))
    }

    /// Writes the declaration of `tool` (pipeline mode, default bounds, owner-only,
    /// replaced by rename like the publisher does) at `generation`.
    pub(crate) fn write_declaration(&self, tool: &str, generation: Option<&str>, pipeline: &str) {
        let workspace = self.sb.workspace();
        let identity = fs::metadata(&workspace).unwrap();
        let mut doc = json!({
            "schema": "marsh.published_tool/v1",
            "tool_name": tool,
            "description": "Say hello",
            "pipeline": pipeline,
            "input_schema": {
                "type": "object",
                "properties": {"input": {"type": "string", "description": "Bytes given to the pipeline as stdin (UTF-8)."}},
                "additionalProperties": false
            },
            "max_output_bytes": 262144,
            "timeout_ms": 120000,
            "canonical_workspace": workspace,
            "workspace_identity": {"device": identity.dev(), "inode": identity.ino()},
            "home": self.home,
        });
        if let Some(g) = generation {
            doc["publication_generation"] = json!(g);
        }
        let target = self.declaration(tool);
        let temp = target.with_extension("json.tmp");
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .unwrap();
        file.write_all(serde_json::to_string_pretty(&doc).unwrap().as_bytes())
            .unwrap();
        file.sync_all().unwrap();
        fs::rename(&temp, &target).unwrap();
    }

    /// The `export-serve` arguments a registration of `tool` at `generation` pins.
    pub(crate) fn export_args(&self, tool: &str, generation: Option<&str>) -> Vec<String> {
        let mut args = vec![
            "export-serve".to_string(),
            "--workspace".into(),
            text(&self.sb.workspace()),
            "--home".into(),
            text(&self.home),
            "--declaration".into(),
            text(&self.declaration(tool)),
        ];
        if let Some(g) = generation {
            args.extend(["--expected-generation".into(), g.to_string()]);
        }
        args.extend([
            "--marsh".into(),
            text(&self.sb.prefix.bin("marsh")),
            "--sbx".into(),
            text(&self.sb.prefix.bin("sbx")),
        ]);
        args
    }

    /// The stand-in sbx with this world's state file.
    pub(crate) fn sbx(&self, args: &[&str]) -> Output {
        Command::new(self.sb.prefix.bin("sbx"))
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.sb.state().join("user"))
            .env("SBX_SHIM_STATE", &self.sbx_state)
            .current_dir(self.sb.workspace())
            .output()
            .unwrap()
    }

    /// Replaces the registration `server` with `marsh-mcp ARGS` (`--args` comma-joined).
    pub(crate) fn register(&self, server: &str, args: &[String]) {
        self.unregister(server);
        let marsh_mcp = text(&self.sb.prefix.bin("marsh-mcp"));
        let joined = args.join(",");
        let out = self.sbx(&[
            "mcp",
            "add",
            server,
            "--command",
            &marsh_mcp,
            "--args",
            &joined,
        ]);
        assert!(out.status.success(), "{out:?}");
    }

    /// Removes the registration `server` if there is one.
    pub(crate) fn unregister(&self, server: &str) {
        let out = self.sbx(&["mcp", "rm", "--force", server]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || stderr.contains("not found"),
            "{out:?}"
        );
    }

    /// What `mcp publish TOOL -- PIPELINE` leaves: the declaration and the registration.
    pub(crate) fn publish(&self, tool: &str, generation: Option<&str>, pipeline: &str) {
        self.write_declaration(tool, generation, pipeline);
        self.register(&server(), &self.export_args(tool, generation));
    }

    /// The environment every command of this world gets besides the harness's own.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PATH", self.path.clone()),
            ("CODEX_HOME", text(&self.codex_home)),
            ("MARSH_SBX", text(&self.sb.prefix.bin("sbx"))),
            ("MARSH_HOME", text(&self.home)),
            ("MARSH_CONTROL_HOME", text(&self.control)),
            ("SBX_SHIM_STATE", text(&self.sbx_state)),
        ]
    }

    /// `marsh-mcp ARGS` from the workspace: (exit code, stderr).
    pub(crate) fn marsh_mcp(&self, args: &[&str]) -> (Option<i32>, String) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut cmd = self.sb.marsh_mcp(&args, &[]);
        cmd.envs(self.env());
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A `codex` command with this world's CODEX_HOME and the fake user home.
    pub(crate) fn codex_command(&self) -> Command {
        let mut cmd = Command::new(npm_bin("codex"));
        cmd.env_clear()
            .env("PATH", &self.path)
            .env("HOME", self.sb.state().join("user"))
            .env("CODEX_HOME", &self.codex_home)
            .current_dir(self.sb.workspace());
        cmd
    }

    pub(crate) fn codex(&self, args: &[&str]) -> Output {
        self.codex_command().args(args).output().unwrap()
    }

    /// `codex mcp get SERVER --json`, or `None` when Codex has no such server.
    pub(crate) fn codex_entry(&self, server: &str) -> Option<Value> {
        let out = self.codex(&["mcp", "get", server, "--json"]);
        if out.status.success() {
            return Some(serde_json::from_slice(&out.stdout).unwrap());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("No MCP server named '{server}' found")),
            "{stderr}"
        );
        None
    }

    /// The bytes of Codex's config.toml (`None` while it does not exist).
    pub(crate) fn codex_config(&self) -> Option<Vec<u8>> {
        fs::read(self.codex_home.join("config.toml")).ok()
    }

    /// Asserts Codex has exactly the entry install-published writes for `generation`.
    pub(crate) fn assert_installed(&self, generation: Option<&str>) {
        let entry = self.codex_entry(&server()).expect("an entry");
        let transport = &entry["transport"];
        assert_eq!(transport["type"], "stdio", "{entry}");
        assert_eq!(
            transport["command"],
            text(&self.sb.prefix.bin("marsh-mcp")),
            "{entry}"
        );
        assert_eq!(
            transport["args"],
            json!(self.export_args(TOOL, generation)),
            "{entry}"
        );
        assert_eq!(entry["enabled"], true, "{entry}");
    }
}

#[test]
fn install_published_registers_exactly_is_idempotent_and_refuses_what_does_not_match() {
    let w = Publishing::new();
    w.publish(TOOL, Some(G1), PIPELINE);

    // A registration that no longer matches the publication is refused before Codex is
    // touched: another marsh, then a dir.
    let mut tampered = w.export_args(TOOL, Some(G1));
    tampered[10] = "/usr/bin/marsh".into();
    w.register(&server(), &tampered);
    let before = w.codex_config();
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("the sbx registration {} does not match", server()))
            && stderr.contains("the --marsh value is \"/usr/bin/marsh\""),
        "{stderr}"
    );
    let marsh_mcp = text(&w.sb.prefix.bin("marsh-mcp"));
    let joined = w.export_args(TOOL, Some(G1)).join(",");
    w.unregister(&server());
    let out = w.sbx(&[
        "mcp",
        "add",
        &server(),
        "--command",
        &marsh_mcp,
        "--args",
        &joined,
        "--dir",
        "/",
    ]);
    assert!(out.status.success(), "{out:?}");
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("dir is \"/\" instead of unset"), "{stderr}");
    assert_eq!(w.codex_config(), before, "nothing written");
    assert_eq!(w.codex_entry(&server()), None);

    // The matching registration installs exactly `marsh-mcp export-serve …`.
    w.publish(TOOL, Some(G1), PIPELINE);
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "registered {} with codex (published tool {TOOL}, generation {G1})",
            server()
        )),
        "{stderr}"
    );
    w.assert_installed(Some(G1));
    let installed = w.codex_config();

    // Re-running changes nothing.
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("nothing changed"), "{stderr}");
    assert_eq!(w.codex_config(), installed);

    // remove-published removes it.
    let (code, stderr) = w.marsh_mcp(&["remove-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("removed {} from codex", server())),
        "{stderr}"
    );
    assert_eq!(w.codex_entry(&server()), None);

    // A same-name foreign entry is refused by both and left byte-identical.
    let out = w.codex(&["mcp", "add", &server(), "--", "/usr/bin/env", "true"]);
    assert!(out.status.success(), "{out:?}");
    let foreign = w.codex_config().expect("config.toml");
    for verb in ["install-published", "remove-published"] {
        let (code, stderr) = w.marsh_mcp(&[verb, "codex", TOOL]);
        assert_eq!(code, Some(1), "{verb}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "codex already has a different entry named {}",
                server()
            )) && stderr.contains("/usr/bin/env"),
            "{verb}: {stderr}"
        );
        assert_eq!(w.codex_config().as_deref(), Some(&foreign[..]), "{verb}");
    }
}

#[test]
fn remove_published_removes_a_previous_generations_entry_even_after_unpublish() {
    let w = Publishing::new();
    w.publish(TOOL, Some(G1), PIPELINE);
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    w.assert_installed(Some(G1));

    // Republished: a new generation. The old entry is not silently replaced…
    w.publish(TOOL, Some(G2), PIPELINE);
    let old = w.codex_config();
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("different entry") && stderr.contains(G1),
        "{stderr}"
    );
    assert_eq!(w.codex_config(), old);
    // …but remove-published removes it, and the new generation installs.
    let (code, stderr) = w.marsh_mcp(&["remove-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(w.codex_entry(&server()), None);
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    w.assert_installed(Some(G2));

    // A registration left behind for the old generation is refused (the declaration
    // moved on) before Codex is touched.
    w.register(&server(), &w.export_args(TOOL, Some(G1)));
    let (code, stderr) = w.marsh_mcp(&["remove-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    let before = w.codex_config();
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("the registration expects") && stderr.contains("nothing was written"),
        "{stderr}"
    );
    assert_eq!(w.codex_config(), before);

    // Unpublished (declaration and registration gone): install is refused, and
    // remove-published still removes the entry it left.
    w.publish(TOOL, Some(G2), PIPELINE);
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    fs::remove_file(w.declaration(TOOL)).unwrap();
    w.unregister(&server());
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("hello is not published"), "{stderr}");
    let (code, stderr) = w.marsh_mcp(&["remove-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(w.codex_entry(&server()), None);
}

#[test]
fn install_published_is_refused_in_a_guest_and_for_bad_names() {
    let w = Publishing::new();
    w.publish(TOOL, Some(G1), PIPELINE);
    for verb in ["install-published", "remove-published"] {
        let args: Vec<String> = [verb, "codex", TOOL].map(String::from).to_vec();
        let out =
            w.sb.marsh_mcp(&args, &[("MARSH_GUEST", "1")])
                .envs(w.env())
                .output()
                .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("inside a marsh guest"), "{stderr}");
        let (code, stderr) = w.marsh_mcp(&[verb, "codex", "-x"]);
        assert_ne!(code, Some(0), "{stderr}");
        let (code, stderr) = w.marsh_mcp(&[verb, "codex", "a/b"]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("is not a published tool name"), "{stderr}");
        let (code, stderr) = w.marsh_mcp(&[verb, "claude", TOOL]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains("invalid value 'claude'"), "{stderr}");
    }
    assert_eq!(w.codex_config(), None, "Codex never touched");
}

/// The real Codex CLI, through what install-published wrote: `codex app-server` sees
/// exactly one tool from that server, and a call returns the pipeline's output.
#[test]
fn codex_app_server_lists_and_calls_exactly_the_published_tool() {
    let w = Publishing::new();
    w.publish(TOOL, Some(G1), PIPELINE);
    let (code, stderr) = w.marsh_mcp(&["install-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");

    let (mut app, thread_id) = codex_app_thread(w.codex_command(), &w.sb.workspace());
    let status = app_request(
        &mut app,
        "mcpServerStatus/list",
        json!({"threadId": thread_id, "serverName": server()}),
    );
    let entry = status["result"]["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == server())
        .cloned()
        .unwrap_or_else(|| panic!("{status}"));
    let tools: Vec<&String> = entry["tools"]
        .as_object()
        .unwrap_or_else(|| panic!("{entry}"))
        .keys()
        .collect();
    assert_eq!(tools.len(), 1, "{entry}");
    assert!(tools[0].ends_with(TOOL), "{entry}");
    let call = app_request(
        &mut app,
        "mcpServer/tool/call",
        json!({"threadId": thread_id, "server": server(), "tool": TOOL, "arguments": {"input": "from codex"}}),
    );
    assert!(call.to_string().contains("FROM CODEX"), "{call}");
    drop(app);
    let (code, stderr) = w.marsh_mcp(&["remove-published", "codex", TOOL]);
    assert_eq!(code, Some(0), "{stderr}");
}
