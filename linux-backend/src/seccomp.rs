//! The seccomp filter every sandbox runs under (handed to bubblewrap with `--seccomp FD`,
//! so it covers the agent, every job and every kit container).
//!
//! What it refuses, and why each rule is needed on top of the user namespace:
//! - setuid/setgid mode bits on any create or mode change (`chmod`, `fchmod`, `fchmodat`,
//!   `fchmodat2`, `open`/`openat`/`creat` with `O_CREAT`/`O_TMPFILE`, `mknod`, `mknodat`)
//!   → `EPERM`. Jobs run as the server's uid; a setuid file they own would run as that
//!   uid for any host user who executes it (as root, for a root server). No capability
//!   is involved in an owner's chmod, so only a filter stops it. The chmod family cannot
//!   tell a directory from a file, so `chmod g+s` on a directory is refused too;
//!   `mkdir` is left alone (the kernel ignores its set-id bits and a setgid directory
//!   grants no privilege).
//! - `openat2` → `ENOSYS`: its mode sits in a struct the filter cannot read; callers fall
//!   back to `openat`.
//! - `io_uring_*` → `EPERM`: io_uring performs opens on the kernel's side, past this filter.
//! - `keyctl`, `add_key`, `request_key` → `EPERM` (as Docker's default profile): key
//!   serials are global, a job runs as the server's uid and would own its keys, and
//!   `request_key` runs a host helper. Every sandbox also starts in a fresh session
//!   keyring (`sandbox::spawn`).
//! - `clone`/`unshare` with `CLONE_NEWUSER` → `EPERM`, and `clone3` → `ENOSYS` (its flags
//!   are in a struct; libc falls back to `clone`): no nested user namespace, in which a job
//!   would hold a full capability set again.
//! - x32 system calls (x86_64 numbers with bit 30 set) → `ENOSYS`: they would otherwise
//!   miss every rule above; other architectures' calls fail the architecture check and
//!   kill the process (seccompiler's prologue).
//!
//! File capabilities (`security.capability` xattrs) need `CAP_SETFCAP`, which no sandbox
//! process holds (bubblewrap drops every capability but the agent's two), so they are
//! refused with `EPERM` by the kernel; a filter cannot read an xattr's name.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Error, Result};

const SET_ID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];
/// `__X32_SYSCALL_BIT`.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// A call whose mode argument must carry neither set-id bit.
struct ModeCall {
    nr: libc::c_long,
    mode_arg: u8,
    /// For the open family: the flags argument, which must request a create for the
    /// mode to matter (without one, the mode register may hold anything).
    create_flags_arg: Option<u8>,
}

fn mode_calls() -> Vec<ModeCall> {
    let plain = |nr, mode_arg| ModeCall {
        nr,
        mode_arg,
        create_flags_arg: None,
    };
    let creating = |nr, flags_arg, mode_arg| ModeCall {
        nr,
        mode_arg,
        create_flags_arg: Some(flags_arg),
    };
    #[allow(unused_mut)]
    let mut calls = vec![
        plain(libc::SYS_fchmod, 1),
        plain(libc::SYS_fchmodat, 2),
        plain(libc::SYS_fchmodat2, 2),
        plain(libc::SYS_mknodat, 2),
        creating(libc::SYS_openat, 2, 3),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([
        plain(libc::SYS_chmod, 1),
        plain(libc::SYS_creat, 1),
        plain(libc::SYS_mknod, 1),
        creating(libc::SYS_open, 1, 2),
    ]);
    calls
}

fn condition(arg: u8, mask: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(mask),
        mask,
    )
    .map_err(filter_error)
}

fn filter_error(e: impl std::fmt::Display) -> Error {
    Error::Backend(format!("building the sandbox's seccomp filter: {e}"))
}

