//! Serving MCP sessions: the bounded line transport and the rmcp handler.

mod handler;
mod transport;

pub use handler::{McpSession, serve_session};
pub use transport::LineTransport;
