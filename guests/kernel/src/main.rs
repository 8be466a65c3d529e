//! kumo's guest supervisor (ring 0).
//!
//! On PVM hosts every ring-0 instruction goes through KVM's emulator (~1 µs each) and
//! SSE/x87 cannot run there at all, so this is a tiny integer-only program (soft-float
//! target) whose job is to get every CPU into ring 3 quickly and then stay out of the
//! way: descriptor and page tables are prebuilt data (boot.S), nothing is zeroed or
//! copied except the 40-byte AP trampoline, and nothing is printed before the workload
//! starts. Ring 3 (the runtime image embedded at `USER_IMAGE_BASE`) parses the command
//! line, runs the benchmarks and formats all output.
#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::cell::UnsafeCell;
use core::ptr::{read_unaligned, read_volatile, write_volatile};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use kumo_abi::{
    ApStart, BootInfo, MAX_CPUS, USER_IMAGE_BASE, USER_MAGIC, UserHeader, call, fault,
    high_table_count,
};

global_asm!(include_str!("boot.S"), options(att_syntax));
global_asm!(
    concat!(
        ".section .user_image, \"a\"\n.incbin \"",
        env!("KUMO_USER_BIN"),
        "\"\n"
    ),
    options(att_syntax)
);

unsafe extern "C" {
    /// APIC ID -> CPU index, 0xFF where there is no CPU (boot.S; read by APs in asm).
    static mut apic_to_cpu: [u8; 256];
    /// Nonzero when the local APICs are driven as x2APIC (MSRs), else xAPIC (MMIO).
    static mut x2apic_mode: u8;
    static entry_tsc: u64;
    /// One `IrqRecord` per device vector (boot.S).
    static irq_log: u8;
    static ap_trampoline_start: u8;
    static ap_trampoline_end: u8;
    /// End of the runtime image including its .bss (kernel.ld).
    static user_image_end: u8;
    /// The identity map's page-directory-pointer table (boot.S): entry `i` maps
    /// `[i GiB, i + 1 GiB)`; entries 0-3 point to 2 MiB page directories.
    static pdpt: [u64; 512];
    /// The CPUs' kernel stacks, `KSTACK_SIZE` each (boot.S).
    static kstacks: u8;
}

const START_INFO_MAGIC: u32 = 0x336e_c578;
/// Real-mode trampoline for APs (guest-abi.md reserves this page); SIPI vector 0x08.
const AP_TRAMPOLINE: u64 = 0x8000;
const SEL_USER_DATA: u64 = 0x23;
const SEL_USER_CODE: u64 = 0x2B;
const SEL_TSS0: u16 = 0x30;
const WAKE_VECTOR: u32 = 32;
const SPURIOUS_VECTOR: u32 = 47;
const USER_STACK_SIZE: u64 = 256 << 10;
/// Each CPU's kernel stack (boot.S's KSTACK_SIZE) and TSS (TSS_BASE, TSS_SIZE).
const KSTACK_SIZE: u64 = 16384;
const TSS_BASE: u64 = 0x10_1000;
const TSS_SIZE: u64 = 128;
/// boot.S's identity map ends here; ring 3 maps RAM above it (`BootInfo::high_tables`).
const MAPPED_END: u64 = 4 << 30;
/// The PDPT maps at most this much (one PML4 entry); nothing is ever mapped above.
const PDPT_END: u64 = 512 << 30;

const COM1: u16 = 0x3F8;
const DEBUG_EXIT_PORT: u16 = 0xF4;
const BOOT_TIMER_PORT: u16 = 0x80;
const XAPIC_BASE: u64 = 0xFEE0_0000;

/// ICR values: bits 7:0 vector, 10:8 delivery mode, 14 assert, 19:18 = 11 (all
/// excluding self).
const ICR_ALL_BUT_SELF: u32 = (3 << 18) | (1 << 14);
const ICR_INIT: u32 = ICR_ALL_BUT_SELF | (5 << 8);
const ICR_STARTUP: u32 = ICR_ALL_BUT_SELF | (6 << 8) | (AP_TRAMPOLINE >> 12) as u32;
const ICR_WAKE: u32 = ICR_ALL_BUT_SELF | WAKE_VECTOR;
/// A fixed IPI with WAKE_VECTOR to the destination in the ICR's high half.
const ICR_WAKE_ONE: u32 = (1 << 14) | WAKE_VECTOR;
/// x2APIC LVT timer in TSC-deadline mode, delivering WAKE_VECTOR.
const LVT_TSC_DEADLINE: u64 = (2 << 17) | WAKE_VECTOR as u64;
const MSR_TSC_DEADLINE: u32 = 0x6E0;
/// x2APIC timer registers: LVT timer, initial count, divide configuration.
const MSR_LVT_TIMER: u32 = 0x832;
const MSR_TIMER_INITIAL: u32 = 0x838;
const MSR_TIMER_DIVIDE: u32 = 0x83E;
/// LVT timer: periodic mode, mask bit.
const LVT_PERIODIC: u64 = 1 << 17;
const LVT_MASKED: u64 = 1 << 16;

