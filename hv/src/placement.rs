//! Where and when vCPU threads run: the host-side levers a scheduler pulls.
//!
//! - **Pinning**: a vCPU thread is bound to one host CPU (`sched_setaffinity`).
//! - **Ranking**: SCHED_FIFO priorities. Among the threads pinned to a CPU the kernel
//!   runs the highest-ranked runnable one, and switches at once when ranks change or a
//!   thread blocks (a vCPU halted in KVM_RUN sleeps) or wakes.
//! - **Parking**: a vCPU's gate is closed and its thread kicked out of KVM_RUN; it
//!   waits outside the guest until the gate reopens.
//!
//! `kumo bench switch` measures the cost of a switch with each (DESIGN.md asks for both
//! to be measured before one is kept).
//!
//! And sensing: whether a thread is runnable. `/proc/<tid>/stat` says so exactly, for
//! ~5 µs a read. A scheduler that asks every millisecond for ten threads spends most
//! of its run there, so threads that can say it cheaper do: a vCPU's halt in the
//! kernel is KVM's `blocking` value (`kvm_stats::InstantStat`), and a thread's own
//! sleeps in user space are a flag it sets around them (`presence::asleep`). Both
//! clear only once the thread runs again: they are exact only for a thread that runs
//! as soon as it wakes (see `VcpuControl::runnable`).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::Error;
use crate::presence::{self, Presence};

/// A vCPU thread's host scheduling class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// SCHED_OTHER: the host's fair scheduler.
    Normal,
    /// SCHED_FIFO with this priority (1..=99): runs until it blocks or a higher one
    /// becomes runnable on its CPU.
    Fifo(u8),
    /// SCHED_RR with this priority (1..=99): as `Fifo` against other priorities, but
    /// threads of the same priority on one CPU take turns (the host's RR quantum,
    /// 100 ms by default) instead of the first running until it blocks.
    RoundRobin(u8),
}

/// Whether `/proc/<tid>/stat`, open in `file`, says runnable ('R').
fn proc_runnable(file: &std::fs::File) -> Option<bool> {
    let mut buf = [0u8; 512];
    let n = std::os::unix::fs::FileExt::read_at(file, &mut buf, 0).ok()?;
    // "tid (comm) S ...": the state follows the last ')' (comm may hold any byte).
    let text = &buf[..n];
    let close = text.iter().rposition(|&b| b == b')')?;
    let state = text[close + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())?;
    Some(*state == b'R')
}

/// Whether a vCPU may enter the guest.
struct Gate {
    open: AtomicBool,
    lock: Mutex<()>,
    opened: Condvar,
}

struct Slot {
    /// Kernel thread id, 0 until the vCPU thread starts.
    tid: AtomicI32,
    gate: Gate,
    /// CPU time the thread used, recorded by the thread as it ends (u64::MAX before).
    final_cpu_ns: AtomicU64,
    /// Time the thread spent runnable but waiting for a host CPU (schedstat's
    /// run_delay), recorded as it ends.
    final_run_delay_ns: AtomicU64,
    /// Guest-physical address + 1 of the word the vCPU is blocked on through the
    /// paravirtual wait page (`pvwait`), 0 when it is not: a scheduler's hint that the
    /// vCPU waits at a barrier for its siblings.
    pv_word: AtomicU64,
    /// `/proc/self/task/<tid>/stat`, kept open: a scheduler reads it every tick, and
    /// one `pread` is much cheaper than open-read-close.
    stat: Mutex<Option<std::fs::File>>,
    /// KVM's `blocking` for this vCPU, where the kernel has it.
    halted: OnceLock<crate::kvm_stats::InstantStat>,
    /// The thread's sleeps outside the guest at its gate and in pauses (its
    /// paravirtual waits are `pv_word`).
    presence: Arc<Presence>,
}

