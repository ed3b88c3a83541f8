//! A server that cannot serve still answers its client: the first request gets a
//! JSON-RPC error carrying the reason, so a client that only shows protocol errors
//! (Codex: "connection closed: initialize response") says why. Used when the
//! development root is leased to another server.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long the client gets to send its first request.
const FIRST_REQUEST_BOUND: Duration = Duration::from_secs(30);
/// Longest line read while waiting for it (an `initialize` is small).
const LINE_LIMIT: u64 = 1024 * 1024;
/// JSON-RPC "server error" range: the server exists but cannot serve.
const CANNOT_SERVE: i64 = -32000;

/// Answers the first request read from `read` with an error carrying `message`
/// (notifications are skipped), then returns. Ends quietly at end of input, after
/// [`FIRST_REQUEST_BOUND`] or on a line over [`LINE_LIMIT`].
pub(crate) async fn refuse_first_request<R, W>(read: R, mut write: W, message: &str)
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let first = tokio::time::timeout(FIRST_REQUEST_BOUND, async {
        let mut read = read;
        loop {
            let mut line = Vec::new();
            let limited = (&mut read).take(LINE_LIMIT);
            tokio::pin!(limited);
            match limited.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return None,
                Ok(_) if !line.ends_with(b"\n") && line.len() as u64 >= LINE_LIMIT => return None,
                Ok(_) => {}
            }
            let Ok(message) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            if let Some(id) = message
                .get("id")
                .filter(|_| message.get("method").is_some())
            {
                return Some(id.clone());
            }
        }
    })
    .await
    .ok()
    .flatten();
    if let Some(id) = first {
        let reply = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": CANNOT_SERVE, "message": message},
        });
        let mut line = reply.to_string().into_bytes();
        line.push(b'\n');
        let _ = write.write_all(&line).await;
        let _ = write.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::BufReader;

    use super::*;

    #[tokio::test]
    async fn the_first_request_gets_the_reason_and_notifications_are_skipped() {
        let input = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/x\"}\nnot json\n{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\",\"params\":{}}\n";
        let (out_w, mut out_r) = tokio::io::duplex(4096);
        refuse_first_request(BufReader::new(&input[..]), out_w, "leased to pid 42").await;
        let mut out = String::new();
        out_r.read_to_string(&mut out).await.unwrap();
        let reply: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(reply["id"], 7);
        assert_eq!(reply["error"]["code"], CANNOT_SERVE);
        assert_eq!(reply["error"]["message"], "leased to pid 42");
    }

    #[tokio::test]
    async fn end_of_input_answers_nothing() {
        let (out_w, mut out_r) = tokio::io::duplex(64);
        refuse_first_request(BufReader::new(&b""[..]), out_w, "x").await;
        let mut out = String::new();
        out_r.read_to_string(&mut out).await.unwrap();
        assert!(out.is_empty());
    }
}
