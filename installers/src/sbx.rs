//! SBX: start (or reuse) the shared broker, then replace the registration explicitly:
//! `sbx mcp rm --force NAME` (success or the exact not-found diagnostic only), then
//! `sbx mcp add NAME --command marsh-mcp --args connect,… --dir W`, then read it back.
//! An interruption between rm and add leaves no registration; rerunning is safe.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::InstallError;
use crate::registration::{Environment, Registration};
use crate::runner::{ClientCommand, Runner};
use crate::verified::{self, ClientStore, ClientWriter};

const SBX_TIMEOUT: Duration = Duration::from_secs(60);
/// Environment names the sbx CLI may need besides PATH/HOME (`SBX_SHIM_STATE` is the
/// stand-in's explicit state file; the stock sbx ignores it).
const SBX_ENV: &[&str] = &[
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "MARSH_CONTROL_HOME",
    "SBX_SHIM_STATE",
];

/// `sbx ARGS…` run from `cwd` with the sbx environment.
fn sbx_at(sbx: &Path, cwd: &Path, env: &Environment, args: &[&str]) -> ClientCommand {
    ClientCommand::new(sbx, cwd, env.for_client(sbx.parent(), SBX_ENV), SBX_TIMEOUT)
        .args(args.iter().copied())
}

fn sbx_command(reg: &Registration, env: &Environment, args: &[&str]) -> ClientCommand {
    sbx_at(Path::new(&reg.sbx), Path::new(&reg.workspace), env, args)
}

fn not_found(name: &str) -> String {
    format!("MCP server \"{name}\" not found")
}

