//! Command-line surface of `marsh-mcp`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ClientArg {
    Codex,
    Claude,
    Sbx,
}

impl From<ClientArg> for marsh_installers::Client {
    fn from(c: ClientArg) -> Self {
        match c {
            ClientArg::Codex => Self::Codex,
            ClientArg::Claude => Self::Claude,
            ClientArg::Sbx => Self::Sbx,
        }
    }
}

/// Clients a published command can be installed into.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PublishedClientArg {
    Codex,
}

impl From<PublishedClientArg> for marsh_installers::PublishedClient {
    fn from(c: PublishedClientArg) -> Self {
        match c {
            PublishedClientArg::Codex => Self::Codex,
        }
    }
}

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
    ///
    /// Without --home or --scope-root: legacy single-scope mode on $MARSH_HOME, else
    /// ~/.marsh (`scope_start` refused, lifecycle state process-local). --sbx defaults
    /// to $MARSH_SBX (absolute), else the first executable `sbx` on PATH.
    Serve(ServeArgs),
    /// Start (or reuse) the resident per-workspace broker.
    BrokerStart(ServeArgs),
    /// Stop an idle broker; refused while a session is attached.
    BrokerStop(ServeArgs),
    /// Relay this process's stdio MCP client to the broker (a thin proxy).
    ///
    /// With --start: first validate like broker-start and reuse a compatible running
    /// broker or start one (which then exits by itself after --idle-exit-secs, default
    /// 600, with no session attached and no operation running). This is what Codex and
    /// Claude registrations launch, so many sessions can share one workspace.
    Connect(ConnectArgs),
    /// Run the `doctor` tool's checks once, for serve's arguments, and print them.
    ///
    /// Validates and opens exactly as `serve` would (creating a missing home or root
    /// the same way), prints one line per check on stdout and exits 0 when healthy, 1
    /// otherwise. A managed root leased by a running server or broker is left alone:
    /// doctor says so and exits 1 (ask that server's `doctor` tool instead).
    Doctor(ServeArgs),
    /// Register this workspace's server with a client (run from the workspace).
    Install { client: ClientArg },
    /// Remove this workspace's registration from a client, only if it is exactly ours.
    Uninstall { client: ClientArg },
    /// Register a command published from this workspace (`mcp publish`) with a client,
    /// after checking its declaration and SBX registration (run from the workspace).
    InstallPublished {
        client: PublishedClientArg,
        /// The published tool name.
        name: String,
    },
    /// Remove a published command's client entry, only if it is this publication's
    /// (any generation).
    RemovePublished {
        client: PublishedClientArg,
        /// The published tool name.
        name: String,
    },
    /// Restore the SBX registration's broker (e.g. after a reboot); registrations untouched.
    Start,
    /// Stop the SBX registration's broker; refused while a proxy is attached.
    Stop,
    /// Serve exactly one published tool (a declaration written by `mcp publish`).
    ExportServe(ExportArgs),
    /// The resident broker itself (spawned by broker-start).
    #[command(hide = true)]
    BrokerRun(ServeArgs),
}

/// Default idle period of a broker started by `connect --start`.
pub const DEFAULT_IDLE_EXIT_SECS: u64 = 600;

