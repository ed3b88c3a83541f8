//! Black-box tests of `marsh` + `marshd` against the README contract.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Env, code, shipped_bin, stderr, stdout};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

#[test]
fn version_and_usage() {
    let env = Env::new();
    let out = env.marsh(&["--version"]);
    assert_eq!(code(&out), 0);
    assert!(
        stdout(&out).starts_with("marsh ") && stdout(&out).trim_end().ends_with("(marsh-shim)")
    );
    assert_eq!(code(&env.marsh(&[])), 2);
    assert_eq!(code(&env.marsh(&["frobnicate"])), 2);
    assert_eq!(code(&env.marsh(&["results", "show", "NOT-HEX"])), 2);
    assert!(!env.home.exists(), "no verb but -c creates the home");

    let marshd = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_marshd"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = marshd(&["--version"]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        stdout(&out),
        format!("marshd {} (marsh-shim)\n", env!("CARGO_PKG_VERSION"))
    );
    for args in [
        &[][..],
        &["bogus"],
        &["serve", "--home", "/h"],
        &["kit-client"],
    ] {
        let out = marshd(args);
        assert_eq!(code(&out), 2, "marshd {args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("Usage: marshd "), "{}", stderr(&out));
    }
}

#[test]
fn run_output_streams_and_exit_codes() {
    let env = Env::new();
    let out = env.run("echo out; echo err >&2; exit 7");
    assert_eq!(code(&out), 7);
    assert_eq!(stdout(&out), "out\n");
    assert_eq!(stderr(&out), "err\n");

    let out = env.run("kill -9 $$");
    assert_eq!(code(&out), 128 + 9, "death by signal N exits 128+N");

    let out = env.run("printf '\\377\\000\\376tail'");
    assert_eq!(code(&out), 0);
    assert_eq!(
        out.stdout, b"\xff\x00\xfetail",
        "bytes pass through exactly"
    );

    // A large output is not truncated (the job writes straight into our pipe).
    let out = env.run("head -c 3000000 /dev/zero");
    assert_eq!(out.stdout.len(), 3_000_000);
}

#[test]
fn job_runs_in_workspace_with_fixed_environment() {
    let mut env = Env::new();
    env.set_env("SECRET_FROM_CALLER", "leak");
    env.set_env("USER", "tester");
    let out = env.run("pwd; env");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(env.ws.to_str().unwrap()));
    let vars: Vec<&str> = lines.map(|l| l.split('=').next().unwrap_or("")).collect();
    assert!(
        !text.contains("SECRET_FROM_CALLER") && !text.contains("MARSH_HOME"),
        "{text}"
    );
    for required in ["PATH", "HOME", "USER", "LANG", "TERM"] {
        assert!(vars.contains(&required), "{required} missing from {vars:?}");
    }
    assert!(
        text.contains("LANG=C.UTF-8") && text.contains("TERM=dumb") && text.contains("USER=tester")
    );
    assert!(text.contains(&format!("HOME={}", env.user_home.display())));

    // The invocation log records the full environment marsh itself received.
    let log = std::fs::read_to_string(env.home.join(".shim/invocations.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(line["env"]["SECRET_FROM_CALLER"], "leak");
    assert_eq!(line["argv"][1], "-c");
    assert_eq!(line["cwd"], env.ws.to_str().unwrap());
    assert!(line["pid"].as_u64().is_some() && line["ts_ms"].as_u64().is_some());
}

#[test]
fn sandbox_hides_home_and_token_and_only_workspace_is_writable() {
    let env = Env::new();
    assert_eq!(code(&env.run("true")), 0);
    let home = env.home.canonicalize().unwrap();
    assert!(home.join("daemon/token").is_file());
    let probes = [
        format!("cat {}/daemon/token", home.display()),
        format!("ls {}", home.display()),
        format!("test -e {}", home.display()),
        format!("test -S {}/daemon/marshd.sock", home.display()),
        "touch /usr/marsh-shim-probe".to_string(),
        "touch /etc/marsh-shim-probe".to_string(),
        "mkdir /marsh-shim-probe".to_string(),
    ];
    for probe in probes {
        let out = env.run(&format!("{probe} >/dev/null 2>&1"));
        assert_ne!(code(&out), 0, "`{probe}` must fail inside the sandbox");
    }
    // The workspace's ancestors exist only as empty mount-point skeletons.
    let out = env.run(&format!("ls -A {}", env.dir.path().display()));
    assert_eq!(stdout(&out), "user\nws\n", "{}", stderr(&out));

    let out = env.run(
        "echo written > made-by-job && mkdir -p sub && echo ok > /tmp/scratch && cat /tmp/scratch",
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(env.ws.join("made-by-job")).unwrap(),
        "written\n"
    );
    assert!(env.ws.join("sub").is_dir());

    let status = env.status();
    assert_eq!(status["shell"]["isolation"], "bwrap");
    assert_eq!(status["shell"]["state"], "up");
    assert_eq!(status["workspace"], env.ws.to_str().unwrap());
}

/// bubblewrap's init (pid 1 in the sandbox) is dumpable and keeps its stdio: a job
/// can copy its fd 0 with pidfd_getfd. That descriptor must be a spent bootstrap
/// socket, never the daemon channel.
#[test]
fn jobs_cannot_take_over_the_daemon_channel() {
    // A missing prerequisite fails the test: it must never pass without running.
    assert!(
        std::path::Path::new("/usr/bin/python3").exists(),
        "this test needs /usr/bin/python3 (a prerequisite of `make test`): install python3"
    );
    let env = Env::new();
    let script = r#"
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(438, os.pidfd_open(1), 0, 0)
if fd < 0:
    print("denied")
else:
    s = socket.socket(fileno=fd)
    s.setblocking(False)
    try:
        print("recv", s.recv(64))
    except BlockingIOError:
        print("live")
    try:
        s.send(b'{"kind":"kit_cancel","req":1}')
        print("sent")
    except OSError:
        print("closed")
"#;
    std::fs::write(env.ws.join("steal.py"), script).unwrap();
    let out = env.run("python3 steal.py");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text == "denied\n" || text == "recv b''\nclosed\n", "{text}");
    assert_eq!(stdout(&env.run("echo fine")), "fine\n");
}

