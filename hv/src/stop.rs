//! Process-wide requests to stop every running VM (a signal reached kumo), and the
//! bounds a run may be given.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::Duration;

/// 0: no request; otherwise the signal number that asked.
static REQUESTED: AtomicI32 = AtomicI32::new(0);

/// Asks every VM of this process to stop soon (each run's coordinator polls this).
/// The first request wins.
pub fn request(signal: i32) {
    let _ = REQUESTED.compare_exchange(0, signal.max(1), Ordering::SeqCst, Ordering::SeqCst);
}

/// The signal that asked every VM to stop, if one did.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// VMs of this process inside `Vm::run` now.
pub fn running_vms() -> usize {
    RUNNING.load(Ordering::SeqCst)
}

/// Counts a VM as running while it lives.
pub(crate) struct Running(());

impl Running {
    pub(crate) fn enter() -> Running {
        RUNNING.fetch_add(1, Ordering::SeqCst);
        Running(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How often a running VM's coordinator looks at [`requested`]: the bound on how late
/// a stop request is seen.
pub const POLL: Duration = Duration::from_millis(20);

/// Why kumo stopped a VM before the guest ended it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    /// The run reached its time limit.
    Timeout(Duration),
    /// A signal asked kumo to stop (SIGINT, SIGTERM, SIGHUP).
    Signal(i32),
}

impl std::fmt::Display for StopCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StopCause::Timeout(limit) => {
                write!(
                    f,
                    "the run reached its time limit of {:.3} s",
                    limit.as_secs_f64()
                )
            }
            StopCause::Signal(signal) => write!(f, "stopped by {}", signal_name(*signal)),
        }
    }
}

pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        n => format!("signal {n}"),
    }
}

/// Bounds on one run of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// Wall time from the start of the run after which kumo stops the VM.
    pub timeout: Option<Duration>,
    /// CPU time a vCPU may use without progress before the VM is ended as stuck
    /// (see `watchdog`); None: no watchdog.
    pub watchdog: Option<Duration>,
}

/// The watchdog bound a run gets unless told otherwise.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(10);

static DEFAULT_LIMITS: Mutex<RunLimits> = Mutex::new(RunLimits {
    timeout: None,
    watchdog: Some(DEFAULT_WATCHDOG),
});

/// Sets the limits every VM this process creates from now on starts with (the command
/// line's `--timeout` and `--watchdog` apply to every VM of a run).
pub fn set_default_limits(limits: RunLimits) {
    *DEFAULT_LIMITS.lock().unwrap_or_else(|e| e.into_inner()) = limits;
}

/// The limits a new VM starts with.
pub fn default_limits() -> RunLimits {
    *DEFAULT_LIMITS.lock().unwrap_or_else(|e| e.into_inner())
}
