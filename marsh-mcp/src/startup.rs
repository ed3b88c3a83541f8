//! Startup validation. Everything here runs before the first MCP byte is read, so a
//! server that answers `tools/list` has passed all of it.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

pub use marsh_scope_registry::workspace_hash;
use marsh_scope_registry::{ManagedRoot, RegistryError, ensure_owner_only_dir};

use crate::child_env::{ChildEnv, ChildEnvError};
use crate::cli::ServeArgs;
use crate::context::ServerContext;
use crate::marsh::MarshDriver;
use crate::pinned::{ForbiddenAreas, PinError, PinnedExecutable};
use crate::scopes::ScopeSet;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot resolve the workspace {path}: {source}")]
    Workspace {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the workspace {path} is not a directory")]
    WorkspaceNotDirectory { path: PathBuf },
    #[error("cannot determine the current directory: {0}")]
    CurrentDir(std::io::Error),
    #[error("cannot locate the running marsh-mcp executable: {0}")]
    CurrentExe(std::io::Error),
    #[error("no home directory: set HOME or MARSH_HOME, or pass --home")]
    NoHome,
    #[error("the path {path} contains `..` after its existing prefix; pass a plain path")]
    DotDot { path: PathBuf },
    #[error(
        "the {what} {path} overlaps the workspace {workspace}; homes and roots must live outside it (and it outside them)"
    )]
    OverlapsWorkspace {
        what: &'static str,
        path: PathBuf,
        workspace: PathBuf,
    },
    #[error("the {what} {path} failed verification: {source}")]
    Area {
        what: &'static str,
        path: PathBuf,
        source: Box<RegistryError>,
    },
    #[error(transparent)]
    Registry(Box<RegistryError>),
    #[error(
        "no sbx to pin: pass --sbx /path/to/sbx, or set MARSH_SBX to its absolute path (or put an executable `sbx` on PATH)"
    )]
    NoSbx,
    #[error(
        "MARSH_SBX={path} is not an absolute path: set it to the sbx executable's absolute path, or pass --sbx"
    )]
    RelativeMarshSbx { path: PathBuf },
    #[error(transparent)]
    Pin(#[from] PinError),
    #[error(transparent)]
    ChildEnv(#[from] ChildEnvError),
}

/// Absolute form of `path` with its longest existing prefix canonicalized, without
/// creating anything: the base for overlap checks before any directory is made.
fn resolve(path: &Path) -> Result<PathBuf, StartupError> {
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()
            .map_err(StartupError::CurrentDir)?
            .join(path)
    };
    if let Ok(canonical) = std::fs::canonicalize(&absolute) {
        return Ok(canonical);
    }
    // Part of the path does not exist yet: `..` cannot be resolved against it.
    if absolute
        .components()
        .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(StartupError::DotDot { path: absolute });
    }
    let mut existing = absolute.clone();
    let mut rest: Vec<OsString> = Vec::new();
    while let Some(name) = existing.file_name().map(|n| n.to_os_string()) {
        rest.push(name);
        existing.pop();
        if let Ok(mut out) = std::fs::canonicalize(&existing) {
            for part in rest.iter().rev() {
                out.push(part);
            }
            return Ok(out);
        }
    }
    Ok(absolute)
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The canonical workspace: path, `(dev, ino)` and hash. Canonicalized once; later
/// client paths are never consulted.
#[derive(Debug, Clone)]
pub struct Workspace {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub hash: String,
}

impl Workspace {
    pub fn resolve(requested: Option<&Path>) -> Result<Self, StartupError> {
        let requested = match requested {
            Some(w) => w.to_path_buf(),
            None => std::env::current_dir().map_err(StartupError::CurrentDir)?,
        };
        let path = std::fs::canonicalize(&requested).map_err(|source| StartupError::Workspace {
            path: requested.clone(),
            source,
        })?;
        let meta = std::fs::metadata(&path).map_err(|source| StartupError::Workspace {
            path: path.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(StartupError::WorkspaceNotDirectory { path });
        }
        Ok(Self {
            hash: workspace_hash(&path),
            dev: meta.dev(),
            ino: meta.ino(),
            path,
        })
    }
}

/// The generated scope root of the SBX/broker registration when `--scope-root` is not
/// given: `<base>/clients/sbx/<hash>`, where `<base>` is `$MARSH_CONTROL_HOME-mcp-scopes`
/// when that is set, else `${XDG_STATE_HOME:-~/.local/state}/marsh-mcp-scopes`.
pub fn default_broker_root(
    env: &[(OsString, OsString)],
    workspace: &Workspace,
) -> Result<PathBuf, StartupError> {
    let lookup = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| PathBuf::from(v))
            .filter(|p| p.is_absolute())
    };
    let base = marsh_scope_registry::scopes_base(lookup).ok_or(StartupError::NoHome)?;
    Ok(marsh_scope_registry::sbx_client_root(
        &base,
        &workspace.hash,
    ))
}

