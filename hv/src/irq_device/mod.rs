//! kumo's interrupt test device wired to a VM: the PCI model from
//! `devices::irq_test`, doorbells as ioeventfds, a responder thread that answers them,
//! and the device's vectors on the interrupt path chosen for it — plus, optionally, a
//! second "noise" device that raises its vector at a fixed rate on the generic path
//! (S4's contention: a NIC's interrupts queued behind everyone else's).
//!
//! A round on the **generic** path: guest doorbell write -> (KVM: ioeventfd) ->
//! responder thread -> MSI-X check -> queue -> event-loop thread -> KVM_SIGNAL_MSI.
//! On the **fast** path the last two hops are one eventfd write that KVM turns into an
//! interrupt itself (irqfd on the vector's own GSI, routed where the guest aimed it).

pub mod responder;

use std::sync::Arc;
use std::time::Duration;

use devices::irq_test::{self, Doorbell, IrqTestDevice};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::Error;
use crate::backend_worker::Control;
use crate::irq::{EventLoop, IrqPath, IrqStats, interrupt_group};
use crate::migration::Quiesce;
use crate::placement::ThreadGroup;
use crate::vm::Vm;
use responder::{Fire, Responder, Round, Trigger};

/// Vectors of the test device (the guest's check aims each at every vCPU).
pub const VECTORS: u16 = 8;

/// How to build the test devices of a VM.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IrqDeviceSetup {
    /// The test device's interrupt path.
    pub path: IrqPath,
    /// How long the device waits between a doorbell and its interrupt.
    pub delay: Duration,
    /// Interrupts per second of the noise device (generic path), if any.
    pub noise_hz: Option<f64>,
}

/// The running devices of one VM. Keep it until the VM has ended; dropping it stops
/// the device threads and the event loop.
pub struct IrqDevices {
    // Field order is drop order: the responders stop raising before the event loop
    // they feed goes away.
    responder: Responder,
    noise: Option<Responder>,
    event_loop: EventLoop,
    device: Arc<IrqTestDevice>,
}

impl IrqDevices {
    /// Doorbell rounds as the host saw them.
    pub fn host_rounds(&self) -> Vec<Round> {
        self.responder.log().rounds()
    }

    /// How many times the noise device raised its vector.
    pub fn noise_raised(&self) -> usize {
        self.noise.as_ref().map_or(0, |n| n.log().rounds().len())
    }

    /// The generic path's counters (the noise device's interrupts, and the test
    /// device's when it is on the generic path).
    pub fn generic_stats(&self) -> &IrqStats {
        self.event_loop.stats()
    }

    pub fn device(&self) -> &Arc<IrqTestDevice> {
        &self.device
    }
}

/// Plugs the test device (and the noise device, if asked) into `vm`'s PCI bus, with
/// BARs placed and doorbells registered. Call before [`Vm::run`]. The device and
/// event-loop threads join `dom0` if given.
pub fn attach(
    vm: &mut Vm,
    setup: &IrqDeviceSetup,
    dom0: Option<&Arc<ThreadGroup>>,
) -> Result<IrqDevices, Error> {
    let event_loop = vm.start_event_loop_in(dom0.cloned())?;
    let sink = interrupt_group(setup.path, VECTORS, &event_loop, &vm.gsi_router())?;
    let doorbells = (0..VECTORS)
        .map(|_| new_eventfd())
        .collect::<Result<Vec<_>, _>>()?;
    let fallback = Arc::new(EventfdDoorbells(
        doorbells
            .iter()
            .map(|fd| fd.try_clone().map_err(os("duplicating a doorbell eventfd")))
            .collect::<Result<_, _>>()?,
    ));
    let device = Arc::new(IrqTestDevice::new(VECTORS, sink, fallback));
    device.place_bar0(vm.allocate_bar(irq_test::BAR0_SIZE)?);
    let wired = doorbells
        .iter()
        .map(|fd| fd.try_clone().map_err(os("duplicating a doorbell eventfd")))
        .collect::<Result<_, _>>()?;
    vm.add_pci_device_with_doorbells(device.clone(), wired)?;
    let responder = Responder::start(
        "irq-test-device",
        Trigger::Doorbells(doorbells),
        setup.delay,
        fire(&device),
        dom0.cloned(),
    )?;

    let noise = match setup.noise_hz {
        Some(hz) if hz > 0.0 => {
            let noisy = Arc::new(IrqTestDevice::new(
                1,
                interrupt_group(IrqPath::Generic, 1, &event_loop, &vm.gsi_router())?,
                Arc::new(NoDoorbells),
            ));
            noisy.place_bar0(vm.allocate_bar(irq_test::BAR0_SIZE)?);
            vm.add_pci_device(noisy.clone())?;
            Some(Responder::start(
                "irq-noise-device",
                Trigger::Periodic(Duration::from_secs_f64(1.0 / hz)),
                Duration::ZERO,
                fire(&noisy),
                dom0.cloned(),
            )?)
        }
        _ => None,
    };
    // A pause answers the doorbells already rung and drains the event loop before
    // the vCPUs save their LAPICs (see `migration::Quiesce`).
    let mut responders = vec![responder.control().clone()];
    responders.extend(noise.iter().map(|n| n.control().clone()));
    vm.migration_hub().add_quiescer(Arc::new(Quiet {
        responders,
        event_loop: event_loop.control(),
    }));
    Ok(IrqDevices {
        responder,
        noise,
        event_loop,
        device,
    })
}

/// The devices' threads as a pause sees them: responders first (they feed the loop).
struct Quiet {
    responders: Vec<Arc<Control>>,
    event_loop: Arc<Control>,
}

impl Quiesce for Quiet {
    fn quiesce(&self) {
        for responder in &self.responders {
            responder.pause();
        }
        self.event_loop.pause();
    }

    fn resume(&self) {
        self.event_loop.resume();
        for responder in &self.responders {
            responder.resume();
        }
    }
}

fn fire(device: &Arc<IrqTestDevice>) -> Fire {
    let device = device.clone();
    Box::new(move |vector| device.fire(vector as u16))
}

fn os(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Os { what, source }
}

fn new_eventfd() -> Result<EventFd, Error> {
    EventFd::new(EFD_NONBLOCK).map_err(os("creating a doorbell eventfd"))
}

/// Doorbell writes that reached the model (between a BAR move and its ioeventfds
/// following it, or where KVM refused one):
/// signalled on the same eventfds, so the responder answers them all the same.
struct EventfdDoorbells(Vec<EventFd>);

impl Doorbell for EventfdDoorbells {
    fn ring(&self, vector: u16) {
        if let Some(fd) = self.0.get(usize::from(vector)) {
            let _ = fd.write(1);
        }
    }
}

/// The noise device raises on its own timer; its doorbells do nothing.
struct NoDoorbells;

impl Doorbell for NoDoorbells {
    fn ring(&self, _vector: u16) {}
}
