//! VM creation and the run coordinator.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use devices::boot_timer::BOOT_TIMER_PORT;
use devices::debug_exit::{DEBUG_EXIT_LEN, DEBUG_EXIT_PORT};
use devices::pci::{BarAllocator, ConfigPorts, PciBus, PciDevice};
use devices::serial::{COM1_LEN, COM1_PORT};
use devices::{BootTimer, Com1, DebugExit, PioBus, PioRange};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::Killable;

use crate::bar_windows::{HostWindow, MemoryWindows};
use crate::doorbells::IoEventWiring;
use crate::halt::{self, ConsoleTail, HaltDetector, HaltVerdict};
use crate::irq::{EventLoop, GsiRouter, Msi};
use crate::kick;
use crate::layout::*;
use crate::migration::{DeviceStates, Hub};
use crate::placement::VcpuControl;
use crate::stop::{self, RunLimits, StopCause};
use crate::vcpu::{self, Shared, ToCoordinator, VcpuEnd};
use crate::watchdog::{Observation, Verdict, Watchdog};
use crate::{Error, FaultReason, FaultReport, GuestExit, RunOutcome};

/// A created VM, ready to run.
pub struct Vm {
    // Field order is drop order: vCPUs before the VM before KVM; memory last.
    pub(crate) vcpus: Vec<VcpuFd>,
    /// Shared with the interrupt paths (event loop, GSI router), which may hold it
    /// until they are dropped.
    pub(crate) vm: Arc<VmFd>,
    pub(crate) control: Arc<VcpuControl>,
    pub(crate) limits: RunLimits,
    /// Bus 0 and the window its BARs are placed in, filled before `run`.
    pub(crate) pci: PciBus,
    /// The eventfds behind devices' doorbells, wired where their BARs decode.
    pub(crate) doorbells: Arc<IoEventWiring>,
    /// Devices' direct windows, mapped as memory slots where their BARs decode.
    pub(crate) windows: Arc<MemoryWindows>,
    /// The VM's one GSI routing table: every fast-path vector of every device has its
    /// own GSI in it (KVM_SET_GSI_ROUTING replaces the whole table).
    pub(crate) gsi: Arc<GsiRouter>,
    pub(crate) bar_window: BarAllocator,
    /// Pausing and saving the running VM (snapshots, migration).
    pub(crate) hub: Arc<Hub>,
    /// Device state a restored VM's devices start from (see `crate::migration`).
    pub(crate) restored: Option<DeviceStates>,
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

/// The first failure of a device of the VM that lives outside kumo (a passthrough
/// device's process died or stopped answering).
#[derive(Default)]
pub struct DeviceHealth {
    failed: std::sync::Mutex<Option<String>>,
    /// Wakes the running VM's coordinator, which does not poll for failures.
    wake: std::sync::Mutex<Option<mpsc::Sender<ToCoordinator>>>,
}

impl std::fmt::Debug for DeviceHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceHealth")
            .field("failed", &self.failure())
            .finish()
    }
}

impl DeviceHealth {
    /// Records `why` (the first report wins) and has the VM's coordinator look at it.
    pub fn fail(&self, why: String) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        failed.get_or_insert(why);
        drop(failed);
        if let Some(tx) = &*self.wake.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = tx.send(ToCoordinator::Look);
        }
    }

    fn set_wake(&self, tx: Option<mpsc::Sender<ToCoordinator>>) {
        *self.wake.lock().unwrap_or_else(|e| e.into_inner()) = tx;
    }

    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Takes the coordinator's channel back from the VM's device health when the run ends.
struct Unwake(Arc<DeviceHealth>);

impl Drop for Unwake {
    fn drop(&mut self) {
        self.0.set_wake(None);
    }
}