/// Where the default scope's home comes from, after validation.
#[derive(Debug)]
enum Mode {
    Legacy(PathBuf),
    Managed(PathBuf),
}

/// Every startup rule checked, nothing created yet and no lease taken.
#[derive(Debug)]
pub struct Validated {
    pub workspace: Workspace,
    mode: Mode,
    driver: MarshDriver,
    allow_full_sbx_control: bool,
}

impl Validated {
    /// The managed root, when in managed mode.
    pub fn root(&self) -> Option<&Path> {
        match &self.mode {
            Mode::Managed(root) => Some(root),
            Mode::Legacy(_) => None,
        }
    }

    pub fn driver(&self) -> &MarshDriver {
        &self.driver
    }

    pub fn allow_full_sbx_control(&self) -> bool {
        self.allow_full_sbx_control
    }

    /// Creates what is missing, takes the lease and loads the registry.
    pub fn open(self) -> Result<ServerContext, StartupError> {
        let workspace = self.workspace;
        let scopes = match self.mode {
            Mode::Legacy(home) => {
                let identity =
                    ensure_owner_only_dir(&home).map_err(|source| StartupError::Area {
                        what: "home",
                        path: home.clone(),
                        source: Box::new(source),
                    })?;
                ScopeSet::legacy(home, identity)
            }
            Mode::Managed(root) => {
                let managed = ManagedRoot::open(
                    &root,
                    &workspace.path.to_string_lossy(),
                    workspace.dev,
                    workspace.ino,
                )
                .map_err(|e| StartupError::Registry(Box::new(e)))?;
                ScopeSet::managed(managed)
            }
        };
        Ok(ServerContext::new(
            workspace.path,
            workspace.hash,
            self.driver,
            scopes,
            self.allow_full_sbx_control,
        ))
    }
}

/// Validates every startup rule and returns the context to serve with.
pub fn prepare(
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<ServerContext, StartupError> {
    validate(args, env)?.open()
}

/// Checks every startup rule without creating anything.
pub fn validate(args: &ServeArgs, env: &[(OsString, OsString)]) -> Result<Validated, StartupError> {
    let lookup = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| PathBuf::from(v))
    };
    let ws = Workspace::resolve(args.workspace.as_deref())?;
    let workspace = ws.path.clone();

    let mode = match (&args.home, &args.scope_root) {
        (Some(home), _) => Mode::Legacy(resolve(home)?),
        (None, Some(root)) => Mode::Managed(resolve(root)?),
        (None, None) => {
            let home = match lookup("MARSH_HOME") {
                Some(h) if !h.as_os_str().is_empty() => h,
                _ => lookup("HOME")
                    .filter(|h| h.is_absolute())
                    .ok_or(StartupError::NoHome)?
                    .join(".marsh"),
            };
            Mode::Legacy(resolve(&home)?)
        }
    };
    let (area_name, area) = match &mode {
        Mode::Legacy(h) => ("home", h.clone()),
        Mode::Managed(r) => ("scope root", r.clone()),
    };
    if overlaps(&area, &workspace) {
        return Err(StartupError::OverlapsWorkspace {
            what: area_name,
            path: area,
            workspace,
        });
    }

    // Pin before creating anything, so a bad executable leaves no state behind.
    let forbidden = [
        ("workspace", workspace.as_path()),
        (area_name, area.as_path()),
    ];
    let marsh_path = match &args.marsh {
        Some(m) => m.clone(),
        None => std::env::current_exe()
            .map_err(StartupError::CurrentExe)?
            .with_file_name("marsh"),
    };
    let sbx_path = sbx_path(args.sbx.as_deref(), env)?;
    let driver = pin_driver(&marsh_path, &sbx_path, &forbidden, env, workspace.clone())?;
    Ok(Validated {
        workspace: ws,
        mode,
        driver,
        allow_full_sbx_control: args.allow_full_sbx_control,
    })
}

