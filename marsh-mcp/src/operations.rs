//! Operations: opaque ids, ownership, lifecycle state and captured output.
//!
//! An operation is created for every call that starts a child (shell runs, prewarm,
//! worker resets, qualification). Its record is owned by the session that created it
//! and retained, bounded, after it ends so results stay readable.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::{ErrorKind, ToolError};
use crate::lock::lock;
use crate::output::{OutputLog, Stream};
use crate::supervisor::Sink;
use crate::tool_table::ToolName;

/// Operation records kept per server, running and finished together.
pub const RETAINED_OPERATIONS: usize = 128;
/// Captured output retained across all finished operations; past it, the oldest
/// finished operations lose their output (reported as evicted).
pub const GLOBAL_RETAINED_BYTES: usize = 32 * 1024 * 1024;
/// The most one operation retains: both streams at their window.
const MAX_RETAINED_PER_OPERATION: usize = 2 * crate::output::RETAINED_PER_STREAM;

/// Identifies one MCP session inside this process.
pub type SessionId = u64;

/// What an operation does. Serialized as the name of the (default-scope) tool that
/// creates it, so kinds and tool names cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    ShellRun,
    Prewarm,
    WorkersReset,
    Qualify,
    ScopeStart,
    ScopeReset,
    ScopeStop,
    ScopeRemove,
    /// A receipt list of a stopped scope (read, then always an exact stop).
    ResultsList,
    /// One receipt of a stopped scope (read, then always an exact stop).
    ResultGet,
}

