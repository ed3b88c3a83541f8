//! `make bench`: figures printed, never asserted.
//!
//! 1. `serve` spawn -> initialize result (median of 25).
//! 2. `shell_run {command: "true"}` inline round trip (median, p99 of 300) against a
//!    bare `marsh -c true` of the stand-in on the same warm home, as a ratio.
//! 3. `shell_run` of a command printing 100 MB: throughput and marsh-mcp peak RSS.
//! 4. With `MARSH_BENCH_BASELINE=DIR` (a directory holding another build's `marsh-mcp`,
//!    `marsh`, `marshd`, `sbx`): `shell_run true`, and a command opening 1,000
//!    workspace files (`cat files/*`, where the set-id guard answers every open), of
//!    this build and of that one side by side, interleaved in blocks of 50 so that
//!    machine noise hits both alike.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server};
use serde_json::json;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn main() {
    // cargo bench passes --bench; nothing else is accepted.
    let sb = Sandbox::new();
    let args = sb.serve_home_args(&[]);

    // 1. spawn -> initialize
    let mut init = Vec::new();
    for _ in 0..25 {
        let t = Instant::now();
        let mut s = Server::spawn(sb.marsh_mcp(&args, &[]));
        let reply = s.initialize();
        init.push(t.elapsed());
        assert!(reply.get("result").is_some());
        drop(s);
    }
    let init_median = percentile(&mut init, 0.5);
    println!(
        "serve spawn -> initialize result: median {:.2} ms (n=25)",
        ms(init_median)
    );

    // 2. fast round trip vs bare marsh -c true
    let mut s = Server::start(&sb, &args, &[]);
    for _ in 0..20 {
        s.ok("shell_run", json!({"command": "true"}));
    }
    let mut rtt = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let data = s.ok("shell_run", json!({"command": "true"}));
        rtt.push(t.elapsed());
        assert_eq!(data["exit_code"], 0);
    }
    let rtt_median = percentile(&mut rtt, 0.5);
    let rtt_p99 = percentile(&mut rtt, 0.99);
    let mut bare = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        let status = Command::new(sb.prefix.bin("marsh"))
            .args(["-c", "true"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", sb.state().join("user"))
            .env("MARSH_HOME", sb.home())
            .current_dir(sb.workspace())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("bare marsh");
        bare.push(t.elapsed());
        assert!(status.success());
    }
    let bare_median = percentile(&mut bare, 0.5);
    println!(
        "shell_run true inline round trip: median {:.2} ms, p99 {:.2} ms (n=300); bare `marsh -c true` median {:.2} ms; ratio {:.2}x",
        ms(rtt_median),
        ms(rtt_p99),
        ms(bare_median),
        ms(rtt_median) / ms(bare_median)
    );

    if let Some(dir) = std::env::var_os("MARSH_BENCH_BASELINE") {
        side_by_side(&mut s, &sb.workspace(), std::path::Path::new(&dir));
    }

    // 3. 100 MB of output
    let before = vm_hwm_kib(s.pid()).unwrap_or(0);
    let t = Instant::now();
    let started = s.ok(
        "shell_run",
        json!({"command": "head -c 100000000 /dev/zero", "wait_ms": 55000, "timeout_ms": 600000}),
    );
    let mut state = started["state"].as_str().unwrap().to_string();
    let id = started["operation_id"].as_str().unwrap().to_string();
    while state == "running" {
        state = s.ok(
            "operation_get",
            json!({"operation_id": id, "wait_ms": 55000}),
        )["state"]
            .as_str()
            .unwrap()
            .to_string();
    }
    let elapsed = t.elapsed();
    let got = s.ok("operation_get", json!({"operation_id": id}));
    let bytes = got["stdout_total_bytes"].as_u64().unwrap();
    let peak = vm_hwm_kib(s.pid()).unwrap_or(0);
    println!(
        "shell_run printing 100 MB: {bytes} bytes in {:.2} s = {:.0} MB/s; marsh-mcp peak RSS {:.1} MiB (before: {:.1} MiB); state {state}",
        elapsed.as_secs_f64(),
        bytes as f64 / 1e6 / elapsed.as_secs_f64(),
        peak as f64 / 1024.0,
        before as f64 / 1024.0
    );
}

/// Section 4: this build's server `current` against a baseline build in `dir`.
fn side_by_side(current: &mut Server, current_ws: &std::path::Path, dir: &std::path::Path) {
    let sb = Sandbox::new();
    let bin = tempfile::tempdir().unwrap();
    for name in ["marsh-mcp", "marsh", "marshd", "sbx"] {
        std::fs::copy(dir.join(name), bin.path().join(name)).expect("baseline binary");
    }
    let mut args = sb.serve_home_args(&[]);
    args[6] = bin.path().join("sbx").display().to_string();
    let mut baseline = Server::spawn(sb.marsh_mcp_at(&bin.path().join("marsh-mcp"), &args, &[]));
    baseline.initialize();
    for _ in 0..20 {
        baseline.ok("shell_run", json!({"command": "true"}));
    }
    for ws in [current_ws, &sb.workspace()] {
        let files = ws.join("files");
        std::fs::create_dir_all(&files).unwrap();
        for i in 0..1000 {
            std::fs::write(files.join(format!("f{i:04}")), "x").unwrap();
        }
    }
    for (label, command) in [
        ("shell_run true", "true"),
        (
            "shell_run cat files/* (1,000 opens)",
            "cat files/* >/dev/null",
        ),
    ] {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..6 {
            for (server, samples) in [(&mut *current, &mut ours), (&mut baseline, &mut theirs)] {
                for _ in 0..50 {
                    let t = Instant::now();
                    let data = server.ok("shell_run", json!({"command": command}));
                    samples.push(t.elapsed());
                    assert_eq!(data["exit_code"], 0, "{data}");
                }
            }
        }
        let (a, b) = (percentile(&mut ours, 0.5), percentile(&mut theirs, 0.5));
        println!(
            "side by side, {label} (n=300 each, interleaved): this build median {:.2} ms, p99 {:.2} ms; baseline median {:.2} ms, p99 {:.2} ms; ratio {:.3}",
            ms(a),
            ms(percentile(&mut ours, 0.99)),
            ms(b),
            ms(percentile(&mut theirs, 0.99)),
            ms(a) / ms(b)
        );
    }
}
