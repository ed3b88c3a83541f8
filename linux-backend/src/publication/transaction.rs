//! The three transactions, each under the control directory's lock.
//!
//! Classification invariant: every step before the first effect (declaration write,
//! revocation marker, sbx load) fails as `rejected_before_effect`; every failure after
//! one is `uncertain`. A load never repairs anything: a revoked, missing, foreign, stale
//! or modified publication is refused as it is.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::control::{self, ControlDir};
use super::declaration::{self, Declaration, Identity};
use super::names::{PublisherKey, default_description, legacy_server_for};
use super::sbx::{Registration, Sbx};
use super::trust;
use super::{Outcome, PublicationAnswer, PublicationRequest, PublicationResult, Settings, TxError};
use crate::util::log;

/// Publications one publisher (workspace and home) may hold at once: its declarations
/// in the control directory. Per publisher, so no workspace can use up another's.
const MAX_PUBLICATIONS: usize = 256;

/// Who runs transactions, for which workspace and home.
#[derive(Debug, Clone)]
pub struct Publisher {
    pub settings: Settings,
    /// Canonical.
    pub workspace: PathBuf,
    /// Canonical when it exists.
    pub home: PathBuf,
    /// Only the daemon, serving its project shell, may publish.
    pub may_publish: bool,
}

/// What a transaction learnt on its way, reported whatever its outcome.
#[derive(Debug, Default)]
struct Known {
    generation: Option<String>,
    sandbox: Option<String>,
}

/// The absolute paths a registration names.
struct Programs {
    marsh_mcp: String,
    marsh: String,
    sbx: PathBuf,
}

impl Publisher {
    /// Runs one request to its answer (validating it again: the request may come
    /// from a sandbox).
    pub fn execute(&self, request: &PublicationRequest) -> PublicationAnswer {
        let name = request.tool_name();
        if let Err(problem) = request.validate() {
            let mut answer = PublicationAnswer::rejected(Some(name), problem.to_string(), true);
            if answer.result.tool_name.is_some() {
                answer.result.server = Some(self.key().server_for(name));
            }
            return answer;
        }
        let mut known = Known::default();
        let outcome = match request {
            PublicationRequest::Publish {
                tool_name,
                description,
                sandbox,
                timeout_ms,
                max_output_bytes,
                pipeline,
            } => {
                let declared = Declared {
                    name: tool_name,
                    description: description.as_deref(),
                    timeout_ms: *timeout_ms,
                    max_output_bytes: *max_output_bytes,
                    pipeline,
                };
                self.publish(&declared, sandbox.as_deref(), &mut known)
            }
            PublicationRequest::Unpublish { tool_name } => self.unpublish(tool_name, &mut known),
            PublicationRequest::Load { tool_name, sandbox } => {
                self.load(tool_name, sandbox, &mut known)
            }
        };
        let (result, reason) = match outcome {
            Ok(()) => (Outcome::Committed, None),
            Err(TxError::Rejected(reason)) => (Outcome::RejectedBeforeEffect, Some(reason)),
            Err(TxError::Uncertain(reason)) => (Outcome::Uncertain, Some(reason)),
        };
        PublicationAnswer {
            result: PublicationResult {
                result,
                tool_name: Some(name.to_string()),
                server: Some(self.key().server_for(name)),
                generation: known.generation,
                sandbox: known.sandbox.filter(|_| result == Outcome::Committed),
                reason,
            },
            usage: false,
        }
    }

