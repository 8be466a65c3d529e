//! Compiles an allow list into a classic-BPF seccomp program that finds a call by
//! binary search over the sorted call numbers, instead of seccompiler's one test per
//! call in a row.
//!
//! Why not seccompiler's program: when a filter is installed, the kernel runs it once
//! for every system call number (~450) to cache which calls it always allows, and each
//! run walks the program until the call's test. With seccompiler's linear chain (334
//! instructions for a vCPU thread) that cost ~0.3 ms per thread on this host, on every
//! VM's boot path (docs/security.md). A search tree reaches any call in ~8 tests.
//! seccompiler still installs the program (`seccompiler::apply_filter`).

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, sock_filter};

/// One argument test: the argument's low 32 bits, masked, equal `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Check {
    pub arg: u8,
    pub mask: u32,
    pub value: u32,
}

/// A call is allowed when all checks of any one of its rules hold; a call with no
/// rules is allowed whatever its arguments.
pub(super) type Rules = BTreeMap<i64, Vec<Vec<Check>>>;

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_ALU_AND_K: u16 = 0x54;
const BPF_JMP_JA: u16 = 0x05;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;

/// `struct seccomp_data` offsets: nr, arch, then six 8-byte arguments after the
/// instruction pointer.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARGS: u32 = 16;
const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;

/// Calls tested one after another at the tree's leaves.
const LEAF_CALLS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("system call number {0} is out of range")]
    BadCall(i64),
    #[error("argument {0} does not exist (a call has six)")]
    BadArg(u8),
    #[error("a rule block is too long for a BPF jump ({0} instructions)")]
    TooLong(usize),
}

/// The program: `mismatch` (a `SECCOMP_RET_*` value) for calls not in `rules` and for
/// arguments no rule accepts; any other architecture kills the process.
pub(super) fn compile(rules: &Rules, mismatch: u32) -> Result<BpfProgram, CompileError> {
    let calls = rules
        .iter()
        .map(|(&nr, call_rules)| {
            let nr = u32::try_from(nr).map_err(|_| CompileError::BadCall(nr))?;
            Ok((nr, call_rules.as_slice()))
        })
        .collect::<Result<Vec<_>, CompileError>>()?;
    let mut program = vec![
        stmt(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, DATA_NR),
    ];
    program.extend(subtree(&calls, mismatch)?);
    Ok(program)
}

/// Finds `calls` (sorted) with the call number in A.
fn subtree(
    calls: &[(u32, &[Vec<Check>])],
    mismatch: u32,
) -> Result<Vec<sock_filter>, CompileError> {
    if calls.len() <= LEAF_CALLS {
        return leaf(calls, mismatch);
    }
    let middle = calls.len() / 2;
    let left = subtree(&calls[..middle], mismatch)?;
    let right = subtree(&calls[middle..], mismatch)?;
    let pivot = calls[middle].0;
    let mut code = Vec::with_capacity(2 + left.len() + right.len());
    match u8::try_from(left.len()) {
        Ok(skip) => code.push(jump(BPF_JMP_JGE_K, pivot, skip, 0)),
        Err(_) => {
            // Too far for a conditional jump: hop over an unconditional one.
            code.push(jump(BPF_JMP_JGE_K, pivot, 0, 1));
            code.push(stmt(BPF_JMP_JA, left.len() as u32));
        }
    }
    code.extend(left);
    code.extend(right);
    Ok(code)
}

/// A few calls tested in a row, then each call's argument rules.
fn leaf(calls: &[(u32, &[Vec<Check>])], mismatch: u32) -> Result<Vec<sock_filter>, CompileError> {
    // Layout: the tests, `ret mismatch`, `ret allow`, then a block per call with rules.
    let blocks = calls
        .iter()
        .map(|&(_, rules)| {
            (!rules.is_empty())
                .then(|| rule_block(rules, mismatch))
                .transpose()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let allow_at = calls.len() + 1;
    let mut block_at = allow_at + 1;
    let mut code = Vec::new();
    for (i, (&(nr, _), block)) in calls.iter().zip(&blocks).enumerate() {
        let target = match block {
            Some(block) => {
                let at = block_at;
                block_at += block.len();
                at
            }
            None => allow_at,
        };
        let offset = target - (i + 1);
        let offset = u8::try_from(offset).map_err(|_| CompileError::TooLong(offset))?;
        code.push(jump(BPF_JMP_JEQ_K, nr, offset, 0));
    }
    code.push(stmt(BPF_RET_K, mismatch));
    code.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
    code.extend(blocks.into_iter().flatten().flatten());
    Ok(code)
}

/// Allow when every check of some rule holds, else `mismatch`.
fn rule_block(rules: &[Vec<Check>], mismatch: u32) -> Result<Vec<sock_filter>, CompileError> {
    let mut code = Vec::new();
    for rule in rules {
        let mut tests = Vec::new();
        for check in rule {
            if check.arg > 5 {
                return Err(CompileError::BadArg(check.arg));
            }
            tests.push(stmt(BPF_LD_W_ABS, DATA_ARGS + 8 * u32::from(check.arg)));
            if check.mask != u32::MAX {
                tests.push(stmt(BPF_ALU_AND_K, check.mask));
            }
            // The jump past this rule is filled in below, once its length is known.
            tests.push(jump(BPF_JMP_JEQ_K, check.value & check.mask, 0, 0));
        }
        tests.push(stmt(BPF_RET_K, libc::SECCOMP_RET_ALLOW));
        let len = tests.len();
        for (at, insn) in tests.iter_mut().enumerate() {
            if insn.code == BPF_JMP_JEQ_K {
                let past = len - (at + 1);
                insn.jf = u8::try_from(past).map_err(|_| CompileError::TooLong(past))?;
            }
        }
        code.extend(tests);
    }
    code.push(stmt(BPF_RET_K, mismatch));
    Ok(code)
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Runs `program` on one call as the kernel would (the instructions kumo's programs
/// and seccompiler's use); returns the action and how many instructions ran.
#[cfg(test)]
pub(super) fn run(program: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
    let word = |offset: u32| -> u32 {
        match offset {
            DATA_NR => nr,
            DATA_ARCH => arch,
            o if (DATA_ARGS..DATA_ARGS + 48).contains(&o) => {
                let arg = args[((o - DATA_ARGS) / 8) as usize];
                if (o - DATA_ARGS).is_multiple_of(8) {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            o => panic!("load from offset {o}"),
        }
    };
    let (mut a, mut pc, mut steps) = (0u32, 0usize, 0usize);
    loop {
        let insn = &program[pc];
        steps += 1;
        pc += 1;
        match insn.code {
            BPF_LD_W_ABS => a = word(insn.k),
            BPF_ALU_AND_K => a &= insn.k,
            BPF_JMP_JA => pc += insn.k as usize,
            BPF_JMP_JEQ_K => pc += usize::from(if a == insn.k { insn.jt } else { insn.jf }),
            BPF_JMP_JGE_K => pc += usize::from(if a >= insn.k { insn.jt } else { insn.jf }),
            0x25 => pc += usize::from(if a > insn.k { insn.jt } else { insn.jf }),
            0x45 => pc += usize::from(if a & insn.k != 0 { insn.jt } else { insn.jf }),
            BPF_RET_K => return (insn.k, steps),
            code => panic!("instruction {code:#x} at {}", pc - 1),
        }
    }
}
