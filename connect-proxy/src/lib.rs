//! The client side of the marsh-mcp broker: the authenticated HTTP-over-Unix-socket
//! handshake (probe, stop, session upgrade) and the bounded line relay that turns one
//! stdio MCP client into one broker session. It never parses MCP (only the `id` of a
//! frame too large to relay, to answer it), so any protocol version passes through
//! unchanged.

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod client;
mod relay;

pub use client::{
    BrokerClient, ClientError, PROBE_PATH, SESSION_PATH, STOP_PATH, UPGRADE_PROTOCOL,
};
pub use relay::{RelayEnd, relay};
