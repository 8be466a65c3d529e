//! Building a VM from a stream: META creates it (RAM, irqchip, vCPUs with the saved
//! CPUID), RAM sections fill memory, and at END the irqchip, clock, vCPU and device
//! state go in. Nothing runs until the caller runs the returned VM.

use std::io::Read;
use std::path::Path;

use kvm_ioctls::Cap;
use std::os::fd::AsRawFd;

use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};

use crate::kvm::ioctl;
use crate::machine::{machine, set_cpuid};
use crate::migration::dirty::DirtyLogMode;
use crate::migration::state::{self, DeviceStates, VcpuState, VmState};
use crate::migration::stream::{
    self, Meta, StreamError, TAG_APP, TAG_DEVICES, TAG_END, TAG_META, TAG_RAM, TAG_SYNC, TAG_VCPU,
    TAG_VM, tag_name,
};
use crate::{Error, Vm};

/// Reads a whole stream (header first) from `r` and builds the VM it describes.
/// Returns the VM, ready to run, and the stream's META (with the program's `app`).
///
/// The guest's clock leaves out the time between the save and now (the snapshot
/// waited on disk): see [`continue_clock`].
pub fn build_from_snapshot(r: &mut impl Read, kvm_device: &Path) -> Result<(Vm, Meta), Error> {
    build(r, kvm_device, |_| Ok(()), true)
}

/// [`build_from_snapshot`] for a migration: `applied(round)` is called at each `SYNC`, once
/// every page before it is in RAM, to acknowledge the round to the source.
/// The guest's clock runs on through the downtime, as a live migration's does
/// everywhere.
pub fn build_incoming(
    r: &mut impl Read,
    kvm_device: &Path,
    applied: impl FnMut(u32) -> Result<(), Error>,
) -> Result<(Vm, Meta), Error> {
    build(r, kvm_device, applied, false)
}

fn build(
    r: &mut impl Read,
    kvm_device: &Path,
    mut applied: impl FnMut(u32) -> Result<(), Error>,
    leave_out_time_saved: bool,
) -> Result<(Vm, Meta), Error> {
    stream::read_header(r)?;
    let first = stream::read_section(r)?;
    if first.tag != TAG_META {
        return Err(StreamError::Order(tag_name(&first.tag)).into());
    }
    let mut meta: Meta = first.json()?;
    stream::check_meta(&meta)?;
    let mut vm = create(&meta, kvm_device)?;
    let mut vcpus: Option<Vec<VcpuState>> = None;
    let mut vm_state: Option<VmState> = None;
    let mut devices: Option<DeviceStates> = None;
    let mut app: Option<String> = None;
    let mut last_sync: Option<u32> = None;
    let mut section = stream::PooledSection::new();
    loop {
        stream::read_section_into(r, &mut section)?;
        match section.tag {
            TAG_RAM if vcpus.is_none() => {
                // Runs of zero pages (rounds list pages in address order) are zeroed
                // with one call each.
                let mut zeros = ZeroRun::new(meta.huge_pages);
                for page in section.pages(meta.memory_bytes) {
                    match page? {
                        (gpa, Some(bytes)) => {
                            zeros.flush(&vm.memory)?;
                            vm.memory
                                .write_slice(bytes, GuestAddress(gpa))
                                .map_err(|e| Error::GuestMemory(e.to_string()))?
                        }
                        (gpa, None) => zeros.add(&vm.memory, gpa)?,
                    }
                }
                zeros.flush(&vm.memory)?;
            }
            TAG_SYNC if vcpus.is_none() => {
                let round = stream::next_sync(&section, last_sync)?;
                last_sync = Some(round);
                applied(round)?;
            }
            TAG_VCPU if vcpus.is_none() => {
                tracing::debug!("VCPU section ({} bytes)", section.payload.len());
                let v: Vec<VcpuState> = section.json()?;
                if v.len() != meta.vcpus as usize {
                    return Err(StreamError::Malformed {
                        tag: "VCPU".into(),
                        why: format!("{} vCPU states for {} vCPUs", v.len(), meta.vcpus),
                    }
                    .into());
                }
                vcpus = Some(v);
            }
            TAG_VM if vm_state.is_none() && vcpus.is_some() => vm_state = Some(section.json()?),
            TAG_DEVICES if devices.is_none() && vcpus.is_some() => devices = Some(section.json()?),
            TAG_APP if app.is_none() && vcpus.is_some() => app = Some(section.json()?),
            TAG_END => {
                tracing::debug!("stream END; applying state");
                if let Some(app) = app {
                    meta.app = app;
                }
                let (Some(vcpus), Some(vm_state), Some(devices)) = (vcpus, vm_state, devices)
                else {
                    return Err(StreamError::Order("END".into()).into());
                };
                apply(&mut vm, &vcpus, &vm_state, devices)?;
                if leave_out_time_saved
                    && let Some(saved) = vcpus.iter().filter_map(VcpuState::tsc).max()
                {
                    continue_clock(&vm, saved)?;
                }
                return Ok((vm, meta));
            }
            tag => return Err(StreamError::Order(tag_name(&tag)).into()),
        }
    }
}

