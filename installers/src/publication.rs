//! `install-published CLIENT NAME` / `remove-published CLIENT NAME`: a command published
//! from this workspace (`mcp publish` in the project shell) registered with a client,
//! bound to the publication's current generation. Host only.
//!
//! Install, from the publishing workspace W with the publishing home H: the stock SBX
//! registration `PublisherKey::of(W, H).server_for(NAME)` must run exactly this
//! `marsh-mcp`, with `dir` unset and the arguments `export_serve_args(W, H, D, G, M, S)`
//! — D the declaration `<control>/mcp/published/<key>/NAME.json`, M the `marsh` beside
//! this `marsh-mcp`, G the
//! generation and S the absolute sbx it pins — and the declaration must pass
//! [`marsh_publication::load`] for W, H and that same G and name NAME. Only then is the client
//! entry `SERVER → marsh-mcp <those arguments>` installed with the verified discipline
//! (read first; identical → nothing changes; different → refused untouched; absent →
//! added and read back). Any mismatch is refused before any client command.
//!
//! Remove needs neither declaration nor registration (the tool may already be
//! unpublished): it removes only an entry running this `marsh-mcp` with the
//! `export-serve` arguments of this publication (W, H, D, M) for any generation — so a
//! previous generation's entry too — and any absolute sbx.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::InstallError;
use crate::codex::{ArgsRule, Codex, Exact};
use crate::registration::{Environment, canonical, resolve_sbx, safe};
use crate::runner::Runner;
use crate::sbx::inspect_server;
use crate::verified;
use marsh_publication::{self as published, Expectation};

/// Clients a published command can be installed into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishedClient {
    Codex,
}

/// The publisher's directory below the control directory, and the declarations'.
const MCP_DIR: &str = "mcp";
const PUBLISHED_DIR: &str = "published";
/// The argument that precedes a pinned generation.
const GENERATION_FLAG: &str = "--expected-generation";

fn passwd_home() -> Option<PathBuf> {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|user| user.dir)
        .filter(|dir| dir.is_absolute())
}

/// The stand-in's control directory: `$MARSH_CONTROL_HOME` when absolute, else
/// `<passwd home of the euid>/.local/state/marsh-control` (never `$HOME`).
fn control_dir(env: &Environment) -> Result<PathBuf, InstallError> {
    env.path("MARSH_CONTROL_HOME")
        .or_else(|| passwd_home().map(|home| home.join(".local/state/marsh-control")))
        .ok_or(InstallError::NoControlDir {
            uid: nix::unistd::geteuid().as_raw(),
        })
}

/// The marsh home as marsh resolves it: `$MARSH_HOME` (made absolute against `cwd`),
/// else `$HOME/.marsh`, else the passwd home's `.marsh`; canonicalized, so it must exist.
fn marsh_home(env: &Environment, cwd: &Path) -> Result<PathBuf, InstallError> {
    let nonempty = |name| env.get(name).filter(|v| !v.is_empty());
    let home = match nonempty("MARSH_HOME") {
        Some(path) => cwd.join(path),
        None => nonempty("HOME")
            .map(PathBuf::from)
            .or_else(passwd_home)
            .ok_or(InstallError::NoHome { what: "MARSH_HOME" })?
            .join(".marsh"),
    };
    canonical("the marsh home", &home)
}

/// One publication as this workspace, home and `marsh-mcp` see it.
#[derive(Debug, Clone)]
struct Publication {
    tool: String,
    server: String,
    workspace: String,
    device: u64,
    inode: u64,
    home: String,
    /// `<control>/mcp/published/<key>/NAME.json` with `<control>/mcp` canonical (as the
    /// publisher names it) when it exists.
    declaration: String,
    marsh_mcp: String,
    marsh: String,
}

