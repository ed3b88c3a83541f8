//! The rmcp transport for one MCP session over any byte stream: our bounded frame
//! reader in front, one writer task behind.
//!
//! Invariants: every inbound line is either handed to rmcp as a parsed message or
//! answered here with a JSON-RPC error (oversized, unparseable, not a JSON object, an
//! object with a duplicate key at any depth, not JSON-RPC, a batch,
//! a request before `initialize`, a `tools/call` without a name or with non-object
//! arguments, a request whose id is still in flight); no frame larger than the cap is
//! ever buffered; outbound frames are serialized and written by one task, so replies
//! and error answers never interleave mid-line.

use std::borrow::Cow;

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{ClientNotification, JsonRpcMessage, NumberOrString};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use marsh_framing::{
    Frame, FrameReader, MAX_FRAME_BYTES, oversized_error, request_id_in_prefix, with_raw_id,
};
use serde_json::value::RawValue;

use super::backlog::Backlog;
use super::duplicate_keys;
use super::request_ids::RequestIds;

const INBOUND_QUEUE: usize = 32;
const OUTBOUND_QUEUE: usize = 64;
/// How long the requests in flight when the input ends may go on as asked; after it,
/// the session's `input_closed` token is cancelled, which every call's own token
/// follows (an inline wait ends with its operation's cancellation), and each is still
/// answered. Quick calls sent just before EOF (a script piping requests) finish
/// normally. (Cancelling through rmcp's `notifications/cancelled` was rejected: rmcp
/// then sends no answer at all.)
const EOF_GRACE: Duration = Duration::from_secs(2);
/// How long a session whose input ended waits for its cancelled requests' answers.
/// With [`EOF_GRACE`] and the session's cancel settle (6 s) the session ends within
/// 15 s of EOF.
const DRAIN_BOUND: Duration = Duration::from_secs(5);
/// A frame begun but not completed within this ends the session's input, as a
/// disconnect does (its operations are cancelled): a peer holding half a line would
/// otherwise keep the session, and its operations, alive forever.
const PARTIAL_FRAME_BOUND: Duration = Duration::from_secs(60);

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
    outbound: Outbound,
    /// Requests read but not yet answered, by the client's exact id. When input ends,
    /// the session stays up until none is left (bounded), so a client that half-closes
    /// after its last request still gets every reply.
    ids: Arc<RequestIds>,
    /// What the session owes its client; the reader waits while it is too much.
    backlog: Arc<Backlog>,
}

impl LineTransport {
    /// Starts the reader and writer tasks. The writer ends when every sender is gone
    /// (the transport and the reader), after flushing what was queued.
    /// `input_closed` is cancelled [`EOF_GRACE`] after the input ends with requests
    /// still in flight (at once when there are none).
    pub fn spawn<R, W>(read: R, write: W, input_closed: CancellationToken) -> Self
    where
        R: AsyncBufRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (in_tx, in_rx) = mpsc::channel(INBOUND_QUEUE);
        let (out_tx, out_rx) = mpsc::channel(OUTBOUND_QUEUE);
        let ids = Arc::new(RequestIds::default());
        let backlog = Arc::new(Backlog::default());
        let outbound = Outbound {
            frames: out_tx,
            backlog: Arc::clone(&backlog),
        };
        tokio::spawn(write_frames(write, out_rx, Arc::clone(&backlog)));
        tokio::spawn(read_frames(
            FrameReader::new(read).with_partial_timeout(PARTIAL_FRAME_BOUND),
            in_tx,
            outbound.clone(),
            Arc::clone(&ids),
            input_closed,
        ));
        Self {
            inbound: in_rx,
            outbound,
            ids,
            backlog,
        }
    }
}

/// The writer's side of the queue: every frame sent through it is counted in the
/// backlog until the writer has written it.
#[derive(Clone)]
struct Outbound {
    frames: mpsc::Sender<Vec<u8>>,
    backlog: Arc<Backlog>,
}