/// Control over a VM's vCPU threads, usable from any thread while the VM runs.
pub struct VcpuControl {
    slots: Vec<Slot>,
    started: Mutex<usize>,
    all_started: Condvar,
    /// Set when the VM stops: gates no longer hold anyone.
    released: AtomicBool,
    /// The host CPUs the guest is told it may use (vCPU ballooning, `pvwait`).
    host_cpus: crate::pvwait::HostCpus,
}

impl VcpuControl {
    pub(crate) fn new(vcpus: usize) -> VcpuControl {
        VcpuControl {
            slots: (0..vcpus)
                .map(|_| Slot {
                    tid: AtomicI32::new(0),
                    final_cpu_ns: AtomicU64::new(u64::MAX),
                    final_run_delay_ns: AtomicU64::new(0),
                    pv_word: AtomicU64::new(0),
                    stat: Mutex::new(None),
                    halted: OnceLock::new(),
                    presence: Arc::default(),
                    gate: Gate {
                        open: AtomicBool::new(true),
                        lock: Mutex::new(()),
                        opened: Condvar::new(),
                    },
                })
                .collect(),
            started: Mutex::new(0),
            all_started: Condvar::new(),
            released: AtomicBool::new(false),
            host_cpus: crate::pvwait::HostCpus::default(),
        }
    }

    pub fn vcpus(&self) -> usize {
        self.slots.len()
    }

