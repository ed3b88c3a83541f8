//! Issue 22's attacks from the host's ordinary life, black-box and as root (where they
//! matter): a secret in `/etc` replaced by rename or created while a shell runs, and a
//! set-id file the host puts in the workspace.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use marsh_tests::{Sandbox, Server};
use serde_json::{Value, json};

fn run(s: &mut Server, command: &str) -> Value {
    s.ok("shell_run", json!({ "command": command }))
}

fn stdout(data: &Value) -> &str {
    data["stdout_text"].as_str().unwrap_or_default()
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
    let mut server = Server::spawn(cmd);
    let init = server.initialize();
    assert!(
        init.get("result").is_some(),
        "initialize failed: {init}; stderr: {}",
        server.stderr()
    );
    server
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

    let doctor = s.ok("doctor", json!({}));
    let isolation = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "isolation")
        .unwrap()
        .clone();
    let detail = isolation["detail"].as_str().unwrap();
    assert!(
        detail.contains("/etc shows only an allowlist") && detail.contains("passwd"),
        "{detail}"
    );
    assert!(!detail.contains("shadow"), "{detail}");
}
