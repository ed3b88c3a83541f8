//! The operation model: the global cap, wait_ms and background running, byte cursors,
//! timeouts and cancellation (tool and MCP notification), and a usable server after.

use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server, wait_op};
use serde_json::json;

fn server(sb: &Sandbox) -> Server {
    Server::start(sb, &sb.serve_home_args(&[]), &[])
}

#[test]
fn five_concurrent_long_runs_give_exactly_one_capacity_exhausted() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let mut ids = Vec::new();
    let mut exhausted = 0;
    for _ in 0..5 {
        let envelope = s.call("shell_run", json!({"command": "sleep 30", "wait_ms": 0}));
        if envelope["ok"] == true {
            assert_eq!(envelope["data"]["state"], "running");
            ids.push(
                envelope["data"]["operation_id"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            );
        } else {
            assert_eq!(envelope["error"]["kind"], "capacity_exhausted");
            assert_eq!(envelope["error"]["retryable"], true);
            exhausted += 1;
        }
    }
    assert_eq!((ids.len(), exhausted), (4, 1));
    for id in &ids {
        let data = s.ok("operation_cancel", json!({"operation_id": id}));
        assert_eq!(data["cancel_accepted"], true);
    }
    for id in &ids {
        assert_eq!(wait_op(&mut s, id)["state"], "cancellation_uncertain");
    }
    // Slots are free again.
    let data = s.ok("shell_run", json!({"command": "echo after"}));
    assert_eq!(data["stdout_text"], "after\n");
}

#[test]
fn timeout_ends_in_timed_out_and_the_server_stays_usable() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let started = Instant::now();
    let data = s.ok(
        "shell_run",
        json!({"command": "echo begin; sleep 30", "timeout_ms": 300}),
    );
    assert_eq!(data["state"], "timed_out");
    assert_eq!(data["error"]["kind"], "timed_out");
    assert_eq!(data["stdout_text"], "begin\n");
    assert!(started.elapsed() < Duration::from_secs(10));
    let after = s.ok("shell_run", json!({"command": "echo ok"}));
    assert_eq!(after["stdout_text"], "ok\n");
}

#[test]
fn mcp_cancelled_notification_cancels_the_inline_run() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let id = s.next_request_id();
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "shell_run", "arguments": {"command": "sleep 30", "wait_ms": 20000}}}));
    std::thread::sleep(Duration::from_millis(500));
    s.notify(
        "notifications/cancelled",
        json!({"requestId": id, "reason": "test"}),
    );
    // The cancelled request gets no result; find the operation through a new run's view.
    std::thread::sleep(Duration::from_millis(300));
    let data = s.ok("shell_run", json!({"command": "echo still-serving"}));
    assert_eq!(data["stdout_text"], "still-serving\n");
    // The slot of the cancelled run comes back: four more long runs fit.
    let ids = s.start_runs_when_free(
        4,
        "sleep 20",
        Duration::from_secs(15),
        "cancelled run never released its slot",
    );
    for id in ids {
        s.ok("operation_cancel", json!({"operation_id": id}));
    }
}

#[test]
fn background_run_reads_with_cursors_and_tail() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let started = s.ok(
        "shell_run",
        json!({"command": "for i in 1 2 3 4 5; do echo line$i; done; sleep 1; echo done >&2", "wait_ms": 0}),
    );
    let id = started["operation_id"].as_str().unwrap().to_string();
    let ended = wait_op(&mut s, &id);
    assert_eq!(ended["state"], "succeeded");
    let mut since = 0;
    let mut collected = String::new();
    loop {
        let page = s.ok(
            "operation_output",
            json!({"operation_id": id, "since_seq": since, "max_bytes": 4}),
        );
        collected.push_str(page["stdout_text"].as_str().unwrap_or(""));
        collected.push_str(page["stderr_text"].as_str().unwrap_or(""));
        assert!(page["next_seq"].as_u64().unwrap() >= since);
        since = page["next_seq"].as_u64().unwrap();
        if page["more_to_page"] == false {
            assert_eq!(page["output_complete"], true);
            break;
        }
    }
    assert_eq!(collected, "line1\nline2\nline3\nline4\nline5\ndone\n");
    let tail = s.ok(
        "operation_output",
        json!({"operation_id": id, "tail_lines": 2}),
    );
    assert_eq!(tail["stdout_text"], "line4\nline5\n");
    assert_eq!(
        s.err_kind(
            "operation_output",
            json!({"operation_id": id, "tail_lines": 2, "since_seq": 0})
        ),
        "invalid_argument"
    );
}

#[test]
fn unowned_and_malformed_operation_ids_are_typed_errors() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let unknown = "00000000-0000-4000-8000-000000000000";
    assert_eq!(
        s.err_kind("operation_get", json!({"operation_id": unknown})),
        "not_owner"
    );
    assert_eq!(
        s.err_kind("operation_cancel", json!({"operation_id": "not-a-uuid"})),
        "unknown_operation"
    );
}

#[test]
fn stdin_eof_cancels_running_work_and_exits_cleanly() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let started = s.ok("shell_run", json!({"command": "sleep 60", "wait_ms": 0}));
    assert_eq!(started["state"], "running");
    let t = Instant::now();
    assert!(s.close().success());
    assert!(t.elapsed() < Duration::from_secs(20));
}
