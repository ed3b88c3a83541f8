//! Durable result receipts: `results/<id>.json`, one per finished job.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::receipt_blanks::Blanks;
use crate::util;

/// `marsh results --json` returns at most this many receipts.
pub const LIST_LIMIT: usize = 100;
/// A listing examines at most this many directory entries, so it stays bounded
/// however many receipts accumulate.
const MAX_SCAN: usize = 20_000;
const MAX_RECEIPT_FILE: u64 = 256 * 1024;
/// How soon after a receipt is written the daemon syncs the results directory, so the
/// receipt also survives a power loss (it survives a process crash at once).
pub const RESULTS_SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Receipt {
    pub id: String,
    pub kind: String,
    pub kit: Option<String>,
    pub command: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at_ms: u64,
    pub finished_at_ms: u64,
    pub duration_ms: u64,
    pub workspace: String,
}

impl Receipt {
    /// Publishes the receipt whole or not at all: through a ready blank when there is
    /// one (one synchronous overwrite + rename, [`Blanks::publish`]), else temp file +
    /// `fdatasync` + rename ([`util::write_whole`]). The caller makes the directory
    /// durable later (the daemon syncs it within [`RESULTS_SYNC_INTERVAL`]).
    pub fn write(&self, dir: &Path, blanks: Option<&Blanks>) -> Result<()> {
        let bytes = serde_json::to_vec(self).map_err(|e| Error::Protocol(e.to_string()))?;
        let name = format!("{}.json", self.id);
        if blanks.is_some_and(|b| b.publish(&bytes, &dir.join(&name))) {
            return Ok(());
        }
        util::write_whole(dir, &name, &bytes)
    }
}

/// `[0-9a-f-]{1,64}`.
pub fn valid_selector(sel: &str) -> bool {
    (1..=64).contains(&sel.len())
        && !sel.starts_with('-')
        && sel
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
}

/// Receipt ids (file stems) in `dir`, at most [`MAX_SCAN`] entries examined.
fn ids(dir: &Path) -> Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("listing {}", dir.display()), e)),
    };
    Ok(entries
        .take(MAX_SCAN)
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let id = name.strip_suffix(".json")?;
            valid_selector(id).then(|| id.to_string())
        })
        .collect())
}

fn read(dir: &Path, id: &str) -> Option<Receipt> {
    let bytes = util::read_bounded(&dir.join(format!("{id}.json")), MAX_RECEIPT_FILE).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// The newest receipts first (by finish time, then start time, then id), at most
/// [`LIST_LIMIT`]. Unreadable or malformed files are skipped.
pub fn list(dir: &Path) -> Result<Vec<Receipt>> {
    let mut receipts: Vec<Receipt> = ids(dir)?.iter().filter_map(|id| read(dir, id)).collect();
    receipts.sort_by(|a, b| {
        (b.finished_at_ms, b.started_at_ms, &b.id).cmp(&(a.finished_at_ms, a.started_at_ms, &a.id))
    });
    receipts.truncate(LIST_LIMIT);
    Ok(receipts)
}

/// The one receipt whose id starts with `sel`; [`Error::NoResult`] when none does,
/// [`Error::AmbiguousResult`] when several do.
pub fn find(dir: &Path, sel: &str) -> Result<Receipt> {
    if !valid_selector(sel) {
        return Err(Error::Usage(format!(
            "invalid result selector {sel:?}: expected [0-9a-f-]{{1,64}}"
        )));
    }
    let matching: Vec<String> = ids(dir)?
        .into_iter()
        .filter(|id| id.starts_with(sel))
        .collect();
    match matching.as_slice() {
        [] => Err(Error::NoResult(sel.to_string())),
        [id] => read(dir, id).ok_or_else(|| Error::failed(format!("result {id} is unreadable"))),
        _ => Err(Error::AmbiguousResult(sel.to_string())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn receipt(id: &str, finished: u64) -> Receipt {
        Receipt {
            id: id.into(),
            kind: "shell".into(),
            kit: None,
            command: "true".into(),
            exit_code: Some(0),
            signal: None,
            started_at_ms: finished - 1,
            finished_at_ms: finished,
            duration_ms: 1,
            workspace: "/w".into(),
        }
    }

    #[test]
    fn list_is_newest_first_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..(LIST_LIMIT as u64 + 5) {
            receipt(&format!("{:08x}-0000-4000-8000-000000000000", i), 10 + i)
                .write(dir.path(), None)
                .unwrap();
        }
        fs::write(dir.path().join("abc.json"), "not json").unwrap();
        let all = list(dir.path()).unwrap();
        assert_eq!(all.len(), LIST_LIMIT);
        assert!(
            all.windows(2)
                .all(|w| w[0].finished_at_ms >= w[1].finished_at_ms)
        );
        assert_eq!(all[0].finished_at_ms, 10 + LIST_LIMIT as u64 + 4);
    }

    #[test]
    fn find_by_prefix() {
        let dir = tempfile::tempdir().unwrap();
        receipt("aa11", 5).write(dir.path(), None).unwrap();
        receipt("aa22", 6).write(dir.path(), None).unwrap();
        assert_eq!(find(dir.path(), "aa1").unwrap().id, "aa11");
        let ambiguous = find(dir.path(), "aa").unwrap_err();
        assert!(
            matches!(ambiguous, Error::AmbiguousResult(_)),
            "{ambiguous:?}"
        );
        assert_eq!(ambiguous.to_string(), "result selector aa is ambiguous");
        assert_eq!(ambiguous.exit_code(), 4);
        let missing = find(dir.path(), "b").unwrap_err();
        assert!(matches!(missing, Error::NoResult(_)), "{missing:?}");
        assert_eq!(missing.to_string(), "no result matches b");
        assert_eq!(missing.exit_code(), 3);
        // An empty or absent results directory matches nothing either.
        let absent = find(&dir.path().join("absent"), "aa").unwrap_err();
        assert_eq!(absent.exit_code(), 3);
        assert_eq!(find(dir.path(), "X").unwrap_err().exit_code(), 2);
    }

    #[test]
    fn a_receipt_published_through_a_blank_is_listed_and_found_whole() {
        let dir = tempfile::tempdir().unwrap();
        let blanks = Blanks::new(dir.path());
        blanks.prepare_one();
        let written = receipt("bb33", 7);
        written.write(dir.path(), Some(&blanks)).unwrap();
        let file = std::fs::read(dir.path().join("bb33.json")).unwrap();
        assert_eq!(file.len(), crate::receipt_blanks::BLANK_SIZE);
        assert_eq!(find(dir.path(), "bb3").unwrap(), written);
        // No blank left: the next receipt takes the temp file + fdatasync path.
        receipt("cc44", 8).write(dir.path(), Some(&blanks)).unwrap();
        let ids: Vec<String> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, ["cc44", "bb33"]);
        let leftovers = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count();
        assert_eq!(leftovers, 0);
    }
}
