//! What a registration pins: the canonical workspace, the installed `marsh-mcp`, its
//! sibling `marsh`, the resolved sbx, and the client's private scope root.

use std::path::{Path, PathBuf};

use serde_json::Value;

use marsh_scope_registry::{sbx_client_root, scopes_base, server_name, workspace_hash};

use crate::InstallError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    Codex,
    Claude,
    Sbx,
}

impl Client {
    pub fn name(self) -> &'static str {
        match self {
            Self::Codex => "codex",
            Self::Claude => "claude",
            Self::Sbx => "sbx",
        }
    }
}

/// Variables whose presence means this process runs inside a marsh guest (a project
/// shell or Kit job), where host registration must not happen.
const GUEST_MARKERS: &[&str] = &[
    "MARSH_GUEST",
    "MARSH_DAEMON_SOCKET",
    "MARSH_DAEMON_TOKEN",
    "MARSHD_SOCKET",
    "MARSHD_TOKEN",
];

/// The caller's environment, as read once.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    vars: Vec<(String, String)>,
}

impl Environment {
    pub fn new(vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>) -> Self {
        Self {
            vars: vars
                .into_iter()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// An absolute path from the environment, or `None`.
    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.get(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    }

    pub fn refuse_guest(&self) -> Result<(), InstallError> {
        match GUEST_MARKERS.iter().find(|m| self.get(m).is_some()) {
            Some(variable) => Err(InstallError::InsideGuest { variable }),
            None => Ok(()),
        }
    }

    /// `program` on `$PATH`, canonicalized.
    pub fn which(&self, program: &str) -> Option<PathBuf> {
        self.found_in(program)
            .and_then(|dir| std::fs::canonicalize(dir.join(program)).ok())
    }

    /// The `$PATH` directory `program` is found in (as written there, not resolved:
    /// an npm client's link sits beside the `node` it runs with).
    pub fn found_in(&self, program: &str) -> Option<PathBuf> {
        self.get("PATH")?
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(PathBuf::from)
            .find(|d| d.join(program).is_file())
    }

    /// The explicit environment a client CLI gets, built like the server's children's:
    /// - `PATH` fixed ([`CLIENT_PATH`]), after `program_dir`, the directory the client
    ///   was found in, so a `#!/usr/bin/env node` client finds the node installed
    ///   beside it;
    /// - `USER` and `LOGNAME` from the passwd entry of the effective uid (never the
    ///   caller's);
    /// - on purpose from the caller: `HOME` and the `extra` names (where each client
    ///   keeps its configuration: `CODEX_HOME`, `CLAUDE_CONFIG_DIR`, the sbx state
    ///   variables), and `LANG`, `TERM`; each only when set.
    ///
    /// Nothing else is inherited.
    pub fn for_client(&self, program_dir: Option<&Path>, extra: &[&str]) -> Vec<(String, String)> {
        let path = match program_dir.and_then(Path::to_str) {
            Some(dir) if !CLIENT_PATH.split(':').any(|d| d == dir) => {
                format!("{dir}:{CLIENT_PATH}")
            }
            _ => CLIENT_PATH.to_string(),
        };
        let mut vars = vec![("PATH".to_string(), path)];
        if let Some(name) = passwd_name() {
            vars.push(("USER".to_string(), name.clone()));
            vars.push(("LOGNAME".to_string(), name));
        }
        vars.extend(
            ["HOME", "LANG", "TERM"]
                .iter()
                .chain(extra)
                .filter_map(|k| self.get(k).map(|v| ((*k).to_string(), v.to_string()))),
        );
        vars
    }
}

/// The system part of every client's `PATH`: the same as the server's children's.
pub const CLIENT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The passwd name of the effective uid, when it has one that is valid UTF-8.
fn passwd_name() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|user| user.name)
}

/// One client's registration of this workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub client: Client,
    pub name: String,
    pub workspace: String,
    pub marsh_mcp: String,
    pub marsh: String,
    pub sbx: String,
    pub root: String,
}

