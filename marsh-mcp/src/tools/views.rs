//! Byte-faithful views of captured output, fitted to one reply frame.
//!
//! Each stream is reported as its size in the view, a text view with its state, and
//! base64 whenever the bytes are not valid UTF-8 (or the caller asks). Nothing is
//! dropped silently: every cut or omission is flagged.
//!
//! A reply carries the output up to twice (the structured text views and the readable
//! copy in `content[0].text`) plus any base64. When that would not fit
//! [`OUTPUT_BUDGET`], parts are dropped in this order, each step only while still too
//! large, and `shrunk_to_fit` is set:
//! 1. the readable copy of the output in the text content (the text says where it is);
//! 2. per stream, larger first, a text view that costs more than its base64 becomes
//!    base64 (state `omitted`): JSON escapes a control byte to six bytes;
//! 3. base64 asked for with `include_base64` next to a text view that is exact;
//! 4. the page (and a window's tail) shrinks by half, again and again; the rest stays
//!    readable with `operation_output`.
//!
//! The operation's id, state and cursor fields are never dropped. Text views are
//! costed after host-path rewriting, as they are sent. The budget leaves room for the
//! rest of the result and the JSON-RPC envelope; a reply that still exceeds the frame
//! (only with an enormous request id) is answered by the transport with a JSON-RPC
//! error naming the operation.

use base64::Engine;

use super::result_data::{OutputTail, OutputView, StreamViews, TextState};
use crate::output::{ReadOut, TailOut, Window};
use crate::redact::HostPaths;

/// Serialized bytes the output may take in one reply, counting all of its copies.
pub(crate) const OUTPUT_BUDGET: usize = marsh_framing::MAX_FRAME_BYTES - 48 * 1024;
/// A page is not shrunk below this; what does not fit then is the transport's to refuse.
const MIN_PAGE: usize = 1024;

