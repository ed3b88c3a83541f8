//! Finds a JSON object key that appears twice in one object, anywhere in a frame.
//!
//! serde_json keeps the last of duplicate keys, so `{"name":"doctor","name":"shell_run"}`
//! would run `shell_run` while a policy layer in front that keeps the first would see
//! `doctor`: a parsing differential. Frames with a duplicate are refused instead. The
//! check is a second pass over the frame that builds nothing but each object's key set
//! (bounded by the frame cap).

use std::collections::HashSet;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};

/// The dotted path of the first duplicate key in `line` (e.g. `params.arguments.x`),
/// or `None` when every object's keys are distinct (or `line` is not JSON: its parse
/// error is reported elsewhere).
pub(super) fn first_duplicate(line: &[u8]) -> Option<String> {
    let mut deserializer = serde_json::Deserializer::from_slice(line);
    match (Walk {
        path: String::new(),
    })
    .deserialize(&mut deserializer)
    {
        Ok(()) => None,
        Err(e) => {
            let message = e.to_string();
            message
                .strip_prefix(DUPLICATE)
                .and_then(|rest| rest.split(" at line ").next())
                .map(str::to_owned)
        }
    }
}

const DUPLICATE: &str = "duplicate key: ";

/// Visits one value whose dotted path is `path`.
struct Walk {
    path: String,
}

impl Walk {
    fn child(&self, key: &str) -> Self {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        Self { path }
    }
}

impl<'de> DeserializeSeed<'de> for Walk {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        while seq
            .next_element_seed(self.child(&index.to_string()))?
            .is_some()
        {
            index += 1;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let child = self.child(&key);
            if !seen.insert(key) {
                return Err(A::Error::custom(format!("{DUPLICATE}{}", child.path)));
            }
            map.next_value_seed(child)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_duplicate_at_any_depth() {
        assert_eq!(first_duplicate(br#"{"a":1,"b":[{"c":1}]}"#), None);
        assert_eq!(
            first_duplicate(br#"{"params":{"name":"doctor","name":"shell_run"}}"#).as_deref(),
            Some("params.name")
        );
        assert_eq!(
            first_duplicate(br#"{"params":{"arguments":{"x":1,"y":{"z":1,"z":2}}}}"#).as_deref(),
            Some("params.arguments.y.z")
        );
        assert_eq!(
            first_duplicate(br#"[{"k":1},{"k":2,"k":3}]"#).as_deref(),
            Some("1.k")
        );
        // Keys equal after unescaping are the same key.
        assert_eq!(
            first_duplicate(br#"{"id":1,"\u0069d":2}"#).as_deref(),
            Some("id")
        );
        assert_eq!(first_duplicate(b"not json"), None);
    }
}
