//! Issue 22's attacks from the host's ordinary life, black-box and as root (where they
//! matter): a secret in `/etc` replaced by rename or created while a shell runs, and a
//! set-id file the host puts in the workspace.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use marsh_tests::{Sandbox, Server};

use super::hardening::doctor_check;
use super::sandbox::server_with;
use serde_json::{Value, json};

fn run(s: &mut Server, command: &str) -> Value {
    s.ok("shell_run", json!({ "command": command }))
}

fn stdout(data: &Value) -> &str {
    data["stdout_text"].as_str().unwrap_or_default()
}

/// The detail of `doctor`'s `isolation` check, which must pass.
fn isolation_detail(s: &mut Server) -> String {
    let isolation = doctor_check(s, "isolation");
    assert_eq!(isolation["ok"], true, "{isolation}");
    isolation["detail"].as_str().unwrap().to_string()
}

fn write_mode(path: &Path, text: &str, mode: u32) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// `serve --home` in a private mount namespace whose `/etc` is `etc` (bound over it
/// there only): the host's real `/etc` is never touched.
fn serve_with_etc(sb: &Sandbox, etc: &Path) -> Server {
    let inner = sb.marsh_mcp(&sb.serve_home_args(&[]), &[]);
    let mut cmd = Command::new("/usr/bin/unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg("mount --bind \"$0\" /etc && exec \"$@\"")
        .arg(etc)
        .arg(inner.get_program())
        .args(inner.get_args())
        .env_clear();
    for (name, value) in inner.get_envs() {
        if let Some(value) = value {
            cmd.env(name, value);
        }
    }
    cmd.current_dir(inner.get_current_dir().unwrap());
    Server::spawn_initialized(cmd)
}

/// A copy of `/etc` in which `shadow` holds `secret` (mode 0640, as Debian's), made
/// with `cp -a` so every other entry keeps its mode.
fn etc_copy(sb: &Sandbox, secret: &str) -> std::path::PathBuf {
    let etc = sb.state().join("etc");
    let status = Command::new("cp")
        .args(["-a", "/etc"])
        .arg(&etc)
        .status()
        .unwrap();
    assert!(status.success());
    for name in ["shadow", "gshadow", "shadow-", "gshadow-"] {
        let _ = fs::remove_file(etc.join(name));
    }
    write_mode(&etc.join("shadow"), secret, 0o640);
    etc
}

/// `passwd`/`chpasswd`/`sed -i` replace `/etc/shadow` by rename while the shell runs,
/// and a new secret appears in `/etc` after boot: neither is visible to a job, while
/// the names programs need (`passwd`, `hosts`, certificates) are; `doctor` states the
/// policy.
#[test]
fn etc_secrets_replaced_by_rename_or_created_later_stay_invisible() {
    if marsh_tests::skip_unless_root("a private mount namespace with a copy of /etc") {
        return;
    }
    let sb = Sandbox::new();
    let etc = etc_copy(&sb, "root:MARSH-SECRET-AT-BOOT:19000:0:99999:7:::\n");
    let mut s = serve_with_etc(&sb, &etc);
    let probe = "cat /etc/shadow 2>/dev/null; cat /etc/late-secret.key 2>/dev/null; \
                 ls /etc/shadow /etc/late-secret.key 2>/dev/null; echo end";
    let first = run(&mut s, probe);
    assert!(!stdout(&first).contains("MARSH-SECRET"), "{first}");

    // A password change: a new file renamed over the old, while the shell runs.
    write_mode(
        &etc.join("nshadow"),
        "root:MARSH-SECRET-RENAMED:19001:0:99999:7:::\n",
        0o640,
    );
    fs::rename(etc.join("nshadow"), etc.join("shadow")).unwrap();
    write_mode(&etc.join("late-secret.key"), "MARSH-SECRET-LATE\n", 0o600);
    let after = run(&mut s, probe);
    assert!(
        !stdout(&after).contains("MARSH-SECRET"),
        "a secret replaced by rename or created after boot is visible: {after}"
    );
    // Not even the names: /etc holds only what the allowlist names.
    assert_eq!(stdout(&first), "end\n", "{first}");
    assert_eq!(stdout(&after), "end\n", "{after}");

    let everyday = run(
        &mut s,
        "grep -c '^root:' /etc/passwd; grep -q localhost /etc/hosts && echo hosts; \
         id -un; ls /etc/ssl/certs | grep -q . && echo certs; [ -e /etc/ssh/ssh_host_rsa_key ] || echo no-host-key",
    );
    assert_eq!(
        stdout(&everyday),
        "1\nhosts\nroot\ncerts\nno-host-key\n",
        "{everyday}"
    );

    let detail = isolation_detail(&mut s);
    let detail = detail.as_str();
    assert!(
        detail.contains("/etc shows only an allowlist") && detail.contains("passwd"),
        "{detail}"
    );
    assert!(!detail.contains("shadow"), "{detail}");
}

