//! The byte-level line relay between a stdio client and a broker session.
//!
//! Invariants: lines are forwarded unchanged, one at a time, never larger than the
//! frame cap; an oversized line in either direction is discarded and answered on the
//! client's stdout with a JSON-RPC error, and the session continues; stdin EOF is
//! passed on as a half-close and the relay ends cleanly only after the broker has
//! finished answering; a broker that goes away ends the relay at once as `Lost`.

use tokio::io::{AsyncBufRead, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use marsh_framing::{Frame, FrameReader, oversized_reply};

#[derive(Debug, PartialEq, Eq)]
pub enum RelayEnd {
    /// Stdin ended and the broker then closed the session after its last reply.
    Clean,
    /// The broker closed or failed while the client was still talking.
    Lost(String),
    /// The client's stdout is gone; nobody can read replies any more.
    ClientGone,
}

async fn write_out<W: AsyncWrite + Unpin>(mut out: W, mut rx: mpsc::Receiver<Vec<u8>>) -> bool {
    while let Some(line) = rx.recv().await {
        if out.write_all(&line).await.is_err() {
            return false;
        }
        while let Ok(more) = rx.try_recv() {
            if out.write_all(&more).await.is_err() {
                return false;
            }
        }
        if out.flush().await.is_err() {
            return false;
        }
    }
    true
}

fn with_newline(mut line: Vec<u8>) -> Vec<u8> {
    line.push(b'\n');
    line
}

/// Relays until the session ends; see [`RelayEnd`].
pub async fn relay<I, O, S>(stdin: I, stdout: O, session: S) -> RelayEnd
where
    I: AsyncBufRead + Unpin + Send + 'static,
    O: AsyncWrite + Unpin + Send + 'static,
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (from_broker, mut to_broker) = tokio::io::split(session);
    let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(64);
    let writer = tokio::spawn(write_out(stdout, out_rx));

    let errors = out_tx.clone();
    let upstream = tokio::spawn(async move {
        let mut frames = FrameReader::new(stdin);
        loop {
            match frames.next_frame().await {
                Ok(Some(Frame::Line(line))) => {
                    if to_broker.write_all(&with_newline(line)).await.is_err()
                        || to_broker.flush().await.is_err()
                    {
                        return Err("cannot write to the broker".to_string());
                    }
                }
                Ok(Some(Frame::Oversized { len, prefix })) => {
                    if errors.send(oversized_reply(len, &prefix)).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(None) | Err(_) => {
                    // Half-close: the broker sees EOF and finishes what it was asked.
                    let _ = to_broker.shutdown().await;
                    return Ok(());
                }
            }
        }
    });

    let mut frames = FrameReader::new(BufReader::new(from_broker));
    let mut client_gone = false;
    let downstream: Result<(), String> = loop {
        match frames.next_frame().await {
            Ok(Some(Frame::Line(line))) => {
                if out_tx.send(with_newline(line)).await.is_err() {
                    client_gone = true;
                    break Ok(());
                }
            }
            Ok(Some(Frame::Oversized { len, prefix })) => {
                if out_tx.send(oversized_reply(len, &prefix)).await.is_err() {
                    client_gone = true;
                    break Ok(());
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(format!("broker session failed: {e}")),
        }
    };
    drop(out_tx);
    // After a clean half-close the upstream task has already ended; the short bound
    // only absorbs scheduling. Still running means stdin is open: the broker left.
    let mut upstream = upstream;
    let upstream_result =
        match tokio::time::timeout(std::time::Duration::from_millis(200), &mut upstream).await {
            Ok(joined) => joined.ok(),
            Err(_) => {
                upstream.abort();
                None
            }
        };
    let wrote_all = writer.await.unwrap_or(false);
    if client_gone || !wrote_all {
        return RelayEnd::ClientGone;
    }
    match (downstream, upstream_result) {
        (Err(e), _) => RelayEnd::Lost(e),
        (Ok(()), Some(Ok(()))) => RelayEnd::Clean,
        (Ok(()), Some(Err(e))) => RelayEnd::Lost(e),
        (Ok(()), None) => RelayEnd::Lost("the broker closed the session".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use marsh_framing::MAX_FRAME_BYTES;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn relays_lines_answers_oversized_and_ends_clean_after_half_close() {
        let (client_side, broker_side) = tokio::io::duplex(4 * 1024 * 1024);
        let broker = tokio::spawn(async move {
            let (r, mut w) = tokio::io::split(broker_side);
            let mut lines = FrameReader::new(BufReader::new(r));
            let mut seen = Vec::new();
            while let Some(Frame::Line(line)) = lines.next_frame().await.unwrap() {
                w.write_all(&with_newline([b"echo:".as_slice(), &line].concat()))
                    .await
                    .unwrap();
                seen.push(line);
            }
            w.shutdown().await.unwrap();
            seen
        });
        let mut input = b"{\"a\":1}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_FRAME_BYTES + 10));
        input.extend_from_slice(b"\n{\"b\":2}\n");
        let (out_w, mut out_r) = tokio::io::duplex(1 << 20);
        let end = relay(
            BufReader::new(std::io::Cursor::new(input)),
            out_w,
            client_side,
        )
        .await;
        assert_eq!(end, RelayEnd::Clean);
        let mut out = String::new();
        out_r.read_to_string(&mut out).await.unwrap();
        assert!(out.contains("echo:{\"a\":1}"));
        assert!(out.contains("echo:{\"b\":2}"));
        assert!(out.contains("-32600"));
        assert_eq!(broker.await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_vanished_broker_is_lost_not_clean() {
        let (client_side, broker_side) = tokio::io::duplex(1024);
        drop(broker_side);
        let (stdin_w, stdin_r) = tokio::io::duplex(1024);
        let (out_w, _out_r) = tokio::io::duplex(1024);
        let end = relay(BufReader::new(stdin_r), out_w, client_side).await;
        assert!(matches!(end, RelayEnd::Lost(_)), "{end:?}");
        drop(stdin_w);
    }
}