/// Data written once by the BSP before any AP starts, read-only afterwards.
struct BspWritten<T>(UnsafeCell<T>);
// SAFETY: written only by the BSP before the APs are started (the SIPI orders it
// before every AP's reads); only read afterwards.
unsafe impl<T> Sync for BspWritten<T> {}

static BOOT_INFO: BspWritten<BootInfo> = BspWritten(UnsafeCell::new(BootInfo {
    cpus: 1,
    reserved: 0,
    tsc_khz: 0,
    cmdline: 0,
    heap_start: 0,
    heap_end: 0,
    entry_tsc: 0,
    pci_ecam: 0,
    irq_log: 0,
    apic_to_cpu: 0,
    high_start: 0,
    high_end: 0,
    high_tables: 0,
    pdpt: 0,
    main_tsc: 0,
    aps_tsc: 0,
    ap_start: 0,
}));
/// Ring-3 stacks: `USER_STACK_SIZE` per CPU from here.
static USER_STACKS: BspWritten<u64> = BspWritten(UnsafeCell::new(0));
/// The LAPIC timer's rate (CPUID 0x40000010 EBX), 0 if the hypervisor does not say.
static APIC_TIMER_KHZ: BspWritten<u64> = BspWritten(UnsafeCell::new(0));
/// The BSP's APIC ID: APs interrupt it when they check in.
static BSP_APIC_ID: BspWritten<u32> = BspWritten(UnsafeCell::new(0));
static AP_START: ApStart = ApStart {
    ready: AtomicU32::new(0),
    bsp_waiting: AtomicU32::new(0),
};
/// x2APIC with a TSC-deadline timer: `call::SLEEP` can arm it.
static TSC_DEADLINE: AtomicBool = AtomicBool::new(false);
static SERIAL_LOCK: AtomicBool = AtomicBool::new(false);

// ---------------------------------------------------------------------------------------
// Entry points (called from boot.S).

/// The BSP in long mode on CPU 0's stack; `start_info` is the PVH `hvm_start_info`.
#[unsafe(no_mangle)]
extern "C" fn bsp_main(start_info: u32) -> ! {
    let main_tsc = rdtsc();
    let si = u64::from(start_info);
    let leaf1 = cpuid(1, 0);
    let x2apic = leaf1[2] & (1 << 21) != 0;
    // SAFETY: single-threaded here; boot.S's APs and traps read it only later.
    unsafe { write_volatile(&raw mut x2apic_mode, u8::from(x2apic)) };
    apic_enable(true);
    load_task_register(0);
    if start_info == 0 || read32(si) != START_INFO_MAGIC {
        boot_failure("bad-start-info");
    }
    // SAFETY: the header is part of our own image, loaded by the PVH loader.
    let header = unsafe { read_volatile(USER_IMAGE_BASE as *const UserHeader) };
    if header.magic != USER_MAGIC {
        boot_failure("no-runtime-image");
    }
    let hypervisor = leaf1[2] & (1 << 31) != 0;
    let (tsc_khz, apic_timer_khz) = tsc_khz(hypervisor);
    let bsp_apic_id = leaf1[1] >> 24;
    let cpus = discover_cpus(si, bsp_apic_id as u8);
    let (stacks, heap_start, heap_end) = memory_layout(si, cpus);
    let (high_start, high_end) = high_memory(si);
    // The page directories for the high range come off the top of the low heap.
    let high_tables = (heap_end - 4096 * high_table_count(high_start, high_end)) & !0xFFF;
    if high_tables <= heap_start && high_end > high_start {
        boot_failure("out-of-memory");
    }

    // SAFETY: BSP-only, before the APs start (see `BspWritten`).
    unsafe {
        *USER_STACKS.0.get() = stacks;
        *APIC_TIMER_KHZ.0.get() = apic_timer_khz;
        *BSP_APIC_ID.0.get() = bsp_apic_id;
        let info = &mut *BOOT_INFO.0.get();
        info.cpus = cpus;
        info.tsc_khz = tsc_khz;
        info.cmdline = read64(si + 24);
        info.heap_start = heap_start;
        info.heap_end = if high_end > high_start {
            high_tables
        } else {
            heap_end
        };
        info.high_start = high_start;
        info.high_end = high_end;
        info.high_tables = if high_end > high_start {
            high_tables
        } else {
            0
        };
        info.pdpt = &raw const pdpt as u64;
        info.entry_tsc = read_volatile(&raw const entry_tsc);
        info.pci_ecam = pci_ecam(si);
        info.irq_log = &raw const irq_log as u64;
        info.apic_to_cpu = &raw const apic_to_cpu as u64;
        info.ap_start = &raw const AP_START as u64;
    }
    serial_init();
    // With a TSC-deadline timer ring 3 can sleep (while the APs start, or in
    // `call::SLEEP`) and still time out.
    let tsc_deadline = x2apic && leaf1[2] & (1 << 24) != 0;
    TSC_DEADLINE.store(tsc_deadline, Ordering::Relaxed);
    // SAFETY: BSP-only, before the APs start (see `BspWritten`).
    unsafe {
        let info = &mut *BOOT_INFO.0.get();
        info.main_tsc = main_tsc;
        info.aps_tsc = rdtsc();
    }
    start_aps(cpus);
    enter_user(0, header.entry)
}

