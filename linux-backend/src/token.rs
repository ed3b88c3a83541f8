//! The daemon credential: 32 random bytes, hex, in `daemon/token` (0600).

use std::fs;
use std::os::unix::fs::MetadataExt;

use crate::error::{Context, Error, Result};
use crate::home::Home;
use crate::util;

const TOKEN_BYTES: usize = 32;

/// Generates a fresh token and publishes it durably, replacing any previous one.
/// A new daemon always mints a new token, so a stale token never authenticates.
pub fn mint(home: &Home) -> Result<String> {
    let token = util::random_hex(TOKEN_BYTES)?;
    util::write_durable(&home.daemon_dir(), "token", format!("{token}\n").as_bytes())?;
    Ok(token)
}

/// Reads the token, refusing a symlink, a file not owned by us, or one readable by others.
pub fn read(home: &Home) -> Result<String> {
    let path = home.token_path();
    let meta = fs::symlink_metadata(&path).context(|| format!("reading {}", path.display()))?;
    if !meta.file_type().is_file() || meta.uid() != util::euid() || meta.mode() & 0o077 != 0 {
        return Err(Error::failed(format!(
            "{} must be a regular owner-only file owned by this user",
            path.display()
        )));
    }
    let bytes = util::read_bounded(&path, 256).context(|| format!("reading {}", path.display()))?;
    let token = String::from_utf8_lossy(&bytes).trim().to_string();
    if token.len() != TOKEN_BYTES * 2 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::failed(format!("{} is malformed", path.display())));
    }
    Ok(token)
}

/// Compares two tokens in time independent of where they first differ.
pub fn matches(expected: &str, presented: &str) -> bool {
    let (a, b) = (expected.as_bytes(), presented.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn mint_then_read_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let mut home = Home::at(dir.path().join("h"));
        home.ensure().unwrap();
        util::ensure_private_dir(&home.daemon_dir()).unwrap();
        let t = mint(&home).unwrap();
        assert_eq!(read(&home).unwrap(), t);
        assert!(matches(&t, &t));
        assert!(!matches(&t, &t[1..]));
        let mut other = t.clone().into_bytes();
        other[0] = if other[0] == b'a' { b'b' } else { b'a' };
        assert!(!matches(&t, &String::from_utf8(other).unwrap()));
    }
}
