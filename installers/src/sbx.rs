//! SBX: start (or reuse) the shared broker, then replace the registration explicitly:
//! `sbx mcp rm --force NAME` (success or the exact not-found diagnostic only), then
//! `sbx mcp add NAME --command marsh-mcp --args connect,… --dir W`, then read it back.
//! An interruption between rm and add leaves no registration; rerunning is safe.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::InstallError;
use crate::registration::{Environment, Registration};
use crate::runner::{ClientCommand, Finished};

const SBX_TIMEOUT: Duration = Duration::from_secs(60);
/// Environment names the sbx CLI may need besides PATH/HOME.
const SBX_ENV: &[&str] = &["XDG_STATE_HOME", "XDG_RUNTIME_DIR", "MARSH_CONTROL_HOME"];

fn sbx(reg: &Registration, env: &Environment, args: &[&str]) -> Result<Finished, InstallError> {
    ClientCommand::new(
        Path::new(&reg.sbx),
        Path::new(&reg.workspace),
        env.for_client(SBX_ENV),
        SBX_TIMEOUT,
    )
    .args(args.iter().copied())
    .run()
}

fn not_found(reg: &Registration) -> String {
    format!("MCP server \"{}\" not found", reg.name)
}

/// The registration as sbx reports it, or `None` when it does not exist.
fn inspect(reg: &Registration, env: &Environment) -> Result<Option<Value>, InstallError> {
    let done = sbx(reg, env, &["mcp", "inspect", &reg.name, "--json"])?;
    if done.ok() {
        return serde_json::from_str(&done.stdout).map(Some).map_err(|e| {
            InstallError::Unparseable {
                command: format!("sbx mcp inspect {} --json", reg.name),
                reason: e.to_string(),
            }
        });
    }
    if done.stderr.trim() == not_found(reg) {
        return Ok(None);
    }
    Err(InstallError::ClientFailed {
        command: format!("sbx mcp inspect {} --json", reg.name),
        code: done.code,
        diagnostic: done.diagnostic(),
    })
}

/// What differs between sbx's view and the expected definition, if anything.
fn difference(reg: &Registration, found: &Value) -> Option<String> {
    let args: Vec<String> = reg.args("connect");
    let found_args: Vec<&str> = found["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if found["command"].as_str() != Some(reg.marsh_mcp.as_str()) {
        return Some(format!(
            "command is {} instead of {}",
            found["command"], reg.marsh_mcp
        ));
    }
    if found_args != args {
        return Some(format!("args are {found_args:?} instead of {args:?}"));
    }
    if found["dir"].as_str() != Some(reg.workspace.as_str()) {
        return Some(format!(
            "dir is {} instead of {}",
            found["dir"], reg.workspace
        ));
    }
    None
}

fn broker_start(reg: &Registration, env: &Environment) -> Result<(), InstallError> {
    let command = ClientCommand::new(
        Path::new(&reg.marsh_mcp),
        Path::new(&reg.workspace),
        env.for_client(SBX_ENV),
        SBX_TIMEOUT,
    )
    .args(reg.args("broker-start"));
    let done = command.run()?;
    if !done.ok() {
        return Err(InstallError::ClientFailed {
            command: command.display(),
            code: done.code,
            diagnostic: done.diagnostic(),
        });
    }
    Ok(())
}

pub fn install(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    broker_start(reg, env)?;
    let removed = sbx(reg, env, &["mcp", "rm", "--force", &reg.name])?;
    if !removed.ok() && removed.stderr.trim() != not_found(reg) {
        return Err(InstallError::UnexpectedRemove {
            name: reg.name.clone(),
            diagnostic: removed.diagnostic(),
        });
    }
    let args = reg.args("connect").join(",");
    let added = sbx(
        reg,
        env,
        &[
            "mcp",
            "add",
            &reg.name,
            "--command",
            &reg.marsh_mcp,
            "--args",
            &args,
            "--dir",
            &reg.workspace,
        ],
    )?;
    if !added.ok() {
        return Err(InstallError::ClientFailed {
            command: format!("sbx mcp add {}", reg.name),
            code: added.code,
            diagnostic: added.diagnostic(),
        });
    }
    match inspect(reg, env)? {
        Some(found) => match difference(reg, &found) {
            None => Ok(format!(
                "registered {} with sbx (broker running); load it with: sbx mcp load {} --sandbox SANDBOX",
                reg.name, reg.name
            )),
            Some(difference) => Err(InstallError::VerifyFailed {
                client: "sbx",
                name: reg.name.clone(),
                difference,
            }),
        },
        None => Err(InstallError::VerifyFailed {
            client: "sbx",
            name: reg.name.clone(),
            difference: "no registration".into(),
        }),
    }
}

pub fn uninstall(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    let Some(found) = inspect(reg, env)? else {
        return Ok(format!("sbx has no {}; nothing to remove", reg.name));
    };
    if let Some(difference) = difference(reg, &found) {
        return Err(InstallError::Conflict {
            client: "sbx",
            name: reg.name.clone(),
            difference,
        });
    }
    let removed = sbx(reg, env, &["mcp", "rm", "--force", &reg.name])?;
    if !removed.ok() {
        return Err(InstallError::ClientFailed {
            command: format!("sbx mcp rm --force {}", reg.name),
            code: removed.code,
            diagnostic: removed.diagnostic(),
        });
    }
    Ok(format!(
        "removed {} from sbx (the broker keeps running; marsh-mcp stop stops it)",
        reg.name
    ))
}
