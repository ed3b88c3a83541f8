//! A newline-delimited frame reader with a hard per-line cap.
//!
//! Rejected alternatives: `tokio_util::codec::LinesCodec` ends the stream when a line
//! overflows its limit, and rmcp's own codec silently drops such a line; we must answer
//! an oversized frame and keep the session, so the reader reports it as a value.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The largest MCP frame accepted in either direction, excluding the newline.
pub const MAX_FRAME_BYTES: usize = 1024 * 1024;
/// How much of an oversized frame is kept, to find its request id (see
/// [`crate::oversized_reply`]).
pub const OVERSIZED_PREFIX_BYTES: usize = 4096;

#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// One complete line without its terminator (a trailing `\r` is kept; JSON allows it).
    Line(Vec<u8>),
    /// A line longer than the cap. Its bytes past the first
    /// [`OVERSIZED_PREFIX_BYTES`] were discarded as they arrived, so memory stays bounded
    /// by the cap whatever the peer sends; `len` counts what was seen.
    Oversized { len: usize, prefix: Vec<u8> },
}

pub struct FrameReader<R> {
    inner: R,
    max: usize,
    /// Once a frame has begun, the rest must arrive within this; `None` waits forever.
    partial_timeout: Option<std::time::Duration>,
}

impl<R: AsyncBufRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        Self::with_limit(inner, MAX_FRAME_BYTES)
    }

    pub fn with_limit(inner: R, max: usize) -> Self {
        Self {
            inner,
            max,
            partial_timeout: None,
        }
    }

    /// A peer that starts a frame and stalls holds a session open with nothing to
    /// answer; with this bound, `next_frame` fails with `TimedOut` instead.
    pub fn with_partial_timeout(mut self, bound: std::time::Duration) -> Self {
        self.partial_timeout = Some(bound);
        self
    }

    /// The next frame, or `None` at end of input. A final unterminated line is returned
    /// as a frame too: a peer that half-closes after its last request still gets served.
    pub async fn next_frame(&mut self) -> std::io::Result<Option<Frame>> {
        let mut line = Vec::new();
        let mut seen = 0usize;
        let mut oversized = false;
        loop {
            let buf = match (self.partial_timeout, seen) {
                (Some(bound), 1..) => tokio::time::timeout(bound, self.inner.fill_buf())
                    .await
                    .map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("a frame stayed incomplete for {} s", bound.as_secs()),
                    )
                })??,
                _ => self.inner.fill_buf().await?,
            };
            if buf.is_empty() {
                return Ok(match (seen, oversized) {
                    (0, _) => None,
                    (_, true) => Some(Frame::Oversized {
                        len: seen,
                        prefix: line,
                    }),
                    (_, false) => Some(Frame::Line(line)),
                });
            }
            let (chunk, done) = match memchr_newline(buf) {
                Some(i) => (&buf[..i], Some(i + 1)),
                None => (buf, None),
            };
            seen += chunk.len();
            if !oversized {
                line.extend_from_slice(chunk);
                if seen > self.max {
                    // From here only the prefix is kept: the first
                    // OVERSIZED_PREFIX_BYTES bytes of the line.
                    oversized = true;
                    line.truncate(OVERSIZED_PREFIX_BYTES);
                    line.shrink_to_fit();
                }
            } else if line.len() < OVERSIZED_PREFIX_BYTES {
                let room = OVERSIZED_PREFIX_BYTES - line.len();
                line.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            let consumed = done.unwrap_or(buf.len());
            self.inner.consume(consumed);
            if done.is_some() {
                return Ok(Some(if oversized {
                    Frame::Oversized {
                        len: seen,
                        prefix: line,
                    }
                } else {
                    Frame::Line(line)
                }));
            }
        }
    }
}

fn memchr_newline(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|b| *b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    async fn frames(input: &[u8], max: usize) -> Vec<Frame> {
        let reader = tokio::io::BufReader::with_capacity(7, input);
        let mut frames = FrameReader::with_limit(reader, max);
        let mut out = Vec::new();
        while let Some(f) = frames.next_frame().await.unwrap() {
            out.push(f);
        }
        out
    }

    #[tokio::test]
    async fn splits_lines_and_reports_oversized_without_ending() {
        let got = frames(b"ab\n0123456789\ncd", 5).await;
        assert_eq!(
            got,
            vec![
                Frame::Line(b"ab".to_vec()),
                Frame::Oversized {
                    len: 10,
                    prefix: b"0123456789".to_vec()
                },
                Frame::Line(b"cd".to_vec())
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_partial_frame_times_out_but_an_idle_peer_does_not() {
        let (mut peer, ours) = tokio::io::duplex(64);
        let mut frames = FrameReader::new(tokio::io::BufReader::new(ours))
            .with_partial_timeout(std::time::Duration::from_secs(60));
        use tokio::io::AsyncWriteExt;
        // Idle between frames: no deadline.
        let idle =
            tokio::time::timeout(std::time::Duration::from_secs(600), frames.next_frame()).await;
        assert!(idle.is_err(), "an idle peer must not time out");
        peer.write_all(b"{\"half\":").await.unwrap();
        let err = frames.next_frame().await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }

    proptest! {
        #[test]
        fn every_line_is_accounted_for(lines in proptest::collection::vec(proptest::collection::vec(0u8..=255u8, 0..40), 0..20), max in 1usize..30) {
            let lines: Vec<Vec<u8>> = lines.into_iter().map(|l| l.into_iter().filter(|b| *b != b'\n').collect()).collect();
            let mut input = Vec::new();
            for l in &lines { input.extend_from_slice(l); input.push(b'\n'); }
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let got = rt.block_on(frames(&input, max));
            prop_assert_eq!(got.len(), lines.len());
            for (g, l) in got.iter().zip(&lines) {
                if l.len() > max {
                    let prefix = l[..l.len().min(OVERSIZED_PREFIX_BYTES)].to_vec();
                    prop_assert_eq!(g, &Frame::Oversized { len: l.len(), prefix });
                } else {
                    prop_assert_eq!(g, &Frame::Line(l.clone()));
                }
            }
        }
    }
}