#[derive(Debug, Clone, Copy)]
pub struct ViewOptions {
    pub include_base64: bool,
    pub max_bytes: usize,
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn base64_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

/// Bytes `text` takes as a JSON string, quotes included (serde_json's escaping).
pub(crate) fn json_len(text: &str) -> usize {
    2 + text
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

/// One stream's part of a view, with what it costs in the reply.
struct StreamView {
    bytes: Vec<u8>,
    text: String,
    state: TextState,
    base64: Option<String>,
}

impl StreamView {
    /// The text is rewritten here, as the reply's final gate would (rewriting is
    /// idempotent), so its cost is measured as sent: a role name can be longer than
    /// the host path it replaces.
    fn of(bytes: Vec<u8>, include_base64: bool, host_paths: &HostPaths) -> Self {
        let (text, state) = match std::str::from_utf8(&bytes) {
            Ok(text) => (host_paths.redact_str(text), TextState::Utf8),
            Err(_) => (
                host_paths.redact_str(&String::from_utf8_lossy(&bytes)),
                TextState::Lossy,
            ),
        };
        let base64 = (state == TextState::Lossy || include_base64).then(|| base64(&bytes));
        Self {
            bytes,
            text,
            state,
            base64,
        }
    }

    /// Bytes in the reply: the structured views, and the readable copy of an exact
    /// text when `copied`.
    fn cost(&self, copied: bool) -> usize {
        let text = json_len(&self.text);
        let copy = if copied && self.state == TextState::Utf8 {
            text
        } else {
            0
        };
        text + copy + self.base64.as_ref().map_or(0, String::len)
    }

    /// Step 2: the text becomes base64 when that is smaller.
    fn omit_costly_text(&mut self) -> bool {
        if self.state == TextState::Omitted || json_len(&self.text) <= base64_len(self.bytes.len())
        {
            return false;
        }
        self.text = String::new();
        self.state = TextState::Omitted;
        self.base64 = Some(base64(&self.bytes));
        true
    }

    /// Step 3: base64 is dropped when the text is exact.
    fn drop_redundant_base64(&mut self) -> bool {
        self.state == TextState::Utf8 && self.base64.take().is_some()
    }
}

/// One part of the reply: both streams.
struct Part([StreamView; 2]);

impl Part {
    fn of(stdout: Vec<u8>, stderr: Vec<u8>, include_base64: bool, host_paths: &HostPaths) -> Self {
        Self([
            StreamView::of(stdout, include_base64, host_paths),
            StreamView::of(stderr, include_base64, host_paths),
        ])
    }

    fn cost(&self, copied: bool) -> usize {
        self.0.iter().map(|s| s.cost(copied)).sum()
    }

    fn into_views(self) -> StreamViews {
        let [out, err] = self.0;
        StreamViews {
            stdout_page_bytes: out.bytes.len(),
            stdout_text: out.text,
            stdout_text_state: out.state,
            stdout_base64: out.base64,
            stderr_page_bytes: err.bytes.len(),
            stderr_text: err.text,
            stderr_text_state: err.state,
            stderr_base64: err.base64,
        }
    }
}

/// A window's parts and whether the readable copy is kept, fitted by steps 1–3.
struct Fitted {
    parts: Vec<Part>,
    text_copy: bool,
    shrunk: bool,
}

impl Fitted {
    fn cost(&self) -> usize {
        self.parts.iter().map(|p| p.cost(self.text_copy)).sum()
    }

    fn fit(parts: Vec<Part>) -> Self {
        let mut fitted = Self {
            parts,
            text_copy: true,
            shrunk: false,
        };
        if fitted.cost() <= OUTPUT_BUDGET {
            return fitted;
        }
        fitted.text_copy = false;
        fitted.shrunk = true;
        // The larger stream views first, across head and tail.
        let mut order: Vec<(usize, usize)> = (0..fitted.parts.len())
            .flat_map(|p| [(p, 0), (p, 1)])
            .collect();
        order.sort_by_key(|&(p, s)| std::cmp::Reverse(fitted.parts[p].0[s].cost(false)));
        for step in [
            StreamView::omit_costly_text,
            StreamView::drop_redundant_base64,
        ] {
            for &(p, s) in &order {
                if fitted.cost() <= OUTPUT_BUDGET {
                    return fitted;
                }
                step(&mut fitted.parts[p].0[s]);
            }
        }
        fitted
    }
}

/// The output view of the reads `read` makes: at `opts.max_bytes` first, then (step 4)
/// at half the budget each time until the view fits [`OUTPUT_BUDGET`].
pub fn output_view(
    opts: ViewOptions,
    host_paths: &HostPaths,
    read: impl Fn(usize) -> Window,
) -> OutputView {
    let mut budget = opts.max_bytes;
    let mut halved = false;
    loop {
        let Window { head, tail } = read(budget);
        let ReadOut {
            stdout,
            stderr,
            start_seq,
            next_seq,
            latest_seq,
            capped,
            evicted,
        } = head;
        let mut parts = vec![Part::of(stdout, stderr, opts.include_base64, host_paths)];
        let omitted = tail.map(|t: TailOut| {
            parts.push(Part::of(
                t.stdout,
                t.stderr,
                opts.include_base64,
                host_paths,
            ));
            t.omitted_bytes
        });
        let fitted = Fitted::fit(parts);
        if fitted.cost() <= OUTPUT_BUDGET || budget <= MIN_PAGE {
            let mut parts = fitted.parts.into_iter().map(Part::into_views);
            let page = parts.next().unwrap_or_else(|| {
                Part::of(Vec::new(), Vec::new(), false, host_paths).into_views()
            });
            let tail = parts
                .next()
                .zip(omitted)
                .map(|(streams, omitted_bytes)| OutputTail {
                    streams,
                    omitted_bytes,
                });
            return OutputView {
                page,
                start_seq,
                next_seq,
                latest_seq,
                more_to_page: capped,
                output_truncated: evicted,
                tail,
                shrunk_to_fit: fitted.shrunk || halved,
                text_copy: fitted.text_copy,
            };
        }
        budget /= 2;
        halved = true;
    }
}

/// A forward or tail read as a window without a tail.
pub fn page(read: ReadOut) -> Window {
    Window {
        head: read,
        tail: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(stdout: &[u8]) -> ReadOut {
        ReadOut {
            stdout: stdout.to_vec(),
            stderr: Vec::new(),
            start_seq: 0,
            next_seq: stdout.len() as u64,
            latest_seq: stdout.len() as u64,
            capped: false,
            evicted: false,
        }
    }

    fn view(bytes: &[u8], include_base64: bool) -> OutputView {
        let opts = ViewOptions {
            include_base64,
            max_bytes: 262_144,
        };
        let paths = HostPaths::new(std::path::Path::new("/ws"), Vec::new());
        output_view(opts, &paths, |max| {
            page(read(&bytes[..bytes.len().min(max)]))
        })
    }

    #[test]
    fn invalid_utf8_comes_back_exactly_in_base64() {
        let bytes = b"ok\xff\xfe\x00end";
        let view = view(bytes, false);
        assert_eq!(view.page.stdout_text_state, TextState::Lossy);
        let b64 = view.page.stdout_base64.unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
            bytes
        );
        assert!(view.page.stderr_base64.is_none());
        assert!(!view.shrunk_to_fit);
    }

    #[test]
    fn json_len_is_serde_jsons() {
        for text in [
            "",
            "plain",
            "a\"b\\c\n\r\t\u{8}\u{c}",
            "\u{1}\u{1f}\u{7f}é€",
        ] {
            assert_eq!(json_len(text), serde_json::to_string(text).unwrap().len());
        }
    }

    /// Control bytes escape to six bytes each: the text becomes base64 and the
    /// readable copy goes first.
    #[test]
    fn escape_heavy_text_is_omitted_not_dropped() {
        let bytes = vec![1u8; 262_144];
        let view = view(&bytes, false);
        assert_eq!(view.page.stdout_text_state, TextState::Omitted);
        assert!(view.shrunk_to_fit && !view.text_copy);
        assert_eq!(view.page.stdout_page_bytes, bytes.len());
        let size = serde_json::to_vec(&view).unwrap().len();
        assert!(size < OUTPUT_BUDGET, "{size}");
    }

    /// 230 000 bytes with include_base64: the text, its copy and base64 fit together.
    #[test]
    fn a_large_page_with_base64_keeps_all_three_when_they_fit() {
        let bytes = vec![b'a'; 230_000];
        let view = view(&bytes, true);
        assert!(!view.shrunk_to_fit && view.text_copy);
        assert_eq!(view.page.stdout_text_state, TextState::Utf8);
        assert!(view.page.stdout_base64.is_some());
    }

    /// Escape-heavy text with base64 asked for: the text goes, base64 stays exact.
    #[test]
    fn base64_asked_for_outlives_a_costly_text() {
        let mut bytes = vec![1u8; 200_000];
        bytes.extend(vec![b'a'; 62_144]);
        let view = view(&bytes, true);
        assert_eq!(view.page.stdout_text_state, TextState::Omitted);
        assert!(view.page.stdout_base64.is_some());
        assert!(view.shrunk_to_fit);
    }
}
