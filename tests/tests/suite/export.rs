//! `marsh-mcp export-serve`: startup refusals, exactly one tool, pipeline and
//! command-mode calls with their result fields, and revocation of a running server.
//! Declarations are written here by hand (the publication flow has its own suite).

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::Engine;
use marsh_tests::{Sandbox, Server};
use serde_json::{Value, json};

pub(crate) const GENERATION: &str = "7c0e9a52-4d1b-4f3e-8a6c-0123456789ab";

/// A hand-made publication: an owner-only control directory and its declaration.
pub(crate) struct Declared {
    pub home: PathBuf,
    pub path: PathBuf,
}

/// The declaration fields for a pipeline of this sandbox's workspace and home.
pub(crate) fn pipeline_declaration(sb: &Sandbox, name: &str, pipeline: &str) -> Value {
    let workspace = sb.workspace();
    let meta = fs::metadata(&workspace).unwrap();
    json!({
        "schema": "marsh.published_tool/v1",
        "tool_name": name,
        "description": "Upper-cases its input",
        "publication_generation": GENERATION,
        "pipeline": pipeline,
        "input_schema": {"type": "object", "additionalProperties": false,
                         "properties": {"input": {"type": "string"}}},
        "canonical_workspace": workspace,
        "workspace_identity": {"device": meta.dev(), "inode": meta.ino()},
        "home": sb.home(),
    })
}

/// Writes `value` as the declaration (0600) in `<state>/control/mcp/published/`.
pub(crate) fn declare(sb: &Sandbox, value: &Value) -> Declared {
    let home = sb.home();
    if !home.exists() {
        fs::create_dir(&home).unwrap();
        fs::set_permissions(&home, fs::Permissions::from_mode(0o700)).unwrap();
    }
    let dir = sb.state().join("control/mcp/published");
    fs::create_dir_all(&dir).unwrap();
    for d in [
        sb.state().join("control"),
        sb.state().join("control/mcp"),
        dir.clone(),
    ] {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
    }
    let path = dir.join(format!("{}.json", value["tool_name"].as_str().unwrap()));
    write_owner_only(&path, value);
    Declared { home, path }
}

pub(crate) fn write_owner_only(path: &Path, value: &Value) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_vec(value).unwrap()).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).unwrap();
    fs::rename(&tmp, path).unwrap();
}

pub(crate) fn export_args(sb: &Sandbox, d: &Declared, generation: Option<&str>) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "export-serve".into(),
        "--workspace".into(),
        sb.workspace().display().to_string(),
        "--home".into(),
        d.home.display().to_string(),
        "--declaration".into(),
        d.path.display().to_string(),
    ];
    if let Some(g) = generation {
        args.push("--expected-generation".into());
        args.push(g.into());
    }
    args.extend([
        "--marsh".into(),
        sb.prefix.bin("marsh").display().to_string(),
        "--sbx".into(),
        sb.prefix.bin("sbx").display().to_string(),
    ]);
    args
}

/// `tools/call` returning the whole `result` (the envelope is `structuredContent`).
fn call_result(server: &mut Server, name: &str, arguments: Value) -> Value {
    let reply = server.request("tools/call", json!({"name": name, "arguments": arguments}));
    let result = reply["result"].clone();
    assert!(result.is_object(), "protocol-level failure: {reply}");
    let ok = result["structuredContent"]["ok"].as_bool().unwrap();
    assert_eq!(
        result["isError"].as_bool().unwrap_or(false),
        !ok,
        "{result}"
    );
    result
}

fn envelope(server: &mut Server, name: &str, arguments: Value) -> Value {
    call_result(server, name, arguments)["structuredContent"].clone()
}

fn decoded(data: &Value, stream: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(data[format!("{stream}_base64")].as_str().unwrap())
        .unwrap()
}

