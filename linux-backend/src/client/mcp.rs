//! `marsh mcp ...`. The publication verbs are the stand-in's own: `publish` is refused
//! on a host (it needs an attached project shell) before anything is touched;
//! `unpublish` and `load` run their transaction in this process, for the canonical
//! cwd as workspace and this home. Everything else runs the sibling `marsh-mcp`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;

use super::daemon_link;
use crate::error::{Error, Result};
use crate::home::Home;
use crate::publication::{Outcome, PublicationAnswer, Publisher, Settings, cli};
use crate::util::log;

pub fn mcp(
    home: &Home,
    cwd: &Path,
    env: &[(OsString, OsString)],
    args: &[OsString],
) -> Result<i32> {
    let answer = match args.first() {
        Some(verb) if verb == "publish" => {
            let name = match cli::parse(args) {
                Ok(request) => Some(request.tool_name().to_string()),
                Err(usage) => usage.tool_name,
            };
            PublicationAnswer::host_publish(name.as_deref())
        }
        Some(verb) if verb == "unpublish" || verb == "load" => match cli::parse(args) {
            Ok(request) => match host_publisher(home, cwd, env) {
                Ok(publisher) => publisher.execute(&request),
                Err(reason) => PublicationAnswer::rejected(
                    Some(request.tool_name()),
                    reason.to_string(),
                    false,
                ),
            },
            Err(usage) => usage.answer(),
        },
        _ => return exec_marsh_mcp(args),
    };
    if answer.result.result != Outcome::Committed
        && let Some(reason) = &answer.result.reason
    {
        log!("marsh: {reason}");
    }
    Ok(answer.print())
}

/// A publisher that may revoke and load, never publish.
fn host_publisher(home: &Home, cwd: &Path, env: &[(OsString, OsString)]) -> Result<Publisher> {
    let workspace = std::fs::canonicalize(cwd).map_err(|e| {
        Error::io(
            format!("cannot resolve the current directory {}", cwd.display()),
            e,
        )
    })?;
    Ok(Publisher {
        settings: Settings::for_client(env),
        workspace,
        home: home.root().to_path_buf(),
        may_publish: false,
    })
}

/// Runs the sibling `marsh-mcp` with the same arguments.
fn exec_marsh_mcp(args: &[OsString]) -> Result<i32> {
    let program = daemon_link::sibling("marsh-mcp")?;
    let err = std::process::Command::new(&program).args(args).exec();
    Err(Error::io(format!("executing {}", program.display()), err))
}
