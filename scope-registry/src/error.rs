use std::path::PathBuf;

use crate::AncestryError;

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
        "another marsh-mcp{} owns {path}: the development root is leased to one server at a time",
        holder_text(*.holder)
    )]
    Leased {
        path: PathBuf,
        /// The holder's pid as it recorded it in the lease file (absent for a holder
        /// that wrote none).
        holder: Option<u32>,
    },
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
    #[error(
        "the development root {path} is not safe to use: {source}; choose a root whose every ancestor is owned by root or you and not writable by others (sticky directories such as /tmp excepted)"
    )]
    UntrustedAncestor {
        path: PathBuf,
        source: AncestryError,
    },
    #[error(
        "the scope registry {path} is missing, but this development root was bound to workspace {workspace} and its registry was created then: the registry was lost. Refusing to start, because scopes it recorded may still have running daemons and homes that would be forgotten. Recover by restoring scopes.json from a backup; or stop every marsh daemon of the homes in the root (MARSH_HOME=<home> marsh stop), move the root aside, and start on a new empty --scope-root"
    )]
    RegistryLost { path: PathBuf, workspace: String },
    #[error(
        "the development root {path} was moved, replaced or loosened while marsh-mcp was running ({what}); every registry write and home creation is refused until it is restored and marsh-mcp restarted"
    )]
    RootDisplaced { path: PathBuf, what: String },
}

impl RegistryError {
    /// The failure without any path, for callers who must never see host paths (the
    /// full error, paths included, belongs in the operator's log).
    pub fn caller_message(&self) -> String {
        match self {
            Self::Inspect { source, .. } => format!("cannot inspect a registry entry: {source}"),
            Self::Create { source, .. } => format!("cannot create a scope home: {source}"),
            Self::Symlink { .. } => "a registry entry is a symbolic link".into(),
            Self::NotDirectory { .. } => "a registry directory is not a directory".into(),
            Self::ForeignOwner { owner, euid, .. } => {
                format!("a registry entry is owned by uid {owner}, not {euid}")
            }
            Self::Accessible { mode, .. } => {
                format!("a registry directory is open to group or others (mode {mode:o})")
            }
            Self::Leased { holder, .. } => format!(
                "the development root is leased to another marsh-mcp server{}",
                holder_text(*holder)
            ),
            Self::Lock { source, .. } => format!("cannot lock the development root: {source}"),
            Self::Read { source, .. } => format!("cannot read the registry: {source}"),
            Self::Write { source, .. } => format!("cannot write the registry: {source}"),
            Self::Corrupt { reason, .. } => format!("the registry is corrupt: {reason}"),
            Self::BoundElsewhere { .. } => {
                "the development root is bound to another workspace".into()
            }
            Self::Unbound { .. } => "the development root has no workspace binding".into(),
            Self::IdentityChanged { .. } => {
                "a registry directory was replaced or changed identity".into()
            }
            Self::UntrustedAncestor { .. } => {
                "an ancestor of the development root is not trusted".into()
            }
            Self::RegistryLost { .. } => "the scope registry was lost".into(),
            Self::RootDisplaced { .. } => "the development root was moved, replaced or loosened while marsh-mcp was running; scope changes are refused until it is restored and marsh-mcp restarted".into(),
        }
    }
}

/// ` (pid N)` for a known lease holder, nothing otherwise.
fn holder_text(holder: Option<u32>) -> String {
    holder
        .map(|pid| format!(" (pid {pid})"))
        .unwrap_or_default()
}
