//! The response of every tool that starts an operation: wait (bounded) for its end,
//! then its head and its output from the start.

use std::sync::Arc;
use std::time::Duration;

use super::Call;
use super::args::MAX_BYTES;
use super::result_data::{OperationHead, OperationReport};
use super::views::{ViewOptions, output_view};
use crate::operations::Operation;

/// Waits up to `wait` (or until the request is cancelled, which cancels the
/// operation too; progress is notified meanwhile when the call asked for it), then
/// reports the operation with its output from the start.
pub(crate) async fn report(
    op: &Arc<Operation>,
    wait: Duration,
    call: Call<'_>,
    max_bytes: usize,
    opts: ViewOptions,
) -> OperationReport {
    let status = call.wait_for_end(op, wait).await;
    if call.request.is_cancelled() {
        op.request_cancel();
    }
    let head = OperationHead::of(op);
    let read = op.output().read_since(0, max_bytes);
    let complete =
        status.state.is_terminal() && status.output_drained && !read.capped && !read.evicted;
    let hint = if !status.state.is_terminal() {
        Some("still running: poll operation_get (wait_ms) and read operation_output from next_seq")
    } else if read.capped {
        Some("more output is retained: call operation_output with since_seq = next_seq")
    } else {
        None
    };
    OperationReport {
        head,
        output: output_view(&read, opts),
        output_complete: complete,
        hint,
    }
}

/// [`report`] for operations whose output is a progress log (lifecycle, workers,
/// qualification): the default byte budget, text views only.
pub(crate) async fn report_log(
    op: &Arc<Operation>,
    wait: Duration,
    call: Call<'_>,
) -> OperationReport {
    let opts = ViewOptions {
        include_base64: false,
    };
    report(op, wait, call, MAX_BYTES.default as usize, opts).await
}
