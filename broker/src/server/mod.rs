//! Serving MCP sessions: the bounded line transport and the rmcp handler.

mod handler;
mod transport;

pub(crate) use handler::serve_session;

#[cfg(test)]
mod session_tests;
