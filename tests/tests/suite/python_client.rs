//! The real PyPI `mcp` client (installed by `make py-client` into target/py-venv)
//! connects, lists the tools and calls shell_run end to end.

use marsh_tests::{Sandbox, python_client_summary};

#[test]
fn pypi_mcp_client_lists_and_calls_tools() {
    let sb = Sandbox::new();
    let summary = python_client_summary(&sb, "smoke.py");
    assert_eq!(summary["server"], "marsh-mcp");
    assert_eq!(summary["tools"].as_array().unwrap().len(), 23);
    assert_eq!(
        summary["run"]["data"]["stdout_text"],
        "from-python-client\n"
    );
    assert_eq!(summary["bad_is_error"], true);
    assert_eq!(summary["bad"]["error"]["kind"], "invalid_argument");
}
