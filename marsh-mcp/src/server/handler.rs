//! One MCP session: rmcp drives the protocol; this handler answers `initialize` once,
//! lists the static catalog and dispatches calls with the session's identity.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use tokio::io::{AsyncBufRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::transport::LineTransport;
use crate::context::ServerContext;
use crate::operations::SessionId;
use crate::shell_facts::ShellFacts;
use crate::tools::{self, CatalogCache};

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// How long a closing session waits for its cancelled children to be reaped (the
/// SIGINT, SIGTERM, SIGKILL escalation takes at most ~4.5 s).
const CLOSE_SETTLE: Duration = Duration::from_secs(6);

/// The server's instructions. A registration can be account-wide (Codex), so they
/// name the workspace's directory: an agent in another repository is not misled.
/// `facts` is the project shell's one-sentence description ([`ShellFacts::sentence`]).
fn instructions(project: &str, facts: &str) -> String {
    format!(
        "marsh-mcp runs commands in the marsh project shell of the workspace `{project}` (never a host shell, \
and never another repository's, whichever one this session was opened in). {facts} \
The sandbox shows the workspace writable (the working directory), the system read-only and a $HOME of its own that \
persists per scope across commands, stops and resets; host files outside the workspace are not there unless a person \
exposed them read-only. Background processes end when their command ends: run a long-lived service as its own \
shell_run operation. Only a person changes these settings (docs: What your agent sees). \
Use shell_run for commands: fast ones return inline; long ones return an operation id to poll with operation_get \
and read with operation_output; operation_list finds your operations. structuredContent is {{ok, data}} or \
{{ok:false, error:{{kind, message, retryable}}}}; the text content is the same result written to be read."
    )
}

pub struct McpSession {
    ctx: Arc<ServerContext>,
    catalog: Arc<CatalogCache>,
    session: SessionId,
    initialized: AtomicBool,
    /// Cancelled by the transport once the input has ended and its grace passed;
    /// every call's token follows it.
    input_closed: CancellationToken,
}

impl McpSession {
    pub fn new(
        ctx: Arc<ServerContext>,
        catalog: Arc<CatalogCache>,
        input_closed: CancellationToken,
    ) -> Self {
        Self {
            ctx,
            catalog,
            session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            initialized: AtomicBool::new(false),
            input_closed,
        }
    }

    pub fn id(&self) -> SessionId {
        self.session
    }
}

impl ServerHandler for McpSession {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("marsh-mcp", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions(
                &self.ctx.project_name(),
                &self
                    .ctx
                    .shell_facts
                    .snapshot()
                    .unwrap_or(ShellFacts::UNKNOWN)
                    .sentence(),
            ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        accept_initialize(&self.initialized, &request, &context)?;
        // `get_info` (sync) reads the facts this fetched.
        self.ctx.shell_facts.get(&self.ctx).await;
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let facts = self.ctx.shell_facts.get(&self.ctx).await;
        Ok(ListToolsResult::with_all_items(
            self.catalog.tools(&self.ctx.project_name(), &facts),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let progress =
            tools::progress::Progress::new(context.meta.get_progress_token(), context.peer);
        let (cancel, _link) = call_token(&context.ct, &self.input_closed);
        match tools::call(
            &self.ctx,
            self.session,
            &request.name,
            request.arguments,
            &cancel,
            &progress,
        )
        .await
        {
            Some(result) => Ok(result.into()),
            None => Err(McpError::invalid_params(
                format!(
                    "unknown tool: {}",
                    crate::error::echo_excerpt(&request.name)
                ),
                None,
            )),
        }
    }
}

/// The one `initialize` a session accepts: a second is refused, the first records the
/// client's info. Shared by the development and the export session.
pub(crate) fn accept_initialize(
    initialized: &AtomicBool,
    request: &InitializeRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<(), McpError> {
    if initialized.swap(true, Ordering::AcqRel) {
        return Err(McpError::invalid_request(
            "this session is already initialized",
            None,
        ));
    }
    context.peer.set_peer_info(request.clone());
    Ok(())
}

/// A call's cancellation: cancelled when rmcp cancels `request` (the client's
/// `notifications/cancelled`) or when the session's input has closed. The guard ends
/// the link when the call ends.
pub(crate) fn call_token(
    request: &CancellationToken,
    input_closed: &CancellationToken,
) -> (CancellationToken, AbortOnDrop) {
    let token = input_closed.child_token();
    let (request, linked) = (request.clone(), token.clone());
    let link = tokio::spawn(async move {
        request.cancelled().await;
        linked.cancel();
    });
    (token, AbortOnDrop(link))
}

/// Aborts its task when dropped.
pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `handler` over a byte stream until the peer leaves; `input_closed` is the
/// token the transport cancels after the input ends (see [`LineTransport::spawn`]).
pub(crate) async fn run_handler<H, R, W>(
    handler: H,
    read: R,
    write: W,
    input_closed: CancellationToken,
) -> Result<(), String>
where
    H: ServerHandler,
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let transport = LineTransport::spawn(read, write, input_closed);
    match handler.serve(transport).await {
        Ok(running) => running
            .waiting()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

/// Serves one session over a byte stream until the peer leaves, then cancels exactly
/// this session's live operations and waits (bounded) for their children.
pub async fn serve_session<R, W>(
    ctx: Arc<ServerContext>,
    catalog: Arc<CatalogCache>,
    read: R,
    write: W,
) -> Result<(), String>
where
    R: AsyncBufRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let input_closed = CancellationToken::new();
    let handler = McpSession::new(Arc::clone(&ctx), catalog, input_closed.clone());
    let session = handler.id();
    let outcome = run_handler(handler, read, write, input_closed).await;
    let cancelled = ctx.ops.cancel_session(session);
    if !cancelled.is_empty() {
        tracing::info!(
            session,
            count = cancelled.len(),
            "session ended; cancelling its operations"
        );
        // One deadline for all of them: the session ends within CLOSE_SETTLE however
        // many it had.
        let never = CancellationToken::new();
        let deadline = tokio::time::Instant::now() + CLOSE_SETTLE;
        for op in cancelled {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            op.wait_for_end(left, &never).await;
        }
    }
    outcome
}
