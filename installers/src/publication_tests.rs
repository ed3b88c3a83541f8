#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};

use serde_json::json;

use super::*;
use crate::runner::{ClientCommand, Finished};
use crate::test_support::{Fixture, Scripted, codex_shown, fake_codex, finished};

const G1: &str = "0b6e3c52-8f6a-4d0e-9c1b-2f3a4b5c6d7e";
const G2: &str = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a";
thread_local! {
    /// The stock SBX server of `hello` for this test's [`World`] (its workspace and home).
    static SERVER: RefCell<String> = const { RefCell::new(String::new()) };
}

fn server() -> String {
    SERVER.with(|s| s.borrow().clone())
}

/// [`server`], under a name that bindings called `server` do not shadow.
fn expected_server() -> String {
    server()
}

/// A fixture with a marsh home, a control directory holding `mcp/published/`, and an
/// environment naming them (plus `SECRET`, which no client may see).
struct World {
    fx: Fixture,
    env: Environment,
    home: PathBuf,
    declaration: PathBuf,
}

fn private_dir(path: &Path) {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).unwrap();
}

fn text(path: &Path) -> String {
    path.display().to_string()
}

impl World {
    fn new() -> Self {
        Self::with(&[])
    }

    fn with(extra: &[(&str, String)]) -> Self {
        let fx = Fixture::new();
        let home = fx.root.join("marsh-home");
        private_dir(&home);
        let control = fx.root.join("control");
        for dir in [
            control.clone(),
            control.join("mcp"),
            control.join("mcp/published"),
        ] {
            private_dir(&dir);
        }
        let mut vars = vec![
            ("PATH", text(&fx.root.join("bin"))),
            ("HOME", text(&fx.root.join("home"))),
            ("CODEX_HOME", text(&fx.root.join("codex"))),
            ("MARSH_HOME", text(&home)),
            ("MARSH_CONTROL_HOME", text(&control)),
            ("SECRET", "must-not-leak".into()),
        ];
        vars.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
        let env = Environment::new(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        let key = published::PublisherKey::of(
            &fs::canonicalize(&fx.workspace).unwrap(),
            &fs::canonicalize(&home).unwrap(),
        );
        SERVER.with(|s| *s.borrow_mut() = key.server_for("hello"));
        private_dir(&control.join("mcp/published").join(key.as_str()));
        Self {
            declaration: control
                .join("mcp/published")
                .join(key.as_str())
                .join("hello.json"),
            fx,
            env,
            home,
        }
    }

    fn workspace(&self) -> &Path {
        &self.fx.workspace
    }

    /// Writes the declaration of `tool` (owner-only) at generation `generation`.
    fn declare(&self, tool: &str, generation: Option<&str>) {
        let meta = fs::metadata(self.workspace()).unwrap();
        let mut doc = json!({
            "schema": "marsh.published_tool/v1",
            "tool_name": tool,
            "description": "Say hello",
            "pipeline": "tr a-z A-Z",
            "input_schema": {"type": "object", "properties": {"input": {"type": "string"}}, "additionalProperties": false},
            "max_output_bytes": 262144,
            "timeout_ms": 120000,
            "canonical_workspace": self.workspace(),
            "workspace_identity": {"device": meta.dev(), "inode": meta.ino()},
            "home": self.home,
        });
        if let Some(g) = generation {
            doc["publication_generation"] = json!(g);
        }
        let _ = fs::remove_file(&self.declaration);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.declaration)
            .unwrap();
        file.write_all(doc.to_string().as_bytes()).unwrap();
    }

    /// The `export-serve` arguments of this publication, spelled out.
    fn args(&self, generation: Option<&str>, sbx: &str) -> Vec<String> {
        let mut args = vec![
            "export-serve".to_string(),
            "--workspace".into(),
            text(self.workspace()),
            "--home".into(),
            text(&self.home),
            "--declaration".into(),
            text(&self.declaration),
        ];
        if let Some(g) = generation {
            args.extend(["--expected-generation".into(), g.to_string()]);
        }
        args.extend([
            "--marsh".into(),
            text(&self.fx.bin("marsh")),
            "--sbx".into(),
            sbx.into(),
        ]);
        args
    }

