//! The command line of `mcp publish|unpublish|load` (in the project shell) and of
//! `marsh mcp unpublish|load` (host). Everything is checked here, before any effect;
//! a bad command line is a `rejected_before_effect` answer with exit 2.
//!
//! Grammar: flags take `--flag VALUE` or `--flag=VALUE` (the word after a value flag is
//! its value whatever it looks like), may come before or after `NAME`, and may be
//! given once. `publish` takes its pipeline as the one word after `--`.

use std::collections::BTreeMap;
use std::ffi::OsString;

use super::names::{DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_TIMEOUT_MS};
use super::{PublicationAnswer, PublicationRequest};

pub const SYNOPSIS: &str = "mcp publish NAME [--description TEXT] [--sandbox SANDBOX] [--timeout-ms N] [--max-output-bytes N] -- 'PIPELINE' | mcp unpublish NAME | mcp load NAME --sandbox SANDBOX";

const KIT_REFUSAL: &str = "--kit targets are not supported by this stand-in (marsh-shim): publish without --kit, or load into a sandbox with --sandbox SANDBOX";

/// Parses `VERB ARGS...` (the words after `mcp`) into a validated request.
pub fn parse(args: &[OsString]) -> Result<PublicationRequest, Usage> {
    let words: Vec<&str> = args
        .iter()
        .map(|a| a.to_str())
        .collect::<Option<_>>()
        .ok_or_else(|| usage(None, "arguments must be UTF-8"))?;
    let Some((&verb, rest)) = words.split_first() else {
        return Err(usage(None, "missing verb"));
    };
    // Before `--` only: after it comes the pipeline, which may mention anything.
    let flag_words = match rest.iter().position(|w| *w == "--") {
        Some(end) if verb == "publish" => &rest[..end],
        _ => rest,
    };
    if flag_words
        .iter()
        .any(|w| *w == "--kit" || w.starts_with("--kit="))
    {
        let value_flags = [
            "--kit",
            "--description",
            "--sandbox",
            "--timeout-ms",
            "--max-output-bytes",
        ];
        return Err(usage(name_hint(rest, &value_flags), KIT_REFUSAL));
    }
    let request = match verb {
        "publish" => parse_publish(rest)?,
        "unpublish" => {
            let parsed = Words::parse(rest, &[], false)?;
            PublicationRequest::Unpublish {
                tool_name: parsed.name()?.to_string(),
            }
        }
        "load" => {
            let parsed = Words::parse(rest, &["--sandbox"], false)?;
            let name = parsed.name()?;
            let sandbox = parsed
                .value("--sandbox")
                .ok_or_else(|| usage(Some(name), "--sandbox SANDBOX is required"))?;
            PublicationRequest::Load {
                tool_name: name.to_string(),
                sandbox: sandbox.to_string(),
            }
        }
        other => return Err(usage(None, format!("unknown verb {other:?}"))),
    };
    request
        .validate()
        .map_err(|problem| usage(Some(request.tool_name()), problem))?;
    Ok(request)
}

fn parse_publish(rest: &[&str]) -> Result<PublicationRequest, Usage> {
    let values = [
        "--description",
        "--sandbox",
        "--timeout-ms",
        "--max-output-bytes",
    ];
    let parsed = Words::parse(rest, &values, true)?;
    let name = parsed.name()?;
    let pipeline = match parsed.trailing.as_deref() {
        Some([pipeline]) => pipeline.to_string(),
        Some([]) => return Err(usage(Some(name), "the pipeline after -- is missing")),
        Some(_) => {
            return Err(usage(
                Some(name),
                "give the pipeline as one quoted word after --: mcp publish NAME -- 'PIPELINE'",
            ));
        }
        None => {
            return Err(usage(
                Some(name),
                "the pipeline goes after --: mcp publish NAME -- 'PIPELINE'",
            ));
        }
    };
    let number = |flag: &str, default: u64| match parsed.value(flag) {
        None => Ok(default),
        Some(text) => decimal(text).ok_or_else(|| {
            usage(
                Some(name),
                format!("{flag} needs a decimal number, got {text:?}"),
            )
        }),
    };
    Ok(PublicationRequest::Publish {
        tool_name: name.to_string(),
        description: parsed.value("--description").map(str::to_string),
        sandbox: parsed.value("--sandbox").map(str::to_string),
        timeout_ms: number("--timeout-ms", DEFAULT_TIMEOUT_MS)?,
        max_output_bytes: number("--max-output-bytes", DEFAULT_MAX_OUTPUT_BYTES)?,
        pipeline,
    })
}

