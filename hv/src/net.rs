//! A network of VMs: a virtio-net NIC on each VM's PCI bus, and domain 0's switch
//! thread that carries Ethernet frames between them (S1's netback, Xen's bridge).
//!
//! The data path of one frame from VM A to VM B:
//! guest A writes TX descriptors and rings the TX doorbell -> (KVM: ioeventfd, no
//! exit to kumo) -> the switch thread wakes -> `VirtioNet::transmit` copies the frame
//! out of A's buffers into the switch (one copy) -> the switch learns, picks B's port
//! and queues the frame -> `VirtioNet::receive_batch` copies it into B's RX buffers
//! (second copy) -> B's RX interrupt on B's configured path (generic: the VM's event
//! loop and `KVM_SIGNAL_MSI`; fast: an irqfd).
//!
//! Nothing is dropped for lack of room: a destination without RX buffers leaves its
//! frames queued in the switch; a full switch queue holds the sender's frame and leaves
//! the rest in the sender's TX ring until the receiver's guest posts buffers (its RX
//! doorbell wakes this thread). Malformed frames are dropped and counted by the switch.
//!
//! One thread serves every NIC of the network (a [`BackendWorker`] over their
//! doorbells), and it joins domain 0 when given one, so the credit scheduler charges
//! its work to domain 0 as Xen charges netback's.

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use devices::net::switch::{PortId, Sources, Switch, SwitchConfig, SwitchStats};
use devices::virtio::VirtioPciDevice;
use devices::virtio::net::{NetConfig, NetStats, QueueRole, VirtioNet};
use devices::virtio::transport::{ActionSink, TransportAction};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::Error;
use crate::backend_worker::{BackendWorker, Control, Events, Handler, RESERVED_TOKENS};
use crate::irq::{EventLoop, IrqPath, interrupt_group};
use crate::placement::ThreadGroup;
use crate::vm::Vm;
use crate::wire::Wire;
pub use crate::wire::WireStats;
use crate::wire_socket::{WireListener, WireStream};

/// How a VM's NIC is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicSetup {
    pub mac: [u8; 6],
    /// The path of the NIC's interrupts.
    pub irq_path: IrqPath,
}

/// Queue size of kumo's NICs (the guest may use fewer entries).
const QUEUE_SIZE: u16 = 256;
/// epoll token of the control (activate/reset) eventfd; ports' doorbells are
/// `port << 16 | queue`, far below it.
const CONTROL: u64 = RESERVED_TOKENS - 1;

/// One NIC: the device model, one eventfd per queue doorbell. A NIC in one of this
/// process's VMs has its model from the start; a NIC served to another process (see
/// [`Network::add_served_port`]) gets one while a client is attached.
struct Nic {
    net: Mutex<Option<Arc<VirtioNet<GuestMemoryMmap>>>>,
    notify: Vec<EventFd>,
    /// The transport and the generic path's event loop, kept for the NIC's lifetime
    /// (the PCI bus holds the transport too), for a NIC of this process's VM.
    _in_vm: Option<(Arc<VirtioPciDevice>, EventLoop)>,
}

/// A NIC in a VM: its receive path writes guest RAM from the switch thread, so a
/// migration of the VM sends the pages it wrote again.
struct NicWrites(Arc<VirtioNet<GuestMemoryMmap>>);

impl crate::migration::DeviceWrites for NicWrites {
    fn track(&self, on: bool) {
        self.0.track_writes(on);
    }
    fn take_written(&self) -> Vec<u64> {
        self.0.take_written()
    }
}

