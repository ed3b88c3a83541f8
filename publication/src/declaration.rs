//! The published-tool declaration (`marsh.published_tool/v1`): its strict format and
//! the checks an exporter or installer makes before trusting one.
//!
//! Invariants of a [`Declaration`] (established by [`Declaration::parse`], never by
//! construction elsewhere): the tool name follows [`valid_tool_name`]; bounds are in
//! range; the input schema is a closed object whose every property is a string or a
//! boolean; in command mode every property is bound exactly once with its type
//! (string: positional, named option or stdin; boolean: flag), and every binding names
//! a property. A schema outside this subset is refused rather than half-understood,
//! so the exporter's argument check is exact.
//!
//! [`load`] adds the file rules: a canonical path outside the workspace and the home,
//! opened without following a symlink, a regular file owned by the effective uid with
//! no group/other bits and one link, in a directory owned by the effective uid that
//! no one else can write; its workspace and identity are the expected ones and its
//! generation is exactly the expected one (an absent expectation matches only a
//! declaration without generation).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use super::name::valid_tool_name;

pub const DECLARATION_SCHEMA: &str = "marsh.published_tool/v1";
/// Largest declaration file read.
pub const MAX_DECLARATION_BYTES: u64 = 256 * 1024;
pub const MAX_OUTPUT_BYTES: u32 = 262_144;
pub const DEFAULT_OUTPUT_BYTES: u32 = MAX_OUTPUT_BYTES;
pub const MAX_TIMEOUT_MS: u32 = 900_000;
pub const DEFAULT_TIMEOUT_MS: u32 = 120_000;
/// Largest stdin a command binding may declare.
pub const MAX_STDIN_BYTES: u32 = 1 << 20;
/// Stdin bound of a binding that names none, and of a pipeline's `input`.
pub const DEFAULT_STDIN_BYTES: u32 = 64 * 1024;
/// Longest string argument other than a stdin field.
pub const MAX_STRING_BYTES: usize = 64 * 1024;
pub const MAX_DESCRIPTION_BYTES: usize = 1024;
const MAX_PROPERTIES: usize = 32;
const MAX_ARGV_BINDINGS: usize = 64;
const MAX_LITERAL_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum DeclarationError {
    #[error("the declaration path {path} is not absolute and canonical")]
    NotCanonical { path: PathBuf },
    #[error("the declaration {path} lies inside the {area} {area_path}")]
    InsideArea {
        path: PathBuf,
        area: &'static str,
        area_path: PathBuf,
    },
    #[error("cannot open the declaration {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the declaration {path} is unsafe: {problem}")]
    Unsafe { path: PathBuf, problem: String },
    #[error("the directory {path} of the declaration is unsafe: {problem}")]
    UnsafeParent { path: PathBuf, problem: String },
    #[error("cannot read the declaration {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the declaration {path} is malformed: {problem}")]
    Malformed { path: PathBuf, problem: String },
    #[error(
        "the declaration {path} belongs to the workspace {found} (device {device}, inode {inode}), not this one"
    )]
    OtherWorkspace {
        path: PathBuf,
        found: PathBuf,
        device: u64,
        inode: u64,
    },
    #[error("the declaration {path} names the home {found}, not {expected}")]
    OtherHome {
        path: PathBuf,
        found: PathBuf,
        expected: PathBuf,
    },
    #[error(
        "the declaration {path} has generation {found:?}, the registration expects {expected:?}: the publication changed; reload the new registration"
    )]
    Generation {
        path: PathBuf,
        found: Option<String>,
        expected: Option<String>,
    },
}

/// A declared argument's JSON type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    String,
    Boolean,
}

/// One property of the input schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub kind: FieldKind,
    pub required: bool,
}

