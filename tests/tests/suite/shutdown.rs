//! Sessions end promptly: on stdin EOF `serve` and `connect` cancel what is still
//! running after a short grace, answer it, and exit within 15 s; a proxy that is
//! killed ends its broker session the same way, so `broker-stop` succeeds.

use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server, host_processes_with};
use serde_json::{Value, json};

/// The documented bound from stdin EOF to exit.
const EXIT_BOUND: Duration = Duration::from_secs(15);

/// Sends a `shell_run` that waits inline for `command` without reading its reply.
fn send_inline_run(s: &mut Server, command: &str) -> u64 {
    let id = s.next_request_id();
    s.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "shell_run", "arguments": {"command": command, "wait_ms": 55_000}}}));
    id
}

/// Closes stdin, then collects messages until the process exits: (the reply to `id`,
/// seconds from EOF to exit).
fn close_and_time_the_exit(s: &mut Server, id: u64) -> (Option<Value>, Duration) {
    let eof = Instant::now();
    s.close_input();
    let mut reply = None;
    loop {
        if let Some(msg) = s.recv(Duration::from_millis(50))
            && msg.get("id") == Some(&json!(id))
        {
            reply = Some(msg);
        }
        if s.try_wait().is_some() {
            while let Some(msg) = s.recv(Duration::from_millis(50)) {
                if msg.get("id") == Some(&json!(id)) {
                    reply = Some(msg);
                }
            }
            return (reply, eof.elapsed());
        }
        assert!(eof.elapsed() < Duration::from_secs(60), "no exit after EOF");
    }
}

fn assert_gone(marker: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !host_processes_with(marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "still running: {:?}",
            host_processes_with(marker)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn check_cancelled_reply(reply: Option<Value>, how: &str) {
    let reply = reply.unwrap_or_else(|| panic!("{how}: the inline call got no reply"));
    let data = &reply["result"]["structuredContent"]["data"];
    assert_eq!(data["cancel_requested"], true, "{how}: {reply}");
}

#[test]
fn serve_and_connect_exit_within_the_bound_after_stdin_eof() {
    let sb = Sandbox::new();
    let mut serve = Server::start(&sb, &sb.serve_home_args(&[]), &[]);
    let id = send_inline_run(&mut serve, "sleep 61.37");
    std::thread::sleep(Duration::from_millis(500));
    let (reply, took) = close_and_time_the_exit(&mut serve, id);
    assert!(took < EXIT_BOUND, "serve took {took:?} to exit");
    check_cancelled_reply(reply, "serve");
    assert_gone("61.37", Duration::from_secs(2));

    let other = Sandbox::new();
    let (code, stderr) = other.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let mut proxy = other.connect();
    let id = send_inline_run(&mut proxy, "sleep 61.41");
    std::thread::sleep(Duration::from_millis(500));
    let (reply, took) = close_and_time_the_exit(&mut proxy, id);
    assert!(took < EXIT_BOUND, "connect took {took:?} to exit");
    check_cancelled_reply(reply, "connect");
    assert_gone("61.41", Duration::from_secs(2));
}

#[test]
fn a_killed_proxy_ends_its_session_and_broker_stop_succeeds() {
    let sb = Sandbox::new();
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let mut proxy = sb.connect();
    proxy.ok("shell_run", json!({"command": "sleep 62.53", "wait_ms": 0}));
    send_inline_run(&mut proxy, "sleep 62.59");
    std::thread::sleep(Duration::from_millis(500));
    assert!(host_processes_with("62.5").len() >= 2);
    let killed = Instant::now();
    proxy.kill();
    let (code, stderr) = sb.startup(&sb.broker_args("broker-stop", &[]), &[]);
    assert_eq!(code, Some(0), "broker-stop after the proxy died: {stderr}");
    assert!(killed.elapsed() < EXIT_BOUND + Duration::from_secs(5));
    assert_gone("62.5", Duration::from_secs(2));
}
