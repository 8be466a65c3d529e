//! What kumo's guest supervisor (ring 0) and its runtime (ring 3) agree on: where the
//! runtime image lives, what ring 3 is handed on entry, and the trap calls.
#![no_std]
#![forbid(unsafe_code)]

/// Physical (= virtual: identity map) address where the runtime image is linked and
/// loaded, as part of the supervisor's PVH ELF.
pub const USER_IMAGE_BASE: u64 = 0x100_0000;

/// First bytes of the runtime image.
#[repr(C)]
pub struct UserHeader {
    /// [`USER_MAGIC`].
    pub magic: u64,
    /// Ring-3 entry point, entered on every CPU with `rdi` = `&BootInfo`, `rsi` = CPU
    /// index, `rsp` = top of that CPU's ring-3 stack (16-byte aligned).
    pub entry: u64,
    /// End of the image including its .bss (the supervisor's ELF covers it, so the PVH
    /// loader zero-fills it).
    pub end: u64,
}

/// "KUMOUSR1", little-endian.
pub const USER_MAGIC: u64 = u64::from_le_bytes(*b"KUMOUSR1");

/// Physical address of a u64 the hypervisor keeps for the guest's clock: TSC ticks
/// during which the guest did not run although its TSC went on (a snapshot waiting on
/// disk before `kumo --restore`; on kvm_pvm the guest's TSC is the host's, and KVM's
/// TSC offset is not honoured). Ring 3's clock is the TSC minus this word; values
/// handed to the supervisor (deadlines) are raw TSC. 0 at boot; in the PVH module
/// list's page, past the entries kumo can write (docs/guest-abi.md).
pub const CLOCK_OFFSET: u64 = 0x6ff8;

/// Most CPUs the guest brings up (GDT, TSS and stacks are sized for this).
pub const MAX_CPUS: usize = 64;

/// Shared, read-only description of the machine handed to ring 3.
#[repr(C)]
pub struct BootInfo {
    /// CPUs running the runtime (the BSP is CPU 0).
    pub cpus: u32,
    pub reserved: u32,
    /// TSC ticks per millisecond.
    pub tsc_khz: u64,
    /// Address of the NUL-terminated command line, 0 if there is none.
    pub cmdline: u64,
    /// Free RAM for the workload: `[heap_start, heap_end)`.
    pub heap_start: u64,
    pub heap_end: u64,
    /// TSC at the guest's first instruction (PVH entry).
    pub entry_tsc: u64,
    /// PCI configuration space (ECAM) of segment 0, bus 0, from the ACPI MCFG; 0 if
    /// the machine has none.
    pub pci_ecam: u64,
    /// Address of the supervisor's [`IrqRecord`] array, one per device vector.
    pub irq_log: u64,
    /// Address of the supervisor's APIC ID -> CPU index table (256 bytes, 0xFF where
    /// there is no CPU), from the MADT. Ring 3 aims interrupts with it: CPUID in ring 3
    /// need not reach the hypervisor (on PVM hosts it runs natively and reports the
    /// host's APIC ID).
    pub apic_to_cpu: u64,
    /// Free RAM above 4 GiB: `[high_start, high_end)` (2 MiB-aligned), the largest
    /// such range of the memory map; both 0 if there is none. Not mapped at entry:
    /// ring 3 maps it (see [`high_tables`](Self::high_tables)) before using it.
    pub high_start: u64,
    pub high_end: u64,
    /// Zeroed, page-aligned room below `heap_end` for the page directories that map
    /// the high range with 2 MiB pages: one 4 KiB directory per GiB from
    /// `high_start` rounded down to a GiB. Ring 3 fills them and links them into
    /// [`pdpt`](Self::pdpt) (entry `i` maps `[i GiB, i + 1 GiB)`): at native speed,
    /// where ring 0 would run ~2,000 emulated instructions per GiB. 0 if no high range.
    pub high_tables: u64,
    /// The identity map's page-directory-pointer table (512 entries, writable from
    /// ring 3 like all of the guest's memory).
    pub pdpt: u64,
    /// TSC when the BSP reached long mode and the supervisor's Rust code.
    pub main_tsc: u64,
    /// TSC when the BSP, its set-up done, began to start the APs.
    pub aps_tsc: u64,
    /// The supervisor's [`ApStart`]: the BSP does not wait for the APs in ring 0;
    /// ring 3 waits on it before the workload starts.
    pub ap_start: u64,
}

