//! The installers' client CLIs (codex, claude, sbx, marsh-mcp itself) run under the
//! one child supervisor: the installers crate describes each command and this adapter
//! runs it.
//!
//! Invariants: `run` is only called from outside the async runtime's worker threads
//! (the installers are synchronous and `subcommands` calls them directly on the main
//! thread), because it blocks on the runtime handle; and the runtime is
//! multi-threaded, because a current-thread runtime's IO and timers are driven only by
//! `Runtime::block_on`, never by `Handle::block_on`.

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use marsh_installers::{CLIENT_OUTPUT_LIMIT, ClientCommand, Finished, InstallError, Runner};

use crate::spawn::ChildCommand;
use crate::supervisor::{Ending, run_captured};

pub(crate) struct SupervisedRunner {
    runtime: Handle,
}

impl SupervisedRunner {
    pub(crate) fn new(runtime: Handle) -> Self {
        Self { runtime }
    }
}

impl Runner for SupervisedRunner {
    fn run(&self, command: &ClientCommand) -> Result<Finished, InstallError> {
        let mut cmd = ChildCommand::new(&command.program);
        cmd.args(&command.args)
            .envs(command.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&command.cwd);
        let never = CancellationToken::new();
        let run = self.runtime.block_on(run_captured(
            cmd,
            CLIENT_OUTPUT_LIMIT,
            command.timeout,
            &never,
        ));
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        match run.ending {
            Ending::Exited(status) => Ok(Finished {
                code: status.code(),
                stdout: text(run.stdout.kept),
                stderr: text(run.stderr.kept),
            }),
            Ending::TimedOut(_) | Ending::Cancelled(_) => Err(InstallError::TimedOut {
                command: command.display(),
                after: command.timeout,
            }),
            Ending::SpawnFailed(source) => Err(InstallError::Spawn {
                command: command.display(),
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    #[test]
    fn runs_with_exactly_the_given_environment_bounded_in_time() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let runner = SupervisedRunner::new(runtime.handle().clone());
        let dir = tempfile::tempdir().unwrap();
        let env = vec![("ONLY".to_string(), "this".to_string())];
        let done = ClientCommand::new(
            Path::new("/bin/sh"),
            dir.path(),
            env.clone(),
            Duration::from_secs(5),
        )
        .args(["-c", "echo $ONLY; echo ${HOME:-unset} >&2; exit 3"])
        .run(&runner)
        .unwrap();
        assert_eq!(
            (done.code, done.stdout.as_str(), done.stderr.as_str()),
            (Some(3), "this\n", "unset\n")
        );
        let slow = ClientCommand::new(
            Path::new("/bin/sleep"),
            dir.path(),
            env,
            Duration::from_millis(200),
        )
        .args(["5"])
        .run(&runner);
        assert!(
            matches!(slow, Err(InstallError::TimedOut { .. })),
            "{slow:?}"
        );
    }
}
