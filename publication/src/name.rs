//! Public tool names, whose they are, and the stock SBX server name derived from both.

use std::path::Path;

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

/// Hex digits of a publisher's key.
const KEY_HEX: usize = 8;

/// Whose publications a name belongs to: a workspace and a marsh home, both canonical.
/// Names, the 256-publication cap and the stock SBX servers are per publisher, so one
/// workspace can neither exhaust nor pre-claim another's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherKey(String);

impl PublisherKey {
    /// The first 8 hex digits of SHA-256 over the canonical workspace's bytes, a NUL,
    /// and the canonical home's bytes.
    pub fn of(workspace: &Path, home: &Path) -> PublisherKey {
        let mut hasher = Sha256::new();
        hasher.update(workspace.as_os_str().as_encoded_bytes());
        hasher.update([0u8]);
        hasher.update(home.as_os_str().as_encoded_bytes());
        PublisherKey(hex::encode(hasher.finalize())[..KEY_HEX].to_string())
    }

    /// The key as it appears in server names and the control directory.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The stock SBX server registered for this publisher's tool `name`:
    /// `marsh-pub-<key>-NAME` when that fits in 64 characters, else the prefix and key,
    /// the first 32 characters of the name, `-` and 12 hex digits of the name's
    /// SHA-256, so two long names sharing a stem stay distinct. A name shaped like a
    /// shortened one is shortened as well (never served plain). Only meaningful for a
    /// [`valid_tool_name`].
    pub fn server_for(&self, name: &str) -> String {
        let head = format!("{SERVER_PREFIX}{}-", self.0);
        let plain = format!("{head}{name}");
        if plain.len() <= MAX_SERVER_NAME && !looks_shortened(name) {
            return plain;
        }
        let digest = hex::encode(Sha256::digest(name.as_bytes()));
        let hex = &digest[..DIGEST_HEX];
        // Valid names are ASCII, so any byte index is a character boundary.
        format!("{head}{}-{hex}", &name[..stem_len()])
    }
}

/// The stock SBX server an earlier release registered for `name`, when names were one
/// namespace per user: `marsh-pub-NAME` when that fits in 64 characters, else the
/// prefix, the first 41 characters, `-` and 12 hex digits of the name's SHA-256. Only
/// for revoking what that release published.
pub fn legacy_server_for(name: &str) -> String {
    const LEGACY_STEM: usize = 41;
    let plain = format!("{SERVER_PREFIX}{name}");
    let bytes = name.as_bytes();
    let shortened_shape = bytes.len() == LEGACY_STEM + 1 + DIGEST_HEX
        && bytes[LEGACY_STEM] == b'-'
        && bytes[LEGACY_STEM + 1..]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    if plain.len() <= MAX_SERVER_NAME && !shortened_shape {
        return plain;
    }
    let digest = hex::encode(Sha256::digest(name.as_bytes()));
    format!(
        "{SERVER_PREFIX}{}-{}",
        &name[..LEGACY_STEM],
        &digest[..DIGEST_HEX]
    )
}

/// Characters of a long name kept in its shortened server name.
fn stem_len() -> usize {
    MAX_SERVER_NAME - SERVER_PREFIX.len() - KEY_HEX - 1 - 1 - DIGEST_HEX
}

/// Whether `name` has the shape of a shortened long name (`<32 characters>-<12 hex>`):
/// such a name is shortened too, so no plain name can take a long name's server.
fn looks_shortened(name: &str) -> bool {
    let stem = stem_len();
    let bytes = name.as_bytes();
    bytes.len() == stem + 1 + DIGEST_HEX
        && bytes[stem] == b'-'
        && bytes[stem + 1..]
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
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
    fn server_names_fit_stay_distinct_and_belong_to_one_publisher() {
        let key = PublisherKey::of(Path::new("/w"), Path::new("/h"));
        let other = PublisherKey::of(Path::new("/w2"), Path::new("/h"));
        assert_eq!(key.as_str().len(), 8);
        assert_ne!(key, other);
        assert_ne!(key, PublisherKey::of(Path::new("/w"), Path::new("/h2")));
        let k = key.as_str();
        assert_eq!(key.server_for("hello"), format!("marsh-pub-{k}-hello"));
        assert_ne!(key.server_for("hello"), other.server_for("hello"));
        let fits = "a".repeat(45);
        assert_eq!(key.server_for(&fits), format!("marsh-pub-{k}-{fits}"));
        let long_a = format!("{}a", "s".repeat(60));
        let long_b = format!("{}b", "s".repeat(60));
        let (a, b) = (key.server_for(&long_a), key.server_for(&long_b));
        assert_eq!(a.len(), 64);
        assert_eq!(b.len(), 64);
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("marsh-pub-{k}-{}-", "s".repeat(32))));
        // A plain name shaped like `a`'s shortened form does not get `a`'s server.
        let crafted = a.trim_start_matches(&format!("marsh-pub-{k}-")).to_string();
        assert_eq!(crafted.len(), 45);
        assert!(valid_tool_name(&crafted));
        assert_ne!(key.server_for(&crafted), a);
        assert_eq!(key.server_for(&crafted).len(), 64);
        // The earlier release's names, for revoking its publications.
        assert_eq!(legacy_server_for("hello"), "marsh-pub-hello");
        let legacy = legacy_server_for(&long_a);
        assert_eq!(legacy.len(), 64);
        assert!(legacy.starts_with(&format!("marsh-pub-{}-", "s".repeat(41))));
    }
}
