//! Stand-ins for `marsh`, `marshd` and `sbx` (the contract is README.md beside this
//! crate). The binaries in `src/bin/` only call the entry points re-exported here.

mod agent;
mod backend;
mod client;
mod config;
mod daemon;
mod error;
mod home;
mod inject;
mod invocation;
mod kits;
mod limits;
mod marshd;
mod proto;
mod publication;
mod receipt;
mod sandbox;
mod sbx;
mod seccomp;
mod seqpacket;
mod token;
mod util;
mod workers;

pub use client::main as marsh_main;
pub use error::Error;
pub use marshd::main as marshd_main;
pub use receipt::Receipt;
pub use sbx::main as sbx_main;
