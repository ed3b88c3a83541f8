//! Bounded output capture with byte cursors.
//!
//! Both streams share one position space: every captured byte gets the next sequence
//! number, starting at 0, and numbers are never reused. Each stream keeps its first
//! [`HEAD_PINNED`] bytes (the command's first lines) and a rolling window of its newest
//! bytes, [`RETAINED_PER_STREAM`] in all; when a stream exceeds it, its oldest bytes
//! after the pinned head are evicted. So each stream loses at most one contiguous
//! range of positions, remembered as `lost`, and a read whose range overlaps it says
//! so (`evicted`) instead of silently skipping it.
//!
//! Invariants of a read ([`OutputLog::read_since`]): a page never spans a lost range
//! (it stops where one begins, and the next page, starting inside it, is flagged); a
//! page never ends inside a UTF-8 character of the stream it ends in (it ends up to
//! three bytes early, or — when the budget is smaller than the character — late), so
//! text paged at any budget decodes without replacement characters.

use std::collections::VecDeque;
use std::ops::Range;

use serde::Serialize;

/// Bytes retained per stream of one operation, its pinned head included.
pub const RETAINED_PER_STREAM: usize = 1024 * 1024;
/// The first bytes of each stream, never evicted by the rolling window (only by
/// global retention pressure): the first lines of a long output stay readable.
pub const HEAD_PINNED: usize = 64 * 1024;
/// Chunks are split to at most this size so eviction granularity stays fine; small
/// contiguous writes are coalesced up to it.
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
    /// The pinned first bytes; evicted only by [`OutputLog::discard_all`].
    head: VecDeque<Chunk>,
    /// Everything after the head, oldest first; the rolling window.
    rest: VecDeque<Chunk>,
    retained: usize,
    written: u64,
    /// The positions this stream lost to eviction: one range, because eviction takes
    /// the oldest chunk after the head (and the head only after everything else).
    lost: Option<Range<u64>>,
}

impl StreamLog {
    fn len(&self) -> usize {
        self.head.len() + self.rest.len()
    }

    fn get(&self, i: usize) -> Option<&Chunk> {
        match i.checked_sub(self.head.len()) {
            None => self.head.get(i),
            Some(j) => self.rest.get(j),
        }
    }

    fn chunks(&self) -> impl DoubleEndedIterator<Item = &Chunk> {
        self.head.iter().chain(self.rest.iter())
    }

    /// Index of the first chunk ending after `since`.
    fn first_after(&self, since: u64) -> usize {
        let in_head = self.head.partition_point(|c| c.end() <= since);
        if in_head < self.head.len() {
            return in_head;
        }
        self.head.len() + self.rest.partition_point(|c| c.end() <= since)
    }

    fn evict_to(&mut self, limit: usize) {
        while self.retained > limit {
            let Some(chunk) = self.rest.pop_front().or_else(|| self.head.pop_front()) else {
                break;
            };
            self.retained -= chunk.data.len();
            let range = chunk.start..chunk.end();
            self.lost = Some(match self.lost.take() {
                None => range,
                Some(lost) => lost.start.min(range.start)..lost.end.max(range.end),
            });
        }
    }

    /// The position of this stream's first retained byte at or after `pos`.
    fn next_retained_from(&self, pos: u64) -> Option<u64> {
        self.get(self.first_after(pos)).map(|c| c.start.max(pos))
    }

    /// Retained bytes of this stream at positions `from..`.
    fn bytes_after(&self, from: u64) -> usize {
        self.chunks()
            .filter(|c| c.end() > from)
            .map(|c| c.data.len() - from.saturating_sub(c.start) as usize)
            .sum()
    }

    fn lost_within(&self, range: &Range<u64>) -> bool {
        self.lost
            .as_ref()
            .is_some_and(|lost| lost.start < range.end && range.start < lost.end)
    }

