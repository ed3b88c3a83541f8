//! Seeded fault injection: SIGKILL of the broker, a `marsh`, a `marshd` or a proxy at
//! a random moment during scope lifecycle work from two sessions, then recovery of
//! every scope by documented tool calls only.
//!
//! Each round: two `connect --start` sessions start, stop, reset, remove and run in
//! generated scopes (calls with `wait_ms` 0, so the work is in flight); after a random
//! delay one victim of a random kind is killed by pid. Then a fresh session brings
//! every scope to rest: `failed` → `scope_reset`; a transitional state is waited out;
//! `ready` and `stopped` are at rest; then some scopes are stopped or removed, so the
//! next round starts from mixed states. A scope that does not reach rest within
//! [`RECOVERY_BOUND`] is a bug: the run panics naming the seed, the round, the scope,
//! its state and its last error.
//!
//! `CHAOS_SEED` replays a run, `CHAOS_ROUNDS` bounds it (default 4; `make chaos` runs
//! 20); the seed is printed first.

// A test program: a broken expectation is a panic with the seed, as in the suites.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::time::{Duration, Instant};

use marsh_tests::{Rng, Sandbox, Server};
use serde_json::{Value, json};

/// How long one scope may take to come to rest after a fault.
const RECOVERY_BOUND: Duration = Duration::from_secs(90);
/// At most this many generated scopes are kept between rounds.
const KEEP_SCOPES: usize = 4;

#[derive(Debug, Clone, Copy)]
enum Victim {
    Broker,
    Proxy,
    Marsh,
    Marshd,
}

struct Chaos {
    sb: Sandbox,
    seed: u64,
    round: usize,
    rng: Rng,
}

impl Chaos {
    fn fail(&self, why: &str) -> ! {
        panic!(
            "chaos: {why}\nseed {} round {} (CHAOS_SEED={} replays it)",
            self.seed, self.round, self.seed
        )
    }

    /// A `connect --start` session (starting a broker when none runs).
    fn session(&self) -> Server {
        let mut args = self.sb.broker_args("connect", &[]);
        args.insert(1, "--start".into());
        Server::start(&self.sb, &args, &[])
    }

