//! What makes two brokers interchangeable: the same build (sha256 of the running
//! `marsh-mcp`) and the same configuration (workspace, root, pinned executables'
//! contents, full-control flag). `broker-start` reuses a broker only when both match.

use std::io::Read;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::marsh::MarshDriver;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerIdentity {
    pub build: String,
    pub fingerprint: String,
}

/// sha256 of the running executable's contents.
pub fn build_hash() -> std::io::Result<String> {
    let mut file = std::fs::File::open(std::env::current_exe()?)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

impl BrokerIdentity {
    pub fn for_config(
        workspace: &std::path::Path,
        root: &std::path::Path,
        driver: &MarshDriver,
        allow_full_sbx_control: bool,
    ) -> std::io::Result<Self> {
        let mut hasher = Sha256::new();
        let mut field = |name: &str, value: &[u8]| {
            hasher.update((name.len() as u64).to_le_bytes());
            hasher.update(name.as_bytes());
            hasher.update((value.len() as u64).to_le_bytes());
            hasher.update(value);
        };
        field("workspace", workspace.as_os_str().as_encoded_bytes());
        field("root", root.as_os_str().as_encoded_bytes());
        for pin in driver.pins() {
            field(pin.role(), pin.path().as_os_str().as_encoded_bytes());
            let sha256 = pin.sha256_hex().map_err(std::io::Error::other)?;
            field(pin.role(), sha256.as_bytes());
        }
        field(
            "full_sbx_control",
            if allow_full_sbx_control { b"1" } else { b"0" },
        );
        Ok(Self {
            build: build_hash()?,
            fingerprint: hex::encode(hasher.finalize()),
        })
    }
}
