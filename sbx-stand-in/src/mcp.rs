//! `sbx mcp ...`: the MCP registration verbs of the stock sandbox CLI (`add`, `rm`,
//! `ls`, `inspect`, `load`, `unload`) plus the test-only `gateway-exec`, over the
//! state file of [`super::state`]. A load snapshots the registration into the sandbox:
//! `gateway-exec` launches that snapshot, so removing or replacing the registration
//! changes future loads only. The contract is docs/sbx-stand-in.md.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::state::{Definition, Registration, State, StateError, StateFile};
use crate::log;

/// The synopsis printed with every usage error and by `sbx mcp --help`.
pub const USAGE: &str = "\
usage: sbx mcp add NAME --command CMD [--args A,B,...] [--dir DIR]
       sbx mcp rm NAME [--force]
       sbx mcp ls [--json]
       sbx mcp inspect NAME [--json]
       sbx mcp load NAME --sandbox SANDBOX
       sbx mcp unload NAME --sandbox SANDBOX
       sbx mcp gateway-exec NAME --sandbox SANDBOX   (test only)";

/// Longest server or sandbox name.
const MAX_NAME: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("{0}\n{USAGE}")]
    Usage(String),
    #[error("injected failure: {0}")]
    Injected(&'static str),
    #[error("MCP server \"{0}\" not found")]
    NotFound(String),
    #[error("MCP server \"{0}\" already exists")]
    AlreadyExists(String),
    #[error(
        "MCP server \"{name}\" is loaded into sandboxes: {}; use --force to remove it anyway",
        .sandboxes.join(", ")
    )]
    Loaded {
        name: String,
        sandboxes: Vec<String>,
    },
    #[error("MCP server \"{name}\" is not loaded into sandbox \"{sandbox}\"")]
    NotLoaded { name: String, sandbox: String },
    #[error(
        "cannot locate the state file: SBX_SHIM_STATE is unset and the user has no passwd entry"
    )]
    NoStateFile,
    #[error(transparent)]
    State(#[from] StateError),
    #[error("cannot execute {command:?}{}: {source}", .dir.as_deref().map(|d| format!(" in {d}")).unwrap_or_default())]
    Exec {
        command: String,
        dir: Option<String>,
        #[source]
        source: std::io::Error,
    },
}

impl McpError {
    /// `2` for usage errors, `1` for everything else.
    pub fn exit_code(&self) -> i32 {
        match self {
            McpError::Usage(_) => 2,
            _ => 1,
        }
    }

    /// The stderr text: the registration diagnostics verbatim (what the stock CLI
    /// prints), everything else as `sbx: <reason>`.
    pub fn diagnostic(&self) -> String {
        match self {
            McpError::NotFound(_) | McpError::AlreadyExists(_) => self.to_string(),
            _ => format!("sbx: {self}"),
        }
    }
}

type Result<T, E = McpError> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "kebab-case")]
enum Verb {
    Add,
    Rm,
    Ls,
    Inspect,
    Load,
    Unload,
    GatewayExec,
}

/// What a verb accepts: flags taking a value, boolean switches, positional count.
struct Spec {
    values: &'static [&'static str],
    switches: &'static [&'static str],
    positional: usize,
}

impl Verb {
    fn as_str(self) -> &'static str {
        self.into()
    }

    fn parse(word: &str) -> Option<Verb> {
        word.parse().ok()
    }

    fn spec(self) -> Spec {
        let spec = |values, switches, positional| Spec {
            values,
            switches,
            positional,
        };
        match self {
            Verb::Add => spec(&["--command", "--args", "--dir"], &[], 1),
            Verb::Rm => spec(&[], &["--force"], 1),
            Verb::Ls => spec(&[], &["--json"], 0),
            Verb::Inspect => spec(&[], &["--json"], 1),
            Verb::Load | Verb::Unload | Verb::GatewayExec => spec(&["--sandbox"], &[], 1),
        }
    }
}

/// The words after the verb, sorted into positionals, flag values and switches.
#[derive(Debug, Default)]
struct Parsed<'a> {
    positional: Vec<&'a str>,
    values: BTreeMap<&'static str, &'a str>,
    switches: Vec<&'static str>,
    help: bool,
}

impl Parsed<'_> {
    fn value(&self, flag: &str) -> Option<&str> {
        self.values.get(flag).copied()
    }

    fn switch(&self, flag: &str) -> bool {
        self.switches.contains(&flag)
    }
}

