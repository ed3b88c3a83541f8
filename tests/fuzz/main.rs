//! A structure-aware, seeded fuzzer of the MCP surface, against `serve` and `connect`.
//!
//! Each step writes one line built from the protocol's structure, mutated: requests
//! with ids of every JSON form (small, beyond 64 bits, `-0`, `1e3`, `5.0`, strings,
//! unicode), every tool with arguments drawn from its schema and then broken (wrong
//! types, out of range, zero-fraction numbers, unknown fields, huge strings, control
//! bytes), cancellations of requests in flight, duplicate keys, top-level
//! non-objects, non-JSON, half-sent and oversized frames. Up to 8 requests are in
//! flight at once.
//!
//! Checked on every line the server writes: it is one JSON object of at most 1 MiB,
//! `jsonrpc: "2.0"`; an `id` is the exact text of a request in flight (answered once:
//! a second answer, or an answer to an id never sent, fails); a tool result has its
//! envelope and a readable text. At the end every request not cancelled has had its
//! answer, and after stdin EOF the process exits 0 within 15 s.
//!
//! `FUZZ_SEED` replays a run, `FUZZ_SECONDS` bounds it (default 10 per target); the
//! seed is printed first. `make fuzz` runs longer; `make test` runs the default.

// A test program: a broken expectation is a panic with the seed, as in the suites.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use marsh_tests::{Rng, Sandbox, TOOLS};
use serde_json::value::RawValue;
use serde_json::{Value, json};

const FRAME: usize = 1024 * 1024;
const IN_FLIGHT: usize = 8;
const EXIT_BOUND: Duration = Duration::from_secs(15);

/// What a line sent expects back.
enum Expect {
    /// One answer carrying exactly this id text (or none, if cancelled meanwhile).
    Answer(String),
    /// Nothing, or an error answer with `id: null`.
    NoneOrNullError,
    /// Nothing; the request with this id text may now go unanswered.
    Cancels(String),
}

/// A distinct id text of some JSON form.
fn id_text(rng: &mut Rng, n: u64) -> String {
    match rng.below(9) {
        0 => n.to_string(),
        1 => format!("{}{:020}", n, rng.below(1_000_000)),
        2 => format!("-{n}"),
        3 => format!("{n}.0"),
        4 => format!("{n}e0"),
        5 => format!("\"s-{n}\""),
        6 => format!("\"é\\u00e9-{n}\""),
        7 => format!("\"{}-{n}\"", "x".repeat(rng.below(300) as usize)),
        _ => format!("{}.5", n),
    }
}

fn huge(rng: &mut Rng) -> Value {
    Value::from("A".repeat(1000 + rng.below(800_000) as usize))
}

/// A value of a random JSON type, sometimes of the right one.
fn any_value(rng: &mut Rng) -> Value {
    match rng.below(10) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(50)),
        2 => json!(rng.below(2_000_000)),
        3 => json!(-(rng.below(100) as i64)),
        4 => json!(rng.below(100_000) as f64),
        5 => json!(0.5 + rng.below(100) as f64),
        6 => json!("all"),
        7 => json!("\u{1}\u{7f}\n\"\\"),
        8 => json!([1, 2]),
        _ => json!({"nested": true}),
    }
}

fn command(rng: &mut Rng) -> String {
    rng.pick(&[
        "echo hi",
        "printf 'caf\\303\\251 \\001\\002'",
        "exit 3",
        "head -c 300000 /dev/zero | tr '\\000' '\\001'",
        "seq 1 20000",
        "printf '\\377\\376'",
        "sleep 0.3; echo slept",
        "echo err >&2; false",
    ])
    .to_string()
}

/// Arguments for `tool`, from its schema's shape, then mutated.
fn arguments(rng: &mut Rng, tool: &str) -> Value {
    let mut args = serde_json::Map::new();
    if tool.starts_with("scope_") && !matches!(tool, "scope_start" | "scope_list") {
        args.insert(
            "scope_id".into(),
            json!(rng.pick(&["default", "nope", "0"])),
        );
    }
    match tool {
        "shell_run" | "scope_run" => {
            args.insert("command".into(), json!(command(rng)));
            args.insert("wait_ms".into(), json!(rng.below(3000)));
            if rng.chance(30) {
                args.insert("max_bytes".into(), json!(1 + rng.below(262_144)));
            }
            if rng.chance(30) {
                args.insert("include_base64".into(), json!(true));
            }
        }
        "operation_get" | "operation_output" | "operation_cancel" => {
            args.insert(
                "operation_id".into(),
                json!(rng.pick(&["00000000-0000-4000-8000-000000000000", "x"])),
            );
        }
        "result_get" | "scope_result_get" => {
            args.insert("selector".into(), json!(rng.pick(&["0", "ab", "-x"])));
        }
        "prewarm" | "workers_reset" | "scope_prewarm" | "scope_workers_reset" => {
            args.insert(
                "selection".into(),
                json!(rng.pick(&["all", "python", "a,b"])),
            );
            args.insert("wait_ms".into(), json!(0));
        }
        "qualify" => {
            args.insert("gate".into(), json!("source"));
        }
        _ => {}
    }
    // Mutations.
    if rng.chance(25) && !args.is_empty() {
        let keys: Vec<String> = args.keys().cloned().collect();
        let key = rng.pick(&keys).clone();
        args.insert(key, any_value(rng));
    }
    if rng.chance(10) {
        args.insert("unknown_field".into(), any_value(rng));
    }
    if rng.chance(3) {
        args.insert("limit".into(), huge(rng));
    }
    if rng.chance(10) {
        args.insert("timeout_ms".into(), json!(100_000.0));
    }
    Value::Object(args)
}

