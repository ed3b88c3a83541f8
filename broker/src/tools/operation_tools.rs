//! operation_get, operation_output, operation_cancel.

use std::time::Duration;

use serde_json::{Map, Value};

use super::args::{self, OperationCancelArgs, OperationGetArgs, OperationOutputArgs};
use super::views::{ViewOptions, read_fields};
use super::{Call, object};
use crate::context::ServerContext;
use crate::error::{ToolError, ToolResult};

/// How long operation_cancel waits for the escalation to reap the child before
/// answering (SIGINT, SIGTERM and SIGKILL steps together take at most ~4.5 s).
const CANCEL_SETTLE: Duration = Duration::from_secs(6);

pub(crate) async fn operation_get(ctx: &ServerContext, call: Call<'_>) -> ToolResult {
    let a: OperationGetArgs = call.parse()?;
    let wait = args::OPERATION_WAIT.duration(a.wait_ms)?;
    let op = ctx.ops.get(&a.operation_id, call.session)?;
    let status = call.wait_for_end(&op, wait).await;
    let mut data = object(op.describe());
    data.insert(
        "wait_result".into(),
        Value::from(if status.state.is_terminal() {
            "ended"
        } else {
            "deadline_reached"
        }),
    );
    data.insert("output_drained".into(), Value::from(status.output_drained));
    Ok(Value::Object(data))
}

pub(crate) async fn operation_output(ctx: &ServerContext, call: Call<'_>) -> ToolResult {
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
    let read = if tail_lines > 0 {
        op.output().tail(tail_lines as usize, max_bytes)
    } else {
        op.output().read_since(a.since_seq.unwrap_or(0), max_bytes)
    };
    let opts = ViewOptions {
        include_base64: a.include_base64.unwrap_or(false),
    };
    let mut data = Map::new();
    data.insert("operation_id".into(), Value::from(op.id.to_string()));
    data.insert(
        "state".into(),
        serde_json::to_value(status.state).unwrap_or(Value::Null),
    );
    data.extend(read_fields(&read, opts));
    data.insert(
        "output_complete".into(),
        Value::from(
            status.state.is_terminal()
                && status.output_drained
                && !read.capped
                && !read.evicted
                && tail_lines == 0,
        ),
    );
    if read.capped {
        data.insert(
            "hint".into(),
            Value::from("more output is retained: call again with since_seq = next_seq"),
        );
    } else if read.evicted {
        data.insert("hint".into(), Value::from("part of the requested range exceeded retention and is gone; start_seq shows where the returned bytes begin"));
    }
    Ok(Value::Object(data))
}

pub(crate) async fn operation_cancel(ctx: &ServerContext, call: Call<'_>) -> ToolResult {
    let a: OperationCancelArgs = call.parse()?;
    let op = ctx.ops.get(&a.operation_id, call.session)?;
    let requested = op.request_cancel();
    call.wait_for_end(&op, CANCEL_SETTLE).await;
    let mut data = object(op.describe());
    data.insert("cancel_accepted".into(), Value::from(requested));
    data.insert(
        "note".into(),
        Value::from(if requested {
            "cancellation was requested; the outcome is cancellation_uncertain because signal delivery does not prove the sandbox work stopped"
        } else {
            "the operation had already ended (or was already being cancelled); nothing was signalled"
        }),
    );
    Ok(Value::Object(data))
}