/// Rewrites the first bytes of each named file through a shared writable mapping
/// (`mmap(MAP_SHARED)` + store + `msync`: the one route on which the kernel keeps
/// set-id bits and file capabilities), printing what happened to each.
const MMAP_REWRITE: &str = r#"
import mmap, os, sys
for name in sys.argv[1:]:
    if name == "kit":  # the kit command's $0
        continue
    try:
        fd = os.open(name, os.O_RDWR)
    except OSError as e:
        print(name, "refused", e.errno)
        continue
    m = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[0:6] = b"PWNED!"
    m.flush()
    m.close()
    os.close(fd)
    print(name, "rewritten")
"#;

/// A tool of libcap2-bin, which lives in an sbin directory that `PATH` may lack.
fn sbin(name: &str) -> std::path::PathBuf {
    ["/usr/sbin", "/sbin", "/usr/bin"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| name.into())
}

/// The contents and set-id state of a workspace file, as the host sees them.
fn host_view(path: &Path) -> (Vec<u8>, u32, bool) {
    let meta = fs::metadata(path).unwrap();
    let caps = Command::new(sbin("getcap")).arg(path).output().unwrap();
    (
        fs::read(path).unwrap(),
        meta.permissions().mode() & 0o7777,
        !String::from_utf8_lossy(&caps.stdout).trim().is_empty(),
    )
}

/// The host puts set-uid, set-gid and file-capability copies of a program in the
/// workspace (as root's `tar x` or `make install` would). Jobs of the project shell
/// and of a kit container try the attack (a shared writable mapping) and the ordinary
/// routes (append, truncate, `cp` over, `dd conv=notrunc`): afterwards each file either
/// has its original contents or has lost its set-id bits and capability, and the
/// mapping route never gets a descriptor. A plain file beside them is rewritten, so the
/// job could have.
#[test]
fn a_job_cannot_rewrite_a_set_id_file_the_host_put_in_the_workspace() {
    if marsh_tests::skip_unless_root("set-id root files and file capabilities in the workspace") {
        return;
    }
    let sb = Sandbox::new();
    let ws = sb.workspace();
    let original = fs::read("/usr/bin/true").unwrap();
    let place = |name: &str, mode: u32| {
        let path = ws.join(name);
        fs::write(&path, &original).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        path
    };
    let files = [
        place("setuid-helper", 0o4755),
        place("setgid-helper", 0o2755),
        place("caps-helper", 0o755),
        place("kit-setuid-helper", 0o4755),
    ];
    let plain = place("plain-helper", 0o755);
    let setcap = Command::new(sbin("setcap"))
        .args(["cap_setuid+ep"])
        .arg(&files[2])
        .status()
        .unwrap();
    assert!(setcap.success(), "setcap (libcap2-bin) is needed");
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    fs::create_dir_all(sb.home().join("kits")).unwrap();
    fs::write(
        sb.home().join("kits/rewriter.json"),
        json!({"command": ["/usr/bin/python3", "-c", MMAP_REWRITE, "kit"], "description": "rewrites files"}).to_string(),
    )
    .unwrap();
    fs::write(ws.join("rewrite.py"), MMAP_REWRITE).unwrap();

    let shell = run(
        &mut s,
        "/usr/bin/python3 rewrite.py setuid-helper setgid-helper caps-helper plain-helper",
    );
    let kit = run(&mut s, "rewriter kit-setuid-helper");
    let intact = |when: &str| {
        for path in &files {
            let (contents, mode, caps) = host_view(path);
            let privileged = mode & 0o6000 != 0 || caps;
            assert!(
                contents == original || !privileged,
                "{when}: {} changed ({}) and kept mode {mode:o} / capability {caps}",
                path.display(),
                String::from_utf8_lossy(&contents[..6])
            );
        }
    };
    intact("after the shared-mapping rewrite");
    assert_eq!(
        stdout(&shell),
        "setuid-helper refused 1\nsetgid-helper refused 1\ncaps-helper refused 1\nplain-helper rewritten\n",
        "{shell}"
    );
    assert_eq!(stdout(&kit), "kit-setuid-helper refused 1\n", "{kit}");
    assert!(fs::read(&plain).unwrap().starts_with(b"PWNED!"));

    let routes = run(
        &mut s,
        "for f in setuid-helper setgid-helper caps-helper; do \
           printf x >> $f; dd if=/dev/zero of=$f bs=1 count=4 conv=notrunc 2>/dev/null; \
           cp plain-helper $f 2>/dev/null; truncate -s 8 $f; done; cat setuid-helper >/dev/null; echo done",
    );
    assert!(stdout(&routes).ends_with("done\n"), "{routes}");
    assert!(
        routes["stderr_text"]
            .as_str()
            .unwrap()
            .contains("Operation not permitted"),
        "a job's open of a set-id file is refused: {routes}"
    );
    intact("after append, dd, cp and truncate");

    // Every other open is answered, a FIFO's too (the daemon must not block opening
    // its end of the event).
    let fifo = s.ok(
        "shell_run",
        json!({"command": "mkfifo pipe && (echo through-fifo > pipe &) && cat pipe", "timeout_ms": 20000}),
    );
    assert_eq!(stdout(&fifo), "through-fifo\n", "{fifo}");
    let detail = isolation_detail(&mut s);
    assert!(detail.contains("set-id guard on"), "{detail}");
}

