//! Codex, through its CLI: `codex mcp get NAME --json`, `codex mcp add NAME -- …`,
//! `codex mcp remove NAME`. `codex mcp add` silently overwrites and drops unknown keys,
//! so an existing entry is read first and only an identical one is accepted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::InstallError;
use crate::registration::{Environment, Registration};
use crate::runner::ClientCommand;

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
    Err(InstallError::ClientFailed {
        command: command.display(),
        code: done.code,
        diagnostic: done.diagnostic(),
    })
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

pub fn install(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    let program = codex_binary(env)?;
    if let Some(found) = get(&program, reg, env)? {
        return match difference(reg, &found) {
            None => Ok(format!(
                "codex already has {} exactly as expected; nothing changed",
                reg.name
            )),
            Some(difference) => Err(InstallError::Conflict {
                client: "codex",
                name: reg.name.clone(),
                difference,
            }),
        };
    }
    let mut args = vec![
        "mcp".to_string(),
        "add".into(),
        reg.name.clone(),
        "--".into(),
        reg.marsh_mcp.clone(),
    ];
    args.extend(reg.args("serve"));
    let command = ClientCommand::new(
        &program,
        Path::new(&reg.workspace),
        env.for_client(&["CODEX_HOME"]),
        CODEX_TIMEOUT,
    )
    .args(args);
    let done = command.run()?;
    if !done.ok() {
        return Err(InstallError::ClientFailed {
            command: command.display(),
            code: done.code,
            diagnostic: done.diagnostic(),
        });
    }
    match get(&program, reg, env)?.map(|found| difference(reg, &found)) {
        Some(None) => Ok(format!(
            "registered {} with codex (private root {})",
            reg.name, reg.root
        )),
        Some(Some(difference)) => Err(InstallError::VerifyFailed {
            client: "codex",
            name: reg.name.clone(),
            difference,
        }),
        None => Err(InstallError::VerifyFailed {
            client: "codex",
            name: reg.name.clone(),
            difference: "no entry".into(),
        }),
    }
}

pub fn uninstall(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    let program = codex_binary(env)?;
    let Some(found) = get(&program, reg, env)? else {
        return Ok(format!("codex has no {}; nothing to remove", reg.name));
    };
    if let Some(difference) = difference(reg, &found) {
        return Err(InstallError::Conflict {
            client: "codex",
            name: reg.name.clone(),
            difference,
        });
    }
    let command = codex(&program, reg, env, &["mcp", "remove", &reg.name]);
    let done = command.run()?;
    if !done.ok() {
        return Err(InstallError::ClientFailed {
            command: command.display(),
            code: done.code,
            diagnostic: done.diagnostic(),
        });
    }
    Ok(format!("removed {} from codex", reg.name))
}