#[test]
fn a_pipeline_tool_is_the_only_tool_and_answers_each_case_as_specified() {
    let sb = Sandbox::new();
    let mut decl = pipeline_declaration(&sb, "hello", "tr a-z A-Z");
    decl["timeout_ms"] = json!(20_000);
    let d = declare(&sb, &decl);
    let mut server = Server::start(&sb, &export_args(&sb, &d, Some(GENERATION)), &[]);

    let list = server.request("tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1, "{list}");
    assert_eq!(tools[0]["name"], "hello");
    assert_eq!(tools[0]["inputSchema"], decl["input_schema"]);
    assert!(tools[0]["outputSchema"]["properties"]["data"]["properties"]["outcome"].is_object());

    let result = call_result(&mut server, "hello", json!({"input": "abc"}));
    let data = &result["structuredContent"]["data"];
    assert_eq!(result["structuredContent"]["ok"], true, "{result}");
    assert_eq!(data["outcome"], "success");
    assert_eq!(data["exit_code"], 0);
    assert_eq!(decoded(data, "stdout"), b"ABC");
    assert_eq!(data["stdout_text"], "ABC");
    assert_eq!(data["stdout_text_state"], "utf8");
    assert_eq!(data["output_complete"], true);
    assert_eq!(data["cleanup_certainty"], "uncertain");
    assert_eq!(data["host_cleanup_certainty"], "verified");
    assert!(data.get("receipt_selector").is_none(), "{data}");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("ABC")
    );

    // Every development tool is absent and refused, as is any other name.
    for name in ["shell_run", "scope_list", "status", "nope"] {
        let env = envelope(&mut server, name, json!({"command": "true"}));
        assert_eq!(env["ok"], false, "{name}: {env}");
        assert_eq!(env["error"]["kind"], "not_found", "{env}");
    }
    // Unknown properties and oversized input are refused before any job.
    let env = envelope(&mut server, "hello", json!({"input": "x", "command": "id"}));
    assert_eq!(env["error"]["kind"], "invalid_argument", "{env}");
    let env = envelope(
        &mut server,
        "hello",
        json!({"input": "x".repeat(64 * 1024 + 1)}),
    );
    assert_eq!(env["error"]["kind"], "invalid_argument", "{env}");
    let env = envelope(&mut server, "hello", json!({"input": 5}));
    assert_eq!(env["error"]["kind"], "invalid_argument", "{env}");
    // No input is empty stdin.
    let env = envelope(&mut server, "hello", json!({}));
    assert_eq!(env["data"]["outcome"], "success", "{env}");
    assert_eq!(decoded(&env["data"], "stdout"), b"");
    server.close();
}

#[test]
fn exits_timeouts_binary_and_cut_output_are_reported_not_called_success() {
    let sb = Sandbox::new();
    let cases = [
        (
            "fails",
            "cat >/dev/null; echo oops >&2; exit 3",
            20_000,
            262_144,
        ),
        ("slow", "sleep 30", 400, 262_144),
        ("binary", "printf 'a\\377\\376b'", 20_000, 262_144),
        ("chatty", "printf 0123456789abcdef", 20_000, 10),
    ];
    for (name, pipeline, timeout_ms, max_output) in cases {
        let mut decl = pipeline_declaration(&sb, name, pipeline);
        decl["timeout_ms"] = json!(timeout_ms);
        decl["max_output_bytes"] = json!(max_output);
        declare(&sb, &decl);
    }
    let start = |name: &str| {
        let d = Declared {
            home: sb.home(),
            path: sb
                .state()
                .join(format!("control/mcp/published/{name}.json")),
        };
        Server::start(&sb, &export_args(&sb, &d, Some(GENERATION)), &[])
    };

    let mut s = start("fails");
    let env = envelope(&mut s, "fails", json!({"input": "x"}));
    assert_eq!(env["ok"], false);
    assert_eq!(env["data"]["outcome"], "exit_nonzero", "{env}");
    assert_eq!(env["data"]["exit_code"], 3);
    assert_eq!(decoded(&env["data"], "stderr"), b"oops\n");
    s.close();

    let mut s = start("slow");
    let env = envelope(&mut s, "slow", json!({}));
    assert_eq!(env["data"]["outcome"], "timeout", "{env}");
    assert_eq!(env["data"]["cleanup_certainty"], "uncertain");
    s.close();

    let mut s = start("binary");
    let env = envelope(&mut s, "binary", json!({}));
    assert_eq!(env["data"]["outcome"], "success", "{env}");
    assert_eq!(decoded(&env["data"], "stdout"), b"a\xff\xfeb");
    assert_eq!(env["data"]["stdout_text_state"], "lossy");
    s.close();

    let mut s = start("chatty");
    let env = envelope(&mut s, "chatty", json!({}));
    assert_eq!(env["ok"], false, "{env}");
    assert_eq!(env["data"]["outcome"], "failed");
    assert_eq!(decoded(&env["data"], "stdout"), b"0123456789");
    assert_eq!(env["data"]["stdout_truncated"], true);
    assert_eq!(env["data"]["stdout_text_state"], "truncated");
    assert_eq!(env["data"]["output_complete"], false);
    s.close();
}

