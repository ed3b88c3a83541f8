//! The JSON Schemas of the catalog, generated from the argument and result types.
//!
//! Input schemas are shaped for clients that build forms or parse `key=value` flags:
//! optional parameters typed plainly with their `default`.
//!
//! Output schemas come in two forms from one generation. The strict `data` schema is
//! the result type's own (serialize contract: what is always sent is `required`), with
//! every `$ref` inlined and no prose. The published one — the envelope around a
//! compacted `data` — is what `tools/list` carries: every byte of it is read by the
//! model each session, and the catalog must stay within 32 KiB. Compaction only ever
//! loosens ([`published`]), so anything valid under the strict schema is valid under
//! the published one; the black-box harness checks every real result against the
//! published schema with that schema closed (`additionalProperties: false`), so a
//! field the catalog does not name fails a test.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::JsonObject;
use schemars::JsonSchema;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

/// `T`'s input schema as clients need it: optional parameters typed plainly
/// (`integer`, not `["integer", "null"]`) with their `default`, so form-based clients
/// and CLIs can set them. An explicit `null` is still accepted (it means the default).
pub(crate) fn input_schema<T: JsonSchema>() -> Arc<JsonObject> {
    let mut map = root_of::<T>(SchemaSettings::default().into_generator());
    // The tool's own title and description say this.
    map.remove("title");
    map.remove("description");
    let defs = take_defs(&mut map);
    if let Some(Value::Object(props)) = map.get_mut("properties") {
        props.values_mut().for_each(plain_property);
    }
    let mut schema = Value::Object(map);
    inline_refs(&mut schema, &defs);
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

/// The output schema of a tool whose `data` is a `T`, as published: the envelope every
/// tool answers (`{ok: true, data}` or `{ok: false, error}`) with `data` described
/// field by field, made compact (see [`published`]).
pub(crate) fn output_schema<T: JsonSchema>() -> Arc<JsonObject> {
    let mut data = strict_data_schema::<T>();
    published(&mut data);
    envelope(data)
}

/// `T`'s own schema with every `$ref` inlined and no prose, but every `required` kept:
/// the reference the published form is derived from and compared with (the unit tests
/// here: the same fields, only looser).
fn strict_data_schema<T: JsonSchema>() -> Value {
    // The serialize contract: a field is required unless it has `skip_serializing_if`
    // (an `Option` sent as `null` is required and nullable), which is what a result
    // carries. The default (deserialize) contract would make every `Option` optional.
    let mut map = root_of::<T>(
        SchemaSettings::draft2020_12()
            .for_serialize()
            .into_generator(),
    );
    let defs = take_defs(&mut map);
    let mut data = Value::Object(map);
    inline_refs(&mut data, &defs);
    each_subschema(&mut data, &mut |map| {
        for key in DROPPED_OUTPUT_KEYWORDS {
            map.remove(*key);
        }
    });
    data
}

/// The envelope around a `data` schema. `error` is named field by field only by its
/// `required` list: the same three fields in every tool, so their types (string,
/// string, boolean) are left to docs/tools.md rather than repeated 22 times.
fn envelope(data: Value) -> Arc<JsonObject> {
    let envelope = json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "data": data,
            "error": {"type": "object", "required": ["kind", "message", "retryable"]}
        },
        "required": ["ok"]
    });
    match envelope {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(JsonObject::new()),
    }
}

/// `T`'s schema from `generator`, as an object without `$schema` (implied by MCP).
fn root_of<T: JsonSchema>(generator: SchemaGenerator) -> Map<String, Value> {
    match serde_json::to_value(generator.into_root_schema_for::<T>()) {
        Ok(Value::Object(mut map)) => {
            map.remove("$schema");
            map
        }
        _ => Map::new(),
    }
}

/// Removes and returns the schema's `$defs` (empty if none).
fn take_defs(map: &mut Map<String, Value>) -> Map<String, Value> {
    match map.remove("$defs") {
        Some(Value::Object(defs)) => defs,
        _ => Map::new(),
    }
}

/// Keywords no output schema carries: prose and annotations the names already carry,
/// and `format`/`minimum` (a `uint` is an `integer`; the sign is no news).
const DROPPED_OUTPUT_KEYWORDS: &[&str] = &["description", "title", "format", "minimum"];

/// Keywords whose values are data, not schemas: never walked.
const DATA_KEYWORDS: &[&str] = &["enum", "const", "default", "examples"];
/// Keywords whose values map names to schemas: only the values are walked (a property
/// named `title` is not a keyword).
const NAME_MAP_KEYWORDS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "dependentSchemas",
];