/// Calls refused with `EPERM`: set-id mode bits, new user namespaces, io_uring.
fn eperm_rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut add = |nr: libc::c_long, rule: Vec<SeccompCondition>| -> Result<()> {
        let rule = SeccompRule::new(rule).map_err(filter_error)?;
        rules.entry(nr).or_default().push(rule);
        Ok(())
    };
    for call in mode_calls() {
        for bit in SET_ID_BITS {
            match call.create_flags_arg {
                None => add(call.nr, vec![condition(call.mode_arg, bit)?])?,
                Some(flags) => {
                    for create in [libc::O_CREAT as u64, libc::O_TMPFILE as u64] {
                        add(
                            call.nr,
                            vec![condition(flags, create)?, condition(call.mode_arg, bit)?],
                        )?;
                    }
                }
            }
        }
    }
    let new_user = libc::CLONE_NEWUSER as u64;
    add(libc::SYS_clone, vec![condition(0, new_user)?])?;
    add(libc::SYS_unshare, vec![condition(0, new_user)?])?;
    // An empty rule list matches the call whatever its arguments.
    for nr in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
    ] {
        rules.insert(nr, Vec::new());
    }
    Ok(rules)
}

/// Calls refused with `ENOSYS`, so that libc falls back to a call the filter can read.
fn enosys_rules() -> BTreeMap<i64, Vec<SeccompRule>> {
    [libc::SYS_openat2, libc::SYS_clone3]
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect()
}

fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        target_arch()?,
    )
    .map_err(filter_error)?;
    filter.try_into().map_err(filter_error)
}

fn target_arch() -> Result<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(filter_error)
}

/// The whole program as classic BPF instructions.
///
/// seccompiler gives a filter one match action, so the program is two compiled filters
/// in sequence (EPERM rules, then ENOSYS rules), chained by turning the first one's
/// "allow" returns into jumps to the second's start. Each filter starts with its own
/// architecture check and reloads the call number, so the chain needs nothing else.
pub fn program() -> Result<BpfProgram> {
    let mut first = compile(eperm_rules()?, libc::EPERM)?;
    let second = compile(enosys_rules(), libc::ENOSYS)?;
    chain(&mut first);
    let mut program = Vec::new();
    #[cfg(target_arch = "x86_64")]
    program.extend(x32_guard());
    program.extend(first);
    program.extend(second);
    Ok(program)
}

/// Rewrites every `ret ALLOW` of `part` into a jump to the instruction after its end.
fn chain(part: &mut BpfProgram) {
    let len = part.len();
    for (i, insn) in part.iter_mut().enumerate() {
        if insn.code == RET_K && insn.k == libc::SECCOMP_RET_ALLOW {
            // `ja k` jumps k instructions past the next one: land on index `len`.
            insn.code = JA;
            insn.k = (len - i - 1) as u32;
        }
    }
}

const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;

#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    use seccompiler::sock_filter;
    let ld_nr = sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k: 0, // offsetof(struct seccomp_data, nr)
    };
    let jge = sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16,
        jt: 0,
        jf: 1,
        k: X32_SYSCALL_BIT,
    };
    let refuse = sock_filter {
        code: RET_K,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    };
    vec![ld_nr, jge, refuse]
}

/// The program in the byte layout `--seccomp FD` reads: `struct sock_filter` in native
/// byte order, back to back.
pub fn program_bytes() -> Result<Vec<u8>> {
    let program = program()?;
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for insn in &program {
        bytes.extend_from_slice(&insn.code.to_ne_bytes());
        bytes.push(insn.jt);
        bytes.push(insn.jf);
        bytes.extend_from_slice(&insn.k.to_ne_bytes());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_program_compiles_within_the_kernel_limit() {
        let program = program().unwrap();
        // BPF_MAXINSNS.
        assert!(program.len() < 4096, "{}", program.len());
        assert_eq!(program_bytes().unwrap().len(), program.len() * 8);
        // Every jump stays inside the program.
        for (i, insn) in program.iter().enumerate() {
            if insn.code & 0x07 == libc::BPF_JMP as u16 {
                let far = if insn.code == JA {
                    insn.k as usize
                } else {
                    usize::from(insn.jt.max(insn.jf))
                };
                assert!(
                    i + 1 + far < program.len(),
                    "jump at {i} leaves the program"
                );
            }
        }
        // The only ALLOW is the last part's fall-through.
        let allows = program
            .iter()
            .filter(|i| i.code == RET_K && i.k == libc::SECCOMP_RET_ALLOW)
            .count();
        assert!(allows >= 1);
    }
}
