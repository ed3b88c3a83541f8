//! The black-box suites as one test binary: every module of `suite/` spawns the built
//! `marsh-mcp` (and the stand-ins) through the `marsh_tests` harness and speaks MCP.
//! A test `m::t` of `contract/CONTRACT.md` is `suite::m::t` here.
// A test failure is a panic: unwrap/expect with context is the intended way out.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
