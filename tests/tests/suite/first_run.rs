//! First run: `make demo` and `make test` check for bubblewrap, python3 with
//! venv and (test) npm before building anything; as root the missing packages are
//! installed with apt-get, otherwise make stops with the command to run. The system is
//! stubbed: `id`, `python3`, `npm`, `apt-get` and `cargo` are scripts on a private
//! `PATH`, and `PREREQS_BWRAP_DIRS` hides the real bwrap.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn script(path: &Path, body: &str) {
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// A stubbed system in a temporary directory: `bin/` is the whole `PATH`, `bwrap/` the
/// only place bwrap is looked for, `apt.log` the apt-get calls, `cargo.log` the builds.
struct System {
    dir: tempfile::TempDir,
}

impl System {
    fn new(uid: u32) -> System {
        let dir = tempfile::tempdir().unwrap();
        let sys = System { dir };
        fs::create_dir(sys.bin()).unwrap();
        fs::create_dir(sys.bwrap_dir()).unwrap();
        script(&sys.bin().join("id"), &format!("echo {uid}"));
        // Installing writes what each package provides, as apt-get would.
        script(
            &sys.bin().join("apt-get"),
            &format!(
                "echo \"$*\" >> {log}\n\
                 [ \"$1\" = install ] || exit 0\n\
                 for p in \"$@\"; do case $p in\n\
                 bubblewrap) printf '#!/bin/sh\\n' > {bwrap}/bwrap; /bin/chmod 755 {bwrap}/bwrap ;;\n\
                 python3-venv) printf '#!/bin/sh\\nexit 0\\n' > {bin}/python3; /bin/chmod 755 {bin}/python3 ;;\n\
                 npm) printf '#!/bin/sh\\n' > {bin}/npm; /bin/chmod 755 {bin}/npm ;;\n\
                 esac; done",
                log = sys.path("apt.log").display(),
                bwrap = sys.bwrap_dir().display(),
                bin = sys.bin().display(),
            ),
        );
        script(
            &sys.bin().join("cargo"),
            &format!("echo \"$*\" >> {}", sys.path("cargo.log").display()),
        );
        sys
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn bin(&self) -> PathBuf {
        self.path("bin")
    }

    fn bwrap_dir(&self) -> PathBuf {
        self.path("bwrap")
    }

    /// python3 without venv/ensurepip (Debian without python3-venv): the check fails.
    fn python_without_venv(self) -> Self {
        script(&self.bin().join("python3"), "exit 1");
        self
    }

    fn with_python_and_bwrap(self) -> Self {
        script(&self.bin().join("python3"), "exit 0");
        script(&self.bwrap_dir().join("bwrap"), "");
        self
    }

    fn with_npm(self) -> Self {
        script(&self.bin().join("npm"), "");
        self
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", self.bin())
            .env("HOME", self.path("home"))
            .env("PREREQS_BWRAP_DIRS", self.bwrap_dir())
            .stdin(Stdio::null());
        cmd
    }

    /// `make GOAL` in this repository, with `cargo` and the demo directory stubbed.
    fn make(&self, goal: &str) -> Output {
        self.command(&which("make"))
            .arg("-C")
            .arg(repo())
            .arg(goal)
            .arg(format!("CARGO={}", self.bin().join("cargo").display()))
            .arg(format!("DEMO_DIR={}", self.path("demo").display()))
            .output()
            .unwrap()
    }

    /// The check alone, as the Makefile runs it.
    fn check(&self, goal: &str) -> Output {
        self.command(Path::new("/bin/sh"))
            .arg(repo().join("tests/prereqs.sh"))
            .arg(goal)
            .output()
            .unwrap()
    }
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(program))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn without_bwrap_or_venv_make_demo_and_make_test_stop_before_building_naming_the_command() {
    for (goal, packages) in [
        ("demo", "bubblewrap python3-venv"),
        ("test", "bubblewrap python3-venv npm"),
    ] {
        let sys = System::new(1000).python_without_venv();
        let out = sys.make(goal);
        let err = stderr(&out);
        assert!(!out.status.success(), "make {goal} passed: {err}");
        let line = format!(
            "marsh-mcp: make {goal} needs missing packages ({packages}); \
             run: sudo apt-get install -y {packages}\n"
        );
        assert!(err.starts_with(&line), "make {goal}: {err}");
        assert_eq!(sys.log("cargo.log"), "", "make {goal} built something");
        assert_eq!(
            sys.log("apt.log"),
            "",
            "make {goal} ran apt-get as non-root"
        );
        assert!(!sys.path("demo").exists());
    }
    // Only bwrap missing: demo names it alone; npm is for `make test` only.
    let sys = System::new(1000).with_python_and_bwrap();
    fs::remove_file(sys.bwrap_dir().join("bwrap")).unwrap();
    let out = sys.check("demo");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out),
        "marsh-mcp: make demo needs missing packages (bubblewrap); \
         run: sudo apt-get install -y bubblewrap\n"
    );
}