/// `connect`: the broker arguments, plus whether to start the broker on demand.
#[derive(Debug, Clone, Args)]
pub struct ConnectArgs {
    /// Validate like broker-start, reuse a compatible broker or start one, then relay.
    #[arg(long)]
    pub start: bool,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// `export-serve`. `--scope-root` and `--allow-full-sbx-control` are parsed only so
/// they can be refused with a reason instead of a usage error.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The publishing workspace (canonicalized; must be the declaration's).
    #[arg(long)]
    pub workspace: PathBuf,
    /// The publishing marsh home (the command-registry home, e.g. ~/.marsh).
    #[arg(long)]
    pub home: Option<PathBuf>,
    /// The declaration file (owner-only, outside the workspace and the home).
    #[arg(long)]
    pub declaration: PathBuf,
    /// The generation the registration was made for (absent: the declaration has none).
    #[arg(long)]
    pub expected_generation: Option<String>,
    /// The installed marsh (default: `marsh` beside this executable).
    #[arg(long)]
    pub marsh: Option<PathBuf>,
    /// The sbx to pin (default: $MARSH_SBX, else `sbx` beside this executable).
    #[arg(long)]
    pub sbx: Option<PathBuf>,
    /// Refused: export mode never uses a development scope root.
    #[arg(long, hide = true)]
    pub scope_root: Option<PathBuf>,
    /// Refused: export mode never enables qualification.
    #[arg(long, hide = true)]
    pub allow_full_sbx_control: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The workspace (default: the current directory). Canonicalized once.
    #[arg(long)]
    pub workspace: Option<PathBuf>,
    /// Legacy single-scope mode on this exact home (owner-only). `serve` without
    /// --home or --scope-root uses $MARSH_HOME, else ~/.marsh. Not for broker modes.
    #[arg(long, conflicts_with = "scope_root")]
    pub home: Option<PathBuf>,
    /// Managed multi-scope mode on this owner-only development root. A person's
    /// settings for every scope of it (network, exposed toolchains, PATH) go in
    /// R/backend.json; a scope's own R/<id>/backend.json overrides them field by field.
    /// They apply at a scope's next boot (scope_stop, then scope_reset). See
    /// docs/agent-view.md.
    #[arg(long)]
    pub scope_root: Option<PathBuf>,
    /// The installed marsh (default: `marsh` beside this executable); needs sibling `marshd`.
    #[arg(long)]
    pub marsh: Option<PathBuf>,
    /// The sbx executable to pin and hand to marsh as MARSH_SBX (default: $MARSH_SBX,
    /// which must be absolute, else the first executable `sbx` on PATH).
    #[arg(long)]
    pub sbx: Option<PathBuf>,
    /// Enable `qualify`, which runs repository make recipes as the host user.
    #[arg(long)]
    pub allow_full_sbx_control: bool,
    /// `serve --declaration D` is `export-serve` (only `serve` accepts it).
    #[arg(long)]
    pub declaration: Option<PathBuf>,
    /// With `--declaration`: the generation the registration was made for.
    #[arg(long, requires = "declaration")]
    pub expected_generation: Option<String>,
    /// Broker modes only (broker-start, connect --start): the started broker exits
    /// after this many seconds with no session attached and no operation running
    /// (0: never). Without it, broker-start's broker never exits by itself, and
    /// connect --start's exits after 600 s.
    #[arg(long, value_name = "SECONDS")]
    pub idle_exit_secs: Option<u64>,
}

impl ServeArgs {
    /// `serve --declaration D ...` as the `export-serve` arguments it stands for.
    pub fn as_export(&self) -> Option<ExportArgs> {
        let declaration = self.declaration.clone()?;
        Some(ExportArgs {
            workspace: self.workspace.clone().unwrap_or_else(|| PathBuf::from(".")),
            home: self.home.clone(),
            declaration,
            expected_generation: self.expected_generation.clone(),
            marsh: self.marsh.clone(),
            sbx: self.sbx.clone(),
            scope_root: self.scope_root.clone(),
            allow_full_sbx_control: self.allow_full_sbx_control,
        })
    }

    /// The same arguments as a command line, for spawning the resident broker. The
    /// caller resolves relative paths and the default sbx first (see
    /// `broker::control`), so the broker depends on neither its cwd nor its
    /// environment.
    pub fn to_argv(&self) -> Vec<std::ffi::OsString> {
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        let mut push = |flag: &str, value: &std::path::Path| {
            argv.push(flag.into());
            argv.push(value.as_os_str().to_owned());
        };
        if let Some(w) = &self.workspace {
            push("--workspace", w);
        }
        if let Some(h) = &self.home {
            push("--home", h);
        }
        if let Some(r) = &self.scope_root {
            push("--scope-root", r);
        }
        if let Some(m) = &self.marsh {
            push("--marsh", m);
        }
        if let Some(s) = &self.sbx {
            push("--sbx", s);
        }
        if self.allow_full_sbx_control {
            argv.push("--allow-full-sbx-control".into());
        }
        if let Some(secs) = self.idle_exit_secs {
            argv.push("--idle-exit-secs".into());
            argv.push(secs.to_string().into());
        }
        argv
    }
}
