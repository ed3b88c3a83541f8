//! prewarm, workers_reset, doctor and qualify against the stand-in.

use std::fs;

use marsh_tests::{Sandbox, Server, wait_op};
use serde_json::json;

fn register_kit(home: &std::path::Path, name: &str) {
    fs::create_dir_all(home.join("kits")).unwrap();
    fs::write(
        home.join(format!("kits/{name}.json")),
        json!({"command": ["/bin/sh", "-c", "echo kit-ran \"$@\"", "kit"], "description": "test kit"}).to_string(),
    )
    .unwrap();
}

#[test]
fn prewarm_warms_workers_and_workers_reset_cools_them() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    register_kit(&sb.home(), "alpha");
    let warm = s.ok("prewarm", json!({"selection": "alpha", "wait_ms": 30000}));
    assert_eq!(warm["state"], "succeeded", "{warm}");
    let status = s.ok("status", json!({}));
    let workers = status["runtime"]["workers"].as_array().unwrap();
    assert!(
        workers
            .iter()
            .any(|w| w["name"] == "alpha" && w["state"] == "warm"),
        "{status}"
    );
    let run = s.ok("shell_run", json!({"command": "alpha one two"}));
    assert_eq!(run["stdout_text"], "kit-ran one two\n", "{run}");
    let reset = s.ok(
        "workers_reset",
        json!({"selection": "alpha", "wait_ms": 30000}),
    );
    assert_eq!(reset["state"], "succeeded", "{reset}");
    let status = s.ok("status", json!({}));
    let workers = status["runtime"]["workers"].as_array().unwrap();
    assert!(
        workers
            .iter()
            .any(|w| w["name"] == "alpha" && w["state"] == "cold"),
        "{status}"
    );
}

#[test]
fn workers_reset_meeting_active_work_is_busy_and_runs_wait_for_lifecycle() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    register_kit(&sb.home(), "beta");
    fs::write(
        sb.home().join("kits/beta.json"),
        json!({"command": ["/bin/sh", "-c", "sleep 20"], "description": "slow"}).to_string(),
    )
    .unwrap();
    let run = s.ok("shell_run", json!({"command": "beta", "wait_ms": 0}));
    let run_id = run["operation_id"].as_str().unwrap().to_string();
    std::thread::sleep(std::time::Duration::from_millis(800));
    let reset = s.ok(
        "workers_reset",
        json!({"selection": "beta", "wait_ms": 30000}),
    );
    assert_eq!(reset["state"], "failed", "{reset}");
    assert_eq!(reset["error"]["kind"], "scope_busy", "{reset}");
    s.ok("operation_cancel", json!({"operation_id": run_id}));

    // While a lifecycle operation holds the scope, runs are refused at once.
    fs::create_dir_all(sb.home().join(".shim/hang")).unwrap();
    fs::write(sb.home().join(".shim/hang/load"), "3000").unwrap();
    let warm = s.ok("prewarm", json!({"selection": "all", "wait_ms": 0}));
    assert_eq!(
        s.err_kind("shell_run", json!({"command": "true"})),
        "scope_busy"
    );
    assert_eq!(s.err_kind("workers_reset", json!({})), "scope_busy");
    // Reads stay available during prewarm.
    assert_eq!(
        s.ok("status", json!({}))["lifecycle_in_progress"],
        "prewarm"
    );
    let id = warm["operation_id"].as_str().unwrap().to_string();
    assert_eq!(wait_op(&mut s, &id)["state"], "succeeded");
    assert_eq!(
        s.ok("shell_run", json!({"command": "true"}))["state"],
        "succeeded"
    );
}

#[test]
fn injected_backend_failure_is_reported_typed() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    fs::create_dir_all(sb.home().join(".shim/fail")).unwrap();
    fs::write(sb.home().join(".shim/fail/status"), "1").unwrap();
    let envelope = s.call("status", json!({}));
    assert_eq!(envelope["error"]["kind"], "backend_failed");
    assert!(
        envelope["error"]["message"]
            .as_str()
            .unwrap()
            .contains("injected failure")
    );
}

#[test]
fn doctor_reports_health_without_host_paths() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.ok("shell_run", json!({"command": "true"}));
    let doctor = s.ok("doctor", json!({}));
    assert_eq!(doctor["healthy"], true, "{doctor}");
    let text = doctor.to_string();
    for path in [sb.home(), sb.workspace(), sb.prefix.bin("marsh")] {
        assert!(
            !text.contains(&path.display().to_string()),
            "doctor leaked {}",
            path.display()
        );
    }
    assert!(
        doctor["server_name"]
            .as_str()
            .unwrap()
            .starts_with("marsh-dev-")
    );
}

#[test]
fn qualify_is_disabled_by_default_and_runs_the_fixed_recipe_when_enabled() {
    let sb = Sandbox::new();
    fs::write(
        sb.workspace().join("Makefile"),
        "test:\n\t@echo evidence: target/qualify/source.log\nperf:\n\t@exit 3\n",
    )
    .unwrap();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    assert_eq!(s.err_kind("qualify", json!({"gate": "source"})), "disabled");
    drop(s);
    let mut s = Server::start(&sb, &sb.serve_home_args(&["--allow-full-sbx-control"]), &[]);
    let q = s.ok("qualify", json!({"gate": "source", "wait_ms": 30000}));
    assert_eq!(q["state"], "succeeded", "{q}");
    assert_eq!(q["make_target"], "test");
    assert!(
        q["stdout_text"]
            .as_str()
            .unwrap()
            .contains("evidence: target/qualify/source.log")
    );
    let perf = s.ok("qualify", json!({"gate": "perf", "wait_ms": 30000}));
    assert_eq!(perf["state"], "exited");
}