/// How long the coordinator waits between kicks of vCPUs that have not stopped yet.
const REKICK: Duration = Duration::from_millis(10);

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
        let doorbells = Arc::new(IoEventWiring::new(vm.clone()));
        let windows = Arc::new(MemoryWindows::new(vm.clone()));
        let mut pci = PciBus::new(PCI_ECAM_BASE);
        pci.set_doorbell_wiring(doorbells.clone());
        pci.set_window_wiring(windows.clone());
        Vm {
            vcpus,
            gsi: GsiRouter::new(vm.clone()),
            vm,
            control,
            limits: stop::default_limits(),
            pci,
            doorbells,
            windows,
            bar_window: BarAllocator::new(PCI_MMIO_START, PCI_MMIO_END),
            hub,
            restored: None,
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
    pub fn signal_msi(&self, msi: Msi) -> Result<bool, Error> {
        crate::irq::signal_msi(&self.vm, msi)
    }

    /// The fast path's GSI routing table for this VM (make one per VM).
    pub fn gsi_router(&self) -> Arc<GsiRouter> {
        self.gsi.clone()
    }

    /// Plugs a device into PCI bus 0 (before `run`); returns its slot.
    pub fn add_pci_device(&mut self, device: Arc<dyn PciDevice>) -> Result<u8, Error> {
        self.pci
            .add(device)
            .map_err(|e| Error::Device(e.to_string()))
    }

    /// A guest-physical address for a memory BAR of `size` bytes, as firmware would
    /// assign it (the guest keeps what it finds).
    pub fn allocate_bar(&mut self, size: u64) -> Result<u64, Error> {
        self.bar_window
            .allocate(size)
            .map_err(|e| Error::Device(e.to_string()))
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
        let slot = self
            .pci
            .free_slot()
            .ok_or_else(|| Error::Device(devices::pci::PciError::Full.to_string()))?;
        for (id, fd) in doorbells.into_iter().enumerate() {
            self.doorbells.provide(slot, id as u32, fd);
        }
        for (id, window) in windows.into_iter().enumerate() {
            self.windows.provide(slot, id as u32, window);
        }
        self.add_pci_device(device)
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
        let pci = Arc::new(self.pci);
        let ports = Arc::new(ConfigPorts::new(pci.clone()));
        // The console's last line, for the report on a guest that halted for good.
        let tail = ConsoleTail::default();
        let console = tail.wrap(console);
        let (com1, timer) = match &self.restored {
            None => (Com1::new(console), BootTimer::new()),
            Some(saved) => {
                let bad = |e: devices::DeviceStateError| Error::Migration(e.to_string());
                pci.restore_state(&saved.pci).map_err(bad)?;
                ports.set_address(saved.pci_address);
                (
                    Com1::from_state(console, &saved.com1).map_err(bad)?,
                    BootTimer::from_state(&saved.boot_timer),
                )
            }
        };
        let (com1, timer) = (Arc::new(com1), Arc::new(timer));
        self.hub.attach(crate::migration::Devices {
            com1: com1.clone(),
            timer: timer.clone(),
            ports: ports.clone(),
            pci: pci.clone(),
        });
        let mut bus = PioBus::new();
        let devices: [(u16, u16, Arc<dyn devices::PioDevice>); 4] = [
            (COM1_PORT, COM1_LEN, com1.clone()),
            (DEBUG_EXIT_PORT, DEBUG_EXIT_LEN, Arc::new(DebugExit)),
            (BOOT_TIMER_PORT, 1, timer.clone()),
            (
                devices::pci::bus::CONFIG_PORTS_BASE,
                devices::pci::bus::CONFIG_PORTS_LEN,
                ports,
            ),
        ];
        for (base, len, device) in devices {
            bus.insert(PioRange::new(base, len), device)
                .expect("the fixed port map does not overlap");
        }
        let hub = self.hub.clone();
        let shared = Arc::new(Shared::new(
            bus,
            pci,
            self.control.clone(),
            hub.clone(),
            self.memory.clone(),
        ));
        let count = self.vcpus.len();
        let mut handles = Vec::with_capacity(count);
        let mut spawn_error = None;
        for (index, fd) in self.vcpus.into_iter().enumerate() {
            let index = index as u32;
            let shared = shared.clone();
            let tx = tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || vcpu::thread_main(index, fd, shared, tx));
            match spawned {
                Ok(h) => handles.push(h),
                Err(source) => {
                    spawn_error = Some(Error::Os {
                        what: "spawning a vCPU thread",
                        source,
                    });
                    break;
                }
            }
        }
        drop(tx);

        // The first vCPU to end the VM decides the outcome, unless kumo ends it first:
        // a stop request (signal), the time limit or the watchdog.
        let mut ended = vec![false; handles.len()];
        let mut remaining = handles.len();
        let mut decision: Option<Result<GuestExit, Error>> = spawn_error.map(Err);
        let started = Instant::now();
        let mut watchdog = self
            .limits
            .watchdog
            .map(|bound| (Watchdog::new(count, bound), started));
        // The watchdog, if any, needs a look every period.
        let dog_period = watchdog.as_ref().map(|(w, _)| w.period());
        let pace = |poll: Duration| dog_period.map_or(poll, |period| period.min(poll));
        let mut poll = pace(stop::POLL);
        let mut halts = HaltDetector::default();
        while decision.is_none() {
            let wait = match self.limits.timeout {
                Some(limit) => poll.min(limit.saturating_sub(started.elapsed())),
                None => poll,
            };
            match rx.recv_timeout(wait) {
                Ok(ToCoordinator::Ended(index, end)) => {
                    ended[index as usize] = true;
                    remaining -= 1;
                    match end {
                        VcpuEnd::Exit(exit) => decision = Some(Ok(exit)),
                        VcpuEnd::Error(e) => decision = Some(Err(e)),
                        VcpuEnd::Stopped => {}
                    }
                }
                Ok(ToCoordinator::Look) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Not while this run's stop registration holds a sender; kept for safety.
                Err(mpsc::RecvTimeoutError::Disconnected) => remaining = 0,
            }
            // Every vCPU stopped without deciding (the channel stays open: the stop
            // registration and the device health hold senders).
            if decision.is_none() && remaining == 0 {
                decision = Some(Err(Error::VcpuThread {
                    index: 0,
                    why: "every vCPU thread ended without an outcome".into(),
                }));
            }
            if decision.is_some() {
                break;
            }
            if let Some(signal) = stop::requested() {
                decision = Some(Ok(GuestExit::Stopped(StopCause::Signal(signal))));
            } else if let Some(why) = self.health.failure() {
                decision = Some(Err(Error::Device(why)));
            } else if let Some(limit) = self.limits.timeout
                && started.elapsed() >= limit
            {
                decision = Some(Ok(GuestExit::Stopped(StopCause::Timeout(limit))));
            } else {
                let seen = observe(&shared, &self.control);
                if let Some((dog, next)) = &mut watchdog
                    && Instant::now() >= *next
                {
                    *next = Instant::now() + dog.period();
                    decision = watch(dog, &seen, &shared, &handles).map(Ok);
                }
                if decision.is_none() {
                    decision = halted_for_good(&mut halts, &seen, &shared, &handles, &tail).map(Ok);
                }
                // A busy guest needs no halt checks: look rarely, so as not to take its CPUs.
                poll = pace(if halts.busy() {
                    stop::BUSY_POLL
                } else {
                    stop::POLL
                });
            }
        }

        // Stop the others: flag first (and open every scheduler gate), then kick until
        // each has acknowledged.
        shared.stop.store(true, Ordering::SeqCst);
        self.control.release_all();
        hub.vm_ending();
        while remaining > 0 {
            for (h, _) in handles.iter().zip(&ended).filter(|(_, e)| !**e) {
                if let Err(e) = h.kill(kick::kick_signal()) {
                    tracing::debug!("kicking a vCPU thread failed: {e}");
                }
            }
            let deadline = Instant::now() + REKICK;
            while remaining > 0 {
                let Some(wait) = deadline.checked_duration_since(Instant::now()) else {
                    break;
                };
                match rx.recv_timeout(wait) {
                    Ok(ToCoordinator::Ended(index, end)) => {
                        ended[index as usize] = true;
                        remaining -= 1;
                        if let VcpuEnd::Error(e) = end {
                            tracing::debug!("vCPU {index} failed while stopping: {e}");
                        }
                    }
                    Ok(ToCoordinator::Look) => {}
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        remaining = 0;
                    }
                }
            }
        }
        for (index, h) in handles.into_iter().enumerate() {
            if h.join().is_err() {
                tracing::error!("vCPU {index} thread panicked");
            }
        }

        let workload_started = timer
            .first_mark()
            .map(|t| t.saturating_duration_since(epoch));
        com1.flush();
        drop(com1.take_writer());
        let exit = decision.expect("loop ends with a decision")?;
        match &exit {
            GuestExit::DebugExit(v) => tracing::debug!("guest exited with {v:#x}"),
            GuestExit::Fault(r) => tracing::debug!("guest fault: {}", r.reason),
            GuestExit::HandedOff => tracing::debug!("the VM was handed off"),
            GuestExit::Stopped(cause) => tracing::debug!("VM stopped: {cause}"),
        }
        let vcpu_cpu_time = (0..self.control.vcpus())
            .map(|v| self.control.cpu_time(v).unwrap_or_default())
            .collect();
        let vcpu_run_delay = (0..self.control.vcpus())
            .map(|v| self.control.run_delay(v))
            .collect();
        let kvm_stats = crate::kvm_stats::KvmStats {
            vm: crate::kvm_stats::cumulative(&*self.vm).unwrap_or_else(|e| {
                tracing::debug!("no KVM statistics for the VM: {e}");
                Vec::new()
            }),
            vcpus: std::mem::take(&mut *shared.kvm_stats.lock().unwrap_or_else(|e| e.into_inner())),
        };
        Ok(RunOutcome {
            exit,
            workload_started,
            vcpu_cpu_time,
            vcpu_run_delay,
            pvwait: shared.pvwait.snapshot(),
            kvm_stats,
        })
    }
}

