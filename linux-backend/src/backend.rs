//! The backend's health, as `marsh status` reports it before any job is tried and as a
//! running daemon reports what it put in force.

use std::ffi::OsString;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{self, BackendConfig};
use crate::error::{Error, Result};
use crate::home::{self, Home};
use crate::job_shell::JobShell;
use crate::limits::{self, LimitsReport};
use crate::sandbox::{BWRAP_FIX, EtcView, Exposed, Isolation, Keep};
use crate::setid_guard::SetIdGuard;

/// `status.backend`. Invariant: `healthy` ⇔ `problem` is null; text never holds a host
/// path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendReport {
    pub healthy: bool,
    pub problem: Option<String>,
    pub fix: Option<String>,
    /// `"bwrap"` or `"unconfined"`; null when no job can run.
    pub isolation: Option<String>,
    /// `"loopback"` or `"host"`; null when the settings cannot be read.
    pub network: Option<String>,
    pub limits: Option<LimitsReport>,
    /// What a job's `/etc` shows: the allowlisted names present on this host (relative
    /// to `/etc`); null when no job can run. Unconfined jobs see the host's `/etc`.
    #[serde(default)]
    pub etc_shown: Option<Vec<String>>,
    /// `"on"` when no job can open a set-id or file-capability file in the workspace
    /// (the set-id guard), else `"off: <why>"`; null when no job can run.
    #[serde(default)]
    pub setid_guard: Option<String>,
    /// The program that runs job commands: `"bash"` or `"sh"`.
    #[serde(default)]
    pub shell: Option<String>,
    /// The `expose` setting as written (`~/`-relative or absolute): host directories
    /// jobs see read-only at their own paths; null when the settings cannot be read.
    #[serde(default)]
    pub exposed: Option<Vec<String>>,
    /// The `path` setting as written: directories first on the job's `PATH`.
    #[serde(default)]
    pub path: Option<Vec<String>>,
    /// True when the settings files now differ from what the running daemon put in
    /// force: they apply at its next boot (after a stop), never to the running shell.
    #[serde(default)]
    pub settings_changed: bool,
}

/// The settings and isolation a daemon booted now would use.
pub struct Assessment {
    pub config: BackendConfig,
    pub isolation: Isolation,
    pub exposed: Exposed,
}

/// Reads the settings and finds the isolation; every failure is [`Error::Backend`].
/// With a `workspace`, settings a job could have written are refused too.
pub fn assess(
    home: &Home,
    user_home: Option<&OsString>,
    workspace: Option<&Path>,
) -> Result<Assessment> {
    let config = BackendConfig::load(home, user_home)?;
    if let Some(workspace) = workspace {
        config.ensure_outside(workspace)?;
    }
    let isolation = Isolation::detect(&config)?;
    let user_home = user_home.map(Path::new).filter(|h| h.is_absolute());
    // What an exposure must stay clear of is looked up only when there is one: `marsh
    // -c` assesses before every run, and the passwd lookup and the path resolutions
    // are most of its cost.
    let exposed = if config.expose.is_empty() {
        Exposed::paths_only(&config, user_home)?
    } else {
        let mut homes: Vec<_> = user_home.map(Path::to_path_buf).into_iter().collect();
        homes.extend(home::passwd_home().ok());
        let mut marsh = vec![home.root()];
        marsh.extend(config::managed_root(home));
        let keep = Keep {
            homes,
            marsh,
            workspace,
        };
        Exposed::resolve(&config, user_home, &keep)?
    };
    Ok(Assessment {
        config,
        isolation,
        exposed,
    })
}

impl BackendReport {
    /// The report of what a daemon put in force.
    pub fn in_force(
        config: &BackendConfig,
        isolation: &Isolation,
        limits: &LimitsReport,
        etc: &EtcView,
        setid_guard: std::result::Result<(), &str>,
        settings_changed: bool,
    ) -> Self {
        Self {
            healthy: true,
            problem: None,
            fix: None,
            isolation: Some(isolation.label().into()),
            network: Some(config.network.label().into()),
            limits: Some(limits.clone()),
            etc_shown: match isolation {
                Isolation::Bwrap(_) => Some(etc.shown_names()),
                Isolation::Unconfined => None,
            },
            setid_guard: Some(match setid_guard {
                Ok(()) => "on".to_string(),
                Err(why) => format!("off: {why}"),
            }),
            shell: Some(JobShell::detect().label().into()),
            exposed: Some(config.expose.clone()),
            path: Some(config.path.clone()),
            settings_changed,
        }
    }

    /// The report without a daemon: what a boot would use, or why it would fail.
    pub fn predicted(home: &Home, user_home: Option<&OsString>) -> Self {
        match assess(home, user_home, None) {
            Ok(found) => {
                let guard = match &found.isolation {
                    Isolation::Bwrap(_) => SetIdGuard::available(),
                    Isolation::Unconfined => Err("jobs run unconfined".to_string()),
                };
                Self::in_force(
                    &found.config,
                    &found.isolation,
                    &limits::probe(&found.config),
                    &EtcView::scan(Path::new("/etc")),
                    guard.as_ref().map(|_| ()).map_err(String::as_str),
                    false,
                )
            }
            Err(e) => Self::failing(&e, BackendConfig::load(home, user_home).ok()),
        }
    }

    fn failing(error: &Error, config: Option<BackendConfig>) -> Self {
        let problem = match error {
            Error::Backend(reason) => reason.clone(),
            other => other.to_string(),
        };
        let fix = if problem.contains("bubblewrap") {
            BWRAP_FIX.to_string()
        } else {
            "a person corrects the backend.json that says so (the scope's home, its scope root, or ~/.config/marsh-shim), then stops and resets the scope (see docs/agent-view.md)"
                .to_string()
        };
        Self {
            healthy: false,
            problem: Some(problem),
            fix: Some(fix),
            isolation: None,
            network: config.as_ref().map(|c| c.network.label().into()),
            limits: config.as_ref().map(limits::probe),
            etc_shown: None,
            setid_guard: None,
            shell: Some(JobShell::detect().label().into()),
            exposed: config.as_ref().map(|c| c.expose.clone()),
            path: config.as_ref().map(|c| c.path.clone()),
            settings_changed: false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_missing_bwrap_is_unhealthy_with_the_fix_and_no_path() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        std::fs::write(
            dir.path().join(crate::config::FILE_NAME),
            r#"{"bwrap": "/nonexistent/secret-dir/bwrap", "network": "host"}"#,
        )
        .unwrap();
        let report = BackendReport::predicted(&home, None);
        assert!(!report.healthy);
        assert_eq!(report.fix.as_deref(), Some(BWRAP_FIX));
        assert_eq!(report.isolation, None);
        assert_eq!(report.network.as_deref(), Some("host"));
        let text = serde_json::to_string(&report).unwrap();
        assert!(!text.contains("secret-dir"), "{text}");
    }

    #[test]
    fn a_malformed_settings_file_is_unhealthy() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(crate::config::FILE_NAME), "{\"x\":1}").unwrap();
        let report = BackendReport::predicted(&Home::at(dir.path()), None);
        assert!(!report.healthy);
        assert!(report.fix.unwrap().contains("backend.json"));
        assert_eq!(report.network, None);
    }
}
