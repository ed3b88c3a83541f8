use std::os::unix::fs::MetadataExt;

use serde::{Deserialize, Serialize};

/// The identity of a directory as recorded in the registry. A directory whose `lstat`
/// no longer yields exactly these four values is not the directory that was recorded,
/// whatever its path says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirIdentity {
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    /// Full `st_mode`, file type bits included.
    pub mode: u32,
}

impl DirIdentity {
    pub fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            uid: meta.uid(),
            mode: meta.mode(),
        }
    }
}