pub(crate) fn canonical(what: &'static str, path: &Path) -> Result<PathBuf, InstallError> {
    std::fs::canonicalize(path).map_err(|source| InstallError::Resolve {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Registered values travel through `sbx --args` (comma-separated) and client configs.
pub(crate) fn safe(what: &'static str, path: &Path) -> Result<String, InstallError> {
    match path.to_str() {
        Some(s) if !s.contains(',') => Ok(s.to_owned()),
        _ => Err(InstallError::UnsafeValue {
            what,
            value: path.to_string_lossy().into_owned(),
        }),
    }
}

/// The private scope root a client's registration of the workspace with hash
/// `workspace_hash` uses (docs/scopes.md). Export mode refuses a home inside one of them.
pub fn generated_root(
    client: Client,
    env: &Environment,
    workspace_hash: &str,
) -> Result<PathBuf, InstallError> {
    let home = || env.path("HOME");
    Ok(match client {
        Client::Codex => env
            .path("CODEX_HOME")
            .or_else(|| home().map(|h| h.join(".codex")))
            .ok_or(InstallError::NoHome { what: "CODEX_HOME" })?
            .join("marsh/dev-mcp/codex")
            .join(workspace_hash),
        Client::Claude => env
            .path("CLAUDE_CONFIG_DIR")
            .or_else(|| home().map(|h| h.join(".claude")))
            .ok_or(InstallError::NoHome {
                what: "CLAUDE_CONFIG_DIR",
            })?
            .join("marsh/dev-mcp/claude")
            .join(workspace_hash),
        Client::Sbx => sbx_client_root(
            &scopes_base(|k| env.path(k)).ok_or(InstallError::NoHome {
                what: "the SBX scope root",
            })?,
            workspace_hash,
        ),
    })
}

/// The sbx to drive: `$MARSH_SBX`, else `sbx` on `PATH`, canonicalized.
pub(crate) fn resolve_sbx(env: &Environment) -> Result<PathBuf, InstallError> {
    let source = match env.path("MARSH_SBX") {
        Some(path) => path,
        None => env.which("sbx").ok_or(InstallError::MissingClient {
            client: "sbx",
            hint: "set MARSH_SBX to the sbx executable or put sbx on PATH",
        })?,
    };
    canonical("the sbx executable", &source)
}

impl Registration {
    /// Resolves every pinned value. `cwd` is the workspace; `exe` the running marsh-mcp.
    pub fn resolve(
        client: Client,
        env: &Environment,
        cwd: &Path,
        exe: &Path,
    ) -> Result<Self, InstallError> {
        env.refuse_guest()?;
        let workspace = canonical("the workspace", cwd)?;
        let hash = workspace_hash(&workspace);
        let marsh_mcp = canonical("the installed marsh-mcp", exe)?;
        let marsh = canonical("the installed marsh", &marsh_mcp.with_file_name("marsh"))?;
        let sbx = resolve_sbx(env)?;
        let root = generated_root(client, env, &hash)?;
        Ok(Self {
            client,
            name: server_name(&hash),
            workspace: safe("the workspace", &workspace)?,
            marsh_mcp: safe("marsh-mcp", &marsh_mcp)?,
            marsh: safe("marsh", &marsh)?,
            sbx: safe("sbx", &sbx)?,
            root: safe("the scope root", &root)?,
        })
    }

    /// The arguments after the program: `<verb> --workspace W --scope-root R --marsh M --sbx S`.
    pub fn args(&self, verb: &str) -> Vec<String> {
        self.args_after(&[verb])
    }

    /// What a Codex or Claude registration launches: `connect --start --workspace W
    /// --scope-root R --marsh M --sbx S`, a proxy to the root's broker (started on
    /// demand, exiting when idle), so any number of sessions share one workspace.
    pub fn client_args(&self) -> Vec<String> {
        self.args_after(&["connect", "--start"])
    }

    /// What the previous release registered with Codex and Claude (a direct `serve`),
    /// one of the earlier forms [`Registration::is_own_earlier`] recognises; the tests
    /// build that entry.
    #[cfg(test)]
    pub(crate) fn previous_client_args(&self) -> Vec<String> {
        self.args("serve")
    }

    /// Whether `command` and `args` are an earlier registration of this workspace by
    /// marsh-mcp itself: the current `connect --start` shape or the previous release's
    /// `serve`, with this workspace and root, but pinning a `marsh-mcp`, `marsh` and
    /// `sbx` that have moved since (an sbx upgrade, a new install prefix). Such an entry
    /// is ours to replace or remove; anything else under the name is not.
    pub fn is_own_earlier(&self, command: &Value, args: &Value) -> bool {
        let file_named = |path: &str, name: &str| {
            let path = Path::new(path);
            path.is_absolute() && path.file_name().is_some_and(|f| f == name)
        };
        let Some(args) = args
            .as_array()
            .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<&str>>>())
        else {
            return false;
        };
        let pinned = match args.as_slice() {
            ["connect", "--start", rest @ ..] | ["serve", rest @ ..] => rest,
            _ => return false,
        };
        command.as_str().is_some_and(|c| file_named(c, "marsh-mcp"))
            && matches!(
                pinned,
                ["--workspace", workspace, "--scope-root", root, "--marsh", marsh, "--sbx", sbx]
                    if *workspace == self.workspace
                        && *root == self.root
                        && file_named(marsh, "marsh")
                        && Path::new(sbx).is_absolute()
            )
    }

    fn args_after(&self, verbs: &[&str]) -> Vec<String> {
        verbs
            .iter()
            .copied()
            .chain([
                "--workspace",
                &self.workspace,
                "--scope-root",
                &self.root,
                "--marsh",
                &self.marsh,
                "--sbx",
                &self.sbx,
            ])
            .map(str::to_string)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_guests_and_commas() {
        let env = Environment::new([("MARSHD_TOKEN".into(), "x".into())]);
        assert!(matches!(
            env.refuse_guest(),
            Err(InstallError::InsideGuest { .. })
        ));
        assert!(safe("x", Path::new("/a,b")).is_err());
        assert_eq!(safe("x", Path::new("/a/b")).unwrap(), "/a/b");
    }

    #[test]
    fn our_earlier_entries_are_recognised_by_shape_workspace_and_root() {
        use serde_json::json;
        let reg = crate::test_support::sample(Client::Codex);
        let moved = |verbs: &[&str], workspace: &str, root: &str, marsh: &str| {
            let mut args: Vec<&str> = verbs.to_vec();
            args.extend([
                "--workspace",
                workspace,
                "--scope-root",
                root,
                "--marsh",
                marsh,
                "--sbx",
                "/opt/sbx-1.1/bin/sbx",
            ]);
            json!(args)
        };
        let ours = |command: &str, args: &Value| reg.is_own_earlier(&json!(command), args);
        let (ws, root) = ("/work/ws", "/state/root");
        // Pins moved (an sbx upgrade, a new prefix), either shape: ours.
        assert!(ours(
            "/new/bin/marsh-mcp",
            &moved(&["connect", "--start"], ws, root, "/new/bin/marsh")
        ));
        assert!(ours(
            "/old/marsh-mcp",
            &moved(&["serve"], ws, root, "/old/marsh")
        ));
        // Another workspace or root, another program, another shape, a relative pin,
        // or anything added: not ours.
        assert!(!ours(
            "/new/bin/marsh-mcp",
            &moved(&["serve"], "/other", root, "/x/marsh")
        ));
        assert!(!ours(
            "/new/bin/marsh-mcp",
            &moved(&["serve"], ws, "/other", "/x/marsh")
        ));
        assert!(!ours(
            "/usr/bin/evil",
            &moved(&["serve"], ws, root, "/x/marsh")
        ));
        assert!(!ours(
            "/x/marsh-mcp",
            &moved(&["export-serve"], ws, root, "/x/marsh")
        ));
        assert!(!ours("/x/marsh-mcp", &moved(&["serve"], ws, root, "marsh")));
        assert!(!ours("marsh-mcp", &moved(&["serve"], ws, root, "/x/marsh")));
        let mut extra = moved(&["serve"], ws, root, "/x/marsh");
        extra
            .as_array_mut()
            .unwrap()
            .push(json!("--allow-full-sbx-control"));
        assert!(!ours("/x/marsh-mcp", &extra));
        assert!(!ours("/x/marsh-mcp", &json!("serve")));
    }
}