/// `CAP_SYS_RESOURCE`'s bit number.
fn libc_cap_sys_resource() -> u32 {
    24
}

fn state_of(s: &mut Server, id: &str) -> String {
    s.ok("operation_get", json!({ "operation_id": id }))["state"]
        .as_str()
        .unwrap()
        .to_string()
}

/// In a scope limited to 256 MiB, one job fills `/tmp` (64 MiB) with 400 MB and another
/// allocates 400 MiB, while a third (another operation, as another session's would be)
/// sleeps: the filler gets ENOSPC, the allocator is the one the OOM killer takes, and
/// the sleeper, the shell and its agent live on. A job cannot lower its OOM score
/// below its container's; all scopes share a memory ceiling below the machine's memory;
/// and the control group of a daemon killed with SIGKILL is gone once the next daemon
/// has started.
#[test]
fn out_of_memory_in_a_scope_kills_the_job_not_the_shell() {
    if marsh_tests::skip_unless_root("control groups bound memory for a root server only") {
        return;
    }
    let sb = Sandbox::new();
    let mut s = server_with(&sb, r#"{"memory_max_mib": 256}"#);
    let sleeper = s.ok(
        "shell_run",
        json!({"command": "sleep 120", "wait_ms": 0, "timeout_ms": 300000}),
    );
    let sleeper = sleeper["operation_id"].as_str().unwrap().to_string();

    let fill = run(
        &mut s,
        "head -c 400000000 /dev/zero > /tmp/fill; echo rc=$?; df -m /tmp | tail -1 | awk '{print $2}'",
    );
    assert!(
        fill["stderr_text"]
            .as_str()
            .unwrap()
            .contains("No space left on device"),
        "{fill}"
    );
    // `/tmp` is a quarter of the scope's 256 MiB.
    assert_eq!(stdout(&fill), "rc=1\n64\n", "{fill}");
    assert_eq!(state_of(&mut s, &sleeper), "running");

    let hog = s.ok(
        "shell_run",
        json!({"command": "rm -f /tmp/fill; /usr/bin/python3 -c \"x = b'x' * (400 << 20); print('survived')\""}),
    );
    // The shell reports its child's SIGKILL as 128 + 9.
    assert_eq!(
        hog["exit_code"], 137,
        "the allocating job is the one killed: {hog}"
    );
    assert_eq!(
        state_of(&mut s, &sleeper),
        "running",
        "the sleeper lives on"
    );

    // Jobs run at the top OOM score. Where the host's root holds CAP_SYS_RESOURCE the
    // daemon also floors each container at its init's score, so a job cannot lower
    // itself below it; without that capability (as in some containers) the floor is 0.
    let scores = run(
        &mut s,
        "cat /proc/self/oom_score_adj; echo 0 > /proc/self/oom_score_adj 2>/dev/null || echo refused",
    );
    let floored = fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << libc_cap_sys_resource()) != 0);
    let expected = if floored { "1000\nrefused\n" } else { "1000\n" };
    assert_eq!(stdout(&scores), expected, "{scores}");

    let status = s.ok("status", json!({}));
    let ceiling = status["runtime"]["backend"]["limits"]["ceiling_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no shared ceiling: {status}"));
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    assert!(ceiling < total_kib * 1024, "{ceiling} vs {total_kib} KiB");

    // The daemon killed outright: its group is removed by the next daemon.
    let pid: i32 = fs::read_to_string(sb.home().join("daemon/pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let groups: Vec<std::path::PathBuf> = [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/memory",
    ]
    .iter()
    .map(|root| Path::new(root).join("marsh-shim").join(pid.to_string()))
    .filter(|dir| dir.is_dir())
    .collect();
    assert!(!groups.is_empty(), "daemon {pid} has no group");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The next command boots a new daemon (the sandbox died with the old one).
    let mut fresh = None;
    for _ in 0..50 {
        let data = s.call("shell_run", json!({"command": "echo again"}));
        if data["data"]["stdout_text"] == "again\n" {
            fresh = Some(data);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(fresh.is_some(), "a new daemon serves the scope");
    let left: Vec<_> = groups.iter().filter(|dir| dir.exists()).collect();
    assert!(
        left.is_empty(),
        "groups of the killed daemon remain: {left:?}"
    );
}
