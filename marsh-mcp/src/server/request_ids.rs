//! Request ids exactly as the client wrote them.
//!
//! rmcp reads an id as an `i64` or a string, so to it `0` and `-0`, or `5001` and
//! `5001.0`, are one id (replies crossed between such requests), and ids beyond 64 bits
//! are mangled. The transport therefore hands rmcp ids of its own — a counter per
//! session — and keeps, for every request in flight, the client's id as its exact JSON
//! text; the reply is written with that text.
//!
//! Rule (documented in docs/tools.md): two ids are the same id exactly when their JSON
//! texts are equal. So `1`, `1.0` and `1e0` are three different ids, and `"1"` a fourth;
//! a second request with the same text while the first is unanswered is refused, and an
//! id is free again once its reply is written (or its request is cancelled, which gets
//! no reply).
//!
//! Invariant: `by_internal` and `by_raw` are inverse maps of the requests in flight.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::lock::lock;

#[derive(Debug, Default)]
struct Table {
    by_internal: HashMap<i64, String>,
    by_raw: HashMap<String, i64>,
    next: i64,
}

#[derive(Debug, Default)]
pub(super) struct RequestIds {
    table: Mutex<Table>,
    /// Signalled when the last request in flight is released.
    emptied: Notify,
}

impl RequestIds {
    /// A fresh internal id for a request whose id is `raw`; `None` while another
    /// request with the same id is unanswered.
    pub fn admit(&self, raw: &str) -> Option<i64> {
        let mut table = lock(&self.table);
        if table.by_raw.contains_key(raw) {
            return None;
        }
        table.next += 1;
        let internal = table.next;
        table.by_raw.insert(raw.to_string(), internal);
        table.by_internal.insert(internal, raw.to_string());
        Some(internal)
    }

    /// The internal id of the request in flight whose id is `raw`.
    pub fn internal(&self, raw: &str) -> Option<i64> {
        lock(&self.table).by_raw.get(raw).copied()
    }

    /// Releases `internal`, returning the client's id text it stood for.
    pub fn release(&self, internal: i64) -> Option<String> {
        let mut table = lock(&self.table);
        let raw = table.by_internal.remove(&internal)?;
        table.by_raw.remove(&raw);
        if table.by_internal.is_empty() {
            self.emptied.notify_waiters();
        }
        Some(raw)
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        lock(&self.table).by_internal.len()
    }

    /// Resolves once no request is in flight.
    pub async fn drained(&self) {
        loop {
            let notified = self.emptied.notified();
            if lock(&self.table).by_internal.is_empty() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_their_exact_text_and_free_again_once_released() {
        let ids = RequestIds::default();
        let zero = ids.admit("0").unwrap();
        let minus_zero = ids.admit("-0").unwrap();
        let float = ids.admit("5001.0").unwrap();
        let int = ids.admit("5001").unwrap();
        let string = ids.admit(r#""5001""#).unwrap();
        let huge = ids.admit("18446744073709551617").unwrap();
        let all = [zero, minus_zero, float, int, string, huge];
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        assert_eq!(ids.admit("0"), None, "in flight");
        assert_eq!(ids.internal("5001"), Some(int));
        assert_eq!(ids.release(zero).as_deref(), Some("0"));
        assert_eq!(ids.release(zero), None, "released once");
        assert!(ids.admit("0").is_some(), "free again");
        assert_eq!(ids.release(huge).as_deref(), Some("18446744073709551617"));
    }
}