    fn sbx(&self) -> String {
        text(&self.fx.bin("sbx"))
    }

    fn marsh_mcp(&self) -> String {
        text(&self.fx.bin("marsh-mcp"))
    }

    /// `sbx mcp inspect SERVER --json` of the registration the publisher writes.
    fn registration(&self, generation: Option<&str>) -> Value {
        json!({
            "name": server(),
            "command": self.marsh_mcp(),
            "args": self.args(generation, &self.sbx()),
            "dir": null,
            "loaded": [],
        })
    }

    /// The codex entry install-published writes for `generation`.
    fn entry(&self, generation: Option<&str>) -> Value {
        let args = self.args(generation, &self.sbx());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        codex_shown(&server(), &self.marsh_mcp(), &args)
    }

    fn install(&self, runner: &dyn Runner) -> Result<String, InstallError> {
        install_published(
            PublishedClient::Codex,
            "hello",
            &self.env,
            self.workspace(),
            &self.fx.exe,
            runner,
        )
    }

    fn remove(&self, runner: &dyn Runner) -> Result<String, InstallError> {
        remove_published(
            PublishedClient::Codex,
            "hello",
            &self.env,
            self.workspace(),
            &self.fx.exe,
            runner,
        )
    }
}

/// The stand-in sbx's `mcp inspect` over one optional registration, and the fake codex.
fn fake_clients<'a>(
    registration: &'a RefCell<Option<Value>>,
    codex: &'a RefCell<Option<Value>>,
) -> impl Fn(&ClientCommand) -> Finished + 'a {
    let codex = fake_codex(codex);
    move |command| {
        if !command.program.ends_with("sbx") {
            return codex(command);
        }
        let args: Vec<&str> = command.args.iter().map(String::as_str).collect();
        match (args.as_slice(), &*registration.borrow()) {
            (["mcp", "inspect", _, "--json"], Some(found)) => finished(0, &found.to_string(), ""),
            (["mcp", "inspect", name, "--json"], None) => {
                finished(1, "", &format!("MCP server \"{name}\" not found\n"))
            }
            (other, _) => finished(2, "", &format!("unexpected sbx call {other:?}")),
        }
    }
}

fn words(args: &[&str]) -> Vec<String> {
    args.iter().map(|w| (*w).to_string()).collect()
}

fn inspect() -> Vec<String> {
    words(&["sbx", "mcp", "inspect", &server(), "--json"])
}

fn get() -> Vec<String> {
    words(&["codex", "mcp", "get", &server(), "--json"])
}

#[test]
fn install_checks_the_registration_adds_reads_back_and_then_changes_nothing() {
    let w = World::new();
    w.declare("hello", Some(G1));
    let registration = RefCell::new(Some(w.registration(Some(G1))));
    let codex = RefCell::new(None);
    let runner = Scripted::new(fake_clients(&registration, &codex));

    let message = w.install(&runner).unwrap();
    assert_eq!(
        message,
        format!(
            "registered {} with codex (published tool hello, generation {G1})",
            server()
        )
    );
    let calls = runner.calls.borrow().clone();
    for call in &calls {
        assert_eq!(call.cwd, w.workspace());
        let names: Vec<&str> = call.env.iter().map(|(k, _)| k.as_str()).collect();
        if call.program.ends_with("sbx") {
            assert_eq!(call.program, w.fx.bin("sbx"));
            assert_eq!(
                names,
                ["PATH", "USER", "LOGNAME", "HOME", "MARSH_CONTROL_HOME"],
                "no SECRET"
            );
        } else {
            assert_eq!(call.program, w.fx.bin("codex"));
            assert_eq!(
                names,
                ["PATH", "USER", "LOGNAME", "HOME", "CODEX_HOME"],
                "no SECRET"
            );
        }
    }
    let mut add = words(&["codex", "mcp", "add", &server(), "--", &w.marsh_mcp()]);
    add.extend(w.args(Some(G1), &w.sbx()));
    assert_eq!(runner.take(), [inspect(), get(), add, get()]);
    assert_eq!(*codex.borrow(), Some(w.entry(Some(G1))));

    let message = w.install(&runner).unwrap();
    assert!(message.contains("nothing changed"), "{message}");
    assert_eq!(runner.take(), [inspect(), get()]);
}

