//! The resident per-workspace broker: one process that owns the lease, the registry
//! and the global operation cap, and serves any number of authenticated sessions over
//! a Unix socket (HTTP/1.1 with an upgrade to newline-delimited MCP).

mod attachments;
mod control;
mod fingerprint;
mod http;
mod runtime_dir;
mod token;

pub(crate) use control::{
    broker_pid_of_root, broker_run, broker_start, broker_stop, connect, connect_start,
};
