//! `make bench` (broker part): figures printed, never asserted.
//!
//! 1. `connect` spawn -> initialize result through a running broker (median of 25).
//! 2. `scope_list` round trip through the proxy vs a direct `serve` (median of 1000
//!    each, as a ratio in one run).
//! 3. 64 concurrent proxies, each making 100 `scope_list` calls: p50/p99, errors, and
//!    the broker's peak RSS.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server};
use serde_json::json;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn timed_calls(server: &mut Server, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let envelope = server.call("scope_list", json!({}));
            assert_eq!(envelope["ok"], true);
            t.elapsed()
        })
        .collect()
}

fn main() {
    let sb = Sandbox::new();
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let connect = sb.broker_args("connect", &[]);

    let mut spawn = Vec::new();
    for _ in 0..25 {
        let t = Instant::now();
        let mut proxy = Server::spawn(sb.marsh_mcp(&connect, &[]));
        assert!(proxy.initialize().get("result").is_some());
        spawn.push(t.elapsed());
        assert!(proxy.close().success());
    }
    println!(
        "connect spawn -> initialize result: median {:.2} ms (n=25)",
        ms(percentile(&mut spawn, 0.5))
    );

    let mut proxy = sb.connect();
    timed_calls(&mut proxy, 50);
    let mut via_proxy = timed_calls(&mut proxy, 1000);
    drop(proxy);
    let direct_sb = Sandbox::new();
    let mut direct = Server::start(&direct_sb, &direct_sb.serve_root_args(&[]), &[]);
    timed_calls(&mut direct, 50);
    let mut via_direct = timed_calls(&mut direct, 1000);
    let (p, d) = (
        percentile(&mut via_proxy, 0.5),
        percentile(&mut via_direct, 0.5),
    );
    println!(
        "scope_list round trip: proxy median {:.3} ms, direct serve median {:.3} ms (n=1000 each); ratio {:.2}x",
        ms(p),
        ms(d),
        ms(p) / ms(d)
    );

    let proxies: Vec<Server> = (0..64).map(|_| sb.connect()).collect();
    let started = Instant::now();
    let workers: Vec<_> = proxies
        .into_iter()
        .map(|mut proxy| {
            std::thread::spawn(move || {
                let mut times = Vec::with_capacity(100);
                let mut errors = 0usize;
                for _ in 0..100 {
                    let t = Instant::now();
                    let envelope = proxy.call("scope_list", json!({}));
                    times.push(t.elapsed());
                    if envelope["ok"] != true {
                        errors += 1;
                    }
                }
                (times, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for worker in workers {
        let (times, e) = worker.join().unwrap();
        all.extend(times);
        errors += e;
    }
    let wall = started.elapsed();
    let pid = std::fs::read_to_string(sb.broker_dir().unwrap().join("broker.pid")).unwrap();
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    println!(
        "64 proxies x 100 scope_list: p50 {:.2} ms, p99 {:.2} ms, {} errors, {:.0} calls/s, broker peak RSS {:.1} MiB",
        ms(percentile(&mut all, 0.5)),
        ms(percentile(&mut all, 0.99)),
        errors,
        all.len() as f64 / wall.as_secs_f64(),
        hwm / 1024.0
    );
}
