//! The broker's socket surface: HTTP/1.1 over a Unix socket.
//!
//! - `GET /v1/probe`: identity (build, fingerprint, pid, sessions).
//! - `POST /v1/stop`: stops the broker; 409 while a session is attached (sessions
//!   whose proxy has gone are given a bounded moment to finish closing first).
//! - `POST /v1/session` with `Upgrade: mcp-lines`: 101, then the stream carries
//!   newline-delimited MCP for one rmcp session of its own.
//!
//! Every connection must come from the broker's own uid (`SO_PEERCRED`) and every
//! request must carry the bearer token. Headers are bounded in size and time;
//! connections and sessions are bounded, with typed refusals.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONNECTION, CONTENT_TYPE, UPGRADE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use marsh_connect_proxy::{PROBE_PATH, SESSION_PATH, STOP_PATH, UPGRADE_PROTOCOL};
use serde_json::json;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use super::attachments::{AttachRefusal, Attachments, MAX_SESSIONS};
use super::fingerprint::BrokerIdentity;
use super::token::token_matches;
use crate::context::ServerContext;
use crate::server::serve_session;
use crate::tools::CatalogCache;

/// Open connections at once (sessions included).
pub const MAX_CONNECTIONS: usize = 256;
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// hyper's smallest allowed read buffer; also the bound on request headers.
const MAX_HEADER_BYTES: usize = 8192;
/// How long a stop request waits for sessions of vanished proxies to close: a session
/// whose input ended is cancelled and gone within 15 s (see the session transport).
const STOP_SETTLE: Duration = Duration::from_secs(15);

pub struct Broker {
    pub ctx: Arc<ServerContext>,
    /// Shared by every session of this broker.
    catalog: Arc<CatalogCache>,
    pub token: String,
    pub identity: BrokerIdentity,
    attachments: Attachments,
    connections: Arc<Semaphore>,
}

type Body = Full<Bytes>;

