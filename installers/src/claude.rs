//! Claude Code, through its CLI in local scope (`claude mcp add NAME --scope local --
//! …`; the name precedes any options), never the shared `.mcp.json`. Claude keys local
//! scope by the enclosing git root (or the exact cwd outside git) inside
//! `$CLAUDE_CONFIG_DIR/.claude.json` (default `~/.claude.json`); the entry is read there
//! before and after every change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::InstallError;
use crate::registration::{Environment, Registration};
use crate::runner::{ClientCommand, Runner};
use crate::verified::{ClientStore, ClientWriter};

const CLAUDE_TIMEOUT: Duration = Duration::from_secs(60);
/// Keep the CLI offline and quiet: no update checks, telemetry or other traffic.
const OFFLINE: &[(&str, &str)] = &[
    ("DISABLE_AUTOUPDATER", "1"),
    ("DISABLE_TELEMETRY", "1"),
    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
];
const CONFIG_LIMIT: u64 = 16 * 1024 * 1024;

fn claude_binary(env: &Environment) -> Result<PathBuf, InstallError> {
    env.which("claude").ok_or(InstallError::MissingClient {
        client: "claude",
        hint: "install Claude Code (npm install -g @anthropic-ai/claude-code) and make sure `claude` is on PATH",
    })
}

fn claude(
    program: &Path,
    reg: &Registration,
    env: &Environment,
    args: Vec<String>,
) -> ClientCommand {
    let mut vars = env.for_client(env.found_in("claude").as_deref(), &["CLAUDE_CONFIG_DIR"]);
    vars.extend(
        OFFLINE
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string())),
    );
    ClientCommand::new(program, Path::new(&reg.workspace), vars, CLAUDE_TIMEOUT).args(args)
}

fn config_path(env: &Environment) -> Result<PathBuf, InstallError> {
    match env.path("CLAUDE_CONFIG_DIR") {
        Some(dir) => Ok(dir.join(".claude.json")),
        None => env
            .path("HOME")
            .map(|h| h.join(".claude.json"))
            .ok_or(InstallError::NoHome {
                what: "CLAUDE_CONFIG_DIR",
            }),
    }
}

/// The project key Claude uses for local scope: the nearest ancestor holding `.git`,
/// else the workspace itself.
fn project_key(workspace: &Path) -> PathBuf {
    workspace
        .ancestors()
        .find(|dir| dir.join(".git").exists())
        .unwrap_or(workspace)
        .to_path_buf()
}

/// The local-scope entry, or `None`.
fn local_entry(reg: &Registration, env: &Environment) -> Result<Option<Value>, InstallError> {
    use std::io::Read;
    let path = config_path(env)?;
    let unreadable = |reason: String| InstallError::ReadConfig {
        path: path.clone(),
        reason,
    };
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(e.to_string())),
    };
    let mut text = String::new();
    file.take(CONFIG_LIMIT)
        .read_to_string(&mut text)
        .map_err(|e| unreadable(e.to_string()))?;
    let config: Value = serde_json::from_str(&text).map_err(|e| unreadable(e.to_string()))?;
    let key = project_key(Path::new(&reg.workspace)).display().to_string();
    Ok(config["projects"][key.as_str()]["mcpServers"]
        .get(&reg.name)
        .cloned())
}

/// The entry `claude mcp add` writes for a stdio server running `args`.
fn entry(reg: &Registration, args: Vec<String>) -> Value {
    json!({"type": "stdio", "command": reg.marsh_mcp, "args": args, "env": {}})
}

/// What differs from this workspace's `connect --start` entry, or `None`.
fn difference(reg: &Registration, found: &Value) -> Option<String> {
    let expected = entry(reg, reg.client_args());
    if *found == expected {
        return None;
    }
    let keys: std::collections::BTreeSet<&String> = found
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
        .chain(expected.as_object().into_iter().flat_map(|o| o.keys()))
        .collect();
    keys.into_iter()
        .find(|k| found.get(k.as_str()) != expected.get(k.as_str()))
        .map(|k| {
            format!(
                "{k} is {} instead of {}",
                found.get(k.as_str()).unwrap_or(&Value::Null),
                expected.get(k.as_str()).unwrap_or(&Value::Null)
            )
        })
        .or_else(|| Some("the entry differs".into()))
}

