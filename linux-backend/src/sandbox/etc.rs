//! The job's `/etc`: only what programs need, chosen by name, never the host's whole
//! `/etc`.
//!
//! Invariants:
//! - Nothing under `/etc` is visible in a sandbox unless its path is on
//!   [`ETC_ALLOWLIST`] (or inside an allowed directory). So a secret replaced by rename
//!   (`passwd`, `chpasswd`, `sed -i` write a new `/etc/shadow` and rename it into
//!   place), or created after the sandbox started, is never visible: there is no
//!   mount of the host's `/etc` for a new name to appear in.
//! - An allowed entry is shown only when an unprivileged host user could read it
//!   (others may read a file; others may list and enter a directory), and inside an
//!   allowed directory what others cannot read is covered ([`super::hidden`]). Jobs run
//!   as the server's uid, which may be root, so ownership must never be what shows a
//!   file.
//! - Allowed files are bound by inode at sandbox start: a file replaced later keeps its
//!   old contents in a running shell (`scope_stop` and the next start show the new
//!   one). Allowed directories are bound whole and live: they hold public data by
//!   purpose (certificates, alternatives, fonts, package configuration readable by
//!   all), and what others could not read in them at sandbox start is covered, but a
//!   private file an administrator puts in one later is not. That is the one limit of
//!   this module; the names that hold secrets by purpose are never on the list.
//!
//! Rejected alternatives: covering each secret with an empty file (the earlier
//! design): a cover sits on a dentry, and a rename puts the new file beside it;
//! watching `/etc` and re-covering: a race, and a running sandbox's mounts cannot be
//! changed from outside without entering its namespaces.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use super::hidden::{Hidden, unreadable_under};

/// What a job's `/etc` may show, relative to `/etc`. A trailing `*` matches every
/// entry of that directory starting with the text before it (versioned package
/// directories such as `java-17-openjdk`, `python3.11`).
///
/// Left out on purpose: `shadow`, `gshadow` and their backups, `sudoers*`, `ssh` host
/// keys, `ssl/private`, `environment`, `npmrc` and `pip.conf` (registry tokens),
/// `machine-id`, and everything a daemon or the boot reads (`systemd`, `cron*`, `pam*`,
/// `security`, `default`, `apt`, `dpkg`).
pub const ETC_ALLOWLIST: &[&str] = &[
    // Users, groups, names and the resolver.
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "hostname",
    "resolv.conf",
    "gai.conf",
    "services",
    "protocols",
    "networks",
    "ethertypes",
    "rpc",
    "netconfig",
    // The dynamic linker.
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    // Time, locale, terminal.
    "localtime",
    "timezone",
    "locale.alias",
    "locale.conf",
    "locale.gen",
    "terminfo",
    "inputrc",
    // Certificates.
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/ca-trust/extracted",
    // System identity.
    "os-release",
    "lsb-release",
    "debian_version",
    "issue",
    "shells",
    "login.defs",
    "mtab",
    // Shells and everyday tools.
    "profile",
    "profile.d",
    "bash.bashrc",
    "bash_completion.d",
    "zsh",
    "alternatives",
    "mime.types",
    "magic",
    "magic.mime",
    "gitconfig",
    "ssh/ssh_config",
    "ssh/ssh_config.d",
    "ssh/ssh_known_hosts",
    "wgetrc",
    "manpath.config",
    "groff",
    "vim",
    "gdb",
    "xattr.conf",
    "mke2fs.conf",
    "fonts",
    "xml",
    "sgml",
    "xdg",
    "ldap",
    // Language runtimes whose installed trees link here.
    "java-*",
    "maven",
    "python3*",
    "perl",
    "php",
    "R",
    "ImageMagick-*",
];

/// One mount that builds the job's `/etc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcMount {
    /// Bind the host path (a file or directory, symlinks resolved) read-only at `at`.
    Bind { host: PathBuf, at: PathBuf },
    /// Recreate a symlink whose target the sandbox shows anyway (`localtime` →
    /// `/usr/share/zoneinfo/…`, `os-release` → `../usr/lib/os-release`).
    Symlink { target: PathBuf, at: PathBuf },
}

