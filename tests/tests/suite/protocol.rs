//! Protocol hygiene: oversized frames, malformed JSON, requests before `initialize`,
//! repeated `initialize`, unknown versions and tools, and argument validation that
//! rejects bad input before any child starts.

use std::time::Duration;

use marsh_tests::{Sandbox, Server, TOOLS, host_processes_with};
use serde_json::{Value, json};

fn raw_server(sb: &Sandbox) -> Server {
    Server::spawn(sb.marsh_mcp(&sb.serve_home_args(&[]), &[]))
}

#[test]
fn two_mib_frame_is_answered_and_the_session_continues() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let mut frame = br#"{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"shell_run","arguments":{"command":""#.to_vec();
    frame.extend(std::iter::repeat_n(b'x', 2 * 1024 * 1024));
    frame.extend_from_slice(b"\"}}}\n");
    s.send_raw(&frame);
    let reply = s
        .recv(Duration::from_secs(30))
        .expect("an answer to the oversized frame");
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    assert_eq!(
        reply["id"], 99,
        "the id found in the frame's prefix is answered"
    );
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exceeds")
    );
    let data = s.ok("shell_run", json!({"command": "echo alive"}));
    assert_eq!(data["stdout_text"], "alive\n");
    assert!(
        sb.invocations(&sb.home())
            .iter()
            .all(|i| !i["argv"].to_string().contains("xxxx"))
    );
}

#[test]
fn malformed_json_and_non_jsonrpc_lines_get_errors_without_work() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.send_raw(b"{not json\n");
    let reply = s.recv(Duration::from_secs(10)).unwrap();
    assert_eq!(reply["error"]["code"], -32700);
    s.send_raw(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":5,\"method\":3}\n");
    let reply = s.recv(Duration::from_secs(10)).unwrap();
    assert!(reply.get("error").is_some(), "{reply}");
    assert_eq!(s.ok("status", json!({}))["state"], "ready");
}

/// Every marsh invocation but the read-only `status` (which `initialize` and
/// `tools/list` use for the shell's facts).
fn runs_and_changes(sb: &Sandbox) -> Vec<Value> {
    sb.invocations(&sb.home())
        .into_iter()
        .filter(|i| i["argv"][1] != "status")
        .collect()
}

#[test]
fn requests_before_initialize_fail_cleanly_and_start_nothing() {
    let sb = Sandbox::new();
    let mut s = raw_server(&sb);
    let reply = s.request(
        "tools/call",
        json!({"name": "shell_run", "arguments": {"command": "touch pre-init"}}),
    );
    assert!(reply.get("error").is_some(), "{reply}");
    let reply = s.request("tools/list", json!({}));
    assert!(reply.get("error").is_some(), "{reply}");
    // A notification before initialize is ignored, not fatal.
    s.notify("notifications/initialized", json!({}));
    let init = s.initialize();
    assert!(init.get("result").is_some(), "{init}");
    assert!(!sb.workspace().join("pre-init").exists());
    // `initialize` reads the project shell's facts (one read-only `marsh status`).
    assert_eq!(runs_and_changes(&sb), Vec::<Value>::new());
}

#[test]
fn repeated_initialize_is_refused_and_the_session_continues() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let again = s.initialize();
    assert_eq!(again["error"]["code"], -32600, "{again}");
    assert_eq!(s.ok("status", json!({}))["state"], "ready");
}

#[test]
fn unknown_protocol_version_is_negotiated_down_not_accepted() {
    let sb = Sandbox::new();
    let mut s = raw_server(&sb);
    let reply = s.request(
        "initialize",
        json!({"protocolVersion": "1999-01-01", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}),
    );
    match reply.get("result") {
        Some(result) => assert_ne!(result["protocolVersion"], "1999-01-01"),
        None => assert!(reply.get("error").is_some()),
    }
}

#[test]
fn unknown_tool_is_a_protocol_error() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let reply = s.request("tools/call", json!({"name": "host_shell", "arguments": {}}));
    assert_eq!(reply["error"]["code"], -32602);
}

#[test]
fn tools_list_is_the_exact_catalog_with_closed_schemas() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let reply = s.request("tools/list", json!({}));
    let tools = reply["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, TOOLS);
    for t in tools {
        assert_eq!(
            t["inputSchema"]["additionalProperties"], false,
            "{}",
            t["name"]
        );
        assert!(t.get("outputSchema").is_some(), "{}", t["name"]);
    }
}