#[test]
fn a_client_from_another_cwd_is_refused() {
    let env = Env::new();
    assert_eq!(code(&env.run("true")), 0);
    let other = env.dir.path().join("elsewhere");
    std::fs::create_dir(&other).unwrap();
    let out = env
        .cmd()
        .current_dir(&other)
        .args(["-c", "true"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    assert!(
        stderr(&out).contains("bound to workspace"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn receipts_are_listed_newest_first_and_shown_by_prefix() {
    let env = Env::new();
    assert_eq!(
        env.json(&["results", "--json"])["results"],
        serde_json::json!([])
    );
    assert_eq!(code(&env.run("exit 3")), 3);
    assert_eq!(code(&env.run("echo second")), 0);
    let list = env.json(&["results", "--json"]);
    let results = list["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["command"], "echo second");
    assert_eq!(results[1]["exit_code"], 3);
    let first = &results[1];
    for key in [
        "id",
        "kind",
        "kit",
        "command",
        "exit_code",
        "signal",
        "started_at_ms",
        "finished_at_ms",
        "duration_ms",
        "workspace",
    ] {
        assert!(first.get(key).is_some(), "receipt lacks {key}");
    }
    assert_eq!(first["kind"], "shell");
    assert_eq!(first["workspace"], env.ws.to_str().unwrap());

    let id = first["id"].as_str().unwrap();
    let shown = env.json(&["results", "show", &id[..8], "--json"]);
    assert_eq!(&shown, first);
    // No match and an ambiguous selector have exit codes of their own (3 and 4): the
    // control plane classifies by exit code, never by the text.
    let out = env.marsh(&["results", "show", "ffffffff-ffff", "--json"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(stderr(&out), "marsh: no result matches ffffffff-ffff\n");
    // No receipt id starts with "-" (ids are UUIDs), and such a selector would read as a
    // flag: it is a usage error.
    assert_eq!(code(&env.marsh(&["results", "show", "-", "--json"])), 2);
    // A second receipt sharing the first's 8-character prefix makes that prefix ambiguous.
    let twin_id = format!("{}-0000-4000-8000-000000000000", &id[..8]);
    let mut twin = first.clone();
    twin["id"] = serde_json::json!(twin_id);
    std::fs::write(
        env.home.join(format!("results/{twin_id}.json")),
        twin.to_string(),
    )
    .unwrap();
    let prefix = &id[..8];
    let out = env.marsh(&["results", "show", prefix, "--json"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        format!("marsh: result selector {prefix} is ambiguous\n")
    );
    assert_eq!(
        env.json(&["results", "show", &twin_id])["id"],
        twin_id.as_str()
    );
}

#[test]
fn reset_and_stop_are_busy_while_a_job_runs_and_sigterm_cancels_it() {
    let env = Env::new();
    let job = env.spawn(&["-c", "sleep 41.25; echo never"]);
    env.wait_status("the job to start", |s| s["active_jobs"] == 1);
    let pid_before = env.daemon_pid().unwrap();

    for verb in ["reset", "stop"] {
        let out = env.marsh(&[verb, "--json"]);
        assert_eq!(code(&out), 125, "{verb} with an active job");
        assert!(
            stderr(&out).starts_with("marsh: busy: "),
            "{}",
            stderr(&out)
        );
    }
    // Nothing changed.
    let status = env.status();
    assert_eq!(status["daemon"]["pid"], pid_before);
    assert_eq!(status["shell"]["state"], "up");
    assert!(common::process_with_cmdline("sleep 41.25"));

    kill(Pid::from_raw(job.id() as i32), Signal::SIGTERM).unwrap();
    let out = job.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 15));
    assert!(!stdout(&out).contains("never"));
    common::wait_no_process("sleep 41.25");
    env.wait_status("the job to end", |s| s["active_jobs"] == 0);
    let receipt = &env.json(&["results"])["results"][0];
    assert_eq!(receipt["signal"], 9);
    assert_eq!(receipt["exit_code"], serde_json::Value::Null);
}

#[test]
fn a_killed_client_cancels_its_job() {
    let env = Env::new();
    let mut job = env.spawn(&["-c", "sleep 42.75"]);
    env.wait_status("the job to start", |s| s["active_jobs"] == 1);
    job.kill().unwrap();
    assert_eq!(job.wait().unwrap().signal(), Some(9));
    common::wait_no_process("sleep 42.75");
    env.wait_status("the job to end", |s| s["active_jobs"] == 0);
}

#[test]
fn reset_restarts_the_shell_and_stop_proves_absence() {
    let env = Env::new();
    // Without a daemon, reset and stop boot nothing.
    assert_eq!(
        env.json(&["reset", "--json"]),
        serde_json::json!({"reset": true, "was_running": false})
    );
    assert_eq!(
        env.json(&["stop", "--json"]),
        serde_json::json!({"stopped": true, "was_running": false})
    );
    assert_eq!(env.status()["daemon"]["state"], "absent");

    assert_eq!(code(&env.run("echo state > /tmp/in-shell")), 0);
    assert_eq!(
        code(&env.run("test -f /tmp/in-shell")),
        0,
        "the project shell is long-lived"
    );
    assert_eq!(
        env.json(&["reset", "--json"]),
        serde_json::json!({"reset": true, "was_running": true})
    );
    assert_eq!(env.status()["shell"]["state"], "up");
    assert_ne!(
        code(&env.run("test -f /tmp/in-shell")),
        0,
        "reset gives a fresh shell"
    );

    let pid = env.daemon_pid().unwrap();
    assert_eq!(
        env.json(&["stop", "--json"]),
        serde_json::json!({"stopped": true, "was_running": true})
    );
    assert!(
        !common::alive(pid),
        "stop returns only once the daemon is gone"
    );
    let status = env.status();
    assert_eq!(
        status["daemon"],
        serde_json::json!({"state": "absent", "pid": null})
    );
    assert_eq!(
        status["shell"],
        serde_json::json!({"state": "down", "isolation": null})
    );
    assert_eq!(
        env.json(&["stop"]),
        serde_json::json!({"stopped": true, "was_running": false})
    );
}

#[test]
fn kits_run_in_fresh_sandboxes_and_track_warm_state() {
    let env = Env::new();
    env.write_kit(
        "probe",
        &[
            "/bin/sh",
            "-c",
            "echo \"kit:$#:$1\"; hostname; test -e /run/marsh && echo sees-shell; test -e /tmp/left && echo not-fresh; touch /tmp/left; cat",
            "probe",
        ],
    );
    env.write_kit("other", &["true"]);
    let status = env.status();
    assert_eq!(
        status["workers"],
        serde_json::json!([
            {"name": "other", "state": "cold", "active_jobs": 0},
            {"name": "probe", "state": "cold", "active_jobs": 0},
        ])
    );

    let out = env.run("hostname; echo piped | probe 'a b'; echo rc=$?; probe x </dev/null");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "marsh-shell\nkit:1:a b\nmarsh-kit\npiped\nrc=0\nkit:1:x\nmarsh-kit\n"
    );
    assert_eq!(worker_state(&env, "other"), "cold");
    assert_eq!(worker_state(&env, "probe"), "warm");
    let receipt = &env.json(&["results"])["results"][1];
    assert_eq!(receipt["kind"], "kit");
    assert_eq!(receipt["kit"], "probe");
    assert_eq!(receipt["exit_code"], 0);

    // A kit's exit status is the wrapper's; an unknown kit name is not on PATH.
    env.write_kit("fails", &["/bin/sh", "-c", "exit 9"]);
    assert_eq!(code(&env.run("fails")), 9);

    assert_eq!(
        env.json(&["workers", "reset", "probe"]),
        serde_json::json!({"reset": ["probe"]})
    );
    assert_eq!(worker_state(&env, "probe"), "cold");
    let out = env.marsh(&["workers", "reset", "nope"]);
    assert_eq!(code(&out), 1);

    assert_eq!(
        code(&env.marsh(&["--load", "other,probe", "-c", "true"])),
        0
    );
    assert_eq!(worker_state(&env, "other"), "warm");
    assert_eq!(worker_state(&env, "probe"), "warm");
    let out = env.marsh(&["--load", "missing", "-c", "true"]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("unknown kit missing"));

    // A worker with an active kit job cannot be reset.
    env.write_kit("slow", &["sleep", "43.5"]);
    let mut job = env.spawn(&["-c", "slow"]);
    env.wait_status("the kit job", |s| s["active_jobs"] == 2);
    let out = env.marsh(&["workers", "reset", "all"]);
    assert_eq!(code(&out), 125);
    assert!(
        stderr(&out).contains("worker slow has 1 active job"),
        "{}",
        stderr(&out)
    );
    kill(Pid::from_raw(job.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(job.wait().unwrap().code(), Some(128 + 2));
    common::wait_no_process("sleep 43.5");
    env.wait_status("the kit job to end", |s| s["active_jobs"] == 0);
}

fn worker_state(env: &Env, name: &str) -> String {
    let status = env.status();
    let worker = status["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == name)
        .cloned();
    worker.unwrap()["state"].as_str().unwrap().to_string()
}

#[test]
fn failure_and_hang_injection() {
    let env = Env::new();
    std::fs::create_dir_all(&env.home).unwrap();
    env.inject("fail", "run", "3\n");
    let out = env.run("echo hi");
    assert_eq!(code(&out), 3);
    assert_eq!(stderr(&out), "marsh: injected failure: run\n");
    assert!(stdout(&out).is_empty());
    assert_eq!(
        env.status()["daemon"]["state"],
        "absent",
        "nothing was booted"
    );
    std::fs::remove_file(env.home.join(".shim/fail/run")).unwrap();

    env.inject("fail", "boot", "");
    let out = env.run("echo hi");
    assert_eq!(code(&out), 1);
    assert_eq!(stderr(&out), "marsh: injected failure: boot\n");
    std::fs::remove_file(env.home.join(".shim/fail/boot")).unwrap();

    env.inject("fail", "status", "4");
    assert_eq!(code(&env.marsh(&["status", "--json"])), 4);
    std::fs::remove_file(env.home.join(".shim/fail/status")).unwrap();

    env.inject("hang", "results", "300");
    let started = Instant::now();
    assert_eq!(code(&env.marsh(&["results", "--json"])), 0);
    assert!(started.elapsed() >= Duration::from_millis(300));

    env.inject("fail", "load", "5");
    env.write_kit("k", &["true"]);
    assert_eq!(code(&env.marsh(&["--load", "k", "-c", "true"])), 5);
    for verb in ["reset", "stop", "workers-reset", "show"] {
        env.inject("fail", verb, "6");
    }
    assert_eq!(code(&env.marsh(&["reset"])), 6);
    assert_eq!(code(&env.marsh(&["stop"])), 6);
    assert_eq!(code(&env.marsh(&["workers", "reset", "all"])), 6);
    assert_eq!(code(&env.marsh(&["results", "show", "ab"])), 6);
}

/// What `make install` ships (the build without the `test-hooks` feature) ignores the
/// failure and delay markers and writes no invocation log: after a run by a caller with
/// a secret in its environment, no file under the home holds it. The same markers make
/// the test build fail (`failure_and_hang_injection`).
#[test]
fn the_shipped_build_honours_no_test_hooks() {
    let mut env = Env::new();
    env.marsh = shipped_bin("marsh");
    std::fs::create_dir_all(&env.home).unwrap();
    env.inject("fail", "run", "3");
    env.inject("fail", "boot", "");
    env.inject("fail", "status", "4");
    env.inject("hang", "run", "60000");
    let secret = "shipped-secret-4c1d9e";
    env.set_env("DEPLOY_TOKEN", secret);

    let started = Instant::now();
    let out = env.run("echo hi");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "hi\n");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the 60 s hang marker was honoured"
    );
    assert_eq!(code(&env.marsh(&["status", "--json"])), 0);
    assert!(!env.home.join(".shim/invocations.jsonl").exists());

    let mut pending = vec![env.home.clone()];
    let mut files = 0;
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path);
            } else if meta.is_file() {
                files += 1;
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                    "{} holds the caller's secret",
                    path.display()
                );
            }
        }
    }
    assert!(files > 0, "the run left its receipt and daemon files");
}

/// A server that is not root gets a working project shell whose jobs see a covered
/// `/proc`. For such a server bubblewrap nests the sandbox's user namespace, so covers
/// bubblewrap put on the shell's `/proc` would be locked and each container's own
/// `/proc` mount refused (every run `backend_failed`). Run as root, the test drops to
/// `nobody` with setpriv; as any other user every test here already runs that way.
#[test]
fn a_server_that_is_not_root_runs_jobs_under_a_covered_proc() {
    use std::os::unix::fs::{PermissionsExt, chown};
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (to run the stand-in as nobody)");
        return;
    }
    let mut env = Env::new();
    const NOBODY: u32 = 65534;
    let bin = env.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for name in ["marsh", "marshd"] {
        let target = bin.join(name);
        std::fs::copy(Path::new(common::MARSH).with_file_name(name), &target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let user_config = env.user_home.join(".config/marsh-shim");
    for path in [
        env.dir.path(),
        &env.ws,
        &env.user_home,
        &env.user_home.join(".config"),
        &user_config,
        &user_config.join("backend.json"),
    ] {
        chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    env.marsh = PathBuf::from("setpriv");
    let marsh = bin.join("marsh");
    let out = env
        .cmd_with(
            "setpriv",
            &[
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                marsh.to_str().unwrap(),
                "-c",
                "id -u; (echo x > /proc/sys/kernel/core_pattern) 2>&1; echo done",
            ],
        )
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("65534\n"), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");
    assert!(text.ends_with("done\n"), "{text}");
}

#[test]
fn missing_bwrap_is_spawn_blocked_unless_unconfined() {
    let env = Env::new();
    env.settings(r#"{"idle_secs": 60, "bwrap": "/nonexistent/bwrap"}"#);
    let status = env.status();
    assert_eq!(status["backend"]["healthy"], false, "{status}");
    assert_eq!(
        status["backend"]["fix"],
        "install bubblewrap (apt-get install bubblewrap)"
    );
    let out = env.run("true");
    assert_eq!(code(&out), 126, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one line of reason: {err}");
    assert!(err.starts_with("marsh: backend unavailable: "), "{err}");
    assert!(err.contains("apt-get install bubblewrap"), "{err}");
    assert_eq!(env.status()["daemon"]["state"], "absent", "nothing booted");
    env.settings(r#"{"idle_secs": 60, "bwrap": "/nonexistent/bwrap", "unconfined": true}"#);
    let out = env.run("echo unconfined");
    assert_eq!(stdout(&out), "unconfined\n", "{}", stderr(&out));
    assert_eq!(env.status()["shell"]["isolation"], "unconfined");
    assert_eq!(env.status()["backend"]["isolation"], "unconfined");
}

#[test]
fn malformed_settings_are_spawn_blocked_and_reported() {
    let env = Env::new();
    env.settings(r#"{"idle_secs": "soon"}"#);
    let out = env.run("true");
    assert_eq!(code(&out), 126, "{}", stderr(&out));
    assert!(stderr(&out).contains("malformed"), "{}", stderr(&out));
    let status = env.status();
    assert_eq!(status["backend"]["healthy"], false, "{status}");
}

#[test]
fn deep_homes_work_and_the_daemon_leaves_with_its_home() {
    let outer = tempfile::tempdir().unwrap();
    let mut base = outer.path().to_path_buf();
    for i in 0..5 {
        base.push(format!("a-deliberately-long-directory-name-{i:02}"));
    }
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let env = Env::with_base(dir);
    assert!(env.home.join("daemon/marshd.sock").as_os_str().len() > 200);
    let out = env.run("echo deep");
    assert_eq!(stdout(&out), "deep\n", "{}", stderr(&out));
    let pid = env.daemon_pid().unwrap();

    std::fs::rename(&env.home, env.dir.path().join("moved-away")).unwrap();
    common::wait_gone(pid);
}

#[test]
fn the_daemon_a_run_boots_has_no_blocked_signals() {
    // `marsh -c` blocks its cancellation signals; the daemon it boots must not keep them
    // blocked, or SIGTERM could not end it.
    let env = Env::new();
    assert_eq!(code(&env.run("true")), 0);
    let pid = env.daemon_pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let blocked = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .unwrap()
        .trim();
    assert_eq!(u64::from_str_radix(blocked, 16).unwrap(), 0, "{status}");
}

#[test]
fn idle_daemon_exits_by_itself() {
    let env = Env::new();
    env.settings(r#"{"idle_secs": 1}"#);
    assert_eq!(code(&env.run("true")), 0);
    let pid = env.daemon_pid().unwrap();
    common::wait_gone(pid);
    assert_eq!(env.status()["daemon"]["state"], "absent");
}

#[test]
fn concurrent_first_runs_boot_one_daemon() {
    let env = Env::new();
    let jobs: Vec<_> = (0..4)
        .map(|i| env.spawn(&["-c", &format!("echo {i}")]))
        .collect();
    for (i, job) in jobs.into_iter().enumerate() {
        let out = job.wait_with_output().unwrap();
        assert_eq!(stdout(&out), format!("{i}\n"), "{}", stderr(&out));
    }
    let log = std::fs::read_to_string(env.home.join("daemon/marshd.log")).unwrap();
    assert_eq!(log.matches(" serving ").count(), 1, "{log}");
}

#[test]
fn run_gives_the_job_marshs_stdin() {
    use std::io::Write;
    let env = Env::new();
    let mut child = env
        .cmd()
        .args(["-c", "tr a-z A-Z"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"abc").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        (code(&out), stdout(&out)),
        (0, "ABC".to_string()),
        "{}",
        stderr(&out)
    );
    // A null stdin reads as empty.
    assert_eq!(stdout(&env.run("cat; echo done")), "done\n");
}

#[test]
fn kit_run_runs_exactly_its_arguments_with_the_callers_stdio() {
    use std::io::Write;
    let env = Env::new();
    env.write_kit(
        "show",
        &[
            "/bin/sh",
            "-c",
            "printf '<%s>\\n' \"$@\"; tr a-z A-Z; exit 3",
            "show",
        ],
    );
    let args = ["a b", "-x", "--", "$HOME", "", "it's"];
    let mut argv = vec!["kit", "run", "show", "--"];
    argv.extend_from_slice(&args);
    let mut child = env
        .cmd()
        .args(&argv)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"piped").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "<a b>\n<-x>\n<-->\n<$HOME>\n<>\n<it's>\nPIPED"
    );

    let receipt = env.json(&["results"])["results"][0].clone();
    assert_eq!(receipt["kind"], "kit");
    assert_eq!(receipt["kit"], "show");
    assert_eq!(receipt["exit_code"], 3);
    assert_eq!(
        receipt["command"],
        "/bin/sh -c 'printf '\\''<%s>\\n'\\'' \"$@\"; tr a-z A-Z; exit 3' show 'a b' -x -- '$HOME' '' 'it'\\''s'"
    );
    assert_eq!(env.status()["workers"][0]["state"], "warm");

    // The invocation log is the evidence of the argv marsh was given.
    let log = std::fs::read_to_string(env.home.join(".shim/invocations.jsonl")).unwrap();
    let line: serde_json::Value = log
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .rfind(|l| l["argv"][1] == "kit")
        .unwrap();
    let logged: Vec<&str> = line["argv"].as_array().unwrap()[1..]
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(logged, argv);

    // Without `--`, the arguments start at the first word that is not an option.
    let out = env.marsh(&["kit", "run", "show", "plain", "-y"]);
    assert_eq!(stdout(&out), "<plain>\n<-y>\n");

    // A kit killed by signal N exits 128+N.
    env.write_kit("die", &["/bin/sh", "-c", "kill -9 $$"]);
    assert_eq!(code(&env.marsh(&["kit", "run", "die"])), 128 + 9);
}

#[test]
fn kit_run_writes_the_receipt_id_to_its_descriptor() {
    let env = Env::new();
    env.write_kit("ok", &["/bin/echo", "done"]);
    let receipt_file = env.dir.path().join("receipt");
    let script = "exec \"$0\" kit run ok --receipt-fd 3 -- x 3>\"$1\"";
    let marsh = env.marsh.to_str().unwrap().to_string();
    let out = env
        .cmd_with(
            "/bin/sh",
            &["-c", script, &marsh, receipt_file.to_str().unwrap()],
        )
        .output()
        .unwrap();
    assert_eq!(
        (code(&out), stdout(&out)),
        (0, "done x\n".to_string()),
        "{}",
        stderr(&out)
    );
    let written = std::fs::read_to_string(&receipt_file).unwrap();
    let id = written.strip_suffix('\n').unwrap();
    let receipt = env.json(&["results", "show", id]);
    assert_eq!(receipt["id"], id);
    assert_eq!(receipt["kind"], "kit");

    // The descriptor must be open for writing, numbered 3 or more.
    for args in [
        &["kit", "run", "ok", "--receipt-fd", "9"][..],
        &["kit", "run", "ok", "--receipt-fd", "2"],
    ] {
        let out = env.marsh(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
    }
    let script = "exec \"$0\" kit run ok --receipt-fd 3 3<\"$1\"";
    let out = env
        .cmd_with(
            "/bin/sh",
            &["-c", script, &marsh, receipt_file.to_str().unwrap()],
        )
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not open for writing"),
        "{}",
        stderr(&out)
    );

    // Without a receipt (the kit is unknown) nothing is written.
    std::fs::write(&receipt_file, "").unwrap();
    let script = "exec \"$0\" kit run missing --receipt-fd 3 3>\"$1\"";
    let out = env
        .cmd_with(
            "/bin/sh",
            &["-c", script, &marsh, receipt_file.to_str().unwrap()],
        )
        .output()
        .unwrap();
    assert_eq!(code(&out), 1);
    assert_eq!(std::fs::read_to_string(&receipt_file).unwrap(), "");
}

#[test]
fn kit_run_refuses_an_unknown_kit_before_any_job_and_honours_injection() {
    let env = Env::new();
    let out = env.marsh(&["kit", "run", "nope", "--", "x"]);
    assert_eq!(code(&out), 1);
    assert_eq!(stderr(&out), "marsh: unknown kit nope\n");
    std::fs::create_dir_all(&env.home).unwrap();
    let out = env.marsh(&["kit", "run", "Bad.Name"]);
    assert_eq!(stderr(&out), "marsh: unknown kit Bad.Name\n");
    assert_eq!(
        env.status()["daemon"]["state"],
        "absent",
        "nothing was booted"
    );
    assert_eq!(env.json(&["results"])["results"], serde_json::json!([]));

    env.write_kit("ok", &["true"]);
    env.inject("fail", "kit-run", "4");
    let out = env.marsh(&["kit", "run", "ok"]);
    assert_eq!(code(&out), 4);
    assert_eq!(stderr(&out), "marsh: injected failure: kit-run\n");
    std::fs::remove_file(env.home.join(".shim/fail/kit-run")).unwrap();
    env.inject("fail", "boot", "5");
    assert_eq!(code(&env.marsh(&["kit", "run", "ok"])), 5);
}

#[test]
fn kit_run_is_cancelled_by_sigterm_and_counts_as_active() {
    let env = Env::new();
    env.write_kit("slow", &["sleep", "41.5"]);
    let mut job = env.spawn(&["kit", "run", "slow"]);
    env.wait_status("the kit job", |s| s["active_jobs"] == 1);
    assert_eq!(code(&env.marsh(&["stop"])), 125, "busy while the kit runs");
    kill(Pid::from_raw(job.id() as i32), Signal::SIGTERM).unwrap();
    assert_eq!(job.wait().unwrap().code(), Some(128 + 15));
    common::wait_no_process("sleep 41.5");
    env.wait_status("the kit job to end", |s| s["active_jobs"] == 0);
    let receipt = env.json(&["results"])["results"][0].clone();
    assert_eq!(receipt["kit"], "slow");
    assert_eq!(receipt["exit_code"], serde_json::Value::Null);
}