/// Zero pages of a RAM section waiting to be zeroed together: `pages` pages from
/// `start`.
struct ZeroRun {
    start: u64,
    pages: u64,
    /// RAM on huge pages: write the zeros. A hole would hand the huge page back to the
    /// host's pool, which the VM was promised it never has to ask again.
    keep_pages: bool,
}

impl ZeroRun {
    fn new(huge_pages: bool) -> ZeroRun {
        ZeroRun {
            start: 0,
            pages: 0,
            keep_pages: huge_pages,
        }
    }

    fn add(&mut self, memory: &GuestMemoryMmap, gpa: u64) -> Result<(), Error> {
        if self.pages > 0 && gpa != self.start + self.pages * stream::PAGE_SIZE as u64 {
            self.flush(memory)?;
        }
        if self.pages == 0 {
            self.start = gpa;
        }
        self.pages += 1;
        Ok(())
    }

    fn flush(&mut self, memory: &GuestMemoryMmap) -> Result<(), Error> {
        if self.pages > 0 {
            let len = self.pages * stream::PAGE_SIZE as u64;
            if self.keep_pages {
                write_zeros(memory, self.start, len)?;
            } else {
                zero_range(memory, self.start, len)?;
            }
            self.pages = 0;
        }
        Ok(())
    }
}