/// Every tool has a title and truthful hints, and every optional parameter is plainly
/// typed (form-based clients and CLIs cannot set `["integer", "null"]`) with a default.
#[test]
fn tools_list_titles_hints_and_plain_optional_parameters() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let reply = s.request("tools/list", json!({}));
    // With every tool's output schema (suite::output_schemas measures it too).
    let body = reply["result"].to_string();
    assert!(
        body.len() <= 32 * 1024,
        "tools/list is {} bytes",
        body.len()
    );
    let tools = reply["result"]["tools"].as_array().unwrap();
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap();
    for t in tools {
        let title = t["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "{}", t["name"]);
        for hint in [
            "readOnlyHint",
            "destructiveHint",
            "idempotentHint",
            "openWorldHint",
        ] {
            let value = &t["annotations"][hint];
            assert!(
                value.is_null() || value.is_boolean(),
                "{} {hint}",
                t["name"]
            );
        }
        let schema = &t["inputSchema"];
        assert!(!schema.to_string().contains("\"null\""), "{schema}");
        let required = schema["required"].as_array().cloned().unwrap_or_default();
        for (name, prop) in schema["properties"].as_object().into_iter().flatten() {
            assert!(prop["type"].is_string(), "{}.{name}", t["name"]);
            if !required.contains(&json!(name)) {
                assert!(prop.get("default").is_some(), "{}.{name}", t["name"]);
            }
        }
    }
    // A hint is written only where it differs from the MCP default; this is what a
    // client reads (destructive and idempotent mean something only when not read-only).
    let hint = |name: &str, which: &str| {
        let a = &tool(name)["annotations"];
        let read_only = a["readOnlyHint"].as_bool().unwrap_or(false);
        match which {
            "readOnlyHint" => read_only,
            "destructiveHint" => !read_only && a[which].as_bool().unwrap_or(true),
            "idempotentHint" => read_only || a[which].as_bool().unwrap_or(false),
            _ => a[which].as_bool().unwrap_or(true),
        }
    };
    for name in [
        "shell_run",
        "scope_run",
        "qualify",
        "scope_remove",
        "workers_reset",
    ] {
        assert!(hint(name, "destructiveHint"), "{name}");
        assert!(!hint(name, "readOnlyHint"), "{name}");
    }
    assert!(!hint("shell_run", "idempotentHint"));
    assert!(hint("shell_run", "openWorldHint"));
    assert!(hint("status", "readOnlyHint"));
    assert!(!hint("status", "destructiveHint"));
    assert!(!hint("status", "openWorldHint"));
    assert!(!hint("prewarm", "destructiveHint"));
    assert!(hint("operation_list", "readOnlyHint"));
    assert_eq!(tool("shell_run")["title"], "Run a shell command");
    let run = &tool("shell_run")["inputSchema"]["properties"];
    assert_eq!(run["wait_ms"]["type"], "integer");
    assert_eq!(run["wait_ms"]["default"], 15_000);
    assert_eq!(run["include_base64"]["type"], "boolean");
    assert_eq!(run["include_base64"]["default"], false);
    // An explicit null is still accepted and means the default.
    let reply = s.request(
        "tools/call",
        json!({"name": "shell_run", "arguments": {"command": "echo hi", "wait_ms": null, "include_base64": null}}),
    );
    assert_eq!(reply["result"]["structuredContent"]["ok"], true, "{reply}");
    s.close();
}

