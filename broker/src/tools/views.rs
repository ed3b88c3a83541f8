//! Byte-faithful views of captured output. Each stream is reported as a byte count,
//! a text view with its state, and base64 whenever the bytes are not valid UTF-8 (or
//! the caller asks). Nothing is dropped silently: every cut or omission is flagged.

use base64::Engine;
use serde_json::{Map, Value};

use crate::output::ReadOut;

/// Text views are dropped (state `omitted`, base64 kept) past this serialized size so
/// a response always fits in one frame.
const TEXT_BUDGET: usize = 600 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct ViewOptions {
    pub include_base64: bool,
}

fn stream_view(
    map: &mut Map<String, Value>,
    prefix: &str,
    bytes: &[u8],
    truncated: bool,
    opts: ViewOptions,
) {
    map.insert(format!("{prefix}_bytes"), Value::from(bytes.len()));
    map.insert(format!("{prefix}_truncated"), Value::from(truncated));
    let (text, state, needs_b64) = match std::str::from_utf8(bytes) {
        Ok(text) => (
            text.to_owned(),
            if truncated { "truncated" } else { "utf8" },
            false,
        ),
        Err(_) => (String::from_utf8_lossy(bytes).into_owned(), "lossy", true),
    };
    map.insert(format!("{prefix}_text"), Value::from(text));
    map.insert(format!("{prefix}_text_state"), Value::from(state));
    if needs_b64 || opts.include_base64 {
        map.insert(
            format!("{prefix}_base64"),
            Value::from(base64::engine::general_purpose::STANDARD.encode(bytes)),
        );
    }
}

/// Omits text views (keeping base64) until the serialized views fit the budget.
fn fit(map: &mut Map<String, Value>, streams: [(&str, &[u8]); 2]) {
    let size = |map: &Map<String, Value>| serde_json::to_vec(map).map_or(usize::MAX, |v| v.len());
    for (prefix, bytes) in streams {
        if size(map) <= TEXT_BUDGET {
            return;
        }
        map.insert(format!("{prefix}_text"), Value::from(""));
        map.insert(format!("{prefix}_text_state"), Value::from("omitted"));
        map.insert(
            format!("{prefix}_base64"),
            Value::from(base64::engine::general_purpose::STANDARD.encode(bytes)),
        );
    }
}

/// The output fields of a read: both stream views plus the cursor fields.
pub fn read_fields(read: &ReadOut, opts: ViewOptions) -> Map<String, Value> {
    let mut map = Map::new();
    let truncated = read.capped;
    stream_view(&mut map, "stdout", &read.stdout, truncated, opts);
    stream_view(&mut map, "stderr", &read.stderr, truncated, opts);
    fit(
        &mut map,
        [("stdout", &read.stdout), ("stderr", &read.stderr)],
    );
    map.insert("start_seq".into(), Value::from(read.start_seq));
    map.insert("next_seq".into(), Value::from(read.next_seq));
    map.insert("latest_seq".into(), Value::from(read.latest_seq));
    map.insert("capped".into(), Value::from(read.capped));
    map.insert("evicted".into(), Value::from(read.evicted));
    map
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
        let map = read_fields(
            &read(bytes),
            ViewOptions {
                include_base64: false,
            },
        );
        assert_eq!(map["stdout_text_state"], "lossy");
        let b64 = map["stdout_base64"].as_str().unwrap();
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap(),
            bytes
        );
        assert!(map.get("stderr_base64").is_none());
    }

    #[test]
    fn oversized_text_is_omitted_not_dropped() {
        let bytes = vec![1u8; 200 * 1024];
        let map = read_fields(
            &read(&bytes),
            ViewOptions {
                include_base64: false,
            },
        );
        assert_eq!(map["stdout_text_state"], "omitted");
        assert!(map["stdout_base64"].as_str().unwrap().len() > 200 * 1024);
    }
}
