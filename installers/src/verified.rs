//! The one registration discipline every client follows: read the entry first; an
//! identical one is a no-op, a different one is refused untouched; only an absent one
//! is written, and what was written is read back and compared before success is
//! claimed. The one exception is an earlier entry of our own (a store's "upgradable"
//! form: the previous release's, or one whose pinned executables have moved since):
//! install replaces it (remove, add, read back) and says what changed, and uninstall
//! removes it. Removal otherwise touches only an entry equal to the expected one.

use serde_json::Value;

use crate::InstallError;
use crate::registration::Registration;

/// How one client reads, compares and removes its entry.
pub trait ClientStore {
    const CLIENT: &'static str;
    /// The entry for this registration as the client shows it, or `None`.
    fn read(&self) -> Result<Option<Value>, InstallError>;
    /// What differs from the expected definition, or `None` when identical (for a
    /// removal store: when the entry is one it may remove).
    fn difference(&self, found: &Value) -> Option<String>;
    /// Whether `found` is exactly the previous release's definition of this entry,
    /// which `install` replaces. None by default.
    fn upgradable(&self, _found: &Value) -> bool {
        false
    }
    fn remove(&self) -> Result<(), InstallError>;
}

/// A store that can also write its one expected definition.
pub trait ClientWriter: ClientStore {
    fn add(&self) -> Result<(), InstallError>;
}

fn conflict<S: ClientStore>(name: &str, difference: String) -> InstallError {
    InstallError::Conflict {
        client: S::CLIENT,
        name: name.to_owned(),
        difference,
    }
}

/// [`install_entry`] for a workspace registration.
pub fn install<S: ClientWriter>(store: &S, reg: &Registration) -> Result<String, InstallError> {
    install_entry(
        store,
        &reg.name,
        &format!(
            "private root {root}; settings for every scope (network, toolchains): {root}/backend.json, applied at a scope's next boot, see docs/agent-view.md",
            root = reg.root
        ),
    )
}

/// Installs the entry `name`; `detail` ends the success message, in parentheses.
pub fn install_entry<S: ClientWriter>(
    store: &S,
    name: &str,
    detail: &str,
) -> Result<String, InstallError> {
    let mut replaced = None;
    if let Some(found) = store.read()? {
        match store.difference(&found) {
            None => {
                return Ok(format!(
                    "{} already has {name} exactly as expected; nothing changed",
                    S::CLIENT
                ));
            }
            Some(difference) if store.upgradable(&found) => {
                store.remove()?;
                replaced = Some(difference);
            }
            Some(difference) => return Err(conflict::<S>(name, difference)),
        }
    }
    store.add()?;
    let difference = match store.read()? {
        Some(found) => match store.difference(&found) {
            None => {
                return Ok(match replaced {
                    None => format!("registered {name} with {} ({detail})", S::CLIENT),
                    Some(changed) => format!(
                        "replaced our earlier entry {name} with {} ({detail}; it differed: {changed})",
                        S::CLIENT
                    ),
                });
            }
            Some(difference) => difference,
        },
        None => "no entry".to_string(),
    };
    Err(InstallError::VerifyFailed {
        client: S::CLIENT,
        name: name.to_owned(),
        difference,
    })
}

/// [`uninstall_entry`] for a workspace registration.
pub fn uninstall<S: ClientStore>(store: &S, reg: &Registration) -> Result<String, InstallError> {
    uninstall_entry(store, &reg.name)
}

