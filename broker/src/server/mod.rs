//! Serving MCP sessions: the bounded line transport and the rmcp handler.

pub mod frames;
mod handler;
mod transport;

pub use handler::{McpSession, serve_session};
pub use transport::LineTransport;