/// The sbx to pin for serve and the broker modes: `--sbx`, else `$MARSH_SBX` (which
/// must then be absolute; an empty value counts as unset), else the first executable
/// regular file named `sbx` in an absolute `PATH` directory. The result is pinned
/// (canonicalized and checked) like an explicit `--sbx`. The one place this default is
/// decided: the broker is spawned with the pinned result, never with the default.
pub(crate) fn sbx_path(
    explicit: Option<&Path>,
    env: &[(OsString, OsString)],
) -> Result<PathBuf, StartupError> {
    if let Some(path) = explicit {
        return Ok(path.to_owned());
    }
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    if let Some(value) = var("MARSH_SBX") {
        let path = PathBuf::from(value);
        if !path.is_absolute() {
            return Err(StartupError::RelativeMarshSbx { path });
        }
        return Ok(path);
    }
    let path_var = var("PATH").ok_or(StartupError::NoSbx)?;
    std::env::split_paths(&path_var)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("sbx"))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
        .ok_or(StartupError::NoSbx)
}

/// Pins `marsh` (and the `marshd` beside it) and `sbx`, none of them under a
/// `forbidden` area, and builds the children's environment around the pinned sbx.
pub(crate) fn pin_driver(
    marsh_path: &Path,
    sbx_path: &Path,
    forbidden: &ForbiddenAreas<'_>,
    env: &[(OsString, OsString)],
    workspace: PathBuf,
) -> Result<MarshDriver, StartupError> {
    let marsh = PinnedExecutable::pin("marsh", marsh_path, true, forbidden)?;
    let marshd = PinnedExecutable::pin(
        "marshd",
        &marsh.path().with_file_name("marshd"),
        true,
        forbidden,
    )?;
    let sbx = PinnedExecutable::pin("sbx", sbx_path, false, forbidden)?;
    let child_env = ChildEnv::build(&sbx.exec_path(), env.iter().cloned())?;
    Ok(MarshDriver::new(marsh, marshd, sbx, child_env, workspace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_keeps_missing_tail_and_refuses_dotdot() {
        let tmp = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        assert_eq!(resolve(&base.join("a/b")).unwrap(), base.join("a/b"));
        assert!(resolve(&base.join("a/../../x")).is_err());
        assert!(overlaps(&base.join("a"), &base));
        assert!(!overlaps(&base.join("ab"), &base.join("a")));
    }

    #[test]
    fn sbx_defaults_to_marsh_sbx_then_the_first_executable_on_path() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let (plain, exec) = (tmp.path().join("plain"), tmp.path().join("exec"));
        for (dir, mode) in [(&plain, 0o644), (&exec, 0o755)] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("sbx"), "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(dir.join("sbx"), std::fs::Permissions::from_mode(mode))
                .unwrap();
        }
        let env = |pairs: &[(&str, &Path)]| -> Vec<(OsString, OsString)> {
            pairs
                .iter()
                .map(|(k, v)| (OsString::from(k), v.as_os_str().to_owned()))
                .collect()
        };
        let path =
            std::env::join_paths(["relative".as_ref(), plain.as_path(), exec.as_path()]).unwrap();
        let path = PathBuf::from(path);
        let explicit = Path::new("/x/sbx");
        assert_eq!(
            sbx_path(Some(explicit), &env(&[("MARSH_SBX", Path::new("/y"))])).unwrap(),
            explicit
        );
        assert_eq!(
            sbx_path(
                None,
                &env(&[("MARSH_SBX", Path::new("/y")), ("PATH", &path)])
            )
            .unwrap(),
            Path::new("/y")
        );
        assert_eq!(
            sbx_path(None, &env(&[("MARSH_SBX", Path::new("")), ("PATH", &path)])).unwrap(),
            exec.join("sbx")
        );
        assert!(matches!(
            sbx_path(None, &env(&[("MARSH_SBX", Path::new("bin/sbx"))])),
            Err(StartupError::RelativeMarshSbx { .. })
        ));
        assert!(matches!(
            sbx_path(None, &env(&[("PATH", &plain)])),
            Err(StartupError::NoSbx)
        ));
        assert!(matches!(sbx_path(None, &[]), Err(StartupError::NoSbx)));
    }

    #[test]
    fn workspace_hash_is_sha256_hex_of_path_bytes() {
        assert_eq!(
            workspace_hash(Path::new("/")),
            "8a5edab282632443219e051e4ade2d1d5bbc671c781051bf1437897cbdfea0f1"
        );
    }
}
