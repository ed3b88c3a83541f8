use std::path::PathBuf;

/// One variant per failing step, each naming the path it failed on.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot inspect {path}: {source}")]
    Inspect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create {path}: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is a symbolic link; refusing to follow it")]
    Symlink { path: PathBuf },
    #[error("{path} is not a directory")]
    NotDirectory { path: PathBuf },
    #[error("{path} is owned by uid {owner}, not by the effective uid {euid}")]
    ForeignOwner {
        path: PathBuf,
        owner: u32,
        euid: u32,
    },
    #[error("{path} has mode {mode:o}; it must not be accessible to group or others (chmod 700)")]
    Accessible { path: PathBuf, mode: u32 },
    #[error(
        "another marsh-mcp owns {path}: the development root is leased to one server at a time"
    )]
    Leased { path: PathBuf },
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is corrupt: {reason}; refusing to guess (restore it, or start on a new empty --scope-root)"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "{path} binds this root to workspace {bound} (dev {bound_dev}, ino {bound_ino}); refusing to use it for {requested}"
    )]
    BoundElsewhere {
        path: PathBuf,
        bound: String,
        bound_dev: u64,
        bound_ino: u64,
        requested: String,
    },
    #[error(
        "{path} is populated but has no workspace binding; refusing to claim it (use a new empty root, or inspect and repair it)"
    )]
    Unbound { path: PathBuf },
    #[error("{path} was replaced or changed identity since it was recorded")]
    IdentityChanged { path: PathBuf },
}
