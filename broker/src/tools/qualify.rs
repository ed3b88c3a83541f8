//! qualify: the one tool that runs a non-marsh host program, and only with
//! `--allow-full-sbx-control`: `/usr/bin/make <fixed target>` in the workspace.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::args::{self, QualifyArgs};
use super::envelope::{ErrorKind, ToolError, ToolResult};
use super::launch::{self, Plan, Step};
use super::views::ViewOptions;
use crate::context::ServerContext;
use crate::operations::{OpKind, SessionId};

pub const MAKE: &str = "/usr/bin/make";

pub async fn qualify(
    ctx: &Arc<ServerContext>,
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
    let plan = Plan {
        kind: OpKind::Qualify,
        scope: "host".into(),
        home: ctx.workspace.clone(),
        timeout,
        steps: vec![Step::Host {
            program: PathBuf::from(MAKE),
            args: vec![target.to_owned()],
        }],
    };
    let op = launch::start(ctx, session, plan, (Some(permit), Box::new(())), None)?;
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