#[test]
fn a_replaced_or_removed_declaration_empties_a_running_server() {
    let sb = Sandbox::new();
    let decl = pipeline_declaration(&sb, "hello", "tr a-z A-Z");
    let d = declare(&sb, &decl);
    let args = export_args(&sb, &d, Some(GENERATION));

    // Re-generated (a republish): empty list, calls refused, and it stays so.
    let mut server = Server::start(&sb, &args, &[]);
    assert_eq!(server.tool_names(), vec!["hello".to_string()]);
    let mut next = decl.clone();
    next["publication_generation"] = json!("11111111-2222-4333-8444-555555555555");
    write_owner_only(&d.path, &next);
    assert!(server.tool_names().is_empty());
    let env = envelope(&mut server, "hello", json!({"input": "abc"}));
    assert_eq!(env["error"]["kind"], "publication_changed", "{env}");
    write_owner_only(&d.path, &decl);
    assert!(
        server.tool_names().is_empty(),
        "a revoked server never comes back"
    );
    server.close();

    // Removed (an unpublish).
    let mut server = Server::start(&sb, &args, &[]);
    fs::remove_file(&d.path).unwrap();
    assert!(server.tool_names().is_empty());
    let env = envelope(&mut server, "hello", json!({"input": "abc"}));
    assert_eq!(env["error"]["kind"], "publication_changed", "{env}");
    server.close();

    // Starting from a stale registration fails.
    write_owner_only(&d.path, &next);
    let (code, stderr) = sb.startup(&args, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("generation"), "{stderr}");
}

