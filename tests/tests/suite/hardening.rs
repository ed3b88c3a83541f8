//! Issue 10's remaining attacks, black-box: an untrusted or swapped scope root, a lost
//! registry, a file renamed over the pinned `marsh` while a call is in flight, and host
//! paths in tool results.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use marsh_tests::{Sandbox, Server};
use serde_json::{Value, json};

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// `serve --scope-root ROOT` for another root than the sandbox's.
fn serve_at(sb: &Sandbox, root: &Path) -> Vec<String> {
    let mut args = sb.serve_root_args(&[]);
    args[4] = root.display().to_string();
    args
}

fn refused_with(sb: &Sandbox, args: &[String], needle: &str) -> String {
    let (code, stderr) = sb.startup(args, &[]);
    assert_ne!(code, Some(0), "startup must be refused: {stderr}");
    assert!(stderr.contains(needle), "expected {needle:?} in: {stderr}");
    stderr
}

pub(crate) fn doctor_check(s: &mut Server, name: &str) -> Value {
    let doctor = s.ok("doctor", json!({}));
    doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {name} check: {doctor}"))
}

#[test]
fn a_root_below_a_writable_ancestor_is_refused_unless_the_ancestor_is_sticky() {
    let sb = Sandbox::new();
    let ww = sb.state().join("ww");
    fs::create_dir(&ww).unwrap();
    chmod(&ww, 0o777);
    refused_with(&sb, &serve_at(&sb, &ww.join("root")), "not safe to use");
    assert!(!ww.join("root").exists(), "nothing is created below it");
    chmod(&ww, 0o1777);
    let mut s = Server::start(&sb, &serve_at(&sb, &ww.join("root")), &[]);
    assert_eq!(doctor_check(&mut s, "scope_root")["ok"], true);
}

/// The attack of the issue: the root's parent becomes writable by another uid (as
/// root, 65534 does the swap; otherwise the server's own uid does), the root is moved
/// away and an open directory put in its place. The server writes nothing there.
#[test]
fn a_root_swapped_while_serving_fails_closed_and_receives_no_file() {
    let sb = Sandbox::new();
    let ww = sb.state().join("ww");
    fs::create_dir(&ww).unwrap();
    chmod(&ww, 0o755);
    let root = ww.join("root");
    let mut s = Server::start(&sb, &serve_at(&sb, &root), &[]);
    s.ok("shell_run", json!({"command": "true"}));
    assert_eq!(doctor_check(&mut s, "scope_root")["ok"], true);

    let swap = "mv root stolen && mkdir root && chmod 777 root";
    let mut attacker = Command::new("/bin/sh");
    attacker.args(["-c", swap]).current_dir(&ww);
    if nix::unistd::geteuid().is_root() {
        chmod(&sb.state(), 0o755);
        chmod(&ww, 0o777);
        attacker.uid(65534).gid(65534);
    }
    assert!(attacker.status().unwrap().success());

    let envelope = s.call("scope_start", json!({}));
    assert_eq!(envelope["error"]["kind"], "identity_invalid", "{envelope}");
    let message = envelope["error"]["message"].as_str().unwrap();
    assert!(message.contains("restored"), "{message}");
    assert_eq!(
        s.err_kind("shell_run", json!({"command": "true"})),
        "identity_invalid"
    );
    let check = doctor_check(&mut s, "scope_root");
    assert_eq!(check["ok"], false, "{check}");
    assert_eq!(s.ok("doctor", json!({}))["healthy"], false);
    let planted: Vec<_> = fs::read_dir(&root).unwrap().flatten().collect();
    assert!(planted.is_empty(), "the server wrote {planted:?}");
    assert!(ww.join("stolen/scopes.json").exists());
    let text = format!("{envelope}{check}");
    assert!(!text.contains(&*ww.to_string_lossy()), "{text}");
}

#[test]
fn a_bound_root_that_lost_its_registry_is_refused_with_the_recovery_steps() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let scope = s.start_scope();
    s.ok("scope_stop", json!({"scope_id": scope}));
    s.close();
    fs::remove_file(sb.root().join("scopes.json")).unwrap();
    let stderr = refused_with(&sb, &sb.serve_root_args(&[]), "registry was lost");
    assert!(stderr.contains("restoring scopes.json"), "{stderr}");
    assert!(stderr.contains("new empty --scope-root"), "{stderr}");
    assert!(
        !sb.root().join("scopes.json").exists(),
        "nothing re-adopted"
    );
    assert!(sb.root().join(&scope).is_dir());
    // A fresh empty root still starts.
    let fresh = sb.state().join("fresh");
    Server::start(&sb, &serve_at(&sb, &fresh), &[]).close();
    assert!(fresh.join("scopes.json").exists());
}

