//! Where a publisher finds its control directory, the `sbx` it drives, and the
//! `marsh-mcp`/`marsh` a registration names. Problems are kept (as [`SettingError`])
//! and reported as a rejection when a transaction needs the setting, so that nothing
//! else (a daemon boot, a `-c` run) ever fails because of them.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::home;

/// The environment variable naming the control home.
pub const CONTROL_HOME_VAR: &str = "MARSH_CONTROL_HOME";
/// The environment variable naming the sbx to drive.
pub const SBX_VAR: &str = "MARSH_SBX";
/// The stand-in sbx's state file override, passed on to every sbx run.
pub const SBX_STATE_VAR: &str = "SBX_SHIM_STATE";
/// Variables an sbx invocation gets (when set); nothing else.
const SBX_ENV: [&str; 6] = ["PATH", "HOME", "USER", "LOGNAME", "LANG", SBX_STATE_VAR];

/// Why a setting is unusable. Cloneable (sources behind `Arc`): a [`Settings`] is
/// resolved once and each transaction reports the same problem.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SettingError {
    #[error("the daemon's {SBX_VAR} ({}) is not an absolute path outside /proc", .0.display())]
    DaemonSbxNotAbsolute(PathBuf),
    #[error(
        "the daemon knows no sbx: the marsh that booted it could not resolve {SBX_VAR} or find sbx beside itself; run `marsh stop` and retry"
    )]
    DaemonSbxUnknown,
    #[error("{SBX_VAR} ({}) is not an absolute path", .0.display())]
    SbxNotAbsolute(PathBuf),
    #[error("cannot resolve the sbx {}: {source}", .path.display())]
    SbxUnresolvable {
        path: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("the sbx {} is not a file", .0.display())]
    SbxNotAFile(PathBuf),
    #[error("cannot locate this executable: {0}")]
    NoExecutable(#[source] Arc<std::io::Error>),
    #[error("this executable has no directory")]
    NoExecutableDirectory,
    #[error("{0}")]
    NoPasswdHome(#[source] Arc<crate::error::Error>),
}

/// What a publisher needs from its process's environment and installation.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The control home before canonicalization (`$MARSH_CONTROL_HOME` or the default).
    pub control_base: Result<PathBuf, SettingError>,
    /// The canonical sbx to run and to name in registrations.
    pub sbx: Result<PathBuf, SettingError>,
    /// The canonical directory holding `marsh-mcp` and `marsh`.
    pub programs: Result<PathBuf, SettingError>,
    /// The complete environment of every sbx run.
    pub sbx_env: Vec<(OsString, OsString)>,
}

impl Settings {
    /// A host `marsh`: `MARSH_SBX` resolved ([`resolve_sbx`]), else `sbx` beside
    /// `marsh`; the programs beside `marsh`.
    pub fn for_client(env: &[(OsString, OsString)]) -> Self {
        let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        Self {
            control_base: control_base(var(CONTROL_HOME_VAR).as_deref()),
            sbx: resolve_sbx(var(SBX_VAR).as_deref()),
            programs: own_directory(),
            sbx_env: sbx_env(&var),
        }
    }

    /// The daemon: `MARSH_SBX` as the booting `marsh` resolved it (an absolute path
    /// outside `/proc`: a descriptor path would name the daemon's own descriptors);
    /// the programs beside `marshd`.
    pub fn for_daemon() -> Self {
        let var = |name: &str| std::env::var_os(name);
        let sbx = match var(SBX_VAR) {
            Some(path)
                if Path::new(&path).is_absolute() && !Path::new(&path).starts_with("/proc") =>
            {
                Ok(PathBuf::from(path))
            }
            Some(path) => Err(SettingError::DaemonSbxNotAbsolute(PathBuf::from(path))),
            None => Err(SettingError::DaemonSbxUnknown),
        };
        Self {
            control_base: control_base(var(CONTROL_HOME_VAR).as_deref()),
            sbx,
            programs: own_directory(),
            sbx_env: sbx_env(&var),
        }
    }
}

/// `$MARSH_CONTROL_HOME` when set, non-empty and absolute; else
/// `<passwd home>/.local/state/marsh-control` (never `$HOME`).
pub fn control_base(value: Option<&OsStr>) -> Result<PathBuf, SettingError> {
    match value {
        Some(v) if !v.is_empty() && Path::new(v).is_absolute() => Ok(PathBuf::from(v)),
        _ => home::passwd_home()
            .map(|h| h.join(".local/state/marsh-control"))
            .map_err(|e| SettingError::NoPasswdHome(Arc::new(e))),
    }
}

/// The sbx a `marsh` drives and hands to its daemon: `MARSH_SBX` (marsh-mcp passes
/// `/proc/self/fd/N`, a descriptor only this process holds, so it is resolved to the
/// file's path here), else `sbx` beside this executable; canonical either way.
pub fn resolve_sbx(value: Option<&OsStr>) -> Result<PathBuf, SettingError> {
    let path = match value.filter(|v| !v.is_empty()) {
        Some(v) if Path::new(v).is_absolute() => PathBuf::from(v),
        Some(v) => return Err(SettingError::SbxNotAbsolute(PathBuf::from(v))),
        None => own_directory()?.join("sbx"),
    };
    let canonical = match std::fs::canonicalize(&path) {
        Ok(canonical) => canonical,
        Err(source) => {
            return Err(SettingError::SbxUnresolvable {
                path,
                source: Arc::new(source),
            });
        }
    };
    if !canonical.is_file() {
        return Err(SettingError::SbxNotAFile(canonical));
    }
    Ok(canonical)
}

/// The canonical directory of this process's executable.
fn own_directory() -> Result<PathBuf, SettingError> {
    let exe = std::env::current_exe()
        .and_then(std::fs::canonicalize)
        .map_err(|e| SettingError::NoExecutable(Arc::new(e)))?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or(SettingError::NoExecutableDirectory)
}

fn sbx_env(var: &dyn Fn(&str) -> Option<OsString>) -> Vec<(OsString, OsString)> {
    SBX_ENV
        .iter()
        .filter_map(|name| {
            var(name)
                .filter(|v| !v.is_empty())
                .map(|v| (OsString::from(name), v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn control_base_prefers_an_absolute_variable() {
        assert_eq!(
            control_base(Some(OsStr::new("/ctl"))).unwrap(),
            PathBuf::from("/ctl")
        );
        let default = control_base(None).unwrap();
        assert!(
            default.ends_with(".local/state/marsh-control"),
            "{default:?}"
        );
        assert_eq!(control_base(Some(OsStr::new("rel"))).unwrap(), default);
        assert_eq!(control_base(Some(OsStr::new(""))).unwrap(), default);
    }

    #[test]
    fn sbx_is_resolved_through_descriptors_and_links() {
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("sbx");
        std::fs::write(&real, "#!/bin/sh\n").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let canonical = real.canonicalize().unwrap();
        assert_eq!(resolve_sbx(Some(link.as_os_str())).unwrap(), canonical);
        let file = std::fs::File::open(&real).unwrap();
        let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
        assert_eq!(resolve_sbx(Some(OsStr::new(&by_fd))).unwrap(), canonical);
        assert!(resolve_sbx(Some(OsStr::new("relative"))).is_err());
        assert!(resolve_sbx(Some(dir.path().join("absent").as_os_str())).is_err());
    }
}