#[test]
fn every_startup_rule_refuses_before_the_first_byte() {
    let sb = Sandbox::new();
    let decl = pipeline_declaration(&sb, "hello", "tr a-z A-Z");
    let d = declare(&sb, &decl);
    let good = export_args(&sb, &d, Some(GENERATION));
    let refused = |args: &[String], expected: &str| {
        let (code, stderr) = sb.startup(args, &[]);
        assert_eq!(code, Some(1), "{expected}: {stderr}");
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    };
    let with = |flag: &str, value: Option<&str>| {
        let mut args = good.clone();
        match args.iter().position(|a| a == flag) {
            Some(i) => match value {
                Some(v) => args[i + 1] = v.into(),
                None => {
                    args.remove(i + 1);
                    args.remove(i);
                }
            },
            None => {
                args.push(flag.into());
                args.extend(value.map(String::from));
            }
        }
        args
    };

    refused(&with("--home", None), "--home is required");
    for flag in ["--workspace", "--home", "--declaration", "--marsh", "--sbx"] {
        refused(
            &with(flag, Some("relative/path")),
            &format!("{flag} relative/path is not an absolute path"),
        );
    }
    refused(
        &with("--scope-root", Some("/tmp")),
        "--scope-root is refused",
    );
    refused(
        &with("--allow-full-sbx-control", None),
        "--allow-full-sbx-control is refused",
    );
    refused(&with("--expected-generation", None), "generation");
    refused(
        &with(
            "--expected-generation",
            Some("11111111-2222-4333-8444-555555555555"),
        ),
        "generation",
    );
    refused(
        &with("--expected-generation", Some("NOT-A-UUID")),
        "lowercase UUID",
    );

    // The workspace's generated SBX scope root (and a scope inside it) is no home.
    let user = sb.state().join("user");
    let hash = marsh_scope_registry::workspace_hash(&sb.workspace());
    let generated = user
        .join(".local/state/marsh-mcp-scopes/clients/sbx")
        .join(hash);
    fs::create_dir_all(generated.join("default")).unwrap();
    refused(
        &with("--home", Some(generated.to_str().unwrap())),
        "development scope root",
    );
    refused(
        &with("--home", Some(generated.join("default").to_str().unwrap())),
        "development scope root",
    );

    // The declaration's own rules.
    let published = d.path.parent().unwrap().to_path_buf();
    let variant = |name: &str, mode: u32| {
        let path = published.join(name);
        write_owner_only(&path, &decl);
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        with("--declaration", Some(path.to_str().unwrap()))
    };
    refused(&variant("loose.json", 0o644), "owner-only");
    let link = published.join("link.json");
    std::os::unix::fs::symlink(&d.path, &link).unwrap();
    refused(
        &with("--declaration", Some(link.to_str().unwrap())),
        "canonical",
    );
    let linked = published.join("second.json");
    fs::hard_link(&d.path, &linked).unwrap();
    refused(&good, "hard links");
    fs::remove_file(&linked).unwrap();
    let in_ws = sb.workspace().join("d.json");
    write_owner_only(&in_ws, &decl);
    refused(
        &with("--declaration", Some(in_ws.to_str().unwrap())),
        "inside the workspace",
    );
    let in_home = d.home.join("d.json");
    write_owner_only(&in_home, &decl);
    refused(
        &with("--declaration", Some(in_home.to_str().unwrap())),
        "inside the home",
    );
    let mut other = decl.clone();
    other["workspace_identity"]["inode"] = json!(1);
    write_owner_only(&published.join("other.json"), &other);
    refused(
        &with(
            "--declaration",
            Some(published.join("other.json").to_str().unwrap()),
        ),
        "not this one",
    );
    let mut malformed = decl.clone();
    malformed["surprise"] = json!(true);
    write_owner_only(&published.join("bad.json"), &malformed);
    refused(
        &with(
            "--declaration",
            Some(published.join("bad.json").to_str().unwrap()),
        ),
        "malformed",
    );
    fs::set_permissions(&published, fs::Permissions::from_mode(0o777)).unwrap();
    refused(&good, "writable by group or others");
    fs::set_permissions(&published, fs::Permissions::from_mode(0o700)).unwrap();

    // `serve --declaration` is the same mode; the broker never serves one.
    let mut alias = good.clone();
    alias[0] = "serve".into();
    let mut server = Server::start(&sb, &alias, &[]);
    assert_eq!(server.tool_names(), vec!["hello".to_string()]);
    server.close();
    let mut broker = good.clone();
    broker[0] = "broker-start".into();
    refused(&broker, "--declaration is accepted only by serve");
}

/// docs/publishing.md's command-mode example, on a kit that echoes its argv and stdin.
fn command_declaration(sb: &Sandbox) -> Value {
    let mut decl = pipeline_declaration(sb, "lint", "unused");
    let object = decl.as_object_mut().unwrap();
    object.remove("pipeline");
    object.insert(
        "command".into(),
        json!({"kit": "echoargs", "bindings": {
            "argv": [{"literal": "check"},
                     {"positional": "path"},
                     {"named_option": {"option": "--lang", "field": "lang"}},
                     {"flag": {"option": "--fix", "field": "fix"}}],
            "stdin": {"field": "config", "max_bytes": 1024}}}),
    );
    object.insert(
        "input_schema".into(),
        json!({"type": "object", "additionalProperties": false, "required": ["path"],
               "properties": {"path": {"type": "string"}, "lang": {"type": "string"},
                              "fix": {"type": "boolean"}, "config": {"type": "string"}}}),
    );
    decl
}

