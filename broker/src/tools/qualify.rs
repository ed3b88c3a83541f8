//! qualify: the one tool that runs a non-marsh host program, and only with
//! `--allow-full-sbx-control`: `/usr/bin/make <fixed target>` in the workspace.

use std::path::Path;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::args::{self, QualifyArgs};
use super::envelope::{ErrorKind, ToolError, ToolResult};
use super::launch;
use super::views::ViewOptions;
use crate::context::ServerContext;
use crate::operations::{OpKind, SessionId};

pub const MAKE: &str = "/usr/bin/make";

pub async fn qualify(
    ctx: &ServerContext,
    session: SessionId,
    raw: Option<Map<String, Value>>,
    request: &CancellationToken,
) -> ToolResult {
    let a: QualifyArgs = args::parse(raw)?;
    let timeout = args::timeout(a.timeout_ms, args::QUALIFY_TIMEOUT_DEFAULT_MS)?;
    let wait = args::wait(a.wait_ms, 0)?;
    if !ctx.allow_full_sbx_control {
        return Err(ToolError::new(
            ErrorKind::Disabled,
            "qualify is disabled: it runs repository recipes as the host user, and this server was not started with --allow-full-sbx-control",
        ));
    }
    let target = a.gate.make_target();
    let permit = ctx.cap.try_admit()?;
    let cmd = ctx.driver.host_command(Path::new(MAKE), &[target]);
    let op = launch::start(
        ctx,
        session,
        OpKind::Qualify,
        "host",
        timeout,
        cmd,
        (permit, Box::new(())),
    )?;
    let mut data = launch::report(
        &op,
        wait,
        request,
        args::MAX_BYTES_DEFAULT as usize,
        ViewOptions {
            include_base64: false,
        },
    )
    .await;
    if let Some(map) = data.as_object_mut() {
        map.insert(
            "gate".into(),
            serde_json::to_value(a.gate).unwrap_or(Value::Null),
        );
        map.insert("make_target".into(), Value::from(target));
    }
    Ok(data)
}
