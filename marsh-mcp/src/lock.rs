//! Poison-tolerant locking, the one policy for every `std::sync::Mutex` in the broker.
//!
//! Invariant required of every caller: no critical section can panic while leaving
//! its data half-updated (each either writes single fields or publishes a finished
//! copy), so the data behind a poisoned lock is still consistent and is used as is.
//! Rejected alternative: propagating poison as an error would turn one panicked task
//! into a permanently unusable server.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
