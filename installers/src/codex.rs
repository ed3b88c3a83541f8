//! Codex, through its CLI: `codex mcp get NAME --json`, `codex mcp add NAME -- …`,
//! `codex mcp remove NAME`. `codex mcp add` silently overwrites and drops unknown keys,
//! so an existing entry is read first and only an identical one is accepted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::InstallError;
use crate::registration::{Environment, Registration};
use crate::runner::{ClientCommand, Runner};
use crate::verified::ClientStore;

const CODEX_TIMEOUT: Duration = Duration::from_secs(60);

fn codex_binary(env: &Environment) -> Result<PathBuf, InstallError> {
    env.which("codex").ok_or(InstallError::MissingClient {
        client: "codex",
        hint: "install the Codex CLI (npm install -g @openai/codex) and make sure `codex` is on PATH",
    })
}

fn codex(program: &Path, reg: &Registration, env: &Environment, args: &[&str]) -> ClientCommand {
    ClientCommand::new(
        program,
        Path::new(&reg.workspace),
        env.for_client(&["CODEX_HOME"]),
        CODEX_TIMEOUT,
    )
    .args(args.iter().copied())
}

/// The entry as `codex mcp get --json` shows it, or `None` when absent.
fn get(
    program: &Path,
    reg: &Registration,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<Option<Value>, InstallError> {
    let command = codex(program, reg, env, &["mcp", "get", &reg.name, "--json"]);
    let done = command.run(runner)?;
    if done.ok() {
        return serde_json::from_str(&done.stdout).map(Some).map_err(|e| {
            InstallError::Unparseable {
                command: command.display(),
                reason: e.to_string(),
            }
        });
    }
    if done
        .stderr
        .contains(&format!("No MCP server named '{}' found", reg.name))
    {
        return Ok(None);
    }
    Err(command.failure(&done))
}

fn is_default(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// What differs from the expected definition: a stdio server running exactly
/// `marsh-mcp serve …`, enabled, with nothing else configured.
fn difference(reg: &Registration, found: &Value) -> Option<String> {
    let expected = json!({"type": "stdio", "command": reg.marsh_mcp, "args": reg.args("serve")});
    let transport = &found["transport"];
    for key in ["type", "command", "args"] {
        if transport[key] != expected[key] {
            return Some(format!(
                "transport.{key} is {} instead of {}",
                transport[key], expected[key]
            ));
        }
    }
    if let Some(extra) = transport.as_object().and_then(|t| {
        t.iter()
            .find(|(k, v)| !["type", "command", "args"].contains(&k.as_str()) && !is_default(v))
    }) {
        return Some(format!("transport.{} is set to {}", extra.0, extra.1));
    }
    if found["enabled"] != json!(true) {
        return Some("the entry is disabled".into());
    }
    found.as_object().and_then(|o| {
        o.iter()
            .find(|(k, v)| {
                !["name", "enabled", "transport"].contains(&k.as_str()) && !is_default(v)
            })
            .map(|(k, v)| format!("{k} is set to {v}"))
    })
}

pub(crate) struct Codex<'a> {
    program: PathBuf,
    reg: &'a Registration,
    env: &'a Environment,
    runner: &'a dyn Runner,
}

impl Codex<'_> {
    fn run(&self, args: &[&str]) -> Result<(), InstallError> {
        codex(&self.program, self.reg, self.env, args)
            .run_ok(self.runner)
            .map(drop)
    }
}

impl ClientStore for Codex<'_> {
    const CLIENT: &'static str = "codex";

    fn read(&self) -> Result<Option<Value>, InstallError> {
        get(&self.program, self.reg, self.env, self.runner)
    }

    fn difference(&self, found: &Value) -> Option<String> {
        difference(self.reg, found)
    }

    fn add(&self) -> Result<(), InstallError> {
        let serve = self.reg.args("serve");
        let mut args = vec!["mcp", "add", &self.reg.name, "--", &self.reg.marsh_mcp];
        args.extend(serve.iter().map(String::as_str));
        self.run(&args)
    }

    fn remove(&self) -> Result<(), InstallError> {
        self.run(&["mcp", "remove", &self.reg.name])
    }
}