/// Applies `f` to every subschema of `schema`, innermost first.
fn each_subschema(schema: &mut Value, f: &mut impl FnMut(&mut Map<String, Value>)) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let key = key.as_str();
                if DATA_KEYWORDS.contains(&key) {
                    continue;
                }
                match value {
                    Value::Object(named) if NAME_MAP_KEYWORDS.contains(&key) => {
                        named.values_mut().for_each(|s| each_subschema(s, f));
                    }
                    value => each_subschema(value, f),
                }
            }
            f(map);
        }
        Value::Array(items) => items.iter_mut().for_each(|v| each_subschema(v, f)),
        _ => {}
    }
}

/// Inlines every `$ref` to `defs`, repeatedly (a definition may refer to another), so
/// a client sees each type without resolving references.
fn inline_refs(schema: &mut Value, defs: &Map<String, Value>) {
    // The types form no cycles, so each pass removes a level; the bound only guards
    // against a future recursive type.
    for _ in 0..16 {
        let mut inlined = false;
        each_subschema(schema, &mut |map| {
            let target = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/$defs/"))
                .and_then(|name| defs.get(name))
                .cloned();
            if let Some(Value::Object(target)) = target {
                map.remove("$ref");
                for (key, value) in target {
                    map.entry(key).or_insert(value);
                }
                inlined = true;
            }
        });
        if !inlined {
            break;
        }
    }
}

/// The published form of a strict `data` schema, equivalent or looser, never
/// stricter, so a result valid under the strict schema is valid under this one:
/// - no `required` (the names and types are the news; the strict schema keeps them);
/// - a `oneOf` of string constants and enums (how schemars writes a documented enum)
///   becomes one `enum`;
/// - `anyOf: [S, {type: null}]` (an `Option<S>`) becomes S with `null` added to its
///   `type`;
/// - `data`'s own fields are itemised; a nested object (an operation's `error`, the
///   `scope` after a lifecycle step, a stopped read's `operation`, doctor's groups) and
///   an array's items keep only their type. Each nested shape is itemised where it is
///   the subject: a scope in `scope_status`, an operation in `operation_get`, the
///   error in the envelope. Itemising them everywhere made the catalog 38 KB;
/// - properties that share one schema are named once: `patternProperties` with an
///   anchored alternation of their exact names (`^(created_ms|timeout_ms)$`), which a
///   validator applies exactly like one `properties` entry per name. A report's thirty
///   fields have eight distinct types; one entry per name cost another 8 KB.
fn published(data: &mut Value) {
    each_subschema(data, &mut |map| {
        map.remove("required");
        for key in ["oneOf", "anyOf"] {
            if let Some(Value::Array(branches)) = map.get(key)
                && let Some(values) = string_constants(branches)
            {
                map.remove(key);
                map.insert("type".into(), Value::from("string"));
                map.insert("enum".into(), Value::Array(values));
            }
        }
        if map.len() == 1
            && let Some(Value::Array(branches)) = map.get("anyOf")
            && let [Value::Object(some), Value::Object(none)] = branches.as_slice()
            && none.len() == 1
            && none.get("type").is_some_and(|t| t == "null")
            && let Some(Value::String(ty)) = some.get("type")
        {
            // S with `null` allowed wherever S restricts values: its `type`, and its
            // `enum`/`const` (a nullable enum must still accept `null`).
            let mut merged = some.clone();
            merged.insert("type".into(), json!([ty, "null"]));
            if let Some(value) = merged.remove("const") {
                merged.insert("enum".into(), json!([value]));
            }
            if let Some(Value::Array(values)) = merged.get_mut("enum") {
                values.push(Value::Null);
            }
            *map = merged;
        }
    });
    if let Some(Value::Object(props)) = data.get_mut("properties") {
        props.values_mut().for_each(only_types_below);
    }
    each_subschema(data, &mut group_properties);
}

/// A field's schema with a nested object reduced to its `type` (every keyword about
/// its members goes, so none can reject one), and an array's items to theirs.
fn only_types_below(field: &mut Value) {
    let Value::Object(map) = field else { return };
    if map.contains_key("properties") || map.contains_key("patternProperties") {
        map.retain(|key, _| key == "type");
    }
    if let Some(Value::Object(items)) = map.get_mut("items") {
        items.retain(|key, _| key == "type");
    }
}

