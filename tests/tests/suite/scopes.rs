//! Managed development scopes: lifecycle, limits, restart reconciliation, identity
//! failures and safe removal, through the real stand-in runtime.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server, wait_op};
use serde_json::{Value, json};

fn managed(sb: &Sandbox) -> Server {
    Server::start(sb, &sb.serve_root_args(&[]), &[])
}

fn start_scope(s: &mut Server) -> String {
    let data = s.ok("scope_start", json!({}));
    assert_eq!(data["state"], "succeeded", "boot failed: {data}");
    assert_eq!(data["scope"]["state"], "ready", "{data}");
    data["scope_id"].as_str().unwrap().to_string()
}

fn home(sb: &Sandbox, id: &str) -> PathBuf {
    sb.root().join(id)
}

fn daemon_pid(home: &Path) -> String {
    fs::read_to_string(home.join("daemon/pid"))
        .unwrap()
        .trim()
        .to_string()
}

fn scope_state(s: &mut Server, id: &str) -> Value {
    s.ok("scope_status", json!({"scope_id": id}))
}

#[test]
fn two_scopes_get_distinct_owner_only_homes_and_daemons_over_one_workspace() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    let b = start_scope(&mut s);
    assert_ne!(a, b);
    assert_eq!(a, a.to_lowercase());
    for id in [&a, &b] {
        let mode = fs::metadata(home(&sb, id)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let run = s.ok("scope_run", json!({"scope_id": id, "command": "pwd"}));
        assert_eq!(
            run["stdout_text"],
            format!("{}\n", sb.workspace().display())
        );
    }
    assert_ne!(daemon_pid(&home(&sb, &a)), daemon_pid(&home(&sb, &b)));
    // Receipts are per scope.
    s.ok(
        "scope_run",
        json!({"scope_id": a, "command": "echo only-in-a"}),
    );
    let in_b = s.ok("scope_results_list", json!({"scope_id": b}));
    assert!(!in_b.to_string().contains("only-in-a"));
    let listed = s.ok("scope_list", json!({}));
    let ids: Vec<&str> = listed["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["scope_id"].as_str().unwrap())
        .collect();
    assert!(ids[0] == "default" && ids.contains(&a.as_str()) && ids.contains(&b.as_str()));
    assert!(
        !listed
            .to_string()
            .contains(&sb.root().display().to_string()),
        "no host paths"
    );
}

#[test]
fn stop_makes_runtime_absent_refuses_runs_and_reset_revives() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    assert_eq!(scope_state(&mut s, &a)["runtime_state"], "present");
    let stopped = s.ok("scope_stop", json!({"scope_id": a}));
    assert_eq!(stopped["state"], "succeeded", "{stopped}");
    let status = scope_state(&mut s, &a);
    assert_eq!(
        (status["state"].as_str(), status["runtime_state"].as_str()),
        (Some("stopped"), Some("absent"))
    );
    assert_eq!(status["runtime"], Value::Null);
    assert!(
        !home(&sb, &a).join("daemon/marshd.sock").exists(),
        "daemon is gone"
    );
    assert_eq!(
        s.err_kind("scope_run", json!({"scope_id": a, "command": "true"})),
        "scope_not_ready"
    );
    assert_eq!(
        s.err_kind("scope_prewarm", json!({"scope_id": a})),
        "scope_not_ready"
    );
    let reset = s.ok("scope_reset", json!({"scope_id": a}));
    assert_eq!(reset["state"], "succeeded", "{reset}");
    assert_eq!(reset["scope"]["state"], "ready");
    let run = s.ok("scope_run", json!({"scope_id": a, "command": "echo back"}));
    assert_eq!(run["stdout_text"], "back\n");
}

