//! vCPU, VM and device state as plain serde structs, and the KVM calls that take and
//! put them. The order of the restore calls follows what was verified on this host
//! (`../shared/platform/kvm-probe/q8_migrate.c`): MP state, registers, XSAVE (which
//! holds the FPU/SSE state), XCRs, debug registers, LAPIC, then MSRs (TSC first, the
//! TSC deadline last: it needs the LAPIC in TSC-deadline mode and the TSC it is
//! relative to), then pending events.

use devices::boot_timer::BootTimerState;
use devices::pci::PciBusState;
use devices::serial::Com1State;
use kvm_bindings::{
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, Msrs, kvm_clock_data,
    kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use kvm_ioctls::{VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::kvm::ioctl;

pub const MSR_IA32_TSC: u32 = 0x10;
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

/// One vCPU, everything KVM keeps for it.
#[derive(Debug, Serialize, Deserialize)]
pub struct VcpuState {
    pub regs: kvm_regs,
    pub sregs: kvm_sregs,
    pub xsave: kvm_xsave,
    pub xcrs: kvm_xcrs,
    pub lapic: kvm_lapic_state,
    pub msrs: Vec<kvm_msr_entry>,
    pub events: kvm_vcpu_events,
    pub mp_state: kvm_mp_state,
    pub debugregs: kvm_debugregs,
    /// KVM_GET_TSC_KHZ (0 if it failed); a destination at another rate scales to it.
    pub tsc_khz: u32,
}

impl VcpuState {
    /// The guest's TSC when the vCPU was saved.
    pub fn tsc(&self) -> Option<u64> {
        self.msrs
            .iter()
            .find(|m| m.index == MSR_IA32_TSC)
            .map(|m| m.data)
    }
}

/// The VM: in-kernel irqchip and the KVM clock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmState {
    pub clock: kvm_clock_data,
    pub pic_master: kvm_irqchip,
    pub pic_slave: kvm_irqchip,
    pub ioapic: kvm_irqchip,
}

/// kumo's devices: COM1, the boot timer, the PCI configuration ports and bus 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStates {
    pub com1: Com1State,
    pub boot_timer: BootTimerState,
    pub pci_address: u32,
    pub pci: PciBusState,
}

/// The MSRs to save: KVM's list, plus the TSC deadline, less any this vCPU refuses.
pub(crate) fn msr_indices(kvm: &kvm_ioctls::Kvm) -> Vec<u32> {
    let mut list: Vec<u32> = match kvm.get_msr_index_list() {
        Ok(l) => l.as_slice().to_vec(),
        Err(e) => {
            tracing::warn!("KVM_GET_MSR_INDEX_LIST failed ({e}); saving only the TSC MSRs");
            vec![MSR_IA32_TSC]
        }
    };
    if !list.contains(&MSR_IA32_TSC_DEADLINE) {
        list.push(MSR_IA32_TSC_DEADLINE);
    }
    // TSC first and the deadline last (see the module comment).
    list.sort_by_key(|&i| match i {
        MSR_IA32_TSC => 0,
        MSR_IA32_TSC_DEADLINE => 2,
        _ => 1,
    });
    list
}

fn msrs_of(entries: &[kvm_msr_entry]) -> Result<Msrs, Error> {
    Msrs::from_entries(entries).map_err(|_| Error::Kvm {
        ioctl: "KVM_GET_MSRS",
        source: kvm_ioctls::Error::new(libc::E2BIG),
    })
}

