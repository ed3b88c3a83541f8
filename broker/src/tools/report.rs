//! The response of every tool that starts an operation: wait (bounded) for its end,
//! then its summary and its output from the start.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use super::args::MAX_BYTES;
use super::views::{ViewOptions, read_fields};
use super::{Call, object};
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
) -> Value {
    let status = call.wait_for_end(op, wait).await;
    if call.request.is_cancelled() {
        op.request_cancel();
    }
    let mut data = object(op.describe());
    let read = op.output().read_since(0, max_bytes);
    let complete =
        status.state.is_terminal() && status.output_drained && !read.capped && !read.evicted;
    data.extend(read_fields(&read, opts));
    data.insert("output_complete".into(), Value::from(complete));
    if !status.state.is_terminal() {
        data.insert(
            "hint".into(),
            Value::from("still running: poll operation_get (wait_ms) and read operation_output from next_seq"),
        );
    } else if read.capped {
        data.insert(
            "hint".into(),
            Value::from("more output is retained: call operation_output with since_seq = next_seq"),
        );
    }
    Value::Object(data)
}

/// [`report`] as fields to extend, for operations whose output is a progress log
/// (lifecycle, workers, qualification): the default byte budget, text views only.
pub(crate) async fn report_fields(
    op: &Arc<Operation>,
    wait: Duration,
    call: Call<'_>,
) -> Map<String, Value> {
    let opts = ViewOptions {
        include_base64: false,
    };
    object(report(op, wait, call, MAX_BYTES.default as usize, opts).await)
}