#[test]
fn reading_receipts_of_a_stopped_scope_always_stops_it_again() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    s.ok("scope_run", json!({"scope_id": a, "command": "echo kept"}));
    s.ok("scope_stop", json!({"scope_id": a}));
    let listed = s.ok("scope_results_list", json!({"scope_id": a}));
    assert!(listed.to_string().contains("echo kept"));
    assert_eq!(scope_state(&mut s, &a)["state"], "stopped");
    // When the exact stop after the read cannot be proven, the scope becomes failed.
    fs::create_dir_all(home(&sb, &a).join(".shim/fail")).unwrap();
    fs::write(home(&sb, &a).join(".shim/fail/stop"), "1").unwrap();
    // The receipts still come back; the operation reports the unproven stop.
    let read = s.ok("scope_results_list", json!({"scope_id": a}));
    assert!(read.to_string().contains("echo kept"), "{read}");
    assert_eq!(read["operation"]["state"], "failed", "{read}");
    let status = scope_state(&mut s, &a);
    assert_eq!(status["state"], "failed", "{status}");
    assert_eq!(status["runtime_state"], "unknown");
    assert!(
        status["last_error"]
            .as_str()
            .unwrap()
            .contains("exact stop")
    );
}

#[test]
fn a_stopped_scope_read_with_wait_ms_0_is_an_operation_of_this_session() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    s.ok(
        "scope_run",
        json!({"scope_id": a, "command": "echo receipt-one"}),
    );
    s.ok("scope_stop", json!({"scope_id": a}));
    let started = s.ok(
        "scope_results_list",
        json!({"scope_id": a, "wait_ms": 0, "limit": 5}),
    );
    // Pending: the operation (nested) and a hint, no receipts yet.
    let op = &started["operation"];
    assert_eq!(op["state"], "running", "{started}");
    assert_eq!(op["kind"], "results_list");
    assert!(started.get("results").is_none(), "{started}");
    assert!(started["hint"].as_str().unwrap().contains("operation_get"));
    let id = op["operation_id"].as_str().unwrap().to_string();
    // It holds the scope exclusively while it runs: a lifecycle call is busy (or,
    // had the read already ended, scope_stop finds the scope stopped and runs nothing).
    let busy = s.call("scope_stop", json!({"scope_id": a}));
    let ended = wait_op(&mut s, &id);
    assert_eq!(ended["state"], "succeeded", "{ended}");
    assert!(
        ended["result"]["results"]
            .to_string()
            .contains("echo receipt-one"),
        "{ended}"
    );
    assert!(!ended.to_string().contains(&sb.root().display().to_string()));
    assert_eq!(scope_state(&mut s, &a)["state"], "stopped");
    assert!(
        busy["error"]["kind"] == "scope_busy" || busy["data"]["note"].is_string(),
        "{busy}"
    );
}

#[test]
fn the_seventeenth_live_scope_is_refused_and_creates_no_home() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let mut ids = Vec::new();
    for _ in 0..16 {
        ids.push(start_scope(&mut s));
    }
    let entries = || fs::read_dir(sb.root()).unwrap().count();
    let before = entries();
    let refused = s.call("scope_start", json!({}));
    assert_eq!(refused["error"]["kind"], "live_scope_limit", "{refused}");
    assert_eq!(entries(), before, "no new home on disk");
    // A stopped scope no longer counts as live.
    s.ok("scope_stop", json!({"scope_id": ids[0]}));
    start_scope(&mut s);
}

