//! Isolation: which confinement is in force, the bubblewrap layout shared by the
//! project shell and kit job containers, and the fixed job environment.
//!
//! Layout invariants, whatever uid the server runs as:
//! - a user namespace (the server's uid mapped to itself, so workspace files keep its
//!   ownership) with no capability in the host's namespaces: kit containers hold none at
//!   all; the project shell's agent keeps `CAP_SYS_ADMIN` and `CAP_SETPCAP` inside the
//!   sandbox's namespace only, to give each job its own pid namespace, and drops both
//!   before any job code runs (`agent::container`);
//! - `no_new_privs` (bubblewrap always sets it) and the seccomp filter of
//!   [`crate::seccomp`];
//! - the workspace is the only writable host directory; the system directories and the
//!   sandbox root are read-only; `/tmp` and `/run` are private tmpfs; the project
//!   shell's `HOME` is the scope's guest home ([`guest_home`]), a kit container's a
//!   private tmpfs; directories a person exposes are read-only, their secrets covered
//!   ([`exposed`]);
//!   in every job's `/proc`, `/proc/sys`, `/proc/sysrq-trigger`, `/proc/irq`,
//!   `/proc/bus`, `/proc/fs` are read-only and kernel-revealing files are masked (by
//!   bubblewrap for a kit container, by each job container's init in the shell); `/sys`
//!   is absent; `/etc` shows only an allowlist of public names ([`etc`]), and what
//!   others cannot read inside an allowed directory is covered ([`hidden`]);
//! - an own network namespace with loopback only, unless the backend setting says host;
//! - nothing else of the host (no marsh home, scope root, token or daemon socket).

mod etc;
mod exposed;
mod guest_home;
mod hidden;
mod spawn;

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use crate::config::{BackendConfig, Network};
use crate::error::{Error, Result};
use crate::limits::Limits;
use crate::proto::EnvVar;

pub use etc::{EtcMount, EtcView};
pub use exposed::{Exposed, Keep};
pub use guest_home::prepare_mount_points;
pub use spawn::{CONTAINER_OOM_SCORE_ADJ, JOB_OOM_SCORE_ADJ, JOB_UMASK, SeccompFd};

/// Where the agent binary, its socket, the kit wrappers and the shell's own commands
/// (`mcp`) live inside the shell (read-only inside every job's container; absent from
/// kit containers, whose `/run` is a fresh tmpfs).
pub const SANDBOX_AGENT_DIR: &str = "/run/marsh";
pub const SANDBOX_AGENT: &str = "/run/marsh/agent";
pub const SANDBOX_KIT_SOCKET: &str = "/run/marsh/kit.sock";
pub const SANDBOX_KIT_DIR: &str = "/run/marsh/kits";
pub const SANDBOX_BIN_DIR: &str = "/run/marsh/bin";
/// Where a kit container finds `marshd` for `guard-exec` (set-id guard only): outside
/// `/run/marsh`, which a kit container never has.
pub const SANDBOX_GUARD_EXEC: &str = "/run/marsh-guard-exec";

/// Host directories bound read-only (or recreated as symlinks) when present; `/etc`
/// is built apart ([`EtcView`]).
const SYSTEM_PATHS: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];
/// A job home must not shadow these.
const RESERVED_PREFIXES: [&str; 11] = [
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/dev", "/sys",
];
const BWRAP_CANDIDATES: [&str; 3] = ["/usr/bin/bwrap", "/usr/local/bin/bwrap", "/bin/bwrap"];

