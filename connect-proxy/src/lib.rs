//! The client side of the marsh-mcp broker: the authenticated HTTP-over-Unix-socket
//! handshake (probe, stop, session upgrade) and the bounded line relay that turns one
//! stdio MCP client into one broker session. It never parses MCP (only the `id` of a
//! frame too large to relay, to answer it), so any protocol version passes through
//! unchanged.

mod client;
mod frames;
mod relay;
mod stdio;

pub use client::{
    BrokerClient, ClientError, PROBE_PATH, SESSION_PATH, STOP_PATH, UPGRADE_PROTOCOL,
};
pub use frames::{Frame, FrameReader, MAX_FRAME_BYTES};
pub use relay::{RelayEnd, oversized_error, oversized_reply, relay, request_id_in_prefix};
pub use stdio::{client_stdin, client_stdout};