    /// Waits until every vCPU thread has started (false on timeout).
    pub fn wait_started(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        while *started < self.slots.len() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            started = self
                .all_started
                .wait_timeout(started, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    fn tid(&self, vcpu: usize) -> Result<libc::pid_t, Error> {
        match self.slots.get(vcpu).map(|s| s.tid.load(Ordering::Acquire)) {
            Some(tid) if tid > 0 => Ok(tid),
            _ => Err(Error::VcpuThread {
                index: vcpu as u32,
                why: "no such vCPU thread (not started yet, or out of range)".into(),
            }),
        }
    }

    /// Binds vCPU `vcpu`'s thread to host CPU `cpu`.
    pub fn pin(&self, vcpu: usize, cpu: usize) -> Result<(), Error> {
        self.confine(vcpu, &[cpu])
    }

    /// Lets vCPU `vcpu`'s thread run on any of `cpus` (and nowhere else).
    pub fn confine(&self, vcpu: usize, cpus: &[usize]) -> Result<(), Error> {
        let tid = self.tid(vcpu)?;
        confine_thread(tid, cpus)
    }

    /// Sets vCPU `vcpu`'s host scheduling class.
    pub fn set_policy(&self, vcpu: usize, policy: Policy) -> Result<(), Error> {
        set_policy(self.tid(vcpu)?, policy)
    }

    /// Keeps vCPU `vcpu` out of the guest: closes its gate and kicks it out of KVM_RUN.
    pub fn park(&self, vcpu: usize) -> Result<(), Error> {
        let tid = self.tid(vcpu)?;
        self.slots[vcpu].gate.open.store(false, Ordering::SeqCst);
        kick(tid)
    }

    /// Kicks vCPU `vcpu`'s thread out of KVM_RUN (its gate stays as it is).
    pub(crate) fn kick_vcpu(&self, vcpu: usize) -> Result<(), Error> {
        kick(self.tid(vcpu)?)
    }

    /// Lets vCPU `vcpu` enter the guest again.
    pub fn unpark(&self, vcpu: usize) {
        if let Some(slot) = self.slots.get(vcpu) {
            let _guard = slot.gate.lock.lock().unwrap_or_else(|e| e.into_inner());
            slot.gate.open.store(true, Ordering::SeqCst);
            slot.gate.opened.notify_all();
        }
    }

    /// Host CPU time vCPU `vcpu`'s thread has used (running the guest and handling its
    /// exits); `None` before it starts.
    pub fn cpu_time(&self, vcpu: usize) -> Option<Duration> {
        let slot = self.slots.get(vcpu)?;
        let done = slot.final_cpu_ns.load(Ordering::Acquire);
        if done != u64::MAX {
            return Some(Duration::from_nanos(done));
        }
        let tid = slot.tid.load(Ordering::Acquire);
        if tid <= 0 {
            return None;
        }
        cpu_time_of(tid)
    }

    /// Whether vCPU `vcpu`'s thread is runnable (`Some(true)`: running or waiting for a
    /// host CPU) or asleep (`Some(false)`: halted in KVM_RUN, waiting for SIPI, or parked
    /// at its gate); `None` if it has not started or has ended.
    ///
    /// `wakes_run_at_once`: the caller knows that this thread, when it wakes, runs
    /// within microseconds (it ranks above every thread on its CPU but the caller).
    /// Then KVM's `blocking` and the thread's own word answer (an atomic load and one
    /// 8-byte `pread`). They still say asleep for a thread that woke and waits for a
    /// CPU, which only such a thread does not do for long; without that knowledge the
    /// answer comes from `/proc`, exact for every thread.
    pub fn runnable(&self, vcpu: usize, wakes_run_at_once: bool) -> Option<bool> {
        let slot = self.slots.get(vcpu)?;
        if slot.final_cpu_ns.load(Ordering::Acquire) != u64::MAX {
            return None;
        }
        let tid = slot.tid.load(Ordering::Acquire);
        if tid <= 0 {
            return None;
        }
        if wakes_run_at_once && let Some(halted) = slot.halted.get() {
            // Blocked on the paravirtual wait page (`pv_word`, set around its futex
            // wait), or in another wait it reports (the gate, a pause).
            if slot.pv_word.load(Ordering::Acquire) != 0 || slot.presence.reported_asleep() {
                return Some(false);
            }
            if let Ok(blocking) = halted.read() {
                return Some(blocking == 0);
            }
        }
        let mut file = slot.stat.lock().unwrap_or_else(|e| e.into_inner());
        if file.is_none() {
            *file = std::fs::File::open(format!("/proc/self/task/{tid}/stat")).ok();
        }
        proc_runnable(file.as_ref()?)
    }

    /// Whether vCPU `vcpu`'s thread has ended (the VM stopped).
    pub fn has_ended(&self, vcpu: usize) -> bool {
        self.slots
            .get(vcpu)
            .is_some_and(|s| s.final_cpu_ns.load(Ordering::Acquire) != u64::MAX)
    }

    /// The guest-physical word vCPU `vcpu` is blocked on in the paravirtual wait page
    /// (a barrier's generation: its siblings that are not blocked on it are the ones
    /// it waits for), `None` when it is not blocked there.
    pub fn pv_waiting_on(&self, vcpu: usize) -> Option<u64> {
        let word = self.slots.get(vcpu)?.pv_word.load(Ordering::Acquire);
        word.checked_sub(1)
    }

    /// Where vCPU `vcpu`'s thread records the word it blocks on (see
    /// [`Self::pv_waiting_on`]).
    /// The host CPU count the guest sees (`kumo --vcpu-balloon`, `kumo ctl vcpu-balloon`).
    pub fn host_cpus(&self) -> &crate::pvwait::HostCpus {
        &self.host_cpus
    }

    pub(crate) fn pv_word(&self, vcpu: usize) -> &AtomicU64 {
        &self.slots[vcpu].pv_word
    }

    /// Whether vCPU `vcpu` is held at its gate (parked).
    pub fn is_parked(&self, vcpu: usize) -> bool {
        self.slots
            .get(vcpu)
            .is_some_and(|s| !s.gate.open.load(Ordering::Acquire))
    }

    /// Called by vCPU thread `vcpu` as it ends: keeps its CPU time (and how long it
    /// waited for a CPU) after it is gone.
    pub(crate) fn record_final_cpu_time(&self, vcpu: usize) {
        let slot = &self.slots[vcpu];
        let delay = std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|text| text.split_ascii_whitespace().nth(1)?.parse().ok())
            .unwrap_or(0);
        slot.final_run_delay_ns.store(delay, Ordering::Relaxed);
        slot.final_cpu_ns
            .store(thread_cpu_time().as_nanos() as u64, Ordering::Release);
    }

    /// How long vCPU `vcpu`'s thread was runnable but waited for a host CPU, over its
    /// whole life; known once it has ended (zero before, or where the host keeps no
    /// schedstat).
    pub fn run_delay(&self, vcpu: usize) -> Duration {
        self.slots.get(vcpu).map_or(Duration::ZERO, |s| {
            Duration::from_nanos(s.final_run_delay_ns.load(Ordering::Relaxed))
        })
    }

    /// Called by vCPU thread `vcpu` when it starts, with KVM's `blocking` value for it
    /// where the kernel has one.
    pub(crate) fn register(&self, vcpu: usize, halted: Option<crate::kvm_stats::InstantStat>) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let slot = &self.slots[vcpu];
        if let Some(halted) = halted {
            let _ = slot.halted.set(halted);
        }
        presence::sense_current_thread(Some(slot.presence.clone()));
        slot.tid.store(tid, Ordering::Release);
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        *started += 1;
        self.all_started.notify_all();
    }

