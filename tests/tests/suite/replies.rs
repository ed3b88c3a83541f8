//! Every reply arrives and reads well: large and escape-heavy output fits one frame
//! (through `serve` and through `connect`), long output shows its head and its tail,
//! the text content is written for a reader, a session finds its own operations, and
//! outcomes say what to do next.

use std::fs;
use std::time::Duration;

use marsh_tests::{Sandbox, Server, decode_b64};
use serde_json::{Value, json};

const FRAME: usize = 1024 * 1024;

/// `tools/call` answered with the whole reply: exactly one, within one frame, its
/// `structuredContent` valid against the tool's schema.
fn call_reply(s: &mut Server, name: &str, arguments: Value) -> Value {
    s.output_schemas();
    let reply = s.request("tools/call", json!({"name": name, "arguments": arguments}));
    let size = serde_json::to_vec(&reply).unwrap().len();
    assert!(size < FRAME, "{name}: a reply of {size} bytes");
    let result = &reply["result"];
    assert!(result.is_object(), "{name}: {reply}");
    s.output_schemas().check(name, &result["structuredContent"]);
    reply
}

fn text_of(reply: &Value) -> String {
    reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn data_of(reply: &Value) -> Value {
    let envelope = &reply["result"]["structuredContent"];
    assert_eq!(envelope["ok"], true, "{envelope}");
    envelope["data"].clone()
}

/// No other message answers any of `ids` (a second reply, or a late one).
fn no_stray_replies(s: &mut Server, ids: &[u64]) {
    while let Some(msg) = s.recv(Duration::from_millis(300)) {
        if let Some(id) = msg.get("id").and_then(Value::as_u64) {
            assert!(!ids.contains(&id), "a second reply to {id}");
        }
    }
}

fn big_outputs(s: &mut Server, label: &str) {
    let fill =
        |bytes: usize, byte: &str| format!("head -c {bytes} /dev/zero | tr '\\000' '{byte}'");
    let cases = [
        ("230 000 bytes with base64", fill(230_000, "a")),
        ("1 MiB", fill(1 << 20, "a")),
        ("5 MiB", fill(5 << 20, "a")),
        (
            "escape-heavy on both streams",
            format!("{}; {} >&2", fill(262_144, "\\001"), fill(262_144, "\\002")),
        ),
    ];
    let first = s.next_request_id();
    for (what, command) in &cases {
        let reply = call_reply(
            s,
            "shell_run",
            json!({"command": command, "max_bytes": 262_144, "include_base64": true, "wait_ms": 30_000}),
        );
        let data = data_of(&reply);
        assert_eq!(data["state"], "succeeded", "{label} {what}");
        assert!(
            data["operation_id"]
                .as_str()
                .is_some_and(|id| !id.is_empty())
        );
        if *what == "escape-heavy on both streams" {
            // The text views cost six bytes per byte: they become exact base64.
            assert_eq!(data["stdout_text_state"], "omitted", "{label}");
            let page = decode_b64(data["stdout_base64"].as_str().unwrap());
            assert!(page.iter().all(|b| *b == 1) && !page.is_empty());
            assert_eq!(data["shrunk_to_fit"], true);
        }
    }
    // A running command: the reply carries its id and state while it runs on.
    let running = call_reply(
        s,
        "shell_run",
        json!({"command": format!("{}; sleep 30", fill(230_000, "a")), "max_bytes": 262_144,
               "include_base64": true, "wait_ms": 1500}),
    );
    let data = data_of(&running);
    assert_eq!(data["state"], "running", "{label}");
    let id = data["operation_id"].as_str().unwrap().to_owned();
    s.ok("operation_cancel", json!({"operation_id": id}));
    let last = s.next_request_id();
    no_stray_replies(s, &(first..last).collect::<Vec<_>>());
}

#[test]
fn large_and_escape_heavy_replies_arrive_whole_through_serve_and_connect() {
    let sb = Sandbox::new();
    let mut serve = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    big_outputs(&mut serve, "serve");
    drop(serve);

    let other = Sandbox::new();
    let (code, stderr) = other.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let mut proxy = other.connect();
    big_outputs(&mut proxy, "connect");
}

#[test]
fn fifty_megabytes_show_the_first_and_last_lines_and_the_final_stderr_line() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let reply = call_reply(
        &mut s,
        "shell_run",
        json!({"command": "seq -f 'line %.0f' 1 4500000; echo final-error >&2", "wait_ms": 50_000}),
    );
    let data = data_of(&reply);
    assert_eq!(data["state"], "succeeded", "{data}");
    assert!(data["stdout_total_bytes"].as_u64().unwrap() > 50_000_000);
    let head = data["stdout_text"].as_str().unwrap();
    assert!(head.starts_with("line 1\nline 2\n"), "{head:.40}");
    let tail = &data["tail"];
    assert!(
        tail["stdout_text"]
            .as_str()
            .unwrap()
            .ends_with("line 4499999\nline 4500000\n"),
        "{tail}"
    );
    assert_eq!(tail["stderr_text"], "final-error\n");
    assert!(tail["omitted_bytes"].as_u64().unwrap() > 50_000_000);
    assert_eq!(
        data["output_truncated"], true,
        "the middle outgrew retention"
    );
    assert!(data["hint"].as_str().unwrap().contains("tail_lines"));
    let text = text_of(&reply);
    for line in [
        "line 1\n",
        "line 4500000\n",
        "final-error\n",
        "bytes left out",
    ] {
        assert!(text.contains(line), "{line:?} in {text:.300}");
    }
}

