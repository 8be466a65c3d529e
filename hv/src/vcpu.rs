//! The vCPU thread: KVM_RUN and exit handling on the vCPU's own thread, and the kick
//! that stops it.
//!
//! Stopping protocol: the coordinator sets `Shared::stop`, then sends `kick_signal()`
//! to the thread (again every few ms until the thread reports back). The thread checks
//! `stop` before every KVM_RUN. The signal's handler sets `immediate_exit` in the
//! thread's own `kvm_run`, so a signal that lands between the check and the ioctl makes
//! KVM_RUN return EINTR at once instead of entering the guest; a signal that lands
//! inside KVM_RUN (running, halted, or waiting for SIPI) makes it return EINTR.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use devices::pci::PciBus;
use devices::{IoAction, PioBus};
use kvm_bindings::{KVM_EXIT_DIRTY_RING_FULL, KVM_EXIT_IO_IN, KVM_EXIT_IO_OUT, kvm_run};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::GuestMemoryMmap;

use crate::fault::{CpuMode, FaultReason, FaultReport, Registers};
use crate::kick;
use crate::kvm_stats::Counter;
use crate::placement::VcpuControl;
use crate::watchdog::Watch;
use crate::{Error, GuestExit};

/// State shared by all vCPU threads of a VM.
pub(crate) struct Shared {
    pub stop: AtomicBool,
    pub bus: PioBus,
    /// ECAM and the devices' memory BARs: every MMIO exit is theirs or unclaimed.
    pub pci: Arc<PciBus>,
    pub control: Arc<VcpuControl>,
    /// Pauses for snapshots and migration.
    pub hub: Arc<crate::migration::Hub>,
    /// Each vCPU's side of the watchdog (index = vCPU).
    pub watch: Vec<Watch>,
    /// Guest RAM, for the paravirtual wait page's futexes.
    pub memory: GuestMemoryMmap,
    pub pvwait: crate::pvwait::Counters,
    /// KVM's counters of each vCPU, read by its thread as it ends (index = vCPU).
    pub kvm_stats: Mutex<Vec<Vec<Counter>>>,
}

impl Shared {
    pub fn new(
        bus: PioBus,
        pci: Arc<PciBus>,
        control: Arc<VcpuControl>,
        hub: Arc<crate::migration::Hub>,
        memory: GuestMemoryMmap,
    ) -> Self {
        let watch = (0..control.vcpus()).map(|_| Watch::default()).collect();
        let kvm_stats = Mutex::new(vec![Vec::new(); control.vcpus()]);
        Self {
            stop: AtomicBool::new(false),
            bus,
            pci,
            control,
            hub,
            watch,
            memory,
            pvwait: crate::pvwait::Counters::default(),
            kvm_stats,
        }
    }

    /// Keeps what KVM counted for vCPU `index` (nothing where the kernel cannot say).
    fn record_kvm_stats(&self, index: u32, vcpu: &VcpuFd) {
        match crate::kvm_stats::cumulative(vcpu) {
            Ok(counters) => {
                let mut all = self.kvm_stats.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(slot) = all.get_mut(index as usize) {
                    *slot = counters;
                }
            }
            Err(e) => tracing::debug!("vCPU {index}: no KVM statistics: {e}"),
        }
    }
}

/// How a vCPU thread ended.
pub(crate) enum VcpuEnd {
    /// The guest ended the VM on this vCPU.
    Exit(GuestExit),
    /// kumo could not continue (a KVM ioctl failed).
    Error(Error),
    /// Stopped on request.
    Stopped,
}

/// What a VM's coordinator hears: a vCPU thread's end, or a request to look at the VM
/// now (a stop was requested or a device failed).
#[expect(
    clippy::large_enum_variant,
    reason = "a few messages per run: boxing the end would buy nothing"
)]
pub(crate) enum ToCoordinator {
    Ended(u32, VcpuEnd),
    Look,
}

/// Reports the thread's end exactly once, even if the thread panics.
struct Reporter {
    index: u32,
    tx: Sender<ToCoordinator>,
    sent: bool,
}

impl Reporter {
    fn send(mut self, end: VcpuEnd) {
        self.sent = true;
        let _ = self.tx.send(ToCoordinator::Ended(self.index, end));
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if !self.sent {
            let _ = self.tx.send(ToCoordinator::Ended(
                self.index,
                VcpuEnd::Error(Error::VcpuThread {
                    index: self.index,
                    why: "the thread panicked".into(),
                }),
            ));
        }
    }
}