impl Outbound {
    /// Counts `frame` as owed from now (not from when the returned future runs) and
    /// hands it to the writer.
    fn send(
        &self,
        frame: Vec<u8>,
    ) -> impl Future<Output = Result<(), TransportError>> + Send + 'static {
        let len = frame.len();
        self.backlog.queued(len);
        let (frames, backlog) = (self.frames.clone(), Arc::clone(&self.backlog));
        async move {
            frames.send(frame).await.map_err(|_| {
                backlog.settled(len);
                TransportError::WriterGone
            })
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(
    mut write: W,
    mut rx: mpsc::Receiver<Vec<u8>>,
    backlog: Arc<Backlog>,
) {
    while let Some(mut frame) = rx.recv().await {
        let len = frame.len();
        frame.push(b'\n');
        let written = async {
            write.write_all(&frame).await?;
            backlog.settled(len);
            // Drain whatever else is already queued before paying for a flush.
            while let Ok(mut more) = rx.try_recv() {
                let len = more.len();
                more.push(b'\n');
                write.write_all(&more).await?;
                backlog.settled(len);
            }
            write.flush().await
        }
        .await;
        if let Err(err) = written {
            tracing::debug!(%err, "session output closed");
            backlog.writer_gone();
            return;
        }
    }
    backlog.writer_gone();
    let _ = write.shutdown().await;
}

/// An error reply to the request whose id is `raw` (its JSON text; `null` for none).
fn error_frame(raw: &str, code: i64, message: &str) -> Vec<u8> {
    let reply = json!({"jsonrpc": "2.0", "error": {"code": code, "message": message}});
    with_raw_id(raw, &reply).into_bytes()
}

/// What answers a request whose reply came out larger than one frame (tool results are
/// fitted well below it, so only an enormous request id gets here): a JSON-RPC error
/// for the same id that names the operation the result was about, which stays
/// readable with operation_get and operation_output.
fn too_large_answer(raw: &str, reply: &Value, len: usize) -> Vec<u8> {
    let data = reply.pointer("/result/structuredContent/data");
    let field = |name: &str| {
        data.and_then(|d| {
            d.get(name)
                .or_else(|| d.get("operation").and_then(|o| o.get(name)))
        })
        .and_then(Value::as_str)
    };
    let (message, data) = match (field("operation_id"), field("state")) {
        (Some(id), state) => (
            format!(
                "the reply of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte frame; operation {id} is {}: operation_get and operation_output read it",
                state.unwrap_or("unknown")
            ),
            json!({"operation_id": id}),
        ),
        (None, _) => (
            format!(
                "the reply of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte frame and was not sent"
            ),
            Value::Null,
        ),
    };
    let error =
        json!({"jsonrpc": "2.0", "error": {"code": -32603, "message": message, "data": data}});
    with_raw_id(raw, &error).into_bytes()
}

/// The answer to an oversized frame: the request's id when its prefix shows one.
fn oversized_frame(len: usize, prefix: &[u8]) -> Vec<u8> {
    let raw = request_id_in_prefix(prefix);
    let reply = json!({"jsonrpc": "2.0", "error": oversized_error(len)});
    with_raw_id(raw.as_deref().unwrap_or("null"), &reply).into_bytes()
}

/// The exact JSON texts of a message's top-level `id` and, for a cancellation, of the
/// request id it names: a parsed value would lose a number's spelling and size.
/// (Parsed apart, so a malformed `params` cannot hide the id.)
#[derive(serde::Deserialize)]
struct IdText<'a> {
    #[serde(borrow)]
    id: Option<&'a RawValue>,
}

#[derive(serde::Deserialize)]
struct CancellationText<'a> {
    #[serde(borrow)]
    params: CancelledText<'a>,
}

#[derive(serde::Deserialize)]
struct CancelledText<'a> {
    #[serde(borrow, rename = "requestId")]
    request_id: &'a RawValue,
}