impl Nic {
    fn model(&self) -> Option<Arc<VirtioNet<GuestMemoryMmap>>> {
        self.net.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A switch port whose NIC model lives in a device server (`kumo nic-server`): its
/// doorbells exist from the start (the server hands them to each client), its model
/// is plugged while a client is attached.
pub struct ServedPort {
    pub port: PortId,
    /// One per queue: what a guest's doorbell write must signal.
    pub doorbells: Vec<EventFd>,
    /// What the model's transport reports (activation, reset, trapped doorbells).
    pub actions: Arc<dyn ActionSink>,
}

/// Port state changes the vCPU threads report to the switch thread.
#[derive(Debug, Clone, Copy)]
enum Change {
    Up(PortId),
    Down(PortId),
    /// A port's TX may move again (a receiver it waited on went away).
    Resume(PortId),
    /// A NIC attached while the switch thread runs: its doorbells join the epoll set.
    Added(PortId),
    /// A gratuitous frame (RARP, as QEMU's self-announce) from this MAC on this port:
    /// learning switches on the way, across wires too, bind the MAC to where it is now.
    Announce(PortId, [u8; 6]),
}

/// What is plugged into a switch port.
#[derive(Clone)]
enum Endpoint {
    Nic(Arc<Nic>),
    Wire(Arc<Wire>),
}

struct Shared {
    switch: Mutex<Switch>,
    /// The switch thread's wake-ups and the time it spent working after them.
    wakeups: AtomicU64,
    busy_ns: AtomicU64,
    /// A modelled backend's CPU per forwarded frame and per KiB, in nanoseconds (0:
    /// kumo's own cost only). See [`Network::model_backend_cost`].
    frame_cost_ns: AtomicU64,
    kib_cost_ns: AtomicU64,
    /// Index = switch port.
    ports: Mutex<Vec<Endpoint>>,
    changes: Mutex<VecDeque<Change>>,
    control: EventFd,
    /// Stops and holds the switch thread: while a VM of the network is paused (a
    /// snapshot or a migration) it writes no guest RAM and raises no interrupt.
    worker: Arc<Control>,
    /// The switch thread has its epoll set: NICs attached from now on are announced
    /// to it ([`Change::Added`]). Set and read with `ports` locked.
    started: std::sync::atomic::AtomicBool,
    /// Every NIC is one VM's, which takes the network with it when it moves
    /// ([`Network::moves_with_its_vm`]).
    one_vm: std::sync::atomic::AtomicBool,
}

/// A NIC's part in pausing its VM: the switch thread held between passes, then the
/// NIC's generic-path event loop paused once its queue is in KVM (so the vCPUs'
/// saved LAPICs hold those interrupts).
///
/// A VM's hold on its network for migration. Weak, as [`PortActions`]: the network
/// owns the VM's NIC, whose device owns these, and a strong reference back kept every
/// network, its NICs' interrupt threads and their VMs' memory alive after the run.
struct NicQuiesce {
    shared: Weak<Shared>,
    event_loop: Arc<Control>,
    /// The NIC's switch port.
    port: PortId,
}

impl crate::migration::Quiesce for NicQuiesce {
    fn quiesce(&self) {
        if let Some(shared) = self.shared.upgrade() {
            shared.worker.pause();
        }
        self.event_loop.pause();
    }
    fn resume(&self) {
        self.event_loop.resume();
        if let Some(shared) = self.shared.upgrade() {
            shared.worker.resume();
        }
    }
    /// The VM runs elsewhere now. A network that is the VM's alone
    /// ([`Network::moves_with_its_vm`]): its wires close at once, so a listening
    /// peer takes the destination's connection as the same port without waiting for
    /// this process to tear the VM down. A network other VMs share (a node's): the
    /// NIC's port goes down, forgetting its MAC (frames for it flood, the wire
    /// included, until the destination announces it) and dropping what was queued
    /// for it. Either before the switch moves again: frames the guest queued before
    /// the pause leave from the destination only.
    fn hand_off(&self) {
        self.event_loop.resume();
        if let Some(shared) = self.shared.upgrade() {
            if shared.one_vm.load(Ordering::Relaxed) {
                shared.close_wires_and_release();
            } else {
                shared.port_gone(self.port);
                shared.worker.resume();
            }
        }
    }
}

impl Shared {
    /// A paused VM of this network runs elsewhere now: close every wire, then let
    /// the switch move again.
    fn close_wires_and_release(&self) {
        let wires: Vec<Arc<Wire>> = self
            .ports()
            .iter()
            .filter_map(|endpoint| match endpoint {
                Endpoint::Wire(wire) => Some(wire.clone()),
                Endpoint::Nic(_) => None,
            })
            .collect();
        for wire in wires {
            wire.close();
        }
        self.worker.resume();
    }

    /// `port`'s NIC is gone (unplugged, or its VM moved away): the port goes down
    /// and the senders it held move again.
    fn port_gone(&self, port: PortId) {
        // Its MAC may now arrive over a wire (the VM moved to another node).
        let unblocked = self.switch().release_port(port);
        self.tell(unblocked.into_iter().map(Change::Resume));
    }

    /// Queues changes for the switch thread and wakes it.
    fn tell(&self, changes: impl IntoIterator<Item = Change>) {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(changes);
        let _ = self.control.write(1);
    }

    fn switch(&self) -> MutexGuard<'_, Switch> {
        self.switch.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ports(&self) -> MutexGuard<'_, Vec<Endpoint>> {
        self.ports.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn worker_stats(&self) -> WorkerStats {
        WorkerStats {
            wakeups: self.wakeups.load(Ordering::Relaxed),
            busy: std::time::Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
            delivered: self.switch().stats().delivered,
        }
    }

    fn endpoint(&self, port: PortId) -> Option<Endpoint> {
        self.ports().get(port).cloned()
    }

    fn nic(&self, port: PortId) -> Option<Arc<Nic>> {
        match self.endpoint(port)? {
            Endpoint::Nic(nic) => Some(nic),
            Endpoint::Wire(_) => None,
        }
    }
}

/// What a port's transport tells the switch thread (from vCPU threads).
struct PortActions {
    /// Weak: the network owns the port's device, which owns these actions.
    shared: Weak<Shared>,
    port: PortId,
    /// The queue doorbells' eventfds, for notifications that came by an MMIO exit.
    notify: Vec<EventFd>,
}

impl ActionSink for PortActions {
    fn act(&self, action: TransportAction) {
        let change = match action {
            TransportAction::None => return,
            TransportAction::QueueNotify(queue) => {
                if let Some(fd) = self.notify.get(usize::from(queue)) {
                    let _ = fd.write(1);
                }
                return;
            }
            TransportAction::Activated => Change::Up(self.port),
            TransportAction::Reset => Change::Down(self.port),
        };
        let Some(shared) = self.shared.upgrade() else {
            return; // the network is gone: nothing to tell
        };
        shared
            .changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(change);
        let _ = shared.control.write(1);
    }
}

/// The switch of one network and the NICs attached to it. Attach every VM's NIC, then
/// [`Network::start`] the switch thread; dropping the returned handle stops it.
pub struct Network {
    shared: Arc<Shared>,
}

fn os(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Os { what, source }
}

impl Network {
    pub fn new(config: SwitchConfig) -> Result<Network, Error> {
        Ok(Network {
            shared: Arc::new(Shared {
                switch: Mutex::new(Switch::new(config)),
                wakeups: AtomicU64::new(0),
                busy_ns: AtomicU64::new(0),
                frame_cost_ns: AtomicU64::new(0),
                kib_cost_ns: AtomicU64::new(0),
                ports: Mutex::new(Vec::new()),
                changes: Mutex::new(VecDeque::new()),
                control: EventFd::new(EFD_NONBLOCK).map_err(os("creating an eventfd"))?,
                worker: Control::new()?,
                started: std::sync::atomic::AtomicBool::new(false),
                one_vm: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// Makes the switch thread spend `per_frame` + `per_kib` per KiB of CPU (busy, on
    /// domain 0's time) on every frame it takes in, as a slower backend would: Xen
    /// 3.4's netback copied each frame through grant tables and a bridge, at tens of
    /// microseconds a frame on S1's hardware, where kumo's switch takes a few. The
    /// experiments use it to ask how much of a result is domain 0's cost.
    pub fn model_backend_cost(&self, per_frame: std::time::Duration, per_kib: std::time::Duration) {
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.shared
            .frame_cost_ns
            .store(ns(per_frame), Ordering::Relaxed);
        self.shared
            .kib_cost_ns
            .store(ns(per_kib), Ordering::Relaxed);
    }

    /// Plugs a virtio-net NIC with `setup`'s MAC into `vm` (before it runs) and
    /// connects it to a new port of this network's switch. Returns the port.
    pub fn attach(
        &self,
        vm: &mut Vm,
        setup: &NicSetup,
        dom0: Option<&Arc<ThreadGroup>>,
    ) -> Result<PortId, Error> {
        let net = Arc::new(
            VirtioNet::new(
                NetConfig {
                    mac: setup.mac,
                    queue_pairs: 1,
                    queue_size: QUEUE_SIZE,
                },
                vm.memory().clone(),
            )
            .map_err(|e| Error::Device(e.to_string()))?,
        );
        let queues = 2u16;
        let notify = new_doorbells(queues)?;
        let port = self.shared.switch().add_port(Sources::Assigned(setup.mac));
        let event_loop = vm.start_event_loop_in(dom0.cloned())?;
        // MSI-X: the configuration vector and one per queue.
        let sink = interrupt_group(setup.irq_path, queues + 1, &event_loop, &vm.gsi_router())?;
        let actions = Arc::new(PortActions {
            shared: Arc::downgrade(&self.shared),
            port,
            notify: duplicate(&notify)?,
        });
        let transport = Arc::new(
            VirtioPciDevice::new(net.clone(), sink, actions)
                .map_err(|e| Error::Device(e.to_string()))?,
        );
        transport.place_bar(vm.allocate_bar(devices::virtio::transport::BAR_SIZE)?);
        vm.add_pci_device_with_doorbells(transport.clone(), duplicate(&notify)?)?;
        vm.migration_hub()
            .add_device_writes(Arc::new(NicWrites(net.clone())));
        vm.migration_hub().add_quiescer(Arc::new(NicQuiesce {
            shared: Arc::downgrade(&self.shared),
            event_loop: event_loop.control(),
            port,
        }));
        let mut ports = self.shared.ports();
        debug_assert_eq!(ports.len(), port, "ports are numbered in attach order");
        ports.push(Endpoint::Nic(Arc::new(Nic {
            net: Mutex::new(Some(net)),
            notify,
            _in_vm: Some((transport, event_loop)),
        })));
        // A VM arriving at a running network (a node's domain migrated here): the
        // switch thread adds its doorbells.
        if self.shared.started.load(Ordering::Relaxed) {
            drop(ports);
            self.shared.tell([Change::Added(port)]);
        }
        Ok(port)
    }

    /// Every NIC of this network is one VM's, and the network (its wires) goes
    /// with that VM when it moves: its hand-off closes the wires, so a listening
    /// peer takes the destination's connection as the same port (a rank VM of
    /// `kumo mpi --ctl-socket`). Without it a moving VM's NICs leave the network
    /// and the wires stay (a node's domain moving to another node).
    pub fn moves_with_its_vm(&self) {
        self.shared.one_vm.store(true, Ordering::Relaxed);
    }

    /// Sends a gratuitous broadcast frame (RARP, as QEMU announces a migrated VM) from
    /// `mac` on NIC `port`: this switch, and every learning switch the flood reaches
    /// across the wires, binds `mac` to the way to this port. A VM that arrived
    /// from another node announces each of its MACs so that its old node's switch
    /// sends their frames down the wire rather than flooding them.
    pub fn announce(&self, port: PortId, mac: [u8; 6]) {
        self.shared.tell([Change::Announce(port, mac)]);
    }

    /// A port for a NIC served to another process (before [`Network::start`]): `queues`
    /// doorbell eventfds, no model until [`Network::plug`]; it may send from `mac` only.
    pub fn add_served_port(&self, queues: u16, mac: [u8; 6]) -> Result<ServedPort, Error> {
        let notify = new_doorbells(queues)?;
        let port = self.shared.switch().add_port(Sources::Assigned(mac));
        let actions = Arc::new(PortActions {
            shared: Arc::downgrade(&self.shared),
            port,
            notify: duplicate(&notify)?,
        });
        let doorbells = duplicate(&notify)?;
        let mut ports = self.shared.ports();
        debug_assert_eq!(ports.len(), port, "ports are numbered in attach order");
        ports.push(Endpoint::Nic(Arc::new(Nic {
            net: Mutex::new(None),
            notify,
            _in_vm: None,
        })));
        Ok(ServedPort {
            port,
            doorbells,
            actions,
        })
    }

    /// Plugs `net` into served port `port` (a client attached), or unplugs it (`None`:
    /// the client went away; the port goes down and its queued frames are dropped).
    pub fn plug(&self, port: PortId, net: Option<Arc<VirtioNet<GuestMemoryMmap>>>) {
        let Some(nic) = self.shared.nic(port) else {
            return;
        };
        if net.is_none() {
            let unblocked = self.shared.switch().set_up(port, false);
            self.shared
                .changes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(unblocked.into_iter().map(Change::Resume));
            let _ = self.shared.control.write(1);
        }
        *nic.net.lock().unwrap_or_else(|e| e.into_inner()) = net;
    }

    /// Connects a wire (QEMU's stream framing on `socket`, a UNIX or TCP stream) to a
    /// new port of the switch, up at once. Its reader and writer threads join `dom0`
    /// if given.
    pub fn attach_wire(
        &self,
        socket: impl Into<WireStream>,
        dom0: Option<&Arc<ThreadGroup>>,
    ) -> Result<PortId, Error> {
        self.plug_wire(Wire::start(socket.into(), dom0.cloned())?)
    }

    /// As [`Network::attach_wire`] for `socket`, a connection `listener` accepted:
    /// when that peer closes, the next connection on `listener` is the same port (a
    /// VM of the other side moved to another process and connects again).
    pub fn attach_listening_wire(
        &self,
        socket: impl Into<WireStream>,
        listener: impl Into<WireListener>,
        dom0: Option<&Arc<ThreadGroup>>,
    ) -> Result<PortId, Error> {
        self.plug_wire(Wire::start_listening(
            socket.into(),
            listener.into(),
            dom0.cloned(),
        )?)
    }

    fn plug_wire(&self, wire: Arc<Wire>) -> Result<PortId, Error> {
        let mut switch = self.shared.switch();
        let port = switch.add_port(Sources::Foreign);
        switch.set_up(port, true);
        let mut ports = self.shared.ports();
        debug_assert_eq!(ports.len(), port, "ports are numbered in attach order");
        ports.push(Endpoint::Wire(wire));
        Ok(port)
    }

    /// The counters of the wire on `port`.
    pub fn wire_stats(&self, port: PortId) -> Option<WireStats> {
        match self.shared.endpoint(port)? {
            Endpoint::Wire(wire) => Some(wire.stats()),
            Endpoint::Nic(_) => None,
        }
    }

    /// Starts the switch thread (`net-switch`, a member of `dom0` if given).
    pub fn start(&self, dom0: Option<Arc<ThreadGroup>>) -> Result<RunningNetwork, Error> {
        self.start_polling(dom0, Duration::ZERO)
    }

    /// As [`Network::start`], the thread polling its doorbells for `poll` after its
    /// last work before it sleeps: no wake-up on the next frame of a burst, at the
    /// price of a CPU kept busy meanwhile (for a NIC server on a CPU of its own, as
    /// hardware is; never for domain 0's switch, which shares the guests' CPUs).
    pub fn start_polling(
        &self,
        dom0: Option<Arc<ThreadGroup>>,
        poll: Duration,
    ) -> Result<RunningNetwork, Error> {
        keep_freed_memory();
        let events = Events::new()?;
        events.add(self.shared.control.as_raw_fd(), CONTROL)?;
        let ports = self.shared.ports();
        for (port, endpoint) in ports.iter().enumerate() {
            match endpoint {
                Endpoint::Nic(nic) => {
                    for (queue, fd) in nic.notify.iter().enumerate() {
                        events.add(fd.as_raw_fd(), token(port, queue as u16))?;
                    }
                }
                Endpoint::Wire(wire) => events.add(wire.event.as_raw_fd(), token(port, 0))?,
            }
        }
        // NICs attached from now on are added by the switch thread (`Change::Added`).
        self.shared.started.store(true, Ordering::Relaxed);
        drop(ports);
        let boost = dom0.is_none();
        let worker = BackendWorker::spawn(
            "net-switch",
            self.shared.worker.clone(),
            events.clone(),
            dom0,
            Worker {
                shared: self.shared.clone(),
                work: VecDeque::new(),
                queued: Vec::new(),
                poll,
                events,
                last_work: Instant::now(),
                woke: None,
                boost,
            },
        )?;
        Ok(RunningNetwork {
            shared: self.shared.clone(),
            worker,
        })
    }

    pub fn switch_stats(&self) -> SwitchStats {
        self.shared.switch().stats()
    }

    /// How often the switch thread woke and how long it worked after waking (the
    /// frames' copies and the interrupts they raise: the "hardware" time of a frame).
    pub fn worker_stats(&self) -> WorkerStats {
        self.shared.worker_stats()
    }

    /// The counters of the NIC on `port`.
    pub fn nic_stats(&self, port: PortId) -> Option<NetStats> {
        self.shared.nic(port)?.model().map(|n| n.stats())
    }
}

/// One doorbell eventfd per queue.
fn new_doorbells(queues: u16) -> Result<Vec<EventFd>, Error> {
    (0..queues)
        .map(|_| EventFd::new(EFD_NONBLOCK).map_err(os("creating a queue doorbell eventfd")))
        .collect()
}

fn duplicate(fds: &[EventFd]) -> Result<Vec<EventFd>, Error> {
    fds.iter()
        .map(|fd| fd.try_clone().map_err(os("duplicating a doorbell eventfd")))
        .collect()
}

/// The switch thread's work since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerStats {
    pub wakeups: u64,
    pub busy: std::time::Duration,
    /// Frames delivered to receivers.
    pub delivered: u64,
}

impl WorkerStats {
    /// One line, as `kumo nic-server` prints it and [`WorkerStats::parse`] reads it.
    pub fn line(&self) -> String {
        format!(
            "switch thread: wakeups={} busy_ns={} delivered={}",
            self.wakeups,
            self.busy.as_nanos(),
            self.delivered
        )
    }

    /// The counters in a line made by [`WorkerStats::line`], if it holds them.
    pub fn parse(line: &str) -> Option<WorkerStats> {
        let (_, fields) = line.split_once("switch thread: ")?;
        let mut values = fields.split(' ').map(|f| f.split_once('=').map(|(_, v)| v));
        let mut next = || values.next().flatten()?.parse::<u64>().ok();
        Some(WorkerStats {
            wakeups: next()?,
            busy: std::time::Duration::from_nanos(next()?),
            delivered: next()?,
        })
    }
}

/// The switch thread; stopped and joined when dropped.
pub struct RunningNetwork {
    shared: Arc<Shared>,
    worker: BackendWorker,
}

impl RunningNetwork {
    pub fn switch_stats(&self) -> SwitchStats {
        self.shared.switch().stats()
    }

    pub fn worker_stats(&self) -> WorkerStats {
        self.shared.worker_stats()
    }
}

impl Drop for RunningNetwork {
    fn drop(&mut self) {
        self.worker.stop();
        for endpoint in self.shared.ports().iter() {
            if let Endpoint::Wire(wire) = endpoint {
                wire.close();
            }
        }
    }
}

/// Under the host's scheduler (no credit domain 0), the switch thread gets a larger
/// CFS share than the vCPU threads (nice -10, as a dom0 weight above the guests'):
/// with every rank spinning on its own CPU, a switch thread at equal weight runs only
/// when CFS preempts a spinner, milliseconds later. Needs CAP_SYS_NICE; without it the
/// thread stays at its normal weight.
fn boost_current_thread() {
    // SAFETY: setpriority on this thread's TID with a constant priority; no memory is
    // passed.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, -10) };
    if rc != 0 {
        tracing::debug!(
            "switch thread: nice -10 refused ({})",
            std::io::Error::last_os_error()
        );
    }
}

/// The switch allocates a buffer per frame in flight and frees it on delivery. glibc
/// hands the free top of a thread's heap back to the kernel past 128 KiB, so a thread
/// whose heap holds little else (a `kumo nic-server`'s switch) gave each 1 MiB burst's
/// memory back and faulted it in again for the next: 141 000 page faults a second,
/// 3.5 µs of switch time per frame against 1.0 µs in kumo's own process. Keeping up to
/// 64 MiB of freed memory ends that (process-wide; glibc only, a no-op elsewhere).
fn keep_freed_memory() {
    // SAFETY: mallopt only changes this process's allocator tuning; no memory is passed.
    unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20) };
}

/// A RARP request from `mac` to everyone (QEMU's self-announce frame): ignored by the
/// guests' MPI (another EtherType), learnt by every switch it crosses.
fn announcement(mac: [u8; 6]) -> Vec<u8> {
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&0x8035u16.to_be_bytes()); // RARP
    frame.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]); // Ethernet/IPv4, request reverse
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0; 4]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&[0; 4]);
    frame.resize(60, 0); // the Ethernet minimum, without FCS
    frame
}