impl OpKind {
    /// The tool that creates this kind of operation.
    pub(crate) fn tool(self) -> ToolName {
        match self {
            Self::ShellRun => ToolName::ShellRun,
            Self::Prewarm => ToolName::Prewarm,
            Self::WorkersReset => ToolName::WorkersReset,
            Self::Qualify => ToolName::Qualify,
            Self::ScopeStart => ToolName::ScopeStart,
            Self::ScopeReset => ToolName::ScopeReset,
            Self::ScopeStop => ToolName::ScopeStop,
            Self::ScopeRemove => ToolName::ScopeRemove,
            Self::ResultsList => ToolName::ResultsList,
            Self::ResultGet => ToolName::ResultGet,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        self.tool().as_str()
    }
}

impl Serialize for OpKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum OpState {
    Queued,
    Running,
    /// The child ran and exited 0.
    Succeeded,
    /// A command (shell_run, qualify) ran and ended with a non-zero exit code or a
    /// signal: its own result, not a failure of the server or the sandbox.
    Exited,
    /// The server, marsh or the sandbox could not do the work; `error` says why.
    Failed,
    TimedOut,
    /// A cancel was requested. Signal delivery does not prove the sandbox work
    /// stopped, so this is where every cancelled operation ends.
    CancellationUncertain,
}

impl OpState {
    /// The state as on the wire.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn is_terminal(self) -> bool {
        match self {
            Self::Queued | Self::Running => false,
            Self::Succeeded
            | Self::Exited
            | Self::Failed
            | Self::TimedOut
            | Self::CancellationUncertain => true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct OpStatus {
    pub state: OpState,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<ToolError>,
    pub started_ms: Option<u64>,
    pub finished_ms: Option<u64>,
    pub cancel_requested: bool,
    /// Both output pipes reached end of file before the operation ended.
    pub output_drained: bool,
}

/// Bytes of a command operation_list shows.
pub const COMMAND_EXCERPT: usize = 200;

/// The first [`COMMAND_EXCERPT`] bytes of `command`, cut on a character boundary.
fn excerpt(command: &str) -> String {
    command[..command.floor_char_boundary(COMMAND_EXCERPT)].to_owned()
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[derive(Debug)]
pub struct Operation {
    pub id: Uuid,
    pub owner: SessionId,
    pub kind: OpKind,
    /// `default`, a scope UUID, or `host` for qualification.
    pub scope: String,
    pub created_ms: u64,
    pub timeout: Duration,
    /// The first [`COMMAND_EXCERPT`] bytes of the command a shell run runs, for
    /// operation_list; `None` for other kinds.
    pub command: Option<String>,
    status: watch::Sender<OpStatus>,
    output: Mutex<OutputLog>,
    /// The caller-facing structured result of an operation that computes one (a
    /// stopped-scope receipt read); set before the operation reports its end.
    result: Mutex<Option<Value>>,
    cancel: CancellationToken,
}

impl Operation {
    #[cfg(test)]
    pub fn new(owner: SessionId, kind: OpKind, scope: String, timeout: Duration) -> Arc<Self> {
        Self::running_command(owner, kind, scope, timeout, None)
    }

    /// [`Operation::new`] for an operation that runs `command` (its excerpt is kept).
    pub fn running_command(
        owner: SessionId,
        kind: OpKind,
        scope: String,
        timeout: Duration,
        command: Option<&str>,
    ) -> Arc<Self> {
        let (status, _) = watch::channel(OpStatus {
            state: OpState::Queued,
            exit_code: None,
            signal: None,
            error: None,
            started_ms: None,
            finished_ms: None,
            cancel_requested: false,
            output_drained: false,
        });
        Arc::new(Self {
            id: Uuid::new_v4(),
            owner,
            kind,
            scope,
            created_ms: now_ms(),
            timeout,
            command: command.map(excerpt),
            status,
            output: Mutex::new(OutputLog::default()),
            result: Mutex::new(None),
            cancel: CancellationToken::new(),
        })
    }

    pub fn status(&self) -> OpStatus {
        self.status.borrow().clone()
    }

    pub fn output(&self) -> MutexGuard<'_, OutputLog> {
        lock(&self.output)
    }

    pub(crate) fn set_result(&self, result: Value) {
        *lock(&self.result) = Some(result);
    }

    pub(crate) fn result(&self) -> Option<Value> {
        lock(&self.result).clone()
    }

    pub fn append(&self, stream: Stream, data: &[u8]) {
        self.output().append(stream, data);
    }

    pub fn cancel_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Requests cancellation. Returns false when the operation had already ended.
    pub fn request_cancel(&self) -> bool {
        let mut requested = false;
        self.status.send_if_modified(|s| {
            if s.state.is_terminal() || s.cancel_requested {
                return false;
            }
            s.cancel_requested = true;
            requested = true;
            true
        });
        self.cancel.cancel();
        requested
    }

    pub fn mark_running(&self) {
        self.status.send_modify(|s| {
            s.state = OpState::Running;
            s.started_ms = Some(now_ms());
        });
    }

    /// Records the end. A requested cancel overrides whatever the child reported: the
    /// outcome of cancelled work is never claimed as certain.
    pub fn finish(
        &self,
        mut state: OpState,
        exit_code: Option<i32>,
        signal: Option<i32>,
        error: Option<ToolError>,
        drained: bool,
    ) {
        self.status.send_modify(|s| {
            if s.cancel_requested {
                state = OpState::CancellationUncertain;
            }
            s.state = state;
            s.exit_code = exit_code;
            s.signal = signal;
            s.error = error;
            s.finished_ms = Some(now_ms());
            s.output_drained = drained;
        });
    }

    /// Waits until the operation ends, `wait` elapses or `abort` fires; returns the
    /// status at that moment.
    pub async fn wait_for_end(&self, wait: Duration, abort: &CancellationToken) -> OpStatus {
        let mut rx = self.status.subscribe();
        let ended = async {
            loop {
                if rx.borrow_and_update().state.is_terminal() {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::select! {
            () = ended => {}
            () = tokio::time::sleep(wait) => {}
            () = abort.cancelled() => {}
        }
        self.status()
    }
}

impl Sink for Operation {
    fn append(&self, stream: Stream, data: &[u8]) {
        Operation::append(self, stream, data);
    }
}

/// All operation records of this server. Invariant: at most
/// [`RETAINED_OPERATIONS`] records; only finished ones are ever dropped.
#[derive(Debug, Default)]
pub struct OperationTable {
    ops: Mutex<VecDeque<Arc<Operation>>>,
}

/// The one answer for an id this session does not own: an unknown id and another
/// session's id get the same kind and message, so a session cannot probe for others'
/// operations.
fn not_owned() -> ToolError {
    ToolError::new(
        ErrorKind::NotOwner,
        "no operation with this id belongs to this session (ids are per session; records are retained for the newest 128 operations)",
    )
}

impl OperationTable {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Arc<Operation>>> {
        lock(&self.ops)
    }

    /// Adds a record, dropping the oldest finished records past the bound and trimming
    /// retained output of finished operations past the global byte budget.
    pub fn insert(&self, op: Arc<Operation>) -> Result<(), ToolError> {
        let mut ops = self.lock();
        while ops.len() >= RETAINED_OPERATIONS {
            let Some(i) = ops.iter().position(|o| o.status().state.is_terminal()) else {
                return Err(ToolError::new(
                    ErrorKind::CapacityExhausted,
                    "every retained operation record is still active",
                ));
            };
            ops.remove(i);
        }
        ops.push_back(op);
        // Every live operation may still grow to its per-operation maximum, so room for
        // that is reserved first; finished output is then trimmed, oldest first, to fit
        // the rest. A finished operation never grows and only inserts add live ones, so
        // the total stays within GLOBAL_RETAINED_BYTES at every moment, not only here.
        let live = ops
            .iter()
            .filter(|o| !o.status().state.is_terminal())
            .count();
        let budget = GLOBAL_RETAINED_BYTES.saturating_sub(live * MAX_RETAINED_PER_OPERATION);
        let mut finished: usize = ops
            .iter()
            .filter(|o| o.status().state.is_terminal())
            .map(|o| o.output().retained())
            .sum();
        for old in ops.iter() {
            if finished <= budget {
                break;
            }
            if old.status().state.is_terminal() {
                let mut out = old.output();
                finished -= out.retained();
                out.discard_all();
            }
        }
        Ok(())
    }

    pub fn get(&self, id: &str, session: SessionId) -> Result<Arc<Operation>, ToolError> {
        let id = Uuid::parse_str(id).map_err(|_| {
            ToolError::new(
                ErrorKind::UnknownOperation,
                "operation_id is not an operation id (a UUID)",
            )
        })?;
        self.lock()
            .iter()
            .find(|o| o.id == id && o.owner == session)
            .cloned()
            .ok_or_else(not_owned)
    }

    /// `session`'s operations, newest first.
    pub fn of_session(&self, session: SessionId) -> Vec<Arc<Operation>> {
        self.lock()
            .iter()
            .rev()
            .filter(|o| o.owner == session)
            .cloned()
            .collect()
    }

    /// Cancels every live operation of `session` (its client went away).
    pub fn cancel_session(&self, session: SessionId) -> Vec<Arc<Operation>> {
        let ops: Vec<_> = self
            .lock()
            .iter()
            .filter(|o| o.owner == session && !o.status().state.is_terminal())
            .cloned()
            .collect();
        for op in &ops {
            op.request_cancel();
        }
        ops
    }

    pub fn counts(&self) -> (usize, usize) {
        let ops = self.lock();
        let live = ops
            .iter()
            .filter(|o| !o.status().state.is_terminal())
            .count();
        (live, ops.len())
    }

    pub fn retained_bytes(&self) -> usize {
        self.lock().iter().map(|o| o.output().retained()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retained_output_never_exceeds_the_global_budget() {
        let table = OperationTable::default();
        let chunk = vec![b'x'; crate::output::RETAINED_PER_STREAM];
        for _ in 0..80 {
            let op = Operation::new(
                1,
                OpKind::ShellRun,
                "default".into(),
                Duration::from_secs(1),
            );
            table.insert(Arc::clone(&op)).unwrap();
            op.append(Stream::Stdout, &chunk);
            op.append(Stream::Stderr, &chunk);
            assert!(table.retained_bytes() <= GLOBAL_RETAINED_BYTES);
            op.finish(OpState::Succeeded, Some(0), None, None, true);
        }
        assert!(table.retained_bytes() <= GLOBAL_RETAINED_BYTES);
        assert!(table.retained_bytes() >= GLOBAL_RETAINED_BYTES - 4 * (2 << 20));
    }

    #[test]
    fn ownership_and_bounded_retention() {
        let table = OperationTable::default();
        let first = Operation::new(
            1,
            OpKind::ShellRun,
            "default".into(),
            Duration::from_secs(1),
        );
        table.insert(Arc::clone(&first)).unwrap();
        let id = first.id.to_string();
        assert!(table.get(&id, 1).is_ok());
        assert_eq!(
            table.get(&id, 2).unwrap_err(),
            table.get(&Uuid::new_v4().to_string(), 2).unwrap_err()
        );
        first.finish(OpState::Succeeded, Some(0), None, None, true);
        for _ in 0..RETAINED_OPERATIONS {
            let op = Operation::new(
                1,
                OpKind::ShellRun,
                "default".into(),
                Duration::from_secs(1),
            );
            op.finish(OpState::Succeeded, Some(0), None, None, true);
            table.insert(op).unwrap();
        }
        assert_eq!(table.counts().1, RETAINED_OPERATIONS);
        assert!(table.get(&id, 1).is_err());
    }

    #[test]
    fn cancel_overrides_outcome() {
        let op = Operation::new(
            1,
            OpKind::ShellRun,
            "default".into(),
            Duration::from_secs(1),
        );
        op.mark_running();
        assert!(op.request_cancel());
        op.finish(OpState::Succeeded, Some(0), None, None, true);
        assert_eq!(op.status().state, OpState::CancellationUncertain);
        assert!(!op.request_cancel());
    }
}
