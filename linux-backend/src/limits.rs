//! Per-scope resource bounds: one control group per daemon holding every sandbox it
//! starts (project shell and kit containers), or rlimits where no control group can be
//! made.
//!
//! Mechanisms, in the order tried:
//! - `cgroup2`: a writable cgroup v2 directory that delegates `pids` (and `memory`) to
//!   children: the daemon's own cgroup when it does (only a root cgroup can, by the
//!   "no internal processes" rule), else the root of the cgroup2 mount (a root server
//!   on a systemd host, or in a container with its own cgroup namespace). The group
//!   `marsh-shim/<pid>` gets `pids.max`, `memory.max` and (when present)
//!   `memory.swap.max` 0.
//! - `cgroup1`: writable v1 `pids` (and `memory`) hierarchies, as root on v1/hybrid hosts,
//!   with the same `marsh-shim/<pid>` groups.
//!
//! Every daemon's group sits in one shared group, `marsh-shim`, whose memory limit is a
//! ceiling for all scopes together: [`CEILING_PERCENT`] of the machine's memory (or a
//! lower limit already set there), so sixteen scopes of 4 GiB each cannot promise more
//! memory than the machine has. A daemon holds a shared `flock` on its own group's
//! directory for its life; a group whose lock can be taken exclusively belongs to a
//! daemon that is gone (SIGKILL included), and is removed by the next daemon to start
//! (`rmdir` itself refuses a group that still holds a process). Creation and removal
//! happen under an exclusive lock on `marsh-shim`, so a group is never removed between
//! its creation and its owner's lock.
//! - `rlimit`: `RLIMIT_DATA` per process on every sandbox, and `RLIMIT_NPROC` on each
//!   shell job, set by the agent inside the sandbox's user namespace so it counts that
//!   namespace's processes only (Linux 5.14+): all of the project shell's processes
//!   together. Set on bubblewrap itself it would count all of the user's host
//!   processes, so kit containers get `RLIMIT_DATA` only. The kernel does not apply
//!   `RLIMIT_NPROC` to uid 0: for a root server this mechanism bounds no process count,
//!   and the report says `enforced: false` (doctor then fails its check).
//!
//! Rejected alternative: making our own delegated subtree on a systemd cgroup v2 host by
//! moving the daemon out of its own cgroup. The daemon shares that cgroup with the
//! processes of the session that booted it, which are not ours to move.
//!
//! Invariant: a sandbox joins the group in its pre-exec hook, before bubblewrap forks
//! anything, so no process of a sandbox is ever outside the group.

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::BackendConfig;
use crate::util::{self, log};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The group every daemon's own group sits in.
const SHARED_GROUP: &str = "marsh-shim";
/// Groups of earlier releases, directly in the parent (`marsh-shim-<pid>`).
const LEGACY_PREFIX: &str = "marsh-shim-";
/// The shared memory ceiling, as a share of the machine's memory.
pub const CEILING_PERCENT: u64 = 75;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mechanism {
    Cgroup2,
    Cgroup1,
    Rlimit,
}

/// What `status` and `doctor` show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsReport {
    pub mechanism: Mechanism,
    pub pids_max: u64,
    pub memory_max_bytes: u64,
    /// False when the process bound does not hold (rlimits for uid 0).
    pub enforced: bool,
    /// The memory limit of all scopes' groups together (the shared group's), when a
    /// control group limits memory.
    #[serde(default)]
    pub ceiling_bytes: Option<u64>,
}

/// Where groups would be made: one parent directory per controller hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Parents {
    /// One unified parent (controllers `pids`, maybe `memory`).
    V2 {
        parent: PathBuf,
        memory: bool,
    },
    /// The `pids` hierarchy's parent, and the `memory` one's when writable.
    V1 {
        pids: PathBuf,
        memory: Option<PathBuf>,
    },
    None,
}