fn token(port: PortId, queue: u16) -> u64 {
    ((port as u64) << 16) | u64::from(queue)
}

/// Work for the switch thread: pull a port's TX ring, or push frames to its RX ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    Transmit(PortId),
    Deliver(PortId),
}

struct Worker {
    shared: Arc<Shared>,
    work: VecDeque<Work>,
    /// Work items already queued (a port's TX and RX are each queued once).
    queued: Vec<Work>,
    /// How long to poll for doorbells after the last work before sleeping.
    poll: Duration,
    /// The thread's own epoll set, for NICs attached while it runs.
    events: Events,
    last_work: Instant,
    /// When the current wake-up began.
    woke: Option<Instant>,
    /// Not in a credit domain 0: take a larger CFS share (`boost_current_thread`).
    boost: bool,
}

impl Handler for Worker {
    fn started(&mut self) {
        if self.boost {
            boost_current_thread();
        }
    }

    fn timeout(&mut self) -> Option<Duration> {
        let polling = !self.poll.is_zero() && self.last_work.elapsed() < self.poll;
        polling.then_some(Duration::ZERO)
    }

    fn handle(&mut self, token: u64, _events: EventSet) {
        self.woke.get_or_insert_with(Instant::now);
        match token {
            CONTROL => {
                let _ = self.shared.control.read();
                self.apply_changes();
            }
            data => self.doorbell((data >> 16) as PortId, data as u16),
        }
    }

