//! doctor: the server's own health, limits and configuration, without host paths.

use serde_json::{Value, json};

use super::envelope::ToolResult;
use crate::admission::GLOBAL_OPERATION_CAP;
use crate::context::{READ_QUERY_CAP, ServerContext};
use crate::marsh::Verb;
use crate::operations::{GLOBAL_RETAINED_BYTES, RETAINED_OPERATIONS};
use crate::output::RETAINED_PER_STREAM;
use crate::server::frames::MAX_FRAME_BYTES;

fn check(name: &str, ok: bool, detail: impl Into<String>) -> Value {
    json!({"name": name, "ok": ok, "detail": detail.into()})
}

pub async fn doctor(ctx: &ServerContext) -> ToolResult {
    let mut checks = Vec::new();
    for pin in ctx.driver.pins() {
        let name = format!("pinned_{}", pin.role());
        checks.push(match pin.revalidate() {
            Ok(()) => check(
                &name,
                true,
                format!("identity unchanged; sha256 {}", pin.sha256_hex()),
            ),
            Err(e) => check(&name, false, e.to_string()),
        });
    }
    let home = ctx.scope.verified_home();
    checks.push(match &home {
        Ok(_) => check(
            "scope_home",
            true,
            "owner-only and identical to the startup identity",
        ),
        Err(e) => check("scope_home", false, e.message.clone()),
    });
    let isolation = match home {
        Ok(home) if ctx.scope.state() == marsh_scope_registry::ScopeState::Ready => {
            match ctx.driver.query_json(Verb::Status, home).await {
                Ok(status) => {
                    let iso = status
                        .pointer("/shell/isolation")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    match iso.as_deref() {
                        Some("bwrap") => {
                            check("isolation", true, "project shell runs under bubblewrap")
                        }
                        Some(other) => check(
                            "isolation",
                            false,
                            format!("project shell isolation is {other}"),
                        ),
                        None => check(
                            "isolation",
                            true,
                            "project shell not booted yet; isolation is checked at boot",
                        ),
                    }
                }
                Err(e) => check("isolation", false, e.message),
            }
        }
        _ => check("isolation", false, "scope not ready; runtime not probed"),
    };
    checks.push(isolation);
    let (live, retained) = ctx.ops.counts();
    let healthy = checks.iter().all(|c| c["ok"] == true);
    Ok(json!({
        "healthy": healthy,
        "version": env!("CARGO_PKG_VERSION"),
        "server_name": ctx.server_name(),
        "workspace_hash": ctx.workspace_hash,
        "mode": ctx.scope.mode(),
        "scope_state": ctx.scope.state().as_str(),
        "full_sbx_control": ctx.allow_full_sbx_control,
        "checks": checks,
        "child_environment": ctx.driver.env().names(true),
        "operations": {"live": live, "retained": retained, "retained_output_bytes": ctx.ops.retained_bytes()},
        "limits": {
            "global_operation_cap": GLOBAL_OPERATION_CAP,
            "operation_slots_free": ctx.cap.available(),
            "concurrent_reads": READ_QUERY_CAP,
            "retained_operations": RETAINED_OPERATIONS,
            "retained_output_bytes_per_stream": RETAINED_PER_STREAM,
            "retained_output_bytes_global": GLOBAL_RETAINED_BYTES,
            "frame_bytes": MAX_FRAME_BYTES,
        },
    }))
}
