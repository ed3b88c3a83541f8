//! The global cap on operations that hold a child process, across every scope and
//! session of this server.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{ErrorKind, ToolError};

/// At most this many operations hold a child process at once, across every scope and
/// session.
pub const GLOBAL_OPERATION_CAP: usize = 4;

/// The global cap. A permit is owned by the operation and dropped only after its
/// child has been reaped, so the count is of live children, not of requests.
#[derive(Debug, Clone)]
pub struct GlobalCap {
    slots: Arc<Semaphore>,
}

impl Default for GlobalCap {
    fn default() -> Self {
        Self::new(GLOBAL_OPERATION_CAP)
    }
}

/// The message of the refusal at a full cap (the tool layer adds the caller's own
/// operations to it, see [`is_slot_refusal`]).
fn slots_full() -> String {
    format!(
        "all {GLOBAL_OPERATION_CAP} operation slots are in use; wait for one to finish or cancel one."
    )
}

/// Whether `error` is the full-cap refusal (and not, say, the concurrent-read limit,
/// which shares its kind).
pub fn is_slot_refusal(error: &ToolError) -> bool {
    error.kind == ErrorKind::CapacityExhausted && error.message.starts_with(&slots_full())
}

impl GlobalCap {
    pub fn new(slots: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(slots)),
        }
    }

    /// Never waits: a full cap is an answer, not a queue.
    pub fn try_admit(&self) -> Result<OwnedSemaphorePermit, ToolError> {
        Arc::clone(&self.slots)
            .try_acquire_owned()
            .map_err(|_| ToolError::new(ErrorKind::CapacityExhausted, slots_full()))
    }

    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_refuses_the_fifth_at_once() {
        let cap = GlobalCap::default();
        let held: Vec<_> = (0..4).map(|_| cap.try_admit().unwrap()).collect();
        assert_eq!(
            cap.try_admit().unwrap_err().kind,
            ErrorKind::CapacityExhausted
        );
        drop(held);
        assert!(cap.try_admit().is_ok());
    }
}