/// `/proc` entries made read-only in every sandbox (Docker's list): writable by the
/// server's uid, they would change the host kernel (`/proc/sys/kernel/core_pattern`
/// runs a program as host root on the next crash; `/proc/sysrq-trigger` can reboot).
pub const PROC_READ_ONLY: [&str; 5] = ["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// `/proc` files replaced by an empty file: kernel memory, keys, timing internals and
/// the allocator and page tables (the container runtimes' masked paths, plus the
/// files that are mode 0400 on the host: a job runs as the server's uid, which may be
/// root, and owner-readable means readable to it).
pub const PROC_MASKED_FILES: [&str; 12] = [
    "kcore",
    "keys",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "slabinfo",
    "vmallocinfo",
    "pagetypeinfo",
    "kpageflags",
    "kpagecount",
    "kpagecgroup",
];
/// `/proc` directories replaced by an empty read-only tmpfs (`tty/driver` holds the
/// root-only serial line state).
pub const PROC_MASKED_DIRS: [&str; 4] = ["acpi", "asound", "scsi", "tty/driver"];

/// The variables a job takes from `marsh`'s own environment.
pub const CALLER_VARS: [&str; 4] = ["PATH", "HOME", "USER", "LOGNAME"];
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The one fix for a missing bubblewrap, as `status`, `doctor` and `marsh` say it.
pub const BWRAP_FIX: &str = "install bubblewrap (apt-get install bubblewrap)";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    Bwrap(PathBuf),
    Unconfined,
}

impl Isolation {
    /// bubblewrap from the `bwrap` setting (an absolute path, used only if it is a file)
    /// or the standard locations; without it, unconfined only with the explicit
    /// `"unconfined": true` setting.
    pub fn detect(config: &BackendConfig) -> Result<Self> {
        let candidates: Vec<PathBuf> = match &config.bwrap {
            Some(path) => vec![path.clone()],
            None => BWRAP_CANDIDATES.iter().map(PathBuf::from).collect(),
        };
        if let Some(found) = candidates
            .into_iter()
            .find(|p| p.is_absolute() && fs::metadata(p).map(|m| m.is_file()).unwrap_or(false))
        {
            return Ok(Isolation::Bwrap(found));
        }
        if config.unconfined {
            return Ok(Isolation::Unconfined);
        }
        Err(Error::Backend(format!(
            "bubblewrap (bwrap) is not installed and jobs never run unconfined by default; {BWRAP_FIX}"
        )))
    }

    pub fn label(&self) -> &'static str {
        match self {
            Isolation::Bwrap(_) => "bwrap",
            Isolation::Unconfined => "unconfined",
        }
    }
}

/// What every sandbox of one daemon shares: settings, the seccomp program, the group
/// and the job's `/etc`.
pub struct Confinement {
    pub network: Network,
    pub limits: Limits,
    seccomp: SeccompFd,
    pub etc: EtcView,
    /// Whether this bubblewrap takes `--size` (0.5 and later); without it tmpfs are
    /// unsized (the daemon logs it at boot).
    sized_tmpfs: bool,
}

impl Confinement {
    pub fn new(
        config: &BackendConfig,
        limits: Limits,
        isolation: &Isolation,
    ) -> Result<Confinement> {
        let sized_tmpfs = match isolation {
            Isolation::Bwrap(bwrap) => takes_size(bwrap),
            Isolation::Unconfined => false,
        };
        Ok(Confinement {
            network: config.network,
            limits,
            seccomp: SeccompFd::new()?,
            etc: EtcView::scan(Path::new("/etc")),
            sized_tmpfs,
        })
    }
}

/// Whether `bwrap --help` lists `--size`.
fn takes_size(bwrap: &Path) -> bool {
    let listed = Command::new(bwrap)
        .arg("--help")
        .env_clear()
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("--size"));
    if !listed {
        crate::util::log!(
            "marshd: this bubblewrap has no --size (0.5 or later has): tmpfs in sandboxes are unsized"
        );
    }
    listed
}

/// Which kind of sandbox to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The project shell: its agent keeps the two capabilities it needs to contain jobs.
    Shell,
    /// A kit job container: no capability at all.
    Kit,
}

/// One sandbox to build.
pub struct Layout<'a> {
    pub role: Role,
    pub workspace: &'a Path,
    /// Mounted when [`home_is_mountable`].
    pub job_home: Option<JobHome<'a>>,
    /// Host directories bound read-only at their own paths, after the home.
    pub exposed: Option<&'a Exposed>,
    pub hostname: &'a str,
    /// Open host files (descriptors) bound read-only at fixed in-sandbox paths: by
    /// descriptor, so what is bound is the file that was opened, whatever its path
    /// names by the time bubblewrap runs.
    pub ro_files: Vec<(RawFd, &'static str)>,
    /// Descriptors the sandbox's first program inherits as they are (a kit's
    /// `guard-exec` gets its guard socket so); close-on-exec everywhere else.
    pub pass_fds: Vec<RawFd>,
}