#[test]
fn invalid_arguments_are_rejected_before_any_child_starts() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let cases: Vec<(&str, Value)> = vec![
        ("shell_run", json!({"command": "touch bad", "cwd": "/"})),
        (
            "shell_run",
            json!({"command": "touch bad", "env": {"A": "1"}}),
        ),
        ("shell_run", json!({"command": 42})),
        ("shell_run", json!({})),
        ("shell_run", json!({"command": ""})),
        ("shell_run", json!({"command": "x".repeat(65537)})),
        ("shell_run", json!({"command": "touch bad\u{0}"})),
        ("shell_run", json!({"command": "touch bad\u{1b}[0m"})),
        (
            "shell_run",
            json!({"command": "touch bad", "timeout_ms": 5}),
        ),
        (
            "shell_run",
            json!({"command": "touch bad", "timeout_ms": 900001}),
        ),
        (
            "shell_run",
            json!({"command": "touch bad", "wait_ms": 55001}),
        ),
        (
            "shell_run",
            json!({"command": "touch bad", "timeout_ms": 1.5}),
        ),
        ("result_get", json!({"selector": "../etc"})),
        ("result_get", json!({"selector": "a".repeat(65)})),
        ("prewarm", json!({"selection": "Bad Name"})),
        ("prewarm", json!({"selection": vec!["k"; 17].join(",")})),
        ("workers_reset", json!({"selection": "all", "extra": 1})),
        ("status", json!({"verbose": true})),
        ("operation_get", json!({"operation_id": 5})),
        ("qualify", json!({"gate": "everything"})),
    ];
    for (tool, args) in cases {
        let kind = s.err_kind(tool, args.clone());
        assert_eq!(kind, "invalid_argument", "{tool} {args}");
    }
    assert!(!sb.workspace().join("bad").exists());
    assert!(
        runs_and_changes(&sb).is_empty(),
        "a child ran: {:?}",
        sb.invocations(&sb.home())
    );
}

#[test]
fn flag_like_selections_and_selectors_never_reach_marsh() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.ok("shell_run", json!({"command": "true"}));
    let before = sb.invocations(&sb.home()).len();
    for (tool, arguments) in [
        ("prewarm", json!({"selection": "--all"})),
        ("prewarm", json!({"selection": "alpha,-c"})),
        ("workers_reset", json!({"selection": "--json"})),
        ("result_get", json!({"selector": "-c"})),
        ("result_get", json!({"selector": "--"})),
    ] {
        assert_eq!(
            s.err_kind(tool, arguments.clone()),
            "invalid_argument",
            "{tool} {arguments}"
        );
    }
    assert_eq!(
        sb.invocations(&sb.home()).len(),
        before,
        "a refused value never reaches marsh"
    );
}

/// Duplicate in-flight ids, batches, oversized frames (answered with their id),
/// nameless `tools/call` and requests before `initialize` are each answered with a
/// JSON-RPC error, and the session goes on.
fn protocol_edges_are_answered(s: &mut Server, workspace: &std::path::Path) {
    let call = |id: u64, command: &str| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "shell_run", "arguments": {"command": command, "wait_ms": 20000}}})
    };
    s.send(&call(900, "sleep 1; echo first"));
    s.send(&call(900, "touch second-ran"));
    let refused = s.reply_to(900);
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    let first = s.reply_to(900);
    assert_eq!(
        first["result"]["structuredContent"]["data"]["stdout_text"], "first\n",
        "{first}"
    );
    assert!(!workspace.join("second-ran").exists(), "the duplicate ran");

    s.send_raw(b"[{\"jsonrpc\":\"2.0\",\"id\":901,\"method\":\"ping\"}]\n");
    let batch = s
        .recv(Duration::from_secs(10))
        .expect("a batch gets an answer");
    assert_eq!(
        (batch["id"].clone(), batch["error"]["code"].clone()),
        (Value::Null, json!(-32600))
    );

    let mut frame =
        br#"{"jsonrpc":"2.0","id":902,"method":"tools/call","params":{"name":"shell_run","arguments":{"command":""#.to_vec();
    frame.extend(std::iter::repeat_n(b'x', 2 * 1024 * 1024));
    frame.extend_from_slice(b"\"}}}\n");
    s.send_raw(&frame);
    let oversized = s.reply_to(902);
    assert_eq!(oversized["error"]["code"], -32600, "{oversized}");

    for params in [json!({}), json!({"name": "status", "arguments": [1]})] {
        let id = s.next_request_id();
        s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
        assert_eq!(s.reply_to(id)["error"]["code"], -32602, "{params}");
    }
    assert_eq!(s.ok("status", json!({}))["scope_id"], "default");
}

