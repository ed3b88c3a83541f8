//! shell_run through the real stand-in project shell: cwd, exit codes, separate
//! streams, byte-faithful output, environment hygiene and sandbox isolation.

use std::fs;

use marsh_tests::{Sandbox, Server, decode_b64};
use pretty_assertions::assert_eq;
use serde_json::json;

fn server(sb: &Sandbox) -> Server {
    Server::start(sb, &sb.serve_home_args(&[]), &[])
}

#[test]
fn natural_cwd_is_the_workspace_and_exit_status_is_reported() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let data = s.ok(
        "shell_run",
        json!({"command": "pwd; echo out; echo err >&2; exit 7"}),
    );
    assert_eq!(data["state"], "exited");
    assert_eq!(data["exit_code"], 7);
    assert_eq!(
        data["stdout_text"],
        format!("{}\nout\n", sb.workspace().display())
    );
    assert_eq!(data["stderr_text"], "err\n");
    assert_eq!(data["output_complete"], true);
    let ok = s.ok("shell_run", json!({"command": "true"}));
    assert_eq!(
        (ok["state"].as_str(), ok["exit_code"].as_i64()),
        (Some("succeeded"), Some(0))
    );
}

#[test]
fn non_utf8_bytes_come_back_exactly() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    let data = s.ok(
        "shell_run",
        json!({"command": r"printf 'a\377\376b\000c'; printf '\351' >&2"}),
    );
    assert_eq!(data["stdout_text_state"], "lossy");
    assert_eq!(
        decode_b64(data["stdout_base64"].as_str().unwrap()),
        b"a\xff\xfeb\x00c"
    );
    assert_eq!(decode_b64(data["stderr_base64"].as_str().unwrap()), b"\xe9");
    assert_eq!(data["stdout_page_bytes"], 6);
    let text = s.ok(
        "shell_run",
        json!({"command": "printf 'caf\\303\\251'", "include_base64": true}),
    );
    assert_eq!(text["stdout_text"], "café");
    assert_eq!(text["stdout_text_state"], "utf8");
    assert_eq!(
        decode_b64(text["stdout_base64"].as_str().unwrap()),
        "café".as_bytes()
    );
}

#[test]
fn hostile_inherited_environment_does_not_reach_marsh_or_the_job() {
    let sb = Sandbox::new();
    let hostile = [
        ("MARSH_SBX", "/evil/sbx"),
        ("MARSH_HOME", "/evil/home"),
        ("MARSHD_TOKEN", "stolen-token"),
        ("MARSH_DAEMON_SOCKET", "/evil/sock"),
        ("USER", "mallory"),
        ("LD_PRELOAD", "/evil/lib.so"),
    ];
    let mut s = Server::start(&sb, &sb.serve_home_args(&[]), &hostile);
    let data = s.ok("shell_run", json!({"command": "env"}));
    let env_text = data["stdout_text"].as_str().unwrap().to_string();
    for (_, value) in hostile {
        assert!(!env_text.contains(value), "job saw {value}: {env_text}");
    }
    // What marsh itself received (the stand-in logs its own environment).
    let runs = sb.invocations(&sb.home());
    let run = runs
        .iter()
        .find(|r| r["argv"].to_string().contains("\"env\""))
        .expect("logged run");
    let env = run["env"].as_object().unwrap();
    assert_eq!(env["MARSH_HOME"], sb.home().display().to_string());
    // The pinned sbx and marshd reach marsh as inherited descriptors, never as paths
    // that could be swapped after the check.
    let sbx = env["MARSH_SBX"].as_str().unwrap();
    let sbx_fd: u32 = sbx.strip_prefix("/proc/self/fd/").unwrap().parse().unwrap();
    let marshd_fd: u32 = env["MARSH_MARSHD_FD"].as_str().unwrap().parse().unwrap();
    assert!(
        sbx_fd > 2 && marshd_fd > 2 && sbx_fd != marshd_fd,
        "{sbx} {marshd_fd}"
    );
    assert_eq!(env["PATH"], "/usr/local/bin:/usr/bin:/bin");
    assert_eq!(env["USER"], marsh_tests::passwd_user().as_str());
    assert_eq!(env["LOGNAME"], marsh_tests::passwd_user().as_str());
    for name in ["MARSHD_TOKEN", "MARSH_DAEMON_SOCKET", "LD_PRELOAD"] {
        assert!(!env.contains_key(name), "marsh received {name}");
    }
}

#[test]
fn a_job_cannot_read_the_scope_root_home_or_token_but_can_write_the_workspace() {
    let sb = Sandbox::new();
    let mut s = Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let root = sb.root();
    let token = root.join("default/daemon/token");
    // Boot the daemon so the token exists on the host.
    s.ok("shell_run", json!({"command": "touch made-by-job"}));
    assert!(
        token.exists(),
        "the stand-in daemon should have a token on the host"
    );
    assert!(sb.workspace().join("made-by-job").exists());
    for probe in [
        format!("cat {}", token.display()),
        format!("ls {}", root.display()),
        format!("cat {}/scopes.json", root.display()),
    ] {
        let data = s.ok("shell_run", json!({"command": probe}));
        assert_ne!(
            data["exit_code"], 0,
            "{probe} succeeded inside the sandbox: {data}"
        );
        let secret = fs::read_to_string(&token).unwrap();
        assert!(
            !data["stdout_text"]
                .as_str()
                .unwrap()
                .contains(secret.trim())
        );
    }
}

#[test]
fn results_are_durable_receipts() {
    let sb = Sandbox::new();
    let mut s = server(&sb);
    s.ok("shell_run", json!({"command": "echo receipt-me"}));
    let listed = s.ok("results_list", json!({"limit": 5}));
    let first = &listed["results"][0];
    assert_eq!(first["command"], "echo receipt-me");
    assert!(
        first.get("workspace").is_none(),
        "host paths must not be returned"
    );
    let id = first["id"].as_str().unwrap();
    let got = s.ok("result_get", json!({"selector": &id[..8]}));
    assert_eq!(got["result"]["id"], id);
    assert_eq!(
        s.err_kind("result_get", json!({"selector": "ffffffff"})),
        "not_found"
    );
    // Receipts survive a server restart.
    drop(s);
    let mut again = server(&sb);
    let listed = again.ok("results_list", json!({}));
    assert_eq!(listed["results"][0]["id"], id);
}
