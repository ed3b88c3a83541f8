//! `marshd kit-client --socket PATH NAME ARGS...`: what a kit wrapper on a job's PATH
//! executes. It hands its stdin/stdout/stderr to the agent and exits with the kit's
//! status (128+N for a kit killed by signal N). Killing it cancels the kit job.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use crate::proto::{self, Bytes, EnvVar, KitReply, ShellRequest};
use crate::sandbox::CALLER_VARS;
use crate::seqpacket::SeqPacket;
use crate::util::log;

/// Runs one kit through the agent at `socket`; returns the process exit code.
pub fn run(socket: &Path, kit: &str, args: &[OsString]) -> i32 {
    match request(socket, kit, args) {
        Ok(KitReply::Done { exit_code, signal }) => match (exit_code, signal) {
            (Some(code), _) => code,
            (None, Some(sig)) => 128 + sig,
            (None, None) => 1,
        },
        Ok(KitReply::Failed { code, message }) => {
            log!("{kit}: {message}");
            code
        }
        Err(message) => {
            log!("{kit}: {message}");
            1
        }
    }
}

fn request(socket: &Path, kit: &str, args: &[OsString]) -> Result<KitReply, String> {
    let conn =
        SeqPacket::connect(socket).map_err(|e| format!("cannot reach the kit service: {e}"))?;
    let env = CALLER_VARS
        .iter()
        .filter_map(|name| {
            std::env::var_os(name).map(|value| EnvVar {
                name: Bytes(name.as_bytes().to_vec()),
                value: Bytes(value.into_vec()),
            })
        })
        .collect();
    let req = ShellRequest::Kit {
        kit: kit.to_string(),
        args: args.iter().map(|a| Bytes(a.as_bytes().to_vec())).collect(),
        env,
    };
    // The Rust runtime guarantees fds 0-2 are open (it puts /dev/null on closed ones).
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    proto::send(
        &conn,
        &req,
        &[stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .map_err(|e| format!("sending the kit request: {e}"))?;
    match proto::recv::<KitReply>(&conn) {
        Ok(Some((reply, _))) => Ok(reply),
        Ok(None) => Err("the project shell agent went away".into()),
        Err(e) => Err(format!("reading the kit result: {e}")),
    }
}