/// How one argv element is built from the arguments.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ArgBinding {
    /// Always this exact word.
    Literal(String),
    /// The field's value as one word, when given.
    Positional(String),
    /// `option` then the field's value, when given.
    NamedOption { option: String, field: String },
    /// `option` when the field is `true`.
    Flag { option: String, field: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinBinding {
    pub field: String,
    #[serde(default = "default_stdin_bytes")]
    pub max_bytes: u32,
}

fn default_stdin_bytes() -> u32 {
    DEFAULT_STDIN_BYTES
}

/// What a call runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `marsh -c PIPELINE` in the project shell, the `input` argument as stdin.
    Pipeline(String),
    /// The registered kit with argv built from the bindings; no shell anywhere.
    Command {
        kit: String,
        argv: Vec<ArgBinding>,
        stdin: Option<StdinBinding>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declaration {
    pub tool_name: String,
    pub description: String,
    pub generation: Option<String>,
    pub action: Action,
    /// The schema as declared (shown in `tools/list`).
    pub input_schema: Value,
    /// The schema's properties, in declaration order.
    pub fields: Vec<Field>,
    pub max_output_bytes: u32,
    pub timeout_ms: u32,
    pub canonical_workspace: PathBuf,
    pub workspace_device: u64,
    pub workspace_inode: u64,
    pub home: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeclaration {
    schema: String,
    tool_name: String,
    description: String,
    #[serde(default)]
    publication_generation: Option<String>,
    #[serde(default)]
    pipeline: Option<String>,
    #[serde(default)]
    command: Option<RawCommand>,
    input_schema: Value,
    #[serde(default)]
    max_output_bytes: Option<u64>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    canonical_workspace: PathBuf,
    workspace_identity: RawIdentity,
    home: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommand {
    kit: String,
    bindings: RawBindings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBindings {
    argv: Vec<ArgBinding>,
    #[serde(default)]
    stdin: Option<StdinBinding>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentity {
    device: u64,
    inode: u64,
}

/// A lowercase hyphenated UUID.
pub fn valid_generation(text: &str) -> bool {
    text.len() == 36
        && text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

/// `[a-z0-9-]{1,64}`, not starting with `-` (the stand-in's kit names).
fn valid_kit_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn valid_field_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// `-x` or `--long-name`: what a bound option may look like.
fn valid_option(option: &str) -> bool {
    let body = option
        .strip_prefix("--")
        .or_else(|| option.strip_prefix('-'))
        .unwrap_or("");
    option.len() <= 64
        && body
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn in_range(value: Option<u64>, default: u32, max: u32, what: &str) -> Result<u32, String> {
    match value {
        None => Ok(default),
        Some(v) if (1..=u64::from(max)).contains(&v) => Ok(v as u32),
        Some(v) => Err(format!("{what} {v} is outside 1..={max}")),
    }
}

/// The closed object schema → its fields, or what is outside the supported subset.
fn schema_fields(schema: &Value) -> Result<Vec<Field>, String> {
    let object = schema.as_object().ok_or("input_schema is not an object")?;
    for key in object.keys() {
        if !matches!(
            key.as_str(),
            "type" | "properties" | "required" | "additionalProperties" | "description"
        ) {
            return Err(format!("input_schema has the unsupported keyword {key:?}"));
        }
    }
    if object.get("type") != Some(&Value::from("object")) {
        return Err("input_schema.type must be \"object\"".into());
    }
    if object.get("additionalProperties") != Some(&Value::Bool(false)) {
        return Err("input_schema.additionalProperties must be false".into());
    }
    let empty = Map::new();
    let properties = match object.get("properties") {
        None => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => return Err("input_schema.properties is not an object".into()),
    };
    if properties.len() > MAX_PROPERTIES {
        return Err(format!(
            "input_schema has more than {MAX_PROPERTIES} properties"
        ));
    }
    let required: BTreeSet<&str> = match object.get("required") {
        None => BTreeSet::new(),
        Some(Value::Array(items)) => {
            let mut names = BTreeSet::new();
            for item in items {
                let name = item
                    .as_str()
                    .ok_or("input_schema.required holds a non-string")?;
                if !properties.contains_key(name) || !names.insert(name) {
                    return Err(format!(
                        "input_schema.required names {name:?} twice or not at all"
                    ));
                }
            }
            names
        }
        Some(_) => return Err("input_schema.required is not an array".into()),
    };
    let mut fields = Vec::with_capacity(properties.len());
    for (name, prop) in properties {
        if !valid_field_name(name) {
            return Err(format!(
                "property name {name:?} is not 1-64 of [A-Za-z0-9_]"
            ));
        }
        let prop = prop
            .as_object()
            .ok_or_else(|| format!("property {name:?} is not an object"))?;
        if let Some(key) = prop
            .keys()
            .find(|k| !matches!(k.as_str(), "type" | "description"))
        {
            return Err(format!(
                "property {name:?} has the unsupported keyword {key:?}"
            ));
        }
        if prop
            .get("description")
            .is_some_and(|d| d.as_str().is_none_or(|d| d.len() > MAX_DESCRIPTION_BYTES))
        {
            return Err(format!("property {name:?} has a bad description"));
        }
        let kind = match prop.get("type").and_then(Value::as_str) {
            Some("string") => FieldKind::String,
            Some("boolean") => FieldKind::Boolean,
            _ => {
                return Err(format!(
                    "property {name:?} must be of type string or boolean"
                ));
            }
        };
        fields.push(Field {
            name: name.clone(),
            kind,
            required: required.contains(name.as_str()),
        });
    }
    Ok(fields)
}

/// Every binding names a property of its type; every property is bound exactly once.
fn check_bindings(
    fields: &[Field],
    argv: &[ArgBinding],
    stdin: Option<&StdinBinding>,
) -> Result<(), String> {
    if argv.len() > MAX_ARGV_BINDINGS {
        return Err(format!("more than {MAX_ARGV_BINDINGS} argv bindings"));
    }
    let mut bound: Vec<(&str, FieldKind)> = Vec::new();
    for binding in argv {
        match binding {
            ArgBinding::Literal(word) => {
                if word.len() > MAX_LITERAL_BYTES || word.contains('\0') {
                    return Err("a literal is longer than 4096 bytes or holds NUL".into());
                }
            }
            ArgBinding::Positional(field) => bound.push((field, FieldKind::String)),
            ArgBinding::NamedOption { option, field } => {
                if !valid_option(option) {
                    return Err(format!("{option:?} is not an option (-x or --name)"));
                }
                bound.push((field, FieldKind::String));
            }
            ArgBinding::Flag { option, field } => {
                if !valid_option(option) {
                    return Err(format!("{option:?} is not an option (-x or --name)"));
                }
                bound.push((field, FieldKind::Boolean));
            }
        }
    }
    if let Some(stdin) = stdin {
        if !(1..=MAX_STDIN_BYTES).contains(&stdin.max_bytes) {
            return Err(format!(
                "stdin.max_bytes {} is outside 1..={MAX_STDIN_BYTES}",
                stdin.max_bytes
            ));
        }
        bound.push((&stdin.field, FieldKind::String));
    }
    for (name, kind) in &bound {
        let field = fields
            .iter()
            .find(|f| f.name == *name)
            .ok_or_else(|| format!("a binding names {name:?}, which input_schema lacks"))?;
        if field.kind != *kind {
            return Err(format!(
                "{name:?} is bound as {kind:?} but declared {:?}",
                field.kind
            ));
        }
    }
    for field in fields {
        match bound.iter().filter(|(n, _)| *n == field.name).count() {
            1 => {}
            0 => return Err(format!("property {:?} is bound to nothing", field.name)),
            _ => return Err(format!("property {:?} is bound more than once", field.name)),
        }
    }
    Ok(())
}

impl Declaration {
    /// Parses and validates declaration bytes; the error text names the first problem.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let raw: RawDeclaration = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if raw.schema != DECLARATION_SCHEMA {
            return Err(format!(
                "schema is {:?}, not {DECLARATION_SCHEMA:?}",
                raw.schema
            ));
        }
        if !valid_tool_name(&raw.tool_name) {
            return Err(format!(
                "tool_name {:?} is not a valid tool name",
                raw.tool_name
            ));
        }
        if raw.description.is_empty() || raw.description.len() > MAX_DESCRIPTION_BYTES {
            return Err(format!(
                "description must be 1-{MAX_DESCRIPTION_BYTES} bytes"
            ));
        }
        if let Some(g) = &raw.publication_generation
            && !valid_generation(g)
        {
            return Err(format!(
                "publication_generation {g:?} is not a lowercase UUID"
            ));
        }
        for (what, path) in [
            ("canonical_workspace", &raw.canonical_workspace),
            ("home", &raw.home),
        ] {
            if !path.is_absolute() {
                return Err(format!("{what} is not an absolute path"));
            }
        }
        let max_output_bytes = in_range(
            raw.max_output_bytes,
            DEFAULT_OUTPUT_BYTES,
            MAX_OUTPUT_BYTES,
            "max_output_bytes",
        )?;
        let timeout_ms = in_range(
            raw.timeout_ms,
            DEFAULT_TIMEOUT_MS,
            MAX_TIMEOUT_MS,
            "timeout_ms",
        )?;
        let fields = schema_fields(&raw.input_schema)?;
        let action = match (raw.pipeline, raw.command) {
            (Some(pipeline), None) => {
                if pipeline.is_empty()
                    || pipeline.len() > MAX_STRING_BYTES
                    || pipeline.contains('\0')
                {
                    return Err("pipeline must be 1-65536 bytes without NUL".into());
                }
                let only_input = fields.len() == 1
                    && fields[0].name == "input"
                    && fields[0].kind == FieldKind::String;
                if !(fields.is_empty() || only_input) {
                    return Err(
                        "a pipeline's input_schema has exactly one string property, input".into(),
                    );
                }
                Action::Pipeline(pipeline)
            }
            (None, Some(command)) => {
                if !valid_kit_name(&command.kit) {
                    return Err(format!(
                        "kit {:?} is not a registered-kit name",
                        command.kit
                    ));
                }
                check_bindings(
                    &fields,
                    &command.bindings.argv,
                    command.bindings.stdin.as_ref(),
                )?;
                Action::Command {
                    kit: command.kit,
                    argv: command.bindings.argv,
                    stdin: command.bindings.stdin,
                }
            }
            _ => return Err("exactly one of pipeline and command is required".into()),
        };
        Ok(Self {
            tool_name: raw.tool_name,
            description: raw.description,
            generation: raw.publication_generation,
            action,
            input_schema: raw.input_schema,
            fields,
            max_output_bytes,
            timeout_ms,
            canonical_workspace: raw.canonical_workspace,
            workspace_device: raw.workspace_identity.device,
            workspace_inode: raw.workspace_identity.inode,
            home: raw.home,
        })
    }
}

/// What a declaration must match to be trusted.
#[derive(Debug, Clone)]
pub struct Expectation<'a> {
    /// Canonical.
    pub workspace: &'a Path,
    pub workspace_device: u64,
    pub workspace_inode: u64,
    /// Canonical.
    pub home: &'a Path,
    pub generation: Option<&'a str>,
}

/// A declaration read and verified, with the exact bytes it was parsed from.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub declaration: Declaration,
    pub bytes: Vec<u8>,
}

fn owner_problem(uid: u32, mode: u32, euid: u32) -> Option<String> {
    if uid != euid {
        return Some(format!("owned by uid {uid}, not {euid}"));
    }
    (mode & 0o022 != 0).then(|| format!("writable by group or others (mode {:o})", mode & 0o7777))
}

/// Reads and verifies the declaration at `path` (see the module doc for every rule).
pub fn load(path: &Path, expect: &Expectation<'_>) -> Result<Loaded, DeclarationError> {
    let canonical = std::fs::canonicalize(path).ok();
    if !path.is_absolute() || canonical.as_deref() != Some(path) {
        return Err(DeclarationError::NotCanonical {
            path: path.to_owned(),
        });
    }
    for (area, area_path) in [("workspace", expect.workspace), ("home", expect.home)] {
        if path.starts_with(area_path) {
            return Err(DeclarationError::InsideArea {
                path: path.to_owned(),
                area,
                area_path: area_path.to_owned(),
            });
        }
    }
    let euid = nix::unistd::geteuid().as_raw();
    let parent = path.parent().unwrap_or(Path::new("/"));
    let parent_meta =
        std::fs::symlink_metadata(parent).map_err(|source| DeclarationError::Open {
            path: parent.to_owned(),
            source,
        })?;
    if let Some(problem) = (!parent_meta.is_dir())
        .then(|| "not a directory".to_string())
        .or_else(|| owner_problem(parent_meta.uid(), parent_meta.mode(), euid))
    {
        return Err(DeclarationError::UnsafeParent {
            path: parent.to_owned(),
            problem,
        });
    }
    let file = File::options()
        .read(true)
        .custom_flags(libc_flags())
        .open(path)
        .map_err(|source| DeclarationError::Open {
            path: path.to_owned(),
            source,
        })?;
    let meta = file.metadata().map_err(|source| DeclarationError::Read {
        path: path.to_owned(),
        source,
    })?;
    let unsafe_file = |problem: String| DeclarationError::Unsafe {
        path: path.to_owned(),
        problem,
    };
    if !meta.file_type().is_file() {
        return Err(unsafe_file("not a regular file".into()));
    }
    if meta.uid() != euid {
        return Err(unsafe_file(format!(
            "owned by uid {}, not {euid}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_file(format!(
            "not owner-only (mode {:o})",
            meta.mode() & 0o7777
        )));
    }
    if meta.nlink() != 1 {
        return Err(unsafe_file(format!("{} hard links, not 1", meta.nlink())));
    }
    let mut bytes = Vec::new();
    file.take(MAX_DECLARATION_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| DeclarationError::Read {
            path: path.to_owned(),
            source,
        })?;
    if bytes.len() as u64 > MAX_DECLARATION_BYTES {
        return Err(unsafe_file(format!(
            "larger than {MAX_DECLARATION_BYTES} bytes"
        )));
    }
    let declaration =
        Declaration::parse(&bytes).map_err(|problem| DeclarationError::Malformed {
            path: path.to_owned(),
            problem,
        })?;
    if declaration.canonical_workspace != expect.workspace
        || declaration.workspace_device != expect.workspace_device
        || declaration.workspace_inode != expect.workspace_inode
    {
        return Err(DeclarationError::OtherWorkspace {
            path: path.to_owned(),
            found: declaration.canonical_workspace,
            device: declaration.workspace_device,
            inode: declaration.workspace_inode,
        });
    }
    if declaration.home != expect.home {
        return Err(DeclarationError::OtherHome {
            path: path.to_owned(),
            found: declaration.home,
            expected: expect.home.to_owned(),
        });
    }
    if declaration.generation.as_deref() != expect.generation {
        return Err(DeclarationError::Generation {
            path: path.to_owned(),
            found: declaration.generation,
            expected: expect.generation.map(str::to_owned),
        });
    }
    Ok(Loaded { declaration, bytes })
}

/// No symlink at the last component; no controlling terminal; never blocks on a FIFO.
fn libc_flags() -> i32 {
    nix::fcntl::OFlag::O_NOFOLLOW.bits()
        | nix::fcntl::OFlag::O_NOCTTY.bits()
        | nix::fcntl::OFlag::O_NONBLOCK.bits()
        | nix::fcntl::OFlag::O_CLOEXEC.bits()
}

/// The `export-serve` arguments a registration of this publication carries, in order.
pub fn export_serve_args(
    workspace: &Path,
    home: &Path,
    declaration: &Path,
    generation: Option<&str>,
    marsh: &Path,
    sbx: &Path,
) -> Vec<String> {
    let text = |p: &Path| p.to_string_lossy().into_owned();
    let mut args = vec![
        "export-serve".to_string(),
        "--workspace".into(),
        text(workspace),
        "--home".into(),
        text(home),
        "--declaration".into(),
        text(declaration),
    ];
    if let Some(g) = generation {
        args.push("--expected-generation".into());
        args.push(g.to_string());
    }
    args.extend(["--marsh".into(), text(marsh), "--sbx".into(), text(sbx)]);
    args
}

#[cfg(test)]
#[path = "declaration_tests.rs"]
mod tests;
