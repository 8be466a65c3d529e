//! The paravirtual wait page: a guest thread that must wait for a word in its memory to
//! change asks the VMM to block its vCPU thread on that word (a host futex on the
//! guest's RAM), and the thread that changes the word asks the VMM to wake the
//! waiters. Both are one MMIO write from ring 3: no guest ring-0 code runs, no
//! interrupt is injected, and a waiting vCPU leaves its host CPU to the vCPUs still
//! working. This is the cheap wake-up of oversubscribed VMs (`--vcpus` above the host's
//! cores): on kvm_pvm hosts a halt and an IPI wake-up run tens of emulated ring-0
//! instructions each (`docs/guest-abi.md`, "Paravirtual wait page").
//!
//! Registers (8-byte writes; reads return all ones):
//! - [`WAIT`]: `value = expected << 32 | address`: block while the aligned u32 at guest
//!   physical `address` equals `expected`, at most [`MAX_BLOCK`] (the guest re-checks
//!   and waits again, so a stop or a pause is never held up longer);
//! - [`PARK`]: as `WAIT`, for a vCPU with nothing to do until the word changes (a
//!   ballooned guest's parked vCPU): at most [`PARK_BLOCK`], so it costs an exit a
//!   second instead of a hundred;
//! - [`WAKE`]: `value = address`: wake every vCPU blocked on that word;
//! - [`HOST_CPUS`]: `value = address`: kumo stores the number of host CPUs the VM may
//!   use in that word now and whenever it changes ([`HostCpus`]): vCPU ballooning,
//!   where the guest runs its threads on that many vCPUs and parks the rest.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Guest-physical base of the page: above ECAM, below the I/O APIC, described to the
/// guest by `pvwait=1` on its command line.
pub const BASE: u64 = 0xe010_0000;
pub const SIZE: u64 = 0x1000;
/// Register offsets.
pub const WAIT: u64 = 0x0;
pub const WAKE: u64 = 0x8;
pub const HOST_CPUS: u64 = 0x10;
pub const PARK: u64 = 0x18;
/// Longest single `WAIT` block: the vCPU thread comes back to its loop (stop, pause,
/// park checks) at least this often, and the guest's own timeouts run.
pub const MAX_BLOCK: Duration = Duration::from_millis(10);
/// Longest single `PARK` block. A stop or a pause does not wait for it: both kick the
/// vCPU thread (a signal ends the futex wait at once) and kick again every few ms
/// until it answers, which covers a kick that lands just before the wait begins.
pub const PARK_BLOCK: Duration = Duration::from_secs(1);

/// What the page has done for a VM, for `kumo bench oversub`.
#[derive(Debug, Default)]
pub struct Counters {
    /// WAIT requests, and how many of them blocked (the word had not changed yet).
    pub waits: AtomicU64,
    pub blocks: AtomicU64,
    /// Total time vCPU threads spent blocked, in nanoseconds.
    pub blocked_ns: AtomicU64,
    /// WAKE requests, and how many blocked threads they woke.
    pub wakes: AtomicU64,
    pub woken: AtomicU64,
}

/// A copy of [`Counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub waits: u64,
    pub blocks: u64,
    pub blocked_ns: u64,
    pub wakes: u64,
    pub woken: u64,
}

impl Counters {
    pub fn snapshot(&self) -> Snapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            waits: get(&self.waits),
            blocks: get(&self.blocks),
            blocked_ns: get(&self.blocked_ns),
            wakes: get(&self.wakes),
            woken: get(&self.woken),
        }
    }
}

/// The host CPUs a VM may use, as its guest sees them: a count kumo sets (at start and
/// from `kumo ctl vcpu-balloon`) and the guest word it is kept in, once the guest has
/// named one ([`HOST_CPUS`]). 0 until kumo sets it (the guest then uses every vCPU).
#[derive(Default)]
pub struct HostCpus {
    count: AtomicU32,
    /// The guest's word: RAM (kept mapped by this clone) and its address.
    word: Mutex<Option<(GuestMemoryMmap, u64)>>,
}

impl HostCpus {
    pub fn count(&self) -> u32 {
        self.count.load(Ordering::SeqCst)
    }

    /// Sets the count and, if the guest named its word, writes it there (the guest
    /// reads it at its next barrier).
    pub fn set(&self, count: u32) {
        let guard = self.word.lock().unwrap_or_else(|e| e.into_inner());
        self.count.store(count, Ordering::SeqCst);
        if let Some(word) = guard.as_ref().and_then(|(memory, gpa)| word(memory, *gpa)) {
            word.store(count, Ordering::SeqCst);
        }
    }

    /// The guest word's address, once the guest has named one (a snapshot carries it,
    /// so that the restored VM is told of its new host's CPUs: [`HostCpus::register`]).
    pub fn word_gpa(&self) -> Option<u64> {
        let guard = self.word.lock().unwrap_or_else(|e| e.into_inner());
        guard.as_ref().map(|(_, gpa)| *gpa)
    }