/// The registration `name` as `sbx mcp inspect NAME --json` reports it, or `None` when
/// sbx answers exactly that it does not exist.
pub(crate) fn inspect_server(
    sbx: &Path,
    cwd: &Path,
    name: &str,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<Option<Value>, InstallError> {
    let command = sbx_at(sbx, cwd, env, &["mcp", "inspect", name, "--json"]);
    let done = command.run(runner)?;
    if done.ok() {
        return serde_json::from_str(&done.stdout).map(Some).map_err(|e| {
            InstallError::Unparseable {
                command: command.display(),
                reason: e.to_string(),
            }
        });
    }
    if done.stderr.trim() == not_found(name) {
        return Ok(None);
    }
    Err(command.failure(&done))
}

/// The registration as sbx reports it, or `None` when it does not exist.
fn inspect(
    reg: &Registration,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<Option<Value>, InstallError> {
    inspect_server(
        Path::new(&reg.sbx),
        Path::new(&reg.workspace),
        &reg.name,
        env,
        runner,
    )
}

/// What differs between sbx's view and the expected definition, if anything.
fn difference(reg: &Registration, found: &Value) -> Option<String> {
    let args: Vec<String> = reg.args("connect");
    let found_args: Vec<&str> = found["args"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if found["command"].as_str() != Some(reg.marsh_mcp.as_str()) {
        return Some(format!(
            "command is {} instead of {}",
            found["command"], reg.marsh_mcp
        ));
    }
    if found_args != args {
        return Some(format!("args are {found_args:?} instead of {args:?}"));
    }
    if found["dir"].as_str() != Some(reg.workspace.as_str()) {
        return Some(format!(
            "dir is {} instead of {}",
            found["dir"], reg.workspace
        ));
    }
    None
}

fn broker_start(
    reg: &Registration,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<(), InstallError> {
    let command = ClientCommand::new(
        Path::new(&reg.marsh_mcp),
        Path::new(&reg.workspace),
        env.for_client(Path::new(&reg.marsh_mcp).parent(), SBX_ENV),
        SBX_TIMEOUT,
    )
    .args(reg.args("broker-start"));
    command.run_ok(runner).map(drop)
}

struct Sbx<'a> {
    reg: &'a Registration,
    env: &'a Environment,
    runner: &'a dyn Runner,
}

impl ClientStore for Sbx<'_> {
    const CLIENT: &'static str = "sbx";

    fn read(&self) -> Result<Option<Value>, InstallError> {
        inspect(self.reg, self.env, self.runner)
    }

    fn difference(&self, found: &Value) -> Option<String> {
        difference(self.reg, found)
    }

    fn remove(&self) -> Result<(), InstallError> {
        sbx_command(
            self.reg,
            self.env,
            &["mcp", "rm", "--force", &self.reg.name],
        )
        .run_ok(self.runner)
        .map(drop)
    }
}

impl ClientWriter for Sbx<'_> {
    fn add(&self) -> Result<(), InstallError> {
        let reg = self.reg;
        let args = reg.args("connect").join(",");
        sbx_command(
            reg,
            self.env,
            &[
                "mcp",
                "add",
                &reg.name,
                "--command",
                &reg.marsh_mcp,
                "--args",
                &args,
                "--dir",
                &reg.workspace,
            ],
        )
        .run_ok(self.runner)
        .map(drop)
    }
}

/// Explicitly replacing, unlike the other clients: the broker first, then `rm --force`
/// accepting only success or the exact not-found diagnostic, then the verified add.
pub fn install(
    reg: &Registration,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<String, InstallError> {
    broker_start(reg, env, runner)?;
    let removed = sbx_command(reg, env, &["mcp", "rm", "--force", &reg.name]).run(runner)?;
    if !removed.ok() && removed.stderr.trim() != not_found(&reg.name) {
        return Err(InstallError::UnexpectedRemove {
            name: reg.name.clone(),
            diagnostic: removed.diagnostic(),
        });
    }
    let message = verified::install(&Sbx { reg, env, runner }, reg)?;
    Ok(format!(
        "{message}; broker running; load it with: sbx mcp load {} --sandbox SANDBOX",
        reg.name
    ))
}

pub fn uninstall(
    reg: &Registration,
    env: &Environment,
    runner: &dyn Runner,
) -> Result<String, InstallError> {
    let message = verified::uninstall(&Sbx { reg, env, runner }, reg)?;
    Ok(format!(
        "{message} (the broker keeps running; marsh-mcp stop stops it)"
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::cell::RefCell;

    use serde_json::json;

    use super::*;
    use crate::registration::Client;
    use crate::runner::Finished;
    use crate::test_support::{Divergence, Fixture, Scripted, assert_each_named, finished, sample};

    /// The entry as `sbx mcp inspect NAME --json` shows it: the definition plus state.
    fn shown(name: &str, command: &str, args: &[&str], dir: &str) -> Value {
        json!({"name": name, "command": command, "args": args, "dir": dir, "loaded": []})
    }

    fn expected(reg: &Registration) -> Value {
        let args = reg.args("connect");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        shown(&reg.name, &reg.marsh_mcp, &args, &reg.workspace)
    }

    #[test]
    fn difference_accepts_the_expected_definition_whatever_its_state() {
        let reg = sample(Client::Sbx);
        assert_eq!(difference(&reg, &expected(&reg)), None);
        let mut loaded = expected(&reg);
        loaded["loaded"] = json!(["dev-sandbox"]);
        assert_eq!(difference(&reg, &loaded), None);
    }

    #[test]
    fn difference_names_each_divergence() {
        let reg = sample(Client::Sbx);
        let cases: &[Divergence] = &[
            (
                "command is \"/usr/bin/other\" instead of /opt/bin/marsh-mcp",
                |e| e["command"] = json!("/usr/bin/other"),
            ),
            ("command is null instead of", |e| {
                e.as_object_mut().unwrap().remove("command");
            }),
            ("args are [\"serve\"] instead of [\"connect\"", |e| {
                e["args"] = json!(["serve"])
            }),
            ("args are [] instead of [\"connect\"", |e| {
                e.as_object_mut().unwrap().remove("args");
            }),
            ("dir is \"/elsewhere\" instead of /work/ws", |e| {
                e["dir"] = json!("/elsewhere")
            }),
            ("dir is null instead of /work/ws", |e| {
                e.as_object_mut().unwrap().remove("dir");
            }),
        ];
        assert_each_named(&expected(&reg), cases, |e| difference(&reg, e));
    }

    /// Answers like the sbx CLI over an in-memory registration; `rm_answer` replaces the
    /// answer to `mcp rm` when set. `marsh-mcp broker-start` always succeeds.
    fn fake_sbx<'a>(
        stored: &'a RefCell<Option<Value>>,
        rm_answer: Option<Finished>,
    ) -> impl Fn(&ClientCommand) -> Finished + 'a {
        move |command| {
            if command.program.ends_with("marsh-mcp") {
                return finished(0, "broker running\n", "");
            }
            let args: Vec<&str> = command.args.iter().map(String::as_str).collect();
            let missing =
                |name: &str| finished(1, "", &format!("MCP server \"{name}\" not found\n"));
            match args.as_slice() {
                ["mcp", "rm", "--force", name] => {
                    if let Some(answer) = &rm_answer {
                        return answer.clone();
                    }
                    match stored.borrow_mut().take() {
                        Some(_) => finished(0, "", ""),
                        None => missing(name),
                    }
                }
                ["mcp", "inspect", name, "--json"] => match &*stored.borrow() {
                    Some(entry) => finished(0, &entry.to_string(), ""),
                    None => missing(name),
                },
                [
                    "mcp",
                    "add",
                    name,
                    "--command",
                    program,
                    "--args",
                    list,
                    "--dir",
                    dir,
                ] => {
                    let list: Vec<&str> = list.split(',').collect();
                    *stored.borrow_mut() = Some(shown(name, program, &list, dir));
                    finished(0, "", "")
                }
                other => finished(2, "", &format!("unexpected sbx call {other:?}")),
            }
        }
    }

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_string()).collect()
    }

    #[test]
    fn install_starts_the_broker_replaces_and_reads_back() {
        let fx = Fixture::new();
        let reg = fx.registration(Client::Sbx);
        let stored = RefCell::new(None);
        let runner = Scripted::new(fake_sbx(&stored, None));

        let message =
            crate::install(Client::Sbx, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        assert!(
            message.contains(&format!("sbx mcp load {}", reg.name)),
            "{message}"
        );
        let calls = runner.calls.borrow().clone();
        assert_eq!(calls[0].program, fx.bin("marsh-mcp"));
        assert!(calls[1..].iter().all(|c| c.program == fx.bin("sbx")));
        for call in &calls {
            assert_eq!(call.cwd, fx.workspace);
            let names: Vec<&str> = call.env.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, ["PATH", "USER", "LOGNAME", "HOME"], "no SECRET");
        }
        let mut broker = vec!["marsh-mcp".to_string()];
        broker.extend(reg.args("broker-start"));
        let rm = strings(&["sbx", "mcp", "rm", "--force", &reg.name]);
        let inspect = strings(&["sbx", "mcp", "inspect", &reg.name, "--json"]);
        let connect = reg.args("connect").join(",");
        let add = strings(&[
            "sbx",
            "mcp",
            "add",
            &reg.name,
            "--command",
            &reg.marsh_mcp,
            "--args",
            &connect,
            "--dir",
            &reg.workspace,
        ]);
        assert_eq!(
            runner.take(),
            [broker, rm, inspect.clone(), add, inspect.clone()]
        );
        assert_eq!(*stored.borrow(), Some(expected(&reg)));

        crate::uninstall(Client::Sbx, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap();
        let rm = strings(&["sbx", "mcp", "rm", "--force", &reg.name]);
        assert_eq!(runner.take(), [inspect, rm]);
        assert_eq!(*stored.borrow(), None);
    }

    #[test]
    fn install_aborts_before_adding_when_rm_answers_otherwise() {
        let fx = Fixture::new();
        let stored = RefCell::new(None);
        let refused = finished(1, "", "MCP server is loaded in sandbox dev\n");
        let runner = Scripted::new(fake_sbx(&stored, Some(refused)));
        let err =
            crate::install(Client::Sbx, &fx.env, &fx.workspace, &fx.exe, &runner).unwrap_err();
        assert!(
            matches!(&err, InstallError::UnexpectedRemove { diagnostic, .. }
                if diagnostic == "MCP server is loaded in sandbox dev"),
            "{err:?}"
        );
        let calls = runner.take();
        assert_eq!(calls.len(), 2, "broker-start and rm only: {calls:?}");
        assert_eq!(*stored.borrow(), None);
    }
}