#[test]
fn install_pins_the_sbx_the_registration_records_and_accepts_no_generation() {
    let w = World::new();
    w.declare("hello", None);
    let mut found = w.registration(None);
    found["args"] = json!(w.args(None, "/opt/elsewhere/sbx"));
    let registration = RefCell::new(Some(found));
    let codex = RefCell::new(None);
    let runner = Scripted::new(fake_clients(&registration, &codex));
    let message = w.install(&runner).unwrap();
    assert!(message.ends_with("generation none)"), "{message}");
    let args = w.args(None, "/opt/elsewhere/sbx");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(
        *codex.borrow(),
        Some(codex_shown(&server(), &w.marsh_mcp(), &args))
    );
}

#[test]
fn install_refuses_a_foreign_entry_after_one_get_and_leaves_it() {
    let w = World::new();
    w.declare("hello", Some(G1));
    let registration = RefCell::new(Some(w.registration(Some(G1))));
    let foreign = codex_shown(&server(), "/usr/bin/other-server", &[]);
    let codex = RefCell::new(Some(foreign.clone()));
    let runner = Scripted::new(fake_clients(&registration, &codex));
    let err = w.install(&runner).unwrap_err();
    assert!(
        matches!(&err, InstallError::Conflict { client: "codex", name, difference }
            if *name == server() && difference.contains("/usr/bin/other-server")),
        "{err:?}"
    );
    assert_eq!(runner.take(), [inspect(), get()]);
    assert_eq!(*codex.borrow(), Some(foreign));
}

#[test]
fn install_refuses_a_previous_generations_entry_until_it_is_removed() {
    let w = World::new();
    w.declare("hello", Some(G2));
    let registration = RefCell::new(Some(w.registration(Some(G2))));
    let codex = RefCell::new(Some(w.entry(Some(G1))));
    let runner = Scripted::new(fake_clients(&registration, &codex));
    let err = w.install(&runner).unwrap_err();
    assert!(
        matches!(&err, InstallError::Conflict { difference, .. } if difference.contains(G1)),
        "{err:?}"
    );
    assert_eq!(*codex.borrow(), Some(w.entry(Some(G1))));
    w.remove(&runner).unwrap();
    w.install(&runner).unwrap();
    assert_eq!(*codex.borrow(), Some(w.entry(Some(G2))));
}

