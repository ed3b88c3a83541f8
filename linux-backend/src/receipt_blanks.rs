//! Receipt files made ahead of need, so that publishing a receipt on the reply path
//! costs one synchronous overwrite and a rename.
//!
//! A blank is a temp file in the results directory (`.blank.RANDOM.tmp`, owner-only,
//! opened `O_DSYNC`) holding [`BLANK_SIZE`] spaces, written synchronously when the
//! blank is made: its blocks are allocated and its size is on disk before any
//! receipt uses it. Publishing a receipt of at most [`BLANK_SIZE`] bytes overwrites
//! the blank's start in place (one `pwrite` that returns once the bytes are on
//! disk; the size and the block map do not change, so no journal commit is waited
//! for) and renames it to `<id>.json`. The spaces left after the JSON are
//! whitespace that every JSON reader skips.
//!
//! Invariants, as for [`crate::util::write_whole`]: a name `<id>.json` only ever
//! names a file whose receipt bytes reached the disk first, so after any crash a
//! receipt is whole or absent; a crash leaves at most temp files, which the next
//! daemon of the home removes before it serves. A receipt larger than a blank, or a
//! write that fails, takes the temp file + `fdatasync` + rename path instead.
//!
//! Rejected alternative: `fdatasync` of a freshly created file on the reply path (the
//! earlier way, still the fallback). The new file's allocation and size make the
//! flush wait for a journal commit: ~350 µs against ~150 µs for the overwrite on the
//! ext4 volume this was measured on.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

use crate::util::{self, lock};

/// The size of a blank, and the largest receipt a blank takes (a receipt is about
/// 250 bytes plus its command text).
pub const BLANK_SIZE: usize = 4096;
/// Blanks kept ready: a burst of this many receipts waits for no allocation.
const BLANKS_KEPT: usize = 2;

/// The daemon's ready blanks for one results directory.
pub struct Blanks {
    dir: PathBuf,
    /// Invariant: every entry is a whole blank (all [`BLANK_SIZE`] spaces on disk)
    /// that no receipt has used; none once discarded.
    ready: Mutex<Ready>,
    /// Signalled when a blank is taken, and when the filler finishes making one.
    changed: Condvar,
}

#[derive(Default)]
struct Ready {
    blanks: Vec<Blank>,
    /// Set by [`Blanks::discard`]: no blank is kept any more.
    discarded: bool,
    /// The filler is making a blank (outside the lock); [`Blanks::discard`] waits for
    /// it, so a stopping daemon does not exit while one is half made.
    making: bool,
}

/// How long the filler waits before trying again after it could not make a blank.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long [`Blanks::discard`] waits for a blank being made.
const DISCARD_WAIT: Duration = Duration::from_secs(2);

struct Blank {
    file: File,
    path: PathBuf,
}

impl Blanks {
    pub fn new(dir: &Path) -> Self {
        Blanks {
            dir: dir.to_path_buf(),
            ready: Mutex::new(Ready::default()),
            changed: Condvar::new(),
        }
    }