#[test]
fn kill_9_during_scope_start_leaves_a_failed_record_after_restart() {
    for attempt in 0..30 {
        let sb = Sandbox::new();
        let mut s = managed(&sb);
        let id = s.next_request_id();
        s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "scope_start", "arguments": {}}}));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut caught = false;
        while Instant::now() < deadline {
            let text = fs::read_to_string(sb.root().join("scopes.json")).unwrap_or_default();
            if text.contains("\"starting\"") {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(s.pid() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                caught = true;
                break;
            }
            if text.contains("\"ready\"") && text.matches("\"state\"").count() > 1 {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        drop(s);
        if !caught {
            eprintln!("attempt {attempt}: the boot finished before the kill; retrying");
            continue;
        }
        let mut again = managed(&sb);
        let listed = again.ok("scope_list", json!({}));
        let generated: Vec<&Value> = listed["scopes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["scope_id"] != "default")
            .collect();
        assert_eq!(generated.len(), 1, "{listed}");
        assert_eq!(generated[0]["state"], "failed", "{listed}");
        assert!(
            generated[0]["last_error"]
                .as_str()
                .unwrap()
                .contains("interrupted")
        );
        // Its home is intact, so scope_reset recovers it.
        let sid = generated[0]["scope_id"].as_str().unwrap().to_string();
        let reset = again.ok("scope_reset", json!({"scope_id": sid}));
        assert_eq!(reset["scope"]["state"], "ready", "{reset}");
        return;
    }
    panic!("never caught a scope in the starting state");
}

#[test]
fn deleted_or_replaced_homes_become_identity_invalid_and_replacements_stay_untouched() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let gone = start_scope(&mut s);
    let swapped = start_scope(&mut s);
    s.ok("scope_stop", json!({"scope_id": gone}));
    s.ok("scope_stop", json!({"scope_id": swapped}));
    drop(s);
    fs::remove_dir_all(home(&sb, &gone)).unwrap();
    let impostor = sb.root().join("impostor");
    fs::create_dir(&impostor).unwrap();
    fs::set_permissions(&impostor, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(impostor.join("precious"), b"do not touch").unwrap();
    fs::remove_dir_all(home(&sb, &swapped)).unwrap();
    fs::rename(&impostor, home(&sb, &swapped)).unwrap();

    let mut s = managed(&sb);
    for id in [&gone, &swapped] {
        let status = scope_state(&mut s, id);
        assert_eq!(
            (
                status["state"].as_str(),
                status["identity_invalid"].as_bool()
            ),
            (Some("failed"), Some(true)),
            "{status}"
        );
        assert!(
            status["last_error"]
                .as_str()
                .unwrap()
                .contains("Restore the exact original directory")
        );
        for tool in [
            "scope_reset",
            "scope_remove",
            "scope_stop",
            "scope_results_list",
        ] {
            assert_eq!(
                s.err_kind(tool, json!({"scope_id": id})),
                "identity_invalid",
                "{tool}"
            );
        }
        assert_eq!(
            s.err_kind("scope_run", json!({"scope_id": id, "command": "true"})),
            "identity_invalid"
        );
    }
    assert!(
        !home(&sb, &gone).exists(),
        "a missing home is never recreated"
    );
    assert_eq!(
        fs::read(home(&sb, &swapped).join("precious")).unwrap(),
        b"do not touch"
    );
    // Both stay charged against capacity.
    assert_eq!(s.ok("scope_list", json!({}))["live_generated"], 2);
    assert_eq!(s.ok("doctor", json!({}))["healthy"], false);
}

#[test]
fn a_home_replaced_while_serving_is_isolated_at_next_use() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    s.ok("scope_stop", json!({"scope_id": a}));
    let moved = sb.state().join("moved-away");
    fs::rename(home(&sb, &a), &moved).unwrap();
    fs::create_dir(home(&sb, &a)).unwrap();
    fs::set_permissions(home(&sb, &a), fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(
        s.err_kind("scope_reset", json!({"scope_id": a})),
        "identity_invalid"
    );
    assert_eq!(scope_state(&mut s, &a)["identity_invalid"], true);
}

#[test]
fn removal_unlinks_planted_symlinks_without_following_them() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    assert_eq!(
        s.err_kind("scope_remove", json!({"scope_id": a})),
        "scope_not_ready",
        "only stopped scopes are removable"
    );
    s.ok("scope_stop", json!({"scope_id": a}));
    let outside = sb.state().join("outside.txt");
    fs::write(&outside, b"outside content").unwrap();
    std::os::unix::fs::symlink(&outside, home(&sb, &a).join("planted-link")).unwrap();
    std::os::unix::fs::symlink(sb.workspace(), home(&sb, &a).join("planted-dir-link")).unwrap();
    fs::write(sb.workspace().join("keep.txt"), b"workspace file").unwrap();
    let removed = s.ok("scope_remove", json!({"scope_id": a}));
    assert_eq!(removed["state"], "succeeded", "{removed}");
    assert!(!home(&sb, &a).exists());
    assert_eq!(fs::read(&outside).unwrap(), b"outside content");
    assert_eq!(
        fs::read(sb.workspace().join("keep.txt")).unwrap(),
        b"workspace file"
    );
    assert_eq!(
        s.err_kind("scope_status", json!({"scope_id": a})),
        "unknown_scope"
    );
    assert_eq!(
        s.err_kind("scope_remove", json!({"scope_id": "default"})),
        "invalid_argument"
    );
}

#[test]
fn removal_refuses_a_home_with_a_special_file_and_deletes_nothing() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    s.ok("scope_stop", json!({"scope_id": a}));
    nix::unistd::mkfifo(
        &home(&sb, &a).join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    fs::write(home(&sb, &a).join("file"), b"x").unwrap();
    let removed = s.ok("scope_remove", json!({"scope_id": a}));
    assert_eq!(removed["state"], "failed", "{removed}");
    assert!(
        removed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("fifo"),
        "{removed}"
    );
    assert!(home(&sb, &a).join("file").exists());
    // The record stays `removing` and the removal is retryable once the tree is clean.
    assert_eq!(scope_state(&mut s, &a)["state"], "removing");
    fs::remove_file(home(&sb, &a).join("fifo")).unwrap();
    assert_eq!(
        s.ok("scope_remove", json!({"scope_id": a}))["state"],
        "succeeded"
    );
}

#[test]
fn default_aliases_stay_disabled_across_restart_after_scope_stop_default() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    s.ok("shell_run", json!({"command": "true"}));
    assert_eq!(
        s.ok("scope_stop", json!({"scope_id": "default"}))["state"],
        "succeeded"
    );
    assert_eq!(
        s.err_kind("shell_run", json!({"command": "true"})),
        "scope_not_ready"
    );
    drop(s);
    let mut s = managed(&sb);
    assert_eq!(
        s.err_kind("shell_run", json!({"command": "true"})),
        "scope_not_ready"
    );
    assert_eq!(s.err_kind("prewarm", json!({})), "scope_not_ready");
    assert_eq!(s.err_kind("status", json!({})), "scope_not_ready");
    let status = s.ok("scope_status", json!({"scope_id": "default"}));
    assert_eq!(
        (status["state"].as_str(), status["runtime_state"].as_str()),
        (Some("stopped"), Some("absent"))
    );
    assert!(
        !sb.root().join("default/daemon/marshd.sock").exists(),
        "nothing restarted it"
    );
    assert_eq!(
        s.ok("scope_reset", json!({"scope_id": "default"}))["scope"]["state"],
        "ready"
    );
    assert_eq!(
        s.ok("shell_run", json!({"command": "echo revived"}))["stdout_text"],
        "revived\n"
    );
}

