//! Installers: register marsh-mcp with Codex, Claude Code and SBX. Every client
//! command runs bounded in time and output with an explicit environment, and every
//! definition written is read back and compared; a same-name entry that differs is
//! refused and left byte-identical.

mod claude;
mod codex;
mod error;
mod registration;
mod runner;
mod sbx;
mod verified;

use std::path::Path;

pub use error::InstallError;
pub use registration::{Client, Environment, Registration};
pub use runner::{ClientCommand, Finished};

/// `marsh-mcp install CLIENT`, run from the workspace.
pub fn install(
    client: Client,
    env: &Environment,
    cwd: &Path,
    exe: &Path,
) -> Result<String, InstallError> {
    let reg = Registration::resolve(client, env, cwd, exe)?;
    match client {
        Client::Codex => codex::install(&reg, env),
        Client::Claude => claude::install(&reg, env),
        Client::Sbx => sbx::install(&reg, env),
    }
}

/// `marsh-mcp uninstall CLIENT`: removes only an entry equal to the expected one.
pub fn uninstall(
    client: Client,
    env: &Environment,
    cwd: &Path,
    exe: &Path,
) -> Result<String, InstallError> {
    let reg = Registration::resolve(client, env, cwd, exe)?;
    match client {
        Client::Codex => codex::uninstall(&reg, env),
        Client::Claude => claude::uninstall(&reg, env),
        Client::Sbx => sbx::uninstall(&reg, env),
    }
}
