//! Names and default locations derived from the canonical workspace. Every client
//! registration and root of one workspace uses these, so they must agree everywhere.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Lowercase hex sha256 of the canonical workspace path bytes.
pub fn workspace_hash(canonical: &Path) -> String {
    hex::encode(Sha256::digest(canonical.as_os_str().as_encoded_bytes()))
}

/// The name clients register: `marsh-dev-` + the first 12 hex of the workspace hash
/// (keeps `mcp__<server>__<tool>` under 64 characters).
pub fn server_name(workspace_hash: &str) -> String {
    format!(
        "marsh-dev-{}",
        workspace_hash.get(..12).unwrap_or(workspace_hash)
    )
}

/// The operating systems whose default scope base differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostOs {
    /// `~/Library/Application Support/marsh-mcp-scopes`.
    MacOs,
    /// Linux and every other Unix: `${XDG_STATE_HOME:-~/.local/state}/marsh-mcp-scopes`.
    Other,
}

impl HostOs {
    /// The system this binary was built for.
    pub const fn current() -> Self {
        if cfg!(target_os = "macos") {
            Self::MacOs
        } else {
            Self::Other
        }
    }
}

/// The base of generated scope roots on this system; see [`scopes_base_for`].
pub fn scopes_base(lookup: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    scopes_base_for(HostOs::current(), lookup)
}

/// The base of generated scope roots on `os`: `$MARSH_CONTROL_HOME-mcp-scopes` when that
/// is set (every system); else on macOS `$HOME/Library/Application Support/marsh-mcp-scopes`,
/// elsewhere `${XDG_STATE_HOME:-$HOME/.local/state}/marsh-mcp-scopes`. `lookup` returns
/// only absolute values.
pub fn scopes_base_for(os: HostOs, lookup: impl Fn(&str) -> Option<PathBuf>) -> Option<PathBuf> {
    if let Some(control) = lookup("MARSH_CONTROL_HOME") {
        let mut name = control.into_os_string();
        name.push("-mcp-scopes");
        return Some(PathBuf::from(name));
    }
    match os {
        HostOs::MacOs => {
            lookup("HOME").map(|home| home.join("Library/Application Support/marsh-mcp-scopes"))
        }
        HostOs::Other => {
            if let Some(state) = lookup("XDG_STATE_HOME") {
                return Some(state.join("marsh-mcp-scopes"));
            }
            lookup("HOME").map(|home| home.join(".local/state/marsh-mcp-scopes"))
        }
    }
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

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<PathBuf> + 'a {
        move |k| {
            vars.iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| PathBuf::from(v))
        }
    }

    #[test]
    fn the_scopes_base_follows_the_os_and_the_control_home_overrides_it() {
        let home = [("HOME", "/Users/u")];
        assert_eq!(
            scopes_base_for(HostOs::MacOs, env(&home)),
            Some(PathBuf::from(
                "/Users/u/Library/Application Support/marsh-mcp-scopes"
            ))
        );
        assert_eq!(
            sbx_client_root(&scopes_base_for(HostOs::MacOs, env(&home)).unwrap(), "ab"),
            PathBuf::from("/Users/u/Library/Application Support/marsh-mcp-scopes/clients/sbx/ab")
        );
        // XDG_STATE_HOME is a Linux convention: macOS ignores it.
        let xdg = [("HOME", "/h"), ("XDG_STATE_HOME", "/s")];
        assert_eq!(
            scopes_base_for(HostOs::MacOs, env(&xdg)),
            Some(PathBuf::from(
                "/h/Library/Application Support/marsh-mcp-scopes"
            ))
        );
        assert_eq!(
            scopes_base_for(HostOs::Other, env(&xdg)),
            Some(PathBuf::from("/s/marsh-mcp-scopes"))
        );
        assert_eq!(
            scopes_base_for(HostOs::Other, env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.local/state/marsh-mcp-scopes"))
        );
        // MARSH_CONTROL_HOME wins on every system.
        let control = [
            ("HOME", "/h"),
            ("XDG_STATE_HOME", "/s"),
            ("MARSH_CONTROL_HOME", "/c/ctl"),
        ];
        for os in [HostOs::MacOs, HostOs::Other] {
            assert_eq!(
                scopes_base_for(os, env(&control)),
                Some(PathBuf::from("/c/ctl-mcp-scopes"))
            );
            assert_eq!(scopes_base_for(os, env(&[])), None);
        }
        // The compiled-in branch: macOS only on macOS; Linux unchanged.
        assert_eq!(
            HostOs::current() == HostOs::MacOs,
            cfg!(target_os = "macos")
        );
        assert_eq!(
            scopes_base(env(&xdg)),
            scopes_base_for(HostOs::current(), env(&xdg))
        );
        #[cfg(not(target_os = "macos"))]
        assert_eq!(
            scopes_base(env(&xdg)),
            Some(PathBuf::from("/s/marsh-mcp-scopes"))
        );
    }
}
