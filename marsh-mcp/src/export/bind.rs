//! Call arguments → what runs. Everything is checked before any job: unknown
//! properties, types, required fields, sizes, and values that would read as options.
//! Nothing is ever interpolated by a shell: a pipeline gets the input on stdin, a
//! command gets argv words.

use marsh_publication::{
    Action, ArgBinding, DEFAULT_STDIN_BYTES, Declaration, FieldKind, MAX_STRING_BYTES,
};
use serde_json::{Map, Value};

use crate::error::ToolError;

/// One call, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invocation {
    Pipeline {
        pipeline: String,
        stdin: Vec<u8>,
    },
    Kit {
        kit: String,
        args: Vec<String>,
        stdin: Vec<u8>,
    },
}

fn string_limit(decl: &Declaration, field: &str) -> usize {
    match &decl.action {
        Action::Pipeline(_) => DEFAULT_STDIN_BYTES as usize,
        Action::Command {
            stdin: Some(stdin), ..
        } if stdin.field == field => stdin.max_bytes as usize,
        Action::Command { .. } => MAX_STRING_BYTES,
    }
}

/// Checks `arguments` against the declaration's fields.
fn checked(
    decl: &Declaration,
    arguments: &Option<Map<String, Value>>,
) -> Result<Map<String, Value>, ToolError> {
    let empty = Map::new();
    let given: &Map<String, Value> = arguments.as_ref().unwrap_or(&empty);
    if let Some(unknown) = given
        .keys()
        .find(|k| !decl.fields.iter().any(|f| &f.name == *k))
    {
        return Err(ToolError::invalid(format!(
            "unknown argument {unknown:?}; this tool takes {}",
            describe_fields(decl)
        )));
    }
    for field in &decl.fields {
        match (given.get(&field.name), field.kind) {
            (None | Some(Value::Null), _) if field.required => {
                return Err(ToolError::invalid(format!(
                    "missing required argument {:?}",
                    field.name
                )));
            }
            (None | Some(Value::Null), _) | (Some(Value::Bool(_)), FieldKind::Boolean) => {}
            (Some(Value::String(text)), FieldKind::String) => {
                let limit = string_limit(decl, &field.name);
                if text.len() > limit {
                    return Err(ToolError::invalid(format!(
                        "argument {:?} is {} bytes; the limit is {limit}",
                        field.name,
                        text.len()
                    )));
                }
            }
            (Some(_), kind) => {
                return Err(ToolError::invalid(format!(
                    "argument {:?} must be a {}",
                    field.name,
                    match kind {
                        FieldKind::String => "string",
                        FieldKind::Boolean => "boolean",
                    }
                )));
            }
        }
    }
    Ok(given.clone())
}

fn describe_fields(decl: &Declaration) -> String {
    if decl.fields.is_empty() {
        return "no arguments".into();
    }
    decl.fields
        .iter()
        .map(|f| f.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn text<'a>(args: &'a Map<String, Value>, field: &str) -> Option<&'a str> {
    args.get(field).and_then(Value::as_str)
}

/// A value bound as an argv word: it must not read as an option, nor hold NUL.
fn word(field: &str, value: &str) -> Result<String, ToolError> {
    if value.starts_with('-') {
        return Err(ToolError::invalid(format!(
            "argument {field:?} may not start with '-' (it would read as an option)"
        )));
    }
    if value.contains('\0') {
        return Err(ToolError::invalid(format!(
            "argument {field:?} contains NUL"
        )));
    }
    Ok(value.to_string())
}

