//! `marsh` argument parsing (the README's verbs; `--json` is accepted and implied).

use std::ffi::OsString;

use crate::error::{Error, Result};
use crate::kits::Selection;
use crate::receipt;

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Version,
    Help,
    Status,
    Results,
    Show(String),
    Run {
        command: OsString,
        load: Option<Selection>,
    },
    /// `marsh kit run NAME [--receipt-fd N] [--] ARGS...`.
    KitRun {
        kit: String,
        receipt_fd: Option<i32>,
        args: Vec<OsString>,
    },
    WorkersReset(Selection),
    Reset,
    Stop,
    /// `marsh mcp ...`: handed to the sibling `marsh-mcp`.
    Mcp(Vec<OsString>),
}

pub const USAGE: &str = "usage: marsh [--load SEL] -c CMD | marsh kit run NAME [--receipt-fd N] [--] ARGS... | \
marsh status [--json] | marsh results [--json] | \
marsh results show SEL [--json] | marsh workers reset SEL [--json] | marsh reset [--json] | \
marsh stop [--json] | marsh mcp ARGS... | marsh --version";

fn usage(what: impl Into<String>) -> Error {
    Error::Usage(format!("{}\n{USAGE}", what.into()))
}

/// Parses the arguments after `argv[0]`.
pub fn parse(args: &[OsString]) -> Result<Command> {
    let Some(first) = args.first() else {
        return Err(usage("no command given"));
    };
    if first == "mcp" {
        return Ok(Command::Mcp(args[1..].to_vec()));
    }
    if first == "-c" || first == "--load" {
        return parse_run(args);
    }
    if first == "kit" {
        return parse_kit_run(&args[1..]);
    }
    let words: Vec<&str> = args
        .iter()
        .map(|a| a.to_str().ok_or_else(|| usage("arguments must be UTF-8")))
        .collect::<Result<_>>()?;
    // `--json` is the only output format; accept it anywhere after the verb.
    let (verb, rest) = (words[0], &words[1..]);
    let rest: Vec<&str> = rest.iter().copied().filter(|w| *w != "--json").collect();
    match (verb, rest.as_slice()) {
        ("--version" | "-V", []) => Ok(Command::Version),
        ("--help" | "-h" | "help", []) => Ok(Command::Help),
        ("status", []) => Ok(Command::Status),
        ("results", []) => Ok(Command::Results),
        // `--` before a value is accepted (and a value never starts with `-`).
        ("results", ["show", sel] | ["show", "--", sel]) => {
            if receipt::valid_selector(sel) {
                Ok(Command::Show((*sel).to_string()))
            } else {
                Err(usage(format!(
                    "invalid result selector {sel:?}: expected [0-9a-f-]{{1,64}}"
                )))
            }
        }
        ("workers", ["reset", sel] | ["reset", "--", sel]) => {
            Ok(Command::WorkersReset(Selection::parse(sel)?))
        }
        ("reset", []) => Ok(Command::Reset),
        ("stop", []) => Ok(Command::Stop),
        _ => Err(usage(format!(
            "unrecognized arguments: {}",
            words.join(" ")
        ))),
    }
}

/// `run NAME [--receipt-fd N] [--] ARGS...`: options come before the arguments; an
/// argument that starts with `-` must follow `--`.
fn parse_kit_run(args: &[OsString]) -> Result<Command> {
    let mut it = args.iter();
    if it.next().is_none_or(|verb| verb != "run") {
        return Err(usage(
            "expected `marsh kit run NAME [--receipt-fd N] [--] ARGS...`",
        ));
    }
    let kit = it
        .next()
        .and_then(|name| name.to_str())
        .filter(|name| !name.starts_with('-'))
        .ok_or_else(|| usage("marsh kit run needs a kit NAME"))?
        .to_string();
    let mut receipt_fd = None;
    let mut rest = it.as_slice();
    while let Some((word, tail)) = rest.split_first() {
        let value = if word == "--receipt-fd" {
            let (value, tail) = tail
                .split_first()
                .ok_or_else(|| usage("--receipt-fd needs a descriptor number"))?;
            rest = tail;
            value.to_str()
        } else if let Some(value) = word.to_str().and_then(|w| w.strip_prefix("--receipt-fd=")) {
            rest = tail;
            Some(value)
        } else if word == "--" {
            rest = tail;
            break;
        } else if word.as_encoded_bytes().starts_with(b"-") {
            return Err(usage(format!(
                "unknown option {} (kit arguments that start with - go after --)",
                word.to_string_lossy()
            )));
        } else {
            break;
        };
        if receipt_fd.is_some() {
            return Err(usage("--receipt-fd given twice"));
        }
        let fd = value
            .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|v| v.parse::<i32>().ok())
            .filter(|fd| *fd >= 3)
            .ok_or_else(|| usage("--receipt-fd needs a descriptor number of 3 or more"))?;
        receipt_fd = Some(fd);
    }
    Ok(Command::KitRun {
        kit,
        receipt_fd,
        args: rest.to_vec(),
    })
}

