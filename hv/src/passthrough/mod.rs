//! PCI passthrough: a device that lives outside kumo, attached to a VM's bus through
//! the mediation of `devices::pci::passthrough` (BARs placed by kumo, MSI-X virtualized
//! and trapped), with its data path kept out of kumo:
//!
//! - DMA: all guest RAM is handed to the device (vfio-user `DMA_MAP` with the memfd),
//!   which reads and writes it directly.
//! - Doorbells: the device's own eventfds, registered as KVM ioeventfds where its BAR
//!   decodes (a guest write signals the device without an exit to kumo).
//! - Interrupts, fast path: vector `v`'s eventfd is a KVM irqfd routed to the vCPU the
//!   guest programmed in the (trapped) MSI-X table; the device writes it, KVM injects.
//!   Generic path: kumo's own eventfds, read by one thread per device (`pt-irq`, on the
//!   [`BackendWorker`]) that fires the vector through the trapped MSI-X table and
//!   injects with `KVM_SIGNAL_MSI` (the event-loop model of `crate::irq`, for
//!   comparison).
//!
//! Backends: [`vfio_user`] (a device server over a UNIX socket; exercised here) and
//! [`vfio`] (the kernel's VFIO: its checks, which name what a host lacks).

pub mod vfio;
pub mod vfio_user;

use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use devices::interrupt::InterruptSourceGroup;
use devices::pci::passthrough::{CONFIG_REGION, DeviceLayout, PassthroughDevice, RegionAccess};
use devices::vfio_user::proto::vfio as consts;
use devices::vfio_user::proto::{DeviceInfo, IoFd, IrqInfo, RegionInfo};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::Error;
use crate::backend_worker::{BackendWorker, Control, Events, Handler};
pub use crate::bar_windows::DeviceMapping;
use crate::bar_windows::HostWindow;
use crate::irq::{IrqPath, fast_group, inject_now_group};
use crate::placement::ThreadGroup;
use crate::{DeviceHealth, Vm};

/// What `--passthrough` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassthroughSpec {
    /// `vfio-user:PATH`: a device served over vfio-user at the UNIX socket PATH.
    VfioUser(PathBuf),
    /// A host PCI device for the kernel's VFIO (`0000:03:00.0`).
    Kernel(vfio::Bdf),
}

impl std::str::FromStr for PassthroughSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("vfio-user:") {
            if path.is_empty() {
                return Err("--passthrough vfio-user: needs a socket path".into());
            }
            return Ok(PassthroughSpec::VfioUser(path.into()));
        }
        text.parse().map(PassthroughSpec::Kernel)
    }
}

impl std::fmt::Display for PassthroughSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassthroughSpec::VfioUser(path) => write!(f, "vfio-user:{}", path.display()),
            PassthroughSpec::Kernel(bdf) => write!(f, "{bdf}"),
        }
    }
}

