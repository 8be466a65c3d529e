//! Guest physical memory layout (docs/guest-abi.md).

/// `hvm_start_info`.
pub const START_INFO: u64 = 0x6000;
/// The PVH module list (`hvm_modlist_entry` array).
pub const MODLIST: u64 = 0x6040;
/// End of the module list's space.
pub const MODLIST_END: u64 = 0x7000;
/// The guest's clock offset (kumo_abi::CLOCK_OFFSET): TSC ticks its snapshot spent on
/// disk, which the guest leaves out of its clock. Past the last module entry.
pub const CLOCK_OFFSET: u64 = 0x6ff8;
/// The PVH memory map (`hvm_memmap_table_entry` array).
pub const MEMMAP: u64 = 0x7000;
pub const MEMMAP_END: u64 = 0x8000;
/// Never used by kumo: the guest's AP real-mode trampoline (SIPI vector 0x08).
pub const AP_TRAMPOLINE: u64 = 0x8000;
/// The command line, NUL-terminated.
pub const CMDLINE: u64 = 0x20000;
/// Room for the command line including its NUL.
pub const CMDLINE_MAX: u64 = 0x1000;
/// End of low RAM; `[LOW_RAM_END, HIGH_RAM_START)` is reserved (legacy + ACPI).
pub const LOW_RAM_END: u64 = 0x9fc00;
/// ACPI RSDP (and the tables after it, up to `HIGH_RAM_START`).
pub const ACPI_START: u64 = 0xe0000;
pub const HIGH_RAM_START: u64 = 0x100000;
/// Where kumo assigns PCI BARs (as firmware would): between the top of low RAM (at
/// most 3 GiB; the rest lies above 4 GiB, see `memory_map`) and ECAM.
pub const PCI_MMIO_START: u64 = 0xc000_0000;
pub const PCI_MMIO_END: u64 = 0xe000_0000;
/// PCI configuration space (ECAM) for bus 0 only, described by the ACPI MCFG and
/// reserved in the memory map.
pub const PCI_ECAM_BASE: u64 = 0xe000_0000;
pub const PCI_ECAM_SIZE: u64 = 1 << 20;
/// The local APIC and I/O APIC MMIO bases.
pub const LAPIC_BASE: u32 = 0xfee0_0000;
pub const IOAPIC_BASE: u32 = 0xfec0_0000;
/// KVM (VMX without unrestricted guest) wants three pages for its real-mode TSS; put
/// them far above RAM.
pub const KVM_TSS_ADDR: usize = 0xfffb_d000;

/// Guest-physical ranges kumo writes at boot: a kernel segment may not overlap them.
pub const BOOT_DATA: [(u64, u64, &str); 3] = [
    (
        START_INFO,
        MEMMAP_END,
        "hvm_start_info, module list and memory map",
    ),
    (CMDLINE, CMDLINE + CMDLINE_MAX, "the command line"),
    (LOW_RAM_END, HIGH_RAM_START, "the reserved legacy/ACPI area"),
];

pub const PAGE_SIZE: u64 = 0x1000;
pub const MIB: u64 = 1 << 20;

pub(crate) fn align_up(v: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    v.checked_add(align - 1).map(|x| x & !(align - 1))
}