fn parse_run(args: &[OsString]) -> Result<Command> {
    let mut command = None;
    let mut load = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "-c" && command.is_none() {
            command = Some(
                it.next()
                    .ok_or_else(|| usage("-c needs a command"))?
                    .clone(),
            );
        } else if flag == "--load" && load.is_none() {
            let sel = it.next().ok_or_else(|| usage("--load needs a selection"))?;
            let sel = sel
                .to_str()
                .ok_or_else(|| usage("the --load selection must be UTF-8"))?;
            load = Some(Selection::parse(sel)?);
        } else {
            return Err(usage(format!(
                "unexpected argument {}",
                flag.to_string_lossy()
            )));
        }
    }
    match command {
        Some(command) => Ok(Command::Run { command, load }),
        None => Err(usage("--load needs -c CMD")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn p(args: &[&str]) -> Result<Command> {
        parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn verbs() {
        assert_eq!(p(&["status", "--json"]).unwrap(), Command::Status);
        assert_eq!(p(&["results"]).unwrap(), Command::Results);
        assert_eq!(
            p(&["results", "show", "ab-1", "--json"]).unwrap(),
            Command::Show("ab-1".into())
        );
        assert_eq!(p(&["results", "show", "XY"]).unwrap_err().exit_code(), 2);
        assert_eq!(
            p(&["results", "show", "--", "ab", "--json"]).unwrap(),
            Command::Show("ab".into())
        );
        assert_eq!(p(&["results", "show", "-c"]).unwrap_err().exit_code(), 2);
        assert_eq!(
            p(&["workers", "reset", "--", "all"]).unwrap(),
            Command::WorkersReset(Selection::All)
        );
        assert_eq!(
            p(&["workers", "reset", "--all"]).unwrap_err().exit_code(),
            2
        );
        assert_eq!(p(&["reset", "--json"]).unwrap(), Command::Reset);
        assert_eq!(p(&["stop"]).unwrap(), Command::Stop);
        assert_eq!(
            p(&["workers", "reset", "all"]).unwrap(),
            Command::WorkersReset(Selection::All)
        );
        assert_eq!(p(&["--version"]).unwrap(), Command::Version);
        assert_eq!(p(&[]).unwrap_err().exit_code(), 2);
        assert_eq!(p(&["bogus"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn run_forms() {
        assert_eq!(
            p(&["-c", "echo hi"]).unwrap(),
            Command::Run {
                command: "echo hi".into(),
                load: None
            }
        );
        assert_eq!(
            p(&["--load", "a,b", "-c", "x"]).unwrap(),
            Command::Run {
                command: "x".into(),
                load: Some(Selection::Names(vec!["a".into(), "b".into()]))
            }
        );
        assert_eq!(p(&["-c"]).unwrap_err().exit_code(), 2);
        assert_eq!(p(&["--load", "all"]).unwrap_err().exit_code(), 2);
        assert_eq!(p(&["-c", "x", "extra"]).unwrap_err().exit_code(), 2);
        assert_eq!(p(&["--load", "Bad", "-c", "x"]).unwrap_err().exit_code(), 2);
    }

    #[test]
    fn kit_run_forms() {
        let kit_run = |kit: &str, fd: Option<i32>, args: &[&str]| Command::KitRun {
            kit: kit.into(),
            receipt_fd: fd,
            args: args.iter().map(OsString::from).collect(),
        };
        assert_eq!(p(&["kit", "run", "k"]).unwrap(), kit_run("k", None, &[]));
        assert_eq!(
            p(&["kit", "run", "k", "a", "-b", "--", "c"]).unwrap(),
            kit_run("k", None, &["a", "-b", "--", "c"])
        );
        assert_eq!(
            p(&[
                "kit",
                "run",
                "k",
                "--receipt-fd",
                "3",
                "--",
                "--x",
                "--receipt-fd"
            ])
            .unwrap(),
            kit_run("k", Some(3), &["--x", "--receipt-fd"])
        );
        assert_eq!(
            p(&["kit", "run", "k", "--receipt-fd=9", "a"]).unwrap(),
            kit_run("k", Some(9), &["a"])
        );
        assert_eq!(
            p(&["kit", "run", "k", "--", "--"]).unwrap(),
            kit_run("k", None, &["--"])
        );
        for bad in [
            &["kit"][..],
            &["kit", "go", "k"],
            &["kit", "run"],
            &["kit", "run", "-k"],
            &["kit", "run", "k", "-x"],
            &["kit", "run", "k", "--receipt-fd"],
            &["kit", "run", "k", "--receipt-fd", "2"],
            &["kit", "run", "k", "--receipt-fd", "x"],
            &["kit", "run", "k", "--receipt-fd", "+4"],
            &["kit", "run", "k", "--receipt-fd", "3", "--receipt-fd", "4"],
        ] {
            assert_eq!(p(bad).unwrap_err().exit_code(), 2, "{bad:?}");
        }
    }
}