/// What the coordinator knows of every vCPU now: CPU time, exits, latest sample.
fn observe(shared: &Shared, control: &VcpuControl) -> Vec<Observation> {
    shared
        .watch
        .iter()
        .enumerate()
        .map(|(vcpu, w)| Observation {
            cpu: control.cpu_time(vcpu),
            exits: w.exits(),
            sample: w.latest(),
        })
        .collect()
}

/// Asks `vcpus` for a sample of their state: request, then kick out of KVM_RUN.
fn request_samples(shared: &Shared, handles: &[std::thread::JoinHandle<()>], vcpus: &[usize]) {
    for &vcpu in vcpus {
        shared.watch[vcpu].want_sample();
        if let Some(h) = handles.get(vcpu)
            && let Err(e) = h.kill(kick::kick_signal())
        {
            tracing::debug!("kicking vCPU {vcpu} for a sample failed: {e}");
        }
    }
}

/// One halt check: samples the vCPUs when all are idle, and ends the VM when every
/// one of them is stopped for good.
fn halted_for_good(
    halts: &mut HaltDetector,
    seen: &[Observation],
    shared: &Shared,
    handles: &[std::thread::JoinHandle<()>],
    tail: &ConsoleTail,
) -> Option<GuestExit> {
    match halts.check(seen) {
        HaltVerdict::Fine => None,
        HaltVerdict::Sample(vcpus) => {
            request_samples(shared, handles, &vcpus);
            None
        }
        HaltVerdict::Dead { vcpu, samples } => Some(GuestExit::Fault(FaultReport {
            reason: FaultReason::HaltedForever {
                vcpus: halt::describe(&samples),
                last_line: tail.last_line(),
            },
            vcpu: vcpu as u32,
            registers: Ok(samples[vcpu].registers.clone()),
        })),
    }
}

/// One watchdog check: samples the vCPUs it asks for (request, then kick), and ends
/// the VM if one is stuck.
fn watch(
    dog: &mut Watchdog,
    seen: &[Observation],
    shared: &Shared,
    handles: &[std::thread::JoinHandle<()>],
) -> Option<GuestExit> {
    match dog.check(seen) {
        Verdict::Fine => None,
        Verdict::Sample(vcpus) => {
            request_samples(shared, handles, &vcpus);
            None
        }
        Verdict::Stuck {
            vcpu,
            stalled,
            last,
        } => Some(GuestExit::Fault(FaultReport {
            reason: FaultReason::NoProgress { cpu_time: stalled },
            vcpu: vcpu as u32,
            registers: last
                .map(|s| s.registers)
                .ok_or_else(|| "never sampled".to_string()),
        })),
    }
}
