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
use crate::runner::ClientCommand;
use crate::verified::{self, ClientStore};

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
    let mut vars = env.for_client(&["CLAUDE_CONFIG_DIR"]);
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

fn difference(reg: &Registration, found: &Value) -> Option<String> {
    let expected =
        json!({"type": "stdio", "command": reg.marsh_mcp, "args": reg.args("serve"), "env": {}});
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

fn run(command: ClientCommand) -> Result<(), InstallError> {
    command.run_ok().map(drop)
}

struct Claude<'a> {
    program: PathBuf,
    reg: &'a Registration,
    env: &'a Environment,
}

impl ClientStore for Claude<'_> {
    const CLIENT: &'static str = "claude";

    fn read(&self) -> Result<Option<Value>, InstallError> {
        local_entry(self.reg, self.env)
    }

    fn difference(&self, found: &Value) -> Option<String> {
        difference(self.reg, found)
    }

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
        args.extend(self.reg.args("serve"));
        run(claude(&self.program, self.reg, self.env, args))
    }

    fn remove(&self) -> Result<(), InstallError> {
        let args = ["mcp", "remove", &self.reg.name, "--scope", "local"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        run(claude(&self.program, self.reg, self.env, args))
    }
}

fn store<'a>(reg: &'a Registration, env: &'a Environment) -> Result<Claude<'a>, InstallError> {
    Ok(Claude {
        program: claude_binary(env)?,
        reg,
        env,
    })
}

pub fn install(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    verified::install(&store(reg, env)?, reg)
}

pub fn uninstall(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    verified::uninstall(&store(reg, env)?, reg)
}