    fn after_events(&mut self) {
        let woke = self.woke.take().unwrap_or_else(Instant::now);
        self.drain();
        self.shared.wakeups.fetch_add(1, Ordering::Relaxed);
        self.shared
            .busy_ns
            .fetch_add(woke.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if !self.poll.is_zero() {
            self.last_work = Instant::now();
        }
    }
}

impl Worker {
    fn push(&mut self, work: Work) {
        if !self.queued.contains(&work) {
            self.queued.push(work);
            self.work.push_back(work);
        }
    }

    fn apply_changes(&mut self) {
        loop {
            let change = self
                .shared
                .changes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            let Some(change) = change else { break };
            match change {
                Change::Up(port) => {
                    self.shared.switch().set_up(port, true);
                    // Frames the guest queued before DRIVER_OK.
                    self.push(Work::Transmit(port));
                }
                Change::Down(port) => {
                    let unblocked = self.shared.switch().set_up(port, false);
                    for source in unblocked {
                        self.push(Work::Transmit(source));
                    }
                }
                Change::Resume(port) => self.push(Work::Transmit(port)),
                Change::Added(port) => {
                    if let Some(nic) = self.shared.nic(port) {
                        for (queue, fd) in nic.notify.iter().enumerate() {
                            if let Err(e) =
                                self.events.add(fd.as_raw_fd(), token(port, queue as u16))
                            {
                                tracing::error!("switch port {port}: its doorbells: {e}");
                            }
                        }
                    }
                    self.push(Work::Transmit(port));
                }
                Change::Announce(port, mac) => {
                    let mut switch = self.shared.switch();
                    let taken = switch.ingress(port, &announcement(mac));
                    tracing::debug!("port {port} announced {mac:02x?}: {taken:?}");
                    let receivers: Vec<PortId> = (0..self.shared.ports().len())
                        .filter(|&p| switch.pending(p) > 0)
                        .collect();
                    drop(switch);
                    for receiver in receivers {
                        self.push(Work::Deliver(receiver));
                    }
                }
            }
        }
    }

