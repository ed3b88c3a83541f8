//! One export session: exactly the declared tool, re-verified against its declaration
//! on every request. Once the declaration is replaced, removed or re-generated, the
//! session lists nothing and refuses every call with `publication_changed`, for the
//! rest of its life (no `list_changed` is sent: the client must reload the
//! registration).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use marsh_publication as published;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, InitializeRequestParams,
    InitializeResult, JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::bind::bind;
use super::published_reply::{error_result, output_schema, run_result};
use super::run::{Bounds, run};
use super::startup::ExportContext;
use crate::error::{ErrorKind, ToolError};
use crate::server::{accept_initialize, call_token};

/// Calls of one export server that may run at once (the product's operation cap).
const CONCURRENT_CALLS: usize = 4;

pub struct ExportSession {
    ctx: Arc<ExportContext>,
    /// Sticky: set by the first failed re-verification, never cleared.
    stale: AtomicBool,
    initialized: AtomicBool,
    calls: Semaphore,
    /// Cancelled once the input has ended and its grace passed; every call follows it.
    input_closed: CancellationToken,
}

impl ExportSession {
    pub fn new(ctx: Arc<ExportContext>, input_closed: CancellationToken) -> Self {
        Self {
            ctx,
            stale: AtomicBool::new(false),
            initialized: AtomicBool::new(false),
            calls: Semaphore::new(CONCURRENT_CALLS),
            input_closed,
        }
    }

    /// The declaration still is, byte for byte, the one this server started from.
    fn current(&self) -> Result<(), ToolError> {
        let changed = |detail: String| {
            tracing::warn!("publication changed: {detail}");
            ToolError::new(
                ErrorKind::PublicationChanged,
                "this published tool was republished, unpublished or modified since the server started; reload the registration",
            )
        };
        if self.stale.load(Ordering::Acquire) {
            return Err(changed("already stale".into()));
        }
        let verdict = match published::load(&self.ctx.declaration_path, &self.ctx.expectation()) {
            Ok(now) if now.bytes == self.ctx.startup.bytes => return Ok(()),
            Ok(_) => "the declaration's bytes differ".to_string(),
            Err(e) => e.to_string(),
        };
        self.stale.store(true, Ordering::Release);
        Err(changed(verdict))
    }

    fn tool(&self) -> Tool {
        let decl = &self.ctx.startup.declaration;
        let schema: JsonObject = match &decl.input_schema {
            Value::Object(map) => map.clone(),
            _ => JsonObject::new(),
        };
        let mut annotations = ToolAnnotations::new();
        annotations.read_only_hint = Some(false);
        annotations.destructive_hint = Some(true);
        annotations.idempotent_hint = Some(false);
        annotations.open_world_hint = Some(false);
        Tool::new(
            decl.tool_name.clone(),
            decl.description.clone(),
            Arc::new(schema),
        )
        .with_raw_output_schema(output_schema())
        .with_annotations(annotations)
    }

    fn instructions(&self) -> String {
        let project = self
            .ctx
            .workspace
            .path
            .file_name()
            .map_or_else(|| "/".into(), |n| n.to_string_lossy().into_owned());
        format!(
            "This server exposes one published tool, {}, which runs a fixed command in the marsh project {project} \
(a fresh project-shell job per call, never a host shell). Results are {{ok, data}}: data.outcome says how it ended, \
stdout_base64/stderr_base64 are the authoritative bytes.",
            self.ctx.startup.declaration.tool_name
        )
    }
}

impl ServerHandler for ExportSession {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "marsh-mcp-export",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(self.instructions())
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        accept_initialize(&self.initialized, &request, &context)?;
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = match self.current() {
            Ok(()) => vec![self.tool()],
            Err(_) => Vec::new(),
        };
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let decl = &self.ctx.startup.declaration;
        let outcome = async {
            if request.name != decl.tool_name {
                return Err(ToolError::new(
                    ErrorKind::NotFound,
                    format!(
                        "unknown tool {:?}; this server exposes only {:?}",
                        crate::error::echo_excerpt(&request.name),
                        decl.tool_name
                    ),
                ));
            }
            self.current()?;
            let invocation = bind(decl, &request.arguments)?;
            let _permit = self.calls.try_acquire().map_err(|_| {
                ToolError::new(
                    ErrorKind::CapacityExhausted,
                    format!(
                        "{CONCURRENT_CALLS} calls of this tool are already running; retry later"
                    ),
                )
            })?;
            let bounds = Bounds {
                max_output_bytes: decl.max_output_bytes as usize,
                timeout: Duration::from_millis(u64::from(decl.timeout_ms)),
            };
            let (cancel, _link) = call_token(&context.ct, &self.input_closed);
            run(
                &self.ctx.driver,
                &self.ctx.home,
                invocation,
                bounds,
                &cancel,
            )
            .await
        }
        .await;
        Ok(match outcome {
            Ok(report) => run_result(&decl.tool_name, &report),
            Err(error) => error_result(&error),
        }
        .into())
    }
}