pub(crate) fn thread_main(
    index: u32,
    mut vcpu: VcpuFd,
    shared: Arc<Shared>,
    tx: Sender<ToCoordinator>,
) {
    let reporter = Reporter {
        index,
        tx,
        sent: false,
    };
    let _ = vmm_sys_util::signal::unblock_signal(kick::kick_signal());
    kick::set_kvm_run(vcpu.get_kvm_run());
    // KVM's `blocking`: the credit driver's cheap look at whether this vCPU halted.
    let halted = crate::kvm_stats::InstantStat::open(&vcpu, "blocking");
    shared.control.register(index as usize, halted);
    // Set up: from here on the thread only runs the guest and serves its exits.
    let end = match crate::seccomp::apply(crate::seccomp::ThreadKind::Vcpu) {
        Ok(()) => run_loop(index, &mut vcpu, &shared),
        Err(e) => VcpuEnd::Error(e.into()),
    };
    shared.record_kvm_stats(index, &vcpu);
    kick::set_kvm_run(std::ptr::null_mut());
    shared.control.record_final_cpu_time(index as usize);
    // A scheduler may have pinned and ranked this thread: leaving like that, it would
    // wait behind the vCPU that now has its host CPU (and the VM's teardown with it).
    // Leave as an ordinary thread free to finish on any CPU.
    crate::placement::release_current_thread();
    reporter.send(end);
}

enum Step {
    Continue,
    Io,
    Fault(FaultReason),
    InternalError,
}

fn run_loop(index: u32, vcpu: &mut VcpuFd, shared: &Shared) -> VcpuEnd {
    let mut eagain: u32 = 0;
    let watch = &shared.watch[index as usize];
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return VcpuEnd::Stopped;
        }
        // Parked by a scheduler: wait outside the guest (not once the VM stops, nor
        // when a pause asks for the vCPU's state).
        shared
            .control
            .pass(index as usize, || shared.hub.pause_requested());
        // Paused for a snapshot or migration: saves its state here, on its own thread.
        if shared.hub.pause_requested() {
            if crate::presence::asleep(|| shared.hub.pause_point(index, vcpu)) {
                return VcpuEnd::Exit(GuestExit::HandedOff);
            }
            // Resumed: back through the gate (a parked vCPU paused at it).
            continue;
        }
        if shared.stop.load(Ordering::SeqCst) {
            return VcpuEnd::Stopped;
        }
        let exit = vcpu.run();
        if exit.is_ok() {
            watch.exit();
        }
        let step = match exit {
            Ok(VcpuExit::IoIn(..) | VcpuExit::IoOut(..)) => Step::Io,
            Ok(VcpuExit::MmioRead(addr, data)) => {
                if !shared.pci.mmio_read(addr, data) {
                    tracing::debug!(
                        vcpu = index,
                        "unclaimed MMIO read of {} bytes at {addr:#x}",
                        data.len()
                    );
                    data.fill(0xff);
                }
                Step::Continue
            }
            Ok(VcpuExit::MmioWrite(addr, data)) => {
                if crate::pvwait::claims(addr) {
                    crate::pvwait::write(
                        &shared.memory,
                        &shared.pvwait,
                        shared.control.pv_word(index as usize),
                        shared.control.host_cpus(),
                        addr,
                        data,
                    );
                } else if !shared.pci.mmio_write(addr, data) {
                    tracing::debug!(
                        vcpu = index,
                        "unclaimed MMIO write of {} bytes at {addr:#x}",
                        data.len()
                    );
                }
                Step::Continue
            }
            Ok(VcpuExit::Shutdown) => Step::Fault(FaultReason::TripleFault),
            Ok(VcpuExit::InternalError) => Step::InternalError,
            Ok(VcpuExit::FailEntry(hardware_reason, cpu)) => Step::Fault(FaultReason::FailEntry {
                hardware_reason,
                cpu,
            }),
            Ok(VcpuExit::Intr) => Step::Continue,
            Ok(VcpuExit::SystemEvent(kind, data)) => Step::Fault(FaultReason::UnhandledExit(
                format!("KVM_EXIT_SYSTEM_EVENT type {kind} data {data:x?}"),
            )),
            // KVM_EXIT_DIRTY_RING_FULL: the ring must be harvested before this vCPU
            // may run on (only a VM made with the dirty ring gets it).
            Ok(VcpuExit::Unsupported(KVM_EXIT_DIRTY_RING_FULL)) => {
                match shared.hub.dirty_ring_full() {
                    Ok(true) => Step::Continue,
                    Ok(false) => Step::Fault(FaultReason::UnhandledExit(
                        "KVM_EXIT_DIRTY_RING_FULL without a dirty ring".into(),
                    )),
                    Err(e) => Step::Fault(FaultReason::UnhandledExit(format!(
                        "harvesting the dirty ring failed: {e}"
                    ))),
                }
            }
            Ok(other) => Step::Fault(FaultReason::UnhandledExit(format!("{other:?}"))),
            Err(e) => match e.errno() {
                libc::EINTR => {
                    // A kick (or another signal). Re-arm before the stop check above.
                    vcpu.set_kvm_immediate_exit(0);
                    if watch.sample_requested() {
                        answer_sample(vcpu, watch);
                    }
                    Step::Continue
                }
                libc::EAGAIN => {
                    // An AP's first KVM_RUN after INIT-SIPI may say EAGAIN: retry.
                    eagain += 1;
                    if eagain > 16 {
                        std::thread::yield_now();
                    }
                    Step::Continue
                }
                errno => Step::Fault(FaultReason::RunFailed { errno }),
            },
        };
        match step {
            Step::Continue => {}
            Step::Io => {
                if let IoAction::Exit(v) = handle_io(vcpu.get_kvm_run(), &shared.bus) {
                    return VcpuEnd::Exit(GuestExit::DebugExit(v));
                }
            }
            Step::Fault(reason) => return fault(index, vcpu, reason),
            Step::InternalError => {
                let run = vcpu.get_kvm_run();
                // SAFETY: KVM_RUN just returned KVM_EXIT_INTERNAL_ERROR, so `internal` is
                // the active member of the exit union.
                let internal = unsafe { run.__bindgen_anon_1.internal };
                let n = (internal.ndata as usize).min(internal.data.len());
                let reason = FaultReason::InternalError {
                    suberror: internal.suberror,
                    data: internal.data[..n].to_vec(),
                };
                return fault(index, vcpu, reason);
            }
        }
    }
}