    fn doorbell(&mut self, port: PortId, queue: u16) {
        let nic = match self.shared.endpoint(port) {
            Some(Endpoint::Nic(nic)) => nic,
            Some(Endpoint::Wire(wire)) => {
                // Frames arrived or the outbox has room: both directions may move.
                let _ = wire.event.read();
                self.push(Work::Transmit(port));
                self.push(Work::Deliver(port));
                return;
            }
            None => return,
        };
        if let Some(fd) = nic.notify.get(usize::from(queue)) {
            let _ = fd.read();
        }
        let Some(net) = nic.model() else {
            return; // a served port with no client: nothing to serve
        };
        match net.queue_role(queue) {
            Some(QueueRole::Tx(_)) => self.push(Work::Transmit(port)),
            Some(QueueRole::Rx(_)) => self.push(Work::Deliver(port)),
            Some(QueueRole::Ctrl) => {
                net.process_ctrl();
            }
            None => {}
        }
    }

    /// Runs work until none is left: a transmit may give receivers frames, a delivery
    /// may unblock senders.
    fn drain(&mut self) {
        while let Some(work) = self.work.pop_front() {
            self.queued.retain(|w| *w != work);
            match work {
                Work::Transmit(port) => self.transmit(port),
                Work::Deliver(port) => self.deliver(port),
            }
        }
    }

