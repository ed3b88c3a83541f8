//! The 23 tools as one enum: the single source of their names, their catalog order and
//! the flags every other table derives from (which scope they address, title and the
//! read-only / destructive / idempotent / open-world hints).
//! `tools/` adds descriptions and schemas and dispatches on it exhaustively; operation
//! kinds name themselves through it.

/// Every tool this server exposes, in catalog order (the declaration order); a tool's
/// wire name is its variant in snake_case.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub(crate) enum ToolName {
    Doctor,
    Status,
    ResultsList,
    ResultGet,
    ShellRun,
    Prewarm,
    WorkersReset,
    ScopeStart,
    ScopeList,
    ScopeStatus,
    ScopeRun,
    ScopeResultsList,
    ScopeResultGet,
    ScopePrewarm,
    ScopeWorkersReset,
    ScopeReset,
    ScopeStop,
    ScopeRemove,
    OperationList,
    OperationGet,
    OperationOutput,
    OperationCancel,
    Qualify,
}

/// Which scope a tool addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Addressing {
    /// No scope (server-wide tools, operations, qualification, scope creation).
    Unscoped,
    /// A default-scope alias: always the default scope.
    DefaultScope,
    /// A `scope_*` tool: a required `scope_id` argument names the scope.
    ScopeArgument,
}

impl ToolName {
    /// Catalog order: exactly these 22.
    pub(crate) const ALL: &'static [ToolName] = <Self as strum::VariantArray>::VARIANTS;