/// Every default-scope alias with arguments it would otherwise accept.
fn default_aliases(receipt: &str) -> [(&'static str, Value); 6] {
    [
        ("status", json!({})),
        ("results_list", json!({})),
        ("result_get", json!({"selector": receipt})),
        ("shell_run", json!({"command": "echo should-not-run"})),
        ("prewarm", json!({})),
        ("workers_reset", json!({})),
    ]
}

/// Calls every default-scope alias: each is `scope_not_ready` naming the recovery, and
/// none reaches marsh (the stand-in's invocation log of the default home is unchanged).
fn assert_aliases_disabled(sb: &Sandbox, s: &mut Server, default_home: &Path, receipt: &str) {
    let before = sb.invocations(default_home).len();
    for (alias, args) in default_aliases(receipt) {
        let envelope = s.call(alias, args);
        assert_eq!(envelope["ok"], false, "{alias}: {envelope}");
        assert_eq!(
            envelope["error"]["kind"], "scope_not_ready",
            "{alias}: {envelope}"
        );
        assert_eq!(envelope["error"]["retryable"], false, "{alias}: {envelope}");
        let message = envelope["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("scope_reset default"),
            "{alias}: {message}"
        );
        assert!(message.contains("scope_status"), "{alias}: {message}");
    }
    assert_eq!(
        sb.invocations(default_home).len(),
        before,
        "a disabled alias never runs marsh"
    );
}

#[test]
fn every_default_alias_is_refused_after_scope_stop_default_but_scope_tools_still_inspect_it() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    s.ok("shell_run", json!({"command": "echo kept-receipt"}));
    let listed = s.ok("results_list", json!({}));
    let receipt = listed["results"][0]["id"].as_str().unwrap()[..8].to_string();
    assert_eq!(
        s.ok("scope_stop", json!({"scope_id": "default"}))["state"],
        "succeeded"
    );
    let default_home = sb.root().join("default");
    assert_aliases_disabled(&sb, &mut s, &default_home, &receipt);
    // The scope tools still inspect it: status without probing, receipts through the
    // stopped-scope read (which stops it again).
    let status = s.ok("scope_status", json!({"scope_id": "default"}));
    assert_eq!(
        (status["state"].as_str(), status["runtime_state"].as_str()),
        (Some("stopped"), Some("absent")),
        "{status}"
    );
    let read = s.ok("scope_results_list", json!({"scope_id": "default"}));
    assert!(read.to_string().contains("kept-receipt"), "{read}");
    let got = s.ok(
        "scope_result_get",
        json!({"scope_id": "default", "selector": receipt}),
    );
    assert!(got["result"].to_string().contains("kept-receipt"), "{got}");
    assert_eq!(
        s.ok("scope_status", json!({"scope_id": "default"}))["state"],
        "stopped"
    );
    // Still disabled after those reads, and after a restart.
    assert_aliases_disabled(&sb, &mut s, &default_home, &receipt);
    drop(s);
    let mut s = managed(&sb);
    assert_aliases_disabled(&sb, &mut s, &default_home, &receipt);
    // scope_start creates generated scopes only; it does not bring the default back.
    let other = start_scope(&mut s);
    assert_eq!(s.err_kind("status", json!({})), "scope_not_ready");
    s.ok("scope_run", json!({"scope_id": other, "command": "true"}));
    // scope_reset default recreates and validates its project shell: every alias answers.
    assert_eq!(
        s.ok("scope_reset", json!({"scope_id": "default"}))["scope"]["state"],
        "ready"
    );
    assert_eq!(s.ok("status", json!({}))["state"], "ready");
    assert!(
        s.ok("results_list", json!({}))
            .to_string()
            .contains("kept-receipt")
    );
    s.ok("result_get", json!({"selector": receipt}));
    assert_eq!(
        s.ok("shell_run", json!({"command": "echo back"}))["stdout_text"],
        "back\n"
    );
}