    /// Called by vCPU thread `vcpu` before each KVM_RUN: returns at once if its gate
    /// is open (one atomic load), else waits until it opens, the VM stops, or
    /// `called_away` holds (checked whenever [`Self::call_away`] wakes the gates): a
    /// parked vCPU is outside the guest already, and a pause for a migration must not
    /// wait for the scheduler to let it back in (on a capped host that took up to 1 s).
    pub(crate) fn pass(&self, vcpu: usize, called_away: impl Fn() -> bool) {
        let gate = &self.slots[vcpu].gate;
        if gate.open.load(Ordering::Acquire) {
            return;
        }
        let mut guard = gate.lock.lock().unwrap_or_else(|e| e.into_inner());
        while !gate.open.load(Ordering::Acquire)
            && !self.released.load(Ordering::Acquire)
            && !called_away()
        {
            guard = presence::asleep(|| gate.opened.wait(guard)).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Wakes every vCPU held at its gate to look at its `called_away` condition (set
    /// it first); the gates stay closed.
    pub(crate) fn call_away(&self) {
        for slot in &self.slots {
            let _guard = slot.gate.lock.lock().unwrap_or_else(|e| e.into_inner());
            slot.gate.opened.notify_all();
        }
    }

    /// The VM is stopping: no gate holds a thread any more.
    pub(crate) fn release_all(&self) {
        self.released.store(true, Ordering::SeqCst);
        for slot in &self.slots {
            let _guard = slot.gate.lock.lock().unwrap_or_else(|e| e.into_inner());
            slot.gate.opened.notify_all();
        }
    }
}

/// How many host CPUs this process may use: the main thread's affinity, read once
/// (a program calls it before it pins any thread; kumo's main does).
/// (std's `available_parallelism` reads the cgroup CPU quota too, each time: opening
/// `/proc/self/cgroup` took ~3 ms here, half of a VM's boot.)
pub fn host_cpus() -> usize {
    static HOST_CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *HOST_CPUS.get_or_init(|| process_cpus().len().max(1))
}

/// Host CPUs the process may use (the main thread's affinity).
pub fn process_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set to fill.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; getpid has no
    // preconditions.
    let rc =
        unsafe { libc::sched_getaffinity(libc::getpid(), std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    }
    // SAFETY: CPU_ISSET reads inside `set` for every index below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Returns the calling thread to ordinary scheduling on every CPU of the process.
pub fn release_current_thread() {
    let _ = set_policy(0, Policy::Normal);
    let _ = confine_thread(0, &process_cpus());
}

/// The calling thread's CPU time.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Spins until this thread has run for `cpu` more of its own CPU time: work that is
/// preempted half way is still owed when the thread runs again, as a real copy's
/// would be (a spin on the wall clock would count the time others ran as done).
pub fn spin_cpu(cpu: Duration) {
    let until = thread_cpu_time() + cpu;
    while thread_cpu_time() < until {
        std::hint::spin_loop();
    }
}

/// CPU time of this process's thread `tid` so far (`None` once it has ended).
pub fn cpu_time_of(tid: libc::pid_t) -> Option<Duration> {
    // The first field of schedstat: nanoseconds on a CPU.
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let ns = text.split_ascii_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Binds thread `tid` (0 = the caller) to host CPU `cpu`.
pub fn pin_thread(tid: libc::pid_t, cpu: usize) -> Result<(), Error> {
    confine_thread(tid, &[cpu])
}

/// Lets thread `tid` (0 = the caller) run on any of `cpus` and nowhere else.
pub fn confine_thread(tid: libc::pid_t, cpus: &[usize]) -> Result<(), Error> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(Error::Os {
                what: "pinning a thread (CPU number out of range)",
                source: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        // SAFETY: `cpu` < CPU_SETSIZE (checked above).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(Error::Os {
            what: "pinning a thread to a host CPU (sched_setaffinity)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Sets thread `tid`'s (0 = the caller's) scheduling class.
pub fn set_policy(tid: libc::pid_t, policy: Policy) -> Result<(), Error> {
    // Threads the ranked thread spawns (a VM's vCPU threads, spawned by its
    // coordinator) must not inherit the rank: SCHED_RESET_ON_FORK.
    let (class, priority) = match policy {
        Policy::Normal => (libc::SCHED_OTHER, 0),
        Policy::Fifo(p) => (
            libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK,
            i32::from(p.clamp(1, 99)),
        ),
        Policy::RoundRobin(p) => (
            libc::SCHED_RR | libc::SCHED_RESET_ON_FORK,
            i32::from(p.clamp(1, 99)),
        ),
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param for the call's duration.
    let rc = unsafe { libc::sched_setscheduler(tid, class, &param) };
    if rc != 0 {
        return Err(Error::Os {
            what: "setting a thread's scheduling policy (sched_setscheduler; SCHED_FIFO needs root or CAP_SYS_NICE)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn kick(tid: libc::pid_t) -> Result<(), Error> {
    // SAFETY: tgkill with our own pid and a thread id of ours; the signal's handler is
    // installed before any vCPU thread starts.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            libc::getpid(),
            tid,
            crate::kick::kick_signal(),
        )
    };
    if rc != 0 {
        return Err(Error::Os {
            what: "kicking a vCPU thread (tgkill)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// A set of host threads scheduled as one unit: domain 0, the VMM's own backend
/// threads (event loops, device emulation, the control socket). A thread joins with
/// [`ThreadGroup::join_current`] and leaves when the returned guard drops.
#[derive(Default)]
pub struct ThreadGroup {
    members: Mutex<Vec<Member>>,
    /// CPU time of members that have left.
    departed_ns: AtomicU64,
    /// Bumped when a thread joins, so a placer knows to place the newcomer.
    joins: AtomicU64,
    /// Bumped by members each time they wake to do work ([`Membership::note_activity`]).
    activity: AtomicU64,
    /// A thread (the credit driver) sleeping until the group's next activity: the
    /// first member to wake unparks it ([`ThreadGroup::watch`]).
    watched: AtomicBool,
    watcher: Mutex<Option<std::thread::Thread>>,
}

struct Member {
    tid: libc::pid_t,
    stat: Option<std::fs::File>,
    presence: Arc<Presence>,
}

/// Membership of the calling thread in a [`ThreadGroup`]; dropping it (on the same
/// thread) records the thread's CPU time and leaves.
pub struct Membership {
    group: std::sync::Arc<ThreadGroup>,
    tid: libc::pid_t,
}

impl Membership {
    /// Says that the calling member woke to do work: one atomic add, and one unpark
    /// when a watcher sleeps on the group.
    pub fn note_activity(&self) {
        self.group.note_activity();
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.group
            .departed_ns
            .fetch_add(thread_cpu_time().as_nanos() as u64, Ordering::Relaxed);
        let mut members = self.group.members.lock().unwrap_or_else(|e| e.into_inner());
        members.retain(|m| m.tid != self.tid);
        presence::sense_current_thread(None);
    }
}

impl ThreadGroup {
    pub fn new() -> std::sync::Arc<ThreadGroup> {
        std::sync::Arc::new(ThreadGroup::default())
    }

    /// Adds the calling thread; it stays a member while the guard lives.
    pub fn join_current(self: &std::sync::Arc<Self>) -> Membership {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let stat = std::fs::File::open(format!("/proc/self/task/{tid}/stat")).ok();
        let presence = Arc::new(Presence::default());
        presence::sense_current_thread(Some(presence.clone()));
        self.members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Member {
                tid,
                stat,
                presence,
            });
        self.joins.fetch_add(1, Ordering::Release);
        Membership {
            group: self.clone(),
            tid,
        }
    }

    /// How many threads have ever joined.
    pub fn joins(&self) -> u64 {
        self.joins.load(Ordering::Acquire)
    }

    /// How many times members woke to do work (those that say so).
    pub fn activity(&self) -> u64 {
        self.activity.load(Ordering::SeqCst)
    }

    fn note_activity(&self) {
        // SeqCst on both sides (here: add, then load; in `watch`: store, then load):
        // either the watcher sees this activity before it sleeps, or this sees the
        // watch and unparks it.
        self.activity.fetch_add(1, Ordering::SeqCst);
        if self.watched.load(Ordering::SeqCst) && self.watched.swap(false, Ordering::SeqCst) {
            let watcher = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(thread) = watcher.as_ref() {
                thread.unpark();
            }
        }
    }

    /// Arms a wake-up of the calling thread at the group's next activity. Returns
    /// `false`, without arming, when there was activity since `seen` (the value of
    /// [`ThreadGroup::activity`] the caller last looked at): then it must not sleep.
    /// The caller sleeps with `std::thread::park_timeout` and disarms with
    /// [`ThreadGroup::unwatch`] when it wakes.
    pub fn watch(&self, seen: u64) -> bool {
        {
            let mut watcher = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
            if watcher.as_ref().map(|t| t.id()) != Some(std::thread::current().id()) {
                *watcher = Some(std::thread::current());
            }
        }
        self.watched.store(true, Ordering::SeqCst);
        if self.activity.load(Ordering::SeqCst) != seen {
            self.watched.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    pub fn unwatch(&self) {
        self.watched.store(false, Ordering::SeqCst);
    }

    /// Runs `f` on every member's thread id, under the members' lock and without
    /// allocating (the credit driver calls this on its loop: see `credit::drive`).
    fn try_each_tid(
        &self,
        mut f: impl FnMut(libc::pid_t) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        members.iter().try_for_each(|m| f(m.tid))
    }

    /// Whether any member is runnable; `None` when the group has no members.
    /// `wakes_run_at_once` as for [`VcpuControl::runnable`]: then the members that
    /// report their sleeps (`presence::asleep`) answer for themselves, and only the others
    /// are read from `/proc`.
    pub fn runnable(&self, wakes_run_at_once: bool) -> Option<bool> {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        if members.is_empty() {
            return None;
        }
        let from_proc = |m: &Member| m.stat.as_ref().and_then(proc_runnable) == Some(true);
        if !wakes_run_at_once {
            return Some(members.iter().any(from_proc));
        }
        if members.iter().any(|m| m.presence.reported_awake()) {
            return Some(true);
        }
        Some(
            members
                .iter()
                .filter(|m| !m.presence.reports.load(Ordering::Acquire))
                .any(from_proc),
        )
    }

    /// Binds every member to `cpus`.
    pub fn confine(&self, cpus: &[usize]) -> Result<(), Error> {
        self.try_each_tid(|tid| confine_thread(tid, cpus))
    }

    /// Sets every member's scheduling class.
    pub fn set_policy(&self, policy: Policy) -> Result<(), Error> {
        self.try_each_tid(|tid| set_policy(tid, policy))
    }

    /// CPU time of the members, present and past.
    pub fn cpu_time(&self) -> Duration {
        let mut live = 0;
        let _ = self.try_each_tid(|tid| {
            live += cpu_time_of(tid).map_or(0, |t| t.as_nanos() as u64);
            Ok(())
        });
        Duration::from_nanos(live + self.departed_ns.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presence::set_asleep;
    use std::sync::atomic::AtomicU32;

    /// Spins until `step` reaches `until`.
    fn spin_until(step: &AtomicU32, until: u32) {
        while step.load(Ordering::Acquire) < until {
            std::hint::spin_loop();
        }
    }

    /// Waits until `step` reaches `at`.
    fn wait_for(step: &AtomicU32, at: u32) {
        while step.load(Ordering::Acquire) < at {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A thread that joins `group`, then runs `body` with `step`.
    fn member(
        group: &Arc<ThreadGroup>,
        step: &Arc<AtomicU32>,
        body: impl FnOnce(&AtomicU32) + Send + 'static,
    ) -> std::thread::JoinHandle<()> {
        let (group, step) = (group.clone(), step.clone());
        std::thread::spawn(move || {
            let _member = group.join_current();
            body(&step);
        })
    }

    /// `spin_cpu` burns its CPU time even when another thread shares its CPU: it
    /// then takes longer on the wall clock, not less CPU.
    #[test]
    fn spinning_cpu_time_is_owed_through_preemption() {
        let cpu = [0];
        let done = Arc::new(AtomicU32::new(0));
        let rival = {
            let done = done.clone();
            std::thread::spawn(move || {
                confine_thread(0, &cpu).unwrap();
                spin_until(&done, 1);
            })
        };
        let spinner = std::thread::spawn(move || {
            confine_thread(0, &cpu).unwrap();
            let (start, wall) = (thread_cpu_time(), std::time::Instant::now());
            spin_cpu(Duration::from_millis(40));
            (thread_cpu_time() - start, wall.elapsed())
        });
        let (used, wall) = spinner.join().unwrap();
        done.store(1, Ordering::Release);
        rival.join().unwrap();
        assert!(used >= Duration::from_millis(40), "{used:?} of CPU");
        assert!(
            wall >= used,
            "{wall:?} on the wall clock for {used:?} of CPU"
        );
    }

    /// A member that reports its sleeps is taken at its word when its wake-ups run at
    /// once, and `/proc` answers otherwise: a member that says it sleeps while it
    /// spins shows which look was taken. A member that never reported is read from
    /// `/proc` either way.
    #[test]
    fn a_member_that_reports_its_sleeps_answers_for_itself() {
        let group = ThreadGroup::new();
        let step = Arc::new(AtomicU32::new(0));
        let reporter = member(&group, &step, |step| {
            set_asleep(true);
            step.store(1, Ordering::Release);
            spin_until(step, 2);
            set_asleep(false);
            step.store(3, Ordering::Release);
            spin_until(step, 4);
        });
        wait_for(&step, 1);
        assert_eq!(group.runnable(true), Some(false), "its word: asleep");
        assert_eq!(group.runnable(false), Some(true), "/proc: it spins");
        step.store(2, Ordering::Release);
        wait_for(&step, 3);
        assert_eq!(group.runnable(true), Some(true), "its word: awake");
        step.store(4, Ordering::Release);
        reporter.join().unwrap();
        assert_eq!(group.runnable(true), None, "it left");

        let silent = ThreadGroup::new();
        let done = Arc::new(AtomicU32::new(0));
        let spinner = member(&silent, &done, |done| {
            done.store(1, Ordering::Release);
            spin_until(done, 2);
        });
        wait_for(&done, 1);
        assert_eq!(silent.runnable(true), Some(true), "never reported: /proc");
        done.store(2, Ordering::Release);
        spinner.join().unwrap();
    }
}