    /// The guest names its word at `gpa`: the count goes there now and on every change.
    /// Ignored unless `gpa` is an aligned u32 in RAM.
    pub fn register(&self, memory: &GuestMemoryMmap, gpa: u64) {
        let Some(word) = word(memory, gpa) else {
            return;
        };
        let mut guard = self.word.lock().unwrap_or_else(|e| e.into_inner());
        word.store(self.count.load(Ordering::SeqCst), Ordering::SeqCst);
        *guard = Some((memory.clone(), gpa));
    }
}

/// Whether an MMIO access at `addr` is the page's.
pub fn claims(addr: u64) -> bool {
    (BASE..BASE + SIZE).contains(&addr)
}

/// Handles a guest write to the page. Malformed requests (a word outside RAM or
/// unaligned, a short write, an unknown register) are ignored: the guest's wait loop
/// then simply polls. While the vCPU blocks, `waiting_on` holds the word's address + 1
/// (the credit scheduler's directed-yield hint, `VcpuControl::pv_waiting_on`).
pub fn write(
    memory: &GuestMemoryMmap,
    counters: &Counters,
    waiting_on: &AtomicU64,
    host_cpus: &HostCpus,
    addr: u64,
    data: &[u8],
) {
    let Ok(bytes) = <[u8; 8]>::try_from(data) else {
        return;
    };
    let value = u64::from_le_bytes(bytes);
    if addr - BASE == HOST_CPUS {
        host_cpus.register(memory, value);
        return;
    }
    let Some(word) = word(memory, value & 0xffff_ffff) else {
        return;
    };
    let register = addr - BASE;
    match register {
        WAIT | PARK => {
            counters.waits.fetch_add(1, Ordering::Relaxed);
            let expected = (value >> 32) as u32;
            if word.load(Ordering::SeqCst) != expected {
                return;
            }
            waiting_on.store((value & 0xffff_ffff) + 1, Ordering::Release);
            counters.blocks.fetch_add(1, Ordering::Relaxed);
            let start = Instant::now();
            let limit = if register == PARK {
                PARK_BLOCK
            } else {
                MAX_BLOCK
            };
            futex_wait(word, expected, limit);
            waiting_on.store(0, Ordering::Release);
            counters
                .blocked_ns
                .fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
        WAKE => {
            counters.wakes.fetch_add(1, Ordering::Relaxed);
            let woken = futex_wake_all(word);
            counters.woken.fetch_add(woken, Ordering::Relaxed);
        }
        _ => {}
    }
}

/// The u32 at guest-physical `gpa`, if it is aligned and in RAM.
fn word(memory: &GuestMemoryMmap, gpa: u64) -> Option<&AtomicU32> {
    if !gpa.is_multiple_of(4) {
        return None;
    }
    // The whole word must lie in one region (checked by asking for its last byte).
    memory.get_host_address(GuestAddress(gpa + 3)).ok()?;
    let host = memory.get_host_address(GuestAddress(gpa)).ok()?;
    // SAFETY: `host` is the start of 4 bytes of the guest's RAM mapping (both ends
    // checked above), 4-aligned (guest RAM is mapped page-aligned and gpa is aligned),
    // and lives as long as `memory`, which the borrow ties the result to. The guest
    // writes it concurrently, which atomics allow.
    Some(unsafe { &*host.cast::<AtomicU32>() })
}

/// Blocks while `*word == expected`, at most `limit`; returns early on a wake-up, a
/// signal (the vCPU kick) or a changed word.
fn futex_wait(word: &AtomicU32, expected: u32, limit: Duration) {
    let timeout = libc::timespec {
        tv_sec: limit.as_secs() as libc::time_t,
        tv_nsec: limit.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the u32 at a valid, aligned address (see `word`) and
    // the timespec on our stack; it writes nothing. Errors (EAGAIN: the word changed,
    // EINTR: a signal, ETIMEDOUT) all mean "return to the guest".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            &timeout as *const libc::timespec,
        )
    };
}