    fn transmit(&mut self, port: PortId) {
        let Some(endpoint) = self.shared.endpoint(port) else {
            return;
        };
        let shared = self.shared.clone();
        let mut switch = shared.switch();
        let (mut frames, mut bytes) = (0u64, 0u64);
        let mut ingress = |frame: &[u8]| {
            let taken = switch.ingress(port, frame).taken();
            if taken {
                frames += 1;
                bytes += frame.len() as u64;
            }
            taken
        };
        match endpoint {
            Endpoint::Nic(nic) => {
                if let Some(net) = nic.model() {
                    for pair in 0..net.queue_pairs() {
                        if net.transmit(pair, &mut ingress).stopped {
                            break;
                        }
                    }
                }
            }
            Endpoint::Wire(wire) => wire.take_frames(&mut ingress),
        }
        let receivers: Vec<PortId> = (0..self.shared.ports().len())
            .filter(|&p| switch.pending(p) > 0)
            .collect();
        drop(switch);
        self.spend_modelled_cost(frames, bytes);
        for receiver in receivers {
            self.push(Work::Deliver(receiver));
        }
    }

    /// The modelled backend's CPU for `frames` frames of `bytes` in all, spent
    /// spinning (outside the switch's lock) on the thread's own CPU clock, so that it
    /// is domain 0's CPU time, as a copy would be, and still owed when a vCPU
    /// preempts it half way. (A spin on the wall clock let preemption do the work:
    /// under S1's 1/1 ms the loaded domain 0 ran 5,600 frames of CG.W in 1.9 s of
    /// CPU, and 4,900 in 2.2 s at 30/10.)
    fn spend_modelled_cost(&self, frames: u64, bytes: u64) {
        let per_frame = self.shared.frame_cost_ns.load(Ordering::Relaxed);
        let per_kib = self.shared.kib_cost_ns.load(Ordering::Relaxed);
        let ns = frames
            .saturating_mul(per_frame)
            .saturating_add(bytes.saturating_mul(per_kib) / 1024);
        if ns > 0 {
            crate::placement::spin_cpu(std::time::Duration::from_nanos(ns));
        }
    }

