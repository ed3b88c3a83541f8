//! Mount identity of a filesystem entry, for removals that must never cross into
//! another mount. `st_dev` alone cannot tell: a bind mount of a directory of the same
//! filesystem has the same device number. `statx(STATX_MNT_ID)` (Linux 5.8+) names the
//! mount itself.

#![allow(unsafe_code)]

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd};

use nix::errno::Errno;

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
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    // SAFETY: `statx` writes only into `buf`, which lives across the call; `name` is a
    // valid C string and the descriptor is borrowed for the call.
    let (ret, buf) = unsafe {
        let mut buf: libc::statx = std::mem::zeroed();
        let ret = libc::statx(
            dir.as_fd().as_raw_fd(),
            name.as_ptr(),
            flags,
            libc::STATX_MNT_ID,
            &mut buf,
        );
        (ret, buf)
    };
    if ret != 0 {
        return Err(MountIdError::Sys(Errno::last()));
    }
    if buf.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(MountIdError::Unsupported);
    }
    Ok(buf.stx_mnt_id)
}
