//! operation_list, operation_get, operation_output, operation_cancel.

use std::time::Duration;

use super::Call;
use super::args::{
    self, OperationCancelArgs, OperationGetArgs, OperationListArgs, OperationOutputArgs,
};
use super::result_data::{
    OperationCancelResult, OperationGetResult, OperationListEntry, OperationListResult,
    OperationOutputResult, OperationSummary, WaitResult,
};
use super::views::{ViewOptions, output_view, page};
use crate::context::ServerContext;
use crate::error::ToolError;

/// How long operation_cancel waits for the escalation to reap the child before
/// answering (SIGINT, SIGTERM and SIGKILL steps together take at most ~4.5 s).
const CANCEL_SETTLE: Duration = Duration::from_secs(6);

pub(crate) fn operation_list(
    ctx: &ServerContext,
    call: Call<'_>,
) -> Result<OperationListResult, ToolError> {
    let a: OperationListArgs = call.parse()?;
    let limit = args::OPERATIONS_LIMIT.check(a.limit)? as usize;
    let ops = ctx.ops.of_session(call.session);
    Ok(OperationListResult {
        live: ops
            .iter()
            .filter(|op| !op.status().state.is_terminal())
            .count(),
        more_available: ops.len() > limit,
        operations: ops
            .iter()
            .take(limit)
            .map(|op| OperationListEntry::of(op))
            .collect(),
    })
}

/// The ids of `session`'s live operations, for a `capacity_exhausted` refusal.
pub(crate) fn live_ids(ctx: &ServerContext, session: crate::operations::SessionId) -> Vec<String> {
    ctx.ops
        .of_session(session)
        .iter()
        .filter(|op| !op.status().state.is_terminal())
        .map(|op| format!("{} ({})", op.id, op.kind.as_str()))
        .collect()
}

pub(crate) async fn operation_get(
    ctx: &ServerContext,
    call: Call<'_>,
) -> Result<OperationGetResult, ToolError> {
    let a: OperationGetArgs = call.parse()?;
    let wait = args::OPERATION_WAIT.duration(a.wait_ms)?;
    let op = ctx.ops.get(&a.operation_id, call.session)?;
    let status = call.wait_for_end(&op, wait).await;
    Ok(OperationGetResult {
        summary: OperationSummary::of(&op),
        wait_result: if status.state.is_terminal() {
            WaitResult::Ended
        } else {
            WaitResult::DeadlineReached
        },
    })
}

pub(crate) async fn operation_output(
    ctx: &ServerContext,
    call: Call<'_>,
) -> Result<OperationOutputResult, ToolError> {
    let a: OperationOutputArgs = call.parse()?;
    let max_bytes = args::max_bytes(a.max_bytes)?;
    // `tail_lines: 0` (its default) means no tail: read forward.
    let tail_lines = args::TAIL_LINES.check(a.tail_lines)?;
    if tail_lines > 0 && a.since_seq.is_some() {
        return Err(ToolError::invalid(
            "since_seq and tail_lines are mutually exclusive",
        ));
    }
    let op = ctx.ops.get(&a.operation_id, call.session)?;
    let status = op.status();
    let since = a.since_seq.unwrap_or(0);
    let opts = ViewOptions {
        include_base64: a.include_base64.unwrap_or(false),
        max_bytes,
    };
    let output = output_view(opts, call.host_paths, |budget| {
        let out = op.output();
        page(if tail_lines > 0 {
            out.tail(tail_lines as usize, budget)
        } else {
            out.read_since(since, budget)
        })
    });
    let hint = if output.more_to_page {
        Some("more output is retained: call again with since_seq = next_seq")
    } else if output.output_truncated {
        Some(
            "part of the requested range exceeded retention and is gone; start_seq shows where the returned bytes begin",
        )
    } else if !status.state.is_terminal() {
        Some("still running: call again with since_seq = next_seq for new output")
    } else {
        None
    };
    Ok(OperationOutputResult {
        operation_id: op.id.to_string(),
        state: status.state,
        output_complete: status.state.is_terminal() && status.output_drained,
        output,
        hint,
    })
}

pub(crate) async fn operation_cancel(
    ctx: &ServerContext,
    call: Call<'_>,
) -> Result<OperationCancelResult, ToolError> {
    let a: OperationCancelArgs = call.parse()?;
    let op = ctx.ops.get(&a.operation_id, call.session)?;
    let requested = op.request_cancel();
    call.wait_for_end(&op, CANCEL_SETTLE).await;
    Ok(OperationCancelResult {
        summary: OperationSummary::of(&op),
        cancel_accepted: requested,
        note: if requested {
            "cancellation was requested; the outcome is cancellation_uncertain because signal delivery does not prove the sandbox work stopped"
        } else {
            "the operation had already ended (or was already being cancelled); nothing was signalled"
        },
    })
}
