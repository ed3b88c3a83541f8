//! Codex, through its CLI: `codex mcp get NAME --json`, `codex mcp add NAME -- …`,
//! `codex mcp remove NAME`. `codex mcp add` silently overwrites and drops unknown keys,
//! so an existing entry is read first and only an identical one is accepted.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::InstallError;
use crate::registration::{Environment, Registration};
use crate::runner::{ClientCommand, Runner};
use crate::verified::{ClientStore, ClientWriter};

const CODEX_TIMEOUT: Duration = Duration::from_secs(60);

fn codex_binary(env: &Environment) -> Result<PathBuf, InstallError> {
    env.which("codex").ok_or(InstallError::MissingClient {
        client: "codex",
        hint: "install the Codex CLI (npm install -g @openai/codex) and make sure `codex` is on PATH",
    })
}

fn codex(program: &Path, cwd: &Path, env: &Environment, args: &[&str]) -> ClientCommand {
    let vars = env.for_client(env.found_in("codex").as_deref(), &["CODEX_HOME"]);
    ClientCommand::new(program, cwd, vars, CODEX_TIMEOUT).args(args.iter().copied())
}

/// The entry `name` as `codex mcp get --json` shows it, or `None` when absent.
fn get(
    program: &Path,
    cwd: &Path,
    name: &str,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<Option<Value>, InstallError> {
    let command = codex(program, cwd, env, &["mcp", "get", name, "--json"]);
    let done = command.run(runner)?;
    if done.ok() {
        return serde_json::from_str(&done.stdout).map(Some).map_err(|e| {
            InstallError::Unparseable {
                command: command.display(),
                reason: e.to_string(),
            }
        });
    }
    if done
        .stderr
        .contains(&format!("No MCP server named '{name}' found"))
    {
        return Ok(None);
    }
    Err(command.failure(&done))
}

fn is_default(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Which `transport.args` an entry may carry.
pub(crate) trait ArgsRule {
    /// What is wrong with `found` (the entry's `transport.args`), or `None`.
    fn difference(&self, found: &Value) -> Option<String>;
}

/// Exactly these arguments: the ones `add` writes.
pub(crate) struct Exact(pub Vec<String>);

impl ArgsRule for Exact {
    fn difference(&self, found: &Value) -> Option<String> {
        let expected = json!(self.0);
        (*found != expected).then(|| format!("transport.args is {found} instead of {expected}"))
    }
}

/// What differs from the expected definition: a stdio server running exactly
/// `command` with arguments `args` accepts, enabled, with nothing else configured.
fn difference(command: &str, args: &dyn ArgsRule, found: &Value) -> Option<String> {
    let transport = &found["transport"];
    for (key, expected) in [("type", json!("stdio")), ("command", json!(command))] {
        if transport[key] != expected {
            return Some(format!(
                "transport.{key} is {} instead of {expected}",
                transport[key]
            ));
        }
    }
    args.difference(&transport["args"])
        .or_else(|| settings_difference(found))
}

/// What differs in everything but the command and its arguments: a stdio server,
/// enabled, with nothing else configured.
fn settings_difference(found: &Value) -> Option<String> {
    let transport = &found["transport"];
    if transport["type"] != json!("stdio") {
        return Some(format!(
            "transport.type is {} instead of \"stdio\"",
            transport["type"]
        ));
    }
    if let Some(extra) = transport.as_object().and_then(|t| {
        t.iter()
            .find(|(k, v)| !["type", "command", "args"].contains(&k.as_str()) && !is_default(v))
    }) {
        return Some(format!("transport.{} is set to {}", extra.0, extra.1));
    }
    if found["enabled"] != json!(true) {
        return Some("the entry is disabled".into());
    }
    found.as_object().and_then(|o| {
        o.iter()
            .find(|(k, v)| {
                !["name", "enabled", "transport"].contains(&k.as_str()) && !is_default(v)
            })
            .map(|(k, v)| format!("{k} is set to {v}"))
    })
}

/// Recognises our own earlier entry by its command and arguments.
type OwnEarlier<'a> = Box<dyn Fn(&Value, &Value) -> bool + 'a>;

/// One Codex entry marsh manages: `name` running `command` with arguments `args`
/// accepts; an [`Exact`] one can also be written.
pub(crate) struct Codex<'a, A> {
    program: PathBuf,
    cwd: &'a Path,
    name: &'a str,
    command: &'a str,
    args: A,
    /// Recognises an earlier entry of ours (by command and arguments) that install
    /// replaces and uninstall removes.
    earlier: Option<OwnEarlier<'a>>,
    env: &'a Environment,
    runner: &'a dyn Runner,
}

impl<'a, A: ArgsRule> Codex<'a, A> {
    /// Finds the `codex` CLI on `PATH`; its commands run from `cwd`.
    pub(crate) fn new(
        env: &'a Environment,
        runner: &'a dyn Runner,
        cwd: &'a Path,
        name: &'a str,
        command: &'a str,
        args: A,
    ) -> Result<Self, InstallError> {
        Ok(Self {
            program: codex_binary(env)?,
            cwd,
            name,
            command,
            args,
            earlier: None,
            env,
            runner,
        })
    }

    /// Also accept, for replacement by install and removal by uninstall, an entry whose
    /// command and arguments `earlier` recognises as ours (and otherwise as written).
    pub(crate) fn replacing(self, earlier: impl Fn(&Value, &Value) -> bool + 'a) -> Self {
        Self {
            earlier: Some(Box::new(earlier)),
            ..self
        }
    }

    fn run(&self, args: &[&str]) -> Result<(), InstallError> {
        codex(&self.program, self.cwd, self.env, args)
            .run_ok(self.runner)
            .map(drop)
    }
}

impl<A: ArgsRule> ClientStore for Codex<'_, A> {
    const CLIENT: &'static str = "codex";

    fn read(&self) -> Result<Option<Value>, InstallError> {
        get(&self.program, self.cwd, self.name, self.env, self.runner)
    }

    fn difference(&self, found: &Value) -> Option<String> {
        difference(self.command, &self.args, found)
    }

    fn upgradable(&self, found: &Value) -> bool {
        let transport = &found["transport"];
        self.earlier
            .as_ref()
            .is_some_and(|earlier| earlier(&transport["command"], &transport["args"]))
            && settings_difference(found).is_none()
    }

    fn remove(&self) -> Result<(), InstallError> {
        self.run(&["mcp", "remove", self.name])
    }
}