#[test]
fn legacy_mode_disables_the_default_aliases_after_scope_stop_default() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.ok("shell_run", json!({"command": "echo legacy-receipt"}));
    let listed = s.ok("results_list", json!({}));
    let receipt = listed["results"][0]["id"].as_str().unwrap()[..8].to_string();
    s.ok("scope_stop", json!({"scope_id": "default"}));
    assert_aliases_disabled(&sb, &mut s, &sb.home(), &receipt);
    assert_eq!(
        s.ok("scope_status", json!({"scope_id": "default"}))["state"],
        "stopped"
    );
    s.ok("scope_reset", json!({"scope_id": "default"}));
    assert_eq!(s.ok("status", json!({}))["state"], "ready");
}

/// Legacy lifecycle state lasts only for the server process: a default scope stopped
/// in one `serve --home` is ready again in the next one on that home (managed mode keeps
/// it stopped: `default_aliases_stay_disabled_across_restart_after_scope_stop_default`).
#[test]
fn a_legacy_restart_brings_a_stopped_default_scope_back() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.ok("scope_stop", json!({"scope_id": "default"}));
    assert_eq!(s.err_kind("status", json!({})), "scope_not_ready");
    assert!(s.close().success());
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    assert_eq!(
        s.ok("scope_status", json!({"scope_id": "default"}))["state"],
        "ready"
    );
    let run = s.ok("shell_run", json!({"command": "echo back"}));
    assert_eq!(run["stdout_text"], "back\n", "{run}");
}

