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
use crate::verified::{self, ClientStore};

const SBX_TIMEOUT: Duration = Duration::from_secs(60);
/// Environment names the sbx CLI may need besides PATH/HOME.
const SBX_ENV: &[&str] = &["XDG_STATE_HOME", "XDG_RUNTIME_DIR", "MARSH_CONTROL_HOME"];

fn sbx_command(reg: &Registration, env: &Environment, args: &[&str]) -> ClientCommand {
    ClientCommand::new(
        Path::new(&reg.sbx),
        Path::new(&reg.workspace),
        env.for_client(SBX_ENV),
        SBX_TIMEOUT,
    )
    .args(args.iter().copied())
}

fn sbx(reg: &Registration, env: &Environment, args: &[&str]) -> Result<Finished, InstallError> {
    sbx_command(reg, env, args).run()
}

fn not_found(reg: &Registration) -> String {
    format!("MCP server \"{}\" not found", reg.name)
}

/// The registration as sbx reports it, or `None` when it does not exist.
fn inspect(reg: &Registration, env: &Environment) -> Result<Option<Value>, InstallError> {
    let command = sbx_command(reg, env, &["mcp", "inspect", &reg.name, "--json"]);
    let done = command.run()?;
    if done.ok() {
        return serde_json::from_str(&done.stdout).map(Some).map_err(|e| {
            InstallError::Unparseable {
                command: command.display(),
                reason: e.to_string(),
            }
        });
    }
    if done.stderr.trim() == not_found(reg) {
        return Ok(None);
    }
    Err(command.failure(&done))
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
    command.run_ok().map(drop)
}

struct Sbx<'a> {
    reg: &'a Registration,
    env: &'a Environment,
}

impl ClientStore for Sbx<'_> {
    const CLIENT: &'static str = "sbx";

    fn read(&self) -> Result<Option<Value>, InstallError> {
        inspect(self.reg, self.env)
    }

    fn difference(&self, found: &Value) -> Option<String> {
        difference(self.reg, found)
    }

    fn add(&self) -> Result<(), InstallError> {
        let reg = self.reg;
        let args = reg.args("connect").join(",");
        sbx_command(
            reg,
            self.env,
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
        )
        .run_ok()
        .map(drop)
    }

    fn remove(&self) -> Result<(), InstallError> {
        sbx_command(
            self.reg,
            self.env,
            &["mcp", "rm", "--force", &self.reg.name],
        )
        .run_ok()
        .map(drop)
    }
}

/// Explicitly replacing, unlike the other clients: the broker first, then `rm --force`
/// accepting only success or the exact not-found diagnostic, then the verified add.
pub fn install(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    broker_start(reg, env)?;
    let removed = sbx(reg, env, &["mcp", "rm", "--force", &reg.name])?;
    if !removed.ok() && removed.stderr.trim() != not_found(reg) {
        return Err(InstallError::UnexpectedRemove {
            name: reg.name.clone(),
            diagnostic: removed.diagnostic(),
        });
    }
    let message = verified::install(&Sbx { reg, env }, reg)?;
    Ok(format!(
        "{message}; broker running; load it with: sbx mcp load {} --sandbox SANDBOX",
        reg.name
    ))
}

pub fn uninstall(reg: &Registration, env: &Environment) -> Result<String, InstallError> {
    let message = verified::uninstall(&Sbx { reg, env }, reg)?;
    Ok(format!(
        "{message} (the broker keeps running; marsh-mcp stop stops it)"
    ))
}
