//! Interrupt delivery: two paths behind one interface.
//!
//! - **Generic** ([`EventLoop`]): every source queues its message to one event-loop
//!   thread, which injects them in arrival order with `KVM_SIGNAL_MSI` — the model of
//!   Xen's event channels, one serialized mechanism for all sources (one thread hop and
//!   one ioctl per interrupt).
//! - **Fast** ([`FastVector`]): the vector's eventfd is a KVM irqfd bound to its own GSI,
//!   whose MSI route names the vCPU the guest programmed. A write to the eventfd is
//!   injected by the kernel: no user-space hop. Re-targeting rewrites the route; a
//!   masked vector's irqfd is unregistered.
//!
//! Devices see neither: a device model holds an [`InterruptSourceGroup`] (from
//! `devices`), and [`interrupt_group`] gives it one on the path chosen for it. On the
//! fast path the group's `notifier(v)` is vector `v`'s irqfd itself, so a backend
//! thread or another process can raise it with one eventfd write.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kvm_bindings::{
    KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI, KVM_IRQCHIP_IOAPIC, KvmIrqRouting,
    kvm_irq_routing_entry, kvm_msi,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use devices::interrupt::{InterruptSourceGroup, MsiMessage, RouteTable};

use crate::Error;
use crate::backend_worker::{BackendWorker, Control, Events, Handler};
use crate::kvm::ioctl;
use crate::placement::ThreadGroup;

fn kvm_msi(msi: MsiMessage) -> kvm_msi {
    kvm_msi {
        address_lo: msi.address as u32,
        address_hi: (msi.address >> 32) as u32,
        data: msi.data,
        ..Default::default()
    }
}

/// Which path a device's interrupts take (`--irq-path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IrqPath {
    /// One event-loop thread, KVM_SIGNAL_MSI.
    #[default]
    Generic,
    /// An irqfd per vector, routed where the guest aims it.
    Fast,
}

impl IrqPath {
    /// As the command line and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            IrqPath::Generic => "generic",
            IrqPath::Fast => "fast",
        }
    }
}

impl std::str::FromStr for IrqPath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "generic" => Ok(IrqPath::Generic),
            "fast" => Ok(IrqPath::Fast),
            _ => Err(format!(
                "unknown interrupt path '{s}' (known: generic, fast)"
            )),
        }
    }
}

/// Counters of one path, for reports and tests.
#[derive(Debug, Default)]
pub struct IrqStats {
    /// Interrupts handed to KVM.
    pub injected: AtomicU64,
    /// Injections KVM refused (logged once each; a guest can cause them, so never fatal).
    pub failed: AtomicU64,
}

// ---------------------------------------------------------------------------------------
// Generic path.

struct LoopState {
    queue: Mutex<VecDeque<MsiMessage>>,
    /// Written once per queued message; the loop waits on it edge-triggered, so a
    /// wake-up is one `epoll_wait` and the counter is never read.
    wake: EventFd,
    stats: IrqStats,
}

/// The generic path's event-loop thread, on the [`BackendWorker`]: stopped when
/// dropped, paused (after injecting everything queued) through [`EventLoop::control`].
pub struct EventLoop {
    state: Arc<LoopState>,
    worker: BackendWorker,
}

/// epoll token of the loop's wake eventfd.
const WAKE: u64 = 0;

impl EventLoop {
    /// Starts the loop thread (`irq-loop`) injecting into `vm`.
    pub fn start(vm: Arc<VmFd>) -> Result<EventLoop, Error> {
        EventLoop::start_in(vm, None)
    }

    /// As [`EventLoop::start`], the thread a member of `dom0` (the VMM's own threads,
    /// scheduled as domain 0 by kumo's credit scheduler).
    pub fn start_in(vm: Arc<VmFd>, dom0: Option<Arc<ThreadGroup>>) -> Result<EventLoop, Error> {
        let state = Arc::new(LoopState {
            queue: Mutex::new(VecDeque::new()),
            wake: EventFd::new(EFD_NONBLOCK).map_err(|source| Error::Os {
                what: "creating the event loop's eventfd",
                source,
            })?,
            stats: IrqStats::default(),
        });
        let events = Events::new()?;
        events.add_edge(state.wake.as_raw_fd(), WAKE)?;
        let worker = BackendWorker::spawn(
            "irq-loop",
            Control::new()?,
            events,
            dom0,
            Injector {
                vm,
                state: state.clone(),
                batch: VecDeque::new(),
            },
        )?;
        Ok(EventLoop { state, worker })
    }

