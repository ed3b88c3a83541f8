//! Names and default locations derived from the canonical workspace. Every client
//! registration and root of one workspace uses these, so they must agree everywhere.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Lowercase hex sha256 of the canonical workspace path bytes.
pub fn workspace_hash(canonical: &Path) -> String {
    format!(
        "{:x}",
        Sha256::digest(canonical.as_os_str().as_encoded_bytes())
    )
}

/// The name clients register: `marsh-dev-` + the first 12 hex of the workspace hash
/// (keeps `mcp__<server>__<tool>` under 64 characters).
pub fn server_name(workspace_hash: &str) -> String {
    format!(
        "marsh-dev-{}",
        workspace_hash.get(..12).unwrap_or(workspace_hash)
    )
}

/// The base of generated scope roots: `$MARSH_CONTROL_HOME-mcp-scopes` when that is set,
/// else `${XDG_STATE_HOME:-$HOME/.local/state}/marsh-mcp-scopes`. `lookup` returns only
/// absolute values.
pub fn scopes_base(lookup: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    if let Some(control) = lookup("MARSH_CONTROL_HOME") {
        let mut name = control.into_os_string();
        name.push("-mcp-scopes");
        return Some(PathBuf::from(name));
    }
    if let Some(state) = lookup("XDG_STATE_HOME") {
        return Some(state.join("marsh-mcp-scopes"));
    }
    lookup("HOME").map(|home| home.join(".local/state/marsh-mcp-scopes"))
}

/// The SBX/broker registration's root: `<base>/clients/sbx/<hash>`.
pub fn sbx_client_root(base: &Path, workspace_hash: &str) -> PathBuf {
    base.join("clients/sbx").join(workspace_hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_roots() {
        let hash = workspace_hash(Path::new("/"));
        assert_eq!(
            hash,
            "8a5edab282632443219e051e4ade2d1d5bbc671c781051bf1437897cbdfea0f1"
        );
        assert_eq!(server_name(&hash), "marsh-dev-8a5edab28263");
        let base = scopes_base(|k| (k == "HOME").then(|| PathBuf::from("/h"))).unwrap();
        assert_eq!(
            sbx_client_root(&base, "ab"),
            PathBuf::from("/h/.local/state/marsh-mcp-scopes/clients/sbx/ab")
        );
        let control =
            scopes_base(|k| (k == "MARSH_CONTROL_HOME").then(|| PathBuf::from("/c/ctl"))).unwrap();
        assert_eq!(control, PathBuf::from("/c/ctl-mcp-scopes"));
    }
}