fn usage(verb: Verb, problem: impl std::fmt::Display) -> McpError {
    McpError::Usage(format!("mcp {}: {problem}", verb.as_str()))
}

/// Parses `--flag VALUE`, `--flag=VALUE`, switches, `-h`/`--help` and `--` (which
/// ends the flags). A flag's value is the next word whatever it looks like.
fn parse_words<'a>(verb: Verb, words: &[&'a str]) -> Result<Parsed<'a>> {
    let spec = verb.spec();
    let mut parsed = Parsed::default();
    let mut rest = words.iter().copied();
    let mut flags_done = false;
    while let Some(word) = rest.next() {
        if flags_done || !word.starts_with('-') || word == "-" {
            parsed.positional.push(word);
            continue;
        }
        if word == "--" {
            flags_done = true;
            continue;
        }
        if word == "-h" || word == "--help" {
            parsed.help = true;
            continue;
        }
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (word, None),
        };
        if let Some(&known) = spec.values.iter().find(|f| **f == flag) {
            let value = match inline {
                Some(value) => value,
                None => rest
                    .next()
                    .ok_or_else(|| usage(verb, format_args!("flag {known} needs a value")))?,
            };
            if parsed.values.insert(known, value).is_some() {
                return Err(usage(verb, format_args!("flag {known} given twice")));
            }
        } else if let Some(&known) = spec.switches.iter().find(|f| **f == word) {
            if parsed.switch(known) {
                return Err(usage(verb, format_args!("flag {known} given twice")));
            }
            parsed.switches.push(known);
        } else {
            return Err(usage(verb, format_args!("unknown flag {flag:?}")));
        }
    }
    if !parsed.help && parsed.positional.len() != spec.positional {
        let expected = match spec.positional {
            0 => "no arguments",
            _ => "exactly one NAME",
        };
        return Err(usage(
            verb,
            format_args!("expected {expected}, got {:?}", parsed.positional),
        ));
    }
    Ok(parsed)
}

