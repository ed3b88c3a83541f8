//! Codex, through its CLI: `codex mcp get NAME --json`, `codex mcp add NAME -- …`,
//! `codex mcp remove NAME`. `codex mcp add` silently overwrites and drops unknown keys,
//! so an existing entry is read first and only an identical one is accepted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::InstallError;
use crate::registration::{Environment, Registration};
use crate::runner::ClientCommand;
use crate::verified::{self, ClientStore};

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
) -> Result<Option<Value>, InstallError> {
    let command = codex(program, reg, env, &["mcp", "get", &reg.name, "--json"]);
    let done = command.run()?;
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

struct Codex<'a> {
    program: PathBuf,
    reg: &'a Registration,
    env: &'a Environment,
}

impl Codex<'_> {
    fn run(&self, args: &[&str]) -> Result<(), InstallError> {
        codex(&self.program, self.reg, self.env, args)
            .run_ok()
            .map(drop)
    }
}

impl ClientStore for Codex<'_> {
    const CLIENT: &'static str = "codex";

    fn read(&self) -> Result<Option<Value>, InstallError> {
        get(&self.program, self.reg, self.env)
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

fn store<'a>(reg: &'a Registration, env: &'a Environment) -> Result<Codex<'a>, InstallError> {
    Ok(Codex {
        program: codex_binary(env)?,
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