/// Port I/O, including `rep ins/outs` (count > 1): each element goes to the bus.
#[inline]
fn handle_io(run: &mut kvm_run, bus: &PioBus) -> IoAction {
    // SAFETY: KVM_RUN just returned KVM_EXIT_IO, so `io` is the active member.
    let io = unsafe { run.__bindgen_anon_1.io };
    let size = usize::from(io.size);
    let len = size * io.count as usize;
    let base = (run as *mut kvm_run).cast::<u8>();
    // SAFETY: for KVM_EXIT_IO the kernel puts `size * count` data bytes at `data_offset`
    // inside the vCPU's kvm_run mapping (KVM_GET_VCPU_MMAP_SIZE bytes, mapped for the
    // life of the VcpuFd); nothing else references those bytes while this slice lives.
    let data = unsafe { std::slice::from_raw_parts_mut(base.add(io.data_offset as usize), len) };
    if size == 0 {
        return IoAction::Continue;
    }
    let mut action = IoAction::Continue;
    match u32::from(io.direction) {
        KVM_EXIT_IO_OUT => {
            for chunk in data.chunks_exact(size) {
                if let IoAction::Exit(v) = bus.write(io.port, chunk) {
                    action = IoAction::Exit(v);
                    break;
                }
            }
        }
        KVM_EXIT_IO_IN => {
            for chunk in data.chunks_exact_mut(size) {
                bus.read(io.port, chunk);
            }
        }
        _ => {}
    }
    action
}

/// The watchdog's (and the halt detector's) sample: registers and whether the vCPU is
/// halted or has never been started.
fn answer_sample(vcpu: &VcpuFd, watch: &Watch) {
    let mp_state = vcpu.get_mp_state().map(|s| s.mp_state).ok();
    let halted = mp_state == Some(kvm_bindings::KVM_MP_STATE_HALTED);
    let waiting_for_sipi = matches!(
        mp_state,
        Some(kvm_bindings::KVM_MP_STATE_UNINITIALIZED | kvm_bindings::KVM_MP_STATE_INIT_RECEIVED)
    );
    match registers(vcpu) {
        Ok(registers) => watch.answer(halted, waiting_for_sipi, registers),
        Err(e) => tracing::debug!("watchdog sample failed: {e}"),
    }
}

fn fault(index: u32, vcpu: &VcpuFd, reason: FaultReason) -> VcpuEnd {
    let registers = registers(vcpu);
    VcpuEnd::Exit(GuestExit::Fault(FaultReport {
        reason,
        vcpu: index,
        registers,
    }))
}

fn registers(vcpu: &VcpuFd) -> Result<Registers, String> {
    let r = vcpu
        .get_regs()
        .map_err(|e| format!("KVM_GET_REGS failed: {e}"))?;
    let s = vcpu
        .get_sregs()
        .map_err(|e| format!("KVM_GET_SREGS failed: {e}"))?;
    Ok(Registers {
        gprs: [
            r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp, r.r8, r.r9, r.r10, r.r11, r.r12,
            r.r13, r.r14, r.r15,
        ],
        rip: r.rip,
        rsp: r.rsp,
        rflags: r.rflags,
        cr0: s.cr0,
        cr2: s.cr2,
        cr3: s.cr3,
        cr4: s.cr4,
        efer: s.efer,
        cs: s.cs.selector,
        cpl: if s.cr0 & 1 != 0 {
            (s.cs.selector & 3) as u8
        } else {
            0
        },
        mode: Some(CpuMode::from_state(
            s.cr0,
            s.efer,
            r.rflags,
            s.cs.l != 0,
            s.cs.db != 0,
        )),
    })
}