/// An AP in long mode on its own kernel stack (`cpu` from the APIC ID table).
#[unsafe(no_mangle)]
extern "C" fn ap_main(cpu: u32) -> ! {
    apic_enable(false);
    load_task_register(cpu);
    // SAFETY: the BSP checked the header before starting us.
    let entry =
        unsafe { read_volatile(&raw const (*(USER_IMAGE_BASE as *const UserHeader)).entry) };
    AP_START.ready.fetch_add(1, Ordering::SeqCst);
    if AP_START.bsp_waiting.load(Ordering::SeqCst) != 0 {
        // SAFETY: written by the BSP before it started us.
        apic_send_to(unsafe { *BSP_APIC_ID.0.get() }, ICR_WAKE_ONE);
    }
    enter_user(cpu, entry)
}

/// `int3` from ring 3: a trap call (see `kumo_abi::call`).
#[unsafe(no_mangle)]
extern "C" fn kumo_trap(number: u64, a: u64, b: u64, c: u64) -> u64 {
    match number {
        call::WRITE => {
            // The workload is trusted; the length bound only limits the damage of a bug.
            let len = b.min(1 << 16) as usize;
            // SAFETY: ring 3 passes a buffer of its own (identity-mapped memory).
            serial_write(unsafe { core::slice::from_raw_parts(a as *const u8, len) });
            0
        }
        call::EXIT => exit(a as u32),
        call::WAIT => {
            // SAFETY: ring 3 passes the address of one of its u32 words. Interrupts are
            // off (interrupt gate) during the check, and `sti; hlt` leaves no window for
            // a wake-up to slip in between.
            unsafe {
                if read_volatile(a as *const u32) == b as u32 {
                    asm!("sti", "hlt", "cli", options(nomem, nostack));
                }
            }
            0
        }
        call::WAKE => {
            apic_send(ICR_WAKE);
            0
        }
        call::MARK_START => {
            outb(BOOT_TIMER_PORT, 1);
            0
        }
        call::FAULT => deliberate_fault(a),
        call::START_APS => {
            apic_send(ICR_STARTUP);
            0
        }
        call::SLEEP => {
            if !TSC_DEADLINE.load(Ordering::Relaxed) {
                return 1;
            }
            // With the scheduler's tick running, the tick ends the halt (the caller
            // may be woken early: it checks the time and sleeps again).
            let ticking = ticking();
            if !ticking {
                wrmsr(MSR_LVT_TIMER, LVT_TSC_DEADLINE);
                wrmsr(MSR_TSC_DEADLINE, a);
            }
            // SAFETY: the timer (and any IPI) lands on the wake vector (or the tick's),
            // whose handler only acknowledges; `sti; hlt` leaves no window to miss it.
            unsafe { asm!("sti", "hlt", "cli", options(nomem, nostack)) };
            if !ticking {
                wrmsr(MSR_TSC_DEADLINE, 0);
            }
            0
        }
        call::WAIT_UNTIL => {
            if !TSC_DEADLINE.load(Ordering::Relaxed) {
                return 1;
            }
            // SAFETY: as for WAIT: ring 3 passes one of its u32 words, checked with
            // interrupts off; the timer lands on the wake vector (acknowledge only).
            unsafe {
                if read_volatile(a as *const u32) == b as u32 {
                    let ticking = ticking();
                    if !ticking {
                        wrmsr(MSR_LVT_TIMER, LVT_TSC_DEADLINE);
                        wrmsr(MSR_TSC_DEADLINE, c);
                    }
                    asm!("sti", "hlt", "cli", options(nomem, nostack));
                    if !ticking {
                        wrmsr(MSR_TSC_DEADLINE, 0);
                    }
                }
            }
            0
        }
        call::SCHED_START => sched_start(a, b),
        call::SCHED_STOP => sched_stop(),
        _ => u64::MAX,
    }
}

