//! Export-mode startup: every rule checked before the first MCP byte, each failure a
//! variant naming its step (the binary prints it and exits 1).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use marsh_installers::{Client, Environment, generated_root};
use marsh_publication::{self as published, DeclarationError, Expectation, Loaded};

use crate::cli::ExportArgs;
use crate::marsh::MarshDriver;
use crate::startup::{StartupError, Workspace, pin_driver};

#[derive(Debug, thiserror::Error)]
pub enum ExportStartupError {
    #[error("--scope-root is refused in export mode: a published tool runs in its publishing home")]
    ScopeRoot,
    #[error("--allow-full-sbx-control is refused in export mode")]
    FullSbxControl,
    #[error("--home is required in export mode: the publishing marsh home (e.g. ~/.marsh)")]
    HomeRequired,
    #[error(
        "{flag} {} is not an absolute path: export mode takes absolute paths only (a registration always passes them)",
        .path.display()
    )]
    RelativePath { flag: &'static str, path: PathBuf },
    #[error("cannot resolve the home {path}: {source}")]
    Home {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the home {path} is not a directory")]
    HomeNotDirectory { path: PathBuf },
    #[error(
        "the home {path} is a development scope root (or a scope inside one), not a marsh command-registry home"
    )]
    ScopeRootAsHome { path: PathBuf },
    #[error("the home {path} overlaps the workspace {workspace}")]
    HomeOverlapsWorkspace { path: PathBuf, workspace: PathBuf },
    #[error("--expected-generation {0:?} is not a lowercase UUID")]
    Generation(String),
    #[error("no sbx: pass --sbx, set MARSH_SBX, or install sbx beside marsh-mcp")]
    NoSbx,
    /// The workspace, a pin or the child environment (the rules `serve` shares).
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    Declaration(#[from] DeclarationError),
    #[error("cannot locate the running marsh-mcp executable: {0}")]
    CurrentExe(std::io::Error),
}

/// Everything an export session needs, validated.
#[derive(Debug)]
pub struct ExportContext {
    pub workspace: Workspace,
    /// Canonical.
    pub home: PathBuf,
    /// Canonical.
    pub declaration_path: PathBuf,
    pub expected_generation: Option<String>,
    /// The declaration as it was at startup; every request compares against it.
    pub startup: Loaded,
    pub driver: MarshDriver,
}

impl ExportContext {
    /// What a declaration must match (the same at startup and on every request).
    pub fn expectation(&self) -> Expectation<'_> {
        Expectation {
            workspace: &self.workspace.path,
            workspace_device: self.workspace.dev,
            workspace_inode: self.workspace.ino,
            home: &self.home,
            generation: self.expected_generation.as_deref(),
        }
    }
}

/// A scope root holds its binding and registry side by side; a generated home sits
/// directly inside one.
fn is_scope_root_or_scope(path: &Path) -> bool {
    let is_root =
        |dir: &Path| dir.join("workspace.json").exists() && dir.join("scopes.json").exists();
    is_root(path) || path.parent().is_some_and(is_root)
}

fn env_path(env: &[(OsString, OsString)], name: &str) -> Option<PathBuf> {
    env.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| PathBuf::from(v))
        .filter(|p| p.is_absolute())
}

/// Validates `args` against the environment; nothing is created.
pub fn prepare(
    args: &ExportArgs,
    env: &[(OsString, OsString)],
) -> Result<ExportContext, ExportStartupError> {
    if args.scope_root.is_some() {
        return Err(ExportStartupError::ScopeRoot);
    }
    if args.allow_full_sbx_control {
        return Err(ExportStartupError::FullSbxControl);
    }
    let requested_home = args.home.as_ref().ok_or(ExportStartupError::HomeRequired)?;
    // A registration names every path absolutely; a relative one would be resolved
    // against whatever cwd the client launched the server in.
    let paths = [
        ("--workspace", Some(&args.workspace)),
        ("--home", Some(requested_home)),
        ("--declaration", Some(&args.declaration)),
        ("--marsh", args.marsh.as_ref()),
        ("--sbx", args.sbx.as_ref()),
    ];
    for (flag, path) in paths {
        if let Some(path) = path.filter(|p| !p.is_absolute()) {
            return Err(ExportStartupError::RelativePath {
                flag,
                path: path.clone(),
            });
        }
    }
    if let Some(g) = &args.expected_generation
        && !published::valid_generation(g)
    {
        return Err(ExportStartupError::Generation(g.clone()));
    }
    let workspace = Workspace::resolve(Some(&args.workspace))?;
    let home =
        std::fs::canonicalize(requested_home).map_err(|source| ExportStartupError::Home {
            path: requested_home.clone(),
            source,
        })?;
    if !home.is_dir() {
        return Err(ExportStartupError::HomeNotDirectory { path: home });
    }
    if home.starts_with(&workspace.path) || workspace.path.starts_with(&home) {
        return Err(ExportStartupError::HomeOverlapsWorkspace {
            path: home,
            workspace: workspace.path,
        });
    }
    let installer_env = Environment::new(env.iter().cloned());
    let generated = [Client::Sbx, Client::Codex, Client::Claude]
        .into_iter()
        .filter_map(|client| generated_root(client, &installer_env, &workspace.hash).ok());
    for root in generated {
        let root = std::fs::canonicalize(&root).unwrap_or(root);
        if home.starts_with(&root) {
            return Err(ExportStartupError::ScopeRootAsHome { path: home });
        }
    }
    if is_scope_root_or_scope(&home) {
        return Err(ExportStartupError::ScopeRootAsHome { path: home });
    }

    let declaration_path = args.declaration.clone();
    let expectation = Expectation {
        workspace: &workspace.path,
        workspace_device: workspace.dev,
        workspace_inode: workspace.ino,
        home: &home,
        generation: args.expected_generation.as_deref(),
    };
    let startup = published::load(&declaration_path, &expectation)?;

    let exe = std::env::current_exe().map_err(ExportStartupError::CurrentExe)?;
    let forbidden = [
        ("workspace", workspace.path.as_path()),
        ("home", home.as_path()),
    ];
    let marsh_path = args
        .marsh
        .clone()
        .unwrap_or_else(|| exe.with_file_name("marsh"));
    let sbx_path = args
        .sbx
        .clone()
        .or_else(|| env_path(env, "MARSH_SBX"))
        .or_else(|| Some(exe.with_file_name("sbx")).filter(|p| p.exists()))
        .ok_or(ExportStartupError::NoSbx)?;
    let driver = pin_driver(
        &marsh_path,
        &sbx_path,
        &forbidden,
        env,
        workspace.path.clone(),
    )?;
    Ok(ExportContext {
        workspace,
        home,
        declaration_path,
        expected_generation: args.expected_generation.clone(),
        startup,
        driver,
    })
}
