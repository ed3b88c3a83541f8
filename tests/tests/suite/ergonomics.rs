//! Operator ergonomics: the sbx default ($MARSH_SBX, then PATH), relative
//! paths resolved before a broker is spawned, `serve --help`, and the `doctor`
//! command line.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use marsh_tests::{Sandbox, Server};
use serde_json::json;

/// Far below `broker-start`'s own 20 s bound, which a broker started in the wrong
/// place used to run into.
const QUICK: Duration = Duration::from_secs(10);

fn text(p: &Path) -> String {
    p.display().to_string()
}

fn run(mut cmd: Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("run marsh-mcp")
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `args` without its `--sbx S`.
fn without_sbx(mut args: Vec<String>) -> Vec<String> {
    let at = args.iter().position(|a| a == "--sbx").expect("--sbx");
    args.drain(at..at + 2);
    args
}

fn verb(mut args: Vec<String>, verb: &str) -> Vec<String> {
    args[0] = verb.to_string();
    args
}

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    out(&o)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_string()
}

fn private_dir(path: &Path) -> PathBuf {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    path.to_path_buf()
}

/// A directory with a file `sbx` of `mode` (a script, so its digest differs from
/// the prefix's sbx).
fn dir_with_sbx(sb: &Sandbox, name: &str, mode: u32) -> PathBuf {
    let dir = private_dir(&sb.state().join(name));
    fs::write(dir.join("sbx"), format!("#!/bin/sh\n# {name}\nexit 0\n")).unwrap();
    fs::set_permissions(dir.join("sbx"), fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// The digest the `doctor` tool reports for the pinned sbx.
fn pinned_sbx_sha(server: &mut Server) -> String {
    let doctor = server.ok("doctor", json!({}));
    let check = doctor["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "pinned_sbx")
        .unwrap_or_else(|| panic!("{doctor}"))
        .clone();
    assert_eq!(check["ok"], true, "{check}");
    let detail = check["detail"].as_str().unwrap();
    detail.rsplit(' ').next().unwrap().to_string()
}

/// The command line of the running broker, arguments joined by spaces.
fn broker_cmdline(sb: &Sandbox) -> String {
    let raw = fs::read(format!("/proc/{}/cmdline", sb.broker_pid())).unwrap();
    String::from_utf8_lossy(&raw).replace('\0', " ")
}

/// Runs `broker-start` with `args` from `cwd`; asserts it succeeds quickly.
fn broker_start_from(sb: &Sandbox, cwd: &Path, args: &[String], env: &[(&str, &str)]) {
    let mut cmd = sb.marsh_mcp(args, env);
    cmd.current_dir(cwd);
    let started = Instant::now();
    let o = run(cmd);
    let took = started.elapsed();
    assert_eq!(o.status.code(), Some(0), "broker-start: {}", err(&o));
    assert!(err(&o).contains("broker started"), "{}", err(&o));
    assert!(took < QUICK, "broker-start took {took:?}");
}

#[test]
fn sbx_defaults_to_marsh_sbx_then_the_first_executable_sbx_on_path() {
    let sb = Sandbox::new();
    let prefix_sbx = sb.prefix.bin("sbx");
    let skipped = dir_with_sbx(&sb, "not-executable", 0o644);
    let found = dir_with_sbx(&sb, "on-path", 0o755);
    let path = format!(
        "relative-dir:{}:{}:/usr/bin:/bin",
        text(&skipped),
        text(&found)
    );
    let args = without_sbx(sb.serve_home_args(&[]));

    let mut s = Server::start(
        &sb,
        &args,
        &[("MARSH_SBX", &text(&prefix_sbx)), ("PATH", &path)],
    );
    assert_eq!(
        pinned_sbx_sha(&mut s),
        sha256(&prefix_sbx),
        "$MARSH_SBX first"
    );
    drop(s);

    let mut s = Server::start(&sb, &args, &[("PATH", &path)]);
    assert_eq!(
        pinned_sbx_sha(&mut s),
        sha256(&found.join("sbx")),
        "then the first executable sbx on PATH"
    );
    drop(s);

    let explicit = sb.serve_home_args(&[]);
    let mut s = Server::start(
        &sb,
        &explicit,
        &[("MARSH_SBX", &text(&found.join("sbx"))), ("PATH", &path)],
    );
    assert_eq!(pinned_sbx_sha(&mut s), sha256(&prefix_sbx), "--sbx wins");
}

#[test]
fn broker_start_pins_the_default_sbx_and_hands_the_broker_its_absolute_path() {
    let sb = Sandbox::new();
    let link = sb.state().join("sbx-link");
    std::os::unix::fs::symlink(sb.prefix.bin("sbx"), &link).unwrap();
    let args = without_sbx(sb.broker_args("broker-start", &[]));
    broker_start_from(&sb, &sb.workspace(), &args, &[("MARSH_SBX", &text(&link))]);
    let cmdline = broker_cmdline(&sb);
    assert!(
        cmdline.contains(&format!("--sbx {}", text(&sb.prefix.bin("sbx")))),
        "the broker gets the canonical pinned sbx, not the variable: {cmdline}"
    );
    // The same configuration given explicitly is the same broker.
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("already running"), "{stderr}");
    let mut s = sb.connect();
    s.ok("shell_run", json!({"command": "true"}));
}

#[test]
fn without_any_sbx_every_mode_refuses_naming_each_fix() {
    let sb = Sandbox::new();
    let empty = private_dir(&sb.state().join("empty"));
    let path = format!("{}:/usr/bin:/bin", text(&empty));
    let env = [("PATH", path.as_str())];
    for args in [
        without_sbx(sb.serve_home_args(&[])),
        without_sbx(sb.broker_args("broker-start", &[])),
    ] {
        let o = run(sb.marsh_mcp(&args, &env));
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let stderr = err(&o);
        assert!(stderr.starts_with("marsh-mcp: no sbx to pin"), "{stderr}");
        for fix in ["--sbx", "MARSH_SBX", "PATH"] {
            assert!(stderr.contains(fix), "{fix} not named: {stderr}");
        }
    }
    assert!(
        !sb.home().exists() && !sb.root().exists(),
        "nothing created"
    );
    let doctor = run(sb.marsh_mcp(&verb(without_sbx(sb.serve_home_args(&[])), "doctor"), &env));
    assert_eq!(doctor.status.code(), Some(1));
    assert!(
        out(&doctor).contains("FAIL  startup: no sbx to pin"),
        "{}",
        out(&doctor)
    );
    let relative = run(sb.marsh_mcp(
        &without_sbx(sb.serve_home_args(&[])),
        &[("MARSH_SBX", "bin/sbx")],
    ));
    assert_eq!(relative.status.code(), Some(1));
    assert!(
        err(&relative).contains("MARSH_SBX=bin/sbx is not an absolute path"),
        "{}",
        err(&relative)
    );
}

#[test]
fn broker_start_resolves_relative_paths_against_its_own_cwd() {
    let sb = Sandbox::new();
    let prefix = sb
        .prefix
        .bin("marsh")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();

    // From the prefix: `--marsh ./bin/marsh --sbx bin/sbx`.
    let mut args = sb.broker_args("broker-start", &[]);
    args[6] = "bin/sbx".into();
    args.extend(["--marsh".to_string(), "./bin/marsh".into()]);
    broker_start_from(&sb, &prefix, &args, &[]);
    let cmdline = broker_cmdline(&sb);
    for bin in ["marsh", "sbx"] {
        let flag = format!("--{bin} {}", text(&sb.prefix.bin(bin)));
        assert!(cmdline.contains(&flag), "{flag} missing: {cmdline}");
    }
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("already running"),
        "same configuration: {stderr}"
    );
    let mut s = sb.connect();
    let data = s.ok("shell_run", json!({"command": "echo relative"}));
    assert_eq!(data["stdout_text"], "relative\n");
    drop(s);
    let (code, stderr) = sb.startup(&sb.broker_args("broker-stop", &[]), &[]);
    assert_eq!(code, Some(0), "{stderr}");

    // From the state directory: a relative workspace, root and sbx.
    let args: Vec<String> = [
        "broker-start",
        "--workspace",
        &format!("../{}", name(&sb.workspace())),
        "--scope-root",
        "root",
        "--sbx",
        &format!("../{}/bin/sbx", name(&prefix)),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    broker_start_from(&sb, &sb.state(), &args, &[]);
    assert!(
        broker_cmdline(&sb).contains(&format!("--scope-root {}", text(&sb.root()))),
        "{}",
        broker_cmdline(&sb)
    );
    let mut s = sb.connect();
    assert!(s.tool_names().contains(&"shell_run".to_string()));
}

#[test]
fn serve_help_states_the_legacy_default_and_the_sbx_default() {
    let sb = Sandbox::new();
    let o = run(sb.marsh_mcp(&["serve".to_string(), "--help".into()], &[]));
    assert_eq!(o.status.code(), Some(0));
    let help = out(&o);
    for needle in [
        "legacy single-scope mode on $MARSH_HOME",
        "~/.marsh",
        "$MARSH_SBX",
        "PATH",
    ] {
        assert!(
            help.contains(needle),
            "{needle:?} missing from serve --help:\n{help}"
        );
    }
    let o = run(sb.marsh_mcp(&["doctor".to_string(), "--help".into()], &[]));
    assert_eq!(o.status.code(), Some(0));
    assert!(out(&o).contains("exits 0 when healthy"), "{}", out(&o));
    let mut args = verb(sb.serve_home_args(&[]), "doctor");
    args.extend(["--declaration".to_string(), "/nonexistent".into()]);
    let (code, stderr) = sb.startup(&args, &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("accepted only by serve"), "{stderr}");
}

/// `marsh-mcp doctor ARGS`'s stdout lines, after asserting its exit code.
fn doctor_lines(sb: &Sandbox, serve_args: Vec<String>, code: i32) -> Vec<String> {
    let o = run(sb.marsh_mcp(&verb(serve_args, "doctor"), &[]));
    let stdout = out(&o);
    assert_eq!(o.status.code(), Some(code), "{stdout}\nstderr: {}", err(&o));
    stdout.lines().map(str::to_string).collect()
}

fn line<'a>(lines: &'a [String], start: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?}: {lines:#?}"))
}

#[test]
fn doctor_prints_one_readable_line_per_check_and_exits_0_when_healthy() {
    let sb = Sandbox::new();
    for args in [sb.serve_home_args(&[]), sb.serve_root_args(&[])] {
        let lines = doctor_lines(&sb, args, 0);
        assert!(lines[0].starts_with("marsh-mcp doctor "), "{lines:#?}");
        assert!(lines[0].contains(&text(&sb.workspace())), "{lines:#?}");
        assert!(line(&lines, "  ok    pinned_sbx: identity unchanged; sha256 ").len() > 60);
        line(&lines, "  ok    isolation: jobs run under bubblewrap");
        assert!(!lines.iter().any(|l| l.contains("FAIL")), "{lines:#?}");
        assert!(
            lines.last().unwrap().starts_with("healthy: all "),
            "{lines:#?}"
        );
    }
    // The lease doctor held is free again: a server takes the root.
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    assert_eq!(s.ok("doctor", json!({}))["healthy"], true);
}

#[test]
fn doctor_exits_1_when_unhealthy_when_startup_fails_and_when_the_root_is_leased() {
    let sb = Sandbox::new();

    // No bubblewrap, by the backend setting.
    private_dir(&sb.home());
    fs::set_permissions(sb.home(), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(
        sb.home().join("backend.json"),
        r#"{"bwrap": "/nonexistent/bwrap"}"#,
    )
    .unwrap();
    let lines = doctor_lines(&sb, sb.serve_home_args(&[]), 1);
    assert!(
        line(&lines, "  FAIL  isolation: ").contains("apt-get install bubblewrap"),
        "{lines:#?}"
    );
    line(&lines, "  ok    pinned_marsh: ");
    assert!(
        lines.last().unwrap().starts_with("unhealthy: 1 of "),
        "{lines:#?}"
    );

    // A startup rule: a group-writable sbx.
    let writable = dir_with_sbx(&sb, "writable", 0o775).join("sbx");
    let mut args = sb.serve_root_args(&[]);
    args[6] = text(&writable);
    let lines = doctor_lines(&sb, args, 1);
    assert!(
        line(&lines, "  FAIL  startup: ").contains("writable by group or others"),
        "{lines:#?}"
    );

    // A root leased by a running server is left alone.
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let lines = doctor_lines(&sb, sb.serve_root_args(&[]), 1);
    assert!(
        line(&lines, "  FAIL  lease: ").contains("is leased by a running marsh-mcp"),
        "{lines:#?}"
    );
    assert_eq!(
        s.ok("doctor", json!({}))["healthy"],
        true,
        "the server keeps serving"
    );
    drop(s);

    // ... and so is one leased by the resident broker, named by its pid.
    let (code, stderr) = sb.broker_start();
    assert_eq!(code, Some(0), "{stderr}");
    let lines = doctor_lines(&sb, sb.serve_root_args(&[]), 1);
    let lease = line(&lines, "  FAIL  lease: ");
    assert!(
        lease.contains(&format!("the resident broker (pid {})", sb.broker_pid())),
        "{lease}"
    );
    let mut c = sb.connect();
    assert_eq!(
        c.ok("doctor", json!({}))["healthy"],
        true,
        "the broker keeps serving"
    );
}
