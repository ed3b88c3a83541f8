//! Failure and delay injection through marker files in the home (`.shim/fail/<verb>`,
//! `.shim/hang/<verb>`), so every failure path can be exercised black-box.
//!
//! A test hook: the markers are read only in a build with the `test-hooks` feature
//! (the test build enables it). Without it [`check`] is an empty function and nothing
//! in the home is consulted, so an installed `marsh` cannot be made to fail or stall
//! by a file planted in its home.

use crate::error::Result;
use crate::home::Home;

/// The marker file name of a verb is its variant in kebab-case (`workers-reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "kebab-case")]
pub enum Verb {
    Boot,
    Run,
    Status,
    Results,
    Show,
    Reset,
    Stop,
    WorkersReset,
    Load,
    KitRun,
}

impl Verb {
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Applies the injections for `verb`: first the delay, then the failure.
#[cfg(feature = "test-hooks")]
pub fn check(home: &Home, verb: Verb) -> Result<()> {
    markers::apply(home, verb)
}

/// Without the `test-hooks` feature there is nothing to inject.
#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub fn check(_home: &Home, _verb: Verb) -> Result<()> {
    Ok(())
}

#[cfg(feature = "test-hooks")]
mod markers {
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::Verb;
    use crate::error::{Error, Result};
    use crate::home::Home;
    use crate::util;

    /// Longest injected delay honoured.
    const MAX_HANG_MS: u64 = 600_000;

    pub(super) fn fail_marker(home: &Home, verb: &str) -> PathBuf {
        home.root().join(".shim/fail").join(verb)
    }

    fn hang_marker(home: &Home, verb: &str) -> PathBuf {
        home.root().join(".shim/hang").join(verb)
    }

    pub(super) fn apply(home: &Home, verb: Verb) -> Result<()> {
        if let Some(ms) = marker_number(home, &hang_marker(home, verb.as_str())) {
            std::thread::sleep(Duration::from_millis(ms.min(MAX_HANG_MS)));
        }
        if let Some(code) = marker(home, &fail_marker(home, verb.as_str())) {
            let code = code
                .parse::<i32>()
                .ok()
                .filter(|c| (1..=255).contains(c))
                .unwrap_or(1);
            return Err(Error::Injected {
                verb: verb.as_str(),
                code,
            });
        }
        Ok(())
    }

    /// The trimmed content of a marker file, or `None` when it is absent.
    fn marker(home: &Home, path: &Path) -> Option<String> {
        if !home.exists() {
            return None;
        }
        let bytes = util::read_bounded(path, 64).ok()?;
        Some(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    fn marker_number(home: &Home, path: &Path) -> Option<u64> {
        marker(home, path).map(|text| text.parse().unwrap_or(0))
    }
}

#[cfg(all(test, feature = "test-hooks"))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn markers_fail_with_their_code() {
        let dir = tempfile::tempdir().unwrap();
        let home = Home::at(dir.path());
        assert!(check(&home, Verb::Run).is_ok());
        std::fs::create_dir_all(dir.path().join(".shim/fail")).unwrap();
        std::fs::write(markers::fail_marker(&home, "run"), "7\n").unwrap();
        std::fs::write(markers::fail_marker(&home, "stop"), "").unwrap();
        let err = check(&home, Verb::Run).unwrap_err();
        assert_eq!(err.exit_code(), 7);
        assert_eq!(err.to_string(), "injected failure: run");
        assert_eq!(check(&home, Verb::Stop).unwrap_err().exit_code(), 1);
        assert!(check(&home, Verb::Status).is_ok());
    }
}