    fn publish(
        &self,
        declared: &Declared<'_>,
        sandbox: Option<&str>,
        known: &mut Known,
    ) -> Result<(), TxError> {
        if !self.may_publish {
            return Err(TxError::Rejected(
                "publication needs an attached project shell: run `mcp publish ...` inside `marsh -c` (shell_run)".into(),
            ));
        }
        if is_development_scope_home(&self.home) {
            return Err(TxError::Rejected(
                "this project shell belongs to a development scope of marsh-mcp (its home sits in a scope root), and a published command must run in an ordinary marsh home: publish from a shell of `marsh-mcp serve --home H` or the legacy default (~/.marsh)".into(),
            ));
        }
        let name = declared.name;
        let server = self.key().server_for(name);
        let programs = self.programs()?;
        let control = self.control()?;
        let _lock = control.lock()?;
        if control.revocation_pending(name)? {
            return Err(pending(name));
        }
        let identity = self.identity()?;
        let path = control.declaration_path(name);
        // A name belongs to the workspace and home that published it until it is
        // unpublished there: never replace another's declaration or registration.
        match self.readable_declaration(&path, name)? {
            Some(found) => self.owned(&found, identity)?,
            // A new name: the control directory and the sbx state hold a bounded set.
            None if control.declaration_count()? >= MAX_PUBLICATIONS => {
                return Err(TxError::Rejected(format!(
                    "{MAX_PUBLICATIONS} tools are published from this workspace and home already; unpublish one first"
                )));
            }
            None => {}
        }
        let sbx = self.sbx(&programs);
        let existing = sbx
            .inspect(&server)
            .map_err(|e| TxError::Rejected(format!("cannot query sbx: {e}")))?;
        if let Some(found) = &existing
            && !self.is_ours(found, &path)
        {
            return Err(not_ours(&server));
        }
        let existed = existing.is_some();
        let generation = uuid::Uuid::new_v4().to_string();
        let args = self.registration_args(&programs, &path, Some(&generation))?;
        let declaration = declared.declaration(self, &generation, identity)?;

        declaration::write(
            control.published_dir(),
            &format!("{name}.json"),
            &declaration,
        )?;
        known.generation = Some(generation);
        let uncertain =
            |what: &str, e: &dyn std::fmt::Display| TxError::Uncertain(format!("{what}: {e}"));
        if existed {
            sbx.remove(&server)
                .map_err(|e| uncertain("removing the previous registration", &e))?;
        }
        sbx.add(&server, &programs.marsh_mcp, &args)
            .map_err(|e| uncertain("registering the server", &e))?;
        let expected = expected_registration(&programs, args);
        match sbx.inspect(&server) {
            Ok(Some(found)) if found == expected => {}
            Ok(Some(found)) => {
                return Err(TxError::Uncertain(format!(
                    "the registration read back differs from the one written: {found:?}"
                )));
            }
            Ok(None) => {
                return Err(TxError::Uncertain(
                    "the registration is missing when read back".into(),
                ));
            }
            Err(e) => return Err(uncertain("reading the registration back", &e)),
        }
        if let Some(sandbox) = sandbox {
            sbx.load(&server, sandbox).map_err(|e| {
                uncertain(
                    &format!("published, but loading into sandbox {sandbox} failed"),
                    &e,
                )
            })?;
            known.sandbox = Some(sandbox.to_string());
        }
        Ok(())
    }

    /// Unpublishes this publisher's `name`; when it has none, a publication of `name`
    /// made from this workspace and home by an earlier release (a declaration directly
    /// in `published/`, server `marsh-pub-NAME`) is revoked the same way, so an upgrade
    /// never leaves a publication that `unpublish` cannot reach.
    fn unpublish(&self, name: &str, known: &mut Known) -> Result<(), TxError> {
        let control = self.control()?;
        let server = self.key().server_for(name);
        match self.unpublish_in(&control, &server, name, known) {
            Err(TxError::Rejected(reason)) if reason == nothing_published(name) => {
                let legacy = control.legacy();
                if legacy.declaration_path(name).exists() {
                    self.unpublish_in(&legacy, &legacy_server_for(name), name, known)
                } else {
                    Err(TxError::Rejected(reason))
                }
            }
            other => other,
        }
    }

