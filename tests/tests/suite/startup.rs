//! Every startup refusal exits 1 with `marsh-mcp: <reason>` on stderr before any MCP
//! byte is answered.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use marsh_tests::Sandbox;
use serde_json::json;

fn refused(sb: &Sandbox, args: &[String], env: &[(&str, &str)], needle: &str) {
    let (code, stderr) = sb.startup(args, env);
    assert_eq!(code, Some(1), "expected exit 1; stderr: {stderr}");
    assert!(
        stderr.starts_with("marsh-mcp: "),
        "stderr must start with the prefix: {stderr}"
    );
    assert!(
        stderr.contains(needle),
        "stderr should mention {needle:?}: {stderr}"
    );
}

#[test]
fn home_and_scope_root_are_mutually_exclusive() {
    let sb = Sandbox::new();
    let mut args = sb.serve_home_args(&[]);
    args.extend(["--scope-root".into(), sb.root().display().to_string()]);
    refused(&sb, &args, &[], "cannot be used with");
}

#[test]
fn missing_sbx_is_refused() {
    let sb = Sandbox::new();
    let args = vec![
        "serve".to_string(),
        "--home".into(),
        sb.home().display().to_string(),
    ];
    refused(&sb, &args, &[], "--sbx");
}

#[test]
fn home_or_root_inside_workspace_is_refused_and_not_created() {
    let sb = Sandbox::new();
    let inside = sb.workspace().join("h");
    let mut args = sb.serve_home_args(&[]);
    args[4] = inside.display().to_string();
    refused(&sb, &args, &[], "overlaps the workspace");
    assert!(!inside.exists());
    let mut args = sb.serve_root_args(&[]);
    args[4] = sb.workspace().join("r").display().to_string();
    refused(&sb, &args, &[], "overlaps the workspace");
}

#[test]
fn group_readable_or_foreign_home_is_refused() {
    let sb = Sandbox::new();
    fs::create_dir(sb.home()).unwrap();
    fs::set_permissions(sb.home(), fs::Permissions::from_mode(0o750)).unwrap();
    refused(&sb, &sb.serve_home_args(&[]), &[], "must not be accessible");
    fs::set_permissions(sb.home(), fs::Permissions::from_mode(0o700)).unwrap();
    if marsh_tests::skip_unless_root("chown the home to another uid") {
        return;
    }
    std::os::unix::fs::chown(sb.home(), Some(65534), None).unwrap();
    refused(&sb, &sb.serve_home_args(&[]), &[], "owned by uid 65534");
}

#[test]
fn executables_inside_workspace_or_home_are_refused() {
    let sb = Sandbox::new();
    let ws_bin = sb.workspace().join("bin");
    fs::create_dir(&ws_bin).unwrap();
    for name in ["marsh", "marshd", "sbx"] {
        fs::copy(sb.prefix.bin(name), ws_bin.join(name)).unwrap();
    }
    let mut args = sb.serve_home_args(&["--marsh"]);
    args.push(ws_bin.join("marsh").display().to_string());
    refused(&sb, &args, &[], "inside the workspace");
    let mut args = sb.serve_home_args(&[]);
    args[6] = ws_bin.join("sbx").display().to_string();
    refused(&sb, &args, &[], "inside the workspace");
    fs::create_dir(sb.home()).unwrap();
    fs::set_permissions(sb.home(), fs::Permissions::from_mode(0o700)).unwrap();
    fs::copy(sb.prefix.bin("sbx"), sb.home().join("sbx")).unwrap();
    let mut args = sb.serve_home_args(&[]);
    args[6] = sb.home().join("sbx").display().to_string();
    refused(&sb, &args, &[], "inside the home");
}

