//! Installers: register marsh-mcp with Codex, Claude Code and SBX. Every client
//! command runs bounded in time and output with an explicit environment, and every
//! definition written is read back and compared; a same-name entry that differs is
//! refused and left byte-identical. Commands run through a caller-supplied [`Runner`];
//! this crate spawns no process itself.

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod claude;
mod codex;
mod error;
mod publication;
mod registration;
mod runner;
mod sbx;
#[cfg(test)]
mod test_support;
mod verified;

use std::path::Path;

pub use error::InstallError;
pub use publication::{PublishedClient, install_published, remove_published};
pub use registration::{Client, Environment, Registration, generated_root};
pub use runner::{CLIENT_OUTPUT_LIMIT, ClientCommand, Finished, Runner};

/// `marsh-mcp install CLIENT`, run from the workspace; every client command goes
/// through `runner`.
pub fn install(
    client: Client,
    env: &Environment,
    cwd: &Path,
    exe: &Path,
    runner: &dyn Runner,
) -> Result<String, InstallError> {
    let reg = Registration::resolve(client, env, cwd, exe)?;
    match client {
        Client::Codex => verified::install(&codex::store(&reg, env, runner)?, &reg),
        Client::Claude => verified::install(&claude::store(&reg, env, runner)?, &reg),
        Client::Sbx => sbx::install(&reg, env, runner),
    }
}

/// `marsh-mcp uninstall CLIENT`: removes only an entry equal to the expected one.
pub fn uninstall(
    client: Client,
    env: &Environment,
    cwd: &Path,
    exe: &Path,
    runner: &dyn Runner,
) -> Result<String, InstallError> {
    let reg = Registration::resolve(client, env, cwd, exe)?;
    match client {
        Client::Codex => verified::uninstall(&codex::store(&reg, env, runner)?, &reg),
        Client::Claude => verified::uninstall(&claude::store(&reg, env, runner)?, &reg),
        Client::Sbx => sbx::uninstall(&reg, env, runner),
    }
}
