//! `marsh-mcp`: parse, validate, dispatch. Stdout carries only MCP; logs go to stderr.
#![deny(clippy::print_stdout)]

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use std::ffi::OsString;
use std::path::Path;

use marsh_broker::{Cli, CliCommand, ServeArgs, prepare, resident, serve_session};
use marsh_installers::{Client, Environment, Registration};

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MARSH_MCP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

fn fail(reason: impl std::fmt::Display) -> ExitCode {
    eprintln!("marsh-mcp: {reason}");
    ExitCode::from(1)
}

type Installer =
    fn(Client, &Environment, &Path, &Path) -> Result<String, marsh_installers::InstallError>;

fn installer(
    client: Client,
    env: &[(OsString, OsString)],
    run: Installer,
) -> anyhow::Result<String> {
    let cwd = std::env::current_dir()?;
    let exe = std::env::current_exe()?;
    Ok(run(
        client,
        &Environment::new(env.iter().cloned()),
        &cwd,
        &exe,
    )?)
}

/// `start`/`stop` act on the broker of this workspace's SBX registration.
fn sbx_broker_args(env: &[(OsString, OsString)]) -> anyhow::Result<ServeArgs> {
    let cwd = std::env::current_dir()?;
    let exe = std::env::current_exe()?;
    let reg = Registration::resolve(
        Client::Sbx,
        &Environment::new(env.iter().cloned()),
        &cwd,
        &exe,
    )?;
    Ok(ServeArgs {
        workspace: Some(reg.workspace.into()),
        home: None,
        scope_root: Some(reg.root.into()),
        marsh: Some(reg.marsh.into()),
        sbx: reg.sbx.into(),
        allow_full_sbx_control: false,
    })
}

/// Control commands report on stderr: stdout belongs to MCP in every mode.
fn report<E: std::fmt::Display>(outcome: Result<String, E>) -> ExitCode {
    match outcome {
        Ok(message) => {
            eprintln!("marsh-mcp: {message}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help / --version: clap prints to stdout itself; no MCP session exists.
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            return fail(
                err.render()
                    .to_string()
                    .trim_start_matches("error: ")
                    .trim_end(),
            );
        }
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let env: Vec<_> = std::env::vars_os().collect();
    match cli.command {
        CliCommand::Serve(args) => {
            let ctx = match prepare(&args, &env) {
                Ok(ctx) => Arc::new(ctx),
                Err(e) => return fail(e),
            };
            let outcome = runtime.block_on(async move {
                let stdin = tokio::io::BufReader::with_capacity(64 * 1024, tokio::io::stdin());
                serve_session(ctx, stdin, tokio::io::stdout()).await
            });
            // Background readers of stdin may still be parked; do not wait for them.
            runtime.shutdown_background();
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        CliCommand::BrokerStart(args) => {
            report(runtime.block_on(resident::broker_start(&args, &env)))
        }
        CliCommand::BrokerStop(args) => {
            report(runtime.block_on(resident::broker_stop(&args, &env)))
        }
        CliCommand::Install { client } => {
            report(installer(client.into(), &env, marsh_installers::install))
        }
        CliCommand::Uninstall { client } => {
            report(installer(client.into(), &env, marsh_installers::uninstall))
        }
        CliCommand::Start => match sbx_broker_args(&env) {
            Ok(args) => report(runtime.block_on(resident::broker_start(&args, &env))),
            Err(e) => fail(e),
        },
        CliCommand::Stop => match sbx_broker_args(&env) {
            Ok(args) => report(runtime.block_on(resident::broker_stop(&args, &env))),
            Err(e) => fail(e),
        },
        CliCommand::BrokerRun(args) => match runtime.block_on(resident::broker_run(&args, &env)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e),
        },
        CliCommand::Connect(args) => {
            let outcome = runtime.block_on(resident::connect(&args, &env));
            runtime.shutdown_background();
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
    }
}
