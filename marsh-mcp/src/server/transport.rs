//! The rmcp transport for one MCP session over any byte stream: our bounded frame
//! reader in front, one writer task behind.
//!
//! Invariants: every inbound line is either handed to rmcp as a parsed message or
//! answered here with a JSON-RPC error (oversized, unparseable, not JSON-RPC, a batch,
//! a request before `initialize`, a `tools/call` without a name or with non-object
//! arguments, a request whose id is still in flight); no frame larger than the cap is
//! ever buffered; outbound frames are serialized and written by one task, so replies
//! and error answers never interleave mid-line.

use std::borrow::Cow;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::JsonRpcMessage;
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, mpsc};

use marsh_framing::{Frame, FrameReader, MAX_FRAME_BYTES, oversized_error, request_id_in_prefix};

const INBOUND_QUEUE: usize = 32;
const OUTBOUND_QUEUE: usize = 64;
/// How long a session whose input ended keeps serving the requests it already has.
/// Above the longest in-request wait (55 s) plus the cancel settle time.
const DRAIN_BOUND: Duration = Duration::from_secs(70);
/// A frame begun but not completed within this ends the session's input, as a
/// disconnect does (its operations are cancelled): a peer holding half a line would
/// otherwise keep the session, and its operations, alive forever.
const PARTIAL_FRAME_BOUND: Duration = Duration::from_secs(60);

