#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use serde_json::{Value, json};

use super::*;

const GENERATION: &str = "0f2b6c1e-8d3a-4b5c-9e7f-112233445566";

fn pipeline_value(workspace: &Path, dev: u64, ino: u64, home: &Path) -> Value {
    json!({
        "schema": DECLARATION_SCHEMA,
        "tool_name": "hello",
        "description": "Say hello",
        "publication_generation": GENERATION,
        "pipeline": "tr a-z A-Z",
        "input_schema": {"type": "object", "properties": {"input": {"type": "string"}},
                         "additionalProperties": false},
        "canonical_workspace": workspace,
        "workspace_identity": {"device": dev, "inode": ino},
        "home": home,
    })
}

fn command_value() -> Value {
    json!({
        "schema": DECLARATION_SCHEMA,
        "tool_name": "fmt",
        "description": "Format",
        "command": {"kit": "fmt-kit", "bindings": {
            "argv": [
                {"literal": "check"},
                {"positional": "path"},
                {"named_option": {"option": "--lang", "field": "lang"}},
                {"flag": {"option": "--dry-run", "field": "dry_run"}}
            ],
            "stdin": {"field": "text", "max_bytes": 1000}
        }},
        "input_schema": {"type": "object", "additionalProperties": false, "required": ["path"],
            "properties": {
                "path": {"type": "string", "description": "file"},
                "lang": {"type": "string"},
                "dry_run": {"type": "boolean"},
                "text": {"type": "string"}
            }},
        "timeout_ms": 5000,
        "canonical_workspace": "/w",
        "workspace_identity": {"device": 1, "inode": 2},
        "home": "/h",
    })
}

fn parse(v: &Value) -> Result<Declaration, String> {
    Declaration::parse(&serde_json::to_vec(v).unwrap())
}

#[test]
fn a_pipeline_declaration_parses_with_defaults() {
    let d = parse(&pipeline_value(Path::new("/w"), 1, 2, Path::new("/h"))).unwrap();
    assert_eq!(d.action, Action::Pipeline("tr a-z A-Z".into()));
    assert_eq!(d.max_output_bytes, 262_144);
    assert_eq!(d.timeout_ms, 120_000);
    assert_eq!(d.generation.as_deref(), Some(GENERATION));
    assert_eq!(d.fields.len(), 1);
}

#[test]
fn a_command_declaration_binds_every_kind() {
    let d = parse(&command_value()).unwrap();
    let Action::Command { kit, argv, stdin } = &d.action else {
        panic!("not a command")
    };
    assert_eq!(kit, "fmt-kit");
    assert_eq!(argv.len(), 4);
    assert_eq!(stdin.as_ref().unwrap().max_bytes, 1000);
    assert_eq!(d.generation, None);
    let path = d.fields.iter().find(|f| f.name == "path").unwrap();
    assert!(path.required);
    assert_eq!(d.timeout_ms, 5000);
}

#[test]
fn malformed_declarations_name_their_problem() {
    let mut cases: Vec<(Value, &str)> = Vec::new();
    let mut v = command_value();
    v["extra"] = json!(1);
    cases.push((v, "unknown field"));
    let mut v = command_value();
    v["pipeline"] = json!("true");
    cases.push((v, "exactly one"));
    let mut v = command_value();
    v["input_schema"]["properties"]["unused"] = json!({"type": "string"});
    cases.push((v, "bound to nothing"));
    let mut v = command_value();
    v["input_schema"]["properties"]["dry_run"] = json!({"type": "string"});
    cases.push((v, "bound as Boolean"));
    let mut v = command_value();
    v["command"]["bindings"]["argv"][2]["named_option"]["option"] = json!("lang");
    cases.push((v, "not an option"));
    let mut v = command_value();
    v["input_schema"]["additionalProperties"] = json!(true);
    cases.push((v, "additionalProperties"));
    let mut v = command_value();
    v["input_schema"]["properties"]["path"]["pattern"] = json!(".*");
    cases.push((v, "unsupported keyword"));
    let mut v = command_value();
    v["timeout_ms"] = json!(900_001);
    cases.push((v, "outside 1..=900000"));
    let mut v = command_value();
    v["max_output_bytes"] = json!(0);
    cases.push((v, "outside 1..=262144"));
    let mut v = command_value();
    v["tool_name"] = json!("-x");
    cases.push((v, "not a valid tool name"));
    let mut v = command_value();
    v["command"]["kit"] = json!("Bad Kit");
    cases.push((v, "registered-kit"));
    let mut v = command_value();
    v["command"]["bindings"]["stdin"]["max_bytes"] = json!(2_000_000);
    cases.push((v, "stdin.max_bytes"));
    let mut v = command_value();
    v["publication_generation"] = json!("ABC");
    cases.push((v, "lowercase UUID"));
    let mut v = pipeline_value(Path::new("/w"), 1, 2, Path::new("/h"));
    v["input_schema"]["properties"]["more"] = json!({"type": "string"});
    cases.push((v, "exactly one string property"));
    for (value, expected) in cases {
        let err = parse(&value).unwrap_err();
        assert!(err.contains(expected), "{expected:?} not in {err:?}");
    }
}