/// Where a job's `HOME` is and what backs it.
#[derive(Debug, Clone, Copy)]
pub struct JobHome<'a> {
    /// The path jobs know as `HOME`.
    pub at: &'a Path,
    /// The directory bound there, writable and kept; `None`: a private tmpfs.
    pub backing: Option<&'a Path>,
}

/// A bubblewrap command for `layout` running `argv` with exactly `env`, plus the
/// seccomp descriptor it reads (keep it until the command is spawned). The sandbox
/// dies with the thread that spawns it (`--die-with-parent`), so spawn it from a thread
/// that outlives it.
pub fn bwrap_command(
    bwrap: &Path,
    confinement: &Confinement,
    layout: &Layout<'_>,
    env: &[(OsString, OsString)],
    argv: &[OsString],
) -> Result<(Command, OwnedFd)> {
    let seccomp = confinement.seccomp.reopen()?;
    let mut cmd = Command::new(bwrap);
    cmd.args(bwrap_args(
        confinement,
        layout,
        seccomp.as_raw_fd(),
        env,
        argv,
    ))
    .env_clear()
    .current_dir("/");
    let mut inherited = vec![seccomp.as_raw_fd()];
    inherited.extend(layout.ro_files.iter().map(|(fd, _)| *fd));
    inherited.extend(layout.pass_fds.iter().copied());
    spawn::prepare(
        &mut cmd,
        inherited,
        &confinement.limits,
        layout.role == Role::Shell,
    );
    Ok((cmd, seccomp))
}

/// Puts an unconfined sandbox process in the scope's limits, with the jobs' umask.
pub fn prepare_unconfined(cmd: &mut Command, confinement: &Confinement) {
    spawn::prepare(cmd, Vec::new(), &confinement.limits, false);
}

