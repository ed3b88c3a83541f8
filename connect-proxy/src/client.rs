//! HTTP/1.1 over the broker's Unix socket. Every request carries the bearer token;
//! the broker additionally checks the peer uid. `BrokerClient` never creates a token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{AUTHORIZATION, CONNECTION, HOST, UPGRADE};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

pub const PROBE_PATH: &str = "/v1/probe";
pub const STOP_PATH: &str = "/v1/stop";
pub const SESSION_PATH: &str = "/v1/session";
/// The `Upgrade` token of a session: newline-delimited MCP after the 101.
pub const UPGRADE_PROTOCOL: &str = "mcp-lines";
/// Bound on every handshake step and on answers read before an upgrade.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const ANSWER_LIMIT: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no broker answers at {path}: {source}")]
    Unreachable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the broker handshake failed: {0}")]
    Handshake(#[source] hyper::Error),
    #[error("the broker refused the request ({status}): {body}")]
    Refused { status: u16, body: String },
    #[error("the broker did not answer within {0:?}")]
    Timeout(Duration),
    #[error("cannot build the request: {0}")]
    Request(String),
}

/// Talks to one broker socket with one token.
#[derive(Debug, Clone)]
pub struct BrokerClient {
    socket: PathBuf,
    token: String,
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

impl BrokerClient {
    pub fn new(socket: &Path, token: String) -> Self {
        Self {
            socket: socket.to_owned(),
            token,
        }
    }

    async fn sender(&self) -> Result<(Sender, tokio::task::JoinHandle<()>), ClientError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|source| ClientError::Unreachable {
                    path: self.socket.clone(),
                    source,
                })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(ClientError::Handshake)?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!(%e, "broker connection ended");
            }
        });
        Ok((sender, driver))
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        upgrade: bool,
    ) -> Result<Request<Empty<Bytes>>, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "marsh-broker")
            .header(AUTHORIZATION, format!("Bearer {}", self.token));
        if upgrade {
            builder = builder
                .header(CONNECTION, "upgrade")
                .header(UPGRADE, UPGRADE_PROTOCOL);
        }
        builder
            .body(Empty::new())
            .map_err(|e| ClientError::Request(e.to_string()))
    }

    /// Sends a plain request and returns the status and body (bounded, answered within
    /// the handshake timeout).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
    ) -> Result<(StatusCode, String), ClientError> {
        self.call_within(method, path, HANDSHAKE_TIMEOUT).await
    }

    /// [`Self::call`] for a request the broker may take up to `limit` to answer.
    pub async fn call_within(
        &self,
        method: Method,
        path: &str,
        limit: Duration,
    ) -> Result<(StatusCode, String), ClientError> {
        let work = async {
            let (mut sender, driver) = self.sender().await?;
            let response = sender
                .send_request(self.request(method, path, false)?)
                .await
                .map_err(ClientError::Handshake)?;
            let status = response.status();
            let body = Limited::new(response.into_body(), ANSWER_LIMIT)
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            driver.abort();
            Ok((status, body))
        };
        tokio::time::timeout(limit, work)
            .await
            .map_err(|_| ClientError::Timeout(limit))?
    }

    /// `GET /v1/probe` as JSON.
    pub async fn probe(&self) -> Result<serde_json::Value, ClientError> {
        let (status, body) = self.call(Method::GET, PROBE_PATH).await?;
        if status != StatusCode::OK {
            return Err(ClientError::Refused {
                status: status.as_u16(),
                body,
            });
        }
        serde_json::from_str(&body).map_err(|e| ClientError::Refused {
            status: status.as_u16(),
            body: format!("malformed probe answer: {e}"),
        })
    }

    /// Opens a session: `POST /v1/session` upgraded to a raw byte stream.
    pub async fn open_session(&self) -> Result<TokioIo<hyper::upgrade::Upgraded>, ClientError> {
        let work = async {
            let (mut sender, _driver) = self.sender().await?;
            let response = sender
                .send_request(self.request(Method::POST, SESSION_PATH, true)?)
                .await
                .map_err(ClientError::Handshake)?;
            if response.status() != StatusCode::SWITCHING_PROTOCOLS {
                let status = response.status().as_u16();
                let body = Limited::new(response.into_body(), ANSWER_LIMIT)
                    .collect()
                    .await
                    .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                    .unwrap_or_default();
                return Err(ClientError::Refused { status, body });
            }
            let upgraded = hyper::upgrade::on(response)
                .await
                .map_err(ClientError::Handshake)?;
            Ok(TokioIo::new(upgraded))
        };
        tokio::time::timeout(HANDSHAKE_TIMEOUT, work)
            .await
            .map_err(|_| ClientError::Timeout(HANDSHAKE_TIMEOUT))?
    }
}
