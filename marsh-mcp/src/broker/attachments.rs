//! The broker's session accounting: how many sessions are attached, and the stop
//! decision that must agree with it.
//!
//! Invariants: the count equals the number of live [`SessionSlot`]s; once a stop is
//! requested no slot is handed out again; and "no session is attached, so stop" (the
//! idle exit, `POST /v1/stop`) and "not stopping, so count this session" (a session
//! request) are decided under one lock, so neither can slip between the other's check
//! and its effect. Without that, a session request could pass its stop check and be
//! counted just after the idle timer saw zero sessions, get its 101 and lose the broker
//! a moment later — a `connect --start` that probed a live broker would then fail
//! instead of starting a new one. The lock is held for those few instructions only,
//! never across an await.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::lock::lock;

/// Sessions attached at once.
pub const MAX_SESSIONS: usize = 128;

/// Why a session was not attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachRefusal {
    /// A stop was requested; `connect --start` answers by starting a broker again.
    Stopping,
    /// [`MAX_SESSIONS`] are attached.
    Full,
}

#[derive(Debug)]
pub struct Attachments {
    /// Attached sessions; see the module doc for what else the lock orders.
    sessions: Arc<Mutex<usize>>,
    stop: watch::Sender<bool>,
}

/// One attached session, counted for as long as it lives.
#[derive(Debug)]
pub struct SessionSlot(Arc<Mutex<usize>>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut count = lock(&self.0);
        *count = count.saturating_sub(1);
    }
}

impl Default for Attachments {
    fn default() -> Self {
        Self {
            sessions: Arc::default(),
            stop: watch::channel(false).0,
        }
    }
}

impl Attachments {
    pub fn count(&self) -> usize {
        *lock(&self.sessions)
    }

    /// Counts one more session unless a stop was requested or the broker is full.
    pub fn attach(&self) -> Result<SessionSlot, AttachRefusal> {
        let mut count = lock(&self.sessions);
        if *self.stop.borrow() {
            return Err(AttachRefusal::Stopping);
        }
        if *count >= MAX_SESSIONS {
            return Err(AttachRefusal::Full);
        }
        *count += 1;
        Ok(SessionSlot(Arc::clone(&self.sessions)))
    }

    /// Asks the accept loop to end, whatever is attached (a signal).
    pub fn request_stop(&self) {
        self.stop.send_replace(true);
    }

    /// Requests a stop if no session is attached and `idle()` agrees, atomically with
    /// respect to [`Attachments::attach`]. True if it did.
    pub fn stop_if_idle(&self, idle: impl FnOnce() -> bool) -> bool {
        let count = lock(&self.sessions);
        let stopping = *count == 0 && idle();
        if stopping {
            self.request_stop();
        }
        stopping
    }

    /// Resolves once a stop has been requested.
    pub async fn stopped(&self) {
        let mut stop = self.stop.subscribe();
        let _ = stop.wait_for(|s| *s).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_count_while_they_live() {
        let attached = Attachments::default();
        let a = attached.attach().unwrap();
        let b = attached.attach().unwrap();
        assert_eq!(attached.count(), 2);
        drop(a);
        assert_eq!(attached.count(), 1);
        drop(b);
        assert_eq!(attached.count(), 0);
    }

    #[test]
    fn an_attached_session_keeps_the_broker_and_a_stop_refuses_new_ones() {
        let attached = Attachments::default();
        let slot = attached.attach().unwrap();
        assert!(!attached.stop_if_idle(|| true), "a session is attached");
        drop(slot);
        assert!(!attached.stop_if_idle(|| false), "an operation is running");
        assert_eq!(attached.attach().map(drop), Ok(()));
        assert!(attached.stop_if_idle(|| true));
        assert_eq!(attached.attach().unwrap_err(), AttachRefusal::Stopping);
        assert_eq!(attached.count(), 0);
    }

    #[test]
    fn the_cap_refuses_without_counting() {
        let attached = Attachments::default();
        let slots: Vec<_> = (0..MAX_SESSIONS)
            .map(|_| attached.attach().unwrap())
            .collect();
        assert_eq!(attached.attach().unwrap_err(), AttachRefusal::Full);
        assert_eq!(attached.count(), MAX_SESSIONS);
        drop(slots);
        assert_eq!(attached.count(), 0);
    }

    #[tokio::test]
    async fn a_requested_stop_wakes_the_accept_loop() {
        let attached = Arc::new(Attachments::default());
        let waiter = tokio::spawn({
            let attached = Arc::clone(&attached);
            async move { attached.stopped().await }
        });
        attached.request_stop();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        // Already stopped: resolves at once.
        attached.stopped().await;
    }
}
