//! What every VM stands on, new or restored: KVM opened, the VM made with its
//! memfd-backed RAM slots, TSS and in-kernel irqchip, and the helpers that give vCPUs
//! their CPUID and KVM its memory slots. The builders (`crate::builder`) and live
//! migration's dirty logging use it; it knows nothing of a running VM.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use kvm_bindings::{CpuId, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::Error;
use crate::kvm::{self, ioctl};
use crate::layout::*;
use crate::memory_map;

/// What every VM starts from, new or restored: KVM opened (and its vCPU limit checked),
/// a VM with `mem_size` bytes of memfd RAM (one slot per region of
/// [`memory_map::ram_regions`]; on huge pages if `huge_pages`), the TSS and the
/// in-kernel irqchip (which must exist before any vCPU). The dirty ring, if wanted,
/// is the caller's to enable next (also before any vCPU).
pub(crate) fn machine(
    kvm_device: &std::path::Path,
    vcpus: u32,
    mem_size: u64,
    huge_pages: bool,
) -> Result<(Kvm, VmFd, GuestMemoryMmap, File), Error> {
    memory_map::check_size(mem_size.div_ceil(MIB))?;
    let (memory, memfd) = create_memory(mem_size, huge_pages)?;
    tracing::debug!("boot: RAM mapped");
    let (kvm, vm) = machine_for(kvm_device, vcpus, &memory, mem_size)?;
    Ok((kvm, vm, memory, memfd))
}

/// As [`machine`], for guest RAM already made (`memory`, `mem_size` bytes): a new VM
/// loads its kernel into RAM on another thread meanwhile.
pub(crate) fn machine_for(
    kvm_device: &std::path::Path,
    vcpus: u32,
    memory: &GuestMemoryMmap,
    mem_size: u64,
) -> Result<(Kvm, VmFd), Error> {
    let kvm = kvm::open(kvm_device)?;
    let vm = machine_on(&kvm, vcpus, memory, mem_size)?;
    Ok((kvm, vm))
}

/// As [`machine_for`], on KVM already opened (a new VM queries it on another thread
/// meanwhile).
pub(crate) fn machine_on(
    kvm: &Kvm,
    vcpus: u32,
    memory: &GuestMemoryMmap,
    mem_size: u64,
) -> Result<VmFd, Error> {
    let max = kvm::max_vcpus(kvm);
    if vcpus > max {
        return Err(Error::TooManyVcpus {
            requested: vcpus,
            max,
        });
    }
    let vm = create_vm(kvm)?;
    crate::teardown::keep(vm.as_raw_fd());
    // Boot time is spent here: each step says when it ended (`RUST_LOG=debug`).
    tracing::debug!("boot: VM created");
    for region in memory_map::ram_regions(mem_size) {
        set_memory_slot(&vm, memory, &region, 0)?;
    }
    tracing::debug!("boot: RAM slots given to KVM");
    vm.set_tss_address(KVM_TSS_ADDR)
        .map_err(ioctl("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip().map_err(ioctl("KVM_CREATE_IRQCHIP"))?;
    tracing::debug!("boot: TSS and irqchip");
    Ok(vm)
}

/// Gives `vcpu` the CPUID `entries`.
pub(crate) fn set_cpuid(
    vcpu: &VcpuFd,
    entries: &[kvm_bindings::kvm_cpuid_entry2],
) -> Result<(), Error> {
    let cpuid = CpuId::from_entries(entries).map_err(|_| Error::Kvm {
        ioctl: "KVM_SET_CPUID2",
        source: kvm_ioctls::Error::new(libc::E2BIG),
    })?;
    vcpu.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))
}

fn create_vm(kvm: &Kvm) -> Result<VmFd, Error> {
    // KVM_CREATE_VM can fail with EINTR when a signal arrives; retry then.
    let mut tries = 0;
    loop {
        match kvm.create_vm() {
            Ok(vm) => return Ok(vm),
            Err(e) if e.errno() == libc::EINTR && tries < 10 => tries += 1,
            Err(e) => return Err(ioctl("KVM_CREATE_VM")(e)),
        }
    }
}

