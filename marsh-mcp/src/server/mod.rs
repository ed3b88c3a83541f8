//! Serving MCP sessions: the bounded line transport and the rmcp handler.

mod backlog;
mod duplicate_keys;
mod handler;
mod refusal;
mod request_ids;
mod transport;

pub(crate) use handler::{accept_initialize, call_token, run_handler, serve_session};
pub(crate) use refusal::refuse_first_request;

#[cfg(test)]
mod session_tests;