/// What one inbound line turns into.
enum Inbound {
    /// A message for rmcp: `request` is the exact id text of a request it must answer,
    /// `cancels` that of the request a `notifications/cancelled` gives up on.
    /// [`read_frames`] gives rmcp ids of its own before passing it on.
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
        Err(_) => return Inbound::Reply(error_frame("null", -32700, "parse error: not JSON")),
    };
    if value.is_array() {
        return Inbound::Reply(error_frame(
            "null",
            -32600,
            "invalid request: batches (JSON arrays) are not supported; send one message per line",
        ));
    }
    if !value.is_object() {
        return Inbound::Reply(error_frame(
            "null",
            -32600,
            "invalid request: a JSON-RPC message is a JSON object, one per line",
        ));
    }
    let id = match serde_json::from_slice::<IdText>(&line) {
        Ok(text) => text.id.map(|raw| raw.get().to_string()),
        Err(_) => value.get("id").map(Value::to_string),
    };
    if let Some(path) = duplicate_keys::first_duplicate(&line) {
        let (code, what) = if path.starts_with("params.arguments.") {
            (-32602, "invalid params")
        } else {
            (-32600, "invalid request")
        };
        // A duplicated id has no one value to echo.
        let raw = match (&id, path.as_str()) {
            (Some(raw), p) if p != "id" => raw.as_str(),
            _ => "null",
        };
        return Inbound::Reply(error_frame(
            raw,
            code,
            &format!(
                "{what}: the key `{}` appears twice in one object; send each key once",
                crate::error::echo_excerpt(&path)
            ),
        ));
    }
    let cancelled_id = serde_json::from_slice::<CancellationText>(&line)
        .ok()
        .map(|text| text.params.request_id.get().to_string());
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let (Some(method), Some(id)) = (method.as_deref(), &id) {
        if method == "ping" && !*initialize_seen {
            // The one request the spec allows before `initialize`.
            let pong = json!({"jsonrpc": "2.0", "result": {}});
            return Inbound::Reply(with_raw_id(id, &pong).into_bytes());
        }
        if method != "initialize" && !*initialize_seen {
            return Inbound::Reply(error_frame(
                id,
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
                    id,
                    -32602,
                    "invalid params: tools/call needs a string `name` and object `arguments`",
                ));
            }
        }
    }
    // rmcp reads ids as i64 or string: an id of another size or spelling would make it
    // refuse the message. Placeholders go in here; `read_frames` puts rmcp's own ids in.
    let mut value = value;
    if id.is_some()
        && let Some(object) = value.as_object_mut()
    {
        object.insert("id".into(), 0.into());
    }
    if cancelled_id.is_some()
        && let Some(params) = value.get_mut("params").and_then(Value::as_object_mut)
    {
        params.insert("requestId".into(), 0.into());
    }
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
                (Some(_), Some(id)) => Some(id.clone()),
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
            Some(id) => {
                Inbound::Reply(error_frame(&id, -32600, &format!("invalid request: {err}")))
            }
            None => {
                tracing::debug!(%err, "dropped an invalid notification");
                Inbound::Ignore
            }
        },
    }
}

/// Puts rmcp's ids in place of the client's: `internal` as a request's id, `cancelled`
/// as the request a cancellation names.
fn with_internal_ids(
    message: &mut RxJsonRpcMessage<RoleServer>,
    internal: Option<i64>,
    cancelled: Option<i64>,
) {
    match message {
        JsonRpcMessage::Request(request) => {
            if let Some(internal) = internal {
                request.id = NumberOrString::Number(internal);
            }
        }
        JsonRpcMessage::Notification(notification) => {
            if let (Some(cancelled), ClientNotification::CancelledNotification(note)) =
                (cancelled, &mut notification.notification)
            {
                note.params.request_id = Some(NumberOrString::Number(cancelled));
            }
        }
        JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
    }
}

async fn read_frames<R: AsyncBufRead + Unpin>(
    mut frames: FrameReader<R>,
    inbound: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    outbound: Outbound,
    ids: Arc<RequestIds>,
    input_closed: CancellationToken,
) {
    let _closed = input_closed.clone().drop_guard();
    let mut initialize_seen = false;
    loop {
        // Nothing more is read while the client has not taken what it was sent.
        outbound.backlog.room(&ids).await;
        let frame = match frames.next_frame().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return end_of_input(&ids, &input_closed).await,
            Err(err) => {
                tracing::debug!(%err, "session input failed");
                return end_of_input(&ids, &input_closed).await;
            }
        };
        let reply = match classify(frame, &mut initialize_seen) {
            Inbound::Message {
                mut message,
                request,
                cancels,
            } => {
                // Two requests may not share an id while the first is unanswered: the
                // second never runs (its reply would be ambiguous).
                let internal = match &request {
                    Some(raw) => match ids.admit(raw) {
                        Some(internal) => Some(internal),
                        None => {
                            let refusal = error_frame(
                                raw,
                                -32600,
                                "invalid request: a request with this id is still in flight",
                            );
                            if outbound.send(refusal).await.is_err() {
                                return;
                            }
                            continue;
                        }
                    },
                    None => None,
                };
                // A cancellation names the request by the client's id; rmcp knows it by
                // ours. A cancelled request gets no reply, so its id is free now; one
                // not in flight is nothing to cancel.
                let cancelled = match &cancels {
                    Some(raw) => match ids.internal(raw) {
                        Some(cancelled) => {
                            ids.release(cancelled);
                            Some(cancelled)
                        }
                        None => continue,
                    },
                    None => None,
                };
                with_internal_ids(&mut message, internal, cancelled);
                if inbound.send(*message).await.is_err() {
                    return;
                }
                None
            }
            Inbound::Reply(reply) => Some(reply),
            Inbound::Ignore => None,
        };
        if let Some(reply) = reply
            && outbound.send(reply).await.is_err()
        {
            return;
        }
    }
}

