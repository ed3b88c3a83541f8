//! The environment every host child gets. It is built from nothing: the inherited
//! environment contributes only a short allowlist of locale/terminal variables, and
//! identity comes from the passwd entry of the effective uid, never from inherited
//! `USER`/`LOGNAME`/`HOME`. Daemon and relay credentials are never passed on.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::spawn::ChildCommand;

/// The variable naming the inherited descriptor of the pinned `marshd`.
pub(crate) const MARSHD_FD_VAR: &str = "MARSH_MARSHD_FD";

pub const FIXED_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Inherited only when present and well-formed; everything else is dropped.
/// `MARSH_CONTROL_HOME` and `SBX_SHIM_STATE` locate the marsh stand-in's publication
/// control directory and its sbx state file: a marsh child (and the daemon it boots)
/// must find the same ones as the server and the user's terminal.
const INHERITED: &[&str] = &[
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "TZ",
    "TMPDIR",
    "MARSH_CONTROL_HOME",
    "SBX_SHIM_STATE",
];

/// Inherited variables that name a path: only an absolute one is passed on.
const ABSOLUTE_PATHS: &[&str] = &["TMPDIR", "MARSH_CONTROL_HOME", "SBX_SHIM_STATE"];

#[derive(Debug, thiserror::Error)]
pub enum ChildEnvError {
    #[error("cannot look up the passwd entry of uid {uid}: {reason}")]
    Passwd { uid: u32, reason: String },
    #[error("the passwd name {name:?} of uid {uid} is not a valid account name")]
    InvalidName { uid: u32, name: String },
    #[error("the passwd home {home} of uid {uid} is not an absolute path")]
    InvalidHome { uid: u32, home: PathBuf },
}

#[derive(Debug, Clone)]
pub struct ChildEnv {
    /// Invariant: contains no `MARSH_HOME` and no `MARSH_SBX`; those are per call.
    base: Vec<(OsString, OsString)>,
    sbx: PathBuf,
}

fn valid_account_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 32
        && (bytes[0].is_ascii_lowercase() || bytes[0] == b'_')
        && bytes.iter().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || *b == b'_'
                || *b == b'-'
                || (*b == b'$' && i == bytes.len() - 1)
        })
}

fn inheritable(name: &str, value: &OsStr) -> bool {
    let v = value.as_bytes();
    if v.is_empty() || v.len() > 256 || v.iter().any(|b| !(0x20..0x7f).contains(b)) {
        return false;
    }
    !ABSOLUTE_PATHS.contains(&name) || v.first() == Some(&b'/')
}

impl ChildEnv {
    /// Looks up the passwd entry once; `inherited` is the server's own environment.
    pub fn build(
        sbx: &Path,
        inherited: impl IntoIterator<Item = (OsString, OsString)>,
    ) -> Result<Self, ChildEnvError> {
        let uid = nix::unistd::geteuid();
        let user = nix::unistd::User::from_uid(uid)
            .map_err(|e| ChildEnvError::Passwd {
                uid: uid.as_raw(),
                reason: e.to_string(),
            })?
            .ok_or_else(|| ChildEnvError::Passwd {
                uid: uid.as_raw(),
                reason: "no such entry".into(),
            })?;
        if !valid_account_name(&user.name) {
            return Err(ChildEnvError::InvalidName {
                uid: uid.as_raw(),
                name: user.name,
            });
        }
        if !user.dir.is_absolute() {
            return Err(ChildEnvError::InvalidHome {
                uid: uid.as_raw(),
                home: user.dir,
            });
        }
        let mut base: Vec<(OsString, OsString)> = vec![
            ("PATH".into(), FIXED_PATH.into()),
            ("HOME".into(), user.dir.clone().into_os_string()),
            ("USER".into(), user.name.clone().into()),
            ("LOGNAME".into(), user.name.clone().into()),
        ];
        let mut kept: Vec<(OsString, OsString)> = inherited
            .into_iter()
            .filter(|(k, v)| {
                k.to_str()
                    .is_some_and(|k| INHERITED.contains(&k) && inheritable(k, v))
            })
            .collect();
        kept.sort();
        kept.dedup_by(|a, b| a.0 == b.0);
        base.extend(kept);
        Ok(Self {
            base,
            sbx: sbx.to_owned(),
        })
    }

    /// Gives `cmd` its whole environment (a [`ChildCommand`] starts with none and never
    /// inherits marsh-mcp's). `home` is the scope home when the child
    /// is a marsh invocation, `None` for host recipes that must not see marsh state.
    pub fn apply(&self, cmd: &mut ChildCommand, home: Option<&Path>) {
        cmd.envs(self.base.iter().map(|(k, v)| (k, v)));
        if let Some(home) = home {
            cmd.env("MARSH_HOME", home);
            cmd.env("MARSH_SBX", &self.sbx);
        }
    }

    /// The variable names a child receives, for `doctor`.
    pub fn names(&self, with_home: bool) -> Vec<String> {
        let mut names: Vec<String> = self
            .base
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        if with_home {
            names.push("MARSH_HOME".into());
            names.push("MARSH_SBX".into());
            names.push(MARSHD_FD_VAR.into());
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowlisted_variables_survive() {
        let inherited = vec![
            ("MARSH_SBX".into(), "/evil/sbx".into()),
            ("MARSH_HOME".into(), "/evil/home".into()),
            ("MARSHD_TOKEN".into(), "secret".into()),
            ("USER".into(), "mallory".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TMPDIR".into(), "relative".into()),
            ("MARSH_CONTROL_HOME".into(), "/ctl".into()),
            ("SBX_SHIM_STATE".into(), "relative/state.json".into()),
        ];
        let env = ChildEnv::build(Path::new("/opt/sbx"), inherited).unwrap();
        let names = env.names(false);
        assert!(names.contains(&"LANG".to_string()));
        assert!(names.contains(&"MARSH_CONTROL_HOME".to_string()));
        assert!(
            !names.iter().any(|n| n == "SBX_SHIM_STATE"),
            "a relative path is dropped"
        );
        assert!(
            !names
                .iter()
                .any(|n| n == "MARSHD_TOKEN" || n == "TMPDIR" || n == "MARSH_SBX")
        );
        let user = env
            .base
            .iter()
            .find(|(k, _)| k == "USER")
            .map(|(_, v)| v.clone());
        assert!(
            user.is_some_and(|u| u != "mallory"),
            "USER comes from passwd"
        );
        assert!(valid_account_name("root"));
        assert!(!valid_account_name("Root;rm"));
    }
}
