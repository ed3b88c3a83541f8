//! `notifications/progress` for calls that wait on an operation.
//!
//! A `tools/call` whose `_meta` carries a `progressToken` gets a notification every
//! [`PERIOD`] while its handler waits for an operation to end (inline runs, lifecycle
//! operations, `operation_get` with `wait_ms`): `progress` is the milliseconds the
//! operation has run (increasing), `message` states that time and the output bytes so
//! far, and `total` is absent (unknown). Without a token nothing is sent. The ticker is
//! polled by the waiting call itself, not spawned: each notification is written before
//! the wait is looked at again, so none follows the call's answer.

use std::future::Future;
use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use tokio::time::{Instant, MissedTickBehavior};

use crate::operations::{Operation, now_ms};
use crate::output::Stream;

/// Between two notifications: well inside the promised "at least once a second".
const PERIOD: Duration = Duration::from_millis(500);
/// A notification the transport has not taken within this ends the ticking (the
/// client is not reading); the wait itself goes on.
const SEND_BOUND: Duration = Duration::from_secs(2);

/// Where a call's progress goes: its token and the session's peer, or nowhere.
pub(crate) struct Progress {
    sink: Option<(ProgressToken, Peer<RoleServer>)>,
}

impl Progress {
    /// Progress for a call carrying `token`; none without one.
    pub(crate) fn new(token: Option<ProgressToken>, peer: Peer<RoleServer>) -> Self {
        Self {
            sink: token.map(|token| (token, peer)),
        }
    }

    /// Runs `wait` (a wait for `op`), notifying progress while it is pending.
    pub(crate) async fn during<F: Future>(&self, op: &Operation, wait: F) -> F::Output {
        let Some((token, peer)) = &self.sink else {
            return wait.await;
        };
        tokio::pin!(wait);
        // The operation's age when the wait began, continued on the monotonic clock so
        // `progress` only ever grows.
        let began = Instant::now();
        let age = Duration::from_millis(now_ms().saturating_sub(op_start_ms(op)));
        let mut ticks = tokio::time::interval_at(began + PERIOD, PERIOD);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                out = &mut wait => return out,
                _ = ticks.tick() => {}
            }
            let note = notification(token.clone(), op, age + began.elapsed());
            match tokio::time::timeout(SEND_BOUND, peer.notify_progress(note)).await {
                Ok(Ok(())) => {}
                // The peer is gone or not reading: stop notifying, keep waiting.
                Ok(Err(_)) | Err(_) => return wait.await,
            }
        }
    }
}

/// When `op` started running (its creation while still queued).
fn op_start_ms(op: &Operation) -> u64 {
    op.status().started_ms.unwrap_or(op.created_ms)
}

fn notification(
    token: ProgressToken,
    op: &Operation,
    elapsed: Duration,
) -> ProgressNotificationParam {
    let (stdout, stderr) = {
        let out = op.output();
        (out.written(Stream::Stdout), out.written(Stream::Stderr))
    };
    let millis = elapsed.as_millis() as u64;
    ProgressNotificationParam::new(token, millis as f64).with_message(message(
        op.kind.as_str(),
        millis,
        stdout,
        stderr,
    ))
}

fn message(kind: &str, millis: u64, stdout: u64, stderr: u64) -> String {
    format!(
        "{kind} running for {}.{} s; {} output bytes so far (stdout {stdout}, stderr {stderr})",
        millis / 1000,
        (millis % 1000) / 100,
        stdout + stderr
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_states_elapsed_time_and_output_bytes() {
        assert_eq!(
            message("shell_run", 3_456, 10, 2),
            "shell_run running for 3.4 s; 12 output bytes so far (stdout 10, stderr 2)"
        );
        assert_eq!(
            message("scope_start", 999, 0, 0),
            "scope_start running for 0.9 s; 0 output bytes so far (stdout 0, stderr 0)"
        );
    }
}
