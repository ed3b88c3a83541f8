//! marsh-mcp: the host-side MCP control plane for one workspace's marsh runtime.
//!
//! The crate's surface is [`Cli`] and [`run`]; every module is crate-private.
#![deny(clippy::print_stdout)]
// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod admission;
mod broker;
mod child_env;
mod cli;
mod client_runner;
mod context;
mod doctor_cli;
mod error;
mod export;
mod global_cap;
mod launch;
mod lock;
mod marsh;
mod operations;
mod output;
mod pinned;
mod redact;
mod scope_gate;
mod scopes;
mod server;
mod shell_facts;
mod spawn;
mod startup;
mod subcommands;
mod supervisor;
mod tool_table;
mod tools;

pub use cli::Cli;
pub use subcommands::run;