#[test]
fn a_failed_scope_is_recovered_by_reset_then_stop_before_removal() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    let shim = home(&sb, &a).join(".shim/fail");
    fs::create_dir_all(&shim).unwrap();
    // A stop that cannot be proven leaves the scope failed.
    fs::write(shim.join("stop"), "1").unwrap();
    let stop = s.ok("scope_stop", json!({"scope_id": a}));
    assert_eq!(stop["state"], "failed", "{stop}");
    assert_eq!(scope_state(&mut s, &a)["state"], "failed");
    fs::remove_file(shim.join("stop")).unwrap();
    // Neither a stop nor a removal is admitted from failed, and nothing runs.
    let before = sb.invocations(&home(&sb, &a)).len();
    for tool in ["scope_stop", "scope_remove"] {
        let envelope = s.call(tool, json!({"scope_id": a}));
        assert_eq!(
            envelope["error"]["kind"], "scope_not_ready",
            "{tool}: {envelope}"
        );
        let message = envelope["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("scope_reset first, then scope_stop"),
            "{tool}: {message}"
        );
    }
    assert_eq!(sb.invocations(&home(&sb, &a)).len(), before);
    assert_eq!(scope_state(&mut s, &a)["state"], "failed");
    assert!(home(&sb, &a).exists());
    // A reset that marsh refuses as busy does not recover it: it stays failed.
    fs::write(shim.join("reset"), "125").unwrap();
    let busy = s.ok("scope_reset", json!({"scope_id": a}));
    assert_eq!(busy["state"], "failed", "{busy}");
    assert_eq!(busy["error"]["kind"], "scope_busy", "{busy}");
    assert_eq!(busy["scope"]["state"], "failed", "{busy}");
    assert_eq!(
        s.err_kind("scope_stop", json!({"scope_id": a})),
        "scope_not_ready"
    );
    fs::remove_file(shim.join("reset")).unwrap();
    // reset (to ready), then stop (to stopped), then removal.
    let reset = s.ok("scope_reset", json!({"scope_id": a}));
    assert_eq!(reset["scope"]["state"], "ready", "{reset}");
    assert_eq!(
        s.err_kind("scope_remove", json!({"scope_id": a})),
        "scope_not_ready",
        "a ready scope is stopped before removal"
    );
    let stopped = s.ok("scope_stop", json!({"scope_id": a}));
    assert_eq!(stopped["scope"]["state"], "stopped", "{stopped}");
    let removed = s.ok("scope_remove", json!({"scope_id": a}));
    assert_eq!(removed["state"], "succeeded", "{removed}");
    assert!(!home(&sb, &a).exists());
    assert_eq!(
        s.err_kind("scope_status", json!({"scope_id": a})),
        "unknown_scope"
    );
}

#[test]
fn concurrent_lifecycle_on_one_scope_is_busy_while_a_peer_scope_keeps_working() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    let b = start_scope(&mut s);
    fs::create_dir_all(home(&sb, &a).join(".shim/hang")).unwrap();
    fs::write(home(&sb, &a).join(".shim/hang/reset"), "3000").unwrap();
    let resetting = s.ok("scope_reset", json!({"scope_id": a, "wait_ms": 0}));
    let op = resetting["operation_id"].as_str().unwrap().to_string();
    assert_eq!(
        s.err_kind("scope_stop", json!({"scope_id": a})),
        "scope_busy"
    );
    assert_eq!(
        s.err_kind("scope_reset", json!({"scope_id": a})),
        "scope_busy"
    );
    assert_eq!(
        s.err_kind("scope_run", json!({"scope_id": a, "command": "true"})),
        "scope_busy"
    );
    let status = scope_state(&mut s, &a);
    assert_eq!(
        (status["state"].as_str(), status["runtime_state"].as_str()),
        (Some("resetting"), Some("unknown"))
    );
    let peer = s.ok("scope_run", json!({"scope_id": b, "command": "echo peer"}));
    assert_eq!(peer["stdout_text"], "peer\n");
    assert_eq!(wait_op(&mut s, &op)["state"], "succeeded");
    assert_eq!(scope_state(&mut s, &a)["state"], "ready");
}

