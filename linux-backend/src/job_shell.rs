//! The program that interprets a job's command string.
//!
//! bash when the host has one, else `/bin/sh`: agents write bash (`[[ ]]`, arrays,
//! `$BASH_VERSION`, `set -o pipefail`), and the shell this backend stands in for is
//! bash-compatible. The daemon (which reports the choice in `status`) and the agent
//! inside the sandbox (which runs it) apply the same test to the same read-only system
//! directories, so they agree; each process decides once.
//!
//! Rejected alternative: a `shell` setting. A person would have one more thing to
//! keep in step with the host, and `/bin/sh` is what remains when bash is absent.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::OnceLock;

/// Which program runs job commands (`PROGRAM -c COMMAND`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobShell {
    Bash,
    Sh,
}

const BASH: &str = "/bin/bash";
const SH: &str = "/bin/sh";

impl JobShell {
    /// bash when `/bin/bash` is an executable file here, else sh; decided once.
    pub fn detect() -> Self {
        static CHOICE: OnceLock<JobShell> = OnceLock::new();
        *CHOICE.get_or_init(|| Self::at(Path::new(BASH)))
    }

    fn at(bash: &Path) -> Self {
        match std::fs::metadata(bash) {
            Ok(meta) if meta.is_file() && meta.permissions().mode() & 0o111 != 0 => Self::Bash,
            _ => Self::Sh,
        }
    }

    pub fn program(self) -> &'static str {
        match self {
            Self::Bash => BASH,
            Self::Sh => SH,
        }
    }

    /// What `status` reports: `"bash"` or `"sh"`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Bash => "bash",
            Self::Sh => "sh",
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn bash_only_when_it_is_an_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        let bash = dir.path().join("bash");
        assert_eq!(JobShell::at(&bash), JobShell::Sh);
        std::fs::write(&bash, "").unwrap();
        std::fs::set_permissions(&bash, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(JobShell::at(&bash), JobShell::Sh);
        std::fs::set_permissions(&bash, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(JobShell::at(&bash), JobShell::Bash);
        assert_eq!(JobShell::at(dir.path()), JobShell::Sh);
        assert_eq!(
            (JobShell::Bash.program(), JobShell::Sh.label()),
            (BASH, "sh")
        );
    }
}
