//! `marsh`: the client. Every invocation is dispatched (in a test build, first recorded
//! in the invocation log); errors print as `marsh: <reason>` and map onto the exit codes.

mod cli;
mod daemon_link;
mod mcp;
mod run;
mod verbs;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use crate::error::{Context, Result};
use crate::home::Home;
use crate::util::log;
use cli::Command;

/// Entry point of the `marsh` binary; returns the process exit code.
pub fn main() -> i32 {
    crate::util::seal_inherited_descriptors();
    let argv: Vec<OsString> = std::env::args_os().collect();
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    match dispatch(&argv, &env) {
        Ok(code) => code,
        Err(e) => {
            log!("marsh: {e}");
            e.exit_code()
        }
    }
}

fn dispatch(argv: &[OsString], env: &[(OsString, OsString)]) -> Result<i32> {
    let cwd: PathBuf =
        std::env::current_dir().context(|| "reading the current directory".to_string())?;
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let mut home = Home::from_env(var("MARSH_HOME"), var("HOME"), &cwd)?;
    let parsed = cli::parse(argv.get(1..).unwrap_or_default());
    // Adopted before anything else opens a descriptor (see `adopt_receipt_fd`).
    let receipt_sink = match &parsed {
        Ok(Command::KitRun {
            receipt_fd: Some(fd),
            ..
        }) => Some(run::adopt_receipt_fd(*fd)),
        _ => None,
    };
    if matches!(parsed, Ok(Command::Run { .. })) {
        // Only a run may create the home (its boot needs one); every other verb
        // reports on what exists.
        home.ensure()?;
    }
    // The log is evidence of what the caller passed; it must not decide the outcome.
    #[cfg(feature = "test-hooks")]
    let _ = crate::invocation::record(&home, argv, &cwd, env);

    let output = match parsed? {
        Command::Version => {
            print_line(&format!("marsh {} (marsh-shim)", env!("CARGO_PKG_VERSION")))?;
            return Ok(0);
        }
        Command::Help => {
            print_line(cli::USAGE)?;
            return Ok(0);
        }
        Command::Mcp(args) => return mcp::mcp(&home, &cwd, env, &args),
        Command::Run { command, load } => {
            return run::run(&home, &cwd, env, &command, load.as_ref());
        }
        Command::KitRun { kit, args, .. } => {
            let sink = receipt_sink.transpose()?;
            return run::kit_run(&home, &cwd, env, &kit, &args, sink);
        }
        Command::Status => verbs::status(&home, var("HOME").as_ref())?,
        Command::Results => verbs::results(&home)?,
        Command::Show(selector) => verbs::show(&home, &selector)?,
        Command::WorkersReset(selection) => verbs::workers_reset(&home, &selection)?,
        Command::Reset => verbs::reset(&home)?,
        Command::Stop => verbs::stop(&home)?,
    };
    print_line(&output)?;
    Ok(0)
}

fn print_line(line: &str) -> Result<()> {
    writeln!(std::io::stdout().lock(), "{line}").context(|| "writing to stdout".to_string())
}