struct Files {
    _dir: tempfile::TempDir,
    workspace: PathBuf,
    home: PathBuf,
    control: PathBuf,
    dev: u64,
    ino: u64,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(dir.path()).unwrap();
    let (workspace, home, control) = (base.join("ws"), base.join("home"), base.join("control"));
    for d in [&workspace, &home, &control] {
        std::fs::create_dir(d).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let meta = std::fs::metadata(&workspace).unwrap();
    Files {
        _dir: dir,
        dev: meta.dev(),
        ino: meta.ino(),
        workspace,
        home,
        control,
    }
}

impl Files {
    fn write(&self, dir: &Path, name: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        let value = pipeline_value(&self.workspace, self.dev, self.ino, &self.home);
        std::fs::write(&path, serde_json::to_vec(&value).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn expect(&self, generation: Option<&'static str>) -> Expectation<'_> {
        Expectation {
            workspace: &self.workspace,
            workspace_device: self.dev,
            workspace_inode: self.ino,
            home: &self.home,
            generation,
        }
    }
}

#[test]
fn load_accepts_exactly_the_expected_file() {
    let f = files();
    let path = f.write(&f.control, "hello.json", 0o600);
    let loaded = load(&path, &f.expect(Some(GENERATION))).unwrap();
    assert_eq!(loaded.declaration.tool_name, "hello");
    assert_eq!(loaded.bytes, std::fs::read(&path).unwrap());
}

#[test]
fn load_refuses_every_unsafe_or_foreign_file() {
    let f = files();
    let good = f.write(&f.control, "hello.json", 0o600);
    let expect = f.expect(Some(GENERATION));
    let err = |path: &Path, expect: &Expectation<'_>| load(path, expect).unwrap_err().to_string();

    assert!(err(&good, &f.expect(None)).contains("generation"));
    assert!(
        err(
            &good,
            &f.expect(Some("00000000-0000-0000-0000-000000000000"))
        )
        .contains("generation")
    );
    let other_ws = Expectation {
        workspace_inode: f.ino + 1,
        ..expect.clone()
    };
    assert!(err(&good, &other_ws).contains("not this one"));

    let loose = f.write(&f.control, "loose.json", 0o640);
    assert!(err(&loose, &expect).contains("owner-only"));
    let inside_ws = f.write(&f.workspace, "d.json", 0o600);
    assert!(err(&inside_ws, &expect).contains("inside the workspace"));
    let inside_home = f.write(&f.home, "d.json", 0o600);
    assert!(err(&inside_home, &expect).contains("inside the home"));

    let link = f.control.join("link.json");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    assert!(err(&link, &expect).contains("canonical"));
    assert!(err(Path::new("relative.json"), &expect).contains("canonical"));

    let second = f.control.join("second-name.json");
    std::fs::hard_link(&good, &second).unwrap();
    assert!(err(&good, &expect).contains("hard links"));
    std::fs::remove_file(&second).unwrap();

    std::fs::set_permissions(&f.control, std::fs::Permissions::from_mode(0o770)).unwrap();
    assert!(err(&good, &expect).contains("writable by group"));
}

#[test]
fn export_args_pin_every_path_in_order() {
    let args = export_serve_args(
        Path::new("/w"),
        Path::new("/h"),
        Path::new("/c/d.json"),
        Some(GENERATION),
        Path::new("/bin/marsh"),
        Path::new("/bin/sbx"),
    );
    assert_eq!(
        args.join(","),
        format!(
            "export-serve,--workspace,/w,--home,/h,--declaration,/c/d.json,--expected-generation,{GENERATION},--marsh,/bin/marsh,--sbx,/bin/sbx"
        )
    );
}
