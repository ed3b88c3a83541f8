//! The `marshd` binary's modes: `serve` (the per-home daemon), `agent` (the project
//! shell's in-sandbox agent), `container-init`, `guard-exec` (a kit container's first
//! program when the set-id guard runs), `kit-client` (what a kit wrapper on a job's
//! PATH runs) and `mcp-client` (what `mcp` on a job's PATH runs).

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::error::ErrorKind;
use clap::{ArgAction, CommandFactory, Parser, Subcommand};

use crate::util::log;
use crate::{agent, daemon};

const USAGE: &str = "marshd serve --home HOME --workspace DIR | marshd agent --kit-socket PATH --kit-dir DIR --bin-dir DIR --self PATH [--contain] [--nproc N] | marshd container-init [--admit] | marshd guard-exec --fd N -- ARGV... | marshd kit-client --socket PATH KIT [ARGS...] | marshd mcp-client --socket PATH [ARGS...]";

// The command line. Only `--version` is a flag of its own: there is no `--help` or
// `help` (they are usage errors), a repeated flag keeps its last value, and a flag's
// value is the next word even when it starts with `-`.
#[derive(Debug, Parser)]
#[command(
    name = "marshd",
    version = concat!(env!("CARGO_PKG_VERSION"), " (marsh-shim)"),
    override_usage = USAGE,
    arg_required_else_help = false,
    disable_version_flag = true,
    disable_help_flag = true,
    disable_help_subcommand = true
)]
struct Cli {
    #[arg(long, action = ArgAction::Version)]
    version: Option<bool>,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Debug, Subcommand)]
enum Mode {
    /// The per-home daemon, bound to one workspace.
    #[command(disable_help_flag = true, args_override_self = true)]
    Serve {
        #[arg(long, value_name = "HOME", allow_hyphen_values = true)]
        home: PathBuf,
        #[arg(long, value_name = "DIR", allow_hyphen_values = true)]
        workspace: PathBuf,
    },
    /// The project shell's agent, inside the sandbox.
    #[command(disable_help_flag = true, args_override_self = true)]
    Agent {
        #[arg(long, value_name = "PATH", allow_hyphen_values = true)]
        kit_socket: PathBuf,
        #[arg(long, value_name = "DIR", allow_hyphen_values = true)]
        kit_dir: PathBuf,
        #[arg(long, value_name = "DIR", allow_hyphen_values = true)]
        bin_dir: PathBuf,
        #[arg(long = "self", value_name = "PATH", allow_hyphen_values = true)]
        self_exe: PathBuf,
        /// Run each job in its own pid and mount namespace (inside bubblewrap).
        #[arg(long)]
        contain: bool,
        /// `RLIMIT_NPROC` for each job (when no control group bounds the scope).
        #[arg(long, value_name = "N")]
        nproc: Option<u64>,
    },
    /// pid 1 of one job's container, started by the agent (channel on fd 0).
    #[command(name = "container-init", disable_help_flag = true)]
    ContainerInit {
        /// Send what the daemon's admission needs (a pidfd and the workspace mounts)
        /// with `Ready`.
        #[arg(long)]
        admit: bool,
    },
    /// A kit container's first program: has the daemon guard its workspace mounts
    /// (socket on fd `N`), then executes the kit's command in its place.
    #[command(
        name = "guard-exec",
        disable_help_flag = true,
        override_usage = "marshd guard-exec --fd N -- ARGV..."
    )]
    GuardExec {
        #[arg(long, value_name = "N")]
        fd: i32,
        #[arg(
            value_name = "ARGV",
            required = true,
            num_args = 1..,
            trailing_var_arg = true,
            allow_hyphen_values = true
        )]
        argv: Vec<OsString>,
    },
    /// What a kit wrapper runs: `--socket PATH` first, then the kit's name and its
    /// arguments, all passed on verbatim (`--`, `--help` and `--socket` included).
    #[command(
        disable_help_flag = true,
        override_usage = "marshd kit-client --socket PATH KIT [ARGS...]"
    )]
    KitClient {
        #[arg(long, value_name = "PATH", allow_hyphen_values = true)]
        socket: PathBuf,
        /// The kit's name followed by its arguments.
        #[arg(
            value_name = "KIT",
            required = true,
            num_args = 1..,
            trailing_var_arg = true,
            allow_hyphen_values = true
        )]
        command: Vec<OsString>,
    },
    /// What `mcp` in the project shell runs: `--socket PATH` first, then the `mcp`
    /// arguments, passed on verbatim.
    #[command(
        name = "mcp-client",
        disable_help_flag = true,
        override_usage = "marshd mcp-client --socket PATH [ARGS...]"
    )]
    McpClient {
        #[arg(long, value_name = "PATH", allow_hyphen_values = true)]
        socket: PathBuf,
        #[arg(
            value_name = "ARGS",
            num_args = 0..,
            trailing_var_arg = true,
            allow_hyphen_values = true
        )]
        args: Vec<OsString>,
    },
}