    fn unpublish_in(
        &self,
        control: &ControlDir,
        server: &str,
        name: &str,
        known: &mut Known,
    ) -> Result<(), TxError> {
        let sbx_path = self.trusted_sbx()?;
        let path = control.declaration_path(name);
        // Marked before waiting for the lock: a load or republish holding it, or taking
        // it first, finds the marker when it looks and is refused, and a wait that
        // times out leaves the marker for the retried unpublish. Only this publisher's
        // own declaration is marked (read without the lock: it is replaced by rename,
        // so it is whole), so no workspace can block another's name.
        let marked = match declaration::read(&path, name) {
            Ok(Some(found))
                if found
                    .check_owner(&self.workspace, self.identity()?, &self.home)
                    .is_ok() =>
            {
                control.mark_revocation(name)?;
                true
            }
            _ => false,
        };
        let _lock = control.lock().map_err(|e| match e {
            TxError::Rejected(reason) if marked => TxError::Uncertain(format!(
                "{reason}; the revocation of {name} is pending (loads and republishes are refused until it finishes): run `mcp unpublish {name}` again"
            )),
            other => other,
        })?;
        let declared = self.readable_declaration(&path, name)?;
        if let Some(found) = &declared {
            self.owned(found, self.identity()?)?;
            known.generation = found.publication_generation.clone();
        }
        let sbx = Sbx {
            program: &sbx_path,
            env: &self.settings.sbx_env,
            cwd: Path::new("/"),
        };
        let registered = sbx
            .inspect(server)
            .map_err(|e| TxError::Rejected(format!("cannot query sbx: {e}")))?;
        // Only this publication's registration is removed; one that another party put
        // under the server name stays as it is.
        let ours = registered.as_ref().is_some_and(|r| self.is_ours(r, &path));
        if declared.is_none() && !ours && !control.revocation_pending(name)? {
            return Err(TxError::Rejected(nothing_published(name)));
        }

        control.mark_revocation(name)?;
        let uncertain = |what: &str, e: &dyn std::fmt::Display| {
            TxError::Uncertain(format!(
                "{what}: {e}; the revocation stays pending (run unpublish again)"
            ))
        };
        if ours {
            sbx.remove(server)
                .map_err(|e| uncertain("removing the registration", &e))?;
        }
        control
            .remove_declaration(name)
            .map_err(|e| uncertain("removing the declaration", &e))?;
        control
            .clear_revocation(name)
            .map_err(|e| TxError::Uncertain(format!("unpublished, but {e}")))
    }

    fn load(&self, name: &str, sandbox: &str, known: &mut Known) -> Result<(), TxError> {
        let server = self.key().server_for(name);
        let programs = self.programs()?;
        let control = self.control()?;
        let _lock = control.lock()?;
        if control.revocation_pending(name)? {
            return Err(pending(name));
        }
        let path = control.declaration_path(name);
        let found = self
            .readable_declaration(&path, name)?
            .ok_or_else(|| TxError::Rejected(format!("{name} is not published")))?;
        self.owned(&found, self.identity()?)?;
        known.generation = found.publication_generation.clone();
        let args =
            self.registration_args(&programs, &path, found.publication_generation.as_deref())?;
        let expected = expected_registration(&programs, args);
        let sbx = self.sbx(&programs);
        match sbx.inspect(&server) {
            Ok(Some(registered)) if registered == expected => {}
            Ok(Some(_)) => {
                return Err(TxError::Rejected(format!(
                    "the sbx server {server} does not match the declaration: stale or modified registration; republish"
                )));
            }
            Ok(None) => {
                return Err(TxError::Rejected(format!(
                    "the sbx server {server} is not registered: stale or modified registration; republish"
                )));
            }
            Err(e) => return Err(TxError::Rejected(format!("cannot query sbx: {e}"))),
        }
        sbx.load(&server, sandbox)
            .map_err(|e| TxError::Uncertain(format!("loading into sandbox {sandbox}: {e}")))?;
        known.sandbox = Some(sandbox.to_string());
        Ok(())
    }

