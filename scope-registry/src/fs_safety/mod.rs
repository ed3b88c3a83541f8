//! Descriptor-based path safety shared by everything that keeps host state: the
//! scope roots and homes here, and (through the crate's re-exports) the server's
//! pinned executables, the installers' roots and the sbx stand-in's state file.
//!
//! - [`ancestry`]: every existing ancestor of a path is owned by root or the euid and
//!   writable by no one else (sticky directories excepted);
//! - [`owner`]: owner-only directories, created or verified with `lstat` (never
//!   following a symlink), as [`identity::DirIdentity`]s;
//! - [`atomic`]: whole-or-absent publication (temp file, fsync, rename, directory
//!   fsync) relative to a directory descriptor, and bounded no-follow reads;
//! - [`mount_id`]: the mount an entry lives on, so a walk never crosses into another.

pub(crate) mod ancestry;
pub(crate) mod atomic;
pub(crate) mod identity;
pub(crate) mod mount_id;
pub(crate) mod owner;
