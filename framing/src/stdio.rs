//! The proxy's own stdin and stdout as async streams.
//!
//! An MCP client talks to the proxy over pipes. Tokio's generic stdio hands every
//! read and write to its blocking thread pool — a thread handoff per frame in each
//! direction, measurable on a relay whose whole job is to add nothing. When stdin or
//! stdout is a pipe, it is driven by the reactor instead (non-blocking, epoll); a
//! terminal, a file or a socket keeps the generic path.
//!
//! Making a pipe end non-blocking changes its open file description, which a process
//! that shares it would see. The proxy is the only reader of its stdin pipe and the
//! only writer of its stdout pipe while it runs (a launcher that execs or waits does
//! not use them), so that is acceptable here; it would not be for a terminal, which is
//! why a terminal is left alone.

use std::os::fd::{AsFd, OwnedFd};

use tokio::io::{AsyncBufRead, AsyncWrite, BufReader};
use tokio::net::unix::pipe;

/// Buffer for frames read from the client.
const READ_BUFFER: usize = 64 * 1024;

fn duplicate(fd: std::os::fd::BorrowedFd<'_>) -> Option<OwnedFd> {
    fd.try_clone_to_owned().ok()
}

/// Stdin as a buffered async reader: a reactor-driven pipe when it is one. Call it
/// inside a Tokio runtime (the pipe registers with its reactor).
pub fn client_stdin() -> Box<dyn AsyncBufRead + Unpin + Send> {
    let stdin = std::io::stdin();
    match duplicate(stdin.as_fd()).map(pipe::Receiver::from_owned_fd) {
        Some(Ok(pipe)) => Box::new(BufReader::with_capacity(READ_BUFFER, pipe)),
        _ => Box::new(BufReader::with_capacity(READ_BUFFER, tokio::io::stdin())),
    }
}

/// Stdout as an async writer: a reactor-driven pipe when it is one. Call it inside a
/// Tokio runtime.
pub fn client_stdout() -> Box<dyn AsyncWrite + Unpin + Send> {
    let stdout = std::io::stdout();
    match duplicate(stdout.as_fd()).map(pipe::Sender::from_owned_fd) {
        Some(Ok(pipe)) => Box::new(pipe),
        _ => Box::new(tokio::io::stdout()),
    }
}