/// Every exception (and unexpected vector): report and end the VM with status 3.
/// `frame` = [vector, error code, rip, cs, rflags, rsp, ss].
#[unsafe(no_mangle)]
extern "C" fn kumo_fault(frame: *const u64) -> ! {
    // SAFETY: boot.S passes the stack frame it built.
    let (vector, error, rip) = unsafe { (*frame, *frame.add(1), *frame.add(2)) };
    let cr2: u64;
    // SAFETY: reading CR2 has no side effects.
    unsafe { asm!("mov {}, cr2", out(reg) cr2, options(nomem, nostack, preserves_flags)) };
    let mut line = Line::new();
    line.text("@kumo fault cpu=");
    line.dec(u64::from(current_cpu()));
    line.text(" vector=");
    line.dec(vector);
    line.text(" error=");
    line.hex(error);
    line.text(" rip=");
    line.hex(rip);
    line.text(" cr2=");
    line.hex(cr2);
    line.text("\n@kumo end status=3\n");
    serial_write(line.bytes());
    exit(3)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    let mut line = Line::new();
    line.text("@kumo error what=kernel-panic item=");
    if let Some(location) = info.location() {
        line.text(location.file());
        line.text(":");
        line.dec(u64::from(location.line()));
    }
    line.text("\n@kumo end status=3\n");
    serial_write(line.bytes());
    exit(3)
}

// ---------------------------------------------------------------------------------------
// Boot steps.

/// TSC kHz: the hypervisor timing leaf (kumo, VMware, QEMU with invtsc), else CPUID
/// 0x15 (crystal clock), else measured against PIT channel 2 (TCG); and the LAPIC
/// timer's kHz if that leaf gives it (else 0).
fn tsc_khz(hypervisor: bool) -> (u64, u64) {
    let mut apic_khz = 0;
    if hypervisor {
        let max_leaf = cpuid(0x4000_0000, 0)[0];
        if (0x4000_0010..0x4000_0100).contains(&max_leaf) {
            let [khz, apic, _, _] = cpuid(0x4000_0010, 0);
            apic_khz = u64::from(apic);
            if khz != 0 {
                return (u64::from(khz), apic_khz);
            }
        }
    }
    if cpuid(0, 0)[0] >= 0x15 {
        let [denominator, numerator, crystal_hz, _] = cpuid(0x15, 0);
        if denominator != 0 && numerator != 0 && crystal_hz != 0 {
            let khz = u64::from(crystal_hz) * u64::from(numerator) / u64::from(denominator) / 1000;
            return (khz, apic_khz);
        }
    }
    (pit_calibrate(), apic_khz)
}

/// Counts TSC ticks over ~10 ms of PIT channel 2 (mode 0, gate on, speaker off).
fn pit_calibrate() -> u64 {
    const PIT_HZ: u64 = 1_193_182;
    const COUNT: u64 = 11_932;
    outb(0x61, (inb(0x61) & !0x02) | 0x01);
    outb(0x43, 0xB0);
    outb(0x42, COUNT as u8);
    outb(0x42, (COUNT >> 8) as u8);
    let start = rdtsc();
    // Bounded so that a machine without a PIT cannot hang the boot (~1 s at 10 GHz).
    while inb(0x61) & 0x20 == 0 && rdtsc() - start < 10_000_000_000 {}
    let ticks = rdtsc() - start;
    (ticks * PIT_HZ / (COUNT * 1000)).max(1)
}

/// Fills `apic_to_cpu` from the ACPI MADT (the BSP is CPU 0, then the other enabled
/// local APICs in table order) and returns the CPU count.
fn discover_cpus(si: u64, bsp_apic_id: u8) -> u32 {
    // SAFETY: BSP-only, before the APs start; the table starts all 0xFF (boot.S), so it
    // is filled in place (no 256-byte copies in emulated code).
    // (clippy's suggested `&mut apic_to_cpu` is a static-mut reference, an error.)
    #[allow(clippy::deref_addrof)]
    let table = unsafe { &mut *&raw mut apic_to_cpu };
    table[usize::from(bsp_apic_id)] = 0;
    let mut cpus = 1u32;
    if let Some(madt) = find_acpi_table(find_rsdp(si), *b"APIC") {
        let end = madt + u64::from(read32(madt + 4));
        let mut entry = madt + 44;
        while entry + 2 <= end {
            let (kind, len) = (read8(entry), read8(entry + 1));
            if len < 2 {
                break;
            }
            // Processor Local APIC, enabled.
            if kind == 0 && len >= 8 && read32(entry + 4) & 1 != 0 {
                let id = usize::from(read8(entry + 3));
                if table[id] == 0xFF && (cpus as usize) < MAX_CPUS {
                    table[id] = cpus as u8;
                    cpus += 1;
                }
            }
            entry += u64::from(len);
        }
    }
    cpus
}

