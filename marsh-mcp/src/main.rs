//! `marsh-mcp`: parse, run, exit. Stdout carries only MCP; logs go to stderr.
#![deny(clippy::print_stdout)]

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match marsh_mcp::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help / --version: clap prints to stdout itself; no MCP session exists.
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            let rendered = err.render().to_string();
            eprintln!(
                "marsh-mcp: {}",
                rendered.trim_start_matches("error: ").trim_end()
            );
            return ExitCode::from(1);
        }
    };
    match marsh_mcp::run(cli) {
        Ok(code) => code,
        Err(e) => {
            // Each error's own message already names its cause; `{e:#}` would repeat it.
            eprintln!("marsh-mcp: {e}");
            ExitCode::from(1)
        }
    }
}
