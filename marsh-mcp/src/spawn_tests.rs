use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

fn sh(script: &str) -> ChildCommand {
    let mut cmd = ChildCommand::new("/bin/sh");
    cmd.args(["-c", script]);
    cmd
}

/// Runs `cmd` with `input` on stdin to its end: (status, stdout, stderr).
async fn output(cmd: &ChildCommand, input: Option<&[u8]>) -> (ExitStatus, String, String) {
    let stdin = if input.is_some() {
        StdinKind::Piped
    } else {
        StdinKind::Null
    };
    let mut spawned = cmd.spawn(stdin).unwrap();
    let run = async {
        if let (Some(bytes), Some(mut pipe)) = (input, spawned.stdin.take()) {
            pipe.write_all(bytes).await.unwrap();
        }
        let (mut out, mut err) = (String::new(), String::new());
        spawned.stdout.read_to_string(&mut out).await.unwrap();
        spawned.stderr.read_to_string(&mut err).await.unwrap();
        let status = spawned.child.wait().await.unwrap();
        (status, out, err)
    };
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("the child's pipes or end were not seen within 10 s")
}

#[tokio::test]
async fn the_child_sees_exactly_its_arguments_environment_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = ChildCommand::new("/bin/sh");
    cmd.arg0("named-shell")
        .args([
            "-c",
            "echo \"$(/usr/bin/head -c 11 /proc/$$/cmdline)|$0|$(pwd)\"; /usr/bin/env | /usr/bin/sort",
            "first arg",
        ])
        .env("ONLY", "this")
        .env("AND", "that")
        .env("ONLY", "replaced")
        .current_dir(dir.path());
    // The test process has PATH and HOME; none of it may pass.
    let (status, out, err) = output(&cmd, None).await;
    assert!(status.success(), "{err}");
    let mut lines = out.lines();
    let canonical = dir.path().canonicalize().unwrap();
    assert_eq!(
        lines.next().unwrap(),
        format!("named-shell|first arg|{}", canonical.display()),
        "argv[0]|$0|cwd"
    );
    // sh itself adds PWD (and may add SHLVL, _); nothing of ours beyond what was set.
    let vars: Vec<&str> = lines
        .filter(|l| !l.starts_with("PWD=") && !l.starts_with("SHLVL=") && !l.starts_with("_="))
        .collect();
    assert_eq!(vars, ["AND=that", "ONLY=replaced"]);
}

#[tokio::test]
async fn stdin_is_null_or_the_given_bytes_and_exit_statuses_are_reported() {
    let (status, out, _) = output(&sh("cat; exit 3"), None).await;
    assert_eq!((status.code(), out.as_str()), (Some(3), ""));
    let (status, out, _) = output(&sh("cat"), Some(b"piped bytes")).await;
    assert_eq!((status.code(), out.as_str()), (Some(0), "piped bytes"));
    let (status, _, err) = output(&sh("echo oops >&2; kill -TERM $$"), None).await;
    assert_eq!(
        (status.code(), status.signal(), err.as_str()),
        (None, Some(libc::SIGTERM), "oops\n")
    );
}

#[tokio::test]
async fn only_named_descriptors_are_inherited() {
    let kept = tempfile::tempfile().unwrap();
    let hidden = tempfile::tempfile().unwrap();
    // std opens files close-on-exec, as marsh-mcp's pins are.
    let script = format!(
        "test -e /proc/self/fd/{k} && echo kept; test -e /proc/self/fd/{h} && echo leaked; true",
        k = kept.as_raw_fd(),
        h = hidden.as_raw_fd()
    );
    let mut cmd = sh(&script);
    cmd.inherit_fd(kept.as_raw_fd());
    let (status, out, _) = output(&cmd, None).await;
    assert!(status.success());
    assert_eq!(out, "kept\n");
    let (_, out, _) = output(&sh(&script), None).await;
    assert_eq!(out, "");
}

#[tokio::test]
async fn the_child_leads_its_own_group_with_no_blocked_or_inherited_handlers() {
    // The test harness ignores SIGPIPE (as marsh-mcp does); the child must not.
    let script = "read -r pid comm state ppid pgid rest < /proc/self/stat; echo \"$$ $pgid\"; \
                  while read -r key mask; do case $key in SigBlk:|SigIgn:) echo \"$key $mask\";; esac; done < /proc/$$/status";
    let (status, out, _) = output(&sh(script), None).await;
    assert!(status.success());
    let mut lines = out.lines();
    let ids: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(ids[0], ids[1], "pid and pgid differ: {out}");
    let masks: Vec<(&str, u64)> = lines
        .map(|line| {
            let (key, mask) = line.split_once(' ').unwrap();
            (key, u64::from_str_radix(mask, 16).unwrap())
        })
        .collect();
    let [("SigBlk:", blocked), ("SigIgn:", ignored)] = masks[..] else {
        panic!("no signal masks read: {out}");
    };
    assert_eq!(blocked, 0, "signals blocked in the child: {blocked:#x}");
    let sigpipe = 1u64 << (libc::SIGPIPE - 1);
    assert_eq!(ignored & sigpipe, 0, "SIGPIPE still ignored: {ignored:#x}");
}