/// Moves properties that share one schema into one `patternProperties` entry naming
/// them exactly. Only plain names (`[a-z0-9_]`, nothing a regex would read) are moved,
/// and only where at least two share a schema.
fn group_properties(map: &mut Map<String, Value>) {
    let Some(Value::Object(props)) = map.get_mut("properties") else {
        return;
    };
    let plain = |name: &str| {
        !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    // Keyed by the schema's canonical text (serde_json maps are sorted); BTreeMap keeps
    // the output deterministic.
    let mut by_schema: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, schema) in props.iter() {
        if plain(name) {
            by_schema
                .entry(schema.to_string())
                .or_default()
                .push(name.clone());
        }
    }
    let mut patterns = Map::new();
    for names in by_schema.into_values().filter(|names| names.len() >= 2) {
        let mut schema = Value::Null;
        for name in &names {
            if let Some(value) = props.remove(name) {
                schema = value;
            }
        }
        patterns.insert(format!("^({})$", names.join("|")), schema);
    }
    if patterns.is_empty() {
        return;
    }
    if props.is_empty() {
        map.remove("properties");
    }
    map.insert("patternProperties".into(), Value::Object(patterns));
}

/// The string values of `branches` when each is a string `const` or a string `enum`.
fn string_constants(branches: &[Value]) -> Option<Vec<Value>> {
    let mut values = Vec::new();
    for branch in branches {
        let branch = branch.as_object()?;
        if branch.get("type").is_some_and(|t| t != "string") {
            return None;
        }
        match (branch.get("const"), branch.get("enum")) {
            (Some(Value::String(c)), None) => values.push(Value::from(c.as_str())),
            (None, Some(Value::Array(e))) if e.iter().all(Value::is_string) => {
                values.extend(e.iter().cloned());
            }
            _ => return None,
        }
    }
    Some(values)
}

/// One property without `null` in its type, without the non-standard `format: uint64`
/// (`minimum` states the sign) and with its doc comment on one line.
fn plain_property(property: &mut Value) {
    let Value::Object(p) = property else { return };
    if let Some(Value::Array(types)) = p.get("type") {
        let mut types: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        let plain = match types.len() {
            1 => types.remove(0),
            _ => Value::Array(types),
        };
        p.insert("type".into(), plain);
    }
    if p.get("format").is_some_and(|f| f == "uint64") {
        p.remove("format");
    }
    if let Some(Value::String(text)) = p.get_mut("description") {
        *text = text.replace('\n', " ");
    }
}

#[cfg(test)]
mod tests {
    use super::super::result_data::*;
    use super::*;

    /// The names a `data` schema itemises at its top level: `properties` keys and the
    /// names in `patternProperties` alternations.
    fn itemised(data: &Value) -> Vec<String> {
        let mut names: Vec<String> = data["properties"]
            .as_object()
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        for pattern in data["patternProperties"].as_object().into_iter().flatten() {
            let inner = pattern
                .0
                .strip_prefix("^(")
                .and_then(|p| p.strip_suffix(")$"))
                .unwrap();
            names.extend(inner.split('|').map(str::to_owned));
        }
        names.sort();
        names
    }

    fn published_data<T: JsonSchema>() -> Value {
        output_schema::<T>()["properties"]["data"].clone()
    }

