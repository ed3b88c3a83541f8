//! The one error type of the shim and its mapping onto the README's exit codes.

use std::io;

/// Every failure the shim reports. `exit_code` maps a variant onto the contract:
/// `2` usage, `3` no result matches a selector, `4` an ambiguous selector, `125` busy,
/// `126` the backend cannot run a job (spawn blocked), the injected code for injected
/// failures, `1` otherwise.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("usage: {0}")]
    Usage(String),
    #[error("busy: {0}")]
    Busy(String),
    /// `marsh results show SEL`: no receipt id starts with `SEL`.
    #[error("no result matches {0}")]
    NoResult(String),
    /// `marsh results show SEL`: several receipt ids start with `SEL`.
    #[error("result selector {0} is ambiguous")]
    AmbiguousResult(String),
    /// A failure injected by a marker file (test builds only).
    #[cfg(feature = "test-hooks")]
    #[error("injected failure: {verb}")]
    Injected { verb: &'static str, code: i32 },
    /// No job can run: bubblewrap missing, bad backend settings, the daemon or the
    /// sandbox cannot start. One line of reason, with the fix when there is one.
    #[error("backend unavailable: {0}")]
    Backend(String),
    #[error("{0}")]
    Failed(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    #[error("{context}: {source}")]
    Sys {
        context: String,
        #[source]
        source: nix::errno::Errno,
    },
    #[error("protocol error: {0}")]
    Protocol(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Usage(_) => 2,
            Error::NoResult(_) => 3,
            Error::AmbiguousResult(_) => 4,
            Error::Busy(_) => 125,
            Error::Backend(_) => 126,
            #[cfg(feature = "test-hooks")]
            Error::Injected { code, .. } => *code,
            Error::Failed(_) | Error::Io { .. } | Error::Sys { .. } | Error::Protocol(_) => 1,
        }
    }

    /// The same failure, classified as the backend being unable to run a job (an
    /// injected failure keeps its injected code, a busy answer stays busy).
    pub fn into_backend(self) -> Self {
        match self {
            Error::Backend(_) | Error::Busy(_) => self,
            #[cfg(feature = "test-hooks")]
            Error::Injected { .. } => self,
            other => Error::Backend(other.to_string()),
        }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Error::Failed(message.into())
    }

    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    pub fn sys(context: impl Into<String>, source: nix::errno::Errno) -> Self {
        Error::Sys {
            context: context.into(),
            source,
        }
    }
}

/// Attaches a human context to `io::Error` and `Errno` results.
pub trait Context<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> Context<T> for std::result::Result<T, io::Error> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::io(context(), source))
    }
}

impl<T> Context<T> for std::result::Result<T, nix::errno::Errno> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::sys(context(), source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_contract() {
        assert_eq!(Error::Usage("x".into()).exit_code(), 2);
        assert_eq!(Error::Busy("x".into()).exit_code(), 125);
        #[cfg(feature = "test-hooks")]
        assert_eq!(
            Error::Injected {
                verb: "run",
                code: 7
            }
            .exit_code(),
            7
        );
        assert_eq!(Error::NoResult("ab".into()).exit_code(), 3);
        assert_eq!(Error::AmbiguousResult("ab".into()).exit_code(), 4);
        assert_eq!(Error::failed("x").exit_code(), 1);
        assert_eq!(Error::Backend("x".into()).exit_code(), 126);
        assert_eq!(
            Error::NoResult("ab".into()).to_string(),
            "no result matches ab"
        );
        assert_eq!(
            Error::AmbiguousResult("ab".into()).to_string(),
            "result selector ab is ambiguous"
        );
        assert_eq!(
            Error::Busy("1 active job".into()).to_string(),
            "busy: 1 active job"
        );
    }
}
