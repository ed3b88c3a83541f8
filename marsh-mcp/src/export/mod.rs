//! Export mode (`export-serve`, or `serve --declaration`): one published tool from a
//! declaration, none of the development tools. See docs/publishing.md.
//!
//! Rejected alternative: serving the tool through the development server's catalog
//! with the other tools hidden. Export mode has different startup rules, different
//! result fields and no scopes; a separate handler cannot leak a development tool.

mod bind;
mod published_reply;
mod run;
mod session;
mod startup;

use std::ffi::OsString;
use std::sync::Arc;

use crate::cli::ExportArgs;
use crate::server::run_handler;

/// Validates everything, then serves one session on stdin/stdout until it ends.
pub fn serve(
    runtime: tokio::runtime::Runtime,
    args: &ExportArgs,
    env: &[(OsString, OsString)],
) -> anyhow::Result<()> {
    let ctx = Arc::new(startup::prepare(args, env)?);
    let outcome = runtime.block_on(async move {
        let (stdin, stdout) = (
            marsh_framing::client_stdin(),
            marsh_framing::client_stdout(),
        );
        let input_closed = tokio_util::sync::CancellationToken::new();
        let session = session::ExportSession::new(ctx, input_closed.clone());
        run_handler(session, stdin, stdout, input_closed).await
    });
    runtime.shutdown_background();
    outcome.map_err(anyhow::Error::msg)
}
