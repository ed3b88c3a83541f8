//! The `marsh.published_tool/v1` declaration format that `export-serve` serves and the
//! installers bind a client registration to: reading and validating a declaration, the
//! stock SBX server name of a tool, and the `export-serve` arguments a registration pins.

// `make lint` fails on a dependency the library does not use (test builds add dev-dependencies).
#![cfg_attr(not(test), deny(unused_crate_dependencies))]

mod declaration;
mod name;

pub use declaration::{
    Action, ArgBinding, DEFAULT_STDIN_BYTES, Declaration, DeclarationError, Expectation, Field,
    FieldKind, Loaded, MAX_STDIN_BYTES, MAX_STRING_BYTES, StdinBinding, export_serve_args, load,
    valid_generation,
};
pub use name::{PublisherKey, legacy_server_for, valid_tool_name};