/// One way the registration or declaration can disagree: the change, and text the
/// error must contain.
type Mismatch = (&'static str, fn(&World, &mut Value));

#[test]
fn a_registration_that_does_not_match_is_refused_before_any_codex_call() {
    let cases: &[Mismatch] = &[
        ("the command is \"/usr/bin/other\"", |_, r| {
            r["command"] = json!("/usr/bin/other")
        }),
        ("dir is \"/work\" instead of unset", |_, r| {
            r["dir"] = json!("/work")
        }),
        ("the --workspace value is \"/elsewhere\"", |_, r| {
            r["args"][2] = json!("/elsewhere")
        }),
        ("the --home value is \"/other-home\"", |_, r| {
            r["args"][4] = json!("/other-home")
        }),
        ("the --declaration value is \"/tmp/hello.json\"", |_, r| {
            r["args"][6] = json!("/tmp/hello.json")
        }),
        ("the --marsh value is \"/usr/bin/marsh\"", |_, r| {
            r["args"][10] = json!("/usr/bin/marsh")
        }),
        ("the pinned sbx \"sbx\" is not an absolute path", |_, r| {
            r["args"][12] = json!("sbx")
        }),
        ("argument 0 is \"serve\"", |_, r| {
            r["args"][0] = json!("serve")
        }),
        ("with G a lowercase UUID", |_, r| {
            r["args"][8] = json!(G1.to_uppercase())
        }),
        ("with G a lowercase UUID", |_, r| {
            r["args"].as_array_mut().unwrap().push(json!("--extra"))
        }),
        ("not a list of strings", |_, r| {
            r["args"] = json!("export-serve")
        }),
    ];
    for (want, change) in cases {
        let w = World::new();
        w.declare("hello", Some(G1));
        let mut found = w.registration(Some(G1));
        change(&w, &mut found);
        let registration = RefCell::new(Some(found));
        let codex = RefCell::new(None);
        let runner = Scripted::new(fake_clients(&registration, &codex));
        let err = w.install(&runner).unwrap_err();
        assert!(
            matches!(&err, InstallError::RegistrationMismatch { server, tool, difference }
                if *server == expected_server() && tool == "hello" && difference.contains(want)),
            "{want}: {err:?}"
        );
        assert!(err.to_string().contains("nothing was written"), "{err}");
        assert_eq!(runner.take(), [inspect()], "{want}");
        assert_eq!(*codex.borrow(), None);
    }
}

#[test]
fn a_missing_registration_or_declaration_is_refused_before_any_codex_call() {
    let w = World::new();
    let registration = RefCell::new(Some(w.registration(Some(G1))));
    let codex = RefCell::new(None);
    let runner = Scripted::new(fake_clients(&registration, &codex));
    let err = w.install(&runner).unwrap_err();
    assert!(
        matches!(&err, InstallError::NotPublished { tool, path } if tool == "hello" && *path == w.declaration),
        "{err:?}"
    );
    assert!(runner.take().is_empty());

    w.declare("hello", Some(G1));
    *registration.borrow_mut() = None;
    let err = w.install(&runner).unwrap_err();
    assert!(
        matches!(&err, InstallError::NotRegistered { server, .. } if *server == expected_server()),
        "{err:?}"
    );
    assert_eq!(runner.take(), [inspect()]);
    assert_eq!(*codex.borrow(), None);
}

#[test]
fn a_declaration_that_does_not_match_the_registration_is_refused_before_any_codex_call() {
    let cases: &[Mismatch] = &[
        // Re-generated declaration, stale registration.
        ("has generation Some(\"5d4c3b2a", |w, _| {
            w.declare("hello", Some(G2))
        }),
        ("has generation None", |w, _| w.declare("hello", None)),
        ("declares the tool \"other\"", |w, _| {
            w.declare("other", Some(G1))
        }),
        ("not owner-only (mode 644)", |w, _| {
            fs::set_permissions(&w.declaration, fs::Permissions::from_mode(0o644)).unwrap()
        }),
        ("2 hard links, not 1", |w, _| {
            fs::hard_link(&w.declaration, w.fx.root.join("control/link")).unwrap()
        }),
        ("is malformed", |w, _| {
            fs::write(&w.declaration, b"{\"schema\": 1}").unwrap()
        }),
    ];
    for (want, change) in cases {
        let w = World::new();
        w.declare("hello", Some(G1));
        let mut found = w.registration(Some(G1));
        change(&w, &mut found);
        let registration = RefCell::new(Some(found));
        let codex = RefCell::new(None);
        let runner = Scripted::new(fake_clients(&registration, &codex));
        let err = w.install(&runner).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(want), "{want}: {text}");
        assert!(text.contains("nothing was written"), "{text}");
        assert!(
            text.contains(&w.declaration.display().to_string()),
            "{text}"
        );
        assert_eq!(runner.take(), [inspect()], "{want}");
        assert_eq!(*codex.borrow(), None);
    }
}