/// Entry point of the `marshd` binary.
pub fn main(args: Vec<OsString>) -> i32 {
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) if e.kind() == ErrorKind::DisplayVersion => {
            let _ = write!(std::io::stdout().lock(), "{}", e.render());
            return 0;
        }
        Err(e) => {
            log!("{}", usage_message(&e, args.get(1)));
            // The agent reports every failure, usage included, with status 1 (the
            // daemon only watches it die); every other mode exits 2 on bad usage.
            return if args.get(1).is_some_and(|mode| mode == "agent") {
                1
            } else {
                2
            };
        }
    };
    match cli.mode {
        Mode::Serve { home, workspace } => match daemon::serve(&home, &workspace) {
            Ok(()) => 0,
            Err(e) => {
                log!("marshd: {e}");
                e.exit_code()
            }
        },
        Mode::Agent {
            kit_socket,
            kit_dir,
            bin_dir,
            self_exe,
            contain,
            nproc,
        } => match agent::run(agent::AgentPaths {
            kit_socket,
            kit_dir,
            bin_dir,
            self_exe,
            contain,
            nproc,
        }) {
            Ok(()) => 0,
            Err(e) => {
                log!("marshd agent: {e}");
                1
            }
        },
        Mode::ContainerInit { admit } => agent::init::main(admit),
        Mode::GuardExec { fd, argv } => crate::setid_guard::exec_guarded(fd, &argv),
        Mode::KitClient { socket, command } => match command.split_first() {
            Some((kit, kit_args)) => {
                agent::kit_client::run(&socket, &kit.to_string_lossy(), kit_args)
            }
            // `required = true` guarantees the kit's name.
            None => 2,
        },
        Mode::McpClient { socket, args } => agent::mcp_client::run(&socket, &args),
    }
}

