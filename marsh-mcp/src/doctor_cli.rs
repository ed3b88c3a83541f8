//! `marsh-mcp doctor ARGS`: the `doctor` tool's checks, run once from a terminal for
//! the configuration `serve ARGS` would use, printed for people.
//!
//! This is not an MCP mode: nothing speaks MCP on stdout here, so the report goes to
//! stdout (logs still go to stderr).
//!
//! Lease rule: in managed mode the checks need the root open, and opening takes the
//! root's exclusive lease (`startup::prepare` → `ManagedRoot::open`). A root leased by
//! a running `serve` or broker is never taken or waited for: doctor reports it (naming
//! the broker's pid when a broker of this root is running) and exits 1. Otherwise it
//! holds the lease only while its checks run; a server started in that moment is
//! refused like any second server and can simply be started again.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use marsh_scope_registry::RegistryError;
use serde_json::Value;
use tokio::runtime::Runtime;

use crate::broker::broker_pid_of_root;
use crate::cli::ServeArgs;
use crate::startup::{StartupError, validate};

/// One printed check.
struct Line {
    name: String,
    ok: bool,
    detail: String,
}

/// Runs the checks and prints them; `ExitCode::SUCCESS` only when healthy.
pub(crate) fn doctor(
    runtime: &Runtime,
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> anyhow::Result<ExitCode> {
    let report = checks(runtime, args, env).unwrap_or_else(|report| report);
    let healthy = report.lines.iter().all(|l| l.ok);
    print(&report, healthy)?;
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

struct Report {
    header: String,
    lines: Vec<Line>,
}

/// A report of one failed check that kept the others from running.
fn stopped(header: &str, name: &str, detail: String) -> Report {
    Report {
        header: format!("marsh-mcp doctor: {header}"),
        lines: vec![Line {
            name: name.into(),
            ok: false,
            detail,
        }],
    }
}

/// The checks' report, or (as the error) the report of what stopped them.
fn checks(
    runtime: &Runtime,
    args: &ServeArgs,
    env: &[(OsString, OsString)],
) -> Result<Report, Report> {
    let startup =
        |e: &dyn std::fmt::Display| stopped("the server would not start", "startup", e.to_string());
    let validated = validate(args, env).map_err(|e| startup(&e))?;
    let root = validated.root().map(std::path::Path::to_path_buf);
    let ctx = validated.open().map_err(|e| match (&e, &root) {
        (StartupError::Registry(inner), Some(root))
            if matches!(**inner, RegistryError::Leased { .. }) =>
        {
            let holder = match broker_pid_of_root(root, env) {
                Some(pid) => format!("the resident broker (pid {pid})"),
                None => "a running marsh-mcp (serve or broker)".into(),
            };
            stopped(
                "not checked, the root is in use",
                "lease",
                format!(
                    "the scope root {} is leased by {holder}; doctor leaves it alone. Ask that server (its `doctor` tool), or stop it and run doctor again",
                    root.display()
                ),
            )
        }
        _ => startup(&e),
    })?;
    let data = runtime
        .block_on(crate::tools::doctor::doctor(&ctx))
        .map_err(|e| stopped("the checks failed", "doctor", e.to_string()))?;
    // Rendered from the JSON the tool answers, so the CLI and the tool cannot differ.
    let data = serde_json::to_value(&data).unwrap_or(Value::Null);
    Ok(render(&ctx.workspace, &data))
}

fn render(workspace: &std::path::Path, data: &Value) -> Report {
    let text = |key: &str| data[key].as_str().unwrap_or("?").to_owned();
    let header = format!(
        "marsh-mcp doctor {}: {} for {} ({} mode, default scope {}{})",
        text("version"),
        text("server_name"),
        workspace.display(),
        text("mode"),
        text("default_scope_state"),
        if data["full_sbx_control"] == true {
            ", full sbx control"
        } else {
            ""
        },
    );
    let lines = data["checks"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|c| Line {
            name: c["name"].as_str().unwrap_or("?").to_owned(),
            ok: c["ok"] == true,
            detail: c["detail"].as_str().unwrap_or_default().to_owned(),
        })
        .collect();
    Report { header, lines }
}

fn print(report: &Report, healthy: bool) -> std::io::Result<()> {
    // Explicitly stdout: doctor is a terminal command, not an MCP mode (see the module
    // comment), so the crate's `print_stdout` rule (stdout belongs to MCP) does not apply.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", report.header)?;
    for line in &report.lines {
        let mark = if line.ok { "ok  " } else { "FAIL" };
        writeln!(out, "  {mark}  {}: {}", line.name, line.detail)?;
    }
    let failed = report.lines.iter().filter(|l| !l.ok).count();
    if healthy {
        writeln!(out, "healthy: all {} checks passed", report.lines.len())?;
    } else {
        writeln!(
            out,
            "unhealthy: {failed} of {} checks failed",
            report.lines.len()
        )?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_every_check_with_its_verdict() {
        let data = json!({
            "version": "1.2.3", "server_name": "marsh-dev-abc", "mode": "managed",
            "default_scope_state": "ready", "full_sbx_control": false,
            "checks": [
                {"name": "pinned_sbx", "ok": true, "detail": "identity unchanged"},
                {"name": "isolation", "ok": false, "detail": "no bwrap; fix: install it"},
            ],
        });
        let report = render(std::path::Path::new("/w"), &data);
        assert_eq!(
            report.header,
            "marsh-mcp doctor 1.2.3: marsh-dev-abc for /w (managed mode, default scope ready)"
        );
        let verdicts: Vec<(&str, bool)> = report
            .lines
            .iter()
            .map(|l| (l.name.as_str(), l.ok))
            .collect();
        assert_eq!(verdicts, [("pinned_sbx", true), ("isolation", false)]);
    }
}