pub(crate) struct Claude<'a> {
    program: PathBuf,
    reg: &'a Registration,
    env: &'a Environment,
    runner: &'a dyn Runner,
}

impl Claude<'_> {
    fn run(&self, args: Vec<String>) -> Result<(), InstallError> {
        claude(&self.program, self.reg, self.env, args)
            .run_ok(self.runner)
            .map(drop)
    }
}

impl ClientStore for Claude<'_> {
    const CLIENT: &'static str = "claude";

    fn read(&self) -> Result<Option<Value>, InstallError> {
        local_entry(self.reg, self.env)
    }

    fn difference(&self, found: &Value) -> Option<String> {
        difference(self.reg, found)
    }

    /// An earlier entry of ours ([`Registration::is_own_earlier`]), otherwise exactly
    /// as `claude mcp add` writes it.
    fn upgradable(&self, found: &Value) -> bool {
        let written = |e: &Value| json!({"type": e["type"], "env": e["env"]});
        let keys_ok = found.as_object().is_some_and(|o| {
            o.keys()
                .all(|k| ["type", "command", "args", "env"].contains(&k.as_str()))
        });
        keys_ok
            && written(found) == written(&entry(self.reg, Vec::new()))
            && self.reg.is_own_earlier(&found["command"], &found["args"])
    }

    fn remove(&self) -> Result<(), InstallError> {
        let args = ["mcp", "remove", &self.reg.name, "--scope", "local"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        self.run(args)
    }
}

impl ClientWriter for Claude<'_> {
    fn add(&self) -> Result<(), InstallError> {
        // The name precedes every option: `-e` would swallow what follows it.
        let mut args = vec![
            "mcp".to_string(),
            "add".into(),
            self.reg.name.clone(),
            "--scope".into(),
            "local".into(),
            "--".into(),
            self.reg.marsh_mcp.clone(),
        ];
        args.extend(self.reg.client_args());
        self.run(args)
    }
}

