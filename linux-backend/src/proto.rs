//! Wire messages. Each record on a seqpacket socket is one JSON document; byte
//! strings that need not be UTF-8 (commands, arguments, environment) travel as base64.
//!
//! Three conversations use this module:
//! - `marsh` -> `marshd` ([`Request`] / [`Reply`]), over the owner-only daemon socket;
//! - `marshd` <-> the in-sandbox agent ([`ToAgent`] / [`FromAgent`]), over an inherited
//!   socket pair;
//! - a kit wrapper or the `mcp` command inside the sandbox -> the agent
//!   ([`ShellRequest`] / [`KitReply`] or [`PublicationAnswer`]), over the
//!   sandbox-private agent socket. It carries no daemon credential.

use std::os::fd::{BorrowedFd, OwnedFd};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::backend::BackendReport;
use crate::error::{Error, Result};
pub use crate::publication::{PublicationAnswer, PublicationRequest};
use crate::seqpacket::SeqPacket;

/// Bumped whenever a message changes shape; both ends must agree.
pub const PROTO_VERSION: u32 = 3;

/// A byte string carried as base64 text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use base64::Engine as _;
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use base64::Engine as _;
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(Bytes)
            .map_err(serde::de::Error::custom)
    }
}

/// One environment variable of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    pub name: Bytes,
    pub value: Bytes,
}

/// `marsh` -> `marshd`. The first record of every connection carries the token.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    pub proto: u32,
    pub token: String,
    pub op: Op,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    Ping,
    Status,
    /// Run a shell command; the record carries the job's stdin, stdout and stderr
    /// descriptors. `env` holds only the variables the job environment takes from the
    /// caller.
    Run {
        command: Bytes,
        cwd: Bytes,
        env: Vec<EnvVar>,
    },
    /// Run a registered kit with exactly `args` (no shell); the record carries the
    /// kit's stdin, stdout and stderr descriptors.
    KitRun {
        kit: String,
        args: Vec<Bytes>,
        cwd: Bytes,
        env: Vec<EnvVar>,
    },
    /// Sent on a `Run` or `KitRun` connection: cancel that job.
    Cancel,
    Load {
        selection: String,
    },
    Reset,
    Stop,
    WorkersReset {
        selection: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Pong {
        pid: u32,
        version: String,
    },
    Status {
        status: Box<StatusReport>,
    },
    Finished {
        receipt_id: String,
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// The end of a `KitRun`. `receipt_id` is set once the receipt is durable;
    /// `failure` (exit code and message) when the kit could not run or its receipt
    /// could not be written.
    KitFinished {
        receipt_id: Option<String>,
        exit_code: Option<i32>,
        signal: Option<i32>,
        failure: Option<KitFailure>,
    },
    Loaded {
        names: Vec<String>,
    },
    Reset {
        was_running: bool,
    },
    Stopped {
        pid: u32,
    },
    WorkersReset {
        names: Vec<String>,
    },
    Error {
        class: ErrorClass,
        message: String,
    },
}

/// Why a kit did not give its own status: `code` is the exit code to report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KitFailure {
    pub code: i32,
    pub message: String,
}

/// Which exit code an error reply maps onto on the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    Busy,
    Backend,
    Failed,
}

impl Reply {
    pub fn from_error(err: &Error) -> Self {
        let (class, message) = match err {
            Error::Busy(what) => (ErrorClass::Busy, what.clone()),
            Error::Backend(why) => (ErrorClass::Backend, why.clone()),
            other => (ErrorClass::Failed, other.to_string()),
        };
        Reply::Error { class, message }
    }

    /// Turns an error reply back into the error it reports.
    pub fn into_error(class: ErrorClass, message: String) -> Error {
        match class {
            ErrorClass::Busy => Error::Busy(message),
            ErrorClass::Backend => Error::Backend(message),
            ErrorClass::Failed => Error::Failed(message),
        }
    }
}

