//! Host-side state of one marsh-mcp development root: the owner-only directory checks,
//! the workspace binding (`workspace.json`), the exclusive lease (`control.lock`) and the
//! atomically published scope registry (`scopes.json`).
//!
//! The descriptor-based path-safety helpers all of this rests on live in `fs_safety`
//! and are re-exported for the server, the installers and the sbx stand-in.
//!
//! Everything here works on identities `(dev, ino, uid, mode)` and never trusts a path
//! twice: directories are checked with `lstat` (no symlink is ever followed) and files
//! are opened with `O_NOFOLLOW`.

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod binding;
mod error;
mod fs_safety;
mod lease;
mod naming;
mod registry;
mod removal;
mod root;

pub use binding::WorkspaceBinding;
pub use error::RegistryError;
pub use fs_safety::ancestry::{AncestryError, TrustedAncestors, VerifyRound};
pub use fs_safety::atomic::{write_atomically, write_atomically_at};
pub use fs_safety::identity::DirIdentity;
pub use fs_safety::owner::{ensure_owner_only_dir, verify_owner_only_dir};
pub use lease::Lease;
pub use naming::{
    HostOs, sbx_client_root, scopes_base, scopes_base_for, server_name, workspace_hash,
};
pub use registry::{
    AdmissionError, DIAGNOSTIC_LIMIT, Event, IDENTITY_RECOVERY, MAX_LIVE_SCOPES,
    MAX_RETAINED_SCOPES, Next, REGISTRY_VERSION, Registry, ScopeId, ScopeRecord, ScopeState,
    TransitionError, transition,
};
pub use removal::{RemovalError, RemovalLimits, RemovalReport, remove_scope_home};
pub use root::{DEFAULT_HOME_NAME, ManagedRoot, home_matches};