    fn deliver(&mut self, port: PortId) {
        let Some(endpoint) = self.shared.endpoint(port) else {
            return;
        };
        let shared = self.shared.clone();
        let mut switch = shared.switch();
        let egress = match endpoint {
            Endpoint::Nic(nic) => match nic.model() {
                Some(net) => net.receive_batch(|batch| {
                    switch.egress(port, |frame| batch.push(frame).consumed())
                }),
                None => return,
            },
            Endpoint::Wire(wire) => switch.egress(port, |frame| wire.send(frame)),
        };
        drop(switch);
        for source in egress.unblocked {
            self.push(Work::Transmit(source));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    /// A broadcast frame (flooded to every other port) in the wire's framing.
    fn framed() -> (Vec<u8>, Vec<u8>) {
        let mut frame = vec![0xff; 6];
        frame.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x88, 0xb5]);
        frame.extend_from_slice(&[7; 50]);
        let mut bytes = (frame.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&frame);
        (frame, bytes)
    }

    #[test]
    fn a_held_switch_forwards_nothing_until_released() {
        let network = Network::new(SwitchConfig::default()).unwrap();
        // Not running yet: holding returns at once.
        network.shared.worker.pause();
        network.shared.worker.resume();
        let (a_near, mut a_far) = UnixStream::pair().unwrap();
        let (b_near, mut b_far) = UnixStream::pair().unwrap();
        network.attach_wire(a_near, None).unwrap();
        network.attach_wire(b_near, None).unwrap();
        let running = network.start(None).unwrap();
        let gate = &network.shared.worker;
        gate.pause();
        assert!(
            gate.is_parked(),
            "hold returns once the switch thread is parked"
        );
        let (frame, bytes) = framed();
        a_far.write_all(&bytes).unwrap();
        // Parked, the switch thread cannot forward it (the wire's reader takes it in).
        b_far
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut length = [0u8; 4];
        let err = b_far.read_exact(&mut length).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{err}"
        );
        gate.resume();
        b_far
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        b_far.read_exact(&mut length).unwrap();
        let mut got = vec![0u8; u32::from_be_bytes(length) as usize];
        b_far.read_exact(&mut got).unwrap();
        assert_eq!(got, frame, "forwarded once released");
        // A hand-off closes the wires before the switch moves again: the far end
        // sees the wire end, and nothing of what the held switch had.
        let (c_near, mut c_far) = UnixStream::pair().unwrap();
        let (d_near, d_far) = UnixStream::pair().unwrap();
        let handed = Network::new(SwitchConfig::default()).unwrap();
        handed.attach_wire(c_near, None).unwrap();
        handed.attach_wire(d_near, None).unwrap();
        let handed_running = handed.start(None).unwrap();
        handed.shared.worker.pause();
        (&d_far).write_all(&bytes).unwrap();
        handed.shared.close_wires_and_release();
        c_far
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut rest = Vec::new();
        c_far.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "the wire ended with nothing forwarded");
        assert_eq!(handed.shared.worker.holds(), 0, "released");
        drop(handed_running);
        // A network dropped while held still ends.
        gate.pause();
        drop(running);
        assert!(!gate.is_running());
    }

    #[test]
    fn an_announcement_floods_a_rarp_frame_and_binds_the_mac_to_its_port() {
        let network = Network::new(SwitchConfig::default()).unwrap();
        let (a_near, _a_far) = UnixStream::pair().unwrap();
        let (b_near, mut b_far) = UnixStream::pair().unwrap();
        let a = network.attach_wire(a_near, None).unwrap();
        network.attach_wire(b_near, None).unwrap();
        let running = network.start(None).unwrap();
        let mac = [2, 0x6b, 0x75, 0, 0, 7];
        network.announce(a, mac);
        b_far
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut length = [0u8; 4];
        b_far.read_exact(&mut length).unwrap();
        let mut got = vec![0u8; u32::from_be_bytes(length) as usize];
        b_far.read_exact(&mut got).unwrap();
        assert_eq!(got.len(), 60);
        assert_eq!(&got[..6], &[0xff; 6], "broadcast");
        assert_eq!(&got[6..12], &mac, "from the MAC announced");
        assert_eq!(&got[12..14], &[0x80, 0x35], "RARP");
        // This switch (like the one across the wire) sends that MAC's frames the way
        // the announcement came.
        assert_eq!(network.shared.switch().lookup(&mac), Some(a));
        drop(running);
    }

    #[test]
    fn a_modelled_backend_cost_is_spent_on_every_frame_taken_in() {
        let network = Network::new(SwitchConfig::default()).unwrap();
        // 10 ms a frame and 1 s per KiB: three 64-byte frames cost 3 x (10 + 62.5) ms.
        network.model_backend_cost(Duration::from_millis(10), Duration::from_secs(1));
        let (a_near, mut a_far) = UnixStream::pair().unwrap();
        let (b_near, mut b_far) = UnixStream::pair().unwrap();
        network.attach_wire(a_near, None).unwrap();
        network.attach_wire(b_near, None).unwrap();
        let running = network.start(None).unwrap();
        let (frame, bytes) = framed();
        for _ in 0..3 {
            a_far.write_all(&bytes).unwrap();
        }
        b_far
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        for _ in 0..3 {
            let mut length = [0u8; 4];
            b_far.read_exact(&mut length).unwrap();
            let mut got = vec![0u8; u32::from_be_bytes(length) as usize];
            b_far.read_exact(&mut got).unwrap();
            assert_eq!(got, frame);
        }
        let per_frame = Duration::from_millis(10)
            + Duration::from_secs(1) * u32::try_from(frame.len()).unwrap() / 1024;
        // The worker adds a wake-up's busy time after it has forwarded the frames:
        // stop it (joined) before reading, or the last frame may not be counted yet.
        drop(running);
        let busy = network.worker_stats().busy;
        assert!(
            busy >= per_frame * 3,
            "busy {busy:?}, 3 x {per_frame:?} spent"
        );
    }

    #[test]
    fn a_vms_nic_holds_its_network_weakly_so_both_end_with_their_owners() {
        if !crate::testing::kvm_available() {
            return;
        }
        let code = [0xf4u8]; // hlt
        let mut vm =
            crate::builder::build_for_boot(crate::testing::code_vm(1, 64, &code)).expect("VM");
        let network = Network::new(SwitchConfig::default()).unwrap();
        let setup = NicSetup {
            mac: [2, 0, 0, 0, 0, 1],
            irq_path: crate::irq::IrqPath::Generic,
        };
        network.attach(&mut vm, &setup, None).expect("NIC");
        // Only the network owns its state: the NIC's device (owned through the network's
        // ports) and the VM's migration hook refer back weakly. A strong reference back
        // kept every network, its NICs' interrupt threads and their VMs' memory alive
        // for the life of the process (an experiment of 91 runs ran out of memory).
        assert_eq!(Arc::strong_count(&network.shared), 1);
        let weak = Arc::downgrade(&network.shared);
        drop(network);
        assert!(
            weak.upgrade().is_none(),
            "the network's state ended with it"
        );
        drop(vm);
    }
}
