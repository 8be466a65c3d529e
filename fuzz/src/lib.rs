//! What the fuzz targets share: a cursor over the fuzzer's bytes, guest memory filled
//! from them, split virtqueues placed where the bytes say, and interrupt and action
//! sinks that only count (a device must never panic whatever the guest wrote).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use devices::interrupt::{InterruptSourceGroup, MsiMessage};
use devices::virtio::transport::{ActionSink, TransportAction};
use devices::virtio::{Activation, InterruptCause, VirtioDevice, VirtioInterrupt, features};
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest RAM every device target runs on: small, so a fuzzer's bytes cover much of it.
pub const MEM_SIZE: usize = 64 * 1024;

/// Reads fixed-size values off the front of the fuzzer's bytes; zeros once they run out.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { data }
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (head, tail) = self.data.split_at(n);
        self.data = tail;
        head
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }

    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }

    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(self.data.len())
    }
}

/// [`MEM_SIZE`] bytes of guest RAM at address 0 holding `contents` (the rest zero).
pub fn guest_memory(contents: &[u8]) -> GuestMemoryMmap {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)])
        .expect("a small anonymous mapping");
    let n = contents.len().min(MEM_SIZE);
    mem.write_slice(&contents[..n], GuestAddress(0))
        .expect("within the mapping");
    mem
}

/// A ready split queue of up to `max_size` entries whose size and ring addresses come
/// from `input`, as a driver would program them through the transport. Addresses are
/// aligned as virtio requires and may lie anywhere, also past RAM's end (the device
/// must then refuse the queue or find nothing, never read out of bounds).
pub fn queue(input: &mut Input<'_>, max_size: u16) -> Queue {
    let mut queue = Queue::new(max_size).expect("the device's own maximum is valid");
    let size = 1u16 << (input.u8() % 16);
    queue.set_size(size.min(max_size));
    let place = |raw: u16, align: u64| u64::from(raw) & !(align - 1);
    let _ = queue.try_set_desc_table_address(GuestAddress(place(input.u16(), 16)));
    let _ = queue.try_set_avail_ring_address(GuestAddress(place(input.u16(), 2)));
    let _ = queue.try_set_used_ring_address(GuestAddress(place(input.u16(), 4)));
    queue.set_event_idx(input.u8() & 1 == 1);
    queue.set_ready(true);
    queue
}

/// Activates `device` as a driver would: the features it offers masked by a word of
/// `setup`, with VERSION_1, and each of its queues placed by [`queue`] from `setup`;
/// interrupts go to a [`Sink`]. False if the device refused the activation (then the
/// target has nothing more to drive).
pub fn activate(device: &dyn VirtioDevice, setup: &mut Input<'_>) -> bool {
    let features = (device.features() & setup.u64()) | features::VERSION_1;
    let queues = device
        .queue_max_sizes()
        .into_iter()
        .map(|max| queue(setup, max))
        .collect();
    device
        .activate(Activation {
            features,
            queues,
            interrupt: std::sync::Arc::new(Sink::default()),
        })
        .is_ok()
}

/// Interrupts and transport actions, counted and otherwise dropped.
#[derive(Default)]
pub struct Sink {
    pub interrupts: AtomicUsize,
    pub actions: Mutex<Vec<TransportAction>>,
}

impl VirtioInterrupt for Sink {
    fn trigger(&self, _cause: InterruptCause) {
        self.interrupts.fetch_add(1, Ordering::Relaxed);
    }
}

impl InterruptSourceGroup for Sink {
    fn trigger(&self, _index: u16) {
        self.interrupts.fetch_add(1, Ordering::Relaxed);
    }

    fn update(&self, _index: u16, _route: Option<MsiMessage>) {}
}

impl ActionSink for Sink {
    fn act(&self, action: TransportAction) {
        if let Ok(mut actions) = self.actions.lock() {
            actions.push(action);
        }
    }
}