/// Tools whose calls only read or run short commands; lifecycle tools are exercised
/// by the chaos harness, not here.
fn fuzz_tool(rng: &mut Rng) -> String {
    if rng.chance(5) {
        return format!("nope-{}", rng.below(10));
    }
    let safe: Vec<&str> = TOOLS
        .iter()
        .copied()
        .filter(|t| {
            !matches!(
                *t,
                "scope_start" | "scope_stop" | "scope_remove" | "scope_reset"
            )
        })
        .collect();
    rng.pick(&safe).to_string()
}

/// One line and what it expects; `ids` hands out distinct ids.
fn message(rng: &mut Rng, ids: &mut u64, in_flight: &[String]) -> (Vec<u8>, Expect) {
    *ids += 1;
    let id = id_text(rng, *ids);
    let line = match rng.below(100) {
        0..=59 => {
            let tool = fuzz_tool(rng);
            let params = json!({"name": tool, "arguments": arguments(rng, &tool)});
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#)
        }
        60..=69 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#),
        70..=74 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#),
        75..=79 => {
            let target = if in_flight.is_empty() {
                id.clone()
            } else {
                rng.pick(in_flight).clone()
            };
            let line = format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":{target}}}}}"#
            );
            return (line.into_bytes(), Expect::Cancels(target));
        }
        80..=82 => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"doctor","name":"status","arguments":{{}}}}}}"#
        ),
        83..=85 => format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"no/such/method"}}"#),
        86..=87 => {
            let line = rng
                .pick(&[
                    "\"just a string\"",
                    "42",
                    "null",
                    "[]",
                    "{",
                    "not json",
                    "   ",
                ])
                .to_string();
            return (line.into_bytes(), Expect::NoneOrNullError);
        }
        88..=89 => {
            // Over the frame cap: answered with an error for the id in its prefix.
            let pad = "A".repeat(FRAME + 10);
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"status","arguments":{{"pad":"{pad}"}}}}}}"#
            )
        }
        90..=94 => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"status","arguments":[1]}}}}"#
        ),
        _ => format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"arguments":{{}}}}}}"#
        ),
    };
    (line.into_bytes(), Expect::Answer(id))
}

/// The exact text of a line's top-level `id`, if it has one.
fn raw_id(line: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct IdText<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    serde_json::from_str::<IdText>(line)
        .ok()?
        .id
        .map(|raw| raw.get().to_string())
}

