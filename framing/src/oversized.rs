//! The JSON-RPC error that answers a frame over the cap, on either side of the relay
//! and in the server's own transport, carrying the request's id when the kept prefix
//! of the frame shows one.

use serde_json::Value;

use crate::reader::MAX_FRAME_BYTES;

/// The JSON-RPC error object that answers an oversized frame, on either side of the
/// relay (the broker's session transport sends the same one).
pub fn oversized_error(len: usize) -> serde_json::Value {
    serde_json::json!({
        "code": -32600,
        "message": format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit and was discarded")
    })
}

/// The top-level `"id"` of a JSON object from the start of its text, as its exact JSON
/// text (a number keeps its spelling and any size), if the id appears complete before
/// the text is cut off. Only the members before it are parsed (each bounded by the
/// prefix), and only a string, number or null counts as an id.
pub fn request_id_in_prefix(prefix: &[u8]) -> Option<String> {
    use serde_json::{Deserializer, Value};
    let skip_ws = |mut i: usize| {
        while prefix.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut i = skip_ws(0);
    if prefix.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_ws(i);
        let mut keys = Deserializer::from_slice(prefix.get(i..)?).into_iter::<String>();
        let key = keys.next()?.ok()?;
        i = skip_ws(i + keys.byte_offset());
        if prefix.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(i + 1);
        let start = i;
        let mut values = Deserializer::from_slice(prefix.get(i..)?).into_iter::<Value>();
        let value = values.next()?.ok()?;
        let end = i + values.byte_offset();
        i = skip_ws(end);
        // Only a value the prefix shows to be complete counts: `"id":12` cut there
        // could be 123.
        let next = *prefix.get(i)?;
        if key == "id" && (next == b',' || next == b'}') {
            let raw = std::str::from_utf8(prefix.get(start..end)?).ok()?;
            return matches!(value, Value::String(_) | Value::Number(_) | Value::Null)
                .then(|| raw.to_string());
        }
        if next != b',' {
            return None;
        }
        i += 1;
    }
}

/// The JSON-RPC error line that answers an oversized frame, carrying the request's id
/// when the frame's kept `prefix` shows one (so a client waiting on that id is not left
/// hanging), else `null`.
pub fn oversized_reply(len: usize, prefix: &[u8]) -> Vec<u8> {
    let reply = serde_json::json!({"jsonrpc": "2.0", "error": oversized_error(len)});
    let id = request_id_in_prefix(prefix);
    let mut line = with_raw_id(id.as_deref().unwrap_or("null"), &reply).into_bytes();
    line.push(b'\n');
    line
}

/// `message` (a JSON object without an `id`) as one line of JSON text whose `id` is
/// exactly `raw`, the id's JSON text as a client sent it. A number keeps its spelling
/// and size (`1e3`, `-0`, `18446744073709551617`), which a parsed value would not.
pub fn with_raw_id(raw: &str, message: &Value) -> String {
    let body = message.to_string();
    match body.strip_prefix('{') {
        Some("}") => format!("{{\"id\":{raw}}}"),
        Some(rest) => format!("{{\"id\":{raw},{rest}"),
        None => body,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_an_oversized_frame_is_found_in_its_prefix() {
        let id = |text: &str| request_id_in_prefix(text.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"x","params":{"a":"#),
            Some("7".into())
        );
        assert_eq!(id(r#" { "id" : "a-b" , "#), Some(r#""a-b""#.into()));
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"x","id":null,"params":"#),
            Some("null".into())
        );
        // A member before the id is parsed whole, nested ids do not count, and an id
        // cut off by the prefix, an object id or a non-object frame give none.
        assert_eq!(id(r#"{"params":{"id":3},"id":4,"x":"#), Some("4".into()));
        // Any size and spelling is kept exactly.
        assert_eq!(
            id(r#"{"id":18446744073709551617,"#),
            Some("18446744073709551617".into())
        );
        assert_eq!(id(r#"{"id":-0,"#), Some("-0".into()));
        assert_eq!(id(r#"{"id":1e3}"#), Some("1e3".into()));
        assert_eq!(id(r#"{"params":{"id":3},"more":"#), None);
        assert_eq!(id(r#"{"id":12"#), None);
        assert_eq!(id(r#"{"id":{"x":1}}"#), None);
        assert_eq!(id(r#"[{"id":1}]"#), None);
        assert_eq!(id("not json"), None);
    }
}
