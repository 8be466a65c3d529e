//! A built VM (see `crate::builder`) and how it runs: its devices start, one thread
//! per vCPU, and the coordinator (`crate::coordinator`) decides when it ends.

use std::fs::File;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use devices::pci::PciDevice;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use crate::bar_windows::HostWindow;
use crate::coordinator::{Coordinator, DeviceHealth, Unwake};
use crate::device_manager::DeviceManager;
use crate::halt::ConsoleTail;
use crate::irq::{EventLoop, GsiRouter};
use crate::kick;
use crate::migration::Hub;
use crate::placement::VcpuControl;
use crate::stop::{self, RunLimits};
use crate::vcpu::{self, Shared, ToCoordinator};
use crate::{Error, GuestExit, RunOutcome};
use devices::interrupt::MsiMessage;

/// A created VM, ready to run.
pub struct Vm {
    // Field order is drop order: vCPUs before the VM before KVM; memory last.
    pub(crate) vcpus: Vec<VcpuFd>,
    /// Shared with the interrupt paths (event loop, GSI router), which may hold it
    /// until they are dropped.
    pub(crate) vm: Arc<VmFd>,
    pub(crate) control: Arc<VcpuControl>,
    pub(crate) limits: RunLimits,
    /// PCI bus 0, BAR placement, GSI routing, and the port devices' state.
    pub(crate) devices: DeviceManager,
    /// Pausing and saving the running VM (snapshots, migration).
    pub(crate) hub: Arc<Hub>,
    /// Devices outside kumo report here that they failed; the run then ends.
    pub(crate) health: Arc<DeviceHealth>,
    pub(crate) _kvm: Kvm,
    pub(crate) memory: GuestMemoryMmap,
    pub(crate) memfd: File,
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm")
            .field("vcpus", &self.vcpus.len())
            .field("memory", &self.memory.last_addr())
            .finish()
    }
}

impl Vm {
    /// A VM of these parts with its (empty) PCI bus wired to KVM: doorbells as
    /// ioeventfds, direct windows as memory slots.
    pub(crate) fn assemble(
        kvm: Kvm,
        vm: Arc<VmFd>,
        vcpus: Vec<VcpuFd>,
        control: Arc<VcpuControl>,
        hub: Arc<Hub>,
        memory: GuestMemoryMmap,
        memfd: File,
    ) -> Vm {
        Vm {
            vcpus,
            devices: DeviceManager::new(&vm),
            vm,
            control,
            limits: stop::default_limits(),
            hub,
            health: Arc::new(DeviceHealth::default()),
            _kvm: kvm,
            memory,
            memfd,
        }
    }

    /// Where a device served outside kumo reports its failure (the coordinator is woken
    /// and ends the run with that report).
    pub fn device_health(&self) -> Arc<DeviceHealth> {
        self.health.clone()
    }

    /// The memfd behind guest RAM (each region's offset in it: [`crate::memory_map::ram_regions`]).
    pub fn memory_fd(&self) -> &File {
        &self.memfd
    }

    /// Guest RAM.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    /// Pinning, ranking and parking of this VM's vCPU threads (usable once `run` has
    /// started them; see [`VcpuControl::wait_started`]).
    pub fn control(&self) -> Arc<VcpuControl> {
        self.control.clone()
    }

    /// Pauses and saves this VM while it runs (snapshots, migration).
    pub fn migration_hub(&self) -> Arc<Hub> {
        self.hub.clone()
    }

    /// Starts the generic interrupt path's event-loop thread for this VM.
    pub fn start_event_loop(&self) -> Result<EventLoop, Error> {
        EventLoop::start(self.vm.clone())
    }

    /// As [`Vm::start_event_loop`], the loop thread a member of `dom0`.
    pub fn start_event_loop_in(
        &self,
        dom0: Option<Arc<crate::placement::ThreadGroup>>,
    ) -> Result<EventLoop, Error> {
        EventLoop::start_in(self.vm.clone(), dom0)
    }

