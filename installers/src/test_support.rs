//! Shared fixtures for the unit tests: a temp install layout with a fake environment,
//! fixed registrations, and a scripted [`Runner`] that records what it was asked to run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cell::RefCell;
use std::fs;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::InstallError;
use crate::registration::{Client, Environment, Registration};
use crate::runner::{ClientCommand, Finished, Runner};

/// A registration with fixed, recognisable values (no filesystem involved).
pub fn sample(client: Client) -> Registration {
    Registration {
        client,
        name: "marsh-dev-0123456789ab".into(),
        workspace: "/work/ws".into(),
        marsh_mcp: "/opt/bin/marsh-mcp".into(),
        marsh: "/opt/bin/marsh".into(),
        sbx: "/opt/bin/sbx".into(),
        root: "/state/root".into(),
    }
}

/// A temp directory holding `bin/{codex,claude,sbx,marsh-mcp,marsh}` (empty files: the
/// scripted runner never executes them), a workspace `ws/` and a home `home/`, plus an
/// environment naming them and one variable no client may see (`SECRET`).
pub struct Fixture {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub workspace: PathBuf,
    pub exe: PathBuf,
    pub env: Environment,
}

impl Fixture {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        let bin = root.join("bin");
        fs::create_dir_all(&bin).unwrap();
        for name in ["codex", "claude", "sbx", "marsh-mcp", "marsh"] {
            fs::write(bin.join(name), "").unwrap();
        }
        let workspace = root.join("ws");
        let home = root.join("home");
        fs::create_dir_all(&workspace).unwrap();
        fs::create_dir_all(&home).unwrap();
        let env = Environment::new(
            [
                ("PATH", bin.display().to_string()),
                ("HOME", home.display().to_string()),
                ("CODEX_HOME", root.join("codex").display().to_string()),
                ("SECRET", "must-not-leak".into()),
                ("USER", "mallory".into()),
                ("LOGNAME", "mallory".into()),
            ]
            .map(|(k, v)| (k.into(), v.into())),
        );
        Self {
            _dir: dir,
            exe: bin.join("marsh-mcp"),
            root,
            workspace,
            env,
        }
    }

    pub fn bin(&self, name: &str) -> PathBuf {
        self.root.join("bin").join(name)
    }

    pub fn registration(&self, client: Client) -> Registration {
        Registration::resolve(client, &self.env, &self.workspace, &self.exe).unwrap()
    }
}

pub fn finished(code: i32, stdout: &str, stderr: &str) -> Finished {
    Finished {
        code: Some(code),
        stdout: stdout.into(),
        stderr: stderr.into(),
    }
}

/// The program's file name followed by the arguments.
pub fn argv(command: &ClientCommand) -> Vec<String> {
    let name = command.program.file_name().unwrap().to_string_lossy();
    std::iter::once(name.into_owned())
        .chain(command.args.iter().cloned())
        .collect()
}

/// Answers every command with `answer` and records each one.
pub struct Scripted<F> {
    pub calls: RefCell<Vec<ClientCommand>>,
    answer: F,
}

impl<F: Fn(&ClientCommand) -> Finished> Scripted<F> {
    pub fn new(answer: F) -> Self {
        Self {
            calls: RefCell::new(Vec::new()),
            answer,
        }
    }

    /// The argv of every command run so far, then forgets them.
    pub fn take(&self) -> Vec<Vec<String>> {
        self.calls.take().iter().map(argv).collect()
    }
}

impl<F: Fn(&ClientCommand) -> Finished> Runner for Scripted<F> {
    fn run(&self, command: &ClientCommand) -> Result<Finished, InstallError> {
        self.calls.borrow_mut().push(command.clone());
        Ok((self.answer)(command))
    }
}

/// One divergence from an expected entry: text its difference must contain, and the
/// change that produces it.
pub type Divergence = (&'static str, fn(&mut serde_json::Value));

/// Applies each change to a copy of `expected` and checks `difference` names it.
pub fn assert_each_named(
    expected: &serde_json::Value,
    cases: &[Divergence],
    difference: impl Fn(&serde_json::Value) -> Option<String>,
) {
    for (want, change) in cases {
        let mut entry = expected.clone();
        change(&mut entry);
        let got = difference(&entry);
        assert!(
            got.as_deref().is_some_and(|d| d.contains(want)),
            "{want}: got {got:?}"
        );
    }
}

/// The entry as `codex mcp get NAME --json` prints it after `codex mcp add NAME --
/// COMMAND ARGS…`.
pub fn codex_shown(name: &str, command: &str, args: &[&str]) -> Value {
    json!({
        "name": name,
        "enabled": true,
        "transport": {
            "type": "stdio",
            "command": command,
            "args": args,
            "env": null,
            "env_vars": [],
            "cwd": null,
        },
        "enabled_tools": null,
        "disabled_tools": null,
        "startup_timeout_sec": null,
        "tool_timeout_sec": null,
    })
}

/// Answers like the real codex CLI over an in-memory config.
pub fn fake_codex(stored: &RefCell<Option<Value>>) -> impl Fn(&ClientCommand) -> Finished + '_ {
    move |command| {
        let args: Vec<&str> = command.args.iter().map(String::as_str).collect();
        match args.as_slice() {
            ["mcp", "get", name, "--json"] => match &*stored.borrow() {
                Some(entry) => finished(0, &serde_json::to_string_pretty(entry).unwrap(), ""),
                None => finished(
                    1,
                    "",
                    &format!("Error: No MCP server named '{name}' found.\n"),
                ),
            },
            ["mcp", "add", name, "--", program, rest @ ..] => {
                *stored.borrow_mut() = Some(codex_shown(name, program, rest));
                finished(0, &format!("Added global MCP server '{name}'.\n"), "")
            }
            ["mcp", "remove", name] => {
                *stored.borrow_mut() = None;
                finished(0, &format!("Removed global MCP server '{name}'.\n"), "")
            }
            other => finished(2, "", &format!("unexpected codex call {other:?}")),
        }
    }
}