#[test]
fn a_failing_test_run_reads_as_text_with_the_exit_code_first() {
    let sb = Sandbox::new();
    fs::write(
        sb.workspace().join("test_math.py"),
        "import unittest\n\nclass MathTest(unittest.TestCase):\n    def test_sum(self):\n        self.assertEqual(1 + 1, 3, \"it \\\"adds\\\"\")\n\nunittest.main()\n",
    )
    .unwrap();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let reply = call_reply(
        &mut s,
        "shell_run",
        json!({"command": "python3 test_math.py"}),
    );
    let data = data_of(&reply);
    assert_eq!(data["state"], "exited", "{data}");
    assert_eq!(data["exit_code"], 1);
    assert_eq!(
        data["error"],
        Value::Null,
        "a command's own failure is no error"
    );
    let text = text_of(&reply);
    let first = text.lines().next().unwrap();
    assert!(
        first.contains("exited with code 1")
            && first.contains(data["operation_id"].as_str().unwrap()),
        "{first}"
    );
    for verbatim in [
        "Traceback (most recent call last):\n",
        "    self.assertEqual(1 + 1, 3, \"it \\\"adds\\\"\")\n",
        "AssertionError: 2 != 3 : it \"adds\"\n",
    ] {
        assert!(text.contains(verbatim), "{verbatim:?} in {text}");
    }
    assert!(!text.contains("\\n"), "no escaped newlines: {text}");
}

/// Runs `sleep 30 # tag` without reading its reply.
fn start_unread(s: &mut Server, tag: &str) -> u64 {
    let id = s.next_request_id();
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "shell_run", "arguments": {"command": format!("sleep 30 # {tag}"), "wait_ms": 0}}}));
    id
}

#[test]
fn a_session_finds_its_operations_after_a_lost_reply_and_at_the_cap() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let first = start_unread(&mut s, "lost-reply");
    let mut started: Vec<String> = Vec::new();
    s.reply_to(first); // the client discards it
    let listed = s.ok("operation_list", json!({}));
    let ops = listed["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 1, "{listed}");
    assert_eq!(ops[0]["command"], "sleep 30 # lost-reply");
    assert_eq!(ops[0]["state"], "running");
    assert_eq!(listed["live"], 1);
    started.push(ops[0]["operation_id"].as_str().unwrap().to_owned());
    for n in 0..3 {
        let data = s.ok(
            "shell_run",
            json!({"command": format!("sleep 30 # {n}"), "wait_ms": 0}),
        );
        started.push(data["operation_id"].as_str().unwrap().to_owned());
    }
    let refused = s.call("shell_run", json!({"command": "true"}));
    assert_eq!(refused["error"]["kind"], "capacity_exhausted", "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    for id in &started {
        assert!(message.contains(id.as_str()), "{id} in {message}");
    }
    let listed = s.ok("operation_list", json!({"limit": 2}));
    assert_eq!(listed["operations"].as_array().unwrap().len(), 2);
    assert_eq!(listed["more_available"], true);
    assert_eq!(
        listed["operations"][0]["operation_id"],
        started[3].as_str(),
        "newest first"
    );
    for id in &started {
        s.ok("operation_cancel", json!({"operation_id": id}));
    }
}