/// Doorbells as the bus attaches and detaches them, checked as KVM would check
/// ioeventfds: never attached twice at one address, never detached unless attached.
#[derive(Default)]
pub struct Doorbells {
    attached: Mutex<Vec<(u8, u32, u64)>>,
}

impl devices::pci::DoorbellWiring for Doorbells {
    fn attach(&self, slot: u8, id: u32, address: u64) {
        let mut attached = self.attached.lock().expect("not poisoned");
        assert!(
            !attached.contains(&(slot, id, address)),
            "doorbell {id} of slot {slot} attached twice at {address:#x}"
        );
        attached.push((slot, id, address));
    }

    fn detach(&self, slot: u8, id: u32, address: u64) {
        let mut attached = self.attached.lock().expect("not poisoned");
        let at = attached.iter().position(|w| *w == (slot, id, address));
        let at = at.unwrap_or_else(|| {
            panic!("doorbell {id} of slot {slot} detached at {address:#x} but not attached")
        });
        attached.swap_remove(at);
    }
}

/// Bus 0 as a VM with one NIC (two queue pairs) and one read-only disk has it: the
/// host bridge, a virtio-net and a virtio-blk function, their BARs placed.
pub struct Machine {
    pub bus: std::sync::Arc<devices::pci::PciBus>,
    pub net: std::sync::Arc<devices::virtio::net::VirtioNet<GuestMemoryMmap>>,
    pub blk: std::sync::Arc<devices::virtio::block::VirtioBlock<GuestMemoryMmap>>,
    pub net_fn: std::sync::Arc<devices::virtio::transport::VirtioPciDevice>,
    pub blk_fn: std::sync::Arc<devices::virtio::transport::VirtioPciDevice>,
    pub net_slot: u8,
    pub blk_slot: u8,
    pub sink: std::sync::Arc<Sink>,
}

/// Where [`Machine`] places its functions' BARs (as the VMM's allocator would).
pub const NET_BAR: u64 = 0xc000_0000;
pub const BLK_BAR: u64 = 0xc001_0000;

impl Machine {
    pub fn new(mem: GuestMemoryMmap) -> Machine {
        use devices::virtio::block::{BlockConfig, VirtioBlock, default_id};
        use devices::virtio::net::{NetConfig, VirtioNet};
        use devices::virtio::transport::VirtioPciDevice;
        use std::sync::Arc;

        let sink = Arc::new(Sink::default());
        let net = Arc::new(
            VirtioNet::new(
                NetConfig {
                    mac: [2, 0, 0, 0, 0, 1],
                    queue_pairs: 2,
                    queue_size: 256,
                },
                mem.clone(),
            )
            .expect("a valid NIC"),
        );
        let image = std::fs::File::open("/dev/null").expect("/dev/null");
        let config = BlockConfig {
            readonly: true,
            id: default_id(0),
            queue_size: 128,
        };
        let blk = Arc::new(VirtioBlock::new(config, image, mem).expect("a valid disk"));
        let transport = |device: Arc<dyn devices::virtio::VirtioDevice>, bar: u64| {
            let function = VirtioPciDevice::new(device, sink.clone(), sink.clone())
                .expect("a valid transport");
            function.place_bar(bar);
            Arc::new(function)
        };
        let net_fn = transport(net.clone(), NET_BAR);
        let blk_fn = transport(blk.clone(), BLK_BAR);
        let mut bus = devices::pci::PciBus::new(hv::layout::PCI_ECAM_BASE);
        bus.set_doorbell_wiring(Arc::new(Doorbells::default()));
        let net_slot = bus.add(net_fn.clone()).expect("a free slot");
        let blk_slot = bus.add(blk_fn.clone()).expect("a free slot");
        Machine {
            bus: Arc::new(bus),
            net,
            blk,
            net_fn,
            blk_fn,
            net_slot,
            blk_slot,
            sink,
        }
    }
}