    /// The published schema names exactly the strict schema's fields, each once, and
    /// requires nothing: compaction moves names, it never drops or adds one.
    fn same_fields<T: JsonSchema>() {
        let strict = strict_data_schema::<T>();
        let mut expected: Vec<String> = strict["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        expected.sort();
        let published = published_data::<T>();
        assert_eq!(itemised(&published), expected, "{published}");
        assert!(
            !published.to_string().contains("\"required\""),
            "{published}"
        );
        assert!(!published.to_string().contains("$ref"), "{published}");
        assert!(
            !published.to_string().contains("description"),
            "{published}"
        );
    }

    #[test]
    fn compaction_keeps_every_field_of_every_result_type() {
        same_fields::<DoctorReport>();
        same_fields::<StatusResult>();
        same_fields::<ReceiptRead<ReceiptList>>();
        same_fields::<ReceiptRead<ReceiptOne>>();
        same_fields::<OperationReport>();
        same_fields::<WorkersResult>();
        same_fields::<LifecycleResult>();
        same_fields::<ScopeStopResult>();
        same_fields::<ScopeListResult>();
        same_fields::<OperationGetResult>();
        same_fields::<OperationListResult>();
        same_fields::<OperationOutputResult>();
        same_fields::<OperationCancelResult>();
        same_fields::<QualifyResult>();
    }

    /// The top-level `data` fields of every result type, as clients see them: a field
    /// renamed, dropped or added changes the wire format, so it must change here too
    /// (and in docs/tools.md), on purpose. The harness cannot notice a dropped field (the
    /// published schemas require nothing).
    #[test]
    fn the_wire_fields_of_every_result_type_are_the_documented_ones() {
        const HEAD: &str = "cancel_requested created_ms duration_ms error exit_code finished_ms kind operation_id output_complete scope_id signal started_ms state stderr_total_bytes stdout_total_bytes timeout_ms";
        const OUTPUT: &str = "latest_seq more_to_page next_seq output_truncated shrunk_to_fit start_seq stderr_base64 stderr_page_bytes stderr_text stderr_text_state stdout_base64 stdout_page_bytes stdout_text stdout_text_state tail";
        const SCOPE: &str = "created_ms identity_invalid last_error last_operation scope_id state";
        let fields = |lists: &[&str]| {
            let mut names: Vec<String> = lists
                .iter()
                .flat_map(|l| l.split(' '))
                .map(str::to_owned)
                .collect();
            names.sort();
            names.dedup();
            names
        };
        let report = [HEAD, OUTPUT, "hint"];
        let check = |got: Vec<String>, want: Vec<String>, what: &str| {
            assert_eq!(got, want, "{what}: {}", got.join(" "));
        };
        check(
            itemised(&published_data::<OperationReport>()),
            fields(&report),
            "OperationReport",
        );
        check(
            itemised(&published_data::<WorkersResult>()),
            fields(&[&report[..], &["selection"]].concat()),
            "WorkersResult",
        );
        check(
            itemised(&published_data::<QualifyResult>()),
            fields(&[&report[..], &["gate make_target"]].concat()),
            "QualifyResult",
        );
        check(
            itemised(&published_data::<LifecycleResult>()),
            fields(&[&report[..], &["scope"]].concat()),
            "LifecycleResult",
        );
        check(
            itemised(&published_data::<ScopeStopResult>()),
            fields(&[&report[..], &["scope note"]].concat()),
            "ScopeStopResult",
        );
        let summary = [HEAD, "latest_seq result"];
        check(
            itemised(&published_data::<OperationGetResult>()),
            fields(&[&summary[..], &["wait_result"]].concat()),
            "OperationGetResult",
        );
        check(
            itemised(&published_data::<OperationCancelResult>()),
            fields(&[&summary[..], &["cancel_accepted note"]].concat()),
            "OperationCancelResult",
        );
        check(
            itemised(&published_data::<OperationOutputResult>()),
            fields(&[OUTPUT, "hint operation_id output_complete state"]),
            "OperationOutputResult",
        );
        check(
            itemised(&published_data::<StatusResult>()),
            fields(&[
                SCOPE,
                "active_runs kits lifecycle_in_progress mode operation_slots_free runtime runtime_state workspace_hash",
            ]),
            "StatusResult",
        );
        check(
            itemised(&published_data::<OperationListResult>()),
            fields(&["live more_available operations"]),
            "OperationListResult",
        );
        check(
            itemised(&published_data::<ScopeListResult>()),
            fields(&["limits live_generated mode retained_generated scopes"]),
            "ScopeListResult",
        );
        check(
            itemised(&published_data::<ReceiptRead<ReceiptList>>()),
            fields(&["hint more_available operation results returned scope scope_id"]),
            "ReceiptRead<ReceiptList>",
        );
        check(
            itemised(&published_data::<ReceiptRead<ReceiptOne>>()),
            fields(&["hint operation result scope scope_id"]),
            "ReceiptRead<ReceiptOne>",
        );
        check(
            itemised(&published_data::<DoctorReport>()),
            fields(&[
                "checks child_environment default_scope_state full_sbx_control healthy limits mode operations scopes server_name version workspace_hash",
            ]),
            "DoctorReport",
        );
    }

    /// docs/tools.md has one row per field name with its one meaning, across every
    /// tool: every name a result can carry has a row, and no row names a field that
    /// no result has. (A name with two meanings would need two rows.)
    #[test]
    fn the_field_table_in_the_docs_names_every_field_once() {
        let docs = include_str!("../../../docs/tools.md");
        let table = docs
            .split("<!-- field-table:start -->")
            .nth(1)
            .and_then(|rest| rest.split("<!-- field-table:end -->").next())
            .expect("docs/tools.md has the field table");
        let mut rows: Vec<String> = table
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .map(str::to_owned)
            .collect();
        let listed = rows.len();
        rows.sort();
        rows.dedup();
        assert_eq!(rows.len(), listed, "a field has two rows");
        let mut names: Vec<String> = [
            itemised(&published_data::<DoctorReport>()),
            itemised(&published_data::<StatusResult>()),
            itemised(&published_data::<ReceiptRead<ReceiptList>>()),
            itemised(&published_data::<ReceiptRead<ReceiptOne>>()),
            itemised(&published_data::<OperationReport>()),
            itemised(&published_data::<WorkersResult>()),
            itemised(&published_data::<LifecycleResult>()),
            itemised(&published_data::<ScopeStopResult>()),
            itemised(&published_data::<ScopeListResult>()),
            itemised(&published_data::<OperationListResult>()),
            itemised(&published_data::<OperationGetResult>()),
            itemised(&published_data::<OperationOutputResult>()),
            itemised(&published_data::<OperationCancelResult>()),
            itemised(&published_data::<QualifyResult>()),
            itemised(&published_data::<OutputTail>()),
            itemised(&published_data::<OperationListEntry>()),
        ]
        .concat();
        names.sort();
        names.dedup();
        assert_eq!(rows, names);
    }

    #[test]
    fn the_strict_schema_requires_what_is_always_sent() {
        let strict = strict_data_schema::<OperationReport>();
        let required: Vec<&str> = strict["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        for always in [
            "operation_id",
            "state",
            "exit_code",
            "stdout_text",
            "output_complete",
        ] {
            assert!(required.contains(&always), "{always}: {strict}");
        }
        for sometimes in ["hint", "stdout_base64", "stderr_base64"] {
            assert!(!required.contains(&sometimes), "{sometimes}: {strict}");
        }
        // Nested shapes are itemised in the strict schema.
        assert_eq!(strict["properties"]["error"]["anyOf"][0]["type"], "object");
    }

    /// A shape no result has yet: a nullable enum and a nullable nested object.
    #[derive(serde::Serialize, JsonSchema)]
    struct Future {
        /// Documented, so schemars writes the enum as `oneOf` of constants.
        maybe_state: Option<TextState>,
        maybe_wait: Option<WaitResult>,
        nested: Option<ScopeCounts>,
    }

    #[test]
    fn a_nullable_enum_still_accepts_null_once_published() {
        same_fields::<Future>();
        let data = published_data::<Future>();
        let patterns = data["patternProperties"].as_object();
        let field = |name: &str| {
            data["properties"]
                .get(name)
                .cloned()
                .or_else(|| {
                    patterns.and_then(|p| {
                        p.iter()
                            .find(|(k, _)| k.contains(name))
                            .map(|(_, v)| v.clone())
                    })
                })
                .unwrap()
        };
        for name in ["maybe_state", "maybe_wait"] {
            let schema = field(name);
            assert_eq!(
                schema["type"],
                json!(["string", "null"]),
                "{name}: {schema}"
            );
            assert!(
                schema["enum"].as_array().unwrap().contains(&Value::Null),
                "{name}: {schema}"
            );
        }
        assert_eq!(field("nested"), json!({"type": ["object", "null"]}));
    }

    #[test]
    fn published_enums_and_nullable_fields_are_plain() {
        let data = published_data::<OperationReport>();
        let text = data.to_string();
        assert!(!text.contains("oneOf") && !text.contains("anyOf"), "{text}");
        let patterns = data["patternProperties"].as_object().unwrap();
        let states = patterns
            .iter()
            .find(|(k, _)| k.contains("stdout_text_state"))
            .unwrap()
            .1;
        assert_eq!(
            states,
            &json!({"type": "string", "enum": ["utf8", "lossy", "omitted"]})
        );
        let nullable = patterns
            .iter()
            .find(|(k, _)| k.contains("exit_code"))
            .unwrap()
            .1;
        assert_eq!(nullable, &json!({"type": ["integer", "null"]}));
        // A nested object keeps only its type.
        let error = patterns
            .iter()
            .find(|(k, _)| k.contains("error"))
            .unwrap()
            .1;
        assert_eq!(error, &json!({"type": ["object", "null"]}));
        assert_eq!(
            data["properties"]["state"]["enum"],
            json!([
                "queued",
                "running",
                "timed_out",
                "succeeded",
                "exited",
                "failed",
                "cancellation_uncertain"
            ])
        );
    }
}