#[test]
fn protocol_edges_are_answered_directly_and_through_connect() {
    let sb = Sandbox::new();
    let mut early = Server::spawn(sb.marsh_mcp(&sb.serve_home_args(&[]), &[]));
    early.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}));
    let answer = early.reply_to(1);
    assert_eq!(answer["error"]["code"], -32600, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("initialize")
    );
    assert!(
        early.initialize().get("result").is_some(),
        "the session still starts"
    );

    let mut direct = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    protocol_edges_are_answered(&mut direct, &sb.workspace());
    drop(direct);

    let other = Sandbox::new();
    let (code, stderr) = other.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let mut proxied = other.connect();
    protocol_edges_are_answered(&mut proxied, &other.workspace());
}

#[test]
fn a_session_stalled_on_half_a_frame_ends_and_cancels_its_operations() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.ok(
        "shell_run",
        json!({"command": "sleep 300.5151", "wait_ms": 0}),
    );
    s.send_raw(br#"{"jsonrpc":"2.0","id":77,"method":"#);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = s.try_wait() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "the stalled session was never closed"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        started.elapsed() >= Duration::from_secs(55),
        "closed before the partial-frame bound: {:?} ({status})",
        started.elapsed()
    );
    // The session's operation was cancelled with it: its job is gone from the host.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if host_processes_with("sleep 300.5151").is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the operation outlived its session"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A Codex registration is account-wide: an agent opened in another repository must
/// see which workspace this server runs commands in (its directory name, never the
/// host path of it).
#[test]
fn instructions_and_run_descriptions_name_the_workspace_directory() {
    let sb = Sandbox::new();
    let mut s = Server::spawn(sb.marsh_mcp(&sb.serve_home_args(&[]), &[]));
    let init = s.initialize();
    let project = sb
        .workspace()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let instructions = init["result"]["instructions"].as_str().unwrap();
    assert!(
        instructions.contains(&format!("`{project}`")),
        "{instructions}"
    );
    assert!(!instructions.contains(&sb.workspace().display().to_string()));
    let list = s.request("tools/list", json!({}));
    for tool in list["result"]["tools"].as_array().unwrap() {
        let description = tool["description"].as_str().unwrap();
        let names_it = description.contains(&format!("`{project}`"));
        match tool["name"].as_str().unwrap() {
            "shell_run" | "scope_run" => assert!(names_it, "{description}"),
            _ => assert!(!names_it, "{description}"),
        }
        assert!(!description.contains(&sb.workspace().display().to_string()));
    }
    s.close();
}

#[test]
fn requests_already_read_are_answered_after_stdin_ends() {
    let sb = Sandbox::new();
    let mut s = raw_server(&sb);
    s.initialize();
    // Three requests in one write, then EOF: each is answered before the server exits.
    let mut batch = Vec::new();
    for (id, method, params) in [
        (101, "tools/list", json!({})),
        (
            102,
            "tools/call",
            json!({"name": "status", "arguments": {}}),
        ),
        (
            103,
            "tools/call",
            json!({"name": "shell_run", "arguments": {"command": "echo drained"}}),
        ),
    ] {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        batch.extend_from_slice(line.to_string().as_bytes());
        batch.push(b'\n');
    }
    s.send_raw(&batch);
    s.close_input();
    // Replies come in any order; read them all until the server closes stdout.
    let mut replies = std::collections::HashMap::new();
    while let Some(msg) = s.recv(Duration::from_secs(60)) {
        if let Some(id) = msg.get("id").and_then(Value::as_u64) {
            replies.insert(id, msg);
        }
    }
    assert!(replies[&101]["result"]["tools"].is_array(), "{replies:?}");
    assert_eq!(replies[&102]["result"]["structuredContent"]["ok"], true);
    assert_eq!(
        replies[&103]["result"]["structuredContent"]["data"]["stdout_text"], "drained\n",
        "{:?}",
        replies[&103]
    );
    assert!(s.close().success());
}

/// The JSON text of a reply line's `id`, exactly as written.
fn raw_id(line: &str) -> String {
    #[derive(serde::Deserialize)]
    struct IdText<'a> {
        #[serde(borrow)]
        id: &'a serde_json::value::RawValue,
    }
    serde_json::from_str::<IdText>(line)
        .unwrap_or_else(|e| panic!("{e}: {line}"))
        .id
        .get()
        .to_string()
}

