//! The broker's bearer token: 32 random bytes as hex in a 0600 file, created once
//! without ever replacing an existing one. Only `broker-start` creates it; clients
//! only read it.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the broker token {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot create the broker token {path}: {source}")]
    Create {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the broker token {path} is not a private regular file of this user (mode must be 0600)"
    )]
    Unsafe { path: String },
    #[error("the broker token {path} is malformed")]
    Malformed { path: String },
}

/// 32 bytes from the operating system's generator, as 64 lowercase hex digits.
fn random_hex() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(std::io::Error::other)?;
    Ok(hex::encode(bytes))
}

/// Reads the token; never creates it.
pub fn read_token(path: &Path) -> Result<String, TokenError> {
    let shown = path.display().to_string();
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| TokenError::Read {
            path: shown.clone(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| TokenError::Read {
        path: shown.clone(),
        source,
    })?;
    if !meta.is_file() || meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0
    {
        return Err(TokenError::Unsafe { path: shown });
    }
    let mut text = String::new();
    file.take(256)
        .read_to_string(&mut text)
        .map_err(|source| TokenError::Read {
            path: shown.clone(),
            source,
        })?;
    let token = text.trim();
    if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::Malformed { path: shown });
    }
    Ok(token.to_owned())
}

/// Returns the existing token, or creates one with `O_EXCL` (so two starters racing
/// agree on the winner's token).
pub fn create_or_read_token(path: &Path) -> Result<String, TokenError> {
    match read_token(path) {
        Ok(token) => return Ok(token),
        Err(TokenError::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(other) => return Err(other),
    }
    let shown = path.display().to_string();
    let token = random_hex().map_err(|source| TokenError::Create {
        path: shown.clone(),
        source,
    })?;
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    match created {
        Ok(mut file) => {
            file.write_all(token.as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|source| TokenError::Create {
                    path: shown.clone(),
                    source,
                })?;
            Ok(token)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => read_token(path),
        Err(source) => Err(TokenError::Create {
            path: shown,
            source,
        }),
    }
}

/// Constant-time comparison of a presented token with the real one.
pub fn token_matches(presented: &str, expected: &str) -> bool {
    presented.len() == expected.len()
        && presented
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn created_once_never_replaced_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("auth-token");
        assert!(read_token(&path).is_err());
        let first = create_or_read_token(&path).unwrap();
        assert_eq!(create_or_read_token(&path).unwrap(), first);
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(read_token(&path), Err(TokenError::Unsafe { .. })));
        assert!(token_matches(&first, &first));
        assert!(!token_matches(&first, &first[1..]));
    }
}