/// Segment 0's ECAM base if the MCFG describes one starting at bus 0, else 0.
fn pci_ecam(si: u64) -> u64 {
    let Some(mcfg) = find_acpi_table(find_rsdp(si), *b"MCFG") else {
        return 0;
    };
    // Header (36 bytes) + 8 reserved, then 16-byte allocations: base, segment, buses.
    let end = mcfg + u64::from(read32(mcfg + 4));
    let mut entry = mcfg + 44;
    while entry + 16 <= end {
        let segment = read32(entry + 8) & 0xFFFF;
        let start_bus = read8(entry + 10);
        if segment == 0 && start_bus == 0 {
            return read64(entry);
        }
        entry += 16;
    }
    0
}

fn find_rsdp(si: u64) -> u64 {
    let given = read64(si + 32);
    if given != 0 {
        return given;
    }
    // QEMU may leave rsdp_paddr 0: the BIOS area then holds it on a 16-byte boundary.
    let signature = u64::from_le_bytes(*b"RSD PTR ");
    (0xE_0000..0x10_0000)
        .step_by(16)
        .find(|&p| read64(p) == signature)
        .unwrap_or(0)
}

fn find_acpi_table(rsdp: u64, signature: [u8; 4]) -> Option<u64> {
    if rsdp == 0 {
        return None;
    }
    let xsdt = if read8(rsdp + 15) >= 2 {
        read64(rsdp + 24)
    } else {
        0
    };
    let (root, entry_size) = if xsdt != 0 {
        (xsdt, 8)
    } else {
        (u64::from(read32(rsdp + 16)), 4)
    };
    if root == 0 {
        return None;
    }
    let end = root + u64::from(read32(root + 4));
    let mut entry = root + 36;
    while entry + entry_size <= end {
        let table = if entry_size == 8 {
            read64(entry)
        } else {
            u64::from(read32(entry))
        };
        if table != 0 && read32(table) == u32::from_le_bytes(signature) {
            return Some(table);
        }
        entry += entry_size;
    }
    None
}

/// Ring-3 stacks and the heap, from the first free byte after the image and modules to
/// the end of its RAM region: (stacks, heap start, heap end).
fn memory_layout(si: u64, cpus: u32) -> (u64, u64, u64) {
    let mut used_end = &raw const user_image_end as u64;
    let modules = read64(si + 16);
    for i in 0..u64::from(read32(si + 12)) {
        let module = modules + 32 * i;
        used_end = used_end.max(read64(module) + read64(module + 8));
    }
    let start = (used_end + 0xFFF) & !0xFFF;
    let (memmap, entries) = if read32(si + 4) >= 1 {
        (read64(si + 40), read32(si + 48))
    } else {
        (0, 0)
    };
    let mut region_end = 0;
    for i in 0..u64::from(entries) {
        let entry = memmap + 24 * i;
        let (addr, size, kind) = (read64(entry), read64(entry + 8), read32(entry + 16));
        if kind == 1 && addr <= start && start < addr + size {
            region_end = (addr + size).min(MAPPED_END);
        }
    }
    if region_end == 0 {
        boot_failure("no-memory-map");
    }
    let heap_start = start + u64::from(cpus) * USER_STACK_SIZE;
    if heap_start >= region_end {
        boot_failure("out-of-memory");
    }
    (start, heap_start, region_end)
}

/// The largest RAM range of the memory map above 4 GiB, 2 MiB-aligned and clipped to
/// what one PDPT maps; (0, 0) if there is none. A few entries: cheap in ring 0.
fn high_memory(si: u64) -> (u64, u64) {
    const PAGE_2M: u64 = 2 << 20;
    let (memmap, entries) = if read32(si + 4) >= 1 {
        (read64(si + 40), read32(si + 48))
    } else {
        (0, 0)
    };
    let (mut best_start, mut best_end) = (0, 0);
    for i in 0..u64::from(entries) {
        let entry = memmap + 24 * i;
        let (addr, size, kind) = (read64(entry), read64(entry + 8), read32(entry + 16));
        let start = addr.max(MAPPED_END).saturating_add(PAGE_2M - 1) & !(PAGE_2M - 1);
        let end = addr.saturating_add(size).min(PDPT_END) & !(PAGE_2M - 1);
        if kind == 1 && start < end && end - start > best_end - best_start {
            (best_start, best_end) = (start, end);
        }
    }
    (best_start, best_end)
}

