//! Every tool result the harness receives is checked against the `outputSchema` the
//! same server published for that tool in `tools/list`: the whole envelope with a JSON
//! Schema validator, and a successful `data` once more with its schema closed
//! (`additionalProperties: false`), so a field the schema does not name fails too.
//! Each black-box test that calls a tool through [`crate::Server::call`] is thereby a
//! schema test of every path it reaches.

use std::collections::HashMap;

use jsonschema::Validator;
use serde_json::{Value, json};

/// One tool's compiled checks.
struct ToolSchema {
    envelope: Validator,
    /// `data`'s schema with `additionalProperties: false`; absent when the published
    /// schema does not describe `data` as an object.
    closed_data: Option<Validator>,
}

/// The output schemas of one server's catalog, by tool name.
#[derive(Default)]
pub struct OutputSchemas {
    tools: HashMap<String, ToolSchema>,
}

fn compile(schema: &Value, what: &str) -> Validator {
    jsonschema::validator_for(schema)
        .unwrap_or_else(|e| panic!("{what} is not a valid JSON Schema ({e}): {schema}"))
}

impl OutputSchemas {
    /// Compiles the `outputSchema` of every tool in a `tools/list` result; every tool
    /// must have one.
    pub fn from_tools_list(result: &Value) -> Self {
        let mut tools = HashMap::new();
        for tool in result["tools"].as_array().into_iter().flatten() {
            let name = tool["name"].as_str().expect("tool name").to_string();
            let schema = &tool["outputSchema"];
            assert!(schema.is_object(), "{name} has no outputSchema: {tool}");
            let envelope = compile(schema, &format!("{name}'s outputSchema"));
            let data = &schema["properties"]["data"];
            let closed_data = (data["type"] == "object").then(|| {
                let mut closed = data.clone();
                closed["additionalProperties"] = json!(false);
                compile(&closed, &format!("{name}'s closed data schema"))
            });
            tools.insert(
                name,
                ToolSchema {
                    envelope,
                    closed_data,
                },
            );
        }
        Self { tools }
    }

    /// Whether `name` is in the catalog these schemas came from.
    pub fn has(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// Panics, naming every violation, unless `envelope` (a result's
    /// `structuredContent`) is valid under `name`'s published schema and, when it
    /// succeeded, its `data` names no field the schema leaves out.
    pub fn check(&self, name: &str, envelope: &Value) {
        let Some(tool) = self.tools.get(name) else {
            return;
        };
        let errors: Vec<String> = tool
            .envelope
            .iter_errors(envelope)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{name}'s result does not match its outputSchema: {errors:?}\nresult: {envelope}"
        );
        if envelope["ok"] == json!(true)
            && let Some(closed) = &tool.closed_data
        {
            let undocumented: Vec<String> = closed
                .iter_errors(&envelope["data"])
                .map(|e| e.to_string())
                .collect();
            assert!(
                undocumented.is_empty(),
                "{name}'s data has fields its outputSchema does not name: {undocumented:?}\ndata: {}",
                envelope["data"]
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schemas() -> OutputSchemas {
        OutputSchemas::from_tools_list(&json!({"tools": [{
            "name": "t",
            "outputSchema": {
                "type": "object",
                "properties": {
                    "ok": {"type": "boolean"},
                    "data": {
                        "type": "object",
                        "properties": {"state": {"type": "string", "enum": ["a", "b"]}},
                        "patternProperties": {"^(x_ms|y_ms)$": {"type": ["integer", "null"]}}
                    },
                    "error": {"type": "object", "required": ["kind", "message", "retryable"]}
                },
                "required": ["ok"]
            }
        }]}))
    }

    fn fails(envelope: Value) -> bool {
        std::panic::catch_unwind(|| schemas().check("t", &envelope)).is_err()
    }

    #[test]
    fn a_result_is_checked_field_by_field() {
        assert!(!fails(
            json!({"ok": true, "data": {"state": "a", "x_ms": 1, "y_ms": null}})
        ));
        assert!(!fails(
            json!({"ok": false, "error": {"kind": "k", "message": "m", "retryable": false}})
        ));
        assert!(fails(json!({"ok": true, "data": {"state": "c"}})));
        assert!(fails(json!({"ok": true, "data": {"x_ms": "1"}})));
        assert!(fails(json!({"ok": true, "data": {"unnamed": 1}})));
        assert!(fails(json!({"ok": false, "error": {"kind": "k"}})));
        assert!(fails(json!({"data": {}})));
        // A tool outside the catalog is not checked.
        schemas().check("other", &json!({"anything": true}));
    }
}
