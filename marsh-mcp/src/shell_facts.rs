//! What an agent must know about the project shell before its first command, read
//! from `marsh status` of the default scope (`status.backend`): which shell runs
//! commands and what network jobs have. The server's instructions and the run tools'
//! descriptions state them, so a loopback-only sandbox is never mistaken for a flaky
//! network and bash syntax is never guessed at.
//!
//! Invariants: the facts come from the default scope's marsh, never from a guess
//! about its settings files; a fact marsh does not report (the real marsh, an older
//! stand-in, a scope not ready) is stated as unknown rather than assumed. They are
//! fetched once per server and again after the default scope is stopped or reset
//! (the only moments its settings take effect); a fetch is bounded by
//! [`FETCH_LIMIT`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::context::ServerContext;
use crate::lock::lock;
use crate::marsh::{Verb, answer};
use marsh_scope_registry::{ScopeId, ScopeState};

/// Bound on one `marsh status` for the facts.
const FETCH_LIMIT: Duration = Duration::from_secs(3);

/// The project shell's network, as far as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Network {
    /// Own network namespace: loopback only.
    Loopback,
    /// The host's network.
    Host,
    Unknown,
}

/// The default scope's project shell as marsh reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShellFacts {
    /// `bash` or `sh`; `None`: not reported.
    pub shell: Option<String>,
    pub network: Network,
}

impl ShellFacts {
    pub const UNKNOWN: ShellFacts = ShellFacts {
        shell: None,
        network: Network::Unknown,
    };

    /// From a `status.backend` object.
    pub fn from_backend(backend: Option<&Value>) -> Self {
        let text = |key: &str| backend.and_then(|b| b.get(key)).and_then(Value::as_str);
        Self {
            shell: text("shell")
                .filter(|s| matches!(*s, "bash" | "sh"))
                .map(str::to_owned),
            network: match text("network") {
                Some("loopback") => Network::Loopback,
                Some("host") => Network::Host,
                _ => Network::Unknown,
            },
        }
    }

    /// One sentence for the instructions and the run tools' descriptions.
    pub fn sentence(&self) -> String {
        let shell = match self.shell.as_deref() {
            Some("bash") => "Commands run in bash",
            Some(_) => "Commands run in /bin/sh (POSIX sh, not bash)",
            None => "Commands run in the project shell",
        };
        let network = match self.network {
            Network::Loopback => {
                "; network: loopback only (no internet unless a person enables it)."
            }
            Network::Host => "; network: the host's.",
            Network::Unknown => ".",
        };
        format!("{shell}{network}")
    }
}

/// The facts of this server, fetched on first need and after the default scope's
/// settings may have taken effect.
///
/// Invariant: a fetch that began before a [`forget`](Self::forget) never fills the
/// cache (the generation moved on), so a stop or reset is never answered with what the
/// shell booted with before it.
#[derive(Debug, Default)]
pub(crate) struct ShellFactsCache {
    held: std::sync::Mutex<Option<ShellFacts>>,
    /// Serializes fetches: concurrent callers wait for one `marsh status`.
    fetching: Mutex<()>,
    generation: AtomicU64,
}

impl ShellFactsCache {
    /// The facts, fetching them when none are held. Unknown facts (a scope not
    /// ready, a failed query) are not kept: the next caller asks again.
    pub async fn get(&self, ctx: &ServerContext) -> ShellFacts {
        if let Some(facts) = self.snapshot() {
            return facts;
        }
        let _fetching = self.fetching.lock().await;
        if let Some(facts) = self.snapshot() {
            return facts;
        }
        let generation = self.generation.load(Ordering::Acquire);
        let facts = fetch(ctx).await;
        let mut held = lock(&self.held);
        if facts != ShellFacts::UNKNOWN && self.generation.load(Ordering::Acquire) == generation {
            *held = Some(facts.clone());
        }
        facts
    }

    /// The facts held now, if any (never waits for a fetch).
    pub fn snapshot(&self) -> Option<ShellFacts> {
        lock(&self.held).clone()
    }

    /// Forgets the facts: the default scope is being stopped or reset.
    pub fn forget(&self) {
        let mut held = lock(&self.held);
        self.generation.fetch_add(1, Ordering::AcqRel);
        *held = None;
    }
}

/// `marsh status` of the default scope when it is ready (a status without a daemon
/// reports what a boot would use); unknown otherwise.
async fn fetch(ctx: &ServerContext) -> ShellFacts {
    let Ok(view) = ctx.scopes.view(ScopeId::Default) else {
        return ShellFacts::UNKNOWN;
    };
    if view.state() != ScopeState::Ready || view.identity_invalid() {
        return ShellFacts::UNKNOWN;
    }
    let Ok(home) = ctx.scopes.verified_home(&view) else {
        return ShellFacts::UNKNOWN;
    };
    let Ok(_permit) = ctx.reads.try_acquire() else {
        return ShellFacts::UNKNOWN;
    };
    let run = ctx
        .driver
        .query_within(&Verb::Status, &home, FETCH_LIMIT, &CancellationToken::new())
        .await;
    match run.and_then(answer) {
        Ok(status) => ShellFacts::from_backend(status.get("backend")),
        Err(e) => {
            tracing::warn!("the project shell's facts could not be read: {}", e.message);
            ShellFacts::UNKNOWN
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn sentences_name_what_marsh_reports_and_nothing_it_does_not() {
        let facts = |v: Value| ShellFacts::from_backend(Some(&v)).sentence();
        let loopback = facts(json!({"shell": "bash", "network": "loopback"}));
        assert!(loopback.starts_with("Commands run in bash;"), "{loopback}");
        assert!(loopback.contains("loopback only"), "{loopback}");
        let host = facts(json!({"shell": "sh", "network": "host"}));
        assert!(
            host.contains("/bin/sh") && host.contains("the host's"),
            "{host}"
        );
        let unknown = ShellFacts::from_backend(None).sentence();
        assert_eq!(unknown, "Commands run in the project shell.");
        assert_eq!(
            ShellFacts::from_backend(Some(&json!({"shell": "zsh", "network": "bridge"}))),
            ShellFacts::UNKNOWN
        );
    }
}
