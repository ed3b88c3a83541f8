//! marsh-mcp: the host-side MCP control plane for one workspace's marsh runtime.
#![deny(clippy::print_stdout)]

pub mod admission;
pub mod child_env;
pub mod cli;
pub mod context;
pub mod marsh;
pub mod operations;
pub mod output;
pub mod pinned;
mod process;
pub mod resident;
pub mod scopes;
pub mod server;
pub mod startup;
pub mod tools;

pub use cli::{Cli, CliCommand, ServeArgs};
pub use context::ServerContext;
pub use server::serve_session;
pub use startup::{StartupError, prepare};