    fn generated(&self, s: &mut Server) -> Vec<(String, String)> {
        let listed = s.call("scope_list", json!({}));
        let Some(scopes) = listed["data"]["scopes"].as_array() else {
            self.fail(&format!("scope_list failed: {listed}"));
        };
        scopes
            .iter()
            .filter(|sc| sc["scope_id"] != "default")
            .map(|sc| {
                (
                    sc["scope_id"].as_str().unwrap_or_default().to_string(),
                    sc["state"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// Puts work in flight: lifecycle calls and runs with `wait_ms` 0.
    fn stir(&mut self, s: &mut Server) {
        let scopes = self.generated(s);
        for _ in 0..3 {
            let start = scopes.is_empty() || (self.rng.below(6) == 0 && scopes.len() < KEEP_SCOPES);
            let (tool, args) = if start {
                ("scope_start", json!({}))
            } else {
                let id = &scopes[self.rng.below(scopes.len() as u64) as usize].0;
                match self.rng.below(4) {
                    0 => ("scope_stop", json!({"scope_id": id, "wait_ms": 0})),
                    1 => ("scope_reset", json!({"scope_id": id, "wait_ms": 0})),
                    2 => ("scope_remove", json!({"scope_id": id, "wait_ms": 0})),
                    _ => (
                        "scope_run",
                        json!({"scope_id": id, "command": "sleep 2; echo chaos", "wait_ms": 0}),
                    ),
                }
            };
            // Refusals (busy, not ready, limits) are expected here; only the answer
            // matters.
            let _ = s.call(tool, args);
        }
    }

    /// Processes of this sandbox whose executable is its installed `name`.
    fn pids_of(&self, name: &str) -> Vec<i32> {
        let exe = self.sb.prefix.bin(name);
        let root = self.sb.root().display().to_string();
        let mut pids = Vec::new();
        for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let path = entry.path();
            if fs::read_link(path.join("exe")).ok() != Some(exe.clone()) {
                continue;
            }
            let environ = fs::read(path.join("environ")).unwrap_or_default();
            let cmdline = fs::read(path.join("cmdline")).unwrap_or_default();
            let mine = |bytes: &[u8]| String::from_utf8_lossy(bytes).contains(&root);
            if mine(&environ) || mine(&cmdline) {
                pids.push(pid);
            }
        }
        pids
    }

    fn kill(pid: i32) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    /// Kills one victim; what it was, and its pid when one was running.
    fn strike(&mut self, sessions: &mut [Server]) -> (Victim, Option<i32>) {
        let victim = match self.rng.below(4) {
            0 => Victim::Broker,
            1 => Victim::Proxy,
            2 => Victim::Marsh,
            _ => Victim::Marshd,
        };
        let pid = match victim {
            Victim::Broker => self.sb.broker_dir().map(|_| self.sb.broker_pid()),
            Victim::Proxy => {
                let i = self.rng.below(sessions.len() as u64) as usize;
                let pid = sessions[i].pid() as i32;
                sessions[i].kill();
                return (victim, Some(pid));
            }
            Victim::Marsh | Victim::Marshd => {
                let name = match victim {
                    Victim::Marsh => "marsh",
                    _ => "marshd",
                };
                let pids = self.pids_of(name);
                (!pids.is_empty()).then(|| pids[self.rng.below(pids.len() as u64) as usize])
            }
        };
        if let Some(pid) = pid {
            Self::kill(pid);
        }
        (victim, pid)
    }

    /// Brings `id` to `ready` (proven by a run) or `stopped` by documented calls,
    /// within the bound.
    fn bring_to_rest(&self, s: &mut Server, id: &str) -> String {
        let deadline = Instant::now() + RECOVERY_BOUND;
        let mut last = Value::Null;
        loop {
            let status = s.call("scope_status", json!({"scope_id": id}));
            if status["ok"] == false && status["error"]["kind"] == "unknown_scope" {
                return "removed".into();
            }
            let state = status["data"]["state"].as_str().unwrap_or("?").to_string();
            match state.as_str() {
                "stopped" => return state,
                "ready" => {
                    let run = s.call(
                        "scope_run",
                        json!({"scope_id": id, "command": "echo at-rest", "wait_ms": 30_000}),
                    );
                    if run["data"]["state"] == "succeeded" {
                        return state;
                    }
                    // A runtime the fault left unusable: the documented way back.
                    last = s.call("scope_reset", json!({"scope_id": id, "wait_ms": 30_000}));
                    if last["ok"] != true {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                }
                "failed" => {
                    last = s.call("scope_reset", json!({"scope_id": id, "wait_ms": 30_000}));
                }
                _ => std::thread::sleep(Duration::from_millis(300)),
            }
            if Instant::now() > deadline {
                self.fail(&format!(
                    "scope {id} did not come to rest within {RECOVERY_BOUND:?}: state {state}, {status}; last call {last}"
                ));
            }
        }
    }

    fn round(&mut self) -> (Victim, Option<i32>) {
        let mut sessions = vec![self.session(), self.session()];
        for s in &mut sessions {
            self.stir(s);
        }
        std::thread::sleep(Duration::from_millis(self.rng.below(600)));
        let victim = self.strike(&mut sessions);
        drop(sessions);
        // A broker that lost its proxies and a killed broker both give way to one
        // `connect --start` session.
        let mut s = self.session();
        let scopes = self.generated(&mut s);
        for (id, _) in &scopes {
            self.bring_to_rest(&mut s, id);
        }
        let status = s.call("status", json!({}));
        if status["ok"] != true {
            let reset = s.call(
                "scope_reset",
                json!({"scope_id": "default", "wait_ms": 30_000}),
            );
            if reset["data"]["state"] != "succeeded" {
                self.fail(&format!(
                    "the default scope did not recover: {status} / {reset}"
                ));
            }
        }
        // Keep the registry small: stop or remove some.
        for (id, _) in self.generated(&mut s).into_iter().skip(KEEP_SCOPES / 2) {
            let stop = s.call("scope_stop", json!({"scope_id": id, "wait_ms": 30_000}));
            if stop["ok"] == true && self.rng.below(2) == 0 {
                let removed = s.call("scope_remove", json!({"scope_id": id, "wait_ms": 30_000}));
                if removed["data"]["state"] != "succeeded" {
                    self.fail(&format!("scope_remove of a stopped scope {id}: {removed}"));
                }
            }
        }
        victim
    }
}

fn main() {
    let seed = Rng::seed_from("CHAOS_SEED");
    let rounds: usize = std::env::var("CHAOS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    println!("chaos: seed {seed} (CHAOS_SEED={seed} replays it), {rounds} rounds");
    let sb = Sandbox::new();
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "broker-start: {stderr}");
    let mut chaos = Chaos {
        sb,
        seed,
        round: 0,
        rng: Rng(seed),
    };
    let started = Instant::now();
    for round in 1..=rounds {
        chaos.round = round;
        let struck = match chaos.round() {
            (victim, Some(pid)) => format!("killed a {victim:?} (pid {pid})"),
            (victim, None) => format!("no {victim:?} was running"),
        };
        println!("chaos round {round}: {struck}; every scope came back to rest");
    }
    println!(
        "chaos: {rounds} rounds in {:.1} s, no stuck scope",
        started.elapsed().as_secs_f64()
    );
}
