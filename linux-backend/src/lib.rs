//! The Linux backend: stand-ins for `marsh` and `marshd` (their contract is
//! docs/linux-backend.md), whose project shell runs every command in a bubblewrap
//! sandbox. The binaries in `src/bin/` only call the entry points re-exported here.

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod admission;
mod agent;
mod backend;
mod client;
mod config;
mod daemon;
mod error;
mod home;
mod inject;
#[cfg(feature = "test-hooks")]
mod invocation;
mod job_shell;
mod kits;
mod limits;
mod marshd;
mod proto;
mod publication;
mod receipt;
mod receipt_blanks;
mod sandbox;
mod seccomp;
mod seqpacket;
mod setid_guard;
mod token;
mod util;
mod workers;

pub use client::main as marsh_main;
pub use error::Error;
pub use marshd::main as marshd_main;
pub use receipt::Receipt;
