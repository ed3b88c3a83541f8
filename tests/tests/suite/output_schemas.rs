//! Every tool's real results against the `outputSchema` it publishes. The harness
//! checks each result `Server::call` returns (the envelope with a JSON Schema validator,
//! then `data` with the schema closed, so an unnamed field fails); this suite makes sure
//! every tool is reached, in each of its result shapes, and measures `tools/list`.

use std::collections::BTreeSet;
use std::fs;

use marsh_tests::{Sandbox, Server};
use serde_json::{Value, json};

/// The bound on the whole `tools/list` result (every byte is read by the model
/// each session).
const TOOLS_LIST_MAX: usize = 32 * 1024;

/// Calls `name` expecting success and records that a successful result of it was
/// checked against its schema.
fn ok(s: &mut Server, seen: &mut BTreeSet<String>, name: &str, args: Value) -> Value {
    let data = s.ok(name, args);
    seen.insert(name.to_string());
    data
}

#[test]
fn every_tool_answers_what_its_output_schema_describes() {
    let sb = Sandbox::new();
    fs::write(
        sb.workspace().join("Makefile"),
        "test:\n\t@echo qualified\n",
    )
    .unwrap();
    let mut s = Server::start(&sb, &sb.serve_root_args(&["--allow-full-sbx-control"]), &[]);
    let list = s.request("tools/list", json!({}));
    let bytes = serde_json::to_vec(&list["result"]).unwrap().len();
    eprintln!("tools/list result: {bytes} bytes");
    assert!(bytes <= TOOLS_LIST_MAX, "tools/list is {bytes} bytes");
    let names: BTreeSet<String> = s.tool_names().into_iter().collect();
    let mut seen = BTreeSet::new();
    let seen = &mut seen;

    ok(&mut s, seen, "doctor", json!({}));
    ok(&mut s, seen, "status", json!({}));
    // Inline, not UTF-8 (lossy text, exact base64), both streams.
    let run = ok(
        &mut s,
        seen,
        "shell_run",
        json!({"command": "printf 'ok\\377'; echo err >&2", "include_base64": true}),
    );
    assert_eq!(run["stdout_text_state"], "lossy", "{run}");
    // Still running: the operation and its hint.
    let slow = ok(
        &mut s,
        seen,
        "shell_run",
        json!({"command": "sleep 1; echo late", "wait_ms": 0}),
    );
    assert_eq!(slow["state"], "running", "{slow}");
    let id = slow["operation_id"].as_str().unwrap();
    let done = ok(
        &mut s,
        seen,
        "operation_get",
        json!({"operation_id": id, "wait_ms": 20000}),
    );
    assert_eq!(done["wait_result"], "ended", "{done}");
    let listed = ok(&mut s, seen, "operation_list", json!({}));
    assert_eq!(listed["operations"][0]["operation_id"], id, "{listed}");
    let capped = ok(
        &mut s,
        seen,
        "operation_output",
        json!({"operation_id": id, "max_bytes": 1}),
    );
    assert_eq!(capped["more_to_page"], true, "{capped}");
    ok(
        &mut s,
        seen,
        "operation_output",
        json!({"operation_id": id, "tail_lines": 1}),
    );
    let long = s.ok("shell_run", json!({"command": "sleep 30", "wait_ms": 0}));
    let cancel = ok(
        &mut s,
        seen,
        "operation_cancel",
        json!({"operation_id": long["operation_id"]}),
    );
    assert_eq!(cancel["cancel_accepted"], true, "{cancel}");
    let listed = ok(&mut s, seen, "results_list", json!({"limit": 2}));
    let receipt = listed["results"][0]["id"].as_str().unwrap()[..8].to_string();
    ok(&mut s, seen, "result_get", json!({"selector": receipt}));
    ok(&mut s, seen, "prewarm", json!({"wait_ms": 30000}));
    ok(&mut s, seen, "workers_reset", json!({"wait_ms": 30000}));
    ok(
        &mut s,
        seen,
        "qualify",
        json!({"gate": "source", "wait_ms": 30000}),
    );

    // A generated scope through its whole life.
    ok(&mut s, seen, "scope_list", json!({}));
    let started = ok(&mut s, seen, "scope_start", json!({}));
    let scope = started["scope_id"].as_str().unwrap().to_string();
    let at = |extra: Value| {
        let mut args = json!({"scope_id": scope});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args
    };
    ok(&mut s, seen, "scope_status", at(json!({})));
    ok(
        &mut s,
        seen,
        "scope_run",
        at(json!({"command": "echo in-scope"})),
    );
    ok(&mut s, seen, "scope_prewarm", at(json!({"wait_ms": 30000})));
    ok(
        &mut s,
        seen,
        "scope_workers_reset",
        at(json!({"wait_ms": 30000})),
    );
    ok(&mut s, seen, "scope_reset", at(json!({"wait_ms": 30000})));
    let stopped = ok(&mut s, seen, "scope_stop", at(json!({"wait_ms": 30000})));
    assert_eq!(stopped["state"], "succeeded", "{stopped}");
    // Already stopped: only the scope and a note.
    let again = ok(&mut s, seen, "scope_stop", at(json!({})));
    assert!(again["note"].is_string(), "{again}");
    // A stopped scope's read: pending, then through operation_get, then inline.
    let pending = ok(
        &mut s,
        seen,
        "scope_results_list",
        at(json!({"wait_ms": 0})),
    );
    if let Some(op) = pending["operation"]["operation_id"].as_str() {
        let read = s.ok(
            "operation_get",
            json!({"operation_id": op, "wait_ms": 30000}),
        );
        assert_eq!(read["state"], "succeeded", "{read}");
    }
    let read = ok(
        &mut s,
        seen,
        "scope_results_list",
        at(json!({"wait_ms": 55000})),
    );
    let in_scope = read["results"][0]["id"].as_str().unwrap()[..8].to_string();
    ok(
        &mut s,
        seen,
        "scope_result_get",
        at(json!({"selector": in_scope, "wait_ms": 55000})),
    );
    ok(&mut s, seen, "scope_remove", at(json!({"wait_ms": 30000})));

    // Failures are checked too: the envelope's `error`.
    assert_eq!(
        s.err_kind("scope_status", json!({"scope_id": "default-nope"})),
        "invalid_argument"
    );
    assert_eq!(
        s.err_kind("operation_get", json!({"operation_id": "0"})),
        "unknown_operation"
    );

    let missed: Vec<&String> = names.difference(seen).collect();
    assert!(missed.is_empty(), "never checked: {missed:?}");
}