impl Publication {
    fn resolve(
        name: &str,
        env: &Environment,
        cwd: &Path,
        exe: &Path,
    ) -> Result<Self, InstallError> {
        env.refuse_guest()?;
        if !published::valid_tool_name(name) {
            return Err(InstallError::BadToolName { name: name.into() });
        }
        let workspace = canonical("the workspace", cwd)?;
        let identity = std::fs::metadata(&workspace).map_err(|source| InstallError::Resolve {
            what: "the workspace",
            path: workspace.clone(),
            source,
        })?;
        let home = marsh_home(env, cwd)?;
        let marsh_mcp = canonical("the installed marsh-mcp", exe)?;
        let marsh = canonical("the installed marsh", &marsh_mcp.with_file_name("marsh"))?;
        let key = published::PublisherKey::of(&workspace, &home);
        let mcp = control_dir(env)?.join(MCP_DIR);
        let declaration = std::fs::canonicalize(&mcp)
            .unwrap_or(mcp)
            .join(PUBLISHED_DIR)
            .join(key.as_str())
            .join(format!("{name}.json"));
        Ok(Self {
            tool: name.into(),
            server: key.server_for(name),
            workspace: safe("the workspace", &workspace)?,
            device: identity.dev(),
            inode: identity.ino(),
            home: safe("the marsh home", &home)?,
            declaration: safe("the declaration", &declaration)?,
            marsh_mcp: safe("marsh-mcp", &marsh_mcp)?,
            marsh: safe("marsh", &marsh)?,
        })
    }

    /// The `export-serve` arguments of this publication at `generation` with `sbx`.
    fn args(&self, generation: Option<&str>, sbx: &str) -> Vec<String> {
        published::export_serve_args(
            Path::new(&self.workspace),
            Path::new(&self.home),
            Path::new(&self.declaration),
            generation,
            Path::new(&self.marsh),
            Path::new(sbx),
        )
    }

    /// `args` when they are this publication's `export-serve` arguments for some
    /// generation (a lowercase UUID, or none) and some absolute sbx: that generation
    /// and sbx. Otherwise what differs.
    fn pinned<'v>(&self, args: &[&'v str]) -> Result<(Option<&'v str>, &'v str), String> {
        let generation = match args.len() {
            13 if args[7] == GENERATION_FLAG && published::valid_generation(args[8]) => {
                Some(args[8])
            }
            11 => None,
            _ => {
                return Err(format!(
                    "the arguments {args:?} are not `export-serve --workspace W --home H --declaration D [--expected-generation G] --marsh M --sbx S` with G a lowercase UUID"
                ));
            }
        };
        let sbx = args[args.len() - 1];
        if !Path::new(sbx).is_absolute() {
            return Err(format!("the pinned sbx {sbx:?} is not an absolute path"));
        }
        let expected = self.args(generation, sbx);
        match args.iter().zip(&expected).position(|(a, e)| a != e) {
            None if args.len() == expected.len() => Ok((generation, sbx)),
            Some(i) => {
                let what = match i.checked_sub(1).map(|j| expected[j].as_str()) {
                    Some(flag) if flag.starts_with("--") => format!("the {flag} value"),
                    _ => format!("argument {i}"),
                };
                Err(format!(
                    "{what} is {:?} instead of {:?}",
                    args[i], expected[i]
                ))
            }
            None => Err(format!(
                "the arguments are {args:?} instead of {expected:?}"
            )),
        }
    }

    /// The generation of a client entry that is this publication's, written by an
    /// earlier install: `export-serve` with this workspace, home and declaration, any
    /// absolute sbx, but a `marsh-mcp` and `--marsh` that may have moved since (a new
    /// install prefix). `None` when it is anything else.
    fn own_earlier_generation(&self, command: &Value, args: &Value) -> Option<Option<String>> {
        let named = |path: &str, name: &str| {
            let path = Path::new(path);
            path.is_absolute() && path.file_name().is_some_and(|f| f == name)
        };
        if !command.as_str().is_some_and(|c| named(c, "marsh-mcp")) {
            return None;
        }
        let mut args = strings(args)?;
        // The pinned marsh is the one but last value; put ours there, so the rest must
        // match exactly.
        let at = args.len().checked_sub(3)?;
        if args.get(at.checked_sub(1)?) != Some(&"--marsh") || !named(args[at], "marsh") {
            return None;
        }
        args[at] = self.marsh.as_str();
        let (generation, _sbx) = self.pinned(&args).ok()?;
        Some(generation.map(str::to_owned))
    }

    /// The generation and sbx of a registration (`sbx mcp inspect --json`) that runs
    /// this `marsh-mcp` with this publication's arguments and no `dir`; else what differs.
    fn matching_registration(&self, found: &Value) -> Result<(Option<String>, String), String> {
        if found["command"].as_str() != Some(self.marsh_mcp.as_str()) {
            return Err(format!(
                "the command is {} instead of {}",
                found["command"], self.marsh_mcp
            ));
        }
        if !found["dir"].is_null() {
            return Err(format!("dir is {} instead of unset", found["dir"]));
        }
        let args = strings(&found["args"])
            .ok_or_else(|| format!("the arguments are {}, not a list of strings", found["args"]))?;
        let (generation, sbx) = self.pinned(&args)?;
        Ok((generation.map(str::to_owned), sbx.to_owned()))
    }

    /// The declaration path once it is known to exist (`load` checks everything else).
    fn existing_declaration(&self) -> Result<&Path, InstallError> {
        let path = Path::new(&self.declaration);
        if std::fs::symlink_metadata(path).is_err() {
            return Err(InstallError::NotPublished {
                tool: self.tool.clone(),
                path: path.to_owned(),
            });
        }
        Ok(path)
    }
}

