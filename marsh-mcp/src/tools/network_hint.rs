//! The `hint` of a command that failed for want of a network it does not have.
//!
//! Under loopback-only networking a download fails with a message that reads like a
//! flaky network (`Temporary failure in name resolution`, cargo's "spurious network
//! error"), and an agent retries. When a run exits non-zero and the end of its stderr
//! names a name-resolution or connection failure, the scope's marsh is asked for its
//! network policy (one `status`, only on such failures); under loopback only the reply
//! says that the sandbox has no network and how a person enables it.
//!
//! Invariant: the hint is given only when marsh reports `loopback` for that scope;
//! a host-network scope, an unknown policy or a failed query gives none.

use super::work_in_scope::read_permit;
use crate::context::ServerContext;
use crate::marsh::Verb;
use crate::operations::{OpState, Operation};
use crate::scopes::ScopeView;
use crate::shell_facts::{Network, ShellFacts};

pub(crate) const NO_NETWORK: &str = "this sandbox has no network (loopback only), so name resolution and outside connections fail; retrying will not help. Work offline (vendored or cached dependencies), or ask a person to enable it: \"network\": \"host\" in the scope's backend.json (or the scope root's, for every scope), then scope_stop and scope_reset";

/// Lowercase phrases of resolvers, curl, git, cargo, pip, npm and Go that mean no
/// name could be resolved or no route leads out. Deliberately absent: a refused or
/// failed connection as such (`could not connect to server`, `failed to establish a
/// new connection`), which is also what a test meets when its own local service is
/// down, and rustc's `failed to resolve: use of undeclared crate` (E0433).
const PHRASES: [&str; 12] = [
    "temporary failure in name resolution",
    "name or service not known",
    "could not resolve host",
    "couldn't resolve host",
    "failed to lookup address",
    "no address associated with hostname",
    "getaddrinfo",
    "eai_again",
    "enotfound",
    "network is unreachable",
    "spurious network error",
    "no such host",
];

/// How much of the end of stderr is searched.
const SEARCHED_BYTES: usize = 8 * 1024;

/// Whether `op` exited non-zero with a network failure at the end of its stderr.
pub(crate) fn looks_like_no_network(op: &Operation) -> bool {
    if op.status().state != OpState::Exited {
        return false;
    }
    let tail = op.output().tail(40, SEARCHED_BYTES);
    names_a_network_failure(&tail.stderr)
}

fn names_a_network_failure(stderr: &[u8]) -> bool {
    let text = String::from_utf8_lossy(stderr).to_lowercase();
    PHRASES.iter().any(|p| text.contains(p))
}

/// The hint for a run of `view` that [`looks_like_no_network`], if its network is
/// loopback only.
pub(crate) async fn for_scope(ctx: &ServerContext, view: &ScopeView) -> Option<&'static str> {
    let home = ctx.scopes.verified_home(view).ok()?;
    let _permit = read_permit(ctx).ok()?;
    let status = ctx.driver.query_json(&Verb::Status, &home).await.ok()?;
    let facts = ShellFacts::from_backend(status.get("backend"));
    (facts.network == Network::Loopback).then_some(NO_NETWORK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolver_and_tool_messages_are_recognised_and_others_are_not() {
        for stderr in [
            "curl: (6) Could not resolve host: example.com",
            "warning: spurious network error (3 tries remaining): [6] Couldn't resolve host name",
            "ping: example.com: Temporary failure in name resolution",
            "npm ERR! code ENOTFOUND",
            "dial tcp: lookup proxy.golang.org: no such host",
        ] {
            assert!(names_a_network_failure(stderr.as_bytes()), "{stderr}");
        }
        for stderr in [
            "error[E0425]: cannot find value",
            "error[E0433]: failed to resolve: use of undeclared crate or module `serde`",
            "curl: (7) Failed to connect to localhost port 8080 after 0 ms: Couldn't connect to server",
            "urllib3.exceptions.NewConnectionError: Failed to establish a new connection: [Errno 111] Connection refused",
            "make: *** [test] Error 1",
            "",
        ] {
            assert!(!names_a_network_failure(stderr.as_bytes()), "{stderr}");
        }
    }
}
