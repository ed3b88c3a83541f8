//! Sandbox names and the bounds a publication request must respect (docs/publishing.md).
//! Tool names, publisher keys and the stock SBX server of a tool are the declaration
//! format's, from `marsh_publication`.

pub use marsh_publication::{PublisherKey, legacy_server_for, valid_tool_name};

/// Longest sandbox name (a stock SBX server name's bound too).
const MAX_SANDBOX_NAME: usize = 64;

pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
pub const MAX_TIMEOUT_MS: u64 = 900_000;
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 262_144;
pub const MAX_OUTPUT_BYTES: u64 = 262_144;
pub const MAX_DESCRIPTION_BYTES: usize = 1024;
pub const MAX_PIPELINE_BYTES: usize = 65_536;

/// `[A-Za-z0-9._-]{1,64}` as `sbx mcp load --sandbox` accepts it, without a leading
/// `-` (another sbx could read one as a flag).
pub fn valid_sandbox_name(name: &str) -> bool {
    (1..=MAX_SANDBOX_NAME).contains(&name.len())
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The default description of a pipeline published from `workspace_name`.
pub fn default_description(workspace_name: &str) -> String {
    format!(
        "Runs a fixed pipeline in the marsh project {workspace_name}; the input argument is its stdin."
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn sandbox_names() {
        assert!(valid_sandbox_name("dev-1.x_y"));
        assert!(!valid_sandbox_name(""));
        assert!(!valid_sandbox_name("a b"));
        assert!(!valid_sandbox_name("--help"));
        assert!(!valid_sandbox_name(&"s".repeat(65)));
    }
}
