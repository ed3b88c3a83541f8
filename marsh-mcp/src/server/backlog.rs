//! What a session owes its client: reply bytes encoded but not yet written, and
//! requests read but not yet answered. The reader stops reading while either is over
//! its bound, so a client that sends and never reads its output cannot make the server
//! queue replies without limit: every request read becomes a reply held in memory
//! until it is written, and a broker serves every session of a workspace.
//!
//! Invariant: `unsent` is the sum of the lengths of the frames handed to the writer and
//! not yet written (or dropped because the writer is gone). Rejected alternative: a
//! bound on the outbound channel alone; rmcp may run a reply's send concurrently with
//! the next requests, so full-channel waits pile up as tasks each holding a reply.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::Notify;

use super::request_ids::RequestIds;

/// Reply bytes a session may have waiting for its client before its requests are no
/// longer read.
pub(super) const UNSENT_BOUND: usize = 4 * 1024 * 1024;
/// Requests a session may have unanswered before the next one is read. A client with
/// this many inline waits has its later lines (a cancellation too) read once one ends.
pub(super) const UNANSWERED_BOUND: usize = 128;

#[derive(Debug, Default)]
pub(super) struct Backlog {
    unsent: AtomicUsize,
    /// The writer has stopped: nothing will be written again, so nothing is owed.
    writer_gone: AtomicBool,
    changed: Notify,
}

impl Backlog {
    /// `len` more bytes handed to the writer.
    pub fn queued(&self, len: usize) {
        self.unsent.fetch_add(len, Ordering::AcqRel);
    }

    /// `len` bytes written (or given up on).
    pub fn settled(&self, len: usize) {
        self.unsent.fetch_sub(len, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// A request was answered.
    pub fn answered(&self) {
        self.changed.notify_waiters();
    }

    pub fn writer_gone(&self) {
        self.writer_gone.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Resolves once the session owes little enough to read another request.
    pub async fn room(&self, ids: &RequestIds) {
        loop {
            let changed = self.changed.notified();
            let owed =
                self.unsent.load(Ordering::Acquire) > UNSENT_BOUND || ids.len() >= UNANSWERED_BOUND;
            if !owed || self.writer_gone.load(Ordering::Acquire) {
                return;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_reader_waits_while_too_much_is_owed() {
        let backlog = Arc::new(Backlog::default());
        let ids = Arc::new(RequestIds::default());
        backlog.room(&ids).await;
        backlog.queued(UNSENT_BOUND + 1);
        let waiting = {
            let (backlog, ids) = (Arc::clone(&backlog), Arc::clone(&ids));
            tokio::spawn(async move { backlog.room(&ids).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        backlog.settled(2);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
        for n in 0..UNANSWERED_BOUND {
            ids.admit(&n.to_string()).unwrap();
        }
        let waiting = {
            let (backlog, ids) = (Arc::clone(&backlog), Arc::clone(&ids));
            tokio::spawn(async move { backlog.room(&ids).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        backlog.writer_gone();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .unwrap()
            .unwrap();
    }
}
