//! The one registration discipline every client follows: read the entry first; an
//! identical one is a no-op, a different one is refused untouched; only an absent one
//! is written, and what was written is read back and compared before success is
//! claimed. Removal likewise touches only an identical entry.

use serde_json::Value;

use crate::InstallError;
use crate::registration::Registration;

/// How one client stores and compares its entry.
pub trait ClientStore {
    const CLIENT: &'static str;
    /// The entry for this registration as the client shows it, or `None`.
    fn read(&self) -> Result<Option<Value>, InstallError>;
    /// What differs from the expected definition, or `None` when identical.
    fn difference(&self, found: &Value) -> Option<String>;
    fn add(&self) -> Result<(), InstallError>;
    fn remove(&self) -> Result<(), InstallError>;
}

fn conflict<S: ClientStore>(reg: &Registration, difference: String) -> InstallError {
    InstallError::Conflict {
        client: S::CLIENT,
        name: reg.name.clone(),
        difference,
    }
}

pub fn install<S: ClientStore>(store: &S, reg: &Registration) -> Result<String, InstallError> {
    if let Some(found) = store.read()? {
        return match store.difference(&found) {
            None => Ok(format!(
                "{} already has {} exactly as expected; nothing changed",
                S::CLIENT,
                reg.name
            )),
            Some(difference) => Err(conflict::<S>(reg, difference)),
        };
    }
    store.add()?;
    let difference = match store.read()? {
        Some(found) => match store.difference(&found) {
            None => {
                return Ok(format!(
                    "registered {} with {} (private root {})",
                    reg.name,
                    S::CLIENT,
                    reg.root
                ));
            }
            Some(difference) => difference,
        },
        None => "no entry".to_string(),
    };
    Err(InstallError::VerifyFailed {
        client: S::CLIENT,
        name: reg.name.clone(),
        difference,
    })
}

pub fn uninstall<S: ClientStore>(store: &S, reg: &Registration) -> Result<String, InstallError> {
    let Some(found) = store.read()? else {
        return Ok(format!(
            "{} has no {}; nothing to remove",
            S::CLIENT,
            reg.name
        ));
    };
    if let Some(difference) = store.difference(&found) {
        return Err(conflict::<S>(reg, difference));
    }
    store.remove()?;
    Ok(format!("removed {} from {}", reg.name, S::CLIENT))
}