#[test]
fn as_root_the_missing_packages_are_installed_with_apt_get_then_the_check_passes() {
    let sys = System::new(0).python_without_venv();
    let out = sys.check("test");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        sys.log("apt.log"),
        "update\ninstall -y bubblewrap python3-venv npm\n"
    );
    assert!(sys.bwrap_dir().join("bwrap").exists());

    // `make demo` installs only what the demo needs (no npm).
    let sys = System::new(0).with_python_and_bwrap();
    fs::remove_file(sys.bwrap_dir().join("bwrap")).unwrap();
    let out = sys.check("demo");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(sys.log("apt.log"), "update\ninstall -y bubblewrap\n");

    // apt-get that installs nothing: the check still fails, naming what is missing.
    let sys = System::new(0).python_without_venv();
    script(
        &sys.bin().join("apt-get"),
        &format!("echo \"$*\" >> {}", sys.path("apt.log").display()),
    );
    let out = sys.check("demo");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("marsh-mcp: still missing after apt-get: bubblewrap python3-venv"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn with_everything_present_the_check_is_silent_and_installs_nothing() {
    for uid in [0, 1000] {
        let sys = System::new(uid).with_python_and_bwrap().with_npm();
        for goal in ["demo", "test"] {
            let out = sys.check(goal);
            assert!(out.status.success(), "{goal}: {}", stderr(&out));
            assert_eq!(stderr(&out), "");
        }
        assert_eq!(sys.log("apt.log"), "");
    }
}

/// `tests/clients/demo.py` (what `make demo` runs) against a copy of the built binaries,
/// with `sbx` replaced by `sbx_script` when given.
fn demo(sbx_script: Option<&str>) -> (Option<i32>, String) {
    let python = marsh_tests::target_dir()
        .parent()
        .unwrap()
        .join("py-venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make py-client` (done by `make test`)",
        python.display()
    );
    let sb = marsh_tests::Sandbox::new();
    if let Some(body) = sbx_script {
        let sbx = sb.prefix.bin("sbx");
        fs::remove_file(&sbx).unwrap();
        script(&sbx, body);
    }
    fs::write(sb.workspace().join("README.txt"), "hello\n").unwrap();
    let demo_dir = sb.state().join("demo");
    fs::create_dir(&demo_dir).unwrap();
    fs::set_permissions(&demo_dir, fs::Permissions::from_mode(0o700)).unwrap();
    let out = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/demo.py"))
        .arg(sb.prefix.bin("marsh-mcp").parent().unwrap())
        .arg(sb.workspace())
        .arg(demo_dir.join("root"))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", sb.state().join("user"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    // The daemons the demo booted (scope root and publication home).
    for pid in [demo_dir.join("home/daemon/pid")].into_iter().chain(
        fs::read_dir(demo_dir.join("root"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("daemon/pid")),
    ) {
        if let Ok(pid) = fs::read_to_string(pid)
            && let Ok(pid) = pid.trim().parse::<i32>()
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    // stdout's last line is the verdict; a crash's traceback is on stderr, after it.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    (out.status.code(), text)
}

#[test]
fn the_demo_exits_0_only_when_every_step_answers_as_expected_and_names_the_failed_ones() {
    let (code, out) = demo(None);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out.matches("  (expected refusal)\n").count(), 4, "{out}");
    assert!(!out.contains("FAILED"), "{out}");
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("demo finished: all ") && last.contains(" steps answered as expected"),
        "{out}"
    );

    // An sbx that fails: publishing fails (a shell_run answering `exited`) and the
    // gateway session crashes; both are named on the last line, and the exit code is 1.
    let (code, out) = demo(Some("echo broken sbx >&2\nexit 1"));
    assert_eq!(code, Some(1), "{out}");
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("demo FAILED: 2 step(s) of "), "{out}");
    assert!(
        last.contains(
            "shell_run: mcp publish (inside the project shell) (state is 'exited', expected 'succeeded')"
        ),
        "{out}"
    );
    assert!(last.contains("; crash: "), "{out}");
}

/// The section names of an ELF file (64-bit little-endian), read from its header.
fn elf_sections(bytes: &[u8]) -> Vec<String> {
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3A), u16_at(0x3C), u16_at(0x3E));
    let names = u64_at(shoff + shstrndx * shentsize + 0x18);
    (0..shnum)
        .map(|i| {
            let at = names + u16_at(shoff + i * shentsize);
            let end = bytes[at..].iter().position(|b| *b == 0).unwrap();
            String::from_utf8_lossy(&bytes[at..at + end]).into_owned()
        })
        .collect()
}

/// A release `marsh-mcp` (`make build`, `make install`, in `target/<host triple>/release`):
/// under 15 MB, no DWARF, symbols kept for backtraces, statically linked (no `.interp`:
/// no dynamic loader runs). Judged on the binary itself, never on the build files'
/// text; skipped (with a line saying so) when no such build is newer than the sources'
/// manifest.
#[test]
fn release_binaries_ship_without_debug_info_but_with_symbols() {
    let built_after = |p: &Path| {
        let (Ok(exe), Ok(toml)) = (fs::metadata(p), fs::metadata(repo().join("Cargo.toml"))) else {
            return false;
        };
        exe.modified().unwrap() > toml.modified().unwrap()
    };
    let shipped: Vec<_> = fs::read_dir(repo().join("target"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join("release/marsh-mcp"))
                .filter(|exe| built_after(exe))
                .collect()
        })
        .unwrap_or_default();
    if shipped.is_empty() {
        eprintln!("skipped: no `make build` newer than Cargo.toml (run `make build`)");
        return;
    }
    for exe in shipped {
        let bytes = fs::read(&exe).unwrap();
        assert!(bytes.len() < 15 << 20, "{exe:?} is {} bytes", bytes.len());
        let sections = elf_sections(&bytes);
        assert!(
            !sections.iter().any(|s| s.starts_with(".debug_")),
            "{sections:?}"
        );
        assert!(sections.iter().any(|s| s == ".symtab"), "{sections:?}");
        assert!(
            !sections.iter().any(|s| s == ".interp"),
            "{exe:?} asks for a dynamic loader"
        );
    }
}
