//! Command-line surface of `marsh-mcp`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "marsh-mcp",
    version,
    about = "MCP control plane for one workspace's marsh runtime"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: CliCommand,
}

#[derive(Debug, Subcommand)]
pub enum CliCommand {
    /// Serve MCP on stdin/stdout for one client.
    Serve(ServeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The workspace (default: the current directory). Canonicalized once.
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Legacy single-scope mode on this exact home (owner-only).
    #[arg(long, conflicts_with = "scope_root")]
    pub home: Option<PathBuf>,
    /// Managed multi-scope mode on this owner-only development root.
    #[arg(long)]
    pub scope_root: Option<PathBuf>,
    /// The installed marsh (default: `marsh` beside this executable); needs sibling `marshd`.
    #[arg(long)]
    pub marsh: Option<PathBuf>,
    /// The sbx executable to pin and hand to marsh as MARSH_SBX.
    #[arg(long)]
    pub sbx: PathBuf,
    /// Enable `qualify`, which runs repository make recipes as the host user.
    #[arg(long)]
    pub allow_full_sbx_control: bool,
}