#[test]
fn command_mode_builds_exactly_the_declared_argv_without_a_shell() {
    let sb = Sandbox::new();
    let d = declare(&sb, &command_declaration(&sb));
    let mut server = Server::start(&sb, &export_args(&sb, &d, Some(GENERATION)), &[]);

    // Not registered yet: refused before any job (marsh is never invoked).
    let env = envelope(&mut server, "lint", json!({"path": "a"}));
    assert_eq!(env["error"]["kind"], "not_found", "{env}");
    assert!(sb.invocations(&d.home).is_empty());

    fs::create_dir_all(d.home.join("kits")).unwrap();
    fs::write(
        d.home.join("kits/echoargs.json"),
        json!({"command": ["/bin/sh", "-c", "printf '[%s]' \"$@\"; printf '<'; cat; printf '>'", "kit"],
               "description": "echoes argv and stdin"})
        .to_string(),
    )
    .unwrap();

    let env = envelope(
        &mut server,
        "lint",
        json!({"path": "a b; $(id)", "lang": "rust", "fix": true, "config": "strict"}),
    );
    let data = &env["data"];
    assert_eq!(data["outcome"], "success", "{env}");
    assert_eq!(
        String::from_utf8(decoded(data, "stdout")).unwrap(),
        "[check][a b; $(id)][--lang][rust][--fix]<strict>"
    );
    assert_eq!(data["cleanup_certainty"], "verified");
    assert!(data.get("host_cleanup_certainty").is_none(), "{data}");
    let receipt = data["receipt_selector"].as_str().expect("a kit receipt");

    // The stand-in's invocation log holds exactly that argv after `--`.
    let runs: Vec<Value> = sb
        .invocations(&d.home)
        .into_iter()
        .filter(|i| i["argv"][1] == "kit")
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let argv: Vec<&str> = runs[0]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(&argv[1..4], ["kit", "run", "echoargs"]);
    let dashdash = argv.iter().position(|a| *a == "--").unwrap();
    assert_eq!(
        &argv[dashdash + 1..],
        ["check", "a b; $(id)", "--lang", "rust", "--fix"]
    );

    // Optional bindings left out; the receipt is a real kit receipt.
    let env = envelope(&mut server, "lint", json!({"path": "x", "fix": false}));
    assert_eq!(
        String::from_utf8(decoded(&env["data"], "stdout")).unwrap(),
        "[check][x]<>"
    );
    let out = std::process::Command::new(sb.prefix.bin("marsh"))
        .args(["results", "show", receipt, "--json"])
        .env("MARSH_HOME", &d.home)
        .current_dir(sb.workspace())
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["kind"], "kit", "{shown}");

    // Values that would read as options, and bad types, never reach marsh.
    let before = sb.invocations(&d.home).len();
    for args in [
        json!({"path": "-rf"}),
        json!({"path": "x", "lang": "--all"}),
        json!({"path": "x", "fix": "yes"}),
        json!({"path": "x", "config": "c".repeat(1025)}),
        json!({"path": "x", "extra": 1}),
    ] {
        let env = envelope(&mut server, "lint", args);
        assert_eq!(env["error"]["kind"], "invalid_argument", "{env}");
    }
    assert_eq!(sb.invocations(&d.home).len(), before);
    server.close();
}

/// Both streams at the output cap, escape-heavy: the reply (structured views, base64
/// and the readable text) still fits one frame, with every byte in base64.
#[test]
fn an_escape_heavy_published_result_fits_one_frame() {
    let sb = Sandbox::new();
    let pipeline = "cat >/dev/null; head -c 262144 /dev/zero | tr '\\000' '\\001'; head -c 262144 /dev/zero | tr '\\000' '\\002' >&2";
    let mut decl = pipeline_declaration(&sb, "noisy", pipeline);
    decl["max_output_bytes"] = json!(262_144);
    let d = declare(&sb, &decl);
    let mut s = Server::start(&sb, &export_args(&sb, &d, Some(GENERATION)), &[]);
    let reply = s.request(
        "tools/call",
        json!({"name": "noisy", "arguments": {"input": "x"}}),
    );
    let size = serde_json::to_vec(&reply).unwrap().len();
    assert!(size < 1024 * 1024, "a reply of {size} bytes");
    let data = &reply["result"]["structuredContent"]["data"];
    assert_eq!(data["outcome"], "success", "{data:.300}");
    assert_eq!(decoded(data, "stdout"), vec![1u8; 262_144]);
    assert_eq!(decoded(data, "stderr"), vec![2u8; 262_144]);
    let text = reply["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with("noisy: success (exit code 0)"),
        "{text:.200}"
    );
}
