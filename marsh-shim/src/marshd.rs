//! The `marshd` binary's modes: `serve` (the per-home daemon), `agent` (the project
//! shell's in-sandbox agent) and `kit-client` (what a kit wrapper on a job's PATH runs).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::util::log;
use crate::{agent, daemon};

/// Entry point of the `marshd` binary.
pub fn main(args: Vec<OsString>) -> i32 {
    let mut args = args.into_iter().skip(1);
    let mode = args
        .next()
        .and_then(|m| m.into_string().ok())
        .unwrap_or_default();
    let rest: Vec<OsString> = args.collect();
    match mode.as_str() {
        "serve" => match serve_args(&rest).and_then(|(home, ws)| daemon::serve(&home, &ws)) {
            Ok(()) => 0,
            Err(e) => {
                log!("marshd: {e}");
                e.exit_code()
            }
        },
        "agent" => match agent_args(&rest).and_then(agent::run) {
            Ok(()) => 0,
            Err(e) => {
                log!("marshd agent: {e}");
                1
            }
        },
        "kit-client" => match rest.as_slice() {
            [flag, socket, kit, kit_args @ ..] if flag == "--socket" => {
                agent::kit_client::run(Path::new(socket), &kit.to_string_lossy(), kit_args)
            }
            _ => usage(),
        },
        "--version" => {
            println_safe(&format!(
                "marshd {} (marsh-shim)",
                env!("CARGO_PKG_VERSION")
            ));
            0
        }
        _ => usage(),
    }
}

fn println_safe(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

fn usage() -> i32 {
    log!(
        "usage: marshd serve --home HOME --workspace DIR | marshd agent --kit-socket PATH --kit-dir DIR --self PATH | marshd kit-client --socket PATH KIT [ARGS...]"
    );
    2
}

/// Parses `--name value` pairs, requiring exactly the `names` given.
fn flag_values(args: &[OsString], names: &[&str]) -> Result<Vec<OsString>> {
    let mut values: Vec<Option<OsString>> = vec![None; names.len()];
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let idx = names.iter().position(|n| flag == *n).ok_or_else(|| {
            Error::Usage(format!("unexpected argument {}", flag.to_string_lossy()))
        })?;
        let value = it
            .next()
            .ok_or_else(|| Error::Usage(format!("{} needs a value", names[idx])))?;
        values[idx] = Some(value.clone());
    }
    values
        .into_iter()
        .zip(names)
        .map(|(v, n)| v.ok_or_else(|| Error::Usage(format!("missing {n}"))))
        .collect()
}

fn serve_args(args: &[OsString]) -> Result<(PathBuf, PathBuf)> {
    let v = flag_values(args, &["--home", "--workspace"])?;
    Ok((PathBuf::from(&v[0]), PathBuf::from(&v[1])))
}

fn agent_args(args: &[OsString]) -> Result<agent::AgentPaths> {
    let v = flag_values(args, &["--kit-socket", "--kit-dir", "--self"])?;
    Ok(agent::AgentPaths {
        kit_socket: PathBuf::from(&v[0]),
        kit_dir: PathBuf::from(&v[1]),
        self_exe: PathBuf::from(&v[2]),
    })
}
