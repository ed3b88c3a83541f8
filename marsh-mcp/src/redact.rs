//! No host paths to callers: the one gate every tool result passes on its way out.
//!
//! Messages are written path-free where they are made (pins name their role, registry
//! failures use `caller_message`), but many come from elsewhere: marsh's stderr, a
//! removal's refusal, a diagnostic persisted as a scope's `last_error`. So the final
//! result is also rewritten here: every occurrence of a host place this server knows
//! (the scope root or legacy home, the directories of the pinned executables) becomes
//! its role in angle brackets, e.g. `<scope-root>/2f…/fifo`.
//!
//! Invariants:
//! - The workspace is never rewritten (the shell sees it anyway, and callers name
//!   files by it): strings are split on the workspace path first and only the pieces
//!   between its occurrences are rewritten.
//! - Longer places are rewritten first, so a place inside another keeps its own role.
//! - `*_base64` fields are exact output bytes and are left alone; the text views next
//!   to them are rewritten. Jobs cannot see these places (the sandbox hides them), so
//!   in practice only marsh's own diagnostics differ.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::ToolResult;

#[derive(Debug, Clone)]
pub struct HostPaths {
    workspace: String,
    /// `(path, role)`, longest path first; never `/`, never empty, never the
    /// workspace or one of its ancestors.
    places: Vec<(String, &'static str)>,
}

impl HostPaths {
    pub fn new(workspace: &Path, places: Vec<(PathBuf, &'static str)>) -> Self {
        let mut places: Vec<(String, &'static str)> = places
            .into_iter()
            .filter(|(path, _)| path.is_absolute() && path.parent().is_some())
            .filter(|(path, _)| !workspace.starts_with(path))
            .map(|(path, role)| (path.to_string_lossy().into_owned(), role))
            .collect();
        places.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        places.dedup_by(|a, b| a.0 == b.0);
        Self {
            workspace: workspace.to_string_lossy().into_owned(),
            places,
        }
    }

    /// `text` with every known host place replaced by its role.
    pub fn redact_str(&self, text: &str) -> String {
        if self.workspace.is_empty() {
            return self.redact_piece(text);
        }
        text.split(self.workspace.as_str())
            .map(|piece| self.redact_piece(piece))
            .collect::<Vec<_>>()
            .join(&self.workspace)
    }

    fn redact_piece(&self, piece: &str) -> String {
        let mut out = piece.to_owned();
        for (path, role) in &self.places {
            if out.contains(path.as_str()) {
                out = out.replace(path.as_str(), &format!("<{role}>"));
            }
        }
        out
    }

    /// Rewrites every string of `value` in place, except `*_base64` fields.
    pub fn redact_value(&self, value: &mut Value) {
        match value {
            Value::String(text) => {
                let redacted = self.redact_str(text);
                if redacted != *text {
                    *text = redacted;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_value(v)),
            Value::Object(map) => {
                for (key, v) in map.iter_mut() {
                    if !key.ends_with("_base64") {
                        self.redact_value(v);
                    }
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// A tool's outcome, rewritten: its data and text, or its error message.
    pub fn redact_outcome(&self, outcome: &mut ToolResult) {
        match outcome {
            Ok(reply) => {
                self.redact_value(&mut reply.data);
                reply.text = self.redact_str(&reply.text);
            }
            Err(err) => err.message = self.redact_str(&err.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn places_become_roles_but_the_workspace_stays() {
        let paths = HostPaths::new(
            Path::new("/srv/ws"),
            vec![
                (PathBuf::from("/srv"), "too-wide"),
                (PathBuf::from("/state/root"), "scope-root"),
                (PathBuf::from("/state/root/default"), "default-home"),
                (PathBuf::from("/opt/marsh/bin"), "marsh-install"),
            ],
        );
        let mut value = json!({
            "message": "refused: /state/root/2f/fifo is a fifo; /opt/marsh/bin/marsh changed",
            "home": "/state/root/default/daemon",
            "stdout_text": "in /srv/ws and /srv/ws/x",
            "stdout_base64": "/state/root",
            "list": ["/state/rootless"],
        });
        paths.redact_value(&mut value);
        assert_eq!(
            value["message"],
            "refused: <scope-root>/2f/fifo is a fifo; <marsh-install>/marsh changed"
        );
        assert_eq!(value["home"], "<default-home>/daemon");
        assert_eq!(value["stdout_text"], "in /srv/ws and /srv/ws/x");
        assert_eq!(value["stdout_base64"], "/state/root");
        assert_eq!(value["list"][0], "<scope-root>less");
    }
}
