//! The binary edge: one parsed command line in, an exit code out. Logging goes to
//! stderr in every mode, because stdout belongs to MCP (or, for `doctor`, to its report).

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;

use marsh_installers::{Client, Environment, Registration};
use marsh_scope_registry::RegistryError;
use tokio::runtime::Runtime;

use crate::broker;
use crate::cli::{Cli, CliCommand, ConnectArgs, ServeArgs};
use crate::client_runner::SupervisedRunner;
use crate::server::{refuse_first_request, serve_session};
use crate::startup::{StartupError, prepare};

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MARSH_MCP_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

/// Control commands report on stderr: stdout belongs to MCP in every mode.
fn reported(message: String) -> ExitCode {
    eprintln!("marsh-mcp: {message}");
    ExitCode::SUCCESS
}

/// Runs one command to its end.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    if let CliCommand::BrokerStart(args)
    | CliCommand::BrokerStop(args)
    | CliCommand::BrokerRun(args)
    | CliCommand::Connect(ConnectArgs { serve: args, .. })
    | CliCommand::Doctor(args) = &cli.command
        && args.declaration.is_some()
    {
        anyhow::bail!(
            "--declaration is accepted only by serve (or export-serve): a published tool is never served by the broker or checked by doctor"
        );
    }
    if let CliCommand::Serve(args)
    | CliCommand::BrokerStop(args)
    | CliCommand::Doctor(args)
    | CliCommand::Connect(ConnectArgs {
        serve: args,
        start: false,
    }) = &cli.command
        && args.idle_exit_secs.is_some()
    {
        anyhow::bail!(
            "--idle-exit-secs is accepted only by broker-start and connect --start: it sets when a started broker exits"
        );
    }
    match cli.command {
        CliCommand::Serve(args) => match args.as_export() {
            Some(export_args) => {
                crate::export::serve(runtime, &export_args, &env)?;
                Ok(ExitCode::SUCCESS)
            }
            None => serve(runtime, &args, &env),
        },
        CliCommand::ExportServe(args) => {
            crate::export::serve(runtime, &args, &env)?;
            Ok(ExitCode::SUCCESS)
        }
        CliCommand::BrokerStart(args) => broker_start(&runtime, &args, &env),
        CliCommand::BrokerStop(args) => broker_stop(&runtime, &args, &env),
        CliCommand::BrokerRun(args) => {
            runtime.block_on(broker::broker_run(&args, &env))?;
            Ok(ExitCode::SUCCESS)
        }
        CliCommand::Connect(ConnectArgs { start, serve: args }) => {
            let outcome = if start {
                runtime.block_on(broker::connect_start(&args, &env))
            } else {
                runtime.block_on(broker::connect(&args, &env))
            };
            runtime.shutdown_background();
            outcome?;
            Ok(ExitCode::SUCCESS)
        }
        CliCommand::Doctor(args) => crate::doctor_cli::doctor(&runtime, &args, &env),
        CliCommand::Install { client } => installer(
            &runtime,
            &env,
            Box::new(move |env, cwd, exe, runner| {
                marsh_installers::install(client.into(), env, cwd, exe, runner)
            }),
        ),
        CliCommand::Uninstall { client } => installer(
            &runtime,
            &env,
            Box::new(move |env, cwd, exe, runner| {
                marsh_installers::uninstall(client.into(), env, cwd, exe, runner)
            }),
        ),
        CliCommand::InstallPublished { client, name } => installer(
            &runtime,
            &env,
            Box::new(move |env, cwd, exe, runner| {
                marsh_installers::install_published(client.into(), &name, env, cwd, exe, runner)
            }),
        ),
        CliCommand::RemovePublished { client, name } => installer(
            &runtime,
            &env,
            Box::new(move |env, cwd, exe, runner| {
                marsh_installers::remove_published(client.into(), &name, env, cwd, exe, runner)
            }),
        ),
        CliCommand::Start => broker_start(&runtime, &sbx_broker_args(&env)?, &env),
        CliCommand::Stop => broker_stop(&runtime, &sbx_broker_args(&env)?, &env),
    }
}

fn broker_start(
    runtime: &Runtime,
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> anyhow::Result<ExitCode> {
    Ok(reported(runtime.block_on(broker::broker_start(args, env))?))
}

fn broker_stop(
    runtime: &Runtime,
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> anyhow::Result<ExitCode> {
    Ok(reported(runtime.block_on(broker::broker_stop(args, env))?))
}

/// `serve`: every startup rule before the first MCP byte, then one session on stdio.
fn serve(
    runtime: Runtime,
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> anyhow::Result<ExitCode> {
    let ctx = match prepare(args, env) {
        Ok(ctx) => Arc::new(ctx),
        Err(StartupError::Registry(inner)) if matches!(*inner, RegistryError::Leased { .. }) => {
            // A client that only shows protocol errors would say "connection closed":
            // the refusal (holder pid included, no path) goes into its initialize reply.
            let message = format!(
                "{}; several sessions share one workspace through `marsh-mcp connect --start` (what install codex|claude register)",
                inner.caller_message()
            );
            // The pipe streams register with the reactor: made inside the runtime.
            runtime.block_on(async {
                let (stdin, stdout) = (
                    marsh_framing::client_stdin(),
                    marsh_framing::client_stdout(),
                );
                refuse_first_request(stdin, stdout, &message).await;
            });
            runtime.shutdown_background();
            return Err(StartupError::Registry(inner).into());
        }
        Err(e) => return Err(e.into()),
    };
    let outcome = runtime.block_on(async move {
        // Pipes are driven by the reactor, not tokio's blocking pool (see the proxy's
        // `client_stdin`): one thread handoff less per frame in each direction.
        let (stdin, stdout) = (
            marsh_framing::client_stdin(),
            marsh_framing::client_stdout(),
        );
        serve_session(ctx, Arc::default(), stdin, stdout).await
    });
    // Background readers of stdin may still be parked; do not wait for them.
    runtime.shutdown_background();
    outcome.map_err(anyhow::Error::msg)?;
    Ok(ExitCode::SUCCESS)
}

/// One installer call: the caller's environment, the workspace (cwd), the running
/// marsh-mcp and the runner its client CLIs go through.
type InstallCall<'a> = dyn FnOnce(
        &Environment,
        &std::path::Path,
        &std::path::Path,
        &dyn marsh_installers::Runner,
    ) -> Result<String, marsh_installers::InstallError>
    + 'a;

/// `install`/`uninstall`/`install-published`/`remove-published`, run from the
/// workspace, with client CLIs under the one supervisor. Called on the main thread,
/// outside the runtime (see `client_runner`).
fn installer(
    runtime: &Runtime,
    env: &[(OsString, OsString)],
    run: Box<InstallCall<'_>>,
) -> anyhow::Result<ExitCode> {
    let cwd = std::env::current_dir()?;
    let exe = std::env::current_exe()?;
    let runner = SupervisedRunner::new(runtime.handle().clone());
    let message = run(&Environment::new(env.iter().cloned()), &cwd, &exe, &runner)?;
    Ok(reported(message))
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
        sbx: Some(reg.sbx.into()),
        allow_full_sbx_control: false,
        declaration: None,
        expected_generation: None,
        idle_exit_secs: None,
    })
}
