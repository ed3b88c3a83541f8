//! doctor: the server's own health, limits and configuration, without host paths.

use serde_json::Value;

use super::result_data::{Check, DoctorReport, DoctorScopes, Limits, OperationCounts, ScopeCounts};

use crate::context::{READ_QUERY_CAP, ServerContext};
use crate::error::ToolError;
use crate::global_cap::GLOBAL_OPERATION_CAP;
use crate::marsh::Verb;
use crate::operations::{GLOBAL_RETAINED_BYTES, RETAINED_OPERATIONS};
use crate::output::RETAINED_PER_STREAM;
use crate::shell_facts::ShellFacts;
use marsh_framing::MAX_FRAME_BYTES;
use marsh_scope_registry::{ScopeId, ScopeState};

fn check(name: &str, ok: bool, detail: impl Into<String>) -> Check {
    Check {
        name: name.to_owned(),
        ok,
        detail: detail.into(),
    }
}

/// The `isolation` check from `status.backend`, which marsh reports before any job is
/// tried (no daemon needed): healthy only under bubblewrap, naming the network and
/// the limits in force; otherwise the problem and its fix.
fn backend_check(backend: Option<&Value>) -> Check {
    let Some(backend) = backend else {
        return check(
            "isolation",
            false,
            "marsh status does not report its backend",
        );
    };
    let text = |pointer: &str| backend.pointer(pointer).and_then(Value::as_str);
    let number = |pointer: &str| backend.pointer(pointer).and_then(Value::as_u64);
    if backend.get("healthy").and_then(Value::as_bool) != Some(true) {
        return check(
            "isolation",
            false,
            format!(
                "{}; fix: {}",
                text("/problem").unwrap_or("the backend cannot run jobs"),
                text("/fix").unwrap_or("see docs/linux-backend.md")
            ),
        );
    }
    let network = text("/network").unwrap_or("unknown");
    let limits = format!(
        "limits by {}: {} processes, {} MiB{}",
        text("/limits/mechanism").unwrap_or("unknown"),
        number("/limits/pids_max").map_or("?".into(), |n| n.to_string()),
        number("/limits/memory_max_bytes").map_or("?".into(), |n| (n >> 20).to_string()),
        number("/limits/ceiling_bytes").map_or(String::new(), |n| format!(
            " (all scopes together at most {} MiB)",
            n >> 20
        )),
    );
    if backend.pointer("/limits/enforced").and_then(Value::as_bool) == Some(false) {
        return check(
            "isolation",
            false,
            format!(
                "{limits} do not bound processes for a root server; fix: give the server a writable cgroup (v2 with the pids controller, or v1 pids)"
            ),
        );
    }
    let guard = text("/setid_guard").unwrap_or("off: not reported (an older marsh)");
    match text("/isolation") {
        // A root server's jobs own every root file in the workspace: without the guard
        // a host-placed set-id file could be rewritten into a root shell.
        Some("bwrap") if guard != "on" && nix::unistd::geteuid().is_root() => check(
            "isolation",
            false,
            format!(
                "set-id guard {guard}: jobs of a root server could rewrite a set-id file the host puts in the workspace; fix: run on a kernel with fanotify permission events (CONFIG_FANOTIFY_ACCESS_PERMISSIONS) and CAP_SYS_ADMIN"
            ),
        ),
        Some("bwrap") => check(
            "isolation",
            true,
            format!(
                "jobs run under bubblewrap; network {network}; {limits}; set-id guard {guard}; {}",
                etc_policy(backend)
            ),
        ),
        Some(other) => check(
            "isolation",
            false,
            format!("jobs run {other} (the explicit opt-in); network {network}; {limits}"),
        ),
        None => check("isolation", false, "marsh status names no isolation"),
    }
}

/// The `project_shell` check: what a job meets (shell, network, HOME, exposed host
/// directories), and whether settings changed since the shell booted, which only a
/// stop and reset applies.
fn shell_check(backend: Option<&Value>) -> Check {
    let Some(backend) = backend else {
        return check(
            "project_shell",
            false,
            "marsh status does not report its backend",
        );
    };
    let facts = ShellFacts::from_backend(Some(backend)).sentence();
    let exposed = backend
        .get("exposed")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let detail = format!(
        "{facts} $HOME is kept per scope; {exposed} host director{} exposed read-only by a person's settings.",
        if exposed == 1 { "y" } else { "ies" }
    );
    if backend.get("settings_changed").and_then(Value::as_bool) == Some(true) {
        return check(
            "project_shell",
            false,
            format!(
                "{detail} The settings files changed since this shell booted and apply at its next boot: scope_stop, then scope_reset (scope_id default)."
            ),
        );
    }
    check("project_shell", true, detail)
}