    /// Keeps [`BLANKS_KEPT`] blanks ready, making one whenever one was taken; runs on
    /// a thread of its own for the daemon's life. A blank that cannot be made is
    /// retried after [`RETRY_AFTER`] (until then receipts take the fallback path).
    pub fn keep_filled(&self) {
        let mut ready = lock(&self.ready);
        loop {
            while ready.discarded || ready.blanks.len() >= BLANKS_KEPT {
                ready = self
                    .changed
                    .wait(ready)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            ready.making = true;
            drop(ready);
            let made = self.make();
            ready = lock(&self.ready);
            ready.making = false;
            self.changed.notify_all();
            match made {
                Ok(blank) if ready.discarded => {
                    let _ = fs::remove_file(&blank.path);
                }
                Ok(blank) => ready.blanks.push(blank),
                Err(e) => {
                    util::log!("marshd: preparing a receipt file: {e}");
                    ready = self
                        .changed
                        .wait_timeout(ready, RETRY_AFTER)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
    }

    /// Makes one blank at once (tests, which do not run [`Blanks::keep_filled`]).
    #[cfg(test)]
    pub(crate) fn prepare_one(&self) {
        let blank = self.make().expect("a blank");
        lock(&self.ready).blanks.push(blank);
    }

    /// Removes the ready blanks and keeps none from now on (a daemon that stops
    /// leaves no temp file; receipts written after this take the fallback path).
    pub fn discard(&self) {
        let mut ready = lock(&self.ready);
        ready.discarded = true;
        for blank in ready.blanks.drain(..) {
            let _ = fs::remove_file(&blank.path);
        }
        // A blank being made is removed by the filler once it sees `discarded`.
        let _ = self
            .changed
            .wait_timeout_while(ready, DISCARD_WAIT, |r| r.making);
    }

    fn make(&self) -> std::io::Result<Blank> {
        let name = format!(
            ".blank.{}.tmp",
            util::random_hex(6).map_err(std::io::Error::other)?
        );
        let path = self.dir.join(name);
        let made = (|| {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_DSYNC | libc::O_CLOEXEC)
                .open(&path)?;
            file.write_all(&[b' '; BLANK_SIZE])?;
            Ok(file)
        })();
        match made {
            Ok(file) => Ok(Blank { file, path }),
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Publishes `bytes` as `target` through a ready blank. `false` when there is
    /// none, the bytes do not fit, or the overwrite or rename failed (the blank is
    /// then removed): the caller writes the receipt the fallback way.
    pub fn publish(&self, bytes: &[u8], target: &Path) -> bool {
        if bytes.len() > BLANK_SIZE {
            return false;
        }
        let Some(blank) = lock(&self.ready).blanks.pop() else {
            return false;
        };
        self.changed.notify_all();
        let published = blank
            .file
            .write_all_at(bytes, 0)
            .and_then(|()| fs::rename(&blank.path, target));
        match published {
            Ok(()) => true,
            Err(e) => {
                util::log!("marshd: publishing a receipt through a prepared file: {e}");
                let _ = fs::remove_file(&blank.path);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn wait_for_blanks(dir: &Path, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while entries(dir)
            .iter()
            .filter(|n| n.starts_with(".blank."))
            .count()
            < count
        {
            assert!(Instant::now() < deadline, "{:?}", entries(dir));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A pool in a fresh directory with its filler running and its blanks ready.
    fn filled_pool() -> (tempfile::TempDir, Arc<Blanks>) {
        let dir = tempfile::tempdir().unwrap();
        let blanks = Arc::new(Blanks::new(dir.path()));
        let filler = Arc::clone(&blanks);
        std::thread::spawn(move || filler.keep_filled());
        wait_for_blanks(dir.path(), BLANKS_KEPT);
        (dir, blanks)
    }

    #[test]
    fn a_receipt_goes_out_through_a_blank_whole_and_the_blank_is_replaced() {
        let (dir, blanks) = filled_pool();
        let target = dir.path().join("abc.json");
        assert!(blanks.publish(br#"{"id":"abc"}"#, &target));
        let bytes = fs::read(&target).unwrap();
        assert_eq!(bytes.len(), BLANK_SIZE);
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(value["id"], "abc");
        wait_for_blanks(dir.path(), BLANKS_KEPT);
        assert!(
            !blanks.publish(&vec![b' '; BLANK_SIZE + 1], &dir.path().join("big.json")),
            "a receipt larger than a blank takes the fallback"
        );
        assert!(!dir.path().join("big.json").exists());
    }

    #[test]
    fn a_discarded_pool_leaves_no_file_and_makes_no_more() {
        let (dir, blanks) = filled_pool();
        blanks.discard();
        assert!(entries(dir.path()).is_empty());
        assert!(!blanks.publish(b"{}", &dir.path().join("x.json")));
        std::thread::sleep(Duration::from_millis(50));
        assert!(entries(dir.path()).is_empty());
    }

    #[test]
    fn without_a_ready_blank_nothing_is_published() {
        let dir = tempfile::tempdir().unwrap();
        let blanks = Blanks::new(dir.path());
        assert!(!blanks.publish(b"{}", &dir.path().join("x.json")));
        assert!(entries(dir.path()).is_empty());
    }
}