/// INIT-SIPI to all other CPUs at once, and on: the BSP's ring 3 waits for their
/// check-in (`ApStart`) while it sets itself up, at native speed where this code would
/// halt in emulated ring 0 and be woken by each AP (~0.2 ms on PVM hosts), and sends
/// the SIPI again every 10 ms (`call::START_APS`) until they are in, up to 1 s.
fn start_aps(cpus: u32) {
    if cpus <= 1 {
        return;
    }
    // SAFETY: the trampoline's bytes are in our image; 0x8000 is reserved for it.
    unsafe {
        let start = &raw const ap_trampoline_start;
        let len = (&raw const ap_trampoline_end as usize) - (start as usize);
        // One `rep movsb` instead of a memcpy call (fewer emulated instructions).
        asm!("rep movsb", inout("rdi") AP_TRAMPOLINE => _, inout("rsi") start => _,
             inout("rcx") len => _, options(nostack, preserves_flags));
    }
    apic_send(ICR_INIT);
    apic_send(ICR_STARTUP);
}

/// To ring 3 at the runtime's entry, with `rdi` = `&BootInfo`, `rsi` = CPU index and
/// interrupts enabled (the wake-up IPI).
fn enter_user(cpu: u32, entry: u64) -> ! {
    // SAFETY: written by the BSP before any AP started.
    let stacks = unsafe { *USER_STACKS.0.get() };
    let stack_top = stacks + (u64::from(cpu) + 1) * USER_STACK_SIZE;
    // No run queue on this CPU (boot.S's interrupt entries read this slot).
    // SAFETY: the top qword of this CPU's own kernel stack, above its TSS RSP0; only
    // `call bsp_main`/`call ap_main`'s return address was there, and they never return.
    unsafe { write_volatile(run_queue_slot(cpu), 0) };
    // SAFETY: a well-formed iretq frame to ring-3 selectors of our GDT; the runtime's
    // entry and stack are mapped (identity map, U/S set).
    unsafe {
        asm!(
            "push {ss}", "push {rsp}", "push {rflags}", "push {cs}", "push {rip}", "iretq",
            ss = const SEL_USER_DATA,
            rsp = in(reg) stack_top,
            rflags = const 0x202,
            cs = const SEL_USER_CODE,
            rip = in(reg) entry,
            in("rdi") BOOT_INFO.0.get(),
            in("rsi") u64::from(cpu),
            options(noreturn),
        )
    }
}

// ---------------------------------------------------------------------------------------
// The scheduler's set-up (the switching itself is boot.S's).

/// The top qword of CPU `cpu`'s own kernel stack: its run queue's address, or 0.
fn run_queue_slot(cpu: u32) -> *mut u64 {
    let top = &raw const kstacks as u64 + (u64::from(cpu) + 1) * KSTACK_SIZE;
    (top - 8) as *mut u64
}

/// `call::SCHED_START`: this CPU multiplexes the run queue at `rq` (the caller is its
/// current task, on the CPU's own kernel stack), with a tick at `hz` (0: none).
fn sched_start(rq: u64, hz: u64) -> u64 {
    // SAFETY: written by the BSP before any AP started.
    let apic_khz = unsafe { *APIC_TIMER_KHZ.0.get() };
    if !x2apic() || (hz != 0 && (apic_khz == 0 || hz > 1_000_000)) {
        return 1;
    }
    let cpu = current_cpu();
    let tss_rsp0 = TSS_BASE + u64::from(cpu) * TSS_SIZE + 4;
    // SAFETY: ring 3 passes its run queue (identity-mapped, ours to read and write
    // while it is installed); the TSS field and the stack slot are this CPU's own.
    unsafe {
        let queue = rq as *mut kumo_abi::sched::RunQueue;
        (*queue).tss_rsp0 = tss_rsp0;
        let current = (*queue).current as usize;
        (*queue).tasks[current].kstack_top = read_unaligned(tss_rsp0 as *const u64);
        (*queue).left = (*queue).slice;
        write_volatile(run_queue_slot(cpu), rq);
    }
    // hz 0: no tick.
    if let Some(count) = (apic_khz * 1000).checked_div(hz) {
        wrmsr(MSR_TIMER_DIVIDE, 0b1011); // divide by 1
        wrmsr(
            MSR_LVT_TIMER,
            LVT_PERIODIC | u64::from(kumo_abi::sched::TICK_VECTOR),
        );
        wrmsr(MSR_TIMER_INITIAL, count);
    }
    0
}