fn bwrap_args(
    confinement: &Confinement,
    layout: &Layout<'_>,
    seccomp_fd: i32,
    env: &[(OsString, OsString)],
    argv: &[OsString],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| args.extend(items.iter().map(|s| s.to_os_string()));
    push(&[
        "--die-with-parent".as_ref(),
        "--unshare-user".as_ref(),
        "--unshare-pid".as_ref(),
        "--unshare-ipc".as_ref(),
        "--unshare-uts".as_ref(),
        "--unshare-cgroup-try".as_ref(),
        "--new-session".as_ref(),
        "--cap-drop".as_ref(),
        "ALL".as_ref(),
        "--hostname".as_ref(),
        layout.hostname.as_ref(),
    ]);
    if layout.role == Role::Shell {
        push(&[
            "--cap-add".as_ref(),
            "CAP_SYS_ADMIN".as_ref(),
            "--cap-add".as_ref(),
            "CAP_SETPCAP".as_ref(),
        ]);
    }
    match confinement.network {
        Network::Loopback => push(&["--unshare-net".as_ref()]),
        Network::Host => {}
    }
    let fd = seccomp_fd.to_string();
    push(&["--seccomp".as_ref(), fd.as_ref()]);
    for path in SYSTEM_PATHS {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = fs::read_link(path) {
                    push(&["--symlink".as_ref(), target.as_os_str(), path.as_ref()]);
                }
            }
            Ok(meta) if meta.is_dir() => {
                push(&["--ro-bind".as_ref(), path.as_ref(), path.as_ref()])
            }
            _ => {}
        }
    }
    for mount in &confinement.etc.mounts {
        match mount {
            EtcMount::Bind { host, at } => {
                push(&["--ro-bind".as_ref(), host.as_os_str(), at.as_os_str()])
            }
            EtcMount::Symlink { target, at } => {
                push(&["--symlink".as_ref(), target.as_os_str(), at.as_os_str()])
            }
        }
    }
    for hidden in &confinement.etc.hidden {
        push(&hidden.cover_args());
    }
    push(&["--proc".as_ref(), "/proc".as_ref()]);
    // The project shell's /proc stays uncovered here: each job's container mounts a
    // /proc of its own and covers it the same way before the job exists
    // (`agent::init`); only the agent, never a job, sees this one. Covering it here
    // would make those mounts fail for a server that is not root: bubblewrap then runs
    // the sandbox in a user namespace nested in the one that made the covers, so they
    // are locked, and the kernel refuses a new /proc instance while an existing one is
    // partly hidden by locked mounts (EPERM).
    if layout.role == Role::Kit {
        for arg in proc_cover() {
            push(&[arg.as_os_str()]);
        }
    }
    // Every tmpfs is charged to the scope's memory and sized so that all of them
    // together stay below its limit: filling them ends in ENOSPC for the writer, never
    // in an out-of-memory kill of whatever else runs in the scope. `/dev` itself
    // (bubblewrap's tmpfs of device nodes) is made read-only once `/dev/shm` is in.
    let sizes = TmpfsSizes::for_sandbox(confinement.limits.report(), layout.role);
    let (tmp, run, shm) = (
        sizes.tmp.to_string(),
        sizes.run.to_string(),
        sizes.shm.to_string(),
    );
    let home = layout
        .job_home
        .filter(|h| home_is_mountable(h.at))
        .map(|h| match h.backing {
            Some(_) if !home_is_backable(h.at) => JobHome { backing: None, ..h },
            _ => h,
        });
    let home_tmpfs = home
        .filter(|h| h.backing.is_none())
        .map(|h| (sizes.home.to_string(), h.at.as_os_str()));
    push(&["--dev".as_ref(), "/dev".as_ref()]);
    let mounts = [
        Some((shm, OsStr::new("/dev/shm"))),
        Some((tmp, OsStr::new("/tmp"))),
        Some((run, OsStr::new("/run"))),
        home_tmpfs,
    ];
    for (size, at) in mounts.into_iter().flatten() {
        if confinement.sized_tmpfs {
            push(&["--size".as_ref(), size.as_ref()]);
        }
        push(&["--tmpfs".as_ref(), at]);
        if at == "/dev/shm" {
            push(&["--remount-ro".as_ref(), "/dev".as_ref()]);
        }
    }
    if let Some(JobHome {
        at,
        backing: Some(backing),
    }) = home
    {
        push(&["--bind".as_ref(), backing.as_os_str(), at.as_os_str()]);
    }
    if let Some(exposed) = layout.exposed {
        for dir in &exposed.dirs {
            push(&[
                "--ro-bind".as_ref(),
                dir.source.as_os_str(),
                dir.at.as_os_str(),
            ]);
        }
        for hidden in &exposed.hidden {
            push(&hidden.cover_args());
        }
    }
    let ws = layout.workspace.as_os_str();
    push(&["--bind".as_ref(), ws, ws]);
    for (fd, dst) in &layout.ro_files {
        let fd = fd.to_string();
        push(&["--ro-bind-fd".as_ref(), fd.as_ref(), dst.as_ref()]);
    }
    // The sandbox's own root (holding only mount points) is read-only too.
    push(&["--remount-ro".as_ref(), "/".as_ref()]);
    push(&["--chdir".as_ref(), ws, "--clearenv".as_ref()]);
    for (name, value) in env {
        push(&["--setenv".as_ref(), name, value]);
    }
    push(&["--".as_ref()]);
    args.extend(argv.iter().cloned());
    args
}

/// The size of each tmpfs of a sandbox, in bytes. The budget is the scope's memory
/// limit, or the ceiling all scopes share when that is lower. The project shell gets
/// `/tmp` a quarter of it, the job home an eighth, `/dev/shm` a sixteenth, `/run` a
/// 128th (57/128 in all); a kit container an eighth of each (57/1024), so the shell and
/// four kit containers at once (the operation cap) fill under 70% of the budget and
/// the scope's processes keep the rest however full the files are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmpfsSizes {
    pub tmp: u64,
    pub home: u64,
    pub shm: u64,
    pub run: u64,
}