fn strings(value: &Value) -> Option<Vec<&str>> {
    value.as_array()?.iter().map(Value::as_str).collect()
}

/// A removal rule: any generation's `export-serve` arguments of one publication.
struct AnyGeneration<'a>(&'a Publication);

impl ArgsRule for AnyGeneration<'_> {
    fn difference(&self, found: &Value) -> Option<String> {
        let Some(args) = strings(found) else {
            return Some(format!("transport.args is {found}, not a list of strings"));
        };
        self.0
            .pinned(&args)
            .err()
            .map(|difference| format!("transport.args: {difference}"))
    }
}

/// `marsh-mcp install-published CLIENT NAME`, run from the publishing workspace.
pub fn install_published(
    client: PublishedClient,
    name: &str,
    env: &Environment,
    cwd: &Path,
    exe: &Path,
    runner: &dyn Runner,
) -> Result<String, InstallError> {
    let p = Publication::resolve(name, env, cwd, exe)?;
    let declaration = p.existing_declaration()?;
    let sbx = resolve_sbx(env)?;
    let workspace = Path::new(&p.workspace);
    let found = inspect_server(&sbx, workspace, &p.server, env, runner)?.ok_or_else(|| {
        InstallError::NotRegistered {
            server: p.server.clone(),
            tool: p.tool.clone(),
        }
    })?;
    let (generation, pinned_sbx) = p.matching_registration(&found).map_err(|difference| {
        InstallError::RegistrationMismatch {
            server: p.server.clone(),
            tool: p.tool.clone(),
            difference,
        }
    })?;
    let expect = Expectation {
        workspace,
        workspace_device: p.device,
        workspace_inode: p.inode,
        home: Path::new(&p.home),
        generation: generation.as_deref(),
    };
    let loaded =
        published::load(declaration, &expect).map_err(|source| InstallError::Declaration {
            tool: p.tool.clone(),
            source,
        })?;
    if loaded.declaration.tool_name != p.tool {
        return Err(InstallError::DeclarationNames {
            tool: p.tool.clone(),
            path: declaration.to_owned(),
            found: loaded.declaration.tool_name,
        });
    }
    let detail = format!(
        "published tool {}, generation {}",
        p.tool,
        generation.as_deref().unwrap_or("none")
    );
    let args = Exact(p.args(generation.as_deref(), &pinned_sbx));
    match client {
        PublishedClient::Codex => {
            // An entry of this generation whose marsh-mcp or marsh moved is ours to
            // replace; another generation's is refused until it is removed.
            let same_generation = |command: &Value, args: &Value| {
                p.own_earlier_generation(command, args).as_ref() == Some(&generation)
            };
            let store = Codex::new(env, runner, workspace, &p.server, &p.marsh_mcp, args)?
                .replacing(same_generation);
            verified::install_entry(&store, &p.server, &detail)
        }
    }
}

/// `marsh-mcp remove-published CLIENT NAME`: removes only this publication's entry
/// (any generation, wherever its marsh-mcp and marsh were installed).
pub fn remove_published(
    client: PublishedClient,
    name: &str,
    env: &Environment,
    cwd: &Path,
    exe: &Path,
    runner: &dyn Runner,
) -> Result<String, InstallError> {
    let p = Publication::resolve(name, env, cwd, exe)?;
    let workspace = Path::new(&p.workspace);
    match client {
        PublishedClient::Codex => {
            let rule = AnyGeneration(&p);
            let store = Codex::new(env, runner, workspace, &p.server, &p.marsh_mcp, rule)?
                .replacing(|command, args| p.own_earlier_generation(command, args).is_some());
            verified::uninstall_entry(&store, &p.server)
        }
    }
}

#[cfg(test)]
#[path = "publication_tests.rs"]
mod tests;