/// Plain ASCII digits (no sign, no spaces), at most 19 of them.
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 19 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The name as far as it can be told, for a rejection's `tool_name`: the first word
/// before `--` that is neither a flag nor the value of one of `value_flags` (never a
/// word of the pipeline).
fn name_hint<'a>(words: &[&'a str], value_flags: &[&str]) -> Option<&'a str> {
    let mut before = words.iter().copied().take_while(|w| *w != "--");
    while let Some(word) = before.next() {
        if value_flags.contains(&word) {
            before.next();
        } else if !word.starts_with('-') {
            return Some(word);
        }
    }
    None
}

/// The words after the verb: one positional, flag values, and (publish) the words
/// after `--`.
struct Words<'a> {
    positional: Vec<&'a str>,
    values: BTreeMap<&'static str, &'a str>,
    trailing: Option<Vec<&'a str>>,
}

impl<'a> Words<'a> {
    fn parse(
        words: &[&'a str],
        known: &[&'static str],
        takes_trailing: bool,
    ) -> Result<Self, Usage> {
        let mut parsed = Words {
            positional: Vec::new(),
            values: BTreeMap::new(),
            trailing: None,
        };
        let name_hint = name_hint(words, known);
        let mut it = words.iter().copied();
        while let Some(word) = it.next() {
            if word == "--" {
                if !takes_trailing {
                    return Err(usage(name_hint, "unexpected --"));
                }
                parsed.trailing = Some(it.by_ref().collect());
                break;
            }
            if !word.starts_with('-') || word == "-" {
                parsed.positional.push(word);
                continue;
            }
            let (flag, inline) = match word.split_once('=') {
                Some((flag, value)) => (flag, Some(value)),
                None => (word, None),
            };
            let Some(&flag) = known.iter().find(|k| **k == flag) else {
                return Err(usage(name_hint, format!("unknown flag {flag:?}")));
            };
            let value = match inline {
                Some(value) => value,
                None => it
                    .next()
                    .ok_or_else(|| usage(name_hint, format!("{flag} needs a value")))?,
            };
            if parsed.values.insert(flag, value).is_some() {
                return Err(usage(name_hint, format!("{flag} given twice")));
            }
        }
        Ok(parsed)
    }

    fn value(&self, flag: &str) -> Option<&'a str> {
        self.values.get(flag).copied()
    }

    fn name(&self) -> Result<&'a str, Usage> {
        match self.positional.as_slice() {
            [name] => Ok(name),
            [] => Err(usage(None, "missing NAME")),
            [name, ..] => Err(usage(
                Some(name),
                format!("expected one NAME, got {:?}", self.positional),
            )),
        }
    }
}

/// A command line that cannot be carried out, and the tool it names (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    pub tool_name: Option<String>,
    pub problem: String,
}

impl Usage {
    /// The `rejected_before_effect` answer (exit 2) for it.
    pub fn answer(&self) -> PublicationAnswer {
        PublicationAnswer::rejected(
            self.tool_name.as_deref(),
            format!("{}; usage: {SYNOPSIS}", self.problem),
            true,
        )
    }
}