/// Removes the entry `name` only when the store accepts it as its own.
pub fn uninstall_entry<S: ClientStore>(store: &S, name: &str) -> Result<String, InstallError> {
    let Some(found) = store.read()? else {
        return Ok(format!("{} has no {name}; nothing to remove", S::CLIENT));
    };
    if let Some(difference) = store.difference(&found)
        && !store.upgradable(&found)
    {
        return Err(conflict::<S>(name, difference));
    }
    store.remove()?;
    Ok(format!("removed {name} from {}", S::CLIENT))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::cell::{Cell, RefCell};

    use serde_json::json;

    use super::*;
    use crate::registration::Client;
    use crate::test_support::sample;

    /// An in-memory client: one optional entry, compared for equality with `expected`.
    struct Fake {
        entry: RefCell<Option<Value>>,
        expected: Value,
        adds: Cell<usize>,
        removes: Cell<usize>,
        /// `add` stores something other than the expected definition.
        add_writes_other: bool,
        /// `add` succeeds but stores nothing.
        add_writes_nothing: bool,
        /// The previous release's definition, which install replaces.
        previous: Option<Value>,
    }

    impl Fake {
        fn holding(entry: Option<Value>) -> Self {
            Self {
                entry: RefCell::new(entry),
                expected: json!({"command": "marsh-mcp"}),
                adds: Cell::new(0),
                removes: Cell::new(0),
                add_writes_other: false,
                add_writes_nothing: false,
                previous: None,
            }
        }

        fn expected(&self) -> Option<Value> {
            Some(self.expected.clone())
        }
    }

    impl ClientStore for Fake {
        const CLIENT: &'static str = "fake";

        fn read(&self) -> Result<Option<Value>, InstallError> {
            Ok(self.entry.borrow().clone())
        }

        fn difference(&self, found: &Value) -> Option<String> {
            (*found != self.expected).then(|| format!("found {found}"))
        }

        fn upgradable(&self, found: &Value) -> bool {
            self.previous.as_ref() == Some(found)
        }

        fn remove(&self) -> Result<(), InstallError> {
            self.removes.set(self.removes.get() + 1);
            *self.entry.borrow_mut() = None;
            Ok(())
        }
    }

    impl ClientWriter for Fake {
        fn add(&self) -> Result<(), InstallError> {
            self.adds.set(self.adds.get() + 1);
            if self.add_writes_nothing {
                return Ok(());
            }
            *self.entry.borrow_mut() = Some(if self.add_writes_other {
                json!({"command": "mangled"})
            } else {
                self.expected.clone()
            });
            Ok(())
        }
    }

    fn foreign() -> Option<Value> {
        Some(json!({"command": "someone-else"}))
    }

    #[test]
    fn install_absent_adds_once_and_verifies() {
        let store = Fake::holding(None);
        let message = install(&store, &sample(Client::Codex)).unwrap();
        assert!(message.starts_with("registered marsh-dev-0123456789ab with fake"));
        assert_eq!(store.adds.get(), 1);
        assert_eq!(*store.entry.borrow(), store.expected());
    }

    #[test]
    fn install_identical_changes_nothing() {
        let store = Fake::holding(Some(json!({"command": "marsh-mcp"})));
        let message = install(&store, &sample(Client::Codex)).unwrap();
        assert!(message.contains("nothing changed"), "{message}");
        assert_eq!(store.adds.get(), 0);
    }

    #[test]
    fn install_different_conflicts_and_leaves_it() {
        let store = Fake::holding(foreign());
        let err = install(&store, &sample(Client::Codex)).unwrap_err();
        match err {
            InstallError::Conflict {
                client,
                name,
                difference,
            } => {
                assert_eq!((client, name.as_str()), ("fake", "marsh-dev-0123456789ab"));
                assert!(difference.contains("someone-else"), "{difference}");
            }
            other => panic!("expected a conflict, got {other:?}"),
        }
        assert_eq!(store.adds.get(), 0);
        assert_eq!(*store.entry.borrow(), foreign());
    }

    #[test]
    fn install_reading_back_something_else_fails_verification() {
        let store = Fake {
            add_writes_other: true,
            ..Fake::holding(None)
        };
        let err = install(&store, &sample(Client::Codex)).unwrap_err();
        assert!(
            matches!(&err, InstallError::VerifyFailed { client: "fake", difference, .. } if difference.contains("mangled")),
            "{err:?}"
        );
        assert_eq!(store.adds.get(), 1);
    }

    #[test]
    fn install_reading_back_nothing_fails_verification() {
        let store = Fake {
            add_writes_nothing: true,
            ..Fake::holding(None)
        };
        let err = install(&store, &sample(Client::Codex)).unwrap_err();
        assert!(
            matches!(&err, InstallError::VerifyFailed { difference, .. } if difference == "no entry"),
            "{err:?}"
        );
        assert_eq!(store.adds.get(), 1);
    }

    fn old() -> Option<Value> {
        Some(json!({"command": "marsh-mcp", "args": ["serve"]}))
    }

    #[test]
    fn install_replaces_exactly_the_previous_form_and_verifies() {
        let store = Fake {
            previous: old(),
            ..Fake::holding(old())
        };
        let message = install(&store, &sample(Client::Codex)).unwrap();
        assert!(
            message.starts_with("replaced our earlier entry marsh-dev-0123456789ab with fake"),
            "{message}"
        );
        assert_eq!((store.removes.get(), store.adds.get()), (1, 1));
        assert_eq!(*store.entry.borrow(), store.expected());
    }

    #[test]
    fn install_refuses_anything_but_the_exact_previous_form() {
        let store = Fake {
            previous: old(),
            ..Fake::holding(foreign())
        };
        let err = install(&store, &sample(Client::Codex)).unwrap_err();
        assert!(matches!(err, InstallError::Conflict { .. }), "{err:?}");
        assert_eq!((store.removes.get(), store.adds.get()), (0, 0));
        assert_eq!(*store.entry.borrow(), foreign());
    }

    #[test]
    fn uninstall_removes_our_earlier_form_but_nothing_foreign() {
        let store = Fake {
            previous: old(),
            ..Fake::holding(old())
        };
        let message = uninstall(&store, &sample(Client::Codex)).unwrap();
        assert_eq!(message, "removed marsh-dev-0123456789ab from fake");
        assert_eq!(store.removes.get(), 1);
        assert_eq!(*store.entry.borrow(), None);

        let store = Fake {
            previous: old(),
            ..Fake::holding(foreign())
        };
        let err = uninstall(&store, &sample(Client::Codex)).unwrap_err();
        assert!(matches!(err, InstallError::Conflict { .. }), "{err:?}");
        assert_eq!(store.removes.get(), 0);
        assert_eq!(*store.entry.borrow(), foreign());
    }

    #[test]
    fn uninstall_absent_removes_nothing() {
        let store = Fake::holding(None);
        let message = uninstall(&store, &sample(Client::Codex)).unwrap();
        assert!(message.contains("nothing to remove"), "{message}");
        assert_eq!(store.removes.get(), 0);
    }

    #[test]
    fn uninstall_identical_removes_it() {
        let store = Fake::holding(Some(json!({"command": "marsh-mcp"})));
        let message = uninstall(&store, &sample(Client::Codex)).unwrap();
        assert_eq!(message, "removed marsh-dev-0123456789ab from fake");
        assert_eq!(store.removes.get(), 1);
        assert_eq!(*store.entry.borrow(), None);
    }

    #[test]
    fn uninstall_different_conflicts_and_leaves_it() {
        let store = Fake::holding(foreign());
        let err = uninstall(&store, &sample(Client::Codex)).unwrap_err();
        assert!(
            matches!(&err, InstallError::Conflict { difference, .. } if difference.contains("someone-else")),
            "{err:?}"
        );
        assert_eq!(store.removes.get(), 0);
        assert_eq!(*store.entry.borrow(), foreign());
    }
}