/// Gives KVM `region` of `memory` as its slot, with `flags` (dirty logging or none).
pub(crate) fn set_memory_slot(
    vm: &VmFd,
    memory: &GuestMemoryMmap,
    region: &memory_map::RamRegion,
    flags: u32,
) -> Result<(), Error> {
    let host = memory
        .get_host_address(GuestAddress(region.gpa))
        .map_err(|e| Error::GuestMemory(e.to_string()))?;
    let slot = kvm_userspace_memory_region {
        slot: region.slot,
        flags,
        guest_phys_addr: region.gpa,
        memory_size: region.size,
        userspace_addr: host as u64,
    };
    // SAFETY: `host` is the start of `memory`'s mapping of this region, `region.size`
    // bytes long (`create_memory` mapped each region of `ram_regions` whole). Whoever
    // owns the VM fd keeps that mapping alive until after the VM is gone (the Vm drops
    // its memory after the VM fd, the migration hub holds a clone), so KVM never sees a
    // dangling host range.
    unsafe { vm.set_user_memory_region(slot) }.map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))
}

/// Guest RAM of `size` bytes on one memfd, mapped region by region as
/// [`memory_map::ram_regions`] lays it out (zero-filled). On 4 KiB pages it is
/// untouched: pages appear when used, so a large guest costs only what it touches. On
/// huge pages every page is taken now, so a short pool is a clear error here and not
/// a fault (SIGBUS) when the guest first touches the page that is missing.
pub(crate) fn create_memory(size: u64, huge_pages: bool) -> Result<(GuestMemoryMmap, File), Error> {
    let flags = if huge_pages {
        if !size.is_multiple_of(HUGE_PAGE) {
            return Err(Error::HugePagesOdd {
                memory_mib: size / MIB,
            });
        }
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB
    } else {
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING
    };
    // SAFETY: the name is a valid NUL-terminated string and `flags` are memfd_create's
    // own; the return value is checked.
    let fd = unsafe { libc::memfd_create(c"kumo-guest-ram".as_ptr(), flags) };
    if fd < 0 {
        return Err(Error::Os {
            what: "memfd_create",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).map_err(|source| Error::Os {
        what: "sizing the guest RAM memfd",
        source,
    })?;
    if huge_pages {
        take_huge_pages(&file, size)?;
    }
    // Fixed size from here on: a vfio-user device server maps this file and refuses
    // one its client could shrink under it (hole punching, which snapshots and
    // migration use, stays allowed).
    // SAFETY: F_ADD_SEALS on the descriptor we own; it takes no pointer.
    let sealed = unsafe {
        libc::fcntl(
            file.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
        )
    };
    if sealed != 0 {
        return Err(Error::Os {
            what: "sealing the guest RAM memfd's size",
            source: std::io::Error::last_os_error(),
        });
    }
    let ranges = memory_map::ram_regions(size)
        .iter()
        .map(|r| {
            let mapped = file.try_clone().map_err(|source| Error::Os {
                what: "duplicating the guest RAM memfd",
                source,
            })?;
            Ok((
                GuestAddress(r.gpa),
                r.size as usize,
                Some(FileOffset::new(mapped, r.file_offset)),
            ))
        })
        .collect::<Result<Vec<_>, Error>>()?;
    let memory = GuestMemoryMmap::from_ranges_with_files(ranges)
        .map_err(|e| Error::GuestMemory(e.to_string()))?;
    Ok((memory, file))
}

/// The size of the huge pages guest RAM can be on (x86's 2 MiB).
const HUGE_PAGE: u64 = 2 * MIB;

/// Allocates every huge page of the memfd `file` (`size` bytes) from the host's pool.
fn take_huge_pages(file: &File, size: u64) -> Result<(), Error> {
    // Read first: a failed fallocate keeps what it took until the memfd closes.
    let free = free_huge_pages();
    // SAFETY: fallocate on a descriptor we own, within its size.
    let done = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, size as libc::off_t) };
    if done == 0 {
        return Ok(());
    }
    let source = std::io::Error::last_os_error();
    match source.raw_os_error() {
        Some(libc::ENOSPC | libc::ENOMEM) => Err(Error::HugePagesShort {
            memory_mib: size / MIB,
            needed: size / HUGE_PAGE,
            free,
        }),
        _ => Err(Error::Os {
            what: "allocating guest RAM on huge pages",
            source,
        }),
    }
}

