//! Process-wide requests to stop every running VM (a signal reached kumo), and the
//! bounds a run may be given.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// 0: no request; otherwise the signal number that asked.
static REQUESTED: AtomicI32 = AtomicI32::new(0);

/// Asks every VM of this process to stop now: each running VM's coordinator is woken to
/// look at [`requested`]. The first request wins.
pub fn request(signal: i32) {
    let _ = REQUESTED.compare_exchange(0, signal.max(1), Ordering::SeqCst, Ordering::SeqCst);
    for (_, wake) in WAKES.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        wake();
    }
}

/// The signal that asked every VM to stop, if one did.
pub fn requested() -> Option<i32> {
    match REQUESTED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Wakes a running VM's coordinator (it must not block: it runs on the thread that
/// took the signal).
pub(crate) type Wake = Box<dyn Fn() + Send>;

/// The coordinators of the VMs inside `Vm::run`, by the id of their [`Running`].
static WAKES: Mutex<Vec<(u64, Wake)>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// VMs of this process inside `Vm::run` now.
pub fn running_vms() -> usize {
    RUNNING.load(Ordering::SeqCst)
}

/// Counts a VM as running while it lives, and has [`request`] wake its coordinator.
pub(crate) struct Running {
    id: u64,
}

impl Running {
    pub(crate) fn enter(wake: Wake) -> Running {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        WAKES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, wake));
        RUNNING.fetch_add(1, Ordering::SeqCst);
        Running { id }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.fetch_sub(1, Ordering::SeqCst);
        WAKES
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(id, _)| *id != self.id);
    }
}

/// Counts a wait that looks at [`requested`] itself (a node's domain waiting for its
/// VM to arrive) as a running VM while it lives: a signal then asks it to end, and the
/// node reports what ran, instead of ending the process at once.
pub struct Waiting {
    _running: Running,
}

impl Waiting {
    pub fn enter() -> Waiting {
        // It polls `requested` on its own: nothing to wake.
        Waiting {
            _running: Running::enter(Box::new(|| {})),
        }
    }
}

/// How often a running VM's coordinator looks at its vCPUs while any of them is idle
/// (the halt detector's pace: it notices a guest stopped for good within a few polls).
pub const POLL: Duration = Duration::from_millis(20);

/// The same while every look finds the guest busy. Each wake-up of the coordinator
/// preempts a vCPU when the vCPUs fill the host's CPUs, and a preempted PVM vCPU loses
/// ~40 us (a waker at 2000 Hz: guest 41 us per wake, native 23 us); at [`POLL`]'s 50 Hz
/// that is 0.2 % of a vCPU. Nothing waits on this pace: stop requests, device failures
/// and vCPU ends wake the coordinator, and a time limit is its own deadline.
pub const BUSY_POLL: Duration = Duration::from_millis(250);

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
    /// Wall time from the start of the run (or from `since`) after which kumo stops
    /// the VM.
    pub timeout: Option<Duration>,
    /// When `timeout` starts counting, if not at this VM's own start: VMs run together
    /// (a node's domains, which start one after another) share one deadline.
    pub since: Option<Instant>,
    /// CPU time a vCPU may use without progress before the VM is ended as stuck
    /// (see `watchdog`); None: no watchdog.
    pub watchdog: Option<Duration>,
}

impl RunLimits {
    /// When a run that started at `started` reaches its time limit, if it has one.
    pub fn deadline(&self, started: Instant) -> Option<Instant> {
        self.timeout
            .map(|limit| self.since.unwrap_or(started) + limit)
    }
}

/// The watchdog bound a run gets unless told otherwise.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(10);

static DEFAULT_LIMITS: Mutex<RunLimits> = Mutex::new(RunLimits {
    timeout: None,
    since: None,
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

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn a_shared_start_gives_vms_that_start_late_the_same_deadline() {
        let node_start = Instant::now();
        let limits = RunLimits {
            timeout: Some(Duration::from_secs(10)),
            since: Some(node_start),
            watchdog: None,
        };
        // The third domain starts 7 s after the node: it has 3 s left, not 10.
        let late = node_start + Duration::from_secs(7);
        assert_eq!(
            limits.deadline(late),
            Some(node_start + Duration::from_secs(10))
        );
        // Alone, a VM's limit counts from its own start; without one, no deadline.
        let alone = RunLimits {
            since: None,
            ..limits
        };
        assert_eq!(alone.deadline(late), Some(late + Duration::from_secs(10)));
        let unbounded = RunLimits {
            timeout: None,
            ..limits
        };
        assert_eq!(unbounded.deadline(late), None);
    }
}
