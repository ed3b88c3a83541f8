//! Receipts survive a daemon killed at any moment: each is whole or absent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Env, wait_gone};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// Every `results/*.json` parses as a whole receipt; returns how many there are.
fn every_receipt_is_whole(env: &Env) -> usize {
    let dir = env.home.join("results");
    let mut whole = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name.starts_with('.') {
            continue; // a temp file: never listed, removed by the next daemon
        }
        let bytes = std::fs::read(entry.path()).unwrap();
        let receipt: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("{name} is not a whole receipt ({e}): {bytes:?}"));
        assert_eq!(format!("{}.json", receipt["id"].as_str().unwrap()), name);
        assert!(receipt["finished_at_ms"].is_u64(), "{receipt}");
        whole += 1;
    }
    whole
}

#[test]
fn receipts_are_whole_or_absent_after_kill_9_of_the_daemon() {
    let env = Arc::new(Env::new());
    assert!(env.run("true").status.success());
    let mut killed = 0;
    for round in 0..6u64 {
        // Three clients run commands back to back while the daemon is killed under them.
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let (env, stop) = (Arc::clone(&env), Arc::clone(&stop));
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = env.run("true");
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150 + 37 * round));
        // The clients boot a daemon again after each kill; how long a boot takes is not
        // what this test is about, so it waits (bounded) for one to be up.
        let up_by = Instant::now() + Duration::from_secs(5);
        let mut daemon = env.daemon_pid();
        while daemon.is_none() && Instant::now() < up_by {
            std::thread::sleep(Duration::from_millis(10));
            daemon = env.daemon_pid();
        }
        if let Some(pid) = daemon {
            kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
            wait_gone(pid);
            killed += 1;
        }
        stop.store(true, Ordering::Relaxed);
        for w in workers {
            w.join().unwrap();
        }
        every_receipt_is_whole(&env);
    }
    assert!(killed >= 5, "the daemon was killed only {killed} times");

    // A fresh daemon lists them all, and left no temp file behind it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !env.run("true").status.success() {
        assert!(Instant::now() < deadline, "no daemon came back");
    }
    let whole = every_receipt_is_whole(&env);
    assert!(whole > 6, "only {whole} receipts");
    let listed = env.json(&["results", "--json"]);
    assert_eq!(
        listed["results"].as_array().unwrap().len(),
        whole.min(100),
        "{listed}"
    );
    // Stopped, the daemon also removes the receipt files it prepared ahead of need.
    assert!(env.marsh(&["stop", "--json"]).status.success());
    let leftovers: Vec<String> = std::fs::read_dir(env.home.join("results"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
