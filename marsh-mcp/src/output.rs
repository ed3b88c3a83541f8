//! Bounded output capture with byte cursors.
//!
//! Both streams share one position space: every captured byte gets the next sequence
//! number, starting at 0, and numbers are never reused. Each stream keeps its own
//! retention window; when a stream exceeds it, its oldest chunks are evicted and the
//! eviction is remembered so a read whose range overlaps evicted bytes says so
//! (`evicted`) instead of silently skipping them.

use std::collections::VecDeque;

use serde::Serialize;

/// Bytes retained per stream of one operation.
pub const RETAINED_PER_STREAM: usize = 1024 * 1024;
/// Chunks are split to at most this size so eviction granularity stays fine.
const MAX_CHUNK: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn index(self) -> usize {
        match self {
            Self::Stdout => 0,
            Self::Stderr => 1,
        }
    }
}

#[derive(Debug)]
struct Chunk {
    start: u64,
    data: Vec<u8>,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

#[derive(Debug, Default)]
struct StreamLog {
    chunks: VecDeque<Chunk>,
    retained: usize,
    written: u64,
    /// Sequence just past the newest evicted byte of this stream (0 = none evicted).
    evicted_through: u64,
    evicted_bytes: u64,
}

impl StreamLog {
    fn evict_to(&mut self, limit: usize) {
        while self.retained > limit {
            let Some(chunk) = self.chunks.pop_front() else {
                break;
            };
            self.retained -= chunk.data.len();
            self.evicted_bytes += chunk.data.len() as u64;
            self.evicted_through = chunk.end();
        }
    }
}

#[derive(Debug)]
pub struct OutputLog {
    streams: [StreamLog; 2],
    next_seq: u64,
    limit: usize,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ReadOut {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Position of the first byte returned (the request position when none was).
    pub start_seq: u64,
    /// The position to pass as `since_seq` next time.
    pub next_seq: u64,
    /// Everything captured so far ends here.
    pub latest_seq: u64,
    /// The byte budget stopped the read before `latest_seq`; reading on continues.
    pub capped: bool,
    /// Part of the requested range was evicted before it was read and is gone.
    pub evicted: bool,
}

impl Default for OutputLog {
    fn default() -> Self {
        Self::with_limit(RETAINED_PER_STREAM)
    }
}

impl OutputLog {
    pub fn with_limit(limit: usize) -> Self {
        Self {
            streams: Default::default(),
            next_seq: 0,
            limit,
        }
    }

    pub fn append(&mut self, stream: Stream, data: &[u8]) {
        let log = &mut self.streams[stream.index()];
        for piece in data.chunks(MAX_CHUNK) {
            log.chunks.push_back(Chunk {
                start: self.next_seq,
                data: piece.to_vec(),
            });
            self.next_seq += piece.len() as u64;
            log.retained += piece.len();
            log.written += piece.len() as u64;
        }
        log.evict_to(self.limit);
    }

    pub fn latest_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn written(&self, stream: Stream) -> u64 {
        self.streams[stream.index()].written
    }

    pub fn retained(&self) -> usize {
        self.streams.iter().map(|s| s.retained).sum()
    }

    #[cfg(test)]
    pub fn evicted_bytes(&self, stream: Stream) -> u64 {
        self.streams[stream.index()].evicted_bytes
    }

    /// Drops everything retained (global retention pressure); reads then report
    /// `evicted` for the dropped range.
    pub fn discard_all(&mut self) {
        for s in &mut self.streams {
            s.evict_to(0);
        }
    }

    /// Reads forward from `since` in position order across both streams, returning at
    /// most `max_bytes` bytes.
    pub fn read_since(&self, since: u64, max_bytes: usize) -> ReadOut {
        let evicted = self
            .streams
            .iter()
            .any(|s| s.evicted_bytes > 0 && since < s.evicted_through);
        let mut cursors = [
            first_after(&self.streams[0], since),
            first_after(&self.streams[1], since),
        ];
        let mut out = [Vec::new(), Vec::new()];
        let mut pos = since;
        let mut start_seq = None;
        let mut budget = max_bytes;
        loop {
            // The next piece is whichever stream's current chunk starts (or resumes) first.
            let next = (0..2)
                .filter_map(|i| {
                    self.streams[i]
                        .chunks
                        .get(cursors[i])
                        .map(|c| (i, c.start.max(pos)))
                })
                .min_by_key(|(_, at)| *at);
            let Some((i, at)) = next else {
                pos = self.next_seq;
                break;
            };
            if budget == 0 {
                pos = at;
                break;
            }
            let chunk = &self.streams[i].chunks[cursors[i]];
            let offset = (at - chunk.start) as usize;
            let take = (chunk.data.len() - offset).min(budget);
            start_seq.get_or_insert(at);
            out[i].extend_from_slice(&chunk.data[offset..offset + take]);
            budget -= take;
            pos = at + take as u64;
            if offset + take == chunk.data.len() {
                cursors[i] += 1;
            }
        }
        let [stdout, stderr] = out;
        ReadOut {
            stdout,
            stderr,
            start_seq: start_seq.unwrap_or(pos.min(since.max(self.first_retained()))),
            next_seq: pos,
            latest_seq: self.next_seq,
            capped: pos < self.next_seq,
            evicted,
        }
    }

    fn first_retained(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|s| s.chunks.front().map(|c| c.start))
            .min()
            .unwrap_or(self.next_seq)
    }

