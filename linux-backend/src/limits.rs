//! Per-scope resource bounds: one control group per daemon holding every sandbox it
//! starts (project shell and kit containers), or rlimits where no control group can be
//! made.
//!
//! Mechanisms, in the order tried:
//! - `cgroup2`: a writable cgroup v2 directory that delegates `pids` (and `memory`) to
//!   children: the daemon's own cgroup when it does (only a root cgroup can, by the
//!   "no internal processes" rule), else the root of the cgroup2 mount (a root server
//!   on a systemd host, or in a container with its own cgroup namespace). A child
//!   `marsh-shim-<pid>` gets `pids.max`, `memory.max` and (when present)
//!   `memory.swap.max` 0.
//! - `cgroup1`: writable v1 `pids` (and `memory`) hierarchies, as root on v1/hybrid hosts.
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
const GROUP_PREFIX: &str = "marsh-shim-";

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
    /// True when no group exists and rlimits stand in.
    rlimit_mode: bool,
}

impl Limits {
    /// Makes this daemon's groups (first removing empty ones of dead daemons); falls
    /// back to rlimits when a group cannot be made.
    pub fn establish(config: &BackendConfig) -> Limits {
        let parents = Parents::find();
        let name = format!("{GROUP_PREFIX}{}", std::process::id());
        match make_groups(&parents, &name, config) {
            Ok(Some((dirs, procs))) => Limits {
                report: report(parents.mechanism(), config),
                procs,
                dirs,
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

type Groups = (Vec<PathBuf>, Vec<File>);

fn make_groups(
    parents: &Parents,
    name: &str,
    config: &BackendConfig,
) -> std::io::Result<Option<Groups>> {
    let pids = config.pids_max.to_string();
    let memory = config.memory_max_bytes().to_string();
    let (mut dirs, mut procs) = (Vec::new(), Vec::new());
    let mut make = |parent: &Path, settings: &[(&str, &str)]| -> std::io::Result<()> {
        remove_stale(parent);
        let dir = parent.join(name);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        dirs.push(dir.clone());
        for (file, value) in settings {
            match File::options().write(true).open(dir.join(file)) {
                Ok(mut f) => f.write_all(value.as_bytes())?,
                // Swap accounting is optional (a kernel without it lacks the file).
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound && *file == "memory.swap.max" => {}
                Err(e) => return Err(e),
            }
        }
        procs.push(File::options().write(true).open(dir.join("cgroup.procs"))?);
        Ok(())
    };
    let result = match parents {
        Parents::None => return Ok(None),
        Parents::V2 { parent, memory: m } => {
            let mut settings = vec![("pids.max", pids.as_str())];
            if *m {
                settings.push(("memory.max", memory.as_str()));
                settings.push(("memory.swap.max", "0"));
            }
            make(parent, &settings)
        }
        Parents::V1 { pids: p, memory: m } => {
            make(p, &[("pids.max", pids.as_str())]).and_then(|()| match m {
                Some(m) => make(m, &[("memory.limit_in_bytes", memory.as_str())]),
                None => Ok(()),
            })
        }
    };
    match result {
        Ok(()) => Ok(Some((dirs, procs))),
        Err(e) => {
            for dir in &dirs {
                let _ = fs::remove_dir(dir);
            }
            Err(e)
        }
    }
}

/// A group younger than this is never taken for stale: its daemon may live in another
/// pid namespace (where its pid means nothing here) and not have started a sandbox yet.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the empty groups of daemons that are gone (a SIGKILLed daemon leaves its
/// group behind). Only an old group whose pid is not alive here is tried, and `rmdir`
/// itself refuses a group that holds any process.
fn remove_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(GROUP_PREFIX))
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
        if old && pid != std::process::id() && !util::process_alive(pid) {
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