#[tokio::test]
async fn failures_before_exec_are_typed() {
    let missing = ChildCommand::new("/nonexistent/marsh-mcp-spawn-test")
        .spawn(StdinKind::Null)
        .unwrap_err();
    assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    let mut bad_dir = sh("true");
    bad_dir.current_dir("/nonexistent/marsh-mcp-spawn-test");
    assert_eq!(
        bad_dir.spawn(StdinKind::Null).unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    let relative = ChildCommand::new("sh").spawn(StdinKind::Null).unwrap_err();
    assert_eq!(relative.kind(), io::ErrorKind::InvalidInput);
    let mut stdio = sh("true");
    stdio.inherit_fd(1);
    assert_eq!(
        stdio.spawn(StdinKind::Null).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
}

#[test]
fn outside_the_runtime_nothing_is_started() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let err = sh(&format!("touch {}", marker.display()))
        .spawn(StdinKind::Null)
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::Other);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!marker.exists());
}

#[tokio::test]
async fn a_child_is_waited_for_through_its_pidfd_where_the_kernel_has_one() {
    let spawned = sh("exit 5").spawn(StdinKind::Null).unwrap();
    let mut child = spawned.child;
    if child.pidfd.is_none() {
        // Only a kernel that refuses pidfd_open may leave it out: ENOSYS before
        // Linux 5.3, EPERM under a container's seccomp policy.
        // SAFETY: a plain system call on integers.
        #[allow(unsafe_code)]
        let probe = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) };
        let errno = Errno::last();
        assert_eq!(probe, -1);
        assert!(
            matches!(errno, Errno::ENOSYS | Errno::EPERM),
            "pidfd_open works ({errno}) but was not used"
        );
    }
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(5));
}

#[tokio::test]
async fn a_child_without_pidfd_is_waited_for_by_polling() {
    let spawned = sh("sleep 0.05; exit 7").spawn(StdinKind::Null).unwrap();
    let mut child = spawned.child.without_pidfd();
    assert_eq!(child.try_wait().unwrap(), None);
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(7));
    assert_eq!(child.try_wait().unwrap().map(|s| s.code()), Some(Some(7)));
}

#[tokio::test]
async fn a_dropped_child_is_killed_and_reaped() {
    let spawned = sh("exec sleep 300").spawn(StdinKind::Null).unwrap();
    let pid = spawned.child.id();
    drop(spawned);
    let gone = async {
        loop {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone)
        .await
        .expect("the dropped child was neither killed nor reaped");
}

#[test]
fn the_child_dies_with_the_thread_that_spawned_it() {
    // PR_SET_PDEATHSIG follows the spawning thread: spawn from a thread that then ends.
    let pid = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let spawned = sh("exec sleep 300").spawn(StdinKind::Null).unwrap();
            let pid = spawned.child.id();
            // Leave it running: forget the handle so its drop does not kill it.
            std::mem::forget(spawned.child);
            pid
        })
    })
    .join()
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)).unwrap() {
            WaitStatus::StillAlive if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            WaitStatus::StillAlive => {
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                panic!("the child outlived the thread that spawned it");
            }
            status => break status,
        }
    };
    assert_eq!(status, WaitStatus::Signaled(pid, Signal::SIGKILL, false));
}

#[test]
fn the_child_stack_has_a_guard_page_below_it() {
    let mut stack = ChildStack::map().unwrap();
    let base = stack.base as usize;
    let usable = stack.usable();
    assert_eq!(usable.len(), CHILD_STACK_BYTES);
    assert_eq!(usable.as_ptr() as usize, base + GUARD_BYTES);
    usable[0] = 1;
    usable[CHILD_STACK_BYTES - 1] = 1;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    // (A neighbouring mapping with the same protection may be merged into the line.)
    let perms_at = |addr: usize| -> String {
        maps.lines()
            .find_map(|line| {
                let (range, rest) = line.split_once(' ')?;
                let (start, end) = range.split_once('-')?;
                let start = usize::from_str_radix(start, 16).ok()?;
                let end = usize::from_str_radix(end, 16).ok()?;
                (start <= addr && addr < end).then(|| rest[..4].to_owned())
            })
            .unwrap_or_else(|| panic!("{addr:x} is not mapped"))
    };
    assert_eq!(perms_at(base), "---p");
    assert_eq!(perms_at(base + GUARD_BYTES - 1), "---p");
    assert_eq!(perms_at(base + GUARD_BYTES), "rw-p");
    assert_eq!(perms_at(base + GUARD_BYTES + CHILD_STACK_BYTES - 1), "rw-p");
}
