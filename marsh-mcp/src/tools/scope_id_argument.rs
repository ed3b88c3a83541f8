//! `scope_*` tools take the same arguments as their default-scope aliases plus a
//! required `scope_id`. The id is taken out of the arguments first, so the rest is
//! parsed by the alias's own closed struct and unknown fields are still refused.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{Map, Value, json};

use crate::error::ToolError;
use crate::scopes::{ScopeSet, ScopeView};

/// Removes `scope_id` from `arguments` and resolves it.
pub(crate) fn take_scope(
    scopes: &ScopeSet,
    arguments: &mut Option<Map<String, Value>>,
) -> Result<ScopeView, ToolError> {
    let value = arguments
        .as_mut()
        .and_then(|m| m.remove("scope_id"))
        .ok_or_else(|| ToolError::invalid("missing field `scope_id`"))?;
    let Value::String(text) = value else {
        return Err(ToolError::invalid("scope_id must be a string"));
    };
    scopes.resolve(&text)
}

/// `schema` with a required `scope_id` property added.
pub(crate) fn with_scope_id(schema: Arc<JsonObject>) -> Arc<JsonObject> {
    let mut schema = (*schema).clone();
    let properties = schema.entry("properties").or_insert_with(|| json!({}));
    if let Some(props) = properties.as_object_mut() {
        props.insert(
            "scope_id".into(),
            // No `pattern`: a malformed id is refused as `invalid_argument` with the
            // rule (`ScopeSet::resolve`), and eleven copies of a UUID regex cost ~1 KB
            // of every tools/list.
            json!({
                "type": "string",
                "description": "`default` or an id scope_start returned"
            }),
        );
    }
    let required = schema.entry("required").or_insert_with(|| json!([]));
    if let Some(list) = required.as_array_mut() {
        list.insert(0, Value::from("scope_id"));
    }
    Arc::new(schema)
}
