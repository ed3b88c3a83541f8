//! MCP over newline-delimited streams, as every side of marsh-mcp frames it: the
//! bounded frame reader (1 MiB per line, an oversized line reported as a value rather
//! than ending the stream), the JSON-RPC error that answers an oversized frame with the
//! id found in its first bytes, and the process's own stdin/stdout as async streams.
//! The direct server, the resident broker's sessions, `export-serve` and the connect
//! proxy all use this one implementation, so the cap and its answer are the same on
//! every path.

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod oversized;
mod reader;
mod stdio;

pub use oversized::{oversized_error, oversized_reply, request_id_in_prefix, with_raw_id};
pub use reader::{Frame, FrameReader, MAX_FRAME_BYTES};
pub use stdio::{client_stdin, client_stdout};