struct Target {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Target {
    fn spawn(sb: &Sandbox, args: &[String]) -> Self {
        let mut child = sb
            .marsh_mcp(args, &[])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn marsh-mcp");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while reader.read_line(&mut line).map(|n| n > 0).unwrap_or(false) {
                if tx.send(std::mem::take(&mut line)).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Self {
            child,
            stdin,
            lines,
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).expect("write a frame");
        stdin.write_all(b"\n").expect("write a frame");
        stdin.flush().expect("flush");
    }
}

fn failed(label: &str, seed: u64, why: &str, recent: &[String]) -> ! {
    panic!(
        "fuzz {label}: {why}\nseed {seed} (FUZZ_SEED={seed} replays it)\nlast lines sent:\n{}",
        recent.join("\n")
    )
}

/// Fuzzes one target; panics with the seed and the recent lines on a violation.
fn fuzz(label: &str, sb: &Sandbox, args: &[String], seed: u64, budget: Duration) -> usize {
    let mut rng = Rng(seed);
    let mut t = Target::spawn(sb, args);
    let mut recent: Vec<String> = Vec::new();
    t.write(br#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fuzz","version":"0"}}}"#);
    t.write(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let mut waiting: HashMap<String, Instant> =
        HashMap::from([("\"init\"".to_string(), Instant::now())]);
    let mut cancelled: HashSet<String> = HashSet::new();
    let mut answered: HashSet<String> = HashSet::new();
    let (mut ids, mut sent) = (0u64, 0usize);
    let start = Instant::now();
    let check = |line: &str,
                 waiting: &mut HashMap<String, Instant>,
                 answered: &mut HashSet<String>,
                 cancelled: &HashSet<String>,
                 recent: &[String]| {
        if line.len() > FRAME + 1 {
            failed(
                label,
                seed,
                &format!("a line of {} bytes", line.len()),
                recent,
            );
        }
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| {
            failed(
                label,
                seed,
                &format!("a line that is not JSON ({e}): {line:.200}"),
                recent,
            )
        });
        if value["jsonrpc"] != "2.0" {
            failed(label, seed, &format!("no jsonrpc 2.0: {line:.200}"), recent);
        }
        let Some(id) = raw_id(line) else { return };
        if id == "null" {
            return;
        }
        if waiting.remove(&id).is_none() {
            if cancelled.contains(&id) && !answered.contains(&id) {
                answered.insert(id);
                return;
            }
            failed(
                label,
                seed,
                &format!("an answer for id {id:.80} that is not in flight: {line:.300}"),
                recent,
            );
        }
        answered.insert(id.clone());
        if let Some(result) = value.get("result")
            && let Some(envelope) = result.get("structuredContent")
        {
            let text = result["content"][0]["text"].as_str().unwrap_or_default();
            if envelope.get("ok").and_then(Value::as_bool).is_none() || text.is_empty() {
                failed(
                    label,
                    seed,
                    &format!("a tool result without envelope or text: {line:.300}"),
                    recent,
                );
            }
        }
    };
    while start.elapsed() < budget {
        while let Ok(line) = t.lines.try_recv() {
            check(&line, &mut waiting, &mut answered, &cancelled, &recent);
        }
        if waiting.len() >= IN_FLIGHT {
            match t.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => check(&line, &mut waiting, &mut answered, &cancelled, &recent),
                Err(_) => failed(
                    label,
                    seed,
                    &format!("no answer within 60 s; waiting for {:?}", waiting.keys()),
                    &recent,
                ),
            }
            continue;
        }
        let in_flight: Vec<String> = waiting.keys().cloned().collect();
        let (line, expect) = message(&mut rng, &mut ids, &in_flight);
        let text = String::from_utf8_lossy(&line[..line.len().min(300)]).into_owned();
        match expect {
            Expect::Answer(id) => {
                waiting.insert(id, Instant::now());
            }
            // A cancelled request may go unanswered.
            Expect::Cancels(target) => {
                if waiting.remove(&target).is_some() {
                    cancelled.insert(target);
                }
            }
            Expect::NoneOrNullError => {}
        }
        recent.push(text);
        if recent.len() > 12 {
            recent.remove(0);
        }
        t.write(&line);
        sent += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while !waiting.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match t.lines.recv_timeout(left) {
            Ok(line) => check(&line, &mut waiting, &mut answered, &cancelled, &recent),
            Err(_) => failed(
                label,
                seed,
                &format!("unanswered at the end: {:?}", waiting.keys()),
                &recent,
            ),
        }
    }
    drop(t.stdin.take());
    let eof = Instant::now();
    loop {
        while let Ok(line) = t.lines.try_recv() {
            check(&line, &mut waiting, &mut answered, &cancelled, &recent);
        }
        if let Some(status) = t.child.try_wait().expect("wait") {
            if !status.success() {
                failed(
                    label,
                    seed,
                    &format!("exited with {status} after EOF"),
                    &recent,
                );
            }
            break;
        }
        if eof.elapsed() > EXIT_BOUND {
            let _ = t.child.kill();
            failed(
                label,
                seed,
                &format!("still running {EXIT_BOUND:?} after stdin EOF"),
                &recent,
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    sent
}

fn main() {
    let seed = Rng::seed_from("FUZZ_SEED");
    let seconds = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let budget = Duration::from_secs(seconds);
    println!("fuzz: seed {seed} (FUZZ_SEED={seed} replays it), {seconds} s per target");
    let sb = Sandbox::new();
    let sent = fuzz("serve", &sb, &sb.serve_root_args(&[]), seed, budget);
    println!("fuzz serve: {sent} lines, every answer checked");
    let other = Sandbox::new();
    let (code, stderr) = other.broker_start();
    assert_eq!(code, Some(0), "broker-start: {stderr}");
    let sent = fuzz(
        "connect",
        &other,
        &other.broker_args("connect", &[]),
        seed ^ 0x5eed,
        budget,
    );
    println!("fuzz connect: {sent} lines, every answer checked");
}
