//! Tool names, sandbox names, the stock SBX server name of a tool, and the bounds a
//! publication request must respect (SPEC of issue 11, README "Publication").

use sha2::{Digest, Sha256};

/// Longest public tool name.
pub const MAX_TOOL_NAME: usize = 64;
/// Prefix of every stock SBX server a publication registers.
pub const SERVER_PREFIX: &str = "marsh-pub-";
/// Longest stock SBX server name (and sandbox name).
const MAX_SERVER_NAME: usize = 64;
/// Hex digits of the name's digest kept when a long name is shortened.
const DIGEST_HEX: usize = 12;

pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
pub const MAX_TIMEOUT_MS: u64 = 900_000;
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 262_144;
pub const MAX_OUTPUT_BYTES: u64 = 262_144;
pub const MAX_DESCRIPTION_BYTES: usize = 1024;
pub const MAX_PIPELINE_BYTES: usize = 65_536;

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

/// `[A-Za-z0-9._-]{1,64}` as `sbx mcp load --sandbox` accepts it, without a leading
/// `-` (another sbx could read one as a flag).
pub fn valid_sandbox_name(name: &str) -> bool {
    (1..=MAX_SERVER_NAME).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
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

/// The stock SBX server of tool `name`: `marsh-pub-NAME` when that fits in 64
/// characters, else the prefix, the first 41 characters of the name, `-` and the first
/// 12 hex digits of the name's SHA-256 (64 characters). Only meaningful for a
/// [`valid_tool_name`] (ASCII, so any byte index is a character boundary).
pub fn server_for_tool(name: &str) -> String {
    let plain = format!("{SERVER_PREFIX}{name}");
    if plain.len() <= MAX_SERVER_NAME && !looks_shortened(name) {
        return plain;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
        .chars()
        .take(DIGEST_HEX)
        .collect();
    let stem = MAX_SERVER_NAME - SERVER_PREFIX.len() - 1 - DIGEST_HEX;
    format!("{SERVER_PREFIX}{}-{hex}", &name[..stem])
}

/// The default description of a pipeline published from `workspace_name`.
pub fn default_description(workspace_name: &str) -> String {
    format!(
        "Runs a fixed pipeline in the marsh project {workspace_name}; the input argument is its stdin."
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn tool_names() {
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
    fn sandbox_names() {
        assert!(valid_sandbox_name("dev-1.x_y"));
        assert!(!valid_sandbox_name(""));
        assert!(!valid_sandbox_name("a b"));
        assert!(!valid_sandbox_name("--help"));
        assert!(!valid_sandbox_name(&"s".repeat(65)));
    }

    #[test]
    fn server_names_fit_and_stay_distinct() {
        assert_eq!(server_for_tool("hello"), "marsh-pub-hello");
        let fits = "a".repeat(54);
        assert_eq!(server_for_tool(&fits), format!("marsh-pub-{fits}"));
        let long_a = format!("{}a", "s".repeat(60));
        let long_b = format!("{}b", "s".repeat(60));
        let (a, b) = (server_for_tool(&long_a), server_for_tool(&long_b));
        assert_eq!((a.len(), b.len()), (64, 64));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("marsh-pub-{}-", "s".repeat(41))));
        // The digest is SHA-256 of the name, lowercase hex.
        let digest = Sha256::digest(long_a.as_bytes());
        assert!(a.ends_with(&format!(
            "{:02x}{:02x}{:02x}{:02x}{:02x}{:02x}",
            digest[0], digest[1], digest[2], digest[3], digest[4], digest[5]
        )));
        // A plain name shaped like `a`'s shortened form does not get `a`'s server.
        let crafted = a.trim_start_matches(SERVER_PREFIX).to_string();
        assert!(valid_tool_name(&crafted));
        assert_ne!(server_for_tool(&crafted), a);
        assert_eq!(server_for_tool(&crafted).len(), 64);
    }
}