/// `call::SCHED_STOP`: the tick off, the run queue forgotten.
fn sched_stop() -> u64 {
    if !x2apic() {
        return 1;
    }
    wrmsr(MSR_TIMER_INITIAL, 0);
    wrmsr(
        MSR_LVT_TIMER,
        LVT_MASKED | u64::from(kumo_abi::sched::TICK_VECTOR),
    );
    // SAFETY: this CPU's own stack slot.
    unsafe { write_volatile(run_queue_slot(current_cpu()), 0) };
    0
}

/// Whether this CPU's LAPIC timer is the scheduler's periodic tick.
fn ticking() -> bool {
    rdmsr(MSR_LVT_TIMER) & (LVT_PERIODIC | LVT_MASKED) == LVT_PERIODIC
}

fn load_task_register(cpu: u32) {
    let selector = SEL_TSS0 + 16 * cpu as u16;
    // SAFETY: boot.S's GDT has an available TSS descriptor for every CPU < MAX_CPUS.
    unsafe { asm!("ltr {0:x}", in(reg) selector, options(nostack, preserves_flags)) };
}

fn deliberate_fault(kind: u64) -> u64 {
    match kind {
        fault::TRIPLE => {
            let empty_idt = [0u8; 10];
            // SAFETY: deliberately not: with an empty IDT the #UD cannot be delivered,
            // nor the resulting #GP and #DF: the CPU shuts down (a triple fault). (ud2,
            // not int3: int3 at CPL0 is an emulator internal error on PVM hosts.)
            unsafe { asm!("lidt [{}]", "ud2", in(reg) &empty_idt, options(nostack)) };
        }
        // SAFETY: deliberately not: #UD goes to kumo_fault, which never returns.
        fault::UD => unsafe { asm!("ud2", options(nomem, nostack)) },
        fault::PAGEFAULT => {
            // SAFETY: deliberately not: nothing is ever mapped at 512 GiB, so this
            // write raises #PF, which goes to kumo_fault.
            unsafe { asm!("mov byte ptr [{}], 1", in(reg) PDPT_END, options(nostack)) };
        }
        _ => {}
    }
    u64::MAX
}

fn boot_failure(why: &str) -> ! {
    let mut line = Line::new();
    line.text("@kumo error what=boot item=");
    line.text(why);
    line.text("\n@kumo end status=3\n");
    serial_write(line.bytes());
    exit(3)
}