#[test]
fn remove_deletes_current_and_previous_generation_entries_without_a_declaration() {
    let w = World::new();
    let remove = words(&["codex", "mcp", "remove", &server()]);
    let entries = [w.entry(Some(G1)), w.entry(Some(G2)), w.entry(None), {
        let args = w.args(Some(G1), "/opt/elsewhere/sbx");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        codex_shown(&server(), &w.marsh_mcp(), &args)
    }];
    for entry in entries {
        let registration = RefCell::new(None);
        let codex = RefCell::new(Some(entry.clone()));
        let runner = Scripted::new(fake_clients(&registration, &codex));
        let message = w.remove(&runner).unwrap();
        assert_eq!(message, format!("removed {} from codex", server()));
        assert_eq!(runner.take(), [get(), remove.clone()], "{entry}");
        assert_eq!(*codex.borrow(), None);
    }
    // Absent: nothing to do.
    let registration = RefCell::new(None);
    let codex = RefCell::new(None);
    let runner = Scripted::new(fake_clients(&registration, &codex));
    let message = w.remove(&runner).unwrap();
    assert!(message.contains("nothing to remove"), "{message}");
    assert_eq!(runner.take(), [get()]);
}

#[test]
fn remove_refuses_any_entry_that_is_not_this_publications_and_leaves_it() {
    let w = World::new();
    let cases: &[Mismatch] = &[
        ("transport.command is \"/usr/bin/other\"", |_, e| {
            e["transport"]["command"] = json!("/usr/bin/other")
        }),
        (
            "transport.args: the --workspace value is \"/elsewhere\"",
            |_, e| e["transport"]["args"][2] = json!("/elsewhere"),
        ),
        ("transport.args: the --home value", |_, e| {
            e["transport"]["args"][4] = json!("/other-home")
        }),
        // A moved marsh is still ours (see below); a program of another name is not.
        ("transport.args: the --marsh value", |_, e| {
            e["transport"]["args"][10] = json!("/usr/bin/other")
        }),
        ("transport.args: argument 0 is \"serve\"", |_, e| {
            e["transport"]["args"][0] = json!("serve")
        }),
        ("is not an absolute path", |_, e| {
            e["transport"]["args"][12] = json!("sbx")
        }),
        ("with G a lowercase UUID", |_, e| {
            e["transport"]["args"][8] = json!("not-a-uuid")
        }),
        ("transport.env is set to", |_, e| {
            e["transport"]["env"] = json!({"TOKEN": "x"})
        }),
        ("the entry is disabled", |_, e| e["enabled"] = json!(false)),
    ];
    for (want, change) in cases {
        let mut entry = w.entry(Some(G1));
        change(&w, &mut entry);
        let registration = RefCell::new(None);
        let codex = RefCell::new(Some(entry.clone()));
        let runner = Scripted::new(fake_clients(&registration, &codex));
        let err = w.remove(&runner).unwrap_err();
        assert!(
            matches!(&err, InstallError::Conflict { client: "codex", difference, .. }
                if difference.contains(want)),
            "{want}: {err:?}"
        );
        assert_eq!(runner.take(), [get()], "{want}");
        assert_eq!(*codex.borrow(), Some(entry));
    }
}

#[test]
fn refused_in_a_guest_and_for_bad_names_before_any_command() {
    let w = World::with(&[("MARSHD_TOKEN", "x".into())]);
    w.declare("hello", Some(G1));
    let registration = RefCell::new(Some(w.registration(Some(G1))));
    let codex = RefCell::new(None);
    let runner = Scripted::new(fake_clients(&registration, &codex));
    assert!(matches!(
        w.install(&runner),
        Err(InstallError::InsideGuest { .. })
    ));
    assert!(matches!(
        w.remove(&runner),
        Err(InstallError::InsideGuest { .. })
    ));
    let w = World::new();
    for name in ["", "-x", "..", "a/b", "a,b"] {
        for run in [install_published, remove_published] {
            let err = run(
                PublishedClient::Codex,
                name,
                &w.env,
                w.workspace(),
                &w.fx.exe,
                &runner,
            )
            .unwrap_err();
            assert!(
                matches!(&err, InstallError::BadToolName { name: n } if n == name),
                "{err:?}"
            );
        }
    }
    assert!(runner.take().is_empty());
}

