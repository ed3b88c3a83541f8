//! Poison-tolerant locking, the one policy for every `std::sync::Mutex` in the server.
//!
//! Invariant required of every caller: no critical section can panic while leaving
//! its data half-updated (each either writes single fields or publishes a finished
//! copy), so the data behind a poisoned lock is still consistent and is used as is.
//! Rejected alternative: propagating poison as an error would turn one panicked task
//! into a permanently unusable server.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The only place the crate calls `Mutex::lock` (clippy's `disallowed_methods`
/// refuses it elsewhere).
#[allow(clippy::disallowed_methods)]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