/// `marsh status --json`, field order as in the README.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatusReport {
    pub home_state: String,
    pub daemon: DaemonState,
    pub shell: ShellState,
    pub workers: Vec<WorkerReport>,
    pub active_jobs: usize,
    pub workspace: Option<String>,
    pub backend: BackendReport,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DaemonState {
    pub state: String,
    pub pid: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShellState {
    pub state: String,
    pub isolation: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerReport {
    pub name: String,
    pub state: String,
    pub active_jobs: usize,
}

/// agent -> the init of one job's container (`marshd container-init`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToInit {
    /// Start `/bin/sh -c command`; the record carries stdin, stdout and stderr
    /// descriptors.
    Run {
        command: Bytes,
        cwd: Bytes,
        env: Vec<EnvVar>,
        /// `RLIMIT_NPROC` for the job, when no control group bounds the scope.
        nproc: Option<u64>,
    },
}

/// The init of one job's container -> agent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FromInit {
    /// The container is set up and waits for a job.
    Ready,
    /// The container could not be set up (init exits; only ever sent before `Ready`).
    Failed { message: String },
    /// The job could not start; the container is empty and waits for another job.
    NotStarted { message: String },
    /// The job's shell ended and the container is empty again.
    Ended {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
}

/// `marshd` -> agent.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ToAgent {
    /// Fork `/bin/sh -c command`; the record carries stdin, stdout and stderr
    /// descriptors.
    Run {
        job: u64,
        command: Bytes,
        cwd: Bytes,
        env: Vec<EnvVar>,
        /// Registered kit names, for the wrappers on the job's PATH.
        kits: Vec<String>,
    },
    Cancel {
        job: u64,
    },
    KitDone {
        req: u64,
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    KitFailed {
        req: u64,
        code: i32,
        message: String,
    },
    /// The daemon's answer to a publication request.
    PublicationDone {
        req: u64,
        answer: PublicationAnswer,
    },
}

/// Agent -> `marshd`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum FromAgent {
    Ready {
        version: String,
    },
    Exited {
        job: u64,
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    SpawnFailed {
        job: u64,
        message: String,
    },
    /// The job's container died under it without a cancel: the backend failed.
    Lost {
        job: u64,
        message: String,
    },
    /// A job asked for a kit; the record carries the caller's stdin, stdout and stderr.
    KitRun {
        req: u64,
        kit: String,
        args: Vec<Bytes>,
        env: Vec<EnvVar>,
    },
    KitCancel {
        req: u64,
    },
    /// A job ran `mcp publish|unpublish|load`: the project shell's authority to
    /// publish. Only the agent's channel carries it (kit containers have no agent).
    Publication {
        req: u64,
        request: PublicationRequest,
    },
}

/// A program inside the project shell -> agent, over the sandbox-private socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ShellRequest {
    /// A kit wrapper; the record carries the wrapper's fds 0, 1 and 2. Answered with
    /// a [`KitReply`].
    Kit {
        kit: String,
        args: Vec<Bytes>,
        env: Vec<EnvVar>,
    },
    /// The `mcp` command; answered with a [`PublicationAnswer`].
    Publication { request: PublicationRequest },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum KitReply {
    Done {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    Failed {
        code: i32,
        message: String,
    },
}

/// Serializes and sends one message.
pub fn send<T: Serialize>(sock: &SeqPacket, msg: &T, fds: &[BorrowedFd<'_>]) -> Result<()> {
    let bytes = serde_json::to_vec(msg).map_err(|e| Error::Protocol(e.to_string()))?;
    sock.send(&bytes, fds)
}

/// Receives and parses one message; `None` at end of stream.
pub fn recv<T: DeserializeOwned>(sock: &SeqPacket) -> Result<Option<(T, Vec<OwnedFd>)>> {
    match sock.recv()? {
        None => Ok(None),
        Some(msg) => {
            let value =
                serde_json::from_slice(&msg.data).map_err(|e| Error::Protocol(e.to_string()))?;
            Ok(Some((value, msg.fds)))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn bytes_survive_non_utf8() {
        let (a, b) = SeqPacket::pair().unwrap();
        let op = Request {
            proto: PROTO_VERSION,
            token: "t".into(),
            op: Op::Run {
                command: Bytes(vec![0xff, 0xfe, b'x']),
                cwd: Bytes(b"/w".to_vec()),
                env: vec![],
            },
        };
        send(&a, &op, &[]).unwrap();
        let (got, fds): (Request, _) = recv(&b).unwrap().unwrap();
        assert!(fds.is_empty());
        match got.op {
            Op::Run { command, .. } => assert_eq!(command.0, vec![0xff, 0xfe, b'x']),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let r: std::result::Result<Request, _> =
            serde_json::from_str(r#"{"proto":1,"token":"t","op":{"kind":"ping"},"x":1}"#);
        assert!(r.is_err());
    }
}