/// An attached passthrough device: the threads kumo keeps for it (the failure
/// monitor, and on the generic path the interrupt thread). Keep it until the VM ends.
pub struct Attached {
    backend: Arc<dyn Backend>,
    /// Set before the connection is closed on purpose, so the monitor stays quiet.
    closing: Arc<AtomicBool>,
    /// The generic path's interrupt thread.
    irqs: Option<BackendWorker>,
    /// The failure monitor.
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Attached {
    /// Disconnects from the server (which then unplugs the port) and ends the threads.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(mut irqs) = self.irqs.take() {
            irqs.stop();
        }
        self.backend.shutdown();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn device_error(spec: &PassthroughSpec, why: impl std::fmt::Display) -> Error {
    Error::Device(format!("passthrough {spec}: {why}"))
}

/// What a passthrough backend answers and does at attach: VFIO's questions, asked
/// over vfio-user ([`vfio_user::VfioUserClient`]) or with the kernel's ioctls
/// ([`vfio::VfioDevice`]). Every answer is checked by [`attach`] before use.
pub trait Backend: RegionAccess {
    /// Hands guest memory `[guest, guest + size)` to the device for DMA: it is the
    /// memfd `fd` from `file_offset`, mapped in this process at `host`.
    fn dma_map(
        &self,
        fd: RawFd,
        file_offset: u64,
        host: u64,
        guest: u64,
        size: u64,
    ) -> Result<(), String>;
    fn device_info(&self) -> Result<DeviceInfo, String>;
    fn region_info(&self, index: u32) -> Result<RegionInfo, String>;
    fn irq_info(&self, index: u32) -> Result<IrqInfo, String>;
    /// Places in region `index` where a write only signals, with the eventfd it signals.
    fn doorbells(&self, index: u32) -> Result<Vec<(IoFd, EventFd)>, String>;
    /// MSI-X vectors `0..fds.len()` signal `fds`.
    fn set_msix(&self, fds: &[RawFd]) -> Result<(), String>;
    /// The parts of region `index` this process can map, mapped (VFIO's BAR mmap).
    /// None (every access goes through [`RegionAccess`]) unless the backend says so.
    fn map_region(&self, _index: u32) -> Result<Vec<DeviceMapping>, String> {
        Ok(Vec::new())
    }
    /// A descriptor that reports a hang-up when the device goes away, if there is one.
    fn hangup_fd(&self) -> Option<RawFd>;
    /// Where to report, while the VM runs, a failure found during an access (a server
    /// that stopped answering). Backends without such failures ignore it.
    fn report_failures_to(&self, _health: Arc<DeviceHealth>) {}
    /// Lets go of the device (closing its connection).
    fn shutdown(&self);
}

/// Attaches the device `spec` names to `vm` (before it runs), its interrupts on `path`;
/// kumo's thread for it on the generic path joins `dom0` if given.
pub fn attach(
    vm: &mut Vm,
    spec: &PassthroughSpec,
    path: IrqPath,
    dom0: Option<&Arc<ThreadGroup>>,
) -> Result<Attached, Error> {
    let fail = |why: String| device_error(spec, why);
    let backend: Arc<dyn Backend> = match spec {
        PassthroughSpec::Kernel(bdf) => {
            Arc::new(vfio::VfioDevice::open(bdf, &vm.vm).map_err(|e| Error::Device(e.to_string()))?)
        }
        PassthroughSpec::VfioUser(socket) => {
            Arc::new(vfio_user::VfioUserClient::connect(socket).map_err(fail)?)
        }
    };
    attach_backend(vm, spec, backend, path, dom0.cloned())
}

/// As [`attach`], for a device reached through `backend` (any [`Backend`]: kumo's two,
/// or one a test provides).
pub fn attach_backend(
    vm: &mut Vm,
    spec: &PassthroughSpec,
    backend: Arc<dyn Backend>,
    path: IrqPath,
    dom0: Option<Arc<ThreadGroup>>,
) -> Result<Attached, Error> {
    let fail = |why: String| device_error(spec, why);
    for region in vm.memory().iter() {
        let file_offset = region
            .file_offset()
            .ok_or_else(|| fail("guest memory is not file-backed".into()))?;
        backend
            .dma_map(
                vm.memory_fd().as_raw_fd(),
                file_offset.start(),
                region.as_ptr() as u64,
                region.start_addr().0,
                region.len(),
            )
            .map_err(|e| fail(format!("DMA map: {e}")))?;
    }
    let info = backend.device_info().map_err(fail)?;
    if info.flags & consts::DEVICE_FLAGS_PCI == 0
        || info.regions <= CONFIG_REGION
        || info.irqs <= consts::PCI_MSIX_IRQ_INDEX
    {
        return Err(fail(format!("not a PCI device with MSI-X ({info:?})")));
    }
    let mut bar_sizes = [0u64; 6];
    let mut doorbells = Vec::new();
    let mut doorbell_fds = Vec::new();
    let mut mappings = Vec::new();
    for (index, size) in bar_sizes.iter_mut().enumerate() {
        *size = backend.region_info(index as u32).map_err(fail)?.size;
        if *size == 0 {
            continue;
        }
        for (entry, fd) in backend.doorbells(index as u32).map_err(fail)? {
            doorbells.push((index as u8, entry.offset));
            doorbell_fds.push(fd);
        }
        for mapping in backend.map_region(index as u32).map_err(fail)? {
            mappings.push((index as u8, Arc::new(mapping)));
        }
    }
    let mut config = [0u8; 256];
    let config_size = backend.region_info(CONFIG_REGION).map_err(fail)?.size;
    if config_size < config.len() as u64 {
        return Err(fail(format!("configuration space of {config_size} bytes")));
    }
    backend
        .region_read(CONFIG_REGION, 0, &mut config)
        .map_err(fail)?;
    let irqs = backend.irq_info(consts::PCI_MSIX_IRQ_INDEX).map_err(fail)?;
    if irqs.count == 0 || irqs.count > u32::from(devices::pci::msix::MAX_VECTORS) {
        return Err(fail(format!("{} MSI-X vectors", irqs.count)));
    }
    let vectors = irqs.count as u16;
    let layout = DeviceLayout {
        config,
        bar_sizes,
        msix_irqs: irqs.count,
        doorbells,
        mappable: mappings
            .iter()
            .map(|(bar, m)| (*bar, m.range().start, m.range().end - m.range().start))
            .collect(),
    };
    let health = vm.device_health();
    let mut threads = Vec::new();
    let closing = Arc::new(AtomicBool::new(false));
    let (sink, irq_fds, generic): (Arc<dyn InterruptSourceGroup>, Vec<EventFd>, bool) = match path {
        // The device's server writes each vector's irqfd itself: the group's notifiers.
        IrqPath::Fast => {
            let group = fast_group(vectors, &vm.gsi_router())?;
            let fds = (0..vectors)
                .map(|v| group.notifier(v))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| fail("duplicating an irqfd failed".into()))?;
            (Arc::new(group), fds, false)
        }
        IrqPath::Generic => {
            let fds = (0..vectors)
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| Error::Os {
                    what: "creating an interrupt eventfd",
                    source,
                })?;
            (inject_now_group(vm.vm.clone(), vectors), fds, true)
        }
    };
    let device = Arc::new(
        PassthroughDevice::new(backend.clone(), &layout, sink).map_err(|e| fail(e.to_string()))?,
    );
    for (index, size) in device.bars() {
        device.place_bar(index, vm.allocate_bar(size)?);
    }
    let raw: Vec<_> = irq_fds.iter().map(|fd| fd.as_raw_fd()).collect();
    backend
        .set_msix(&raw)
        .map_err(|e| fail(format!("SET_IRQS: {e}")))?;
    let irqs = if generic {
        Some(spawn_generic_irqs(device.clone(), irq_fds, dom0)?)
    } else {
        None
    };
    // Each window lies in one mapping of its BAR (windows are cut from them).
    let windows = device
        .windows()
        .iter()
        .map(|w| {
            mappings
                .iter()
                .filter(|(bar, _)| *bar == w.bar)
                .find_map(|(_, m)| HostWindow::of(m, w.offset, w.size))
                .ok_or_else(|| fail(format!("window {w:?} lies in no mapping")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    vm.add_pci_device_wired(device, doorbell_fds, windows)?;
    backend.report_failures_to(health.clone());
    if let Some(fd) = backend.hangup_fd() {
        threads.push(spawn_monitor(
            backend.clone(),
            fd,
            health,
            closing.clone(),
            spec.clone(),
        )?);
    }
    Ok(Attached {
        backend,
        closing,
        irqs,
        threads,
    })
}

/// One thread (`pt-irq`) reading the device's interrupt eventfds and firing the
/// vectors through the trapped MSI-X table (held in the PBA while masked).
fn spawn_generic_irqs(
    device: Arc<PassthroughDevice>,
    fds: Vec<EventFd>,
    dom0: Option<Arc<ThreadGroup>>,
) -> Result<BackendWorker, Error> {
    let events = Events::new()?;
    for (vector, fd) in fds.iter().enumerate() {
        events.add(fd.as_raw_fd(), vector as u64)?;
    }
    BackendWorker::spawn(
        "pt-irq",
        Control::new()?,
        events,
        dom0,
        FireVectors { device, fds },
    )
}

/// The `pt-irq` thread's handler.
struct FireVectors {
    device: Arc<PassthroughDevice>,
    fds: Vec<EventFd>,
}

impl Handler for FireVectors {
    fn handle(&mut self, token: u64, _events: EventSet) {
        if let Some(fd) = self.fds.get(token as usize)
            && fd.read().is_ok()
        {
            self.device.fire(token as u16);
        }
    }
}

/// A thread (`pt-monitor`) that waits for the server to hang up (its process died)
/// and reports the device failed; it takes no part in the data path.
fn spawn_monitor(
    backend: Arc<dyn Backend>,
    fd: RawFd,
    health: Arc<DeviceHealth>,
    closing: Arc<AtomicBool>,
    spec: PassthroughSpec,
) -> Result<JoinHandle<()>, Error> {
    std::thread::Builder::new()
        .name("pt-monitor".into())
        .spawn(move || {
            let _open = &backend; // keeps `fd` open
            let mut poll = libc::pollfd {
                fd,
                events: libc::POLLRDHUP,
                revents: 0,
            };
            loop {
                // SAFETY: one pollfd on the stack, valid for the call; `fd` stays open
                // while `backend` lives (held by this thread).
                let rc = unsafe { libc::poll(&mut poll, 1, -1) };
                if rc < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                if rc < 0 || poll.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0 {
                    break;
                }
            }
            if closing.load(Ordering::SeqCst) {
                return;
            }
            health.fail(format!(
                "passthrough {spec}: the device server closed its socket (its process died?); the device failed"
            ));
        })
        .map_err(|source| Error::Os {
            what: "spawning a passthrough monitor thread",
            source,
        })
}