/// Renames a script over a pinned executable 0–4 ms after a `shell_run` was sent, 200
/// times (a fresh server per trial, since a swap breaks the pin): `marsh` on even
/// trials, `marshd` on odd ones, with the daemon stopped first so the call boots one
/// (marsh's start-up is then inside the window). Whether the call runs the verified
/// binaries or is refused, the script never runs.
#[test]
fn a_file_renamed_over_marsh_or_marshd_mid_call_never_runs() {
    let sb = Sandbox::new();
    let marker = sb.state().join("swapped-file-ran");
    let script = format!("#!/bin/sh\necho \"$0\" >> '{}'\n", marker.display());
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.ok("shell_run", json!({"command": "true"}));
    drop(s);
    let (mut ran, mut refused) = (0, 0);
    for trial in 0..200u64 {
        let target = sb
            .prefix
            .bin(if trial % 2 == 0 { "marsh" } else { "marshd" });
        let original = fs::read(&target).unwrap();
        if trial % 2 == 1 {
            let stop = Command::new(sb.prefix.bin("marsh"))
                .arg("stop")
                .env("MARSH_HOME", sb.home())
                .current_dir(sb.workspace())
                .output()
                .unwrap();
            assert!(stop.status.success(), "{stop:?}");
        }
        let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
        let evil = target.with_file_name("evil");
        fs::write(&evil, &script).unwrap();
        chmod(&evil, 0o755);
        let id = s.next_request_id();
        s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "shell_run", "arguments": {"command": "true"}}}));
        std::thread::sleep(Duration::from_micros((trial * 397) % 4000));
        fs::rename(&evil, &target).unwrap();
        let reply = s.reply_to(id);
        let envelope = &reply["result"]["structuredContent"];
        match envelope["ok"].as_bool() {
            Some(true) => ran += 1,
            // A daemon started just before marshd was replaced refuses to start its
            // shell (the unlinked inode cannot be bound): refused too, never run.
            _ => {
                let kind = &envelope["error"]["kind"];
                assert!(
                    kind == "executable_changed" || (trial % 2 == 1 && kind == "backend_failed"),
                    "{reply}"
                );
                refused += 1;
            }
        }
        drop(s);
        let restore = target.with_file_name("restore");
        fs::write(&restore, &original).unwrap();
        chmod(&restore, 0o755);
        fs::rename(&restore, &target).unwrap();
        let ran_swapped = fs::read_to_string(&marker).unwrap_or_default();
        assert!(ran_swapped.is_empty(), "trial {trial}: ran {ran_swapped}");
    }
    eprintln!("200 trials: {ran} ran the verified binaries, {refused} refused");
}

fn place_strings(sb: &Sandbox) -> Vec<String> {
    let prefix_bin: PathBuf = sb.prefix.bin("marsh").parent().unwrap().to_path_buf();
    vec![
        sb.state().display().to_string(),
        prefix_bin.display().to_string(),
    ]
}

fn assert_no_places(sb: &Sandbox, what: &str, value: &Value) {
    let text = value.to_string();
    for place in place_strings(sb) {
        assert!(!text.contains(&place), "{what} names {place}: {text}");
    }
}

/// Every tool, its failing paths, and doctor after a pin change: no result names the
/// root, the homes, the user home or the install prefix.
#[test]
fn no_tool_result_names_a_host_path() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let mut seen: Vec<(String, Value)> = Vec::new();
    let mut call = |s: &mut Server, name: &str, args: Value| {
        let envelope = s.call(name, args);
        seen.push((name.to_string(), envelope.clone()));
        envelope
    };
    let run = call(&mut s, "shell_run", json!({"command": "echo hi; exit 3"}));
    let op = run["data"]["operation_id"].as_str().unwrap().to_string();
    call(&mut s, "status", json!({}));
    call(&mut s, "results_list", json!({}));
    call(&mut s, "result_get", json!({"selector": "no-such-receipt"}));
    call(&mut s, "operation_get", json!({"operation_id": op}));
    call(&mut s, "operation_output", json!({"operation_id": op}));
    call(&mut s, "prewarm", json!({"selection": "no-such-kit"}));
    call(&mut s, "workers_reset", json!({"selection": "no-such-kit"}));
    let started = call(&mut s, "scope_start", json!({}));
    let scope = started["data"]["scope_id"].as_str().unwrap().to_string();
    call(
        &mut s,
        "scope_run",
        json!({"scope_id": scope, "command": "true"}),
    );
    call(&mut s, "scope_status", json!({"scope_id": scope}));
    call(&mut s, "scope_stop", json!({"scope_id": scope}));
    let home = sb.root().join(&scope);
    nix::unistd::mkfifo(
        &home.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let removal = call(&mut s, "scope_remove", json!({"scope_id": scope}));
    assert!(removal.to_string().contains("fifo"), "{removal}");
    call(&mut s, "scope_list", json!({}));
    call(&mut s, "scope_status", json!({"scope_id": scope}));
    call(&mut s, "doctor", json!({}));
    // A pin change: every refusal and doctor's details stay path-free.
    chmod(&sb.prefix.bin("sbx"), 0o700);
    let changed = call(&mut s, "shell_run", json!({"command": "true"}));
    assert_eq!(changed["error"]["kind"], "executable_changed", "{changed}");
    call(&mut s, "status", json!({}));
    call(&mut s, "scope_start", json!({}));
    let doctor = call(&mut s, "doctor", json!({}));
    assert_eq!(doctor["data"]["healthy"], false, "{doctor}");
    for (name, envelope) in &seen {
        assert_no_places(&sb, name, envelope);
    }
    fs::remove_file(home.join("fifo")).unwrap();
    chmod(&sb.prefix.bin("sbx"), 0o755);
}