/// How the APs check in: each adds one to `ready` once it is on its way to ring 3,
/// and interrupts the BSP if `bsp_waiting` is set (the BSP sleeps only after
/// spinning a while; both sides use sequentially consistent order, so an AP either
/// sees the flag or the BSP sees its count before it sleeps).
#[repr(C)]
pub struct ApStart {
    pub ready: core::sync::atomic::AtomicU32,
    pub bsp_waiting: core::sync::atomic::AtomicU32,
}

/// Page directories [`BootInfo::high_tables`] holds for a high range.
pub fn high_table_count(high_start: u64, high_end: u64) -> u64 {
    const GIB: u64 = 1 << 30;
    if high_start >= high_end {
        return 0;
    }
    high_end.div_ceil(GIB) - high_start / GIB
}

/// Interrupt vectors the supervisor hands to devices: `DEVICE_VECTOR_BASE + i` for
/// `i < DEVICE_VECTORS`. Each one's handler fills `IrqRecord` `i` and acknowledges.
/// Records 0-15 belong to the interrupt test devices (guest-abi.md), 16 and up to the
/// NICs: one per NIC, so each MPI rank of a VM waits on its own.
pub const DEVICE_VECTOR_BASE: u32 = 48;
pub const DEVICE_VECTORS: usize = 80;

/// What the supervisor records for each device interrupt it takes. Written in ring 0
/// (`tsc` and `apic_id` first, then `count` with a locked increment), read by ring 3.
#[repr(C)]
pub struct IrqRecord {
    /// Interrupts taken on this vector so far.
    pub count: u64,
    /// TSC at the handler's entry, for the latest one.
    pub tsc: u64,
    /// APIC ID of the CPU that took the latest one.
    pub apic_id: u64,
    pub reserved: u64,
}

/// Trap calls: ring 3 executes `int3` with `rdi` = call number and arguments in `rsi`,
/// `rdx`, `rcx`; the result comes back in `rax`. Every other caller-saved register
/// (SysV ABI) may be clobbered; vector registers are preserved (ring 0 never touches
/// them). `syscall` and `int 0x80` are not used: they are broken on PVM hosts.
pub mod call {
    /// `write(ptr, len)`: bytes to COM1.
    pub const WRITE: u64 = 0;
    /// `exit(status)`: debug-exit port write; does not return.
    pub const EXIT: u64 = 1;
    /// `wait(addr, expected)`: sleep until an interrupt if the u32 at `addr` still
    /// equals `expected` (checked with interrupts off). May return spuriously.
    pub const WAIT: u64 = 2;
    /// `wake()`: interrupt every other CPU (ends their `wait`).
    pub const WAKE: u64 = 3;
    /// `mark_start()`: the boot-timer port write ("workload started").
    pub const MARK_START: u64 = 4;
    /// `fault(kind)`: fault deliberately in ring 0, `kind` one of [`super::fault`].
    pub const FAULT: u64 = 5;
    /// `sleep(until_tsc)`: halt until the TSC reaches `until_tsc` (or any interrupt;
    /// may return early). Returns 0, or 1 if this machine has no TSC-deadline timer
    /// (x2APIC and CPUID.1:ECX[24] are needed): the caller must wait another way.
    pub const SLEEP: u64 = 6;
    /// `wait_until(addr, expected, until_tsc)`: as `WAIT` (sleep until an interrupt if
    /// the u32 at `addr` still equals `expected`, checked with interrupts off), but
    /// also woken at `until_tsc` by the TSC-deadline timer. Returns 0, or 1 without
    /// sleeping if this machine has no TSC-deadline timer (the caller must poll).
    /// Device drivers wait for their interrupt records with it and keep a timeout.
    pub const WAIT_UNTIL: u64 = 7;
    /// `sched_start(run_queue, hz)`: this CPU multiplexes the ring-3 tasks of the
    /// [`super::sched::RunQueue`] at `run_queue` (the caller is its task `current`),
    /// preempting every `slice` ticks of a periodic LAPIC timer at `hz` (0: no tick;
    /// tasks then switch only in [`SWITCH`]). Returns 0, or 1 if this machine cannot
    /// tick (no x2APIC, or no LAPIC timer rate in CPUID `0x40000010 EBX`).
    pub const SCHED_START: u64 = 8;
    /// `sched_stop()`: the tick off and the run queue forgotten; only the task that
    /// called [`SCHED_START`] may call it (it runs on the CPU's own kernel stack).
    pub const SCHED_STOP: u64 = 9;
    /// `switch()`: hand the CPU to the next runnable task of this CPU's run queue,
    /// round robin, the caller last (a `sched_yield`). A task whose `wait_word` is set
    /// is not runnable while it waits (see [`super::sched::Task`]); if no task is
    /// runnable, the CPU halts until an interrupt and looks again. Returns 0 once the
    /// caller is picked again. Handled in assembly (`boot.S`): never in `kumo_trap`.
    pub const SWITCH: u64 = 10;
    /// `start_aps()`: send the start-up IPI to the APs again (the BSP's ring 3 does
    /// it every 10 ms while it waits for them, as the supervisor once did).
    pub const START_APS: u64 = 11;
}

