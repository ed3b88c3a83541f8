//! A client that sends requests and never reads its output cannot grow the server:
//! the session stops reading while its replies wait, in `serve` and per broker session,
//! and other sessions stay responsive.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use marsh_tests::{PROTOCOL_VERSION, Sandbox};
use serde_json::json;

const FLOOD: usize = 80_000;
const RSS_BOUND_KB: u64 = 100 * 1024;

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Spawns `cmd` with its output never read, initializes, and floods it with
/// `tools/list` requests from a thread (which blocks once the server stops reading).
fn flood(mut cmd: Command) -> Child {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || {
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "flood", "version": "0"}}});
        let mut lines = format!(
            "{init}\n{}\n",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        );
        for id in 1..=FLOOD {
            lines.push_str(&format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/list\"}}\n"
            ));
            if id % 1000 == 0 {
                if stdin.write_all(lines.as_bytes()).is_err() {
                    return;
                }
                lines.clear();
            }
        }
    });
    child
}

/// The RSS of `pid` once the flood has had `settle` to fill what the server holds, and
/// `span` later. Unbounded, the debug build grows ~10 MB/s while it works through
/// the flood; bounded, it stays flat once the session stops reading.
fn rss_then_later(pid: u32, settle: Duration, span: Duration) -> (u64, u64) {
    std::thread::sleep(settle);
    let early = rss_kb(pid);
    std::thread::sleep(span);
    (early, rss_kb(pid))
}

fn assert_bounded(what: &str, (early, late): (u64, u64)) {
    assert!(late < RSS_BOUND_KB, "{what} grew to {late} kB");
    assert!(
        late < early + 8 * 1024,
        "{what} kept growing while its output was unread: {early} kB, then {late} kB"
    );
}

#[test]
fn unread_replies_do_not_grow_serve_or_the_broker() {
    let sb = Sandbox::new();
    let mut serve = flood(sb.marsh_mcp(&sb.serve_home_args(&[]), &[]));
    let rss = rss_then_later(serve.id(), Duration::from_secs(2), Duration::from_secs(6));
    let _ = serve.kill();
    let _ = serve.wait();
    assert_bounded("serve", rss);

    let other = Sandbox::new();
    let (code, stderr) = other.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let broker = other.broker_pid() as u32;
    let mut proxy = flood(other.marsh_mcp(&other.broker_args("connect", &[]), &[]));
    std::thread::sleep(Duration::from_secs(2));
    // Another session of the same broker is served meanwhile.
    let mut second = other.connect();
    assert_eq!(second.tool_names().len(), marsh_tests::TOOLS.len());
    assert_bounded(
        "the broker",
        rss_then_later(broker, Duration::ZERO, Duration::from_secs(6)),
    );
    let _ = proxy.kill();
    let _ = proxy.wait();
    // The flooded session ends (its proxy is gone) and what it held is released.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        rss_kb(broker) < RSS_BOUND_KB,
        "after: {} kB",
        rss_kb(broker)
    );
    assert_eq!(second.tool_names().len(), marsh_tests::TOOLS.len());
}