/// Ids are kept exactly as sent: requests whose ids are equal as numbers but written
/// differently (`0`/`-0`, `5001`/`5001.0`) each get their own reply, ids beyond 64 bits
/// and in exponent form are echoed as written, a duplicate in flight is refused without
/// touching the first, and an id is free again once answered.
#[test]
fn request_ids_are_kept_exactly_as_sent() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    let sb = Sandbox::new();
    let mut child = sb
        .marsh_mcp(&sb.serve_home_args(&[]), &[])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |text: &str| {
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    };
    send(
        r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}"#,
    );
    assert_eq!(raw_id(&lines.next().unwrap().unwrap()), r#""init""#);
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let call = |id: &str, tool: &str, arguments: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{arguments}}}}}"#
        )
    };
    let slow = |word: &str| format!(r#"{{"command":"sleep 1; echo {word}"}}"#);
    send(&call("0", "shell_run", &slow("zero")));
    send(&call("-0", "status", "{}"));
    send(&call("5001", "shell_run", &slow("int")));
    send(&call("5001.0", "status", "{}"));
    send(&call("5001", "status", "{}"));
    for id in ["18446744073709551617", "-9223372036854775809", "1e3"] {
        send(&format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#));
    }
    let mut replies: Vec<(String, String)> = Vec::new();
    while replies.len() < 8 {
        let line = lines.next().unwrap().unwrap();
        replies.push((raw_id(&line), line));
    }
    let with = |id: &str| -> Vec<&String> {
        replies
            .iter()
            .filter(|(raw, _)| raw == id)
            .map(|(_, line)| line)
            .collect()
    };
    assert!(with("0")[0].contains(r#"zero\n"#), "{:?}", with("0"));
    assert!(with("-0")[0].contains("active_runs"), "{:?}", with("-0"));
    assert!(
        with("5001.0")[0].contains("active_runs"),
        "{:?}",
        with("5001.0")
    );
    let int = with("5001");
    assert_eq!(int.len(), 2, "{int:?}");
    assert!(int.iter().any(|l| l.contains("still in flight")), "{int:?}");
    assert!(int.iter().any(|l| l.contains(r#"int\n"#)), "{int:?}");
    for id in ["18446744073709551617", "-9223372036854775809", "1e3"] {
        assert!(with(id)[0].contains(r#""result":{}"#), "{id}: {replies:?}");
    }
    // Answered, so free again.
    send(r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#);
    let line = lines.next().unwrap().unwrap();
    assert_eq!(raw_id(&line), "0");
    assert!(line.contains(r#""result":{}"#), "{line}");
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// A frame with a duplicate key anywhere is refused before anything runs (serde keeps
/// the last one, a policy layer in front might keep the first), with the request's id
/// and `-32602` when the duplicate is in the arguments; a top-level JSON value that is
/// not an object gets an error with `id: null` instead of silence.
#[test]
fn duplicate_keys_and_non_object_lines_are_refused() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    s.send_raw(br#"{"jsonrpc":"2.0","id":71,"method":"tools/call","params":{"name":"doctor","name":"shell_run","arguments":{"command":"touch dup-name"}}}"#);
    s.send_raw(b"\n");
    let reply = s.reply_to(71);
    assert_eq!(reply["error"]["code"], -32600, "{reply}");
    s.send_raw(br#"{"jsonrpc":"2.0","id":72,"method":"tools/call","params":{"name":"shell_run","arguments":{"command":"true","command":"touch dup-arg"}}}"#);
    s.send_raw(b"\n");
    let reply = s.reply_to(72);
    assert_eq!(reply["error"]["code"], -32602, "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("params.arguments.command"),
        "{reply}"
    );
    for line in ["\"a string\"", "42", "null", "true"] {
        s.send_raw(format!("{line}\n").as_bytes());
        let answer = s
            .recv(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no answer to {line}"));
        assert_eq!(answer["id"], Value::Null, "{answer}");
        assert_eq!(answer["error"]["code"], -32600, "{answer}");
    }
    // Nothing ran, and the session goes on.
    assert_eq!(
        s.ok("shell_run", json!({"command": "ls"}))["stdout_text"],
        ""
    );
    assert!(!sb.workspace().join("dup-name").exists());
    assert!(!sb.workspace().join("dup-arg").exists());
}
