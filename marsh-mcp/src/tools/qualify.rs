//! qualify: the one tool that runs a non-marsh host program, and only with
//! `--allow-full-sbx-control`: `/usr/bin/make <fixed target>` in the workspace.

use std::path::PathBuf;
use std::sync::Arc;

use super::Call;
use super::args::{self, QualifyArgs};
use super::operation_reply::report_log;
use super::result_data::QualifyResult;
use crate::context::ServerContext;
use crate::error::{ErrorKind, ToolError};
use crate::launch::{Plan, Step};
use crate::operations::OpKind;

pub(crate) const MAKE: &str = "/usr/bin/make";

pub(crate) async fn qualify(
    ctx: &Arc<ServerContext>,
    call: Call<'_>,
) -> Result<QualifyResult, ToolError> {
    let a: QualifyArgs = call.parse()?;
    let timeout = args::QUALIFY_TIMEOUT.duration(a.timeout_ms)?;
    let wait = args::QUALIFY_WAIT.duration(a.wait_ms)?;
    if !ctx.allow_full_sbx_control {
        return Err(ToolError::new(
            ErrorKind::Disabled,
            "qualify is disabled: it runs repository recipes as the host user, and this server was not started with --allow-full-sbx-control",
        ));
    }
    let target = a.gate.make_target();
    let ticket = ctx.admission().admit_host()?;
    let plan = Plan {
        kind: OpKind::Qualify,
        timeout,
        steps: vec![Step::Host {
            program: PathBuf::from(MAKE),
            args: vec![target.to_owned()],
        }],
    };
    let op = ticket.launch(ctx, call.session, plan, None)?;
    Ok(QualifyResult {
        report: report_log(&op, wait, call).await,
        gate: a.gate,
        make_target: target,
    })
}
