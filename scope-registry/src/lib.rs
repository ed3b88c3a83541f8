//! Host-side state of one marsh-mcp development root: the owner-only directory checks,
//! the workspace binding (`workspace.json`), the exclusive lease (`control.lock`) and the
//! atomically published scope registry (`scopes.json`).
//!
//! Everything here works on identities `(dev, ino, uid, mode)` and never trusts a path
//! twice: directories are checked with `lstat` (no symlink is ever followed) and files
//! are opened with `O_NOFOLLOW`.

mod ancestry;
mod atomic;
mod binding;
mod error;
mod identity;
mod lease;
mod mount_id;
mod naming;
mod owner;
mod registry;
mod removal;
mod root;

pub use ancestry::{AncestryError, TrustedAncestors};
pub use atomic::{write_atomically, write_atomically_at};
pub use binding::WorkspaceBinding;
pub use error::RegistryError;
pub use identity::DirIdentity;
pub use lease::Lease;
pub use naming::{
    HostOs, sbx_client_root, scopes_base, scopes_base_for, server_name, workspace_hash,
};
pub use owner::{ensure_owner_only_dir, verify_owner_only_dir};
pub use registry::{
    AdmissionError, DIAGNOSTIC_LIMIT, Event, IDENTITY_RECOVERY, MAX_LIVE_SCOPES,
    MAX_RETAINED_SCOPES, Next, REGISTRY_VERSION, Registry, ScopeId, ScopeRecord, ScopeState,
    TransitionError, transition,
};
pub use removal::{RemovalError, RemovalLimits, RemovalReport, remove_scope_home};
pub use root::{DEFAULT_HOME_NAME, ManagedRoot, home_matches};