    /// Injects `msi` now, from this thread (`KVM_SIGNAL_MSI`; what the event loop does
    /// for each queued interrupt). `Ok(false)`: coalesced or blocked by the guest.
    pub fn signal_msi(&self, msi: MsiMessage) -> Result<bool, Error> {
        crate::irq::signal_msi(&self.vm, msi)
    }

    /// The fast path's GSI routing table for this VM (make one per VM).
    pub fn gsi_router(&self) -> Arc<GsiRouter> {
        self.devices.gsi_router()
    }

    /// Plugs a device into PCI bus 0 (before `run`); returns its slot.
    pub fn add_pci_device(&mut self, device: Arc<dyn PciDevice>) -> Result<u8, Error> {
        self.devices.add_pci_device(device)
    }

    /// A guest-physical address for a memory BAR of `size` bytes, as firmware would
    /// assign it (the guest keeps what it finds).
    pub fn allocate_bar(&mut self, size: u64) -> Result<u64, Error> {
        self.devices.allocate_bar(size)
    }

    /// Plugs a device into PCI bus 0 (before `run`) with its doorbells served in the
    /// kernel: a guest write to doorbell `id` signals `doorbells[id]` without an exit,
    /// wherever the device's BAR decodes at the time and nowhere while it does not
    /// (KVM ioeventfds kept in step with the BARs by the bus). Returns its slot.
    pub fn add_pci_device_with_doorbells(
        &mut self,
        device: Arc<dyn PciDevice>,
        doorbells: Vec<EventFd>,
    ) -> Result<u8, Error> {
        self.add_pci_device_wired(device, doorbells, Vec::new())
    }

    /// As [`Vm::add_pci_device_with_doorbells`], and the device's direct window `id`
    /// is `windows[id]`: mapped into the guest as memory wherever its BAR decodes (a
    /// KVM memory slot moved with the BAR), so guest accesses there never exit.
    pub fn add_pci_device_wired(
        &mut self,
        device: Arc<dyn PciDevice>,
        doorbells: Vec<EventFd>,
        windows: Vec<HostWindow>,
    ) -> Result<u8, Error> {
        self.devices
            .add_pci_device_wired(device, doorbells, windows)
    }

    /// Sets the run's time limit and watchdog bound (default: the process's
    /// [`stop::default_limits`]).
    pub fn set_limits(&mut self, limits: RunLimits) {
        self.limits = limits;
    }

    pub fn vcpu_count(&self) -> u32 {
        self.vcpus.len() as u32
    }