impl Parents {
    fn mechanism(&self) -> Mechanism {
        match self {
            Parents::V2 { .. } => Mechanism::Cgroup2,
            Parents::V1 { .. } => Mechanism::Cgroup1,
            Parents::None => Mechanism::Rlimit,
        }
    }
}

/// Which mechanism a daemon booted now would use (makes nothing).
pub fn probe(config: &BackendConfig) -> LimitsReport {
    report(Parents::find().mechanism(), config)
}

fn report(mechanism: Mechanism, config: &BackendConfig) -> LimitsReport {
    LimitsReport {
        mechanism,
        pids_max: config.pids_max,
        memory_max_bytes: config.memory_max_bytes(),
        enforced: mechanism != Mechanism::Rlimit || util::euid() != 0,
        ceiling_bytes: None,
    }
}

impl Parents {
    fn find() -> Parents {
        let Ok(text) = fs::read_to_string("/proc/self/cgroup") else {
            return Parents::None;
        };
        let mut v2 = Vec::new();
        let (mut pids, mut memory) = (None, None);
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let rel = path.trim_start_matches('/');
            match controllers {
                "" => {
                    if let Some(mount) = [CGROUP_ROOT, "/sys/fs/cgroup/unified"]
                        .into_iter()
                        .map(Path::new)
                        .find(|m| is_cgroup2(m))
                    {
                        v2 = vec![mount.join(rel), mount.to_path_buf()];
                    }
                }
                list => {
                    for controller in list.split(',') {
                        let dir = Path::new(CGROUP_ROOT).join(controller).join(rel);
                        match controller {
                            "pids" => pids = Some(dir),
                            "memory" => memory = Some(dir),
                            _ => {}
                        }
                    }
                }
            }
        }
        for parent in v2 {
            let delegated =
                fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
            let has = |c: &str| delegated.split_whitespace().any(|w| w == c);
            if has("pids") && writable(&parent) {
                return Parents::V2 {
                    memory: has("memory"),
                    parent,
                };
            }
        }
        match pids.filter(|p| writable(p)) {
            Some(pids) => Parents::V1 {
                pids,
                memory: memory.filter(|m| writable(m)),
            },
            None => Parents::None,
        }
    }
}

fn is_cgroup2(mount: &Path) -> bool {
    mount.join("cgroup.controllers").is_file()
}

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// The bounds a daemon put in force.
pub struct Limits {
    report: LimitsReport,
    /// `cgroup.procs` of each group, open for writing (joined from pre-exec hooks).
    procs: Vec<File>,
    /// The group directories, removed (once empty) when the daemon ends.
    dirs: Vec<PathBuf>,
    /// A shared `flock` on each group directory, held for the daemon's life: what tells
    /// a later daemon that the group is not stale.
    _held: Vec<nix::fcntl::Flock<File>>,
    /// True when no group exists and rlimits stand in.
    rlimit_mode: bool,
}

impl Limits {
    /// Makes this daemon's groups (first removing empty ones of dead daemons); falls
    /// back to rlimits when a group cannot be made.
    pub fn establish(config: &BackendConfig) -> Limits {
        let parents = Parents::find();
        let name = std::process::id().to_string();
        match make_groups(&parents, &name, config) {
            Ok(Some(groups)) => Limits {
                report: LimitsReport {
                    ceiling_bytes: groups.ceiling,
                    ..report(parents.mechanism(), config)
                },
                procs: groups.procs,
                dirs: groups.dirs,
                _held: groups.held,
                rlimit_mode: false,
            },
            Ok(None) => Self::rlimits(config),
            Err(e) => {
                log!("marshd: cannot make a control group ({e}); using rlimits");
                Self::rlimits(config)
            }
        }
    }

    /// Rlimits only (also what a test without control groups uses).
    pub fn rlimits(config: &BackendConfig) -> Limits {
        Limits {
            report: report(Mechanism::Rlimit, config),
            procs: Vec::new(),
            dirs: Vec::new(),
            _held: Vec::new(),
            rlimit_mode: true,
        }
    }

    pub fn report(&self) -> &LimitsReport {
        &self.report
    }

