//! Public tool names and the stock SBX server name derived from one.

use sha2::{Digest, Sha256};

/// Longest public tool name.
pub const MAX_TOOL_NAME: usize = 64;
/// Prefix of every stock SBX server a publication registers.
pub const SERVER_PREFIX: &str = "marsh-pub-";
/// Longest stock SBX server name.
const MAX_SERVER_NAME: usize = 64;
/// Hex digits of the name's digest kept when a long name is shortened.
const DIGEST_HEX: usize = 12;

/// 1–64 of `[A-Za-z0-9_.-]`, no leading `-`, not dots only.
pub fn valid_tool_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_TOOL_NAME
        && bytes[0] != b'-'
        && !bytes.iter().all(|b| *b == b'.')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Whether `name` has the shape of a shortened long name (`<41 characters>-<12 hex>`):
/// such a name is shortened too, so no plain name can take a long name's server.
fn looks_shortened(name: &str) -> bool {
    let stem = MAX_SERVER_NAME - SERVER_PREFIX.len() - 1 - DIGEST_HEX;
    let bytes = name.as_bytes();
    bytes.len() == stem + 1 + DIGEST_HEX
        && bytes[stem] == b'-'
        && bytes[stem + 1..]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// The stock SBX server registered for tool `name` (one per user: republishing a name
/// from anywhere replaces it). `marsh-pub-NAME` when that fits in 64 characters, else
/// the prefix, the first 41 characters of the name, `-` and 12 hex digits of the
/// name's SHA-256, so two long names sharing a 41-character stem stay distinct. A
/// name shaped like a shortened one is shortened as well (never served plain).
/// Only meaningful for a [`valid_tool_name`].
pub fn server_for_tool(name: &str) -> String {
    let plain = format!("{SERVER_PREFIX}{name}");
    if plain.len() <= MAX_SERVER_NAME && !looks_shortened(name) {
        return plain;
    }
    let digest = hex::encode(Sha256::digest(name.as_bytes()));
    let hex = &digest[..DIGEST_HEX];
    let stem_len = MAX_SERVER_NAME - SERVER_PREFIX.len() - 1 - DIGEST_HEX;
    // Valid names are ASCII, so any byte index is a character boundary.
    format!("{SERVER_PREFIX}{}-{hex}", &name[..stem_len])
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_published_rules() {
        for good in [
            "hello",
            "team.review",
            "a",
            "x_y-z.1",
            ".hidden",
            &"a".repeat(64),
        ] {
            assert!(valid_tool_name(good), "{good}");
        }
        for bad in [
            "",
            "-x",
            ".",
            "..",
            "...",
            "a b",
            "a/b",
            "é",
            "a,b",
            &"a".repeat(65),
        ] {
            assert!(!valid_tool_name(bad), "{bad}");
        }
    }

    #[test]
    fn server_names_fit_and_stay_distinct() {
        assert_eq!(server_for_tool("hello"), "marsh-pub-hello");
        let fits = "a".repeat(54);
        assert_eq!(server_for_tool(&fits), format!("marsh-pub-{fits}"));
        let long_a = format!("{}a", "s".repeat(60));
        let long_b = format!("{}b", "s".repeat(60));
        let (a, b) = (server_for_tool(&long_a), server_for_tool(&long_b));
        assert_eq!(a.len(), 64);
        assert_eq!(b.len(), 64);
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("marsh-pub-{}-", "s".repeat(41))));
        // A plain name shaped like `a`'s shortened form does not get `a`'s server.
        let crafted = a.trim_start_matches("marsh-pub-").to_string();
        assert_eq!(crafted.len(), 54);
        assert!(valid_tool_name(&crafted));
        assert_ne!(server_for_tool(&crafted), a);
        assert_eq!(server_for_tool(&crafted).len(), 64);
    }
}