    /// Runs one thread per vCPU (`vcpu0`, `vcpu1`, ...) until the guest writes the
    /// debug-exit port or faults; then stops every other vCPU and returns. COM1 output
    /// goes to `console`, which is dropped before this returns. `epoch` is the start
    /// of kumo, for `workload_started`.
    pub fn run(
        self,
        console: Box<dyn std::io::Write + Send>,
        epoch: Instant,
    ) -> Result<RunOutcome, Error> {
        tracing::debug!("boot: devices attached, the VM runs");
        kick::install_kick_handler()?;
        // Everything that ends the run reaches the coordinator here: vCPU ends, stop
        // requests and device failures (the last two as a request to look now).
        let (tx, rx) = mpsc::channel();
        let look = tx.clone();
        let _running = stop::Running::enter(Box::new(move || {
            let _ = look.send(ToCoordinator::Look);
        }));
        self.health.set_wake(Some(tx.clone()));
        let _unwake = Unwake(self.health.clone());
        // The console's last line, for the report on a guest that halted for good.
        let tail = ConsoleTail::default();
        let devices = self.devices.start(tail.wrap(console), &self.hub)?;
        tracing::debug!("boot: platform devices started");
        let shared = Arc::new(Shared::new(
            devices.bus,
            devices.pci,
            self.control.clone(),
            self.hub.clone(),
            self.memory.clone(),
        ));
        let (handles, spawn_error) = spawn_vcpus(self.vcpus, &shared, &tx);
        tracing::debug!("vCPU threads started");
        drop(tx);
        // The coordinator has a thread of its own, so that its filter confines only
        // this VM's steady state (the caller may build more VMs after this one).
        let (control, health, hub, limits) = (&self.control, &self.health, &self.hub, self.limits);
        let decision = std::thread::scope(|scope| {
            let coordinator = std::thread::Builder::new()
                .name("coordinator".into())
                .spawn_scoped(scope, || {
                    crate::seccomp::apply_or_exit(crate::seccomp::ThreadKind::Coordinator);
                    let mut coordinator =
                        Coordinator::new(rx, &shared, control, health, &tail, handles);
                    let decision = coordinator.decide(limits, spawn_error);
                    coordinator.stop_all(hub);
                    decision
                })
                .map_err(|source| Error::Os {
                    what: "spawning the coordinator thread",
                    source,
                })?;
            // The calling thread may be domain 0's: it sleeps here for the whole run.
            crate::presence::asleep(|| coordinator.join()).unwrap_or_else(|_| {
                Err(Error::Os {
                    what: "the coordinator thread",
                    source: std::io::Error::other("it panicked"),
                })
            })
        });

        let workload_started = devices
            .timer
            .first_mark()
            .map(|t| t.saturating_duration_since(epoch));
        devices.com1.flush();
        drop(devices.com1.take_writer());
        let exit = decision?;
        match &exit {
            GuestExit::DebugExit(v) => tracing::debug!("guest exited with {v:#x}"),
            GuestExit::Fault(r) => tracing::debug!("guest fault: {}", r.reason),
            GuestExit::HandedOff => tracing::debug!("the VM was handed off"),
            GuestExit::Stopped(cause) => tracing::debug!("VM stopped: {cause}"),
        }
        Ok(outcome(
            exit,
            workload_started,
            &self.control,
            &self.vm,
            &shared,
        ))
    }
}

/// Starts one thread per vCPU (`vcpu0`, `vcpu1`, ...); stops at the first that cannot
/// be started and returns that error beside the threads that run.
fn spawn_vcpus(
    vcpus: Vec<VcpuFd>,
    shared: &Arc<Shared>,
    tx: &mpsc::Sender<ToCoordinator>,
) -> (Vec<JoinHandle<()>>, Option<Error>) {
    let mut handles = Vec::with_capacity(vcpus.len());
    for (index, fd) in vcpus.into_iter().enumerate() {
        let index = index as u32;
        let shared = shared.clone();
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("vcpu{index}"))
            .spawn(move || vcpu::thread_main(index, fd, shared, tx));
        match spawned {
            Ok(h) => handles.push(h),
            Err(source) => {
                return (
                    handles,
                    Some(Error::Os {
                        what: "spawning a vCPU thread",
                        source,
                    }),
                );
            }
        }
    }
    (handles, None)
}

/// What a run that ended with `exit` reports: each vCPU's CPU time and run delay,
/// its paravirtual waits and KVM's counters.
fn outcome(
    exit: GuestExit,
    workload_started: Option<Duration>,
    control: &VcpuControl,
    vm: &VmFd,
    shared: &Shared,
) -> RunOutcome {
    let vcpu_cpu_time = (0..control.vcpus())
        .map(|v| control.cpu_time(v).unwrap_or_default())
        .collect();
    let vcpu_run_delay = (0..control.vcpus()).map(|v| control.run_delay(v)).collect();
    let kvm_stats = crate::kvm_stats::KvmStats {
        vm: crate::kvm_stats::cumulative(vm).unwrap_or_else(|e| {
            tracing::debug!("no KVM statistics for the VM: {e}");
            Vec::new()
        }),
        vcpus: std::mem::take(&mut *shared.kvm_stats.lock().unwrap_or_else(|e| e.into_inner())),
    };
    RunOutcome {
        exit,
        workload_started,
        vcpu_cpu_time,
        vcpu_run_delay,
        pvwait: shared.pvwait.snapshot(),
        kvm_stats,
    }
}