/// `[A-Za-z0-9._-]{1,64}`: server and sandbox names.
fn valid_name(name: &str) -> bool {
    (1..=MAX_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

fn checked_name(verb: Verb, what: &str, name: &str) -> Result<String> {
    if valid_name(name) {
        Ok(name.to_string())
    } else {
        Err(usage(
            verb,
            format_args!(
                "invalid {what} name {name:?}: expected 1 to {MAX_NAME} of [A-Za-z0-9._-]"
            ),
        ))
    }
}

/// `--args`: one value split on every comma; empty means no arguments.
fn split_args(value: &str) -> Vec<String> {
    if value.is_empty() {
        Vec::new()
    } else {
        value.split(',').map(str::to_string).collect()
    }
}

/// One parsed `sbx mcp` command line.
#[derive(Debug, PartialEq)]
enum Command {
    Help,
    Add {
        name: String,
        command: String,
        args: Vec<String>,
        dir: Option<String>,
    },
    Rm {
        name: String,
        force: bool,
    },
    Ls {
        json: bool,
    },
    Inspect {
        name: String,
    },
    Load {
        name: String,
        sandbox: String,
    },
    Unload {
        name: String,
        sandbox: String,
    },
    GatewayExec {
        name: String,
        sandbox: String,
    },
}

/// The comma list of verbs to fail, from `SBX_SHIM_FAIL`: a test hook, read only in a
/// build with the `test-hooks` feature (the test build enables it).
#[cfg(feature = "test-hooks")]
fn injected_failures() -> Option<String> {
    std::env::var("SBX_SHIM_FAIL").ok()
}

/// Without the `test-hooks` feature no verb is ever made to fail.
#[cfg(not(feature = "test-hooks"))]
fn injected_failures() -> Option<String> {
    None
}

/// True when the comma list `fail` (from `SBX_SHIM_FAIL`) names `verb`.
fn injected(fail: Option<&str>, verb: Verb) -> bool {
    fail.is_some_and(|list| list.split(',').any(|v| v.trim() == verb.as_str()))
}

/// Parses the words after `sbx mcp`. The injection check comes first, as soon as the
/// verb is known.
fn parse(words: &[&str], fail: Option<&str>) -> Result<Command> {
    let Some((&first, rest)) = words.split_first() else {
        return Err(McpError::Usage("mcp: missing verb".into()));
    };
    if matches!(first, "help" | "-h" | "--help") {
        return Ok(Command::Help);
    }
    let verb = Verb::parse(first)
        .ok_or_else(|| McpError::Usage(format!("mcp: unknown verb {first:?}")))?;
    if injected(fail, verb) {
        return Err(McpError::Injected(verb.as_str()));
    }
    let parsed = parse_words(verb, rest)?;
    if parsed.help {
        return Ok(Command::Help);
    }
    let name = || match parsed.positional.first() {
        Some(name) => checked_name(verb, "MCP server", name),
        None => Err(usage(verb, "missing NAME")),
    };
    let sandbox = || match parsed.value("--sandbox") {
        Some(sandbox) => checked_name(verb, "sandbox", sandbox),
        None => Err(usage(verb, "--sandbox is required")),
    };
    Ok(match verb {
        Verb::Add => {
            let command = match parsed.value("--command") {
                Some("") => return Err(usage(verb, "--command must not be empty")),
                Some(command) => command.to_string(),
                None => return Err(usage(verb, "--command is required")),
            };
            let dir = match parsed.value("--dir") {
                None => None,
                Some("") => return Err(usage(verb, "--dir must not be empty")),
                Some(dir) => Some(absolute(verb, dir)?),
            };
            Command::Add {
                name: name()?,
                command,
                args: split_args(parsed.value("--args").unwrap_or("")),
                dir,
            }
        }
        Verb::Rm => Command::Rm {
            name: name()?,
            force: parsed.switch("--force"),
        },
        Verb::Ls => Command::Ls {
            json: parsed.switch("--json"),
        },
        Verb::Inspect => Command::Inspect { name: name()? },
        Verb::Load => Command::Load {
            name: name()?,
            sandbox: sandbox()?,
        },
        Verb::Unload => Command::Unload {
            name: name()?,
            sandbox: sandbox()?,
        },
        Verb::GatewayExec => Command::GatewayExec {
            name: name()?,
            sandbox: sandbox()?,
        },
    })
}

/// `dir` made absolute against the current directory (lexically; it need not exist).
fn absolute(verb: Verb, dir: &str) -> Result<String> {
    let path = std::path::absolute(dir)
        .map_err(|e| usage(verb, format_args!("cannot resolve --dir {dir:?}: {e}")))?;
    path.to_str()
        .map(str::to_string)
        .ok_or_else(|| usage(verb, "--dir must be UTF-8"))
}

/// The public JSON form of one registration (`inspect`, `ls --json`).
fn entry_json(name: &str, reg: &Registration) -> Value {
    json!({
        "name": name,
        "command": reg.command,
        "args": reg.args,
        "dir": reg.dir,
        "loaded": reg.loaded,
    })
}

/// The `ls` text line: name, shell-quoted command line, dir, loaded sandboxes
/// (`-` for none), separated by tabs.
fn entry_line(name: &str, reg: &Registration) -> String {
    let command_line = std::iter::once(&reg.command)
        .chain(&reg.args)
        .map(|w| quoted(w))
        .collect::<Vec<_>>()
        .join(" ");
    let dir = reg.dir.as_deref().unwrap_or("-");
    let loaded = match reg.loaded.is_empty() {
        true => "-".to_string(),
        false => reg.loaded.join(","),
    };
    format!("{name}\t{command_line}\t{dir}\t{loaded}")
}

/// `word` as one POSIX shell word: unchanged when it is made only of characters no
/// shell treats specially, else single-quoted (an embedded `'` as `'\\''`).
fn quoted(word: &str) -> String {
    const PLAIN: &[u8] = b"-_./=:,+@%";
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || PLAIN.contains(&b))
    {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// One locked read-modify-write of the state file (see [`StateFile::update`]).
fn update(state: &StateFile, change: impl FnOnce(&mut State) -> Result<()>) -> Result<()> {
    state.update(change)
}

/// What `sandbox` loaded as `name`: its snapshot; else, for a load recorded before
/// snapshots existed (the sandbox only in `loaded`), the registration itself. Not
/// found when there is neither a snapshot nor a registration of that name.
fn loaded_definition(state: &State, name: &str, sandbox: &str) -> Result<Definition> {
    if let Some(definition) = state
        .loads()?
        .get(sandbox)
        .and_then(|servers| servers.get(name))
    {
        return Ok(definition.clone());
    }
    let regs = state.registrations()?;
    let reg = regs
        .get(name)
        .ok_or_else(|| McpError::NotFound(name.to_string()))?;
    if reg.loaded.iter().any(|s| s == sandbox) {
        Ok(reg.definition())
    } else {
        Err(McpError::NotLoaded {
            name: name.to_string(),
            sandbox: sandbox.to_string(),
        })
    }
}

/// Runs one command; returns the lines for stdout. `gateway-exec` returns only when
/// it could not replace the process.
fn execute(command: Command, state: Option<PathBuf>) -> Result<Vec<String>> {
    if command == Command::Help {
        return Ok(vec![USAGE.to_string()]);
    }
    let state = StateFile::new(state.ok_or(McpError::NoStateFile)?);
    match command {
        Command::Help => Ok(vec![USAGE.to_string()]),
        Command::Add {
            name,
            command,
            args,
            dir,
        } => {
            update(&state, |s| {
                let mut regs = s.registrations()?;
                if regs.contains_key(&name) {
                    return Err(McpError::AlreadyExists(name.clone()));
                }
                let reg = Registration {
                    command,
                    args,
                    dir,
                    loaded: Vec::new(),
                    extra: serde_json::Map::new(),
                };
                regs.insert(name.clone(), reg);
                Ok(s.set_registrations(&regs)?)
            })?;
            Ok(vec![format!("MCP server \"{name}\" added")])
        }
        Command::Rm { name, force } => {
            update(&state, |s| {
                let mut regs = s.registrations()?;
                let reg = regs
                    .remove(&name)
                    .ok_or_else(|| McpError::NotFound(name.clone()))?;
                if !reg.loaded.is_empty() && !force {
                    return Err(McpError::Loaded {
                        name: name.clone(),
                        sandboxes: reg.loaded,
                    });
                }
                // The sandboxes keep what they loaded. A load recorded before snapshots
                // existed (in `loaded` only) is snapshotted now, from the registration
                // it loaded.
                let mut loads = s.loads()?;
                let before = loads.clone();
                for sandbox in &reg.loaded {
                    loads
                        .entry(sandbox.clone())
                        .or_default()
                        .entry(name.clone())
                        .or_insert_with(|| reg.definition());
                }
                if loads != before {
                    s.set_loads(&loads)?;
                }
                Ok(s.set_registrations(&regs)?)
            })?;
            Ok(vec![format!("MCP server \"{name}\" removed")])
        }
        Command::Ls { json } => {
            let regs = state.read()?.registrations()?;
            if json {
                let servers: Vec<Value> = regs.iter().map(|(n, r)| entry_json(n, r)).collect();
                Ok(vec![json!({ "servers": servers }).to_string()])
            } else {
                Ok(regs.iter().map(|(n, r)| entry_line(n, r)).collect())
            }
        }
        Command::Inspect { name } => {
            let regs = state.read()?.registrations()?;
            let reg = regs.get(&name).ok_or(McpError::NotFound(name.clone()))?;
            Ok(vec![entry_json(&name, reg).to_string()])
        }
        Command::Load { name, sandbox } => {
            update(&state, |s| {
                let mut regs = s.registrations()?;
                let reg = regs
                    .get_mut(&name)
                    .ok_or_else(|| McpError::NotFound(name.clone()))?;
                if !reg.loaded.contains(&sandbox) {
                    reg.loaded.push(sandbox.clone());
                    reg.loaded.sort();
                }
                // The sandbox's snapshot: this registration's definition, replacing
                // whatever it loaded under this name before.
                let definition = reg.definition();
                let mut loads = s.loads()?;
                let slot = loads.entry(sandbox.clone()).or_default();
                if slot.get(&name) != Some(&definition) {
                    slot.insert(name.clone(), definition);
                    s.set_loads(&loads)?;
                }
                Ok(s.set_registrations(&regs)?)
            })?;
            Ok(vec![format!(
                "MCP server \"{name}\" loaded into sandbox \"{sandbox}\""
            )])
        }
        Command::Unload { name, sandbox } => {
            update(&state, |s| {
                let mut regs = s.registrations()?;
                let mut loads = s.loads()?;
                let dropped = loads
                    .get_mut(&sandbox)
                    .and_then(|servers| servers.remove(&name))
                    .is_some();
                match regs.get_mut(&name) {
                    Some(reg) => reg.loaded.retain(|s| *s != sandbox),
                    None if dropped => {}
                    None => return Err(McpError::NotFound(name.clone())),
                }
                if dropped {
                    s.set_loads(&loads)?;
                }
                Ok(s.set_registrations(&regs)?)
            })?;
            Ok(vec![format!(
                "MCP server \"{name}\" unloaded from sandbox \"{sandbox}\""
            )])
        }
        Command::GatewayExec { name, sandbox } => {
            let current = state.read()?;
            let definition = loaded_definition(&current, &name, &sandbox)?;
            let mut child = std::process::Command::new(&definition.command);
            child.args(&definition.args);
            if let Some(dir) = &definition.dir {
                child.current_dir(dir);
            }
            // Only returns on failure; on success this process is the server.
            let source = child.exec();
            Err(McpError::Exec {
                command: definition.command,
                dir: definition.dir,
                source,
            })
        }
    }
}

fn run(args: &[OsString], state: Option<PathBuf>, fail: Option<&str>) -> Result<Vec<String>> {
    let words: Vec<&str> = args
        .iter()
        .map(|a| {
            a.to_str()
                .ok_or_else(|| McpError::Usage("mcp: arguments must be UTF-8".into()))
        })
        .collect::<Result<_>>()?;
    execute(parse(&words, fail)?, state)
}

/// `sbx mcp ARGS...` (`args` excludes `mcp`); returns the process exit code.
pub fn main(args: &[OsString], state: Option<PathBuf>) -> i32 {
    let fail = injected_failures();
    match run(args, state, fail.as_deref()) {
        Ok(lines) => {
            let mut out = std::io::stdout().lock();
            match lines.iter().try_for_each(|line| writeln!(out, "{line}")) {
                Ok(()) => 0,
                Err(e) => {
                    log(format_args!("sbx: writing to stdout: {e}"));
                    1
                }
            }
        }
        Err(e) => {
            log(format_args!("{}", e.diagnostic()));
            e.exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse_line(line: &str) -> Result<Command> {
        let words: Vec<&str> = line.split(' ').filter(|w| !w.is_empty()).collect();
        parse(&words, None)
    }

    #[test]
    fn add_parsing() {
        assert_eq!(
            parse_line("add srv --command /bin/echo --args=a,,b --dir /tmp").unwrap(),
            Command::Add {
                name: "srv".into(),
                command: "/bin/echo".into(),
                args: vec!["a".into(), "".into(), "b".into()],
                dir: Some("/tmp".into()),
            }
        );
        assert_eq!(
            parse_line("add --command x --args -y,pkg -- -srv").unwrap(),
            Command::Add {
                name: "-srv".into(),
                command: "x".into(),
                args: vec!["-y".into(), "pkg".into()],
                dir: None,
            }
        );
        let words = ["add", "s", "--command", "x", "--args", ""];
        assert!(matches!(parse(&words, None), Ok(Command::Add { args, .. }) if args.is_empty()));
    }

    #[test]
    fn usage_errors() {
        for line in [
            "",
            "bogus",
            "add srv",
            "add srv --command",
            "add srv --command x --command y",
            "add srv --command x --bogus 1",
            "add bad/name --command x",
            "rm",
            "rm a b",
            "rm a --force=yes",
            "ls extra",
            "load a",
            "load a --sandbox bad:name",
            "inspect a --force",
        ] {
            let err = parse_line(line).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{line}: {err}");
            assert!(err.diagnostic().contains("usage: sbx mcp add"), "{line}");
        }
        let long = "a".repeat(65);
        assert!(parse(&["rm", &long], None).is_err());
        assert!(parse(&["rm", &long[..64]], None).is_ok());
        assert_eq!(parse_line("ls --help").unwrap(), Command::Help);
    }

    #[test]
    fn injection_precedes_parsing() {
        let err = parse(&["rm"], Some("add, rm")).unwrap_err();
        assert_eq!(err.diagnostic(), "sbx: injected failure: rm");
        assert_eq!(err.exit_code(), 1);
        assert!(parse(&["ls"], Some("rm")).is_ok());
        assert!(parse(&["ls"], Some("")).is_ok());
    }

    #[test]
    fn diagnostics() {
        assert_eq!(
            McpError::NotFound("x".into()).diagnostic(),
            "MCP server \"x\" not found"
        );
        assert_eq!(
            McpError::AlreadyExists("x".into()).diagnostic(),
            "MCP server \"x\" already exists"
        );
        assert_eq!(
            McpError::Loaded {
                name: "x".into(),
                sandboxes: vec!["a".into(), "b".into()]
            }
            .diagnostic(),
            "sbx: MCP server \"x\" is loaded into sandboxes: a, b; use --force to remove it anyway"
        );
    }
}