    /// The declaration at `path`, `None` when absent; unreadable or malformed is a
    /// rejection (it is not provably anyone's, so nothing is done on top of it).
    fn readable_declaration(
        &self,
        path: &Path,
        name: &str,
    ) -> Result<Option<Declaration>, TxError> {
        declaration::read(path, name).map_err(|problem| {
            log!("marsh: publication of {name}: {problem}");
            TxError::Rejected(format!(
                "the declaration of {name} is unreadable or malformed; check the control directory (the daemon log names it) and remove it by hand"
            ))
        })
    }

    /// `found` was published from this workspace and home; the refusal names neither
    /// (the caller may be a job: another workspace's path is not its business).
    fn owned(&self, found: &Declaration, identity: Identity) -> Result<(), TxError> {
        found
            .check_owner(&self.workspace, identity, &self.home)
            .map_err(|problem| {
                log!("marsh: publication: {problem}");
                TxError::Rejected(format!(
                    "{} is published from another workspace or marsh home; unpublish it there first",
                    found.tool_name
                ))
            })
    }

    /// A registration of this publication, any generation: `export-serve` with this
    /// workspace, home and declaration.
    fn is_ours(&self, registration: &Registration, declaration: &Path) -> bool {
        let expected = [
            Some("export-serve"),
            Some("--workspace"),
            self.workspace.to_str(),
            Some("--home"),
            self.home.to_str(),
            Some("--declaration"),
            declaration.to_str(),
        ];
        registration.args.len() > expected.len()
            && expected
                .iter()
                .zip(&registration.args)
                .all(|(want, got)| *want == Some(got.as_str()))
    }

    /// Whose publications these are: names, servers and the cap are per publisher.
    fn key(&self) -> PublisherKey {
        PublisherKey::of(&self.workspace, &self.home)
    }

    fn control(&self) -> Result<ControlDir, TxError> {
        let base = self
            .settings
            .control_base
            .clone()
            .map_err(|e| TxError::Rejected(e.to_string()))?;
        control::open(&base, &self.home, &self.workspace)
    }

    fn identity(&self) -> Result<Identity, TxError> {
        let meta = std::fs::metadata(&self.workspace).map_err(|e| {
            TxError::Rejected(format!(
                "cannot inspect the workspace {}: {e}",
                self.workspace.display()
            ))
        })?;
        Ok(Identity {
            device: meta.dev(),
            inode: meta.ino(),
        })
    }

    fn sbx<'a>(&'a self, programs: &'a Programs) -> Sbx<'a> {
        Sbx {
            program: &programs.sbx,
            env: &self.settings.sbx_env,
            // Not the workspace: jobs write there, and an sbx must not pick up
            // configuration a job left in its working directory.
            cwd: Path::new("/"),
        }
    }

    /// The sbx plus `marsh-mcp` and `marsh` from the programs directory; refused when
    /// one is not a trusted executable there ([`trust`]).
    fn programs(&self) -> Result<Programs, TxError> {
        let sbx = self.trusted_sbx()?;
        let dir = self
            .settings
            .programs
            .clone()
            .map_err(|e| TxError::Rejected(e.to_string()))?;
        let program = |name: &str| {
            let path = dir.join(name);
            self.trusted(name, &path)?;
            utf8(&path)
        };
        Ok(Programs {
            marsh_mcp: program("marsh-mcp")?,
            marsh: program("marsh")?,
            sbx,
        })
    }

    fn trusted_sbx(&self) -> Result<PathBuf, TxError> {
        let sbx = self
            .settings
            .sbx
            .clone()
            .map_err(|e| TxError::Rejected(e.to_string()))?;
        self.trusted("sbx", &sbx)?;
        Ok(sbx)
    }