/// The supervisor's preemptive scheduler of ring-3 tasks (several MPI ranks per vCPU):
/// the run queues live in ring-3 memory, ring 3 builds the tasks, ring 0 only switches
/// (`boot.S`: the tick, [`call::SWITCH`], and device interrupts that make a waiting
/// task runnable). A task's context is its kernel stack (the 15 general registers
/// pushed below the CPU's interrupt frame, at `ksp`) and its FXSAVE area.
pub mod sched {
    /// The scheduler's tick: the LAPIC timer in periodic mode.
    pub const TICK_VECTOR: u32 = 33;
    /// Most tasks one CPU multiplexes.
    pub const MAX_TASKS: usize = 16;
    /// Order in which the supervisor pushes the general registers of a task that is
    /// switched away from (the first pushed, highest address, first); the frame at a
    /// task's `ksp` is these 15 in reverse (r15 at `ksp`), then `rip, cs, rflags, rsp, ss`.
    pub const PUSH_ORDER: [&str; 15] = [
        "rax", "rcx", "rdx", "rbx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11", "r12", "r13",
        "r14", "r15",
    ];
    /// Qwords of a switched-away task's frame at `ksp`.
    pub const FRAME_QWORDS: usize = 20;

    /// One ring-3 context of a CPU. Ring 3 writes every field but `ksp` (and ring 0
    /// writes `ksp` only of the task it switches away from, and `kstack_top` of the
    /// task calling `SCHED_START`).
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Task {
        /// Saved kernel stack pointer while the task does not run (a new task: its
        /// prebuilt frame).
        pub ksp: u64,
        /// The value for the TSS's RSP0 while it runs: 16 bytes below the top of its
        /// own kernel stack, whose top qword holds the address of the CPU's run queue.
        pub kstack_top: u64,
        /// Its 512-byte FXSAVE area (16-byte aligned).
        pub fx: u64,
        /// Waiting: while `wait_word != 0`, the u32 at `wait_word` equals `wait_value`,
        /// the u32 at `wait_word2` equals `wait_value2` and the TSC is below
        /// `wait_until`, the task is not runnable. Ring 3 sets these before `SWITCH`
        /// and clears `wait_word` after it.
        pub wait_word: u64,
        pub wait_value: u64,
        pub wait_word2: u64,
        pub wait_value2: u64,
        pub wait_until: u64,
    }

    /// One CPU's tasks (64-byte header, then the tasks; `boot.S` has the offsets).
    #[repr(C)]
    pub struct RunQueue {
        /// Index of the running task.
        pub current: u64,
        /// Tasks `0..count` exist.
        pub count: u64,
        /// Ticks per slice, and ticks left of the current one.
        pub slice: u64,
        pub left: u64,
        /// Counters: ticks taken from ring 3, switches, halts with nothing runnable.
        pub ticks: u64,
        pub switches: u64,
        pub halts: u64,
        /// Written by `SCHED_START`: the address of this CPU's TSS RSP0 field.
        pub tss_rsp0: u64,
        pub tasks: [Task; MAX_TASKS],
    }