/// The job's `/etc`, scanned once per daemon boot.
#[derive(Debug, Clone, Default)]
pub struct EtcView {
    pub mounts: Vec<EtcMount>,
    /// Unreadable entries inside allowed directories, covered after the binds.
    pub hidden: Vec<Hidden>,
}

/// Top-level directories every sandbox shows read-only: a symlink into one of them can
/// stay a symlink.
const SHOWN_ELSEWHERE: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
];

impl EtcView {
    /// The view of the host directory `etc`, mounted at `/etc` in the sandbox.
    pub fn scan(etc: &Path) -> EtcView {
        let mut view = EtcView::default();
        for pattern in ETC_ALLOWLIST {
            for rel in expand(etc, pattern) {
                view.add(etc, &rel);
            }
        }
        view
    }

    /// The allowed names this host shows, for `status` (relative to `/etc`).
    pub fn shown_names(&self) -> Vec<String> {
        self.mounts
            .iter()
            .map(|m| match m {
                EtcMount::Bind { at, .. } | EtcMount::Symlink { at, .. } => at,
            })
            .filter_map(|at| at.strip_prefix("/etc").ok())
            .map(|rel| rel.to_string_lossy().into_owned())
            .collect()
    }

    fn add(&mut self, etc: &Path, rel: &Path) {
        let host = etc.join(rel);
        let at = Path::new("/etc").join(rel);
        let Ok(meta) = fs::symlink_metadata(&host) else {
            return;
        };
        if meta.file_type().is_symlink() {
            let Ok(target) = fs::read_link(&host) else {
                return;
            };
            let parent = at.parent().unwrap_or(Path::new("/etc"));
            if let Some(lexical) = lexical_target(parent, &target)
                && SHOWN_ELSEWHERE.iter().any(|top| lexical.starts_with(top))
            {
                self.mounts.push(EtcMount::Symlink { target, at });
                return;
            }
            // A link elsewhere (`resolv.conf` → `/run/…`): what it names now, if public.
            let Ok(resolved) = fs::canonicalize(&host) else {
                return;
            };
            self.add_public(resolved, at);
            return;
        }
        self.add_public(host, at);
    }

    fn add_public(&mut self, host: PathBuf, at: PathBuf) {
        let Ok(meta) = fs::metadata(&host) else {
            return;
        };
        // Readable by others means reachable by them too: a link that leads into a
        // private directory (`/root/...`) shows nothing.
        let reachable = host
            .ancestors()
            .skip(1)
            .all(|dir| fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
        if !reachable {
            return;
        }
        let mode = meta.permissions().mode();
        if meta.is_file() && mode & 0o004 != 0 {
            self.mounts.push(EtcMount::Bind { host, at });
        } else if meta.is_dir() && mode & 0o005 == 0o005 {
            for covered in unreadable_under(&host) {
                self.hidden.push(relocate(covered, &host, &at));
            }
            self.mounts.push(EtcMount::Bind { host, at });
        }
    }
}

/// The relative paths `pattern` names under `etc` (itself, or the matches of a
/// trailing `*` in its directory).
fn expand(etc: &Path, pattern: &str) -> Vec<PathBuf> {
    let Some(stem) = pattern.strip_suffix('*') else {
        return vec![PathBuf::from(pattern)];
    };
    let rel = Path::new(stem);
    let (dir, prefix) = match (rel.parent(), rel.file_name()) {
        (Some(dir), Some(name)) if !stem.ends_with('/') => (dir.to_path_buf(), name.to_owned()),
        _ => (rel.to_path_buf(), Default::default()),
    };
    let Ok(entries) = fs::read_dir(etc.join(&dir)) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.file_name())
        .filter(|name| {
            name.as_encoded_bytes()
                .starts_with(prefix.as_encoded_bytes())
        })
        .map(|name| dir.join(name))
        .collect();
    found.sort();
    found
}