/// Builds the run for one call.
pub fn bind(
    decl: &Declaration,
    arguments: &Option<Map<String, Value>>,
) -> Result<Invocation, ToolError> {
    let args = checked(decl, arguments)?;
    match &decl.action {
        Action::Pipeline(pipeline) => Ok(Invocation::Pipeline {
            pipeline: pipeline.clone(),
            stdin: text(&args, "input").unwrap_or_default().as_bytes().to_vec(),
        }),
        Action::Command { kit, argv, stdin } => {
            let mut words = Vec::with_capacity(argv.len() * 2);
            for binding in argv {
                match binding {
                    ArgBinding::Literal(w) => words.push(w.clone()),
                    ArgBinding::Positional(field) => {
                        if let Some(value) = text(&args, field) {
                            words.push(word(field, value)?);
                        }
                    }
                    ArgBinding::NamedOption { option, field } => {
                        if let Some(value) = text(&args, field) {
                            words.push(option.clone());
                            words.push(word(field, value)?);
                        }
                    }
                    ArgBinding::Flag { option, field } => {
                        if args.get(field) == Some(&Value::Bool(true)) {
                            words.push(option.clone());
                        }
                    }
                }
            }
            let stdin = stdin
                .as_ref()
                .and_then(|s| text(&args, &s.field))
                .unwrap_or_default()
                .as_bytes()
                .to_vec();
            Ok(Invocation::Kit {
                kit: kit.clone(),
                args: words,
                stdin,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn command_decl() -> Declaration {
        let value = json!({
            "schema": "marsh.published_tool/v1",
            "tool_name": "fmt",
            "description": "Format",
            "command": {"kit": "fmt-kit", "bindings": {
                "argv": [
                    {"literal": "check"},
                    {"positional": "path"},
                    {"named_option": {"option": "--lang", "field": "lang"}},
                    {"flag": {"option": "--dry-run", "field": "dry_run"}}
                ],
                "stdin": {"field": "text", "max_bytes": 8}
            }},
            "input_schema": {"type": "object", "additionalProperties": false, "required": ["path"],
                "properties": {
                    "path": {"type": "string"}, "lang": {"type": "string"},
                    "dry_run": {"type": "boolean"}, "text": {"type": "string"}
                }},
            "canonical_workspace": "/w",
            "workspace_identity": {"device": 1, "inode": 2},
            "home": "/h",
        });
        Declaration::parse(&serde_json::to_vec(&value).unwrap()).unwrap()
    }

    fn args(value: Value) -> Option<Map<String, Value>> {
        match value {
            Value::Object(map) => Some(map),
            _ => None,
        }
    }

    #[test]
    fn every_binding_kind_builds_its_words() {
        let decl = command_decl();
        let full = bind(
            &decl,
            &args(json!({"path": "a b.txt", "lang": "rust", "dry_run": true, "text": "hi"})),
        )
        .unwrap();
        assert_eq!(
            full,
            Invocation::Kit {
                kit: "fmt-kit".into(),
                args: vec!["check", "a b.txt", "--lang", "rust", "--dry-run"]
                    .into_iter()
                    .map(String::from)
                    .collect(),
                stdin: b"hi".to_vec(),
            }
        );
        let minimal = bind(&decl, &args(json!({"path": "x", "dry_run": false}))).unwrap();
        let Invocation::Kit {
            args: words, stdin, ..
        } = minimal
        else {
            panic!("not a kit run")
        };
        assert_eq!(words, vec!["check".to_string(), "x".to_string()]);
        assert!(stdin.is_empty());
    }

    #[test]
    fn bad_arguments_are_refused_before_any_run() {
        let decl = command_decl();
        for (value, expected) in [
            (json!({"path": "x", "extra": 1}), "unknown argument"),
            (json!({}), "missing required"),
            (json!({"path": 3}), "must be a string"),
            (json!({"path": "x", "dry_run": "yes"}), "must be a boolean"),
            (json!({"path": "-rf"}), "may not start with '-'"),
            (
                json!({"path": "x", "lang": "--evil"}),
                "may not start with '-'",
            ),
            (json!({"path": "x", "text": "123456789"}), "the limit is 8"),
        ] {
            let err = bind(&decl, &args(value)).unwrap_err();
            assert!(
                err.message.contains(expected),
                "{expected}: {}",
                err.message
            );
        }
    }
}
