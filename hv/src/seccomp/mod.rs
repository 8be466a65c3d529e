//! A seccomp filter per kind of thread (Firecracker's model), installed with rust-vmm's
//! `seccompiler` and compiled to a binary search (`bpf.rs` says why). Each thread confines itself once its set-up is done (the VM's
//! memory, fds and threads exist), so the filter describes its steady state only.
//!
//! The mode is process-wide and starts `Off`: the `kumo` command sets it from
//! `--seccomp` (default `kill`); library users and in-process tests are not confined.
//! In `kill` mode a forbidden call raises SIGSYS (SECCOMP_RET_TRAP); the handler
//! writes one line naming the thread and the call and ends the process with status 3.
//! `log` lets the call through and has the kernel log it (SECCOMP_RET_LOG).
//!
//! The allow lists come from `strace -f` traces per thread name (docs/security.md).

mod bpf;
mod names;
mod rules;

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicU8, Ordering};

use seccompiler::{BpfProgram, SeccompAction};

pub use names::name as syscall_name;

/// The exit status of a process one of whose threads made a forbidden call.
pub const EXIT_STATUS: i32 = 3;

/// The environment variable of the test hook: a thread of the kind it names makes a
/// forbidden call (`personality`) right after confining itself.
pub const TEST_FORBIDDEN_ENV: &str = "KUMO_SECCOMP_TEST_FORBIDDEN";

/// What a filter does with a call outside its thread kind's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No filters.
    Off,
    /// Allowed, and logged by the kernel (SECCOMP_RET_LOG).
    Log,
    /// The process ends with status 3 and a line naming the thread and the call.
    Kill,
}

/// The kinds of thread kumo confines, each with its own allow list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadKind {
    /// A vCPU thread: KVM_RUN and the exits it handles.
    Vcpu,
    /// A device or backend worker (`backend_worker.rs`): net switch, block, interrupt
    /// responders, passthrough interrupts, the interrupt event loop.
    Backend,
    /// A VM's coordinator: waits for the vCPUs' ends, stops them, reports.
    Coordinator,
    /// The control/API thread: serves a UNIX socket (today's `ctl` server or a tokio
    /// current_thread runtime); snapshots and migrations are sent from it.
    Api,
    /// A migration thread (the incoming side's acknowledgement).
    Migration,
    /// The credit scheduler's driver.
    Credit,
    /// A `kumo nic-server` port thread.
    NicServer,
}

impl ThreadKind {
    pub const ALL: [ThreadKind; 7] = [
        ThreadKind::Vcpu,
        ThreadKind::Backend,
        ThreadKind::Coordinator,
        ThreadKind::Api,
        ThreadKind::Migration,
        ThreadKind::Credit,
        ThreadKind::NicServer,
    ];

    /// The name the test hook and the docs use.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::Backend => "backend",
            ThreadKind::Coordinator => "coordinator",
            ThreadKind::Api => "api",
            ThreadKind::Migration => "migration",
            ThreadKind::Credit => "credit",
            ThreadKind::NicServer => "nic-server",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the {kind} filter: {source}")]
    Build {
        kind: &'static str,
        source: bpf::CompileError,
    },
    #[error("installing the {kind} filter: {source}")]
    Install {
        kind: &'static str,
        source: seccompiler::Error,
    },
    #[error("installing the SIGSYS handler: {0}")]
    Handler(std::io::Error),
}

static MODE: AtomicU8 = AtomicU8::new(Mode::Off as u8);

/// Sets the process-wide mode; threads confine themselves as they reach their steady
/// state, so this is set before any VM is built.
pub fn set_mode(mode: Mode) {
    MODE.store(mode as u8, Ordering::SeqCst);
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Log => "log",
            Mode::Kill => "kill",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "off" => Ok(Mode::Off),
            "log" => Ok(Mode::Log),
            "kill" => Ok(Mode::Kill),
            _ => Err(format!("'{s}' is not a seccomp mode (off, log or kill)")),
        }
    }
}

pub fn mode() -> Mode {
    match MODE.load(Ordering::SeqCst) {
        x if x == Mode::Kill as u8 => Mode::Kill,
        x if x == Mode::Log as u8 => Mode::Log,
        _ => Mode::Off,
    }
}

/// Confines the calling thread to `kind`'s list (nothing when the mode is `Off`).
/// Irreversible for this thread and for every thread it starts from now on.
pub fn apply(kind: ThreadKind) -> Result<(), Error> {
    let mismatch = match mode() {
        Mode::Off => return Ok(()),
        Mode::Log => SeccompAction::Log,
        Mode::Kill => SeccompAction::Trap,
    };
    // Read before the filter is on: the hook must not need calls the filter forbids.
    let test_forbidden = std::env::var_os(TEST_FORBIDDEN_ENV)
        .is_some_and(|v| v.as_encoded_bytes() == kind.name().as_bytes());
    install_sigsys_handler()?;
    remember_thread_name();
    let program = compiled(kind, mismatch)?;
    seccompiler::apply_filter(program).map_err(|source| Error::Install {
        kind: kind.name(),
        source,
    })?;
    if test_forbidden {
        // SAFETY: personality(0xffffffff) only queries the persona; it is the call no
        // filter allows, made on purpose.
        unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) };
    }
    Ok(())
}

