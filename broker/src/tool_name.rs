//! The 22 tools as one enum: the single source of their names, their catalog order and
//! the flags every other table derives from (read-only, which scope they address).
//! `tools/` adds descriptions and schemas and dispatches on it exhaustively; operation
//! kinds name themselves through it.

/// Every tool this server exposes, in catalog order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    pub(crate) const ALL: [ToolName; 22] = [
        Self::Doctor,
        Self::Status,
        Self::ResultsList,
        Self::ResultGet,
        Self::ShellRun,
        Self::Prewarm,
        Self::WorkersReset,
        Self::ScopeStart,
        Self::ScopeList,
        Self::ScopeStatus,
        Self::ScopeRun,
        Self::ScopeResultsList,
        Self::ScopeResultGet,
        Self::ScopePrewarm,
        Self::ScopeWorkersReset,
        Self::ScopeReset,
        Self::ScopeStop,
        Self::ScopeRemove,
        Self::OperationGet,
        Self::OperationOutput,
        Self::OperationCancel,
        Self::Qualify,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Doctor => "doctor",
            Self::Status => "status",
            Self::ResultsList => "results_list",
            Self::ResultGet => "result_get",
            Self::ShellRun => "shell_run",
            Self::Prewarm => "prewarm",
            Self::WorkersReset => "workers_reset",
            Self::ScopeStart => "scope_start",
            Self::ScopeList => "scope_list",
            Self::ScopeStatus => "scope_status",
            Self::ScopeRun => "scope_run",
            Self::ScopeResultsList => "scope_results_list",
            Self::ScopeResultGet => "scope_result_get",
            Self::ScopePrewarm => "scope_prewarm",
            Self::ScopeWorkersReset => "scope_workers_reset",
            Self::ScopeReset => "scope_reset",
            Self::ScopeStop => "scope_stop",
            Self::ScopeRemove => "scope_remove",
            Self::OperationGet => "operation_get",
            Self::OperationOutput => "operation_output",
            Self::OperationCancel => "operation_cancel",
            Self::Qualify => "qualify",
        }
    }

    /// The tool called `name`, if there is one.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|tool| tool.as_str() == name)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for tool in ToolName::ALL {
            assert!(seen.insert(tool.as_str()), "{tool:?}");
            assert_eq!(ToolName::parse(tool.as_str()), Some(tool));
        }
        assert_eq!(ToolName::parse("shell"), None);
    }

    #[test]
    fn every_scope_tool_takes_a_scope_argument_and_aliases_do_not() {
        for tool in ToolName::ALL {
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
