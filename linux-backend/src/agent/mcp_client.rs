//! `marshd mcp-client --socket PATH ARGS...`: what the `mcp` command in the project
//! shell runs. It checks the command line completely (a bad one is answered without
//! contacting anything), sends the typed request over the sandbox-private agent socket
//! and prints the daemon's answer: one JSON line on stdout, exit 0 only when committed.

use std::ffi::OsString;
use std::path::Path;

use crate::proto::{self, PublicationAnswer, PublicationRequest, ShellRequest};
use crate::publication::{Outcome, cli};
use crate::seqpacket::SeqPacket;
use crate::util::log;

/// Runs one `mcp` command; returns the process exit code.
pub fn run(socket: &Path, args: &[OsString]) -> i32 {
    let answer = match cli::parse(args) {
        Ok(request) => ask(socket, &request),
        Err(usage) => usage.answer(),
    };
    if answer.result.result != Outcome::Committed
        && let Some(reason) = &answer.result.reason
    {
        log!("mcp: {reason}");
    }
    answer.print()
}

fn ask(socket: &Path, request: &PublicationRequest) -> PublicationAnswer {
    let name = Some(request.tool_name());
    let conn = match SeqPacket::connect(socket) {
        Ok(conn) => conn,
        Err(e) => {
            return PublicationAnswer::rejected(
                name,
                format!("cannot reach the project shell's agent: {e}"),
                false,
            );
        }
    };
    let message = ShellRequest::Publication {
        request: request.clone(),
    };
    // A record is sent whole or not at all: a failed send reached no one.
    if let Err(e) = proto::send(&conn, &message, &[]) {
        return PublicationAnswer::rejected(name, format!("sending the request: {e}"), false);
    }
    match proto::recv::<PublicationAnswer>(&conn) {
        Ok(Some((answer, _))) => answer,
        Ok(None) => PublicationAnswer::uncertain(
            name,
            "the project shell's agent went away before the daemon answered",
        ),
        Err(e) => PublicationAnswer::uncertain(name, format!("reading the answer: {e}")),
    }
}