fn exit(status: u32) -> ! {
    // SAFETY: the debug-exit port ends the VM; if nothing is there, halt for good.
    unsafe {
        asm!("out dx, eax", in("dx") DEBUG_EXIT_PORT, in("eax") status, options(nomem, nostack));
        loop {
            asm!("cli", "hlt", options(nomem, nostack));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Local APIC.

fn x2apic() -> bool {
    // SAFETY: written once by the BSP before anything else reads it.
    unsafe { read_volatile(&raw const x2apic_mode) != 0 }
}

/// Software-enables this CPU's local APIC (x2APIC mode when available); on the BSP also
/// masks LINT0, where the firmware routes the legacy PIC (its timer would arrive as a
/// stray vector 8).
fn apic_enable(bsp: bool) {
    if x2apic() {
        wrmsr(0x1B, rdmsr(0x1B) | (1 << 10) | (1 << 11));
        wrmsr(0x80F, u64::from(0x100 | SPURIOUS_VECTOR));
        if bsp {
            wrmsr(0x835, 1 << 16);
        }
    } else {
        write32(XAPIC_BASE + 0xF0, 0x100 | SPURIOUS_VECTOR);
        if bsp {
            write32(XAPIC_BASE + 0x350, 1 << 16);
        }
    }
}

fn apic_send(icr: u32) {
    if x2apic() {
        wrmsr(0x830, u64::from(icr));
    } else {
        write32(XAPIC_BASE + 0x310, 0);
        write32(XAPIC_BASE + 0x300, icr);
    }
}

fn apic_send_to(apic_id: u32, icr: u32) {
    if x2apic() {
        wrmsr(0x830, (u64::from(apic_id) << 32) | u64::from(icr));
    } else {
        write32(XAPIC_BASE + 0x310, apic_id << 24);
        write32(XAPIC_BASE + 0x300, icr);
    }
}

fn current_cpu() -> u32 {
    let apic_id = if x2apic() {
        rdmsr(0x802) as u32
    } else {
        read32(XAPIC_BASE + 0x20) >> 24
    };
    // SAFETY: the table is only written by the BSP before the APs start.
    let cpu = unsafe { read_volatile(&raw const apic_to_cpu) }
        .get(apic_id as usize)
        .copied();
    match cpu {
        Some(cpu) if cpu != 0xFF => u32::from(cpu),
        _ => apic_id,
    }
}

// ---------------------------------------------------------------------------------------
// COM1.

fn serial_init() {
    // FIFO on: each "THR empty" then means room for 16 bytes.
    outb(COM1 + 2, 0x07);
}

/// Writes in 16-byte bursts (`rep outsb`: one VM exit each), checking the line status
/// once per FIFO load instead of per byte: each port access is a ~10 µs exit.
fn serial_write(bytes: &[u8]) {
    // Bounded: a fault report must get out even if its CPU faulted holding the lock.
    let mut spins = 0;
    while SERIAL_LOCK.swap(true, Ordering::Acquire) && spins < 100_000 {
        spins += 1;
        core::hint::spin_loop();
    }
    for chunk in bytes.chunks(16) {
        let mut polls = 0;
        while inb(COM1 + 5) & 0x20 == 0 && polls < 100_000 {
            polls += 1;
        }
        // SAFETY: port output from our own buffer; DF is clear (SysV ABI).
        unsafe {
            asm!(
                "rep outsb",
                in("dx") COM1,
                inout("rsi") chunk.as_ptr() => _,
                inout("rcx") chunk.len() => _,
                options(nostack, preserves_flags, readonly),
            )
        };
    }
    SERIAL_LOCK.store(false, Ordering::Release);
}

/// A fixed buffer for ring-0 messages (no `core::fmt`: fewer emulated instructions).
struct Line {
    buf: [u8; 192],
    len: usize,
}

impl Line {
    fn new() -> Line {
        Line {
            buf: [0; 192],
            len: 0,
        }
    }

    fn text(&mut self, s: &str) {
        for &b in s.as_bytes() {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    fn dec(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        // ASCII digits are always valid UTF-8.
        self.text(core::str::from_utf8(&digits[i..]).unwrap_or("?"));
    }

    fn hex(&mut self, v: u64) {
        let mut digits = [0u8; 18];
        digits[0] = b'0';
        digits[1] = b'x';
        let mut n = 2;
        let mut started = false;
        for shift in (0..16).rev() {
            let nibble = ((v >> (shift * 4)) & 0xF) as u8;
            if nibble != 0 || started || shift == 0 {
                started = true;
                digits[n] = b"0123456789abcdef"[usize::from(nibble)];
                n += 1;
            }
        }
        self.text(core::str::from_utf8(&digits[..n]).unwrap_or("?"));
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

// ---------------------------------------------------------------------------------------
// Instructions.

fn cpuid(leaf: u32, subleaf: u32) -> [u32; 4] {
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    [r.eax, r.ebx, r.ecx, r.edx]
}

fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no side effects (CR4.TSD is clear).
    unsafe { core::arch::x86_64::_rdtsc() }
}

fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: only called for MSRs that exist in the mode in use (APIC base, x2APIC).
    unsafe { asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nomem, nostack)) };
    (u64::from(hi) << 32) | u64::from(lo)
}

fn wrmsr(msr: u32, value: u64) {
    // SAFETY: only called for APIC MSRs with architecturally valid values.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") value as u32, in("edx") (value >> 32) as u32,
             options(nostack))
    };
}

fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: reads of the UART/PIT ports have no memory effects.
    unsafe {
        asm!("in al, dx", in("dx") port, out("al") v, options(nomem, nostack, preserves_flags))
    };
    v
}

fn outb(port: u16, v: u8) {
    // SAFETY: writes to the UART, PIT and boot-timer ports have no memory effects.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") v, options(nomem, nostack, preserves_flags))
    };
}

fn read8(addr: u64) -> u8 {
    // SAFETY: firmware tables and start_info are in identity-mapped low memory.
    unsafe { read_volatile(addr as *const u8) }
}

fn read32(addr: u64) -> u32 {
    // SAFETY: as `read8`; firmware tables need not be aligned.
    unsafe { read_unaligned(addr as *const u32) }
}

fn read64(addr: u64) -> u64 {
    // SAFETY: as `read32`.
    unsafe { read_unaligned(addr as *const u64) }
}

fn write32(addr: u64, v: u32) {
    // SAFETY: only used for xAPIC registers (identity-mapped MMIO).
    unsafe { write_volatile(addr as *mut u32, v) }
}