pub(crate) fn store<'a>(
    reg: &'a Registration,
    env: &'a Environment,
    runner: &'a dyn Runner,
) -> Result<Codex<'a>, InstallError> {
    Ok(Codex {
        program: codex_binary(env)?,
        reg,
        env,
        runner,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::registration::Client;
    use crate::runner::Finished;
    use crate::test_support::{Divergence, Fixture, Scripted, assert_each_named, finished, sample};

    /// The entry as `codex mcp get NAME --json` prints it after `codex mcp add NAME --
    /// COMMAND ARGS…`.
    fn shown(name: &str, command: &str, args: &[&str]) -> Value {
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

    fn expected(reg: &Registration) -> Value {
        let args = reg.args("serve");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        shown(&reg.name, &reg.marsh_mcp, &args)
    }

    #[test]
    fn difference_accepts_exactly_the_expected_entry() {
        let reg = sample(Client::Codex);
        assert_eq!(difference(&reg, &expected(&reg)), None);
        // An empty env table is "not configured" too.
        let mut entry = expected(&reg);
        entry["transport"]["env"] = json!({});
        assert_eq!(difference(&reg, &entry), None);
    }

    #[test]
    fn difference_names_each_divergence() {
        let reg = sample(Client::Codex);
        let cases: &[Divergence] = &[
            ("transport.command is \"/usr/bin/other\"", |e| {
                e["transport"]["command"] = json!("/usr/bin/other")
            }),
            ("transport.args is [\"serve\"]", |e| {
                e["transport"]["args"] = json!(["serve"])
            }),
            ("transport.args is null", |e| {
                e["transport"].as_object_mut().unwrap().remove("args");
            }),
            ("transport.type is \"streamable_http\"", |e| {
                e["transport"]["type"] = json!("streamable_http")
            }),
            ("transport.env is set to {\"TOKEN\":\"x\"}", |e| {
                e["transport"]["env"] = json!({"TOKEN": "x"})
            }),
            ("transport.env_vars is set to [\"TOKEN\"]", |e| {
                e["transport"]["env_vars"] = json!(["TOKEN"])
            }),
            ("transport.cwd is set to \"/elsewhere\"", |e| {
                e["transport"]["cwd"] = json!("/elsewhere")
            }),
            ("the entry is disabled", |e| e["enabled"] = json!(false)),
            ("the entry is disabled", |e| {
                e.as_object_mut().unwrap().remove("enabled");
            }),
            ("startup_timeout_sec is set to 5.0", |e| {
                e["startup_timeout_sec"] = json!(5.0)
            }),
            ("disabled_tools is set to [\"shell_run\"]", |e| {
                e["disabled_tools"] = json!(["shell_run"])
            }),
        ];
        assert_each_named(&expected(&reg), cases, |e| difference(&reg, e));
    }

    /// Answers like the real codex CLI over an in-memory config.
    fn fake_codex(stored: &RefCell<Option<Value>>) -> impl Fn(&ClientCommand) -> Finished + '_ {
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
                    *stored.borrow_mut() = Some(shown(name, program, rest));
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

    #[test]
    fn install_gets_adds_and_reads_back_then_reinstall_and_uninstall() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Codex);
        let stored = RefCell::new(None);
        let runner = Scripted::new(fake_codex(&stored));

        let message =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(message.starts_with(&format!("registered {} with codex", reg.name)));
        let calls = runner.calls.borrow().clone();
        for call in &calls {
            assert_eq!(call.program, fx.bin("codex"));
            assert_eq!(call.cwd, fx.workspace);
            assert_eq!(call.timeout, CODEX_TIMEOUT);
            let names: Vec<&str> = call.env.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, ["PATH", "HOME", "CODEX_HOME"], "no SECRET");
        }
        let path = |p: std::path::PathBuf| p.display().to_string();
        let root = fx.root.join("codex/marsh/dev-mcp/codex");
        assert!(reg.root.starts_with(&path(root)), "{}", reg.root);
        let get = ["codex", "mcp", "get", &reg.name, "--json"].map(String::from);
        let add = [
            "codex",
            "mcp",
            "add",
            &reg.name,
            "--",
            &path(fx.bin("marsh-mcp")),
            "serve",
            "--workspace",
            &path(fx.workspace.clone()),
            "--scope-root",
            &reg.root,
            "--marsh",
            &path(fx.bin("marsh")),
            "--sbx",
            &path(fx.bin("sbx")),
        ]
        .map(String::from);
        assert_eq!(runner.take(), [get.to_vec(), add.to_vec(), get.to_vec()]);
        assert_eq!(*stored.borrow(), Some(expected(&reg)));

        let message =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(message.contains("nothing changed"), "{message}");
        assert_eq!(runner.take(), [get.to_vec()]);

        let message =
            crate::uninstall(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert_eq!(message, format!("removed {} from codex", reg.name));
        let remove = ["codex", "mcp", "remove", &reg.name].map(String::from);
        assert_eq!(runner.take(), [get.to_vec(), remove.to_vec()]);
        assert_eq!(*stored.borrow(), None);
    }

    #[test]
    fn install_refuses_a_foreign_entry_after_one_get() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Codex);
        let foreign = shown(&reg.name, "/usr/bin/other-server", &[]);
        let stored = RefCell::new(Some(foreign.clone()));
        let runner = Scripted::new(fake_codex(&stored));
        let err =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap_err();
        assert!(
            matches!(&err, InstallError::Conflict { client: "codex", difference, .. }
                if difference.contains("/usr/bin/other-server")),
            "{err:?}"
        );
        assert_eq!(runner.take().len(), 1);
        assert_eq!(*stored.borrow(), Some(foreign));
    }

    #[test]
    fn install_stops_when_get_fails_otherwise() {
        let fx = Fixture::new();
        let runner = Scripted::new(|_: &ClientCommand| finished(1, "", "config.toml is broken"));
        let err =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap_err();
        assert!(
            matches!(&err, InstallError::ClientFailed { code: Some(1), diagnostic, .. }
                if diagnostic == "config.toml is broken"),
            "{err:?}"
        );
        assert_eq!(runner.take().len(), 1, "nothing is added");
    }
}