pub(crate) fn store<'a>(
    reg: &'a Registration,
    env: &'a Environment,
    runner: &'a dyn Runner,
) -> Result<Claude<'a>, InstallError> {
    Ok(Claude {
        program: claude_binary(env)?,
        reg,
        env,
        runner,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::registration::Client;
    use crate::runner::Finished;
    use crate::test_support::{Divergence, Fixture, Scripted, assert_each_named, finished, sample};

    fn expected(reg: &Registration) -> Value {
        entry(reg, reg.client_args())
    }

    #[test]
    fn difference_accepts_exactly_the_expected_entry() {
        let reg = sample(Client::Claude);
        assert_eq!(difference(&reg, &expected(&reg)), None);
    }

    #[test]
    fn difference_names_each_divergence() {
        let reg = sample(Client::Claude);
        let cases: &[Divergence] = &[
            (
                "command is \"/usr/bin/other\" instead of \"/opt/bin/marsh-mcp\"",
                |e| e["command"] = json!("/usr/bin/other"),
            ),
            (
                "args is [\"serve\"] instead of [\"connect\",\"--start\",\"--workspace\"",
                |e| e["args"] = json!(["serve"]),
            ),
            ("type is \"sse\" instead of \"stdio\"", |e| {
                e["type"] = json!("sse")
            }),
            ("env is {\"TOKEN\":\"x\"} instead of {}", |e| {
                e["env"] = json!({"TOKEN": "x"})
            }),
            ("env is null instead of {}", |e| {
                e.as_object_mut().unwrap().remove("env");
            }),
            ("cwd is \"/elsewhere\" instead of null", |e| {
                e["cwd"] = json!("/elsewhere")
            }),
            ("args is null instead of [\"connect\"", |e| {
                *e = json!("not an object")
            }),
        ];
        assert_each_named(&expected(&reg), cases, |e| difference(&reg, e));
    }

    #[test]
    fn project_key_is_the_enclosing_git_root_else_the_workspace() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let sub = repo.join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        assert_eq!(project_key(&sub), sub);
        std::fs::create_dir(repo.join(".git")).unwrap();
        assert_eq!(project_key(&sub), repo);
        assert_eq!(project_key(&repo), repo);
    }

    /// Answers like the real claude CLI: `mcp add|remove NAME --scope local` edits the
    /// local-scope entry of `config` under project `key`.
    fn fake_claude<'a>(
        config: &'a std::path::Path,
        key: &'a str,
    ) -> impl Fn(&ClientCommand) -> Finished + 'a {
        move |command| {
            let args: Vec<&str> = command.args.iter().map(String::as_str).collect();
            let mut doc: Value = std::fs::read_to_string(config)
                .map(|t| serde_json::from_str(&t).unwrap())
                .unwrap_or_else(|_| json!({"projects": {}}));
            let done = match args.as_slice() {
                [
                    "mcp",
                    "add",
                    name,
                    "--scope",
                    "local",
                    "--",
                    program,
                    rest @ ..,
                ] => {
                    let entry =
                        json!({"type": "stdio", "command": program, "args": rest, "env": {}});
                    doc["projects"][key]["mcpServers"][*name] = entry;
                    finished(0, &format!("Added stdio MCP server {name}\n"), "")
                }
                ["mcp", "remove", name, "--scope", "local"] => {
                    if let Some(servers) = doc["projects"][key]["mcpServers"].as_object_mut() {
                        servers.remove(*name);
                    }
                    finished(0, &format!("Removed MCP server {name}\n"), "")
                }
                other => return finished(2, "", &format!("unexpected claude call {other:?}")),
            };
            std::fs::write(config, doc.to_string()).unwrap();
            done
        }
    }

    #[test]
    fn install_adds_in_local_scope_and_reads_the_config_back() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Claude);
        let config = fx.root.join("home/.claude.json");
        let key = fx.workspace.display().to_string();
        let runner = Scripted::new(fake_claude(&config, &key));

        let message =
            crate::install(Client::Claude, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(message.starts_with(&format!("registered {} with claude", reg.name)));
        let calls = runner.calls.borrow().clone();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].program, fx.bin("claude"));
        assert_eq!(calls[0].cwd, fx.workspace);
        let names: Vec<&str> = calls[0].env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "USER",
                "LOGNAME",
                "HOME",
                "DISABLE_AUTOUPDATER",
                "DISABLE_TELEMETRY",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"
            ]
        );
        let mut add = vec!["claude", "mcp", "add", &reg.name, "--scope", "local", "--"];
        add.push(&reg.marsh_mcp);
        let launch = reg.client_args();
        add.extend(launch.iter().map(String::as_str));
        assert_eq!(runner.take(), [add]);

        let message =
            crate::install(Client::Claude, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(message.contains("nothing changed"), "{message}");
        assert!(runner.take().is_empty());

        crate::uninstall(Client::Claude, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert_eq!(
            runner.take(),
            [["claude", "mcp", "remove", &reg.name, "--scope", "local"]]
        );
        assert_eq!(local_entry(&reg, &fx.env).unwrap(), None);
    }

    #[test]
    fn install_upgrades_exactly_the_previous_serve_entry() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Claude);
        let config = fx.root.join("home/.claude.json");
        let key = fx.workspace.display().to_string();
        let write = |entry: &Value| {
            let doc = json!({"projects": {&key: {"mcpServers": {&reg.name: entry}}}});
            std::fs::write(&config, doc.to_string()).unwrap();
        };
        let runner = Scripted::new(fake_claude(&config, &key));
        write(&entry(&reg, reg.previous_client_args()));
        let message =
            crate::install(Client::Claude, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(
            message.starts_with(&format!(
                "replaced our earlier entry {} with claude",
                reg.name
            )),
            "{message}"
        );
        let verbs: Vec<String> = runner.take().iter().map(|c| c[2].clone()).collect();
        assert_eq!(verbs, ["remove", "add"]);
        assert_eq!(local_entry(&reg, &fx.env).unwrap(), Some(expected(&reg)));

        // The previous form with an extra argument is refused untouched.
        let mut args = reg.previous_client_args();
        args.push("--allow-full-sbx-control".into());
        write(&entry(&reg, args));
        let before = std::fs::read_to_string(&config).unwrap();
        let err =
            crate::install(Client::Claude, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap_err();
        assert!(matches!(err, InstallError::Conflict { .. }), "{err:?}");
        assert!(runner.take().is_empty());
        assert_eq!(std::fs::read_to_string(&config).unwrap(), before);
    }
}