fn usage(tool_name: Option<&str>, problem: impl std::fmt::Display) -> Usage {
    Usage {
        tool_name: tool_name.map(str::to_string),
        problem: problem.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::publication::Outcome;

    fn p(args: &[&str]) -> Result<PublicationRequest, Usage> {
        parse(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    fn rejected(args: &[&str]) -> PublicationAnswer {
        let answer = p(args).expect_err("a rejection").answer();
        assert_eq!(answer.result.result, Outcome::RejectedBeforeEffect);
        assert_eq!(answer.exit_code(), 2, "{args:?}");
        answer
    }

    #[test]
    fn publish_forms() {
        assert_eq!(
            p(&["publish", "hello", "--", "tr a-z A-Z"]).unwrap(),
            PublicationRequest::Publish {
                tool_name: "hello".into(),
                description: None,
                sandbox: None,
                timeout_ms: 120_000,
                max_output_bytes: 262_144,
                pipeline: "tr a-z A-Z".into(),
            }
        );
        assert_eq!(
            p(&[
                "publish",
                "--description",
                "-dash first",
                "hello",
                "--sandbox=dev",
                "--timeout-ms",
                "5",
                "--max-output-bytes=7",
                "--",
                "--kit x",
            ])
            .unwrap(),
            PublicationRequest::Publish {
                tool_name: "hello".into(),
                description: Some("-dash first".into()),
                sandbox: Some("dev".into()),
                timeout_ms: 5,
                max_output_bytes: 7,
                pipeline: "--kit x".into(),
            }
        );
    }

    #[test]
    fn bad_command_lines_are_usage_rejections() {
        for args in [
            &[][..],
            &["frob"],
            &["publish"],
            &["publish", "hello"],
            &["publish", "hello", "--"],
            &["publish", "hello", "--", "a", "b"],
            &["publish", "hello", "extra", "--", "x"],
            &["publish", "-bad", "--", "x"],
            &["publish", "..", "--", "x"],
            &["publish", "hello", "--timeout-ms", "0", "--", "x"],
            &["publish", "hello", "--timeout-ms", "900001", "--", "x"],
            &["publish", "hello", "--timeout-ms", "+5", "--", "x"],
            &[
                "publish",
                "hello",
                "--max-output-bytes",
                "262145",
                "--",
                "x",
            ],
            &["publish", "hello", "--sandbox", "a b", "--", "x"],
            &[
                "publish",
                "hello",
                "--sandbox",
                "a",
                "--sandbox",
                "b",
                "--",
                "x",
            ],
            &["publish", "hello", "--bogus", "--", "x"],
            &["publish", "hello", "--", ""],
            &["unpublish"],
            &["unpublish", "a", "b"],
            &["unpublish", "a", "--"],
            &["load", "a"],
            &["load", "a", "--sandbox"],
        ] {
            rejected(args);
        }
        let answer = rejected(&["publish", "hello", "--timeout-ms", "0", "--", "x"]);
        assert_eq!(answer.result.tool_name.as_deref(), Some("hello"));
        // The server depends on the publisher, which only the daemon knows.
        assert_eq!(answer.result.server, None);
        // The name is never taken from the pipeline or from a flag's value.
        for args in [
            &["publish", "-x", "--", "cat"][..],
            &["publish", "--sandbox", "dev", "--bogus", "--", "cat"],
            &["publish", "--kit", "k", "--", "cat"],
        ] {
            let answer = rejected(args);
            assert_eq!(answer.result.tool_name, None, "{args:?}");
        }
        let answer = rejected(&[
            "publish",
            "--sandbox",
            "dev",
            "hello",
            "--bogus",
            "--",
            "cat",
        ]);
        assert_eq!(answer.result.tool_name.as_deref(), Some("hello"));
    }

    #[test]
    fn kit_targets_are_refused() {
        for args in [
            &["publish", "hello", "--kit", "codex", "--", "x"][..],
            &["publish", "--kit=codex", "hello", "--", "x"],
            &["load", "hello", "--kit", "codex"],
            &["load", "hello", "--sandbox", "s", "--kit", "codex"],
            &["unpublish", "hello", "--kit", "k"],
        ] {
            let answer = rejected(args);
            let reason = answer.result.reason.unwrap_or_default();
            assert!(
                reason.contains("--kit targets are not supported"),
                "{reason}"
            );
        }
    }
}