    pub const TASK: Task = Task {
        ksp: 0,
        kstack_top: 0,
        fx: 0,
        wait_word: 0,
        wait_value: 0,
        wait_word2: 0,
        wait_value2: 0,
        wait_until: 0,
    };

    impl RunQueue {
        pub const fn new() -> RunQueue {
            RunQueue {
                current: 0,
                count: 1,
                slice: 1,
                left: 1,
                ticks: 0,
                switches: 0,
                halts: 0,
                tss_rsp0: 0,
                tasks: [TASK; MAX_TASKS],
            }
        }
    }

    impl Default for RunQueue {
        fn default() -> Self {
            Self::new()
        }
    }

    const _: () = assert!(core::mem::size_of::<Task>() == 64);
    const _: () = assert!(core::mem::offset_of!(RunQueue, tasks) == 64);
}

/// Kinds of deliberate ring-0 fault (`fault=` on the command line).
pub mod fault {
    pub const TRIPLE: u64 = 0;
    pub const UD: u64 = 1;
    pub const PAGEFAULT: u64 = 2;
}

/// kumo's interrupt test device (PCI, MSI-X): what a driver in the guest needs.
///
/// BAR 0 (memory, 32-bit, [`irq_device::BAR0_SIZE`] bytes):
/// - doorbell `i` at `i * DOORBELL_STRIDE` (a 4-byte write of any value asks the device
///   to raise MSI-X vector `i` after its configured delay; backed by an ioeventfd, so
///   the write does not wait for the VMM);
/// - the MSI-X table at [`irq_device::MSIX_TABLE`], the PBA at [`irq_device::MSIX_PBA`].
pub mod irq_device {
    /// "KU", not a PCI-SIG assigned vendor: a research device that exists only in kumo.
    pub const VENDOR_ID: u16 = 0x4b55;
    pub const DEVICE_ID: u16 = 0x0001;
    pub const DOORBELL_STRIDE: u64 = 8;
    pub const MSIX_TABLE: u64 = 0x1000;
    pub const MSIX_PBA: u64 = 0x1800;
    pub const BAR0_SIZE: u64 = 0x2000;
}

/// The limits of the runtime's `net=` workload list, which kumo checks a node file's
/// `[network] net` against before any guest runs (one line instead of an error from
/// every guest): at most [`net::MAX_ITEMS`] items joined by `+`, each `check`,
/// `pingpong:SIZES` or `bw:SIZES`, SIZES at most [`net::MAX_SIZES`] byte counts of at
/// most [`net::MAX_MESSAGE`] joined by `,`.
pub mod net {
    /// Most items in `net=`.
    pub const MAX_ITEMS: usize = 8;
    /// Most sizes in one `pingpong:` or `bw:` item.
    pub const MAX_SIZES: usize = 16;
    /// Largest message size in an item, in bytes.
    pub const MAX_MESSAGE: u64 = 64 << 20;
}

/// The switch probe's method (`probe=switch:MS` in the guest; the same on host threads
/// in `kumo bench switch`'s native twin, so the two measure alike).
pub mod switch_probe {
    /// Shorter interruptions (a host timer tick, an exit) are not descheduling.
    pub const GAP_NS: u64 = 3_000;

    /// Calls `cost` with each switch's cost, in TSC ticks, found in two spinners' gap
    /// logs (`(last seen, first seen again)`, in time order). When the host runs both
    /// spinners on one core and switches between them, a gap of A that starts at `s` is
    /// a switch to B if B was itself stopped at `s` and resumed before A did; B's
    /// resume time `r` then gives the switch's cost `r - s` (from A's last instruction
    /// to B's first, on one TSC).
    pub fn switch_costs(a: &[[u64; 2]], b: &[[u64; 2]], mut cost: impl FnMut(u64)) {
        for (mine, theirs) in [(a, b), (b, a)] {
            let mut j = 0;
            for gap in mine {
                let stop = gap[0];
                // Their gaps are in time order: find the one that spans our stop.
                while j < theirs.len() && theirs[j][1] <= stop {
                    j += 1;
                }
                // A switch: they were stopped when we stopped, and resumed before we
                // did (a short interruption of ours while they waited is no switch).
                if j < theirs.len() && theirs[j][0] <= stop && theirs[j][1] <= gap[1] {
                    cost(theirs[j][1] - stop);
                }
            }
        }
    }
}
