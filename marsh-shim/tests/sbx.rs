//! Black-box tests of the `sbx` stand-in.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

const SBX: &str = env!("CARGO_BIN_EXE_sbx");

fn sbx(dir: &std::path::Path, extra: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    Command::new(SBX)
        .env_clear()
        .env("HOME", dir)
        .envs(extra.iter().copied())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn version() {
    let dir = tempfile::tempdir().unwrap();
    let out = sbx(dir.path(), &[], &["version"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("sbx version ") && text.trim_end().ends_with("(marsh-shim)"),
        "{text}"
    );
}

#[test]
fn ls_reads_the_state_file_locations() {
    let dir = tempfile::tempdir().unwrap();
    let ls = |extra: &[(&str, &str)]| {
        let out = sbx(dir.path(), extra, &["ls", "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert_eq!(ls(&[]), serde_json::json!({"sandboxes": []}));

    let default = dir.path().join(".local/state/sbx-shim/state.json");
    std::fs::create_dir_all(default.parent().unwrap()).unwrap();
    std::fs::write(&default, r#"{"sandboxes":[{"name":"dev"}]}"#).unwrap();
    assert_eq!(ls(&[]), serde_json::json!({"sandboxes": [{"name": "dev"}]}));

    let xdg = dir.path().join("xdg");
    std::fs::create_dir_all(xdg.join("sbx-shim")).unwrap();
    std::fs::write(
        xdg.join("sbx-shim/state.json"),
        r#"{"sandboxes":[{"name":"x"}]}"#,
    )
    .unwrap();
    let xdg_s = xdg.to_str().unwrap();
    assert_eq!(
        ls(&[("XDG_STATE_HOME", xdg_s)]),
        serde_json::json!({"sandboxes": [{"name": "x"}]})
    );

    let explicit = dir.path().join("explicit.json");
    std::fs::write(&explicit, r#"{"sandboxes":[{"name":"e"}]}"#).unwrap();
    let explicit_s = explicit.to_str().unwrap();
    assert_eq!(
        ls(&[("XDG_STATE_HOME", xdg_s), ("SBX_SHIM_STATE", explicit_s)]),
        serde_json::json!({"sandboxes": [{"name": "e"}]})
    );

    let out = sbx(dir.path(), &[], &["bogus"]);
    assert_eq!(out.status.code(), Some(2));
}