fn answer(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

fn refusal(status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    answer(status, json!({"error": {"kind": kind, "message": message}}))
}

impl Broker {
    pub fn new(ctx: Arc<ServerContext>, token: String, identity: BrokerIdentity) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            catalog: Arc::default(),
            token,
            identity,
            attachments: Attachments::default(),
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        })
    }

    pub fn sessions(&self) -> usize {
        self.attachments.count()
    }

    /// Asks the accept loop to end.
    pub fn request_stop(&self) {
        self.attachments.request_stop();
    }

    /// Asks the accept loop to end if no session is attached and `idle()` agrees,
    /// atomically with respect to session requests. True if it did.
    pub fn stop_if_idle(&self, idle: impl FnOnce() -> bool) -> bool {
        self.attachments.stop_if_idle(idle)
    }

    /// Accepts until a stop is requested.
    pub async fn serve(self: &Arc<Self>, listener: UnixListener) {
        let euid = nix::unistd::geteuid().as_raw();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = self.attachments.stopped() => return,
            };
            let (stream, _) = match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(%e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // The peer's uid is checked before anything is read or a connection slot
            // taken: a foreign process cannot hold slots through the header phase.
            if !stream.peer_cred().is_ok_and(|cred| cred.uid() == euid) {
                tokio::spawn(refuse_raw(stream, Refused::PeerUid));
                continue;
            }
            let Ok(permit) = Arc::clone(&self.connections).try_acquire_owned() else {
                tokio::spawn(refuse_raw(stream, Refused::TooManyConnections));
                continue;
            };
            let broker = Arc::clone(self);
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let broker = Arc::clone(&broker);
                    async move { Ok::<_, Infallible>(broker.route(req).await) }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_buf_size(MAX_HEADER_BYTES)
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
                if let Err(e) = served {
                    tracing::debug!(%e, "broker connection ended");
                }
                drop(permit);
            });
        }
    }

    async fn route(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let presented = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_credentials)
            .unwrap_or("");
        if !token_matches(presented, &self.token) {
            return refusal(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token",
            );
        }
        match (req.method(), req.uri().path()) {
            (&Method::GET, PROBE_PATH) => answer(
                StatusCode::OK,
                json!({
                    "service": "marsh-mcp-broker",
                    "version": env!("CARGO_PKG_VERSION"),
                    "build": self.identity.build,
                    "fingerprint": self.identity.fingerprint,
                    "pid": std::process::id(),
                    "sessions": self.sessions(),
                    "workspace_hash": self.ctx.workspace_hash,
                }),
            ),
            (&Method::POST, STOP_PATH) => self.stop_request().await,
            (&Method::POST, SESSION_PATH) => self.open_session(req),
            _ => refusal(StatusCode::NOT_FOUND, "not_found", "no such endpoint"),
        }
    }

    async fn stop_request(&self) -> Response<Body> {
        let deadline = tokio::time::Instant::now() + STOP_SETTLE;
        while self.sessions() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !self.stop_if_idle(|| true) {
            let attached = self.sessions();
            return refusal(
                StatusCode::CONFLICT,
                "sessions_attached",
                &format!("{attached} session(s) attached; stop their proxies first"),
            );
        }
        answer(
            StatusCode::OK,
            json!({"stopping": true, "pid": std::process::id()}),
        )
    }

    fn open_session(self: &Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let wants = req.headers().get(UPGRADE).and_then(|v| v.to_str().ok());
        if wants != Some(UPGRADE_PROTOCOL) {
            return refusal(
                StatusCode::BAD_REQUEST,
                "upgrade_required",
                "POST /v1/session needs `Upgrade: mcp-lines`",
            );
        }
        // A stop decided after this sees the session; one decided before refuses it
        // (503, which `connect --start` answers by starting a broker again).
        let slot = match self.attachments.attach() {
            Ok(slot) => slot,
            Err(AttachRefusal::Stopping) => {
                return refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "stopping",
                    "the broker is stopping; start it again",
                );
            }
            Err(AttachRefusal::Full) => {
                return refusal(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too_many_sessions",
                    &format!("{MAX_SESSIONS} sessions are attached; retry later"),
                );
            }
        };
        let ctx = Arc::clone(&self.ctx);
        let catalog = Arc::clone(&self.catalog);
        tokio::spawn(async move {
            let upgraded = match hyper::upgrade::on(req).await {
                Ok(upgraded) => upgraded,
                Err(e) => {
                    tracing::debug!(%e, "session upgrade failed");
                    return;
                }
            };
            let (read, write) = tokio::io::split(TokioIo::new(upgraded));
            if let Err(e) = serve_session(
                ctx,
                catalog,
                BufReader::with_capacity(64 * 1024, read),
                write,
            )
            .await
            {
                tracing::debug!(%e, "session ended with an error");
            }
            drop(slot);
        });
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = response.headers_mut();
        headers.insert(
            CONNECTION,
            hyper::header::HeaderValue::from_static("upgrade"),
        );
        headers.insert(
            UPGRADE,
            hyper::header::HeaderValue::from_static(UPGRADE_PROTOCOL),
        );
        response
    }
}

/// Why a connection is answered and closed before anything is read from it.
#[derive(Debug, Clone, Copy)]
enum Refused {
    /// The connecting process does not run as the broker's user (`SO_PEERCRED`).
    PeerUid,
    /// [`MAX_CONNECTIONS`] are open.
    TooManyConnections,
}

/// Answers `stream` with one HTTP response without reading it, then closes it.
async fn refuse_raw(mut stream: UnixStream, why: Refused) {
    let (status, kind, message) = match why {
        Refused::PeerUid => (
            "403 Forbidden",
            "peer_uid",
            "the connecting process does not run as the broker's user".to_string(),
        ),
        Refused::TooManyConnections => (
            "503 Service Unavailable",
            "too_many_connections",
            format!("{MAX_CONNECTIONS} connections are open"),
        ),
    };
    let body = json!({"error": {"kind": kind, "message": message}}).to_string();
    let reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(reply.as_bytes())).await;
}

/// The credentials of an `Authorization` value in the `Bearer` scheme, whose name is
/// case-insensitive (RFC 7235); `None` for another scheme.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim_start_matches(' '))
}