/// Requests read but not yet answered, by canonical JSON id. When input ends, the
/// session stays up until this is empty (bounded), so a client that half-closes after
/// its last request still gets every reply.
#[derive(Debug, Default)]
struct Pending {
    ids: Mutex<HashSet<String>>,
    emptied: Notify,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        crate::lock::lock(&self.ids)
    }

    /// Records a request; false when one with the same id is still unanswered.
    fn add(&self, id: String) -> bool {
        self.lock().insert(id)
    }

    fn done(&self, id: &str) {
        let mut ids = self.lock();
        if ids.remove(id) && ids.is_empty() {
            self.emptied.notify_waiters();
        }
    }

    async fn drained(&self) {
        loop {
            let notified = self.emptied.notified();
            if self.lock().is_empty() {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("the session's writer has stopped")]
    WriterGone,
    #[error("cannot encode an outbound message: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("outbound message of {0} bytes exceeds the 1 MiB frame cap")]
    OutboundTooLarge(usize),
}

pub struct LineTransport {
    inbound: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    outbound: mpsc::Sender<Vec<u8>>,
    pending: Arc<Pending>,
}

impl LineTransport {
    /// Starts the reader and writer tasks. The writer ends when every sender is gone
    /// (the transport and the reader), after flushing what was queued.
    pub fn spawn<R, W>(read: R, write: W) -> Self
    where
        R: AsyncBufRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (in_tx, in_rx) = mpsc::channel(INBOUND_QUEUE);
        let (out_tx, out_rx) = mpsc::channel(OUTBOUND_QUEUE);
        let pending = Arc::new(Pending::default());
        tokio::spawn(write_frames(write, out_rx));
        tokio::spawn(read_frames(
            FrameReader::new(read).with_partial_timeout(PARTIAL_FRAME_BOUND),
            in_tx,
            out_tx.clone(),
            Arc::clone(&pending),
        ));
        Self {
            inbound: in_rx,
            outbound: out_tx,
            pending,
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(mut write: W, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(mut frame) = rx.recv().await {
        frame.push(b'\n');
        let written = async {
            write.write_all(&frame).await?;
            // Drain whatever else is already queued before paying for a flush.
            while let Ok(mut more) = rx.try_recv() {
                more.push(b'\n');
                write.write_all(&more).await?;
            }
            write.flush().await
        }
        .await;
        if let Err(err) = written {
            tracing::debug!(%err, "session output closed");
            return;
        }
    }
    let _ = write.shutdown().await;
}

fn error_frame(id: Value, code: i64, message: &str) -> Vec<u8> {
    let reply = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    reply.to_string().into_bytes()
}

/// The answer to an oversized frame: the request's id when its prefix shows one.
fn oversized_frame(len: usize, prefix: &[u8]) -> Vec<u8> {
    let id = request_id_in_prefix(prefix).unwrap_or(Value::Null);
    let reply = json!({"jsonrpc": "2.0", "id": id, "error": oversized_error(len)});
    reply.to_string().into_bytes()
}

/// What one inbound line turns into.
enum Inbound {
    /// A message for rmcp; `request` is the canonical id of a request it must answer,
    /// `cancels` the id a `notifications/cancelled` gives up on.
    Message {
        message: Box<RxJsonRpcMessage<RoleServer>>,
        request: Option<String>,
        cancels: Option<String>,
    },
    Reply(Vec<u8>),
    Ignore,
}

fn classify(frame: Frame, initialize_seen: &mut bool) -> Inbound {
    let line = match frame {
        Frame::Oversized { len, prefix } => {
            tracing::warn!(len, "discarded an oversized frame");
            return Inbound::Reply(oversized_frame(len, &prefix));
        }
        Frame::Line(line) => line,
    };
    if line.iter().all(u8::is_ascii_whitespace) {
        return Inbound::Ignore;
    }
    let value: Value = match serde_json::from_slice(&line) {
        Ok(v) => v,
        Err(_) => return Inbound::Reply(error_frame(Value::Null, -32700, "parse error: not JSON")),
    };
    if value.is_array() {
        return Inbound::Reply(error_frame(
            Value::Null,
            -32600,
            "invalid request: batches (JSON arrays) are not supported; send one message per line",
        ));
    }
    let id = value.get("id").cloned();
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let (Some(method), Some(id)) = (method.as_deref(), &id) {
        if method == "ping" && !*initialize_seen {
            // The one request the spec allows before `initialize`.
            let pong = json!({"jsonrpc": "2.0", "id": id, "result": {}});
            return Inbound::Reply(pong.to_string().into_bytes());
        }
        if method != "initialize" && !*initialize_seen {
            return Inbound::Reply(error_frame(
                id.clone(),
                -32600,
                "the session is not initialized: send `initialize` first",
            ));
        }
        if method == "tools/call" {
            let params = value.get("params");
            let named = params
                .and_then(|p| p.get("name"))
                .is_some_and(Value::is_string);
            let arguments_ok = params
                .and_then(|p| p.get("arguments"))
                .is_none_or(|a| a.is_object() || a.is_null());
            if !named || !arguments_ok {
                return Inbound::Reply(error_frame(
                    id.clone(),
                    -32602,
                    "invalid params: tools/call needs a string `name` and object `arguments`",
                ));
            }
        }
    }
    let cancelled_id = value.pointer("/params/requestId").map(Value::to_string);
    match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value) {
        Ok(message) => {
            match (method.as_deref(), &id) {
                (Some("initialize"), Some(_)) => *initialize_seen = true,
                // rmcp ends a session on a notification before `initialize`; a
                // notification needs no answer, so it is dropped instead.
                (Some(_), None) if !*initialize_seen => return Inbound::Ignore,
                _ => {}
            }
            let request = match (&method, &id) {
                (Some(_), Some(id)) => Some(id.to_string()),
                _ => None,
            };
            let cancels = match method.as_deref() {
                Some("notifications/cancelled") => cancelled_id,
                _ => None,
            };
            Inbound::Message {
                message: Box::new(message),
                request,
                cancels,
            }
        }
        Err(err) => match id {
            Some(id) => Inbound::Reply(error_frame(id, -32600, &format!("invalid request: {err}"))),
            None => {
                tracing::debug!(%err, "dropped an invalid notification");
                Inbound::Ignore
            }
        },
    }
}

/// The id of a request message (null for anything else).
fn message_id(message: &RxJsonRpcMessage<RoleServer>) -> Value {
    match message {
        JsonRpcMessage::Request(request) => {
            serde_json::to_value(&request.id).unwrap_or(Value::Null)
        }
        _ => Value::Null,
    }
}

async fn read_frames<R: AsyncBufRead + Unpin>(
    mut frames: FrameReader<R>,
    inbound: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    outbound: mpsc::Sender<Vec<u8>>,
    pending: Arc<Pending>,
) {
    let mut initialize_seen = false;
    loop {
        let frame = match frames.next_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            Err(err) => {
                tracing::debug!(%err, "session input failed");
                return;
            }
        };
        let delivered = match classify(frame, &mut initialize_seen) {
            Inbound::Message {
                message,
                request,
                cancels,
            } => {
                if let Some(id) = request
                    && !pending.add(id)
                {
                    // Two requests may not share an id while the first is unanswered:
                    // the second never runs (its reply would be ambiguous).
                    let id = message_id(&message);
                    let refusal = error_frame(
                        id,
                        -32600,
                        "invalid request: a request with this id is still in flight",
                    );
                    if outbound.send(refusal).await.is_err() {
                        return;
                    }
                    continue;
                }
                if let Some(id) = cancels {
                    // A cancelled request gets no reply; do not wait for one.
                    pending.done(&id);
                }
                inbound.send(*message).await.is_ok()
            }
            Inbound::Reply(reply) => outbound.send(reply).await.is_ok(),
            Inbound::Ignore => true,
        };
        if !delivered {
            return;
        }
    }
}

impl Transport<RoleServer> for LineTransport {
    type Error = TransportError;

    fn name() -> Cow<'static, str> {
        "marsh-line".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let outbound = self.outbound.clone();
        let encoded = serde_json::to_vec(&item);
        let answered = match &item {
            JsonRpcMessage::Response(r) => serde_json::to_string(&r.id).ok(),
            JsonRpcMessage::Error(e) => e.id.as_ref().and_then(|id| serde_json::to_string(id).ok()),
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
        };
        let pending = Arc::clone(&self.pending);
        async move {
            let result = async {
                let bytes = encoded?;
                if bytes.len() > MAX_FRAME_BYTES {
                    return Err(TransportError::OutboundTooLarge(bytes.len()));
                }
                outbound
                    .send(bytes)
                    .await
                    .map_err(|_| TransportError::WriterGone)
            }
            .await;
            if let Some(id) = answered {
                pending.done(&id);
            }
            result
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        let pending = Arc::clone(&self.pending);
        let inbound = &mut self.inbound;
        async move {
            let next = inbound.recv().await;
            if next.is_none() {
                // Input ended: answer what was already asked before ending the session.
                if tokio::time::timeout(DRAIN_BOUND, pending.drained())
                    .await
                    .is_err()
                {
                    tracing::warn!(
                        "input ended with requests still unanswered after the drain bound"
                    );
                }
            }
            next
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inbound.close();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Frame {
        Frame::Line(text.as_bytes().to_vec())
    }

    fn reply(inbound: Inbound) -> Value {
        match inbound {
            Inbound::Reply(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Inbound::Message { .. } => panic!("expected a reply, got a message"),
            Inbound::Ignore => panic!("expected a reply, got nothing"),
        }
    }

    #[test]
    fn bad_frames_are_answered_here_and_never_reach_rmcp() {
        let mut seen = false;
        let cut = br#"{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"#.to_vec();
        let oversized = reply(classify(
            Frame::Oversized {
                len: 2 << 20,
                prefix: cut,
            },
            &mut seen,
        ));
        assert_eq!(
            oversized["id"], 41,
            "the id found in the prefix is answered"
        );
        assert_eq!(oversized["error"]["code"], -32600);
        assert!(
            oversized["error"]["message"]
                .as_str()
                .unwrap()
                .contains("2097152")
        );
        assert_eq!(
            reply(classify(line("{nope"), &mut seen))["error"]["code"],
            -32700
        );
        let invalid = reply(classify(
            line(r#"{"jsonrpc":"2.0","id":7,"x":1}"#),
            &mut seen,
        ));
        assert_eq!(
            (invalid["id"].clone(), invalid["error"]["code"].clone()),
            (Value::from(7), Value::from(-32600))
        );
        assert!(matches!(classify(line("   "), &mut seen), Inbound::Ignore));
        let batch = reply(classify(
            line(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
            &mut seen,
        ));
        assert_eq!(
            (batch["id"].clone(), batch["error"]["code"].clone()),
            (Value::Null, Value::from(-32600))
        );
        let early = reply(classify(
            line(r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#),
            &mut seen,
        ));
        assert_eq!(
            (early["id"].clone(), early["error"]["code"].clone()),
            (Value::from(2), Value::from(-32600))
        );
        assert!(
            early["error"]["message"]
                .as_str()
                .unwrap()
                .contains("initialize")
        );
        seen = true;
        for params in [
            r#"{}"#,
            r#"{"name":5}"#,
            r#"{"name":"status","arguments":[1]}"#,
        ] {
            let frame =
                format!(r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{params}}}"#);
            let nameless = reply(classify(line(&frame), &mut seen));
            assert_eq!(nameless["error"]["code"], -32602, "{params}");
            assert_eq!(nameless["id"], 3);
        }
    }

    #[test]
    fn requests_are_tracked_and_early_notifications_dropped() {
        let mut seen = false;
        let early = line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert!(matches!(classify(early, &mut seen), Inbound::Ignore));
        let init = line(
            r#"{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
        );
        match classify(init, &mut seen) {
            Inbound::Message {
                request, cancels, ..
            } => {
                assert_eq!(request.as_deref(), Some("\"a\""));
                assert_eq!(cancels, None);
            }
            _ => panic!("initialize must reach rmcp"),
        }
        assert!(seen);
        let cancel = line(
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}"#,
        );
        match classify(cancel, &mut seen) {
            Inbound::Message {
                request, cancels, ..
            } => {
                assert_eq!((request, cancels.as_deref()), (None, Some("3")));
            }
            _ => panic!("a cancellation must reach rmcp"),
        }
    }
}
