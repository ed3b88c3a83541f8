//! Pinned executables are revalidated before every child: a replaced, rewritten or
//! chmod-ed binary makes the next call fail closed with `executable_changed`.

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;

use marsh_tests::{Sandbox, Server};
use serde_json::json;

#[test]
fn replaced_marsh_fails_closed_before_any_child() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.ok("shell_run", json!({"command": "true"}));
    let before = sb.invocations(&sb.home()).len();
    let marsh = sb.prefix.bin("marsh");
    let replacement = marsh.with_file_name("marsh.new");
    fs::copy(&marsh, &replacement).unwrap();
    fs::rename(&replacement, &marsh).unwrap();
    let envelope = s.call("shell_run", json!({"command": "touch should-not-exist"}));
    assert_eq!(
        envelope["error"]["kind"], "executable_changed",
        "{envelope}"
    );
    let message = envelope["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("marsh") && message.contains("restart"),
        "{message}"
    );
    assert_eq!(s.err_kind("status", json!({})), "executable_changed");
    assert_eq!(sb.invocations(&sb.home()).len(), before);
    assert!(!sb.workspace().join("should-not-exist").exists());
}

#[test]
fn in_place_rewrite_with_restored_mtime_is_caught() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let marshd = sb.prefix.bin("marshd");
    let mtime = fs::metadata(&marshd).unwrap().modified().unwrap();
    let bytes = fs::read(&marshd).unwrap();
    fs::write(&marshd, &bytes).unwrap();
    File::options()
        .write(true)
        .open(&marshd)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    assert_eq!(fs::metadata(&marshd).unwrap().modified().unwrap(), mtime);
    let envelope = s.call("shell_run", json!({"command": "true"}));
    assert_eq!(
        envelope["error"]["kind"], "executable_changed",
        "{envelope}"
    );
    assert!(
        envelope["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ctime")
    );
}

#[test]
fn chmod_of_sbx_fails_closed() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    fs::set_permissions(sb.prefix.bin("sbx"), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(s.err_kind("prewarm", json!({})), "executable_changed");
    let doctor = s.ok("doctor", json!({}));
    assert_eq!(doctor["healthy"], false);
}