/// True if `memfd` is a hugetlbfs file (guest RAM made with `huge_pages`).
pub(crate) fn on_huge_pages(memfd: &File) -> bool {
    const HUGETLBFS_MAGIC: libc::c_long = 0x9584_58f6;
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs writes a statfs into the buffer it is given; read only on success.
    let done = unsafe { libc::fstatfs(memfd.as_raw_fd(), fs.as_mut_ptr()) };
    // SAFETY: initialised by the successful call.
    done == 0 && unsafe { fs.assume_init() }.f_type as libc::c_long == HUGETLBFS_MAGIC
}

/// The host's 2 MiB huge pages free for a new VM: `HugePages_Free` less
/// `HugePages_Rsvd` (promised to mappings that have not touched them yet) of
/// `/proc/meminfo`; 0 if unread.
pub(crate) fn free_huge_pages() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| -> u64 {
        meminfo
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    field("HugePages_Free:").saturating_sub(field("HugePages_Rsvd:"))
}

pub(crate) fn write(memory: &GuestMemoryMmap, addr: u64, bytes: &[u8]) -> Result<(), Error> {
    if write_through_file(memory, addr, bytes) {
        return Ok(());
    }
    memory
        .write_slice(bytes, GuestAddress(addr))
        .map_err(|e| Error::GuestMemory(format!("writing {} bytes at {addr:#x}: {e}", bytes.len())))
}

/// Writes `bytes` at guest address `addr` with `pwrite` on the RAM's memfd, if they lie
/// in one file-backed region: the kernel fills fresh pages without a page fault each
/// (a fault is several microseconds on a nested host, and the guest image is ~200
/// pages). False if it did not (hugetlbfs has no `write`): then copy through the
/// mapping.
fn write_through_file(memory: &GuestMemoryMmap, addr: u64, bytes: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    use vm_memory::GuestMemoryRegion;
    let Some(region) = memory.find_region(GuestAddress(addr)) else {
        return false;
    };
    let Some(file) = region.file_offset() else {
        return false;
    };
    let within = addr - region.start_addr().0;
    if within.saturating_add(bytes.len() as u64) > region.len() {
        return false;
    }
    file.file()
        .write_all_at(bytes, file.start() + within)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(flags: libc::c_uint) -> File {
        // SAFETY: a valid name; the result is checked before it is owned.
        let fd = unsafe { libc::memfd_create(c"kumo-test".as_ptr(), libc::MFD_CLOEXEC | flags) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor nothing else owns.
        unsafe { File::from_raw_fd(fd) }
    }

    /// Bytes written through the memfd are what the mapping (KVM's view) reads.
    #[test]
    fn bytes_written_through_the_memfd_are_seen_through_the_mapping() {
        use vm_memory::{Bytes, GuestAddress};
        let (memory, _file) = create_memory(4 * MIB, false).unwrap();
        let bytes: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        assert!(write_through_file(&memory, 0x1234, &bytes));
        let mut back = vec![0u8; bytes.len()];
        memory.read_slice(&mut back, GuestAddress(0x1234)).unwrap();
        assert_eq!(back, bytes);
        // Past the end of RAM: not through the file, and `write` reports it.
        assert!(!write_through_file(&memory, 4 * MIB - 10, &bytes));
        assert!(write(&memory, 4 * MIB - 10, &bytes).is_err());
    }

    #[test]
    fn a_hugetlbfs_memfd_is_told_from_a_shared_memory_one() {
        // Creating the file takes no page, so this needs no pool.
        assert!(on_huge_pages(&memfd(
            libc::MFD_HUGETLB | libc::MFD_HUGE_2MB
        )));
        assert!(!on_huge_pages(&memfd(0)));
    }

    #[test]
    fn guest_ram_on_huge_pages_is_whole_huge_pages() {
        let err = create_memory(3 * MIB, true).unwrap_err();
        assert!(
            matches!(err, Error::HugePagesOdd { memory_mib: 3 }),
            "{err}"
        );
    }
}