/// Each kind's program, compiled once per process and mode: compiling took ~0.1 ms a
/// thread, and every VM starts a vCPU thread each and a coordinator on its boot path.
static COMPILED: [[std::sync::OnceLock<BpfProgram>; ThreadKind::ALL.len()]; 2] =
    [const { [const { std::sync::OnceLock::new() }; ThreadKind::ALL.len()] }; 2];

fn compiled(kind: ThreadKind, mismatch: SeccompAction) -> Result<&'static BpfProgram, Error> {
    let by_mode = usize::from(mismatch == SeccompAction::Trap);
    let slot = &COMPILED[by_mode][kind as usize];
    if let Some(program) = slot.get() {
        return Ok(program);
    }
    let program = program(kind, mismatch)?;
    Ok(slot.get_or_init(|| program))
}

/// Compiles `kinds`' programs for the current mode ahead of their threads (a VM's
/// builder does it for its vCPUs and coordinator while KVM makes the VM).
pub fn prepare(kinds: &[ThreadKind]) {
    let mismatch = match mode() {
        Mode::Off => return,
        Mode::Log => SeccompAction::Log,
        Mode::Kill => SeccompAction::Trap,
    };
    for &kind in kinds {
        if let Err(e) = compiled(kind, mismatch.clone()) {
            tracing::debug!("seccomp: {e} (the thread will report it)");
        }
    }
}

/// As [`apply`], for threads with no way to report an error: a thread that was to be
/// confined and cannot be must not run unconfined, so the process ends (status 3).
pub fn apply_or_exit(kind: ThreadKind) {
    if let Err(e) = apply(kind) {
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        eprintln!("kumo: seccomp: cannot confine thread {name}: {e}");
        std::process::exit(EXIT_STATUS);
    }
}

/// The BPF program of `kind`'s filter.
pub fn program(kind: ThreadKind, mismatch: SeccompAction) -> Result<BpfProgram, Error> {
    let build = |source| Error::Build {
        kind: kind.name(),
        source,
    };
    bpf::compile(&rules::rules(kind), mismatch.into()).map_err(build)
}

/// The system calls `kind`'s filter allows (with or without argument checks).
pub fn allowed(kind: ThreadKind) -> Vec<i64> {
    rules::rules(kind).into_keys().collect()
}

thread_local! {
    /// The thread's name, NUL-padded, for the SIGSYS handler (which cannot allocate
    /// or lock). Const-initialised: reading it from a handler takes no lazy set-up.
    static THREAD_NAME: Cell<[u8; 16]> = const { Cell::new([0; 16]) };
}

fn remember_thread_name() {
    let mut buf = [0u8; 16];
    let name = std::thread::current();
    let name = name.name().unwrap_or("?").as_bytes();
    let n = name.len().min(buf.len());
    buf[..n].copy_from_slice(&name[..n]);
    THREAD_NAME.with(|t| t.set(buf));
}

fn install_sigsys_handler() -> Result<(), Error> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid start; the handler only makes
        // async-signal-safe calls (write, _exit) and reads its own thread-local.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigsys as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
                result = Err(Error::Handler(std::io::Error::last_os_error()));
            }
        }
    });
    result
}

/// Where the kernel puts the system call number in a SIGSYS siginfo on x86-64:
/// after si_signo, si_errno, si_code and padding (16 bytes), the call address (8).
const SI_SYSCALL_OFFSET: usize = 24;

extern "C" fn on_sigsys(
    _signal: libc::c_int,
    info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    // SAFETY: the kernel passes a full siginfo_t for SA_SIGINFO handlers; for
    // SIGSYS from seccomp, `_sigsys._syscall` is the int at SI_SYSCALL_OFFSET.
    let nr = unsafe {
        info.cast::<u8>()
            .add(SI_SYSCALL_OFFSET)
            .cast::<i32>()
            .read_unaligned()
    };
    let name = THREAD_NAME.try_with(Cell::get).unwrap_or([b'?'; 16]);
    let mut line = Line::default();
    line.push(b"kumo: seccomp: thread ");
    line.push(name.split(|&b| b == 0).next().unwrap_or(b"?"));
    line.push(b" made forbidden system call ");
    line.number(nr);
    if let Some(name) = names::name(nr) {
        line.push(b" (");
        line.push(name.as_bytes());
        line.push(b")");
    }
    line.push(b"\n");
    // SAFETY: write(2) and _exit(2) are async-signal-safe and on every kind's list.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(EXIT_STATUS);
    }
}

