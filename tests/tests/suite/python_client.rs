//! The real PyPI `mcp` client (installed by `make py-client` into target/py-venv)
//! connects, lists the tools and calls shell_run end to end.

use std::process::Command;

use marsh_tests::{Sandbox, target_dir};
use serde_json::Value;

#[test]
fn pypi_mcp_client_lists_and_calls_tools() {
    let python = target_dir().parent().unwrap().join("py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make py-client` (done by `make test`)",
        python.display()
    );
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/smoke.py");
    let sb = Sandbox::new();
    let out = Command::new(python)
        .arg(script)
        .arg(sb.prefix.bin("marsh-mcp"))
        .args(sb.serve_home_args(&[]))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", sb.state().join("user"))
        .current_dir(sb.workspace())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["server"], "marsh-mcp");
    assert_eq!(summary["tools"].as_array().unwrap().len(), 22);
    assert_eq!(
        summary["run"]["data"]["stdout_text"],
        "from-python-client\n"
    );
    assert_eq!(summary["bad_is_error"], true);
    assert_eq!(summary["bad"]["error"]["kind"], "invalid_argument");
}