    pub(crate) fn as_str(self) -> &'static str {
        self.into()
    }

    /// The tool called `name`, if there is one.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        name.parse().ok()
    }

    pub(crate) fn addressing(self) -> Addressing {
        match self {
            Self::Status
            | Self::ResultsList
            | Self::ResultGet
            | Self::ShellRun
            | Self::Prewarm
            | Self::WorkersReset => Addressing::DefaultScope,
            Self::ScopeStatus
            | Self::ScopeRun
            | Self::ScopeResultsList
            | Self::ScopeResultGet
            | Self::ScopePrewarm
            | Self::ScopeWorkersReset
            | Self::ScopeReset
            | Self::ScopeStop
            | Self::ScopeRemove => Addressing::ScopeArgument,
            Self::Doctor
            | Self::ScopeStart
            | Self::ScopeList
            | Self::OperationList
            | Self::OperationGet
            | Self::OperationOutput
            | Self::OperationCancel
            | Self::Qualify => Addressing::Unscoped,
        }
    }

    /// Whether the tool only observes: it changes no scope, runtime or operation.
    /// Receipt reads count as reads even though reading a stopped scope boots and then
    /// exactly stops its runtime (the persisted state ends where it began).
    pub(crate) fn read_only(self) -> bool {
        match self {
            Self::Doctor
            | Self::Status
            | Self::ResultsList
            | Self::ResultGet
            | Self::ScopeList
            | Self::ScopeStatus
            | Self::ScopeResultsList
            | Self::ScopeResultGet
            | Self::OperationList
            | Self::OperationGet
            | Self::OperationOutput => true,
            Self::ShellRun
            | Self::Prewarm
            | Self::WorkersReset
            | Self::ScopeStart
            | Self::ScopeRun
            | Self::ScopePrewarm
            | Self::ScopeWorkersReset
            | Self::ScopeReset
            | Self::ScopeStop
            | Self::ScopeRemove
            | Self::OperationCancel
            | Self::Qualify => false,
        }
    }

    /// A short human title (`title` in the catalog).
    pub(crate) fn title(self) -> &'static str {
        match self {
            Self::Doctor => "Check server health",
            Self::Status => "Default scope status",
            Self::ResultsList => "List default-scope receipts",
            Self::ResultGet => "Get a default-scope receipt",
            Self::ShellRun => "Run a shell command",
            Self::Prewarm => "Warm default-scope workers",
            Self::WorkersReset => "Reset default-scope workers",
            Self::ScopeStart => "Start a new scope",
            Self::ScopeList => "List scopes",
            Self::ScopeStatus => "Scope status",
            Self::ScopeRun => "Run a shell command in a scope",
            Self::ScopeResultsList => "List a scope's receipts",
            Self::ScopeResultGet => "Get a scope's receipt",
            Self::ScopePrewarm => "Warm a scope's workers",
            Self::ScopeWorkersReset => "Reset a scope's workers",
            Self::ScopeReset => "Reset a scope",
            Self::ScopeStop => "Stop a scope",
            Self::ScopeRemove => "Remove a scope",
            Self::OperationList => "List this session's operations",
            Self::OperationGet => "Get an operation",
            Self::OperationOutput => "Read an operation's output",
            Self::OperationCancel => "Cancel an operation",
            Self::Qualify => "Run a qualification gate",
        }
    }

    /// `destructiveHint`: the tool runs commands, or discards, resets or stops state.
    pub(crate) fn destructive(self) -> bool {
        match self {
            // Observers change nothing.
            Self::Doctor
            | Self::Status
            | Self::ResultsList
            | Self::ResultGet
            | Self::ScopeList
            | Self::ScopeStatus
            | Self::ScopeResultsList
            | Self::ScopeResultGet
            | Self::OperationList
            | Self::OperationGet
            | Self::OperationOutput => false,
            // Warming only brings workers up; it discards nothing.
            Self::Prewarm | Self::ScopePrewarm => false,
            // Creates a new scope beside the others: purely additive.
            Self::ScopeStart => false,
            // Arbitrary commands can change or delete anything the shell can reach.
            Self::ShellRun | Self::ScopeRun => true,
            // Runs `make` in the workspace as the host user.
            Self::Qualify => true,
            // Discard warm worker state.
            Self::WorkersReset | Self::ScopeWorkersReset => true,
            // Reboots, stops or deletes a scope's runtime or home.
            Self::ScopeReset | Self::ScopeStop | Self::ScopeRemove => true,
            // Signals running work.
            Self::OperationCancel => true,
        }
    }

    /// `idempotentHint`: a repeat with the same arguments has no additional effect.
    /// Conservative: only where the second call provably finds nothing left to do.
    pub(crate) fn idempotent(self) -> bool {
        match self {
            // Reads.
            Self::Doctor
            | Self::Status
            | Self::ResultsList
            | Self::ResultGet
            | Self::ScopeList
            | Self::ScopeStatus
            | Self::ScopeResultsList
            | Self::ScopeResultGet
            | Self::OperationList
            | Self::OperationGet
            | Self::OperationOutput => true,
            // Warm workers stay warm; cold workers stay cold.
            Self::Prewarm | Self::ScopePrewarm | Self::WorkersReset | Self::ScopeWorkersReset => {
                true
            }
            // A stopped scope is answered "already stopped; nothing was run".
            Self::ScopeStop => true,
            // A removed scope is unknown the second time.
            Self::ScopeRemove => true,
            // An ended or already-cancelled operation is not signalled again.
            Self::OperationCancel => true,
            // Each call runs the command / recipe again.
            Self::ShellRun | Self::ScopeRun | Self::Qualify => false,
            // Each call creates another scope.
            Self::ScopeStart => false,
            // Each call reboots the runtime again.
            Self::ScopeReset => false,
        }
    }

    /// `openWorldHint`: the tool may reach entities outside this server's scopes.
    pub(crate) fn open_world(self) -> bool {
        match self {
            // Arbitrary commands reach whatever the sandbox's network policy allows; that
            // policy belongs to the sandbox configuration, not to this server.
            Self::ShellRun | Self::ScopeRun => true,
            // Runs on the host, outside any sandbox, as the host user.
            Self::Qualify => true,
            // Fixed marsh verbs and reads of this server's own state.
            Self::Doctor
            | Self::Status
            | Self::ResultsList
            | Self::ResultGet
            | Self::Prewarm
            | Self::WorkersReset
            | Self::ScopeStart
            | Self::ScopeList
            | Self::ScopeStatus
            | Self::ScopeResultsList
            | Self::ScopeResultGet
            | Self::ScopePrewarm
            | Self::ScopeWorkersReset
            | Self::ScopeReset
            | Self::ScopeStop
            | Self::ScopeRemove
            | Self::OperationList
            | Self::OperationGet
            | Self::OperationOutput
            | Self::OperationCancel => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for &tool in ToolName::ALL {
            assert!(seen.insert(tool.as_str()), "{tool:?}");
            assert_eq!(ToolName::parse(tool.as_str()), Some(tool));
        }
        assert_eq!(ToolName::parse("shell"), None);
    }

    #[test]
    fn hints_are_consistent() {
        let mut titles = std::collections::HashSet::new();
        for &tool in ToolName::ALL {
            assert!(titles.insert(tool.title()), "{tool:?}");
            if tool.read_only() {
                assert!(!tool.destructive() && tool.idempotent() && !tool.open_world());
            }
        }
        for tool in [
            ToolName::ShellRun,
            ToolName::ScopeRun,
            ToolName::Qualify,
            ToolName::WorkersReset,
            ToolName::ScopeWorkersReset,
            ToolName::ScopeReset,
            ToolName::ScopeStop,
            ToolName::ScopeRemove,
            ToolName::OperationCancel,
        ] {
            assert!(tool.destructive(), "{tool:?}");
        }
        assert!(!ToolName::Prewarm.destructive());
        assert!(!ToolName::ShellRun.idempotent());
    }

    #[test]
    fn every_scope_tool_takes_a_scope_argument_and_aliases_do_not() {
        for &tool in ToolName::ALL {
            let scoped = tool.as_str().starts_with("scope_")
                && !matches!(tool, ToolName::ScopeStart | ToolName::ScopeList);
            assert_eq!(
                tool.addressing() == Addressing::ScopeArgument,
                scoped,
                "{tool:?}"
            );
        }
    }
}
