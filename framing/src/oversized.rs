//! The JSON-RPC error that answers a frame over the cap, on either side of the relay
//! and in the server's own transport, carrying the request's id when the kept prefix
//! of the frame shows one.

use crate::reader::MAX_FRAME_BYTES;

/// The JSON-RPC error object that answers an oversized frame, on either side of the
/// relay (the broker's session transport sends the same one).
pub fn oversized_error(len: usize) -> serde_json::Value {
    serde_json::json!({
        "code": -32600,
        "message": format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit and was discarded")
    })
}

/// The top-level `"id"` of a JSON object from the start of its text, if the id appears
/// complete before the text is cut off. Only the members before it are parsed (each
/// bounded by the prefix), and only a string, number or null counts as an id.
pub fn request_id_in_prefix(prefix: &[u8]) -> Option<serde_json::Value> {
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
        let mut values = Deserializer::from_slice(prefix.get(i..)?).into_iter::<Value>();
        let value = values.next()?.ok()?;
        i = skip_ws(i + values.byte_offset());
        // Only a value the prefix shows to be complete counts: `"id":12` cut there
        // could be 123.
        let next = *prefix.get(i)?;
        if key == "id" && (next == b',' || next == b'}') {
            return matches!(value, Value::String(_) | Value::Number(_) | Value::Null)
                .then_some(value);
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
    let reply = serde_json::json!({
        "jsonrpc": "2.0",
        "id": request_id_in_prefix(prefix).unwrap_or(serde_json::Value::Null),
        "error": oversized_error(len),
    });
    let mut line = reply.to_string().into_bytes();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_of_an_oversized_frame_is_found_in_its_prefix() {
        let id = |text: &str| request_id_in_prefix(text.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"x","params":{"a":"#),
            Some(7.into())
        );
        assert_eq!(id(r#" { "id" : "a-b" , "#), Some("a-b".into()));
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"x","id":null,"params":"#),
            Some(serde_json::Value::Null)
        );
        // A member before the id is parsed whole, nested ids do not count, and an id
        // cut off by the prefix, an object id or a non-object frame give none.
        assert_eq!(id(r#"{"params":{"id":3},"id":4,"x":"#), Some(4.into()));
        assert_eq!(id(r#"{"params":{"id":3},"more":"#), None);
        assert_eq!(id(r#"{"id":12"#), None);
        assert_eq!(id(r#"{"id":{"x":1}}"#), None);
        assert_eq!(id(r#"[{"id":1}]"#), None);
        assert_eq!(id("not json"), None);
    }
}