impl TmpfsSizes {
    pub fn for_sandbox(limits: &crate::limits::LimitsReport, role: Role) -> TmpfsSizes {
        let budget = limits
            .ceiling_bytes
            .map_or(limits.memory_max_bytes, |c| c.min(limits.memory_max_bytes));
        let share = match role {
            Role::Shell => 1,
            Role::Kit => 8,
        };
        // Page multiples: the kernel rounds a tmpfs size up to whole pages anyway.
        let part = |divisor: u64| (budget / (divisor * share)) & !4095;
        TmpfsSizes {
            tmp: part(4),
            home: part(8),
            shm: part(16),
            run: part(128),
        }
    }
}

/// A job home can be a private tmpfs when it is absolute, normal, not `/`, and does
/// not shadow a system directory.
pub fn home_is_mountable(home: &Path) -> bool {
    home.is_absolute()
        && home
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && home != Path::new("/")
        && !RESERVED_PREFIXES.iter().any(|p| home.starts_with(p))
}

/// A mountable job home can also be backed by a kept directory when no fixed file of
/// the sandbox is mounted at or under it after it (`/run/marsh/agent`, the guard's
/// `/run/marsh-guard-exec`): bubblewrap would create those mount points in a directory
/// jobs wrote, following any link a job left there. Such a home is a private tmpfs.
pub fn home_is_backable(home: &Path) -> bool {
    let fixed = [Path::new(SANDBOX_AGENT_DIR), Path::new(SANDBOX_GUARD_EXEC)];
    !fixed
        .iter()
        .any(|f| f.starts_with(home) || home.starts_with(f))
}

/// The fixed job environment: `PATH` (with `dirs` first, in order: the shell's own
/// commands, then the kit wrappers), `HOME`, `USER`, `LOGNAME` from the caller,
/// `LANG=C.UTF-8`, `TERM=dumb`.
pub fn job_env(caller: &[EnvVar], dirs: &[&Path]) -> Vec<(OsString, OsString)> {
    let path = caller_value(caller, "PATH").unwrap_or_else(|| DEFAULT_PATH.as_bytes().to_vec());
    let mut full_path = Vec::new();
    for dir in dirs {
        full_path.extend_from_slice(dir.as_os_str().as_bytes());
        full_path.push(b':');
    }
    full_path.extend_from_slice(&path);
    finish_env(caller, full_path)
}

/// The environment of a kit job: like [`job_env`] but with the shell's directories
/// (`strip`) removed from `PATH`: they do not exist in a kit's container.
pub fn kit_env(caller: &[EnvVar], strip: &[&Path]) -> Vec<(OsString, OsString)> {
    let path = caller_value(caller, "PATH").unwrap_or_else(|| DEFAULT_PATH.as_bytes().to_vec());
    let kept: Vec<&[u8]> = path
        .split(|b| *b == b':')
        .filter(|entry| !strip.iter().any(|dir| *entry == dir.as_os_str().as_bytes()))
        .collect();
    finish_env(caller, kept.join(&b':'))
}

fn finish_env(caller: &[EnvVar], path: Vec<u8>) -> Vec<(OsString, OsString)> {
    let mut env = vec![(OsString::from("PATH"), OsString::from_vec(path))];
    for name in ["HOME", "USER", "LOGNAME"] {
        if let Some(value) = caller_value(caller, name) {
            env.push((OsString::from(name), OsString::from_vec(value)));
        }
    }
    env.push(("LANG".into(), "C.UTF-8".into()));
    env.push(("TERM".into(), "dumb".into()));
    env
}

fn caller_value(caller: &[EnvVar], name: &str) -> Option<Vec<u8>> {
    caller
        .iter()
        .find(|v| v.name.0 == name.as_bytes())
        .map(|v| v.value.0.clone())
        .filter(|v| !v.contains(&0))
}

/// `HOME` of a job environment, if any.
pub fn env_home(env: &[(OsString, OsString)]) -> Option<PathBuf> {
    env.iter()
        .find(|(k, _)| k == "HOME")
        .map(|(_, v)| PathBuf::from(v))
}

