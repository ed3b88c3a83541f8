//! Byte-faithful views of captured output. Each stream is reported as a byte count,
//! a text view with its state, and base64 whenever the bytes are not valid UTF-8 (or
//! the caller asks). Nothing is dropped silently: every cut or omission is flagged.

use base64::Engine;

use super::result_data::{OutputView, TextState};
use crate::output::ReadOut;

/// Text views are dropped (state `omitted`, base64 kept) past this serialized size so
/// a response always fits in one frame.
const TEXT_BUDGET: usize = 600 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct ViewOptions {
    pub include_base64: bool,
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// One stream's view: its byte count, its text with the text's state, and base64 when
/// the text is not the exact bytes (or the caller asked).
struct StreamView {
    bytes: usize,
    text: String,
    state: TextState,
    base64: Option<String>,
}

fn stream_view(bytes: &[u8], truncated: bool, opts: ViewOptions) -> StreamView {
    let (text, state) = match std::str::from_utf8(bytes) {
        Ok(text) if truncated => (text.to_owned(), TextState::Truncated),
        Ok(text) => (text.to_owned(), TextState::Utf8),
        Err(_) => (
            String::from_utf8_lossy(bytes).into_owned(),
            TextState::Lossy,
        ),
    };
    let base64 = (state == TextState::Lossy || opts.include_base64).then(|| base64(bytes));
    StreamView {
        bytes: bytes.len(),
        text,
        state,
        base64,
    }
}

/// The output fields of a read: both stream views plus the cursor fields. Text views
/// are omitted (stdout first, base64 kept) until the serialized view fits the budget.
pub fn output_view(read: &ReadOut, opts: ViewOptions) -> OutputView {
    let truncated = read.capped;
    let stdout = stream_view(&read.stdout, truncated, opts);
    let stderr = stream_view(&read.stderr, truncated, opts);
    let mut view = OutputView {
        stdout_bytes: stdout.bytes,
        stdout_truncated: truncated,
        stdout_text: stdout.text,
        stdout_text_state: stdout.state,
        stdout_base64: stdout.base64,
        stderr_bytes: stderr.bytes,
        stderr_truncated: truncated,
        stderr_text: stderr.text,
        stderr_text_state: stderr.state,
        stderr_base64: stderr.base64,
        start_seq: read.start_seq,
        next_seq: read.next_seq,
        latest_seq: read.latest_seq,
        capped: read.capped,
        evicted: read.evicted,
    };
    let size = |view: &OutputView| serde_json::to_vec(view).map_or(usize::MAX, |v| v.len());
    if size(&view) > TEXT_BUDGET {
        view.stdout_text = String::new();
        view.stdout_text_state = TextState::Omitted;
        view.stdout_base64 = Some(base64(&read.stdout));
    }
    if size(&view) > TEXT_BUDGET {
        view.stderr_text = String::new();
        view.stderr_text_state = TextState::Omitted;
        view.stderr_base64 = Some(base64(&read.stderr));
    }
    view
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

    #[test]
    fn invalid_utf8_comes_back_exactly_in_base64() {
        let bytes = b"ok\xff\xfe\x00end";
        let view = output_view(
            &read(bytes),
            ViewOptions {
                include_base64: false,
            },
        );
        assert_eq!(view.stdout_text_state, TextState::Lossy);
        let b64 = view.stdout_base64.unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
            bytes
        );
        assert!(view.stderr_base64.is_none());
    }

    #[test]
    fn oversized_text_is_omitted_not_dropped() {
        let bytes = vec![1u8; 200 * 1024];
        let view = output_view(
            &read(&bytes),
            ViewOptions {
                include_base64: false,
            },
        );
        assert_eq!(view.stdout_text_state, TextState::Omitted);
        assert!(view.stdout_base64.unwrap().len() > 200 * 1024);
    }
}