impl ClientWriter for Codex<'_, Exact> {
    fn add(&self) -> Result<(), InstallError> {
        let mut args = vec!["mcp", "add", self.name, "--", self.command];
        args.extend(self.args.0.iter().map(String::as_str));
        self.run(&args)
    }
}

/// The store of this workspace's `marsh-mcp connect --start …` entry; an earlier entry
/// of ours ([`Registration::is_own_earlier`]: the previous release's `serve`, or pins
/// that have moved) is replaced.
pub(crate) fn store<'a>(
    reg: &'a Registration,
    env: &'a Environment,
    runner: &'a dyn Runner,
) -> Result<Codex<'a, Exact>, InstallError> {
    Ok(Codex::new(
        env,
        runner,
        Path::new(&reg.workspace),
        &reg.name,
        &reg.marsh_mcp,
        Exact(reg.client_args()),
    )?
    .replacing(|command, args| reg.is_own_earlier(command, args)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::registration::Client;
    use crate::test_support::{
        Divergence, Fixture, Scripted, assert_each_named, codex_shown as shown, fake_codex,
        finished, sample,
    };

    /// The difference from this workspace's `connect --start` entry.
    fn difference(reg: &Registration, found: &Value) -> Option<String> {
        super::difference(&reg.marsh_mcp, &Exact(reg.client_args()), found)
    }

    fn shown_with(reg: &Registration, args: &[String]) -> Value {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        shown(&reg.name, &reg.marsh_mcp, &args)
    }

    fn expected(reg: &Registration) -> Value {
        shown_with(reg, &reg.client_args())
    }

    #[test]
    fn difference_accepts_exactly_the_expected_entry() {
        let reg = sample(Client::Codex);
        assert_eq!(difference(&reg, &expected(&reg)), None);
        // An empty env table is "not configured" too.
        let mut entry = expected(&reg);
        entry["transport"]["env"] = json!({});
        assert_eq!(difference(&reg, &entry), None);
    }

    #[test]
    fn difference_names_each_divergence() {
        let reg = sample(Client::Codex);
        let cases: &[Divergence] = &[
            ("transport.command is \"/usr/bin/other\"", |e| {
                e["transport"]["command"] = json!("/usr/bin/other")
            }),
            ("transport.args is [\"serve\"]", |e| {
                e["transport"]["args"] = json!(["serve"])
            }),
            ("transport.args is null", |e| {
                e["transport"].as_object_mut().unwrap().remove("args");
            }),
            ("transport.type is \"streamable_http\"", |e| {
                e["transport"]["type"] = json!("streamable_http")
            }),
            ("transport.env is set to {\"TOKEN\":\"x\"}", |e| {
                e["transport"]["env"] = json!({"TOKEN": "x"})
            }),
            ("transport.env_vars is set to [\"TOKEN\"]", |e| {
                e["transport"]["env_vars"] = json!(["TOKEN"])
            }),
            ("transport.cwd is set to \"/elsewhere\"", |e| {
                e["transport"]["cwd"] = json!("/elsewhere")
            }),
            ("the entry is disabled", |e| e["enabled"] = json!(false)),
            ("the entry is disabled", |e| {
                e.as_object_mut().unwrap().remove("enabled");
            }),
            ("startup_timeout_sec is set to 5.0", |e| {
                e["startup_timeout_sec"] = json!(5.0)
            }),
            ("disabled_tools is set to [\"shell_run\"]", |e| {
                e["disabled_tools"] = json!(["shell_run"])
            }),
        ];
        assert_each_named(&expected(&reg), cases, |e| difference(&reg, e));
    }

    #[test]
    fn install_gets_adds_and_reads_back_then_reinstall_and_uninstall() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Codex);
        let stored = RefCell::new(None);
        let runner = Scripted::new(fake_codex(&stored));

        let message =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(message.starts_with(&format!("registered {} with codex", reg.name)));
        let calls = runner.calls.borrow().clone();
        for call in &calls {
            assert_eq!(call.program, fx.bin("codex"));
            assert_eq!(call.cwd, fx.workspace);
            assert_eq!(call.timeout, CODEX_TIMEOUT);
            let names: Vec<&str> = call.env.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                names,
                ["PATH", "USER", "LOGNAME", "HOME", "CODEX_HOME"],
                "no SECRET"
            );
            let var = |name: &str| call.env.iter().find(|(k, _)| k == name).unwrap().1.clone();
            // The passwd identity, never the caller's; the fixed PATH after the
            // directory codex was found in.
            assert_ne!(var("USER"), "mallory");
            assert_eq!(var("USER"), var("LOGNAME"));
            assert_eq!(
                var("PATH"),
                format!(
                    "{}:{}",
                    fx.bin("codex").parent().unwrap().display(),
                    crate::registration::CLIENT_PATH
                )
            );
        }
        let path = |p: std::path::PathBuf| p.display().to_string();
        let root = fx.root.join("codex/marsh/dev-mcp/codex");
        assert!(reg.root.starts_with(&path(root)), "{}", reg.root);
        let get = ["codex", "mcp", "get", &reg.name, "--json"].map(String::from);
        let add = [
            "codex",
            "mcp",
            "add",
            &reg.name,
            "--",
            &path(fx.bin("marsh-mcp")),
            "connect",
            "--start",
            "--workspace",
            &path(fx.workspace.clone()),
            "--scope-root",
            &reg.root,
            "--marsh",
            &path(fx.bin("marsh")),
            "--sbx",
            &path(fx.bin("sbx")),
        ]
        .map(String::from);
        assert_eq!(runner.take(), [get.to_vec(), add.to_vec(), get.to_vec()]);
        assert_eq!(*stored.borrow(), Some(expected(&reg)));

        let message =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(message.contains("nothing changed"), "{message}");
        assert_eq!(runner.take(), [get.to_vec()]);

        let message =
            crate::uninstall(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert_eq!(message, format!("removed {} from codex", reg.name));
        let remove = ["codex", "mcp", "remove", &reg.name].map(String::from);
        assert_eq!(runner.take(), [get.to_vec(), remove.to_vec()]);
        assert_eq!(*stored.borrow(), None);
    }

    #[test]
    fn install_upgrades_exactly_the_previous_serve_entry() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Codex);
        let stored = RefCell::new(Some(shown_with(&reg, &reg.previous_client_args())));
        let runner = Scripted::new(fake_codex(&stored));
        let message =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(
            message.starts_with(&format!(
                "replaced our earlier entry {} with codex",
                reg.name
            )),
            "{message}"
        );
        let verbs: Vec<String> = runner.take().iter().map(|c| c[2].clone()).collect();
        assert_eq!(verbs, ["get", "remove", "add", "get"]);
        assert_eq!(*stored.borrow(), Some(expected(&reg)));

        // A previous-form entry with anything more is not the previous release's.
        let mut altered = shown_with(&reg, &reg.previous_client_args());
        altered["transport"]["env"] = json!({"TOKEN": "x"});
        *stored.borrow_mut() = Some(altered.clone());
        let err =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap_err();
        assert!(matches!(err, InstallError::Conflict { .. }), "{err:?}");
        assert_eq!(runner.take().len(), 1);
        assert_eq!(*stored.borrow(), Some(altered));
    }

    #[test]
    fn install_refuses_a_foreign_entry_after_one_get() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Codex);
        let foreign = shown(&reg.name, "/usr/bin/other-server", &[]);
        let stored = RefCell::new(Some(foreign.clone()));
        let runner = Scripted::new(fake_codex(&stored));
        let err =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap_err();
        assert!(
            matches!(&err, InstallError::Conflict { client: "codex", difference, .. }
                if difference.contains("/usr/bin/other-server")),
            "{err:?}"
        );
        assert_eq!(runner.take().len(), 1);
        assert_eq!(*stored.borrow(), Some(foreign));
    }

    #[test]
    fn install_stops_when_get_fails_otherwise() {
        let fx = Fixture::new();
        let runner = Scripted::new(|_: &ClientCommand| finished(1, "", "config.toml is broken"));
        let err =
            crate::install(Client::Codex, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap_err();
        assert!(
            matches!(&err, InstallError::ClientFailed { code: Some(1), diagnostic, .. }
                if diagnostic == "config.toml is broken"),
            "{err:?}"
        );
        assert_eq!(runner.take().len(), 1, "nothing is added");
    }
}