/// A fixed buffer the SIGSYS handler formats into (no allocation in a handler).
struct Line {
    buf: [u8; 160],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            buf: [0; 160],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn number(&mut self, nr: i32) {
        if nr < 0 {
            self.push(b"-");
        }
        let mut digits = [0u8; 10];
        let mut v = nr.unsigned_abs();
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_compiles_and_allows_what_the_handler_needs() {
        for kind in ThreadKind::ALL {
            program(kind, SeccompAction::Trap).unwrap();
            let allowed = allowed(kind);
            for call in [
                libc::SYS_write,
                libc::SYS_exit_group,
                libc::SYS_rt_sigreturn,
            ] {
                assert!(allowed.contains(&call), "{} lacks {call}", kind.name());
            }
            assert!(!allowed.contains(&libc::SYS_personality), "{}", kind.name());
            assert!(!allowed.contains(&libc::SYS_execve), "{}", kind.name());
        }
    }

    /// seccompiler's linear program for the same rules: the reference the search tree
    /// must agree with.
    fn seccompiler_program(kind: ThreadKind) -> BpfProgram {
        use seccompiler::{
            SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
            TargetArch,
        };
        let rules = rules::rules(kind)
            .into_iter()
            .map(|(nr, call_rules)| {
                let call_rules = call_rules
                    .iter()
                    .map(|rule| {
                        let conditions = rule
                            .iter()
                            .map(|c| {
                                SeccompCondition::new(
                                    c.arg,
                                    SeccompCmpArgLen::Dword,
                                    SeccompCmpOp::MaskedEq(u64::from(c.mask)),
                                    u64::from(c.value),
                                )
                                .unwrap()
                            })
                            .collect();
                        SeccompRule::new(conditions).unwrap()
                    })
                    .collect();
                (nr, call_rules)
            })
            .collect();
        SeccompFilter::new(
            rules,
            SeccompAction::Trap,
            SeccompAction::Allow,
            TargetArch::x86_64,
        )
        .unwrap()
        .try_into()
        .unwrap()
    }

    /// Argument values around each check of a call: its value, with bits outside the
    /// mask set, one bit off, and with the upper half set (only the low half counts).
    fn argument_cases(checks: &[Vec<bpf::Check>]) -> Vec<u64> {
        let mut cases = vec![0, u64::MAX];
        for check in checks.iter().flatten() {
            for low in [
                check.value,
                check.value | !check.mask,
                check.value ^ 1,
                check.value ^ 0x100,
            ] {
                cases.push(u64::from(low));
                cases.push(u64::from(low) | 0xdead_0000_0000_0000);
            }
        }
        cases
    }

    #[test]
    fn the_search_tree_decides_every_call_as_seccompiler_does_in_fewer_steps() {
        const X86_64: u32 = 0xC000_003E;
        for kind in ThreadKind::ALL {
            let ours = program(kind, SeccompAction::Trap).unwrap();
            let reference = seccompiler_program(kind);
            let rules = rules::rules(kind);
            let (mut our_steps, mut their_steps) = (0, 0);
            let numbers = (0..=480).chain([0x4000_0001, u32::MAX]);
            for nr in numbers {
                let checks = rules.get(&i64::from(nr)).map(Vec::as_slice).unwrap_or(&[]);
                for arg in argument_cases(checks) {
                    let (action, steps) = bpf::run(&ours, X86_64, nr, [arg; 6]);
                    let (expected, theirs) = bpf::run(&reference, X86_64, nr, [arg; 6]);
                    assert_eq!(action, expected, "{}: call {nr} with {arg:#x}", kind.name());
                    our_steps += steps;
                    their_steps += theirs;
                }
            }
            // Another architecture's calls are refused by both, whatever the number.
            let i386 = bpf::run(&ours, 0x4000_0003, 1, [0; 6]).0;
            assert_eq!(i386, bpf::run(&reference, 0x4000_0003, 1, [0; 6]).0);
            assert_eq!(i386, libc::SECCOMP_RET_KILL_PROCESS);
            // The point of the tree: the kernel's per-call cache walk is much shorter.
            assert!(
                our_steps * 5 < their_steps,
                "{}: {our_steps} steps against seccompiler's {their_steps}",
                kind.name()
            );
        }
    }

    #[test]
    fn the_report_line_formats_numbers() {
        let mut line = Line::default();
        line.number(135);
        line.number(-1);
        line.number(0);
        assert_eq!(&line.buf[..line.len], b"135-10");
        assert_eq!(names::name(135), Some("personality"));
    }
}