/// The input ended (EOF, a read error, a frame left half-written): the requests in
/// flight get [`EOF_GRACE`] to finish, then `input_closed` cancels the rest.
async fn end_of_input(ids: &RequestIds, input_closed: &CancellationToken) {
    if tokio::time::timeout(EOF_GRACE, ids.drained())
        .await
        .is_err()
    {
        tracing::debug!("input ended: cancelling the requests still in flight");
    }
    input_closed.cancel();
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
        // A reply goes out with the client's id, exactly as it was written; the id is
        // free again from here. A reply whose request was cancelled (its id already
        // released) is not sent: a cancelled request gets none.
        let internal = match &item {
            JsonRpcMessage::Response(r) => Some(&r.id),
            JsonRpcMessage::Error(e) => e.id.as_ref(),
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
        };
        let client_id = match internal {
            Some(NumberOrString::Number(n)) => {
                let released = self.ids.release(*n);
                self.backlog.answered();
                Some(released)
            }
            _ => None,
        };
        let encoded = match client_id {
            None => serde_json::to_vec(&item).map(Some),
            Some(None) => Ok(None),
            Some(Some(raw)) => serde_json::to_value(&item).map(|mut value| {
                if let Some(object) = value.as_object_mut() {
                    object.remove("id");
                }
                let bytes = with_raw_id(&raw, &value).into_bytes();
                if bytes.len() > MAX_FRAME_BYTES {
                    tracing::warn!(len = bytes.len(), "a reply exceeds the frame cap");
                    return Some(too_large_answer(&raw, &value, bytes.len()));
                }
                Some(bytes)
            }),
        };
        let delivery = match encoded {
            Err(e) => Err(TransportError::Encode(e)),
            Ok(None) => {
                tracing::debug!("dropped the reply to a cancelled request");
                Ok(None)
            }
            // Even the error naming the operation does not fit (its id alone is about
            // a frame); nothing smaller can answer it.
            Ok(Some(bytes)) if bytes.len() > MAX_FRAME_BYTES => {
                Err(TransportError::OutboundTooLarge(bytes.len()))
            }
            Ok(Some(bytes)) => Ok(Some(self.outbound.send(bytes))),
        };
        async move {
            match delivery? {
                Some(sent) => sent.await,
                None => Ok(()),
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        let ids = Arc::clone(&self.ids);
        let inbound = &mut self.inbound;
        async move {
            let next = inbound.recv().await;
            if next.is_none() {
                // Input ended: answer what was already asked before ending the session.
                if tokio::time::timeout(DRAIN_BOUND, ids.drained())
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

    /// A reply too large for a frame becomes an error for the same id that names the
    /// operation (here a stopped-scope read, whose operation is nested).
    #[test]
    fn a_too_large_reply_names_its_operation() {
        for data in [
            json!({"operation_id": "op-1", "state": "running"}),
            json!({"operation": {"operation_id": "op-1", "state": "running"}}),
        ] {
            let reply = json!({"result": {"structuredContent": {"ok": true, "data": data}}});
            let line = String::from_utf8(too_large_answer("18446744073709551617", &reply, 2 << 20))
                .unwrap();
            assert!(line.contains(r#""id":18446744073709551617"#), "{line}");
            let value: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(value["error"]["code"], -32603);
            assert_eq!(value["error"]["data"]["operation_id"], "op-1");
            let message = value["error"]["message"].as_str().unwrap();
            assert!(message.contains("op-1 is running") && message.contains("operation_output"));
        }
    }

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