/// clap's diagnostic, always followed by the usage of the mode (or of `marshd`).
fn usage_message(e: &clap::Error, mode: Option<&OsString>) -> String {
    let text = e.render().to_string();
    let text = text.trim_end();
    if text.contains("Usage:") {
        return text.to_string();
    }
    let mut cmd = Cli::command();
    cmd.build();
    let usage = match mode
        .and_then(|m| m.to_str())
        .and_then(|m| cmd.find_subcommand_mut(m))
    {
        Some(sub) => sub.render_usage(),
        None => cmd.render_usage(),
    };
    format!("{text}\n\n{}", usage.to_string().trim_end())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("marshd").chain(args.iter().copied()))
    }

    fn usage_error(args: &[&str]) {
        let e = parse(args).expect_err("a usage error");
        assert_ne!(e.kind(), ErrorKind::DisplayVersion, "{args:?}");
        assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
    }

    #[test]
    fn serve_takes_home_and_workspace_in_any_order() {
        for args in [
            &["serve", "--home", "/h", "--workspace", "/w"][..],
            &["serve", "--workspace", "/w", "--home", "/h"],
            &["serve", "--home", "/x", "--home", "/h", "--workspace", "/w"],
        ] {
            match parse(args).unwrap().mode {
                Mode::Serve { home, workspace } => {
                    assert_eq!((home, workspace), ("/h".into(), "/w".into()), "{args:?}");
                }
                other => panic!("{other:?}"),
            }
        }
        match parse(&["serve", "--home", "-h", "--workspace", "--w"])
            .unwrap()
            .mode
        {
            Mode::Serve { home, workspace } => {
                assert_eq!((home, workspace), ("-h".into(), "--w".into()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn agent_takes_its_three_paths() {
        let args = [
            "agent",
            "--kit-socket",
            "/run/k.sock",
            "--kit-dir",
            "/run/kits",
            "--bin-dir",
            "/run/bin",
            "--self",
            "/a",
        ];
        match parse(&args).unwrap().mode {
            Mode::Agent {
                kit_socket,
                kit_dir,
                bin_dir,
                self_exe,
                contain,
                nproc,
            } => {
                assert_eq!(kit_socket, PathBuf::from("/run/k.sock"));
                assert_eq!(kit_dir, PathBuf::from("/run/kits"));
                assert_eq!(bin_dir, PathBuf::from("/run/bin"));
                assert_eq!(self_exe, PathBuf::from("/a"));
                assert!(!contain);
                assert_eq!(nproc, None);
            }
            other => panic!("{other:?}"),
        }
        let mut contained = args.to_vec();
        contained.extend(["--contain", "--nproc", "64"]);
        match parse(&contained).unwrap().mode {
            Mode::Agent { contain, nproc, .. } => assert_eq!((contain, nproc), (true, Some(64))),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn kit_client_passes_the_kit_arguments_verbatim() {
        let cases: [(&[&str], &[&str]); 4] = [
            (&["k"], &["k"]),
            (&["k", "a", "b"], &["k", "a", "b"]),
            (
                &["k", "--", "--socket", "x", "--help", "-v", "--version"],
                &["k", "--", "--socket", "x", "--help", "-v", "--version"],
            ),
            (&["-k", "-x"], &["-k", "-x"]),
        ];
        for (tail, expected) in cases {
            let mut args = vec!["kit-client", "--socket", "/s"];
            args.extend_from_slice(tail);
            match parse(&args).unwrap().mode {
                Mode::KitClient { socket, command } => {
                    assert_eq!(socket, PathBuf::from("/s"));
                    let expected: Vec<OsString> = expected.iter().map(OsString::from).collect();
                    assert_eq!(command, expected, "{args:?}");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn version_is_the_only_top_level_flag() {
        let e = parse(&["--version"]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DisplayVersion);
        assert_eq!(
            e.render().to_string(),
            format!("marshd {} (marsh-shim)\n", env!("CARGO_PKG_VERSION"))
        );
    }

    #[test]
    fn bad_usage_exits_2() {
        for args in [
            &[][..],
            &["frobnicate"],
            &["help"],
            &["--help"],
            &["-h"],
            &["-V"],
            &["serve"],
            &["serve", "--home", "/h"],
            &["serve", "--home", "/h", "--workspace"],
            &["serve", "--home", "/h", "--workspace", "/w", "extra"],
            &["serve", "--home", "/h", "--workspace", "/w", "--help"],
            &["serve", "--version", "--home", "/h", "--workspace", "/w"],
            &["agent", "--kit-socket", "/s", "--kit-dir", "/d"],
            &["kit-client"],
            &["kit-client", "--socket", "/s"],
            &["kit-client", "k", "--socket", "/s"],
            &["kit-client", "--help"],
        ] {
            usage_error(args);
        }
        let usage = |args: &[&str]| {
            let argv = std::iter::once("marshd").chain(args.iter().copied());
            main(argv.map(OsString::from).collect())
        };
        assert_eq!(usage(&[]), 2);
        assert_eq!(usage(&["serve", "--home", "/h"]), 2);
        assert_eq!(usage(&["kit-client", "--socket"]), 2);
        assert_eq!(usage(&["agent", "--self"]), 1, "the agent fails with 1");
    }

    #[test]
    fn every_usage_error_shows_a_usage() {
        let message = |args: &[&str]| {
            let e = parse(args).unwrap_err();
            usage_message(&e, args.first().map(OsString::from).as_ref())
        };
        for args in [&[][..], &["frobnicate"], &["--help"]] {
            let text = message(args);
            assert!(text.starts_with("error: "), "{text}");
            assert!(text.ends_with(&format!("Usage: {USAGE}")), "{text}");
        }
        for (args, usage) in [
            (
                &["serve"][..],
                "Usage: marshd serve --home <HOME> --workspace <DIR>",
            ),
            (
                &["agent", "--self"],
                "Usage: marshd agent [OPTIONS] --kit-socket <PATH> --kit-dir <DIR> --bin-dir <DIR> --self <PATH>",
            ),
            (
                &["kit-client", "--socket"],
                "Usage: marshd kit-client --socket PATH KIT [ARGS...]",
            ),
        ] {
            let text = message(args);
            assert!(text.starts_with("error: "), "{text}");
            assert!(text.ends_with(usage), "{text}");
        }
    }
}
