//! `notifications/progress` while a call waits: only with a `progressToken`, at least
//! once a second, increasing, with elapsed time and output bytes, and none after the
//! call answers.

use std::fs;
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server, python_client_summary};
use serde_json::{Value, json};

/// The `notifications/progress` among `notifications`, asserting each is well formed
/// for `token`: no `total`, a message with elapsed seconds and output bytes.
fn progress_of(notifications: &[Value], token: &Value) -> Vec<f64> {
    notifications
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .map(|n| {
            let p = &n["params"];
            assert_eq!(&p["progressToken"], token, "{n}");
            assert!(p.get("total").is_none(), "total must be absent: {n}");
            let message = p["message"].as_str().expect("a message");
            assert!(
                message.contains(" s;") && message.contains("output bytes so far"),
                "{message}"
            );
            p["progress"].as_f64().expect("numeric progress")
        })
        .collect()
}

fn assert_increasing(progress: &[f64]) {
    assert!(
        progress.windows(2).all(|w| w[1] > w[0]),
        "progress must increase: {progress:?}"
    );
}

/// Nothing arrives once the call has answered (the session is otherwise idle).
fn assert_silent(server: &Server, for_: Duration) {
    if let Some(stray) = server.recv(for_) {
        panic!("a message after the answer: {stray}");
    }
}

#[test]
fn progress_only_with_a_token_for_operation_get_and_lifecycle_waits() {
    let sb = Sandbox::new();
    let mut server = Server::start(&sb, &sb.serve_home_args(&[]), &[]);

    // Without a progressToken: a 2-second inline wait sends nothing but the answer.
    let (reply, notes) = server.request_with_notifications(
        "tools/call",
        json!({"name": "shell_run", "arguments": {"command": "sleep 2; echo quiet", "wait_ms": 10000}}),
    );
    assert_eq!(reply["result"]["structuredContent"]["ok"], true, "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["data"]["stdout_text"],
        "quiet\n"
    );
    assert!(
        notes
            .iter()
            .all(|n| n["method"] != "notifications/progress"),
        "no token, no progress: {notes:?}"
    );

    // operation_get with wait_ms and a progressToken on a running operation.
    let started = server.ok(
        "shell_run",
        json!({"command": "printf partial; sleep 3; echo done", "wait_ms": 0}),
    );
    let id = started["operation_id"].as_str().expect("operation id");
    let token = json!("op-get-7");
    let began = Instant::now();
    let (reply, notes) = server.request_with_notifications(
        "tools/call",
        json!({
            "name": "operation_get",
            "arguments": {"operation_id": id, "wait_ms": 10000},
            "_meta": {"progressToken": token},
        }),
    );
    let waited = began.elapsed();
    let data = &reply["result"]["structuredContent"]["data"];
    assert_eq!(data["wait_result"], "ended", "{reply}");
    assert_eq!(data["state"], "succeeded", "{reply}");
    let progress = progress_of(&notes, &token);
    // At least once a second while it waited (about 3 s).
    assert!(
        progress.len() as u64 >= waited.as_secs().max(2),
        "{} notifications in {waited:?}: {notes:?}",
        progress.len()
    );
    assert_increasing(&progress);
    // Output bytes so far: `partial` was written before the wait began, `done` only
    // after 3 s, so the first notification (0.5 s in) counts exactly those 7 bytes.
    let first = notes
        .iter()
        .find(|n| n["method"] == "notifications/progress")
        .expect("a notification");
    assert!(
        first["params"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("stdout 7")),
        "{first}"
    );
    assert_silent(&server, Duration::from_millis(1500));

    // An operation that has already ended: the wait is immediate, nothing is sent.
    let (_, notes) = server.request_with_notifications(
        "tools/call",
        json!({
            "name": "operation_get",
            "arguments": {"operation_id": id, "wait_ms": 10000},
            "_meta": {"progressToken": 8},
        }),
    );
    assert!(notes.is_empty(), "{notes:?}");

    // A lifecycle operation waited inline (a worker reset the stand-in holds 2.5 s).
    fs::create_dir_all(sb.home().join(".shim/hang")).unwrap();
    fs::write(sb.home().join(".shim/hang/workers-reset"), "2500").unwrap();
    let token = json!("reset-1");
    let (reply, notes) = server.request_with_notifications(
        "tools/call",
        json!({
            "name": "workers_reset",
            "arguments": {"wait_ms": 30000},
            "_meta": {"progressToken": token},
        }),
    );
    let data = &reply["result"]["structuredContent"]["data"];
    assert_eq!(data["state"], "succeeded", "{reply}");
    let progress = progress_of(&notes, &token);
    assert!(progress.len() >= 2, "{notes:?}");
    assert_increasing(&progress);
    assert_silent(&server, Duration::from_millis(1200));
}

#[test]
fn progress_for_inline_scope_runs() {
    let sb = Sandbox::new();
    let mut server = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let scope = server.start_scope();
    let token = json!(42);
    let (reply, notes) = server.request_with_notifications(
        "tools/call",
        json!({
            "name": "scope_run",
            "arguments": {"scope_id": scope, "command": "sleep 2; echo inline", "wait_ms": 10000},
            "_meta": {"progressToken": token},
        }),
    );
    assert_eq!(
        reply["result"]["structuredContent"]["data"]["stdout_text"], "inline\n",
        "{reply}"
    );
    let progress = progress_of(&notes, &token);
    assert!(progress.len() >= 2, "{notes:?}");
    assert_increasing(&progress);
    assert_silent(&server, Duration::from_millis(1200));
}

#[test]
fn pypi_mcp_client_progress_callback_sees_a_waiting_shell_run() {
    let sb = Sandbox::new();
    let summary = python_client_summary(&sb, "progress_client.py");
    assert_eq!(summary["run"]["ok"], true, "{summary}");
    assert_eq!(summary["run"]["data"]["stdout_text"], "done\n", "{summary}");
    let seen = summary["progress"].as_array().unwrap();
    assert!(seen.len() >= 2, "{summary}");
    assert_eq!(summary["count_at_answer"].as_u64(), Some(seen.len() as u64));
    let progress: Vec<f64> = seen
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect();
    assert_increasing(&progress);
    for p in seen {
        assert!(p["total"].is_null(), "{p}");
        let message = p["message"].as_str().unwrap();
        assert!(message.starts_with("shell_run running for "), "{message}");
        assert!(message.contains("output bytes so far"), "{message}");
    }
    // At least once a second: no gap between notifications (nor before the first)
    // much beyond a second.
    let mut last = 0;
    for p in seen {
        let at = p["at_ms"].as_u64().unwrap();
        assert!(at - last <= 1300, "a gap of {} ms: {summary}", at - last);
        last = at;
    }
}