    /// The newest bytes of this stream at positions `from..`, at most `max` of them,
    /// starting on a character boundary (leading continuation bytes are dropped) and
    /// at a line when one begins in their first half.
    fn newest_after(&self, from: u64, max: usize) -> Vec<u8> {
        let mut pieces: Vec<&[u8]> = Vec::new();
        let mut total = 0usize;
        for c in self.chunks().rev() {
            if c.end() <= from || total >= max {
                break;
            }
            let skip = from.saturating_sub(c.start) as usize;
            let piece = &c.data[skip..];
            let piece = &piece[piece.len().saturating_sub(max - total)..];
            total += piece.len();
            pieces.push(piece);
        }
        let mut bytes = Vec::with_capacity(total);
        for piece in pieces.iter().rev() {
            bytes.extend_from_slice(piece);
        }
        let skip = if total == self.bytes_after(from) {
            0
        } else {
            match bytes[..bytes.len() / 2].iter().position(|b| *b == b'\n') {
                Some(newline) => newline + 1,
                None => continuation_prefix(&bytes),
            }
        };
        bytes.split_off(skip)
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
    /// Retained bytes exist after `next_seq`: reading on from it returns more.
    pub capped: bool,
    /// Part of the range this read covers was evicted before it was read and is gone.
    pub evicted: bool,
}

/// The newest bytes of each stream after a head page, and what lies between.
#[derive(Debug, PartialEq, Eq)]
pub struct TailOut {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes of both streams after the head page and before these tails: retained
    /// ones can be paged from the head's `next_seq`; lost ones are flagged there.
    pub omitted_bytes: u64,
}

/// A read from the start that fits a budget: everything, or the head and each
/// stream's tail with the count of bytes left out between them.
#[derive(Debug, PartialEq, Eq)]
pub struct Window {
    pub head: ReadOut,
    pub tail: Option<TailOut>,
}

impl Default for OutputLog {
    fn default() -> Self {
        Self::with_limit(RETAINED_PER_STREAM)
    }
}

fn is_continuation(byte: u8) -> bool {
    byte & 0xC0 == 0x80
}

/// How many of the first bytes (at most 3) continue a character begun before them.
fn continuation_prefix(bytes: &[u8]) -> usize {
    bytes
        .iter()
        .take(3)
        .take_while(|b| is_continuation(**b))
        .count()
}

/// A UTF-8 character begun at the end of `bytes` but not complete: how many of its
/// bytes are there and how many are missing. `(0, 0)` when the end is a character
/// boundary or the bytes are not UTF-8 there.
fn incomplete_char_suffix(bytes: &[u8]) -> (usize, usize) {
    let window = &bytes[bytes.len().saturating_sub(3)..];
    let Some(lead_at) = window.iter().rposition(|b| !is_continuation(*b)) else {
        return (0, 0);
    };
    let lead = window[lead_at];
    let width = match lead {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return (0, 0),
    };
    let have = window.len() - lead_at;
    if have < width {
        (have, width - have)
    } else {
        (0, 0)
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

    pub fn append(&mut self, stream: Stream, mut data: &[u8]) {
        let log = &mut self.streams[stream.index()];
        while !data.is_empty() {
            let head_room = (HEAD_PINNED as u64).saturating_sub(log.written) as usize;
            let (chunks, bound) = if head_room > 0 {
                (&mut log.head, head_room)
            } else {
                (&mut log.rest, usize::MAX)
            };
            let at = self.next_seq;
            let take = match chunks.back_mut() {
                Some(last) if last.end() == at && last.data.len() < MAX_CHUNK => {
                    let take = data.len().min(MAX_CHUNK - last.data.len()).min(bound);
                    last.data.extend_from_slice(&data[..take]);
                    take
                }
                _ => {
                    let take = data.len().min(MAX_CHUNK).min(bound);
                    chunks.push_back(Chunk {
                        start: at,
                        data: data[..take].to_vec(),
                    });
                    take
                }
            };
            data = &data[take..];
            self.next_seq += take as u64;
            log.retained += take;
            log.written += take as u64;
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
        let s = &self.streams[stream.index()];
        s.written - s.retained as u64
    }

    /// Drops everything retained (global retention pressure); reads then report
    /// `evicted` for the dropped range.
    pub fn discard_all(&mut self) {
        for s in &mut self.streams {
            s.evict_to(0);
        }
    }

    fn lost_within(&self, range: &Range<u64>) -> bool {
        self.streams.iter().any(|s| s.lost_within(range))
    }

    /// Reads forward from `since` in position order across both streams, returning at
    /// most `max_bytes` bytes (see the module doc for where a page ends).
    pub fn read_since(&self, since: u64, max_bytes: usize) -> ReadOut {
        self.read_page(since, max_bytes).0
    }

    /// [`Self::read_since`], and the stream and length of the newest piece it took.
    fn read_page(&self, since: u64, max_bytes: usize) -> (ReadOut, Option<(usize, usize)>) {
        // A page stops where a lost range ahead of it begins.
        let stop_at = self
            .streams
            .iter()
            .filter_map(|s| s.lost.as_ref().map(|l| l.start))
            .filter(|&start| start > since)
            .min()
            .unwrap_or(self.next_seq);
        let mut cursors = [
            self.streams[0].first_after(since),
            self.streams[1].first_after(since),
        ];
        let mut out = [Vec::new(), Vec::new()];
        let mut pos = since;
        let mut start_seq = None;
        let mut budget = max_bytes;
        // The stream, length and end position of the newest piece taken.
        let mut last: Option<(usize, usize, u64)> = None;
        loop {
            // The next piece is whichever stream's current chunk starts (or resumes) first.
            let next = (0..2)
                .filter_map(|i| {
                    self.streams[i]
                        .get(cursors[i])
                        .map(|c| (i, c.start.max(pos)))
                })
                .min_by_key(|(_, at)| *at);
            let Some((i, at)) = next.filter(|(_, at)| *at < stop_at) else {
                pos = pos.max(stop_at.min(self.next_seq));
                break;
            };
            if budget == 0 {
                pos = at;
                break;
            }
            let Some(chunk) = self.streams[i].get(cursors[i]) else {
                break;
            };
            let offset = (at - chunk.start) as usize;
            let take = (chunk.data.len() - offset).min(budget);
            start_seq.get_or_insert(at);
            out[i].extend_from_slice(&chunk.data[offset..offset + take]);
            budget -= take;
            pos = at + take as u64;
            last = Some((i, take, pos));
            if offset + take == chunk.data.len() {
                cursors[i] += 1;
            }
        }
        if let Some((i, take, end)) = last
            && let Some(moved) = self.keep_last_char_whole(&mut out, i, take, end)
        {
            pos = moved;
        }
        let [stdout, stderr] = out;
        let start_seq = start_seq.unwrap_or(pos.min(since.max(self.first_retained())));
        let read = ReadOut {
            stdout,
            stderr,
            start_seq,
            next_seq: pos,
            latest_seq: self.next_seq,
            capped: pos < self.next_seq,
            evicted: self.lost_within(&(since..pos.max(since.saturating_add(1)))),
        };
        (read, last.map(|(i, take, _)| (i, take)))
    }

    /// Ends the page in `out` (whose newest piece, `take` bytes of stream `i`, ends at
    /// position `end`) on a character boundary: drops a trailing incomplete character
    /// when the page keeps other bytes, else completes it from the bytes that follow it
    /// in the same chunk. Returns where the page now ends, if that moved. Only a
    /// character whose next bytes are retained is kept whole: bytes that end the stream
    /// (an incomplete sequence in binary output, a character still being written) or
    /// that an evicted range follows are returned as they are.
    fn keep_last_char_whole(
        &self,
        out: &mut [Vec<u8>; 2],
        i: usize,
        take: usize,
        end: u64,
    ) -> Option<u64> {
        let (cut, missing) = incomplete_char_suffix(&out[i]);
        let stream = &self.streams[i];
        let continues = stream
            .next_retained_from(end)
            .is_some_and(|next| next == end || !stream.lost_within(&(end..next)));
        if cut == 0 || cut > take || !continues {
            return None;
        }
        if cut < out[0].len() + out[1].len() {
            let bytes = &mut out[i];
            bytes.truncate(bytes.len() - cut);
            return Some(end - cut as u64);
        }
        // The budget is smaller than one character: complete it rather than return
        // half of it.
        let chunk = stream
            .get(stream.first_after(end))
            .filter(|c| c.start <= end)?;
        let rest = &chunk.data[(end - chunk.start) as usize..];
        let want = continuation_prefix(rest).min(missing);
        out[i].extend_from_slice(&rest[..want]);
        Some(end + want as u64)
    }

    fn first_retained(&self) -> u64 {
        self.streams
            .iter()
            .filter_map(|s| s.chunks().next().map(|c| c.start))
            .min()
            .unwrap_or(self.next_seq)
    }

    /// Everything from the start when it fits `max_bytes`; otherwise a head page of
    /// about half the budget and, with the rest, the newest bytes of each stream after
    /// it (a stream that needs less leaves its share to the other).
    pub fn window(&self, max_bytes: usize) -> Window {
        let whole = self.read_since(0, max_bytes);
        if !whole.capped {
            return Window {
                head: whole,
                tail: None,
            };
        }
        let head_budget = max_bytes.div_ceil(2);
        let (mut head, last) = self.read_page(0, head_budget);
        // End the head after a line when its last line starts in the second half of it:
        // the same read with that many bytes less.
        if let Some((i, take)) = last {
            let bytes = if i == 0 { &head.stdout } else { &head.stderr };
            let after_newline = bytes.iter().rev().take(take).position(|b| *b == b'\n');
            if let Some(cut) = after_newline.filter(|&cut| cut > 0 && cut < head_budget / 2) {
                head = self.read_since(0, head.stdout.len() + head.stderr.len() - cut);
            }
        }
        let from = head.next_seq;
        let budget = max_bytes.saturating_sub(head.stdout.len() + head.stderr.len());
        let [out_avail, err_avail] = [
            self.streams[0].bytes_after(from),
            self.streams[1].bytes_after(from),
        ];
        let err_share = err_avail
            .min(budget / 2)
            .max(budget.saturating_sub(out_avail));
        let err_share = err_share.min(err_avail);
        let out_share = budget - err_share.min(budget);
        let stdout = self.streams[0].newest_after(from, out_share);
        let stderr = self.streams[1].newest_after(from, err_share);
        let shown = (stdout.len() + stderr.len()) as u64;
        head.evicted = self.lost_within(&(0..self.next_seq.max(1)));
        Window {
            tail: Some(TailOut {
                stdout,
                stderr,
                omitted_bytes: (self.next_seq - from).saturating_sub(shown),
            }),
            head,
        }
    }

    /// The newest `lines` lines of each stream, at most `max_bytes` in all (newest
    /// bytes kept, starting on a character boundary), independent of any cursor.
    pub fn tail(&self, lines: usize, max_bytes: usize) -> ReadOut {
        let per_stream = max_bytes / 2;
        let mut out = [Vec::new(), Vec::new()];
        let mut start = self.next_seq;
        let mut evicted = false;
        for (i, s) in self.streams.iter().enumerate() {
            // Walk chunks newest first, collecting until enough newlines or bytes.
            let mut newlines = 0usize;
            let mut collected: Vec<&Chunk> = Vec::new();
            let mut total = 0usize;
            for c in s.chunks().rev() {
                collected.push(c);
                total += c.data.len();
                newlines += c.data.iter().filter(|b| **b == b'\n').count();
                if newlines > lines || total >= per_stream {
                    break;
                }
            }
            let mut bytes: Vec<u8> = Vec::with_capacity(total);
            for c in collected.iter().rev() {
                bytes.extend_from_slice(&c.data);
            }
            let first_seq = collected.last().map_or(self.next_seq, |c| c.start);
            let mut cut = tail_lines_offset(&bytes, lines);
            if bytes.len() - cut > per_stream {
                cut = bytes.len() - per_stream;
                cut += continuation_prefix(&bytes[cut..]);
            }
            if cut == 0 && collected.len() == s.len() && s.lost.is_some() {
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
        assert!(r.stdout.is_empty());
        assert_eq!(log.evicted_bytes(Stream::Stdout), 8);
    }

    /// The pinned head survives the rolling window: a page from 0 is the head and stops
    /// where the lost range begins; the next page starts inside it and says so.
    #[test]
    fn the_head_is_pinned_and_a_page_stops_at_the_lost_range() {
        let mut log = OutputLog::default();
        let line = |n: usize| format!("line {n:07}\n").into_bytes();
        let mut n = 0;
        while log.latest_seq() < 3 * RETAINED_PER_STREAM as u64 {
            log.append(Stream::Stdout, &line(n));
            n += 1;
        }
        log.append(Stream::Stderr, b"final error\n");
        let head = log.read_since(0, usize::MAX);
        assert!(!head.evicted, "the head itself is intact");
        assert!(head.capped);
        assert_eq!(head.next_seq, HEAD_PINNED as u64);
        assert!(head.stdout.starts_with(&line(0)));
        let after = log.read_since(head.next_seq, 100);
        assert!(after.evicted);
        assert!(after.start_seq > head.next_seq);
        let window = log.window(65_536);
        assert!(window.head.stdout.starts_with(&line(0)));
        let tail = window.tail.unwrap();
        assert!(tail.stdout.ends_with(&line(n - 1)));
        assert_eq!(tail.stderr, b"final error\n");
        assert!(window.head.evicted);
        let shown = window.head.stdout.len() + tail.stdout.len() + tail.stderr.len();
        assert!(shown <= 65_536);
        assert_eq!(tail.omitted_bytes + shown as u64, log.latest_seq());
    }

    /// A character split across two writes, with the other stream's evicted bytes
    /// between them: paging at any budget returns every retained byte exactly once.
    #[test]
    fn a_split_character_beside_an_evicted_range_keeps_every_retained_byte() {
        let mut log = OutputLog::default();
        log.append(Stream::Stderr, &vec![b'e'; HEAD_PINNED]);
        log.append(Stream::Stderr, b"z");
        log.append(Stream::Stdout, b"x\xC3");
        log.append(Stream::Stderr, &vec![b'f'; 2 * RETAINED_PER_STREAM]);
        log.append(Stream::Stdout, b"\xA9y");
        for page in 1..5 {
            let (mut stdout, mut since) = (Vec::new(), 0);
            loop {
                let r = log.read_since(since, page);
                stdout.extend_from_slice(&r.stdout);
                if !r.capped {
                    break;
                }
                assert!(r.next_seq > since);
                since = r.next_seq;
            }
            assert_eq!(stdout, "xéy".as_bytes(), "page {page}");
        }
        // A cursor at the end of the position space is not an overflow.
        assert!(!log.read_since(u64::MAX, 10).capped);
    }

    #[test]
    fn a_window_that_fits_is_the_whole_output() {
        let mut log = OutputLog::default();
        log.append(Stream::Stdout, b"out\n");
        log.append(Stream::Stderr, b"err\n");
        let window = log.window(100);
        assert_eq!(window.tail, None);
        assert_eq!(window.head.stdout, b"out\n");
        assert_eq!(window.head.stderr, b"err\n");
    }

    #[test]
    fn incomplete_suffixes() {
        assert_eq!(incomplete_char_suffix(b"abc"), (0, 0));
        assert_eq!(incomplete_char_suffix("aé".as_bytes()), (0, 0));
        assert_eq!(incomplete_char_suffix(&"aé".as_bytes()[..2]), (1, 1));
        assert_eq!(incomplete_char_suffix(&"a€".as_bytes()[..3]), (2, 1));
        assert_eq!(incomplete_char_suffix(&"😀".as_bytes()[..3]), (3, 1));
        assert_eq!(incomplete_char_suffix(b"\xff\xfe"), (0, 0));
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
                // Late by at most one character, only when the budget is smaller than one.
                prop_assert!(r.stdout.len() + r.stderr.len() <= page.max(4));
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

        /// Text paged at any budget, in writes of any size, decodes page by page.
        #[test]
        fn pages_never_split_a_character(
            text in "[aé€😀\n]{0,200}",
            split in 1usize..7,
            page in 1usize..9,
        ) {
            let mut log = OutputLog::default();
            for piece in text.as_bytes().chunks(split) {
                log.append(Stream::Stdout, piece);
            }
            let mut got = String::new();
            let mut since = 0;
            loop {
                let r = log.read_since(since, page);
                let decoded = std::str::from_utf8(&r.stdout);
                prop_assert!(decoded.is_ok(), "page {:?} at {}", r.stdout, since);
                got.push_str(decoded.unwrap_or_default());
                if !r.capped { break; }
                prop_assert!(r.next_seq > since);
                since = r.next_seq;
            }
            prop_assert_eq!(got, text);
        }
    }
}
