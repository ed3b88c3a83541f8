//! Serving MCP sessions: the bounded line transport and the rmcp handler.

mod handler;
mod transport;

pub(crate) use handler::{accept_initialize, run_handler, serve_session};

#[cfg(test)]
mod session_tests;