/// bubblewrap arguments covering `/proc` (the kit containers'; the shell's containers
/// cover their own): `/proc/sys` and friends bound read-only whatever bubblewrap could
/// write at setup (the source is the host's /proc, the same kernel tables, read-only),
/// kernel-revealing files and directories masked.
fn proc_cover() -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    let push = |out: &mut Vec<OsString>, items: &[&OsStr]| {
        out.extend(items.iter().map(|s| s.to_os_string()));
    };
    for name in PROC_READ_ONLY {
        let path = format!("/proc/{name}");
        push(
            &mut out,
            &["--ro-bind-try".as_ref(), path.as_ref(), path.as_ref()],
        );
    }
    for name in PROC_MASKED_FILES {
        let path = format!("/proc/{name}");
        if Path::new(&path).exists() {
            push(
                &mut out,
                &["--ro-bind".as_ref(), "/dev/null".as_ref(), path.as_ref()],
            );
        }
    }
    for name in PROC_MASKED_DIRS {
        let path = format!("/proc/{name}");
        if Path::new(&path).is_dir() {
            push(
                &mut out,
                &[
                    "--tmpfs".as_ref(),
                    path.as_ref(),
                    "--remount-ro".as_ref(),
                    path.as_ref(),
                ],
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::proto::Bytes;

    /// The bubblewrap arguments of `layout` (default settings, unconfined limits), as
    /// text.
    fn args_of(layout: &Layout<'_>) -> Vec<String> {
        let config = BackendConfig::default();
        let confinement =
            Confinement::new(&config, Limits::rlimits(&config), &Isolation::Unconfined).unwrap();
        bwrap_args(&confinement, layout, 9, &[], &["true".into()])
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn var(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: Bytes(name.as_bytes().to_vec()),
            value: Bytes(value.as_bytes().to_vec()),
        }
    }

    #[test]
    fn job_env_is_fixed() {
        let caller = vec![var("PATH", "/a:/b"), var("HOME", "/h"), var("SECRET", "x")];
        let env = job_env(
            &caller,
            &[Path::new("/run/marsh/bin"), Path::new("/run/marsh/kits")],
        );
        let names: Vec<_> = env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["PATH", "HOME", "LANG", "TERM"]);
        assert_eq!(env[0].1, "/run/marsh/bin:/run/marsh/kits:/a:/b");
        let kit = kit_env(
            &[var("PATH", "/run/marsh/bin:/run/marsh/kits:/a")],
            &[Path::new("/run/marsh/bin"), Path::new("/run/marsh/kits")],
        );
        assert_eq!(kit[0].1, "/a");
    }

    #[test]
    fn tmpfs_sizes_stay_below_the_memory_limit() {
        let limit = 4096u64 << 20;
        let mut report = crate::limits::LimitsReport {
            mechanism: crate::limits::Mechanism::Cgroup2,
            pids_max: 1,
            memory_max_bytes: limit,
            enforced: true,
            ceiling_bytes: None,
        };
        let total = |s: TmpfsSizes| s.tmp + s.home + s.shm + s.run;
        let shell = TmpfsSizes::for_sandbox(&report, Role::Shell);
        let kit = TmpfsSizes::for_sandbox(&report, Role::Kit);
        assert_eq!(shell.tmp, 1024 << 20);
        assert!(total(shell) + 4 * total(kit) < limit * 7 / 10);
        // A lower shared ceiling is the budget.
        report.ceiling_bytes = Some(limit / 2);
        assert_eq!(TmpfsSizes::for_sandbox(&report, Role::Shell).tmp, 512 << 20);
        report.memory_max_bytes = 1_000_001;
        assert_eq!(TmpfsSizes::for_sandbox(&report, Role::Shell).tmp % 4096, 0);
    }

    #[test]
    fn homes() {
        assert!(home_is_mountable(Path::new("/root")));
        assert!(home_is_mountable(Path::new("/home/u")));
        assert!(!home_is_mountable(Path::new("/")));
        assert!(!home_is_mountable(Path::new("/usr/x")));
        assert!(!home_is_mountable(Path::new("rel")));
        assert!(!home_is_mountable(Path::new("/home/../etc")));
        assert!(home_is_backable(Path::new("/root")));
        assert!(home_is_backable(Path::new("/run/user/0")));
        assert!(home_is_backable(Path::new("/tmp")));
        for fixed in [
            "/run",
            "/run/marsh",
            "/run/marsh/x",
            "/run/marsh-guard-exec",
        ] {
            assert!(!home_is_backable(Path::new(fixed)), "{fixed}");
        }
    }

    #[test]
    fn a_home_holding_the_shells_fixed_files_is_a_tmpfs_not_the_guest_home() {
        let layout = Layout {
            role: Role::Shell,
            workspace: Path::new("/w"),
            job_home: Some(JobHome {
                at: Path::new("/run"),
                backing: Some(Path::new("/m/home/guest/home")),
            }),
            exposed: None,
            hostname: "h",
            ro_files: vec![],
            pass_fds: vec![],
        };
        let text = args_of(&layout);
        assert!(!text.iter().any(|a| a == "/m/home/guest/home"), "{text:?}");
        let run_tmpfs = text
            .windows(2)
            .filter(|w| w[0] == "--tmpfs" && w[1] == "/run")
            .count();
        assert_eq!(run_tmpfs, 2, "{text:?}");
    }

    #[test]
    fn the_shell_home_is_the_guest_home_and_exposed_dirs_follow_it_read_only() {
        let exposed = Exposed {
            dirs: vec![exposed::ExposedDir {
                source: "/opt/rustup".into(),
                at: "/root/.rustup".into(),
            }],
            hidden: vec![hidden::Hidden::File(
                "/root/.rustup/credentials.toml".into(),
            )],
            path: vec![],
        };
        let layout = Layout {
            role: Role::Shell,
            workspace: Path::new("/root/w"),
            job_home: Some(JobHome {
                at: Path::new("/root"),
                backing: Some(Path::new("/m/home/guest/home")),
            }),
            exposed: Some(&exposed),
            hostname: "h",
            ro_files: vec![],
            pass_fds: vec![],
        };
        let text = args_of(&layout);
        let at = |needle: &[&str]| {
            text.windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} in {text:?}"))
        };
        let home = at(&["--bind", "/m/home/guest/home", "/root"]);
        let tool = at(&["--ro-bind", "/opt/rustup", "/root/.rustup"]);
        let cover = at(&["--ro-bind", "/dev/null", "/root/.rustup/credentials.toml"]);
        let ws = at(&["--bind", "/root/w", "/root/w"]);
        assert!(home < tool && tool < cover && cover < ws, "{text:?}");
        assert!(
            !text
                .windows(2)
                .any(|w| w[0] == "--tmpfs" && w[1] == "/root")
        );
    }

    #[test]
    fn layout_binds_only_the_workspace_writable() {
        let layout = Layout {
            role: Role::Kit,
            workspace: Path::new("/w"),
            job_home: Some(JobHome {
                at: Path::new("/root"),
                backing: None,
            }),
            exposed: None,
            hostname: "h",
            ro_files: vec![],
            pass_fds: vec![],
        };
        let text = args_of(&layout);
        let binds: Vec<_> = text
            .windows(2)
            .filter(|w| w[0] == "--bind")
            .map(|w| w[1].clone())
            .collect();
        assert_eq!(binds, ["/w"]);
        assert!(
            text.windows(2)
                .any(|w| w[0] == "--tmpfs" && w[1] == "/root")
        );
        assert_eq!(text.last().map(String::as_str), Some("true"));
        for flag in ["--unshare-user", "--unshare-net", "--die-with-parent"] {
            assert!(text.iter().any(|a| a == flag), "{flag}");
        }
        assert!(text.windows(2).any(|w| w[0] == "--seccomp" && w[1] == "9"));
        assert!(
            !text.iter().any(|a| a == "--cap-add"),
            "a kit container keeps no capability"
        );
        assert!(
            text.windows(3)
                .any(|w| w[0] == "--ro-bind-try" && w[1] == "/proc/sys" && w[2] == "/proc/sys")
        );
    }

    #[test]
    fn missing_bwrap_refuses_unless_unconfined() {
        let mut config = BackendConfig {
            bwrap: Some(PathBuf::from("/nonexistent/bwrap")),
            ..BackendConfig::default()
        };
        let err = Isolation::detect(&config).unwrap_err();
        assert_eq!(err.exit_code(), 126);
        assert!(
            err.to_string().contains("apt-get install bubblewrap"),
            "{err}"
        );
        config.unconfined = true;
        assert_eq!(Isolation::detect(&config).unwrap(), Isolation::Unconfined);
    }
}