#[test]
fn outcomes_say_what_happened_and_what_to_do() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let timed_out = s.ok(
        "shell_run",
        json!({"command": "sleep 10", "timeout_ms": 2000, "wait_ms": 20_000}),
    );
    assert_eq!(timed_out["state"], "timed_out", "{timed_out}");
    assert_eq!(timed_out["error"]["retryable"], false);
    let advice = timed_out["error"]["message"].as_str().unwrap();
    assert!(
        advice.contains("timeout_ms") && advice.contains("wait_ms 0"),
        "{advice}"
    );

    let exited = s.ok("shell_run", json!({"command": "exit 1"}));
    assert_eq!(
        (exited["state"].as_str(), exited["exit_code"].as_i64()),
        (Some("exited"), Some(1))
    );
    assert_eq!(exited["error"], Value::Null);
    // A backend that fails is `failed` with the reason, never `exited`.
    let home = sb.root().join("default");
    fs::create_dir_all(home.join(".shim/fail")).unwrap();
    fs::write(home.join(".shim/fail/load"), "1").unwrap();
    let broken = s.ok("prewarm", json!({"wait_ms": 20_000}));
    assert_eq!(broken["state"], "failed", "{broken}");
    assert_eq!(broken["error"]["kind"], "backend_failed");
    fs::remove_file(home.join(".shim/fail/load")).unwrap();

    let unknown = s.call("prewarm", json!({"selection": "python"}));
    assert_eq!(unknown["error"]["kind"], "not_found", "{unknown}");
    let message = unknown["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("python") && message.contains("kit"),
        "{message}"
    );

    let scope = s.start_scope();
    let refused = s.call("scope_remove", json!({"scope_id": scope}));
    assert_eq!(refused["error"]["kind"], "scope_not_ready", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("scope_stop"),
        "{refused}"
    );
}

#[test]
fn paging_by_odd_byte_counts_never_splits_a_character() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let run = s.ok(
        "shell_run",
        json!({"command": "for i in $(seq 1 300); do printf 'é€'; done"}),
    );
    let id = run["operation_id"].as_str().unwrap().to_owned();
    let whole = "é€".repeat(300);
    for max_bytes in [1, 3, 5, 7] {
        let (mut text, mut since) = (String::new(), 0u64);
        loop {
            let page = s.ok(
                "operation_output",
                json!({"operation_id": id, "since_seq": since, "max_bytes": max_bytes}),
            );
            assert_eq!(page["stdout_text_state"], "utf8", "{page}");
            let piece = page["stdout_text"].as_str().unwrap();
            assert!(!piece.contains('\u{fffd}'), "{page}");
            text.push_str(piece);
            if page["more_to_page"] == false {
                break;
            }
            since = page["next_seq"].as_u64().unwrap();
        }
        assert_eq!(text, whole, "max_bytes {max_bytes}");
    }
}

/// A refusal repeats a bounded excerpt of a huge argument, so it arrives; a number
/// with a zero fraction is an integer, as JSON Schema says.
#[test]
fn huge_arguments_are_refused_briefly_and_integral_numbers_are_integers() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let huge = "A".repeat(900_000);
    let reply = call_reply(
        &mut s,
        "scope_results_list",
        json!({"scope_id": "default", "limit": huge}),
    );
    let envelope = &reply["result"]["structuredContent"];
    assert_eq!(
        envelope["error"]["kind"], "invalid_argument",
        "{envelope:.300}"
    );
    assert!(envelope["error"]["message"].as_str().unwrap().len() < 1024);
    let unknown = s.request("tools/call", json!({"name": huge, "arguments": {}}));
    assert_eq!(unknown["error"]["code"], -32602);
    assert!(
        serde_json::to_vec(&unknown).unwrap().len() < 4096,
        "{unknown:.300}"
    );

    let run = s.ok(
        "shell_run",
        json!({"command": "echo integral", "timeout_ms": 100000.0, "wait_ms": 1e4, "max_bytes": 4096.0}),
    );
    assert_eq!(run["stdout_text"], "integral\n");
    assert_eq!(run["timeout_ms"], 100_000);
    assert_eq!(
        s.err_kind("shell_run", json!({"command": "true", "timeout_ms": 100.5})),
        "invalid_argument"
    );
}