/// `target` resolved against `parent` without following links, or `None` when it
/// climbs above `/`.
fn lexical_target(parent: &Path, target: &Path) -> Option<PathBuf> {
    let mut out = if target.is_absolute() {
        PathBuf::from("/")
    } else {
        parent.to_path_buf()
    };
    for component in target.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// A cover found under the host directory `from`, moved to the same place under `to`.
fn relocate(hidden: Hidden, from: &Path, to: &Path) -> Hidden {
    let moved = |path: PathBuf| match path.strip_prefix(from) {
        Ok(rel) => to.join(rel),
        Err(_) => path,
    };
    match hidden {
        Hidden::File(path) => Hidden::File(moved(path)),
        Hidden::Dir(path) => Hidden::Dir(moved(path)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::symlink;

    fn mode(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn only_allowed_public_names_are_shown() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path();
        for name in ["passwd", "group", "shadow", "npmrc", "unknown.conf"] {
            fs::write(etc.join(name), "x").unwrap();
        }
        mode(&etc.join("shadow"), 0o640);
        fs::create_dir_all(etc.join("ssl/certs")).unwrap();
        fs::create_dir_all(etc.join("ssl/private")).unwrap();
        fs::write(etc.join("ssl/certs/ca.pem"), "x").unwrap();
        fs::write(etc.join("ssl/certs/key.pem"), "x").unwrap();
        mode(&etc.join("ssl/certs/key.pem"), 0o600);
        fs::create_dir(etc.join("java-17-openjdk")).unwrap();
        fs::create_dir(etc.join("java-21-openjdk")).unwrap();
        symlink("/usr/share/zoneinfo/Etc/UTC", etc.join("localtime")).unwrap();
        symlink("../usr/lib/os-release", etc.join("os-release")).unwrap();
        fs::write(etc.join("real-resolv"), "nameserver 10.0.0.1").unwrap();
        symlink(etc.join("real-resolv"), etc.join("resolv.conf")).unwrap();
        // A link into a directory others cannot enter shows nothing.
        fs::create_dir(etc.join("private")).unwrap();
        fs::write(etc.join("private/hosts"), "x").unwrap();
        mode(&etc.join("private"), 0o700);
        symlink(etc.join("private/hosts"), etc.join("hosts")).unwrap();
        // An allowed name that is not public is not shown.
        fs::write(etc.join("gitconfig"), "x").unwrap();
        mode(&etc.join("gitconfig"), 0o600);

        let view = EtcView::scan(etc);
        let mut names = view.shown_names();
        names.sort();
        assert_eq!(
            names,
            [
                "group",
                "java-17-openjdk",
                "java-21-openjdk",
                "localtime",
                "os-release",
                "passwd",
                "resolv.conf",
                "ssl/certs"
            ]
        );
        assert!(view.mounts.contains(&EtcMount::Symlink {
            target: "/usr/share/zoneinfo/Etc/UTC".into(),
            at: "/etc/localtime".into()
        }));
        assert!(view.mounts.contains(&EtcMount::Bind {
            host: fs::canonicalize(etc.join("real-resolv")).unwrap(),
            at: "/etc/resolv.conf".into()
        }));
        assert_eq!(view.hidden, [Hidden::File("/etc/ssl/certs/key.pem".into())]);
    }

    #[test]
    fn symlinks_resolve_lexically() {
        let etc = Path::new("/etc");
        assert_eq!(
            lexical_target(etc, Path::new("../usr/lib/os-release")),
            Some(PathBuf::from("/usr/lib/os-release"))
        );
        assert_eq!(lexical_target(etc, Path::new("../../../proc/mounts")), None);
        assert_eq!(
            lexical_target(etc, Path::new("/run/x")),
            Some(PathBuf::from("/run/x"))
        );
    }
}
