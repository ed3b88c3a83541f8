//! Serving MCP sessions: the bounded line transport and the rmcp handler.

pub mod frames;
mod handler;
mod transport;

pub use handler::{serve_session, McpSession};
pub use transport::LineTransport;