/// Wakes every thread blocked on `word`; returns how many.
fn futex_wake_all(word: &AtomicU32) -> u64 {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    let woken = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
    woken.max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x2000)]).unwrap()
    }

    fn request(expected: u32, gpa: u64) -> [u8; 8] {
        ((u64::from(expected) << 32) | gpa).to_le_bytes()
    }

    #[test]
    fn a_changed_word_does_not_block() {
        let (memory, counters) = (memory(), Counters::default());
        word(&memory, 0x100).unwrap().store(7, Ordering::SeqCst);
        write(
            &memory,
            &counters,
            &AtomicU64::new(0),
            &HostCpus::default(),
            BASE + WAIT,
            &request(6, 0x100),
        );
        let seen = counters.snapshot();
        assert_eq!((seen.waits, seen.blocks), (1, 0));
    }

    #[test]
    fn a_waiter_blocks_until_woken() {
        let memory = memory();
        let counters = Arc::new(Counters::default());
        let waiting_on = Arc::new(AtomicU64::new(0));
        let waiter = {
            let (memory, counters, waiting_on) =
                (memory.clone(), counters.clone(), waiting_on.clone());
            std::thread::spawn(move || {
                // Wait until the word changes: each block ends at MAX_BLOCK at the
                // latest, as the guest's loop would retry.
                while word(&memory, 0x200).unwrap().load(Ordering::SeqCst) == 0 {
                    write(
                        &memory,
                        &counters,
                        &waiting_on,
                        &HostCpus::default(),
                        BASE + WAIT,
                        &request(0, 0x200),
                    );
                }
            })
        };
        // While blocked, the vCPU's slot names the word (+ 1) for the scheduler.
        let mut seen = 0;
        while seen == 0 {
            seen = waiting_on.load(Ordering::Acquire);
            std::thread::yield_now();
        }
        assert_eq!(seen, 0x201);
        word(&memory, 0x200).unwrap().store(1, Ordering::SeqCst);
        write(
            &memory,
            &counters,
            &AtomicU64::new(0),
            &HostCpus::default(),
            BASE + WAKE,
            &0x200u64.to_le_bytes(),
        );
        waiter.join().unwrap();
        assert_eq!(waiting_on.load(Ordering::Acquire), 0);
        let seen = counters.snapshot();
        assert_eq!(seen.wakes, 1);
        assert!(seen.blocks >= 1 && seen.waits >= seen.blocks, "{seen:?}");
    }

    #[test]
    fn a_parked_vcpu_outlasts_a_wait_block_and_ends_on_a_wake() {
        let memory = memory();
        let waiting_on = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let parked = {
            let (memory, waiting_on, done) = (memory.clone(), waiting_on.clone(), done.clone());
            std::thread::spawn(move || {
                // One request, no retry loop: it must not come back by itself soon.
                write(
                    &memory,
                    &Counters::default(),
                    &waiting_on,
                    &HostCpus::default(),
                    BASE + PARK,
                    &request(0, 0x300),
                );
                done.store(true, Ordering::SeqCst);
            })
        };
        while waiting_on.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        // Three WAIT blocks' worth: a WAIT would have returned by now, a PARK has not.
        std::thread::sleep(3 * MAX_BLOCK);
        assert!(
            !done.load(Ordering::SeqCst),
            "the park ended at a WAIT's limit"
        );
        word(&memory, 0x300).unwrap().store(1, Ordering::SeqCst);
        write(
            &memory,
            &Counters::default(),
            &AtomicU64::new(0),
            &HostCpus::default(),
            BASE + WAKE,
            &0x300u64.to_le_bytes(),
        );
        parked.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }

    #[test]
    fn malformed_requests_are_ignored() {
        let (memory, counters) = (memory(), Counters::default());
        // Unaligned, far outside RAM, just past its end, short, unknown register.
        let waiting_on = AtomicU64::new(0);
        for (addr, data) in [
            (BASE + WAIT, &request(0, 0x102)[..]),
            (BASE + WAIT, &request(0, 0x10_0000)[..]),
            (BASE + WAIT, &request(0, 0x2000)[..]),
            (BASE + WAIT, &[0; 4][..]),
            (BASE + 0x10, &request(0, 0x100)[..]),
        ] {
            write(
                &memory,
                &counters,
                &waiting_on,
                &HostCpus::default(),
                addr,
                data,
            );
        }
        assert_eq!(waiting_on.load(Ordering::Relaxed), 0);
        assert_eq!(counters.snapshot(), Snapshot::default());
        assert!(claims(BASE) && claims(BASE + SIZE - 1));
        assert!(!claims(BASE + SIZE) && !claims(BASE - 1));
    }

    #[test]
    fn the_host_cpu_count_reaches_the_named_word_now_and_on_change() {
        let (memory, counters, host_cpus) = (memory(), Counters::default(), HostCpus::default());
        host_cpus.set(2);
        let name = |gpa: u64| {
            let data = gpa.to_le_bytes();
            write(
                &memory,
                &counters,
                &AtomicU64::new(0),
                &host_cpus,
                BASE + HOST_CPUS,
                &data,
            );
        };
        // Unaligned and outside RAM: ignored, nothing written.
        name(0x302);
        name(0x10_0000);
        assert_eq!(word(&memory, 0x300).unwrap().load(Ordering::SeqCst), 0);
        name(0x300);
        assert_eq!(word(&memory, 0x300).unwrap().load(Ordering::SeqCst), 2);
        host_cpus.set(5);
        assert_eq!(word(&memory, 0x300).unwrap().load(Ordering::SeqCst), 5);
        assert_eq!(host_cpus.word_gpa(), Some(0x300));
        assert_eq!(host_cpus.count(), 5);
        assert_eq!(counters.snapshot(), Snapshot::default());
    }
}