    /// The newest `lines` lines of each stream, at most `max_bytes` in all (newest
    /// bytes kept), independent of any cursor.
    pub fn tail(&self, lines: usize, max_bytes: usize) -> ReadOut {
        let per_stream = max_bytes / 2;
        let mut out = [Vec::new(), Vec::new()];
        let mut start = self.next_seq;
        let mut evicted = false;
        for (i, s) in self.streams.iter().enumerate() {
            let mut bytes: Vec<u8> = Vec::with_capacity(s.retained.min(per_stream * 2));
            // Walk chunks newest first, collecting until enough newlines or bytes.
            let mut newlines = 0usize;
            let mut collected: Vec<&Chunk> = Vec::new();
            let mut total = 0usize;
            for c in s.chunks.iter().rev() {
                collected.push(c);
                total += c.data.len();
                newlines += c.data.iter().filter(|b| **b == b'\n').count();
                if newlines > lines || total >= per_stream {
                    break;
                }
            }
            for c in collected.iter().rev() {
                bytes.extend_from_slice(&c.data);
            }
            let first_seq = collected.last().map_or(self.next_seq, |c| c.start);
            let cut = tail_lines_offset(&bytes, lines);
            let cut = cut.max(bytes.len().saturating_sub(per_stream));
            if cut == 0 && s.evicted_bytes > 0 && collected.len() == s.chunks.len() {
                evicted = true;
            }
            start = start.min(first_seq + cut as u64);
            out[i] = bytes.split_off(cut);
        }
        let [stdout, stderr] = out;
        ReadOut {
            stdout,
            stderr,
            start_seq: start,
            next_seq: self.next_seq,
            latest_seq: self.next_seq,
            capped: false,
            evicted,
        }
    }
}

fn first_after(log: &StreamLog, since: u64) -> usize {
    log.chunks.partition_point(|c| c.end() <= since)
}

/// Offset where the last `lines` lines of `bytes` begin. A trailing newline ends the
/// last line rather than starting an empty one.
fn tail_lines_offset(bytes: &[u8], lines: usize) -> usize {
    if lines == 0 {
        return bytes.len();
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut seen = 0usize;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                return i + 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn interleaves_in_position_order_and_caps() {
        let mut log = OutputLog::default();
        log.append(Stream::Stdout, b"abc");
        log.append(Stream::Stderr, b"XY");
        log.append(Stream::Stdout, b"de");
        let all = log.read_since(0, 100);
        assert_eq!(
            (all.stdout.as_slice(), all.stderr.as_slice()),
            (&b"abcde"[..], &b"XY"[..])
        );
        assert_eq!(
            (all.start_seq, all.next_seq, all.latest_seq, all.capped),
            (0, 7, 7, false)
        );
        let part = log.read_since(2, 2);
        assert_eq!(
            (part.stdout.as_slice(), part.stderr.as_slice()),
            (&b"c"[..], &b"X"[..])
        );
        assert_eq!((part.start_seq, part.next_seq, part.capped), (2, 4, true));
        let rest = log.read_since(part.next_seq, 100);
        assert_eq!(
            (rest.stdout.as_slice(), rest.stderr.as_slice()),
            (&b"de"[..], &b"Y"[..])
        );
    }

    #[test]
    fn eviction_is_reported_not_skipped_silently() {
        let mut log = OutputLog::with_limit(4);
        log.append(Stream::Stdout, b"0123");
        log.append(Stream::Stdout, b"4567");
        let r = log.read_since(0, 100);
        assert!(r.evicted);
        assert_eq!(r.stdout, b"4567");
        assert_eq!(r.start_seq, 4);
        assert!(!log.read_since(4, 100).evicted);
        assert_eq!(log.evicted_bytes(Stream::Stdout), 4);
    }

    #[test]
    fn tail_returns_last_lines_per_stream() {
        let mut log = OutputLog::default();
        log.append(Stream::Stdout, b"one\ntwo\nthree\n");
        log.append(Stream::Stderr, b"e1\ne2");
        let t = log.tail(2, 1000);
        assert_eq!(t.stdout, b"two\nthree\n");
        assert_eq!(t.stderr, b"e1\ne2");
    }

    proptest! {
        #[test]
        fn paging_reassembles_each_stream_exactly(
            writes in proptest::collection::vec((any::<bool>(), proptest::collection::vec(any::<u8>(), 0..50)), 0..30),
            page in 1usize..40,
        ) {
            let mut log = OutputLog::default();
            let (mut want_out, mut want_err) = (Vec::new(), Vec::new());
            for (is_err, data) in &writes {
                if *is_err { log.append(Stream::Stderr, data); want_err.extend_from_slice(data); }
                else { log.append(Stream::Stdout, data); want_out.extend_from_slice(data); }
            }
            let (mut got_out, mut got_err) = (Vec::new(), Vec::new());
            let mut since = 0;
            loop {
                let r = log.read_since(since, page);
                prop_assert!(r.stdout.len() + r.stderr.len() <= page);
                prop_assert!(r.next_seq >= since);
                got_out.extend_from_slice(&r.stdout);
                got_err.extend_from_slice(&r.stderr);
                if !r.capped { break; }
                prop_assert!(r.next_seq > since);
                since = r.next_seq;
            }
            prop_assert_eq!(got_out, want_out);
            prop_assert_eq!(got_err, want_err);
        }
    }
}
