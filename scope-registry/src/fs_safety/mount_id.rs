//! Mount identity of a filesystem entry, for removals that must never cross into
//! another mount. `st_dev` alone cannot tell: a bind mount of a directory of the same
//! filesystem has the same device number. `statx(STATX_MNT_ID)` (Linux 5.8+) names the
//! mount itself.

use std::ffi::CStr;
use std::os::fd::AsFd;

use nix::errno::Errno;
use rustix::fs::{AtFlags, StatxFlags, statx};

/// Why no mount id could be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountIdError {
    /// The call failed with this errno.
    Sys(Errno),
    /// The kernel does not report mount ids (before Linux 5.8).
    Unsupported,
}

/// The mount id of `name` in `dir`, without following a final symlink; an empty name
/// means `dir` itself.
pub fn mount_id_at(dir: impl AsFd, name: &CStr) -> Result<u64, MountIdError> {
    let flags = if name.is_empty() {
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    let found = statx(dir, name, flags, StatxFlags::MNT_ID)
        .map_err(|e| MountIdError::Sys(Errno::from_raw(e.raw_os_error())))?;
    if found.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        return Err(MountIdError::Unsupported);
    }
    Ok(found.stx_mnt_id)
}