    /// Descriptors of the `cgroup.procs` files a sandbox joins by writing `0`.
    pub fn procs_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// `RLIMIT_DATA` for every sandbox process, in rlimit mode.
    pub fn data_limit(&self) -> Option<u64> {
        self.rlimit_mode.then_some(self.report.memory_max_bytes)
    }

    /// `RLIMIT_NPROC` for each shell job (set inside the sandbox), in rlimit mode.
    pub fn nproc_limit(&self) -> Option<u64> {
        self.rlimit_mode.then_some(self.report.pids_max)
    }

    /// Removes the groups; call once every sandbox is gone. Best effort.
    pub fn release(&self) {
        for dir in &self.dirs {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// What [`make_groups`] made.
struct Groups {
    dirs: Vec<PathBuf>,
    procs: Vec<File>,
    held: Vec<nix::fcntl::Flock<File>>,
    ceiling: Option<u64>,
}

/// Makes `marsh-shim/<name>` under each parent, with `settings`, under the shared
/// group's exclusive lock (first removing the groups of daemons that are gone).
fn make_groups(
    parents: &Parents,
    name: &str,
    config: &BackendConfig,
) -> std::io::Result<Option<Groups>> {
    let pids = config.pids_max.to_string();
    let memory = config.memory_max_bytes().to_string();
    let ceiling = machine_memory().map(|total| total / 100 * CEILING_PERCENT);
    let mut groups = Groups {
        dirs: Vec::new(),
        procs: Vec::new(),
        held: Vec::new(),
        ceiling: None,
    };
    // `shared` is (file, value) to set on the shared group when it is looser.
    let mut make = |parent: &Path,
                    shared: &[(&str, u64)],
                    delegate: &str,
                    settings: &[(&str, &str)]|
     -> std::io::Result<()> {
        remove_legacy(parent);
        let shared_dir = parent.join(SHARED_GROUP);
        create_dir_if_absent(&shared_dir)?;
        let shared_lock = File::open(&shared_dir)?;
        nix::fcntl::Flock::lock(shared_lock, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| std::io::Error::from(e))
            .and_then(|_locked| {
                if !delegate.is_empty() {
                    write_setting(&shared_dir, "cgroup.subtree_control", delegate)?;
                }
                for (file, limit) in shared {
                    groups.ceiling = Some(tighten(&shared_dir, file, *limit)?);
                }
                remove_stale(&shared_dir);
                // A group of our own, never one found there: a daemon of the same pid in
                // another pid namespace (or a leftover still holding a process) keeps
                // its own, and this one takes the next free suffix.
                let dir = create_own_group(&shared_dir, name)?;
                groups.dirs.push(dir.clone());
                let held = nix::fcntl::Flock::lock(
                    File::open(&dir)?,
                    nix::fcntl::FlockArg::LockSharedNonblock,
                )
                .map_err(|(_, e)| std::io::Error::from(e))?;
                groups.held.push(held);
                for (file, value) in settings {
                    match write_setting(&dir, file, value) {
                        // Swap accounting is optional (a kernel without it lacks the file).
                        Err(e)
                            if e.kind() == std::io::ErrorKind::NotFound
                                && *file == "memory.swap.max" => {}
                        other => other?,
                    }
                }
                groups
                    .procs
                    .push(File::options().write(true).open(dir.join("cgroup.procs"))?);
                Ok(())
            })
    };
    let ceiling_for = |memory_controlled: bool, file: &'static str| -> Vec<(&'static str, u64)> {
        match ceiling {
            Some(c) if memory_controlled => vec![(file, c)],
            _ => Vec::new(),
        }
    };
    let result = match parents {
        Parents::None => return Ok(None),
        Parents::V2 { parent, memory: m } => {
            let mut settings = vec![("pids.max", pids.as_str())];
            let delegate = if *m {
                settings.push(("memory.max", memory.as_str()));
                settings.push(("memory.swap.max", "0"));
                "+pids +memory"
            } else {
                "+pids"
            };
            make(parent, &ceiling_for(*m, "memory.max"), delegate, &settings)
        }
        Parents::V1 { pids: p, memory: m } => make(p, &[], "", &[("pids.max", pids.as_str())])
            .and_then(|()| match m {
                Some(m) => make(
                    m,
                    &ceiling_for(true, "memory.limit_in_bytes"),
                    "",
                    &[("memory.limit_in_bytes", memory.as_str())],
                ),
                None => Ok(()),
            }),
    };
    match result {
        Ok(()) => Ok(Some(groups)),
        Err(e) => {
            for dir in &groups.dirs {
                let _ = fs::remove_dir(dir);
            }
            Err(e)
        }
    }
}

/// Creates `<shared>/<name>`, else `<name>-1` … `<name>-15`, whichever is free first.
fn create_own_group(shared: &Path, name: &str) -> std::io::Result<PathBuf> {
    let mut last = None;
    for n in 0..16 {
        let dir = match n {
            0 => shared.join(name),
            n => shared.join(format!("{name}-{n}")),
        };
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free group name")))
}

fn create_dir_if_absent(dir: &Path) -> std::io::Result<()> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

fn write_setting(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    File::options()
        .write(true)
        .open(dir.join(file))?
        .write_all(value.as_bytes())
}

/// Sets `file` in `dir` to `limit` unless it already holds a lower one (an
/// administrator's); returns the limit in force.
fn tighten(dir: &Path, file: &str, limit: u64) -> std::io::Result<u64> {
    let current = fs::read_to_string(dir.join(file))?;
    match current.trim().parse::<u64>() {
        Ok(set) if set <= limit => Ok(set),
        _ => write_setting(dir, file, &limit.to_string()).map(|()| limit),
    }
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn machine_memory() -> Option<u64> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Removes the groups in `shared` whose daemon is gone: a group whose directory can be
/// locked exclusively has no daemon holding it. Call under `shared`'s exclusive lock.
fn remove_stale(shared: &Path) {
    let Ok(entries) = fs::read_dir(shared) else {
        return;
    };
    for entry in entries.flatten() {
        // `<pid>` or `<pid>-<n>` (see `create_own_group`).
        let is_group = entry.file_type().is_ok_and(|t| t.is_dir())
            && entry.file_name().to_str().is_some_and(|n| {
                n.split('-').count() <= 2 && n.split('-').all(|p| p.parse::<u32>().is_ok())
            });
        if !is_group {
            continue;
        }
        let Ok(dir) = File::open(entry.path()) else {
            continue;
        };
        if let Ok(_unheld) =
            nix::fcntl::Flock::lock(dir, nix::fcntl::FlockArg::LockExclusiveNonblock)
        {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// A legacy group younger than this is never taken for stale: its daemon may live in
/// another pid namespace (where its pid means nothing here) and not have started a
/// sandbox yet. (Groups of this release are told apart by their lock instead.)
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the empty `marsh-shim-<pid>` groups of earlier releases' daemons that are
/// gone: only an old group whose pid is not alive here is tried.
fn remove_legacy(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(LEGACY_PREFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if old && !util::process_alive(pid) {
            let _ = fs::remove_dir(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn rlimits_carry_the_configured_bounds() {
        let config = BackendConfig {
            pids_max: 100,
            memory_max_mib: 256,
            ..BackendConfig::default()
        };
        let limits = Limits::rlimits(&config);
        assert_eq!(limits.report().mechanism, Mechanism::Rlimit);
        assert_eq!(limits.report().memory_max_bytes, 256 << 20);
        assert!(limits.procs_fds().is_empty());
        assert_eq!(limits.nproc_limit(), Some(100));
        assert_eq!(limits.data_limit(), Some(256 << 20));
    }

    #[test]
    fn probing_makes_nothing_and_names_a_mechanism() {
        let report = probe(&BackendConfig::default());
        assert_eq!(report.pids_max, crate::config::DEFAULT_PIDS_MAX);
    }
}