/// How a job's `/etc` is built, from `status.backend.etc_shown`.
fn etc_policy(backend: &Value) -> String {
    match backend.get("etc_shown").and_then(Value::as_array) {
        Some(names) => {
            let names: Vec<&str> = names.iter().filter_map(Value::as_str).collect();
            format!(
                "/etc shows only an allowlist of public names ({} here: {}); any other name, a secret replaced by rename or created later included, is never visible",
                names.len(),
                names.join(", ")
            )
        }
        None => "/etc policy not reported (an older marsh)".into(),
    }
}

pub(crate) async fn doctor(ctx: &ServerContext) -> Result<DoctorReport, ToolError> {
    let mut checks = Vec::new();
    for pin in ctx.driver.pins() {
        let name = format!("pinned_{}", pin.role());
        checks.push(match pin.revalidate().and_then(|()| pin.sha256_hex()) {
            Ok(sha256) => check(&name, true, format!("identity unchanged; sha256 {sha256}")),
            Err(e) => check(&name, false, e.to_string()),
        });
    }
    checks.push(match ctx.scopes.root_in_place() {
        Ok(()) => check(
            "scope_root",
            true,
            if ctx.scopes.is_managed() {
                "the development root and its ancestors are the ones claimed at startup"
            } else {
                "legacy mode: no development root"
            },
        ),
        Err(e) => check("scope_root", false, e.message),
    });
    let default = ctx.scopes.view(ScopeId::Default)?;
    let home = ctx.scopes.verified_home(&default);
    checks.push(match &home {
        Ok(_) => check(
            "default_scope_home",
            true,
            "owner-only and identical to the recorded identity",
        ),
        Err(e) => check("default_scope_home", false, e.message.clone()),
    });
    let (isolation, shell) = match home {
        Ok(home) if default.state() == ScopeState::Ready => {
            match ctx.driver.query_json(&Verb::Status, &home).await {
                Ok(status) => (
                    backend_check(status.get("backend")),
                    shell_check(status.get("backend")),
                ),
                Err(e) => (
                    check("isolation", false, e.message.clone()),
                    check("project_shell", false, e.message),
                ),
            }
        }
        _ => {
            let why = "default scope not ready; runtime not probed";
            (
                check("isolation", false, why),
                check("project_shell", false, why),
            )
        }
    };
    checks.push(isolation);
    checks.push(shell);
    let scopes = ctx.scopes.list();
    let invalid: Vec<String> = scopes
        .iter()
        .filter(|v| v.identity_invalid())
        .map(|v| v.id.to_string())
        .collect();
    checks.push(check(
        "scope_identities",
        invalid.is_empty(),
        if invalid.is_empty() {
            "every recorded scope home matches its identity".to_string()
        } else {
            format!(
                "identity-invalid scopes (operator action needed): {}",
                invalid.join(", ")
            )
        },
    ));
    let (live_scopes, retained_scopes, invalid_keys) = ctx.scopes.counts();
    checks.push(check(
        "registry_keys",
        invalid_keys == 0,
        if invalid_keys == 0 {
            "every registry entry has a valid scope id".to_string()
        } else {
            format!("{invalid_keys} registry entries under invalid keys are preserved and hidden; inspect scopes.json")
        },
    ));
    let (live, retained) = ctx.ops.counts();
    let healthy = checks.iter().all(|c| c.ok);
    Ok(DoctorReport {
        healthy,
        version: env!("CARGO_PKG_VERSION"),
        server_name: ctx.server_name(),
        workspace_hash: ctx.workspace_hash.clone(),
        mode: ctx.scopes.mode(),
        default_scope_state: default.state().as_str(),
        scopes: DoctorScopes {
            counts: ScopeCounts {
                live_generated: live_scopes,
                retained_generated: retained_scopes,
            },
            listed: scopes.len(),
        },
        full_sbx_control: ctx.allow_full_sbx_control,
        checks,
        child_environment: ctx.driver.env().names(true),
        operations: OperationCounts {
            live,
            retained,
            retained_output_bytes: ctx.ops.retained_bytes(),
        },
        limits: Limits {
            global_operation_cap: GLOBAL_OPERATION_CAP,
            operation_slots_free: ctx.cap.available(),
            concurrent_reads: READ_QUERY_CAP,
            retained_operations: RETAINED_OPERATIONS,
            retained_output_bytes_per_stream: RETAINED_PER_STREAM,
            retained_output_bytes_global: GLOBAL_RETAINED_BYTES,
            frame_bytes: MAX_FRAME_BYTES,
        },
    })
}