/// Reads the MSRs in `indices` that this vCPU has; an index KVM refuses is dropped
/// (KVM_GET_MSRS stops at the first one it cannot read).
pub(crate) fn get_msrs(vcpu: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, Error> {
    let mut wanted: Vec<kvm_msr_entry> = indices
        .iter()
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    let mut done = Vec::with_capacity(wanted.len());
    while !wanted.is_empty() {
        let mut msrs = msrs_of(&wanted)?;
        let n = vcpu.get_msrs(&mut msrs).map_err(ioctl("KVM_GET_MSRS"))?;
        done.extend_from_slice(&msrs.as_slice()[..n]);
        if n < wanted.len() {
            tracing::debug!("MSR {:#x} cannot be read; not saved", wanted[n].index);
            wanted.drain(..=n);
        } else {
            wanted.clear();
        }
    }
    Ok(done)
}

/// Takes a stopped vCPU's state (call on its own thread, outside KVM_RUN, after
/// any pending I/O completed).
pub(crate) fn save_vcpu(vcpu: &VcpuFd, msr_indices: &[u32]) -> Result<VcpuState, Error> {
    Ok(VcpuState {
        mp_state: vcpu.get_mp_state().map_err(ioctl("KVM_GET_MP_STATE"))?,
        regs: vcpu.get_regs().map_err(ioctl("KVM_GET_REGS"))?,
        sregs: vcpu.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?,
        xsave: vcpu.get_xsave().map_err(ioctl("KVM_GET_XSAVE"))?,
        xcrs: vcpu.get_xcrs().map_err(ioctl("KVM_GET_XCRS"))?,
        lapic: vcpu.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?,
        debugregs: vcpu.get_debug_regs().map_err(ioctl("KVM_GET_DEBUGREGS"))?,
        msrs: get_msrs(vcpu, msr_indices)?,
        events: vcpu
            .get_vcpu_events()
            .map_err(ioctl("KVM_GET_VCPU_EVENTS"))?,
        tsc_khz: vcpu.get_tsc_khz().unwrap_or(0),
    })
}

/// Puts a saved state into a vCPU that has not run. `xsave_size` is what
/// KVM_CAP_XSAVE2 reports (the size KVM_SET_XSAVE reads; 0 if the capability is absent).
pub(crate) fn restore_vcpu(
    vcpu: &VcpuFd,
    state: &VcpuState,
    xsave_size: usize,
) -> Result<(), Error> {
    if xsave_size > std::mem::size_of::<kvm_xsave>() {
        return Err(Error::Migration(format!(
            "this host's XSAVE area is {xsave_size} bytes; kumo restores the 4096-byte layout only"
        )));
    }
    if state.tsc_khz != 0 && vcpu.get_tsc_khz().ok() != Some(state.tsc_khz) {
        vcpu.set_tsc_khz(state.tsc_khz)
            .map_err(ioctl("KVM_SET_TSC_KHZ"))?;
    }
    vcpu.set_mp_state(resumed_mp_state(state.mp_state))
        .map_err(ioctl("KVM_SET_MP_STATE"))?;
    vcpu.set_regs(&state.regs).map_err(ioctl("KVM_SET_REGS"))?;
    vcpu.set_sregs(&state.sregs)
        .map_err(ioctl("KVM_SET_SREGS"))?;
    // SAFETY: KVM_SET_XSAVE reads the vCPU's XSAVE area size from the pointer, and
    // that size was checked above to be at most sizeof(kvm_xsave), the struct passed.
    unsafe { vcpu.set_xsave(&state.xsave) }.map_err(ioctl("KVM_SET_XSAVE"))?;
    vcpu.set_xcrs(&state.xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
    vcpu.set_debug_regs(&state.debugregs)
        .map_err(ioctl("KVM_SET_DEBUGREGS"))?;
    vcpu.set_lapic(&state.lapic)
        .map_err(ioctl("KVM_SET_LAPIC"))?;
    let msrs = msrs_of(&state.msrs)?;
    let n = vcpu.set_msrs(&msrs).map_err(ioctl("KVM_SET_MSRS"))?;
    if n != state.msrs.len() {
        return Err(Error::Migration(format!(
            "KVM refused MSR {:#x} of the saved state",
            state.msrs[n].index
        )));
    }
    vcpu.set_vcpu_events(&state.events)
        .map_err(ioctl("KVM_SET_VCPU_EVENTS"))?;
    if tracing::enabled!(tracing::Level::DEBUG)
        && let Some(saved) = state.msrs.iter().find(|m| m.index == MSR_IA32_TSC)
        && let Ok(now) = get_msrs(vcpu, &[MSR_IA32_TSC])
        && let Some(now) = now.first()
    {
        let khz = f64::from(state.tsc_khz.max(1));
        tracing::debug!(
            "restored TSC runs {:.3} ms ahead of the saved value",
            (now.data as f64 - saved.data as f64) / khz
        );
    }
    Ok(())
}

/// The state a saved vCPU resumes in: a halted one runnable, as if its `hlt` ended
/// spuriously. A wake-up in flight while the VM was saved (an IPI sent just before the
/// pause) can otherwise be lost, leaving it halted for good with its word already
/// changed (seen: a ballooned VM saved as its master released the fork barrier, five
/// vCPUs halted, restored: the release never reached them; cause not found, the saved
/// LAPIC state is KVM's). The only guest kumo restores, its own, halts only in loops
/// that re-check what they wait for (an interrupt can end a `hlt` for unrelated
/// reasons), so the cost is one more check per halted vCPU.
fn resumed_mp_state(saved: kvm_mp_state) -> kvm_mp_state {
    if saved.mp_state == kvm_bindings::KVM_MP_STATE_HALTED {
        kvm_mp_state {
            mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
        }
    } else {
        saved
    }
}

fn irqchip(vm: &VmFd, chip_id: u32) -> Result<kvm_irqchip, Error> {
    let mut chip = kvm_irqchip {
        chip_id,
        ..Default::default()
    };
    vm.get_irqchip(&mut chip)
        .map_err(ioctl("KVM_GET_IRQCHIP"))?;
    Ok(chip)
}

/// Takes the VM's irqchip and clock (every vCPU stopped).
pub(crate) fn save_vm(vm: &VmFd) -> Result<VmState, Error> {
    Ok(VmState {
        clock: vm.get_clock().map_err(ioctl("KVM_GET_CLOCK"))?,
        pic_master: irqchip(vm, KVM_IRQCHIP_PIC_MASTER)?,
        pic_slave: irqchip(vm, KVM_IRQCHIP_PIC_SLAVE)?,
        ioapic: irqchip(vm, KVM_IRQCHIP_IOAPIC)?,
    })
}

/// Puts the irqchip and clock back (before the vCPUs' state).
pub(crate) fn restore_vm(vm: &VmFd, state: &VmState) -> Result<(), Error> {
    // Only the clock value: the flags KVM_GET_CLOCK reports are not all settable.
    let clock = kvm_clock_data {
        clock: state.clock.clock,
        ..Default::default()
    };
    vm.set_clock(&clock).map_err(ioctl("KVM_SET_CLOCK"))?;
    for (chip, id) in [
        (&state.pic_master, KVM_IRQCHIP_PIC_MASTER),
        (&state.pic_slave, KVM_IRQCHIP_PIC_SLAVE),
        (&state.ioapic, KVM_IRQCHIP_IOAPIC),
    ] {
        if chip.chip_id != id {
            return Err(Error::Migration(format!(
                "irqchip state {} saved where chip {id} belongs",
                chip.chip_id
            )));
        }
        vm.set_irqchip(chip).map_err(ioctl("KVM_SET_IRQCHIP"))?;
    }
    Ok(())
}

#[cfg(test)]
mod resume_tests {
    use super::*;

    #[test]
    fn a_halted_vcpu_resumes_runnable_and_other_states_are_kept() {
        let state = |mp_state| kvm_mp_state { mp_state };
        let halted = state(kvm_bindings::KVM_MP_STATE_HALTED);
        assert_eq!(
            resumed_mp_state(halted).mp_state,
            kvm_bindings::KVM_MP_STATE_RUNNABLE
        );
        for kept in [
            kvm_bindings::KVM_MP_STATE_RUNNABLE,
            kvm_bindings::KVM_MP_STATE_UNINITIALIZED,
            kvm_bindings::KVM_MP_STATE_INIT_RECEIVED,
        ] {
            assert_eq!(resumed_mp_state(state(kept)).mp_state, kept);
        }
    }
}