#[test]
fn reset_and_stop_refuse_active_work() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    let run = s.ok(
        "scope_run",
        json!({"scope_id": a, "command": "sleep 20", "wait_ms": 0}),
    );
    assert_eq!(
        s.err_kind("scope_reset", json!({"scope_id": a})),
        "scope_busy"
    );
    assert_eq!(
        s.err_kind("scope_stop", json!({"scope_id": a})),
        "scope_busy"
    );
    s.ok(
        "operation_cancel",
        json!({"operation_id": run["operation_id"]}),
    );
    assert_eq!(scope_state(&mut s, &a)["state"], "ready");
}

#[test]
fn legacy_mode_refuses_scope_start_and_unknown_ids() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    assert_eq!(s.err_kind("scope_start", json!({})), "disabled");
    let unknown = "00000000-0000-4000-8000-000000000000";
    assert_eq!(
        s.err_kind("scope_status", json!({"scope_id": unknown})),
        "unknown_scope"
    );
    assert_eq!(
        s.err_kind("scope_status", json!({"scope_id": "DEFAULT"})),
        "invalid_argument"
    );
    assert_eq!(
        s.err_kind(
            "scope_run",
            json!({"scope_id": "default", "command": "true", "cwd": "/"})
        ),
        "invalid_argument"
    );
    assert_eq!(
        s.ok("scope_status", json!({"scope_id": "default"}))["state"],
        "ready"
    );
}

#[test]
fn malformed_records_fail_closed_and_invalid_keys_are_preserved_and_reported() {
    let sb = Sandbox::new();
    drop(managed(&sb));
    let path = sb.root().join("scopes.json");
    let mut registry: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let bad_id = "11111111-2222-4333-8444-555555555555";
    registry["scopes"][bad_id] = json!({"state": "ready", "home": "not an identity"});
    registry["scopes"]["../../etc"] = json!({"state": "ready"});
    fs::write(&path, serde_json::to_vec(&registry).unwrap()).unwrap();
    let mut s = managed(&sb);
    let status = scope_state(&mut s, bad_id);
    assert_eq!(
        (
            status["state"].as_str(),
            status["identity_invalid"].as_bool()
        ),
        (Some("failed"), Some(true))
    );
    assert_eq!(
        s.err_kind("scope_reset", json!({"scope_id": bad_id})),
        "identity_invalid"
    );
    let listed = s.ok("scope_list", json!({}));
    assert!(
        !listed.to_string().contains("../../etc"),
        "invalid keys are hidden"
    );
    let doctor = s.ok("doctor", json!({}));
    let keys = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "registry_keys")
        .unwrap()
        .clone();
    assert_eq!(keys["ok"], false, "{doctor}");
    // A later transition republishes the registry with both entries kept verbatim.
    start_scope(&mut s);
    let after: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(after["scopes"]["../../etc"], json!({"state": "ready"}));
    assert_eq!(
        after["scopes"][bad_id],
        json!({"state": "ready", "home": "not an identity"})
    );
}

#[test]
fn a_crash_persisted_removing_record_is_retryable() {
    let sb = Sandbox::new();
    let mut s = managed(&sb);
    let a = start_scope(&mut s);
    s.ok("scope_stop", json!({"scope_id": a}));
    drop(s);
    let path = sb.root().join("scopes.json");
    let mut registry: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    registry["scopes"][&a]["state"] = json!("removing");
    fs::write(&path, serde_json::to_vec(&registry).unwrap()).unwrap();
    let mut s = managed(&sb);
    assert_eq!(scope_state(&mut s, &a)["state"], "removing");
    assert_eq!(
        s.ok("scope_remove", json!({"scope_id": a}))["state"],
        "succeeded"
    );
    assert!(!home(&sb, &a).exists());
}
