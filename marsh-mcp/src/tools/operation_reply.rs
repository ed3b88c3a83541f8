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
    opts: ViewOptions,
) -> OperationReport {
    let status = call.wait_for_end(op, wait).await;
    if call.request.is_cancelled() {
        op.request_cancel();
    }
    let head = OperationHead::of(op);
    let output = output_view(opts, call.host_paths, |budget| op.output().window(budget));
    let hint = if !status.state.is_terminal() {
        Some(
            "still running: poll operation_get (wait_ms), read new output with operation_output from next_seq, or the last lines with tail_lines",
        )
    } else if output.tail.is_some() {
        Some(
            "the middle of the output is left out (tail.omitted_bytes): operation_output with since_seq = next_seq pages through it; tail_lines reads the last lines",
        )
    } else if output.more_to_page {
        Some(
            "more output is retained: operation_output with since_seq = next_seq pages on; tail_lines reads the last lines",
        )
    } else {
        None
    };
    OperationReport { head, output, hint }
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
        max_bytes: MAX_BYTES.default as usize,
    };
    report(op, wait, call, opts).await
}