#[test]
fn the_control_directory_is_the_variable_when_absolute_else_below_the_passwd_home() {
    let env = |vars: &[(&str, &str)]| {
        Environment::new(vars.iter().map(|(k, v)| ((*k).into(), (*v).into())))
    };
    assert_eq!(
        control_dir(&env(&[("MARSH_CONTROL_HOME", "/srv/control")])).unwrap(),
        PathBuf::from("/srv/control")
    );
    let default = passwd_home().unwrap().join(".local/state/marsh-control");
    for vars in [
        &[
            ("MARSH_CONTROL_HOME", "relative/control"),
            ("HOME", "/elsewhere"),
        ][..],
        &[("MARSH_CONTROL_HOME", ""), ("HOME", "/elsewhere")],
        &[("HOME", "/elsewhere")],
    ] {
        assert_eq!(control_dir(&env(vars)).unwrap(), default, "{vars:?}");
    }
}

#[test]
fn the_marsh_home_follows_marsh_and_must_exist() {
    let w = World::new();
    assert_eq!(marsh_home(&w.env, w.workspace()).unwrap(), w.home);
    let relative = Environment::new([("MARSH_HOME".into(), "../marsh-home".into())]);
    assert_eq!(marsh_home(&relative, w.workspace()).unwrap(), w.home);
    let default = Environment::new([("HOME".into(), text(&w.fx.root.join("home")).into())]);
    let err = marsh_home(&default, w.workspace()).unwrap_err();
    assert!(
        matches!(&err, InstallError::Resolve { what: "the marsh home", path, .. }
            if *path == w.fx.root.join("home/.marsh")),
        "{err:?}"
    );
}

/// After a new install prefix (marsh-mcp and marsh moved): install replaces this
/// generation's entry, remove deletes any generation's, and an entry of this shape
/// for another declaration stays refused.
#[test]
fn entries_whose_marsh_mcp_and_marsh_moved_are_replaced_or_removed() {
    let w = World::new();
    w.declare("hello", Some(G2));
    let moved = |generation: Option<&str>| {
        let mut entry = w.entry(generation);
        entry["transport"]["command"] = json!("/opt/old-prefix/bin/marsh-mcp");
        entry["transport"]["args"][10] = json!("/opt/old-prefix/bin/marsh");
        entry
    };
    let registration = RefCell::new(Some(w.registration(Some(G2))));
    let codex = RefCell::new(Some(moved(Some(G2))));
    let runner = Scripted::new(fake_clients(&registration, &codex));
    let message = w.install(&runner).unwrap();
    assert!(
        message.starts_with(&format!("replaced our earlier entry {}", server())),
        "{message}"
    );
    assert_eq!(*codex.borrow(), Some(w.entry(Some(G2))));

    // Another generation's moved entry: refused by install, removed by remove.
    *codex.borrow_mut() = Some(moved(Some(G1)));
    assert!(matches!(
        w.install(&runner),
        Err(InstallError::Conflict { .. })
    ));
    assert_eq!(*codex.borrow(), Some(moved(Some(G1))));
    w.remove(&runner).unwrap();
    assert_eq!(*codex.borrow(), None);

    // The same shape for another declaration is not ours.
    let mut other = moved(Some(G1));
    other["transport"]["args"][6] = json!("/tmp/other.json");
    *codex.borrow_mut() = Some(other.clone());
    assert!(matches!(
        w.remove(&runner),
        Err(InstallError::Conflict { .. })
    ));
    assert_eq!(*codex.borrow(), Some(other));
}