    /// Refuses a program a job could have written (the detail goes to the log only).
    fn trusted(&self, role: &str, path: &Path) -> Result<(), TxError> {
        match trust::untrusted_program(path, &self.workspace, &self.home) {
            None => Ok(()),
            Some(problem) => {
                log!("marsh: publication: {role} {}: {problem}", path.display());
                Err(TxError::Rejected(format!(
                    "the {role} this marsh would use is missing or not a trusted executable (see the log)"
                )))
            }
        }
    }

    /// `export-serve,--workspace,W,--home,H,--declaration,D[,--expected-generation,G],
    /// --marsh,M,--sbx,S`, every value free of commas (`--args` cannot express one).
    fn registration_args(
        &self,
        programs: &Programs,
        declaration: &Path,
        generation: Option<&str>,
    ) -> Result<Vec<String>, TxError> {
        let mut args: Vec<String> = vec!["export-serve".into()];
        let mut pair = |flag: &str, value: String| -> Result<(), TxError> {
            if value.contains(',') {
                return Err(TxError::Rejected(format!(
                    "{value} contains a comma, which an sbx registration cannot express"
                )));
            }
            args.extend([flag.to_string(), value]);
            Ok(())
        };
        pair("--workspace", utf8(&self.workspace)?)?;
        pair("--home", utf8(&self.home)?)?;
        pair("--declaration", utf8(declaration)?)?;
        if let Some(generation) = generation {
            pair("--expected-generation", generation.to_string())?;
        }
        pair("--marsh", programs.marsh.clone())?;
        pair("--sbx", utf8(&programs.sbx)?)?;
        Ok(args)
    }
}

/// The registration `sbx mcp inspect` must show: exactly this command and these
/// arguments, and no `dir`.
fn expected_registration(programs: &Programs, args: Vec<String>) -> Registration {
    Registration {
        command: programs.marsh_mcp.clone(),
        args,
        dir: None,
    }
}

fn not_ours(server: &str) -> TxError {
    TxError::Rejected(format!(
        "the sbx server {server} exists and is not this publication's; it was left as it is (remove it with `sbx mcp rm` if it is stale)"
    ))
}

/// Whether `home` is a development scope's: a marsh-mcp scope root keeps its binding
/// and registry side by side, and its scopes' homes directly inside it. `export-serve`
/// refuses such a home, so a registration naming it could never be launched.
fn is_development_scope_home(home: &Path) -> bool {
    home.parent().is_some_and(|root| {
        root.join("workspace.json").is_file() && root.join("scopes.json").is_file()
    })
}

fn pending(name: &str) -> TxError {
    TxError::Rejected(format!(
        "a revocation of {name} is pending: finish it with `mcp unpublish {name}`"
    ))
}

fn utf8(path: &Path) -> Result<String, TxError> {
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| TxError::Rejected(format!("{} is not UTF-8", path.display())))
}

/// What `publish` declares.
struct Declared<'a> {
    name: &'a str,
    description: Option<&'a str>,
    timeout_ms: u64,
    max_output_bytes: u64,
    pipeline: &'a str,
}

impl Declared<'_> {
    fn declaration(
        &self,
        publisher: &Publisher,
        generation: &str,
        identity: Identity,
    ) -> Result<Declaration, TxError> {
        let workspace_name = publisher
            .workspace
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Ok(Declaration {
            schema: declaration::SCHEMA.into(),
            tool_name: self.name.into(),
            description: self
                .description
                .map_or_else(|| default_description(&workspace_name), str::to_string),
            publication_generation: Some(generation.into()),
            pipeline: Some(self.pipeline.into()),
            command: None,
            input_schema: declaration::pipeline_input_schema(),
            max_output_bytes: Some(self.max_output_bytes),
            timeout_ms: Some(self.timeout_ms),
            canonical_workspace: utf8(&publisher.workspace)?,
            workspace_identity: identity,
            home: utf8(&publisher.home)?,
        })
    }
}

fn nothing_published(name: &str) -> String {
    format!("nothing is published as {name}")
}