#[test]
fn marsh_needs_sibling_marshd_and_trusted_ancestors() {
    let sb = Sandbox::new();
    let lonely = sb.state().join("lonely");
    fs::create_dir(&lonely).unwrap();
    fs::copy(sb.prefix.bin("marsh"), lonely.join("marsh")).unwrap();
    let mut args = sb.serve_home_args(&["--marsh"]);
    args.push(lonely.join("marsh").display().to_string());
    refused(&sb, &args, &[], "marshd");

    let open = sb.state().join("open");
    fs::create_dir(&open).unwrap();
    for name in ["marsh", "marshd"] {
        fs::copy(sb.prefix.bin(name), open.join(name)).unwrap();
    }
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let mut args = sb.serve_home_args(&["--marsh"]);
    args.push(open.join("marsh").display().to_string());
    refused(&sb, &args, &[], "untrusted ancestor");
}

#[test]
fn writable_or_non_executable_sbx_is_refused() {
    let sb = Sandbox::new();
    let sbx = sb.prefix.bin("sbx");
    fs::set_permissions(&sbx, fs::Permissions::from_mode(0o775)).unwrap();
    refused(
        &sb,
        &sb.serve_home_args(&[]),
        &[],
        "writable by group or others",
    );
    fs::set_permissions(&sbx, fs::Permissions::from_mode(0o644)).unwrap();
    refused(&sb, &sb.serve_home_args(&[]), &[], "not executable");
}

#[test]
fn managed_root_refuses_unbound_populated_and_foreign_bound_roots() {
    let sb = Sandbox::new();
    fs::create_dir(sb.root()).unwrap();
    fs::set_permissions(sb.root(), fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(sb.root().join("leftover"), b"x").unwrap();
    refused(&sb, &sb.serve_root_args(&[]), &[], "no workspace binding");
    let left: Vec<_> = fs::read_dir(sb.root())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["leftover"], "the refused root is left as it was");
    fs::remove_file(sb.root().join("leftover")).unwrap();

    // Claim it for this workspace, then point another workspace at it.
    let server = marsh_tests::Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    drop(server);
    let other = tempfile::tempdir().unwrap();
    let mut args = sb.serve_root_args(&[]);
    args[2] = other.path().display().to_string();
    refused(&sb, &args, &[], "binds this root to workspace");
}

#[test]
fn corrupt_registry_fails_closed() {
    let sb = Sandbox::new();
    drop(marsh_tests::Server::start(
        &sb,
        &sb.serve_root_args(&[]),
        &[],
    ));
    fs::write(
        sb.root().join("scopes.json"),
        b"{\"version\": 1, \"default\": ",
    )
    .unwrap();
    refused(&sb, &sb.serve_root_args(&[]), &[], "scopes.json is corrupt");
}

#[test]
fn second_server_on_the_same_root_is_refused_by_the_lease() {
    let sb = Sandbox::new();
    let mut first = marsh_tests::Server::start(&sb, &sb.serve_root_args(&[]), &[]);
    let holder = format!("another marsh-mcp (pid {}) owns", first.pid());
    refused(&sb, &sb.serve_root_args(&[]), &[], &holder);
    // The first keeps serving.
    let status = first.ok("status", json!({}));
    assert_eq!(status["mode"], "managed");
    assert!(first.close().success());
    // Once it is gone the lease is free again.
    drop(marsh_tests::Server::start(
        &sb,
        &sb.serve_root_args(&[]),
        &[],
    ));
}

#[test]
fn legacy_mode_uses_marsh_home_and_creates_it_owner_only() {
    let sb = Sandbox::new();
    let home = sb.state().join("legacy-home");
    let args = vec![
        "serve".to_string(),
        "--workspace".into(),
        sb.workspace().display().to_string(),
        "--sbx".into(),
        sb.prefix.bin("sbx").display().to_string(),
    ];
    let home_s = home.display().to_string();
    let mut server = marsh_tests::Server::start(&sb, &args, &[("MARSH_HOME", &home_s)]);
    let status = server.ok("status", json!({}));
    assert_eq!(status["mode"], "legacy");
    let mode = fs::metadata(&home).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
}