/// Makes `len` bytes of RAM from `gpa` zero without touching them: a hole punched in
/// the region's file (nothing to do where it is one already, as everywhere in a fresh
/// VM; writing zeros instead would allocate every zero page the source sends, and a
/// destination doing that falls behind the stream). Zeros are written where the
/// range has no file or spans regions.
fn zero_range(memory: &GuestMemoryMmap, gpa: u64, len: u64) -> Result<(), Error> {
    if let Some((region, at)) = memory.to_region_addr(GuestAddress(gpa))
        && let Some(file) = region.file_offset()
        && region.len() - at.raw_value() >= len
    {
        let offset = file.start() + at.raw_value();
        // SAFETY: fallocate on the region's own file, inside the range the region
        // maps (checked above); the mapping stays valid and reads zeros there
        // afterwards.
        let r = unsafe {
            libc::fallocate(
                file.file().as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(());
        }
    }
    write_zeros(memory, gpa, len)
}

/// Writes zeros over `len` bytes of RAM from `gpa`.
fn write_zeros(memory: &GuestMemoryMmap, gpa: u64, len: u64) -> Result<(), Error> {
    let zeros = [0u8; stream::PAGE_SIZE];
    for page in 0..len / stream::PAGE_SIZE as u64 {
        memory
            .write_slice(&zeros, GuestAddress(gpa + page * stream::PAGE_SIZE as u64))
            .map_err(|e| Error::GuestMemory(e.to_string()))?;
    }
    Ok(())
}

/// A VM of META's shape with nothing loaded: RAM, irqchip, vCPUs with their CPUID.
fn create(meta: &Meta, kvm_device: &Path) -> Result<Vm, Error> {
    let dirty = DirtyLogMode::default();
    let (kvm, vm, memory, memfd) =
        machine(kvm_device, meta.vcpus, meta.memory_bytes, meta.huge_pages)?;
    super::enable_dirty_log(&vm, dirty)?;
    let mut vcpus = Vec::with_capacity(meta.vcpus as usize);
    for (index, entries) in meta.cpuid.iter().enumerate() {
        let vcpu = vm
            .create_vcpu(index as u64)
            .map_err(ioctl("KVM_CREATE_VCPU"))?;
        set_cpuid(&vcpu, entries)?;
        vcpus.push(vcpu);
    }
    super::finish(kvm, vm, vcpus, dirty, memory, memfd)
}

/// Takes the time a restored VM spent saved out of its guest's clock. On a KVM that
/// honours the restored TSC (it continues from the saved value) there is nothing to
/// take; on kvm_pvm the guest's TSC is the host's, and neither `KVM_SET_MSRS` of
/// IA32_TSC nor `KVM_VCPU_TSC_OFFSET` changes what the guest reads
/// (docs/migration.md), so vCPU 0's TSC now, less `saved`, is added to the guest's
/// clock offset word (`layout::CLOCK_OFFSET`), which kumo's guest subtracts. `saved`
/// is the latest TSC any vCPU saved: the clock resumes there, so no vCPU reads a time
/// earlier than one it read before the snapshot.
fn continue_clock(vm: &Vm, saved: u64) -> Result<(), Error> {
    let Some(fd) = vm.vcpus.first() else {
        return Ok(());
    };
    let now = state::get_msrs(fd, &[state::MSR_IA32_TSC])?
        .first()
        .map(|m| m.data)
        .ok_or_else(|| Error::Migration("KVM_GET_MSRS returned no TSC".into()))?;
    let away = now.saturating_sub(saved);
    let at = GuestAddress(crate::layout::CLOCK_OFFSET);
    let offset: u64 = vm
        .memory
        .read_obj(at)
        .map_err(|e| Error::GuestMemory(e.to_string()))?;
    vm.memory
        .write_obj(offset.wrapping_add(away), at)
        .map_err(|e| Error::GuestMemory(e.to_string()))?;
    tracing::debug!("the guest's clock leaves out {away} TSC ticks spent saved");
    Ok(())
}

/// Puts the saved irqchip, clock, vCPU and device state into a created VM.
fn apply(
    vm: &mut Vm,
    vcpus: &[VcpuState],
    vm_state: &VmState,
    devices: DeviceStates,
) -> Result<(), Error> {
    state::restore_vm(&vm.vm, vm_state)?;
    tracing::debug!("irqchip and clock restored");
    let xsave_size = usize::try_from(vm._kvm.check_extension_int(Cap::Xsave2)).unwrap_or(0);
    for (index, (fd, saved)) in vm.vcpus.iter().zip(vcpus).enumerate() {
        state::restore_vcpu(fd, saved, xsave_size)
            .map_err(|e| Error::Migration(format!("restoring vCPU {index}: {e}")))?;
    }
    // The PCI bus is rebuilt by whoever plugs devices in before `run`; its state is
    // checked against it there.
    tracing::debug!("vCPUs restored");
    vm.devices.restore_from(devices);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroing_ram_on_huge_pages_keeps_every_page() {
        if crate::machine::free_huge_pages() < 1 {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "no free huge page but CI=true: .ci/run must reserve them"
            );
            eprintln!("SKIPPED: no free 2 MiB huge page");
            return;
        }
        let (memory, _memfd) = crate::machine::create_memory(2 << 20, true).unwrap();
        let taken = crate::machine::free_huge_pages();
        memory
            .write_slice(&[0xab; stream::PAGE_SIZE], GuestAddress(0))
            .unwrap();
        let mut zeros = ZeroRun::new(true);
        for p in 0..512 {
            zeros.add(&memory, p * stream::PAGE_SIZE as u64).unwrap();
        }
        zeros.flush(&memory).unwrap();
        // A hole over the whole huge page would have handed it back to the pool (read
        // before the page is touched again, which would fault a page back in).
        assert_eq!(crate::machine::free_huge_pages(), taken);
        let mut bytes = [0xffu8; stream::PAGE_SIZE];
        memory.read_slice(&mut bytes, GuestAddress(0)).unwrap();
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn runs_of_zero_pages_are_zeroed_and_nothing_else() {
        let (memory, _memfd) = crate::machine::create_memory(1 << 20, false).unwrap();
        let page = stream::PAGE_SIZE as u64;
        for p in 0..6 {
            memory
                .write_slice(&[0xab; stream::PAGE_SIZE], GuestAddress(p * page))
                .unwrap();
        }
        // Holes (4-KiB RAM) and written zeros (huge pages) read the same.
        for keep_pages in [false, true] {
            let mut zeros = ZeroRun::new(keep_pages);
            // Pages 1 and 2 are one run; page 4 starts another.
            for p in [1, 2, 4] {
                zeros.add(&memory, p * page).unwrap();
            }
            zeros.flush(&memory).unwrap();
            for p in 0..6 {
                let mut bytes = [0u8; stream::PAGE_SIZE];
                memory
                    .read_slice(&mut bytes, GuestAddress(p * page))
                    .unwrap();
                let want = if [1, 2, 4].contains(&p) { 0 } else { 0xab };
                assert!(bytes.iter().all(|&b| b == want), "page {p}");
                memory
                    .write_slice(&[0xab; stream::PAGE_SIZE], GuestAddress(p * page))
                    .unwrap();
            }
        }
    }
}