    /// A handle sources use to queue interrupts.
    pub fn sink(&self) -> GenericSink {
        GenericSink {
            state: self.state.clone(),
        }
    }

    pub fn stats(&self) -> &IrqStats {
        &self.state.stats
    }

    /// Pausing the loop (a VM's pause): [`Control::pause`] returns once everything
    /// queued so far is in KVM; what is queued later waits for [`Control::resume`].
    pub fn control(&self) -> Arc<Control> {
        self.worker.control().clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere cannot leave a queue or a route table half-updated in a way
    // that matters more than losing interrupts: keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The event loop's handler: injects every queued message, in order.
struct Injector {
    vm: Arc<VmFd>,
    state: Arc<LoopState>,
    batch: VecDeque<MsiMessage>,
}

impl Injector {
    fn inject_queued(&mut self) {
        std::mem::swap(&mut self.batch, &mut *lock(&self.state.queue));
        for msi in self.batch.drain(..) {
            inject(&self.vm, msi, &self.state.stats);
        }
    }
}

impl Handler for Injector {
    fn handle(&mut self, _token: u64, _events: EventSet) {
        self.inject_queued();
    }

    fn quiesce(&mut self) {
        self.inject_queued();
    }
}

/// One `KVM_SIGNAL_MSI`: the generic path's injection primitive. `Ok(false)` when KVM
/// coalesced it (the vector was already pending) or the guest's APIC blocked it.
pub(crate) fn signal_msi(vm: &VmFd, msi: MsiMessage) -> Result<bool, Error> {
    vm.signal_msi(kvm_msi(msi))
        .map(|delivered| delivered > 0)
        .map_err(ioctl("KVM_SIGNAL_MSI"))
}

fn inject(vm: &VmFd, msi: MsiMessage, stats: &IrqStats) {
    match vm.signal_msi(kvm_msi(msi)) {
        // 0 = the interrupt was coalesced or blocked by the guest's APIC state; it is
        // still "delivered" as far as the device is concerned, like on hardware.
        Ok(_) => stats.injected.fetch_add(1, Ordering::Relaxed),
        Err(e) => {
            if stats.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!("KVM_SIGNAL_MSI {msi:x?} failed: {e}");
            }
            0
        }
    };
}

/// Queues interrupts to the [`EventLoop`] (cheap to clone).
#[derive(Clone)]
pub struct GenericSink {
    state: Arc<LoopState>,
}

impl GenericSink {
    /// Queues `msi` to the loop, which injects it with `KVM_SIGNAL_MSI`.
    pub fn raise(&self, msi: MsiMessage) {
        lock(&self.state.queue).push_back(msi);
        if let Err(e) = self.state.wake.write(1) {
            tracing::error!("waking the event loop failed: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fast path.

/// GSIs 0..24 are the IOAPIC's pins; fast vectors take GSIs above them.
const FIRST_MSI_GSI: u32 = 24;
const IOAPIC_PINS: u32 = 24;

/// The VM's GSI routing table. KVM_SET_GSI_ROUTING replaces the whole table, so every
/// change rewrites it from this copy (the IOAPIC pins' default routes included).
pub struct GsiRouter {
    vm: Arc<VmFd>,
    routes: Mutex<Routes>,
}

struct Routes {
    msi: BTreeMap<u32, MsiMessage>,
    next_gsi: u32,
}

impl GsiRouter {
    pub fn new(vm: Arc<VmFd>) -> Arc<GsiRouter> {
        Arc::new(GsiRouter {
            vm,
            routes: Mutex::new(Routes {
                msi: BTreeMap::new(),
                next_gsi: FIRST_MSI_GSI,
            }),
        })
    }

    /// A new fast vector with its own GSI and eventfd, not yet routed (masked).
    pub fn vector(self: &Arc<Self>) -> Result<FastVector, Error> {
        let gsi = {
            let mut routes = lock(&self.routes);
            let gsi = routes.next_gsi;
            routes.next_gsi += 1;
            gsi
        };
        let eventfd = EventFd::new(EFD_NONBLOCK).map_err(|source| Error::Os {
            what: "creating an irqfd",
            source,
        })?;
        Ok(FastVector {
            router: self.clone(),
            gsi,
            eventfd,
            routed: Mutex::new(None),
        })
    }

    fn commit(&self, routes: &Routes) -> Result<(), Error> {
        let mut table = KvmIrqRouting::new(0).map_err(|_| fam_error())?;
        for pin in 0..IOAPIC_PINS {
            let mut entry = kvm_irq_routing_entry {
                gsi: pin,
                type_: KVM_IRQ_ROUTING_IRQCHIP,
                ..Default::default()
            };
            entry.u.irqchip.irqchip = KVM_IRQCHIP_IOAPIC;
            entry.u.irqchip.pin = pin;
            table.push(entry).map_err(|_| fam_error())?;
        }
        for (&gsi, msi) in &routes.msi {
            let mut entry = kvm_irq_routing_entry {
                gsi,
                type_: KVM_IRQ_ROUTING_MSI,
                ..Default::default()
            };
            entry.u.msi.address_lo = msi.address as u32;
            entry.u.msi.address_hi = (msi.address >> 32) as u32;
            entry.u.msi.data = msi.data;
            table.push(entry).map_err(|_| fam_error())?;
        }
        self.vm
            .set_gsi_routing(&table)
            .map_err(ioctl("KVM_SET_GSI_ROUTING"))
    }
}

fn fam_error() -> Error {
    Error::Kvm {
        ioctl: "KVM_SET_GSI_ROUTING",
        source: kvm_ioctls::Error::new(libc::E2BIG),
    }
}

/// One device vector on the fast path: an irqfd on its own GSI.
pub struct FastVector {
    router: Arc<GsiRouter>,
    gsi: u32,
    eventfd: EventFd,
    /// The message the GSI routes to, while the irqfd is registered.
    routed: Mutex<Option<MsiMessage>>,
}

impl FastVector {
    pub fn gsi(&self) -> u32 {
        self.gsi
    }

    /// Points the vector at `msi` (registering the irqfd if it was masked), or masks
    /// it (`None`: the irqfd is unregistered, so a write to the eventfd is not
    /// delivered). Called when the guest rewrites or (un)masks the MSI-X entry.
    pub fn route(&self, msi: Option<MsiMessage>) -> Result<(), Error> {
        let mut routed = lock(&self.routed);
        if *routed == msi {
            return Ok(());
        }
        let mut routes = lock(&self.router.routes);
        match msi {
            Some(msi) => {
                routes.msi.insert(self.gsi, msi);
                self.router.commit(&routes)?;
                if routed.is_none() {
                    self.router
                        .vm
                        .register_irqfd(&self.eventfd, self.gsi)
                        .map_err(ioctl("KVM_IRQFD"))?;
                }
            }
            None => {
                self.router
                    .vm
                    .unregister_irqfd(&self.eventfd, self.gsi)
                    .map_err(ioctl("KVM_IRQFD (deassign)"))?;
                // Drain what was written while routed but not yet consumed, so an
                // unmask does not deliver a stale interrupt twice.
                let _ = self.eventfd.read();
                routes.msi.remove(&self.gsi);
                self.router.commit(&routes)?;
            }
        }
        *routed = msi;
        Ok(())
    }

    /// Raises the vector: one eventfd write, injected by KVM.
    pub fn trigger(&self) {
        if let Err(e) = self.eventfd.write(1) {
            tracing::error!("irqfd write for GSI {} failed: {e}", self.gsi);
        }
    }
}

impl Drop for FastVector {
    fn drop(&mut self) {
        if lock(&self.routed).is_some() {
            let _ = self.router.vm.unregister_irqfd(&self.eventfd, self.gsi);
            let mut routes = lock(&self.router.routes);
            routes.msi.remove(&self.gsi);
            let _ = self.router.commit(&routes);
        }
    }
}

/// A PCI device's MSI-X vectors on `path`, as the group its model raises them through.
/// Generic: each trigger queues the vector's route to `event_loop`. Fast: an irqfd per
/// vector on its own GSI from `router`, re-routed whenever the guest rewrites or
/// (un)masks the entry.
pub fn interrupt_group(
    path: IrqPath,
    vectors: u16,
    event_loop: &EventLoop,
    router: &Arc<GsiRouter>,
) -> Result<Arc<dyn InterruptSourceGroup>, Error> {
    Ok(match path {
        IrqPath::Generic => Arc::new(GenericGroup {
            sink: event_loop.sink(),
            routes: RouteTable::new(vectors),
        }),
        IrqPath::Fast => Arc::new(fast_group(vectors, router)?),
    })
}

/// The fast path's group alone (no event loop needed): an irqfd per vector, each
/// handed out by [`InterruptSourceGroup::notifier`].
pub fn fast_group(vectors: u16, router: &Arc<GsiRouter>) -> Result<FastGroup, Error> {
    Ok(FastGroup(
        (0..vectors)
            .map(|_| router.vector())
            .collect::<Result<Vec<_>, _>>()?,
    ))
}

/// The generic path's group: the routes the device told it; a trigger queues its
/// vector's route to the event loop.
struct GenericGroup {
    sink: GenericSink,
    routes: RouteTable,
}

impl InterruptSourceGroup for GenericGroup {
    fn trigger(&self, index: u16) {
        if let Some(msi) = self.routes.get(index) {
            self.sink.raise(msi);
        }
    }

    fn update(&self, index: u16, route: Option<MsiMessage>) {
        self.routes.set(index, route);
    }
}

/// The generic path injecting on the calling thread: `KVM_SIGNAL_MSI` at once, no
/// queue (for a device whose own thread is its event loop: a passthrough device's
/// `pt-irq` thread).
pub fn inject_now_group(vm: Arc<VmFd>, vectors: u16) -> Arc<dyn InterruptSourceGroup> {
    Arc::new(InjectNow {
        vm,
        routes: RouteTable::new(vectors),
    })
}

struct InjectNow {
    vm: Arc<VmFd>,
    routes: RouteTable,
}

impl InterruptSourceGroup for InjectNow {
    fn trigger(&self, index: u16) {
        if let Some(msi) = self.routes.get(index)
            && let Err(e) = signal_msi(&self.vm, msi)
        {
            tracing::warn!("interrupt {msi:x?}: {e}");
        }
    }

    fn update(&self, index: u16, route: Option<MsiMessage>) {
        self.routes.set(index, route);
    }
}

/// The fast path's group: vector `v` is an irqfd on its own GSI. A trigger is one
/// eventfd write (no lock, no queue); `notifier(v)` hands out that irqfd, for a
/// device outside kumo (a passthrough device's server) or a backend thread to write.
pub struct FastGroup(Vec<FastVector>);

impl InterruptSourceGroup for FastGroup {
    fn trigger(&self, index: u16) {
        if let Some(fast) = self.0.get(usize::from(index)) {
            fast.trigger();
        }
    }

    fn update(&self, index: u16, route: Option<MsiMessage>) {
        if let Some(fast) = self.0.get(usize::from(index))
            && let Err(e) = fast.route(route)
        {
            // The guest cannot make this fail with valid messages; KVM refusing a
            // route leaves the vector undeliverable, which the guest will see.
            tracing::warn!("re-routing fast vector {index}: {e}");
        }
    }

    fn notifier(&self, index: u16) -> Option<EventFd> {
        let fast = self.0.get(usize::from(index))?;
        match fast.eventfd.try_clone() {
            Ok(fd) => Some(fd),
            Err(e) => {
                tracing::error!("duplicating the irqfd of GSI {}: {e}", fast.gsi);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_parse_by_name() {
        assert_eq!("fast".parse(), Ok(IrqPath::Fast));
        assert_eq!("generic".parse(), Ok(IrqPath::Generic));
        assert!(
            "posted"
                .parse::<IrqPath>()
                .unwrap_err()
                .contains("generic, fast")
        );
    }
}
