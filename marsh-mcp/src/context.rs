//! Everything a tool call may use, shared by every session of this server. Built from
//! leaves (the driver, the scopes, the operation table, the cap); nothing here knows
//! the tools, the sessions or startup.

use std::path::PathBuf;

use tokio::sync::Semaphore;

use crate::admission::Admitter;
use crate::global_cap::GlobalCap;
use crate::marsh::MarshDriver;
use crate::operations::OperationTable;
use crate::redact::HostPaths;
use crate::scopes::ScopeSet;
use crate::shell_facts::ShellFactsCache;

/// Concurrent read queries (status, results) that may hold a marsh child; reads are
/// not operations, so they get their own small bound instead of the global cap.
pub(crate) const READ_QUERY_CAP: usize = 8;

#[derive(Debug)]
pub(crate) struct ServerContext {
    pub workspace: PathBuf,
    /// Lowercase hex sha256 of the canonical workspace path bytes.
    pub workspace_hash: String,
    pub driver: MarshDriver,
    pub scopes: ScopeSet,
    pub ops: OperationTable,
    pub cap: GlobalCap,
    pub reads: Semaphore,
    pub allow_full_sbx_control: bool,
    /// Every tool result passes through it: no host path but the workspace goes out.
    pub host_paths: HostPaths,
    /// The default scope's shell and network, for the instructions and the catalog.
    pub shell_facts: ShellFactsCache,
}

impl ServerContext {
    /// The workspace's directory name: what the catalog and instructions call it
    /// (a name, not a host path).
    pub fn project_name(&self) -> String {
        self.workspace
            .file_name()
            .map_or_else(|| "/".to_string(), |n| n.to_string_lossy().into_owned())
    }

    pub fn new(
        workspace: PathBuf,
        workspace_hash: String,
        driver: MarshDriver,
        scopes: ScopeSet,
        allow_full_sbx_control: bool,
    ) -> Self {
        let mut places = vec![match scopes.root_path() {
            Some(root) => (root, "scope-root"),
            None => (scopes.legacy_home().unwrap_or_default(), "marsh-home"),
        }];
        for pin in driver.pins() {
            if let Some(dir) = pin.path().parent() {
                let role = if pin.role() == "sbx" {
                    "sbx-install-dir"
                } else {
                    "marsh-install-dir"
                };
                places.push((dir.to_path_buf(), role));
            }
        }
        let host_paths = HostPaths::new(&workspace, places);
        Self {
            workspace,
            workspace_hash,
            driver,
            scopes,
            ops: OperationTable::default(),
            cap: GlobalCap::default(),
            reads: Semaphore::new(READ_QUERY_CAP),
            allow_full_sbx_control,
            host_paths,
            shell_facts: ShellFactsCache::default(),
        }
    }

    /// `marsh-dev-` + the first 12 hex of the workspace hash.
    pub fn server_name(&self) -> String {
        marsh_scope_registry::server_name(&self.workspace_hash)
    }

    /// Admission over this server's scopes, cap and pinned executables.
    pub fn admission(&self) -> Admitter<'_> {
        Admitter {
            scopes: &self.scopes,
            cap: &self.cap,
            pins: &self.driver,
            workspace: &self.workspace,
        }
    }
}
