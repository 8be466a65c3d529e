//! A learning Ethernet switch that loses nothing silently: domain 0's bridge between
//! the NICs of a node's VMs.
//!
//! - **Learning**: each frame's source MAC is bound to the port it came in on (a bounded
//!   table; a MAC seen on a new port moves).
//! - **Forwarding**: unicast to a learned MAC goes to its port; broadcast, multicast and
//!   unknown unicast are flooded to every other port that is up.
//! - **Queues**: each destination port keeps one FIFO per source port, each bounded to
//!   [`SwitchConfig::queue_frames`]. Frames between two ports stay in order.
//! - **Back-pressure, no loss**: when a destination's FIFO from a source is full, the
//!   switch keeps the frame (parked, with the destinations still owed) and the source
//!   is *blocked*: [`Switch::ingress`] refuses its next frames ([`Ingress::Blocked`],
//!   the caller leaves them in the guest's TX ring) until egress makes room and
//!   [`Egress::unblocked`] names it. A flood places the frame where there is room and
//!   owes it to the rest, so a frame is never duplicated or lost.
//! - **Fairness**: a destination drains its FIFOs round-robin over source ports, so
//!   two senders to one receiver share it frame by frame.
//! - **Malformed frames** (shorter than an Ethernet header, longer than
//!   [`SwitchConfig::max_frame`]) are dropped and counted, as are frames with nowhere
//!   to go (unicast to a port that is down, to the port it came from, a flood with no
//!   other port up) and frames queued for a port when it goes down (its driver reset).
//!
//! The data path copies each frame once, from the sender's TX buffers into a shared
//! buffer (`Arc`, so a flood does not copy again), and once more into each receiver's
//! RX buffers. The switch only decides where a frame goes from its header, so a
//! zero-intermediate-copy path (TX buffers straight into RX buffers when the
//! destination has room) can be added beside this one without changing the policy.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A port's number (index in the switch).
pub type PortId = usize;

/// Bytes of an Ethernet header (destination, source, EtherType).
pub const ETHERNET_HEADER_LEN: usize = 14;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchConfig {
    /// Frames each destination holds from each source before that source is blocked.
    pub queue_frames: usize,
    /// Largest frame accepted (Ethernet header and payload, no FCS).
    pub max_frame: usize,
    /// MAC addresses remembered; beyond that, new ones are not learned (and flooded).
    pub mac_table: usize,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            queue_frames: 256,
            max_frame: crate::virtio::net::MAX_FRAME_LEN,
            mac_table: 4096,
        }
    }
}

/// What became of a frame offered by a source port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingress {
    /// Queued for `.0` ports.
    Forwarded(usize),
    /// Taken, but some destination is full: the switch keeps it and the source is now
    /// blocked until [`Egress::unblocked`] names it.
    Held,
    /// Not taken: the source is blocked by an earlier held frame. Offer it again
    /// after the source is unblocked.
    Blocked,
    /// Dropped and counted.
    Dropped(DropReason),
}

impl Ingress {
    /// Whether the switch took the frame (the caller may release the sender's buffer).
    pub fn taken(self) -> bool {
        self != Ingress::Blocked
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// Shorter than an Ethernet header.
    Runt,
    /// Longer than [`SwitchConfig::max_frame`].
    Giant,
    /// Unicast to the port it came from.
    Hairpin,
    /// Unicast to a port that is down.
    PortDown,
    /// Flooded with no other port up.
    NoDestination,
    /// The source port does not exist or is down.
    BadSource,
}

/// What an egress pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Egress {
    /// Frames the receiver took.
    pub delivered: usize,
    /// Source ports whose held frame is now fully queued: resume their TX.
    pub unblocked: Vec<PortId>,
}

/// Counters (monotonic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Frames taken from sources.
    pub received: u64,
    /// Frame copies queued for destinations (a flood counts once per destination).
    pub queued: u64,
    /// Frame copies the destinations took.
    pub delivered: u64,
    /// Frames that had to be flooded.
    pub flooded: u64,
    /// Times a source was blocked by a full destination.
    pub held: u64,
    pub runts: u64,
    pub giants: u64,
    pub hairpin: u64,
    pub port_down: u64,
    pub no_destination: u64,
    pub bad_source: u64,
    /// Queued frame copies discarded because their destination went down or away.
    pub discarded: u64,
    /// Source MACs not learned because the table was full.
    pub table_full: u64,
}

/// A frame a source could not place everywhere yet.
struct Parked {
    frame: Arc<[u8]>,
    owed: Vec<PortId>,
}

struct Port {
    up: bool,
    /// Frames for this port, one FIFO per source port.
    inbox: Vec<VecDeque<Arc<[u8]>>>,
    /// Frames in `inbox`.
    pending: usize,
    /// Next source to serve (round-robin).
    cursor: usize,
    /// This port's held frame, as a source.
    parked: Option<Parked>,
}

impl Port {
    fn new(ports: usize) -> Port {
        Port {
            up: true,
            inbox: (0..ports).map(|_| VecDeque::new()).collect(),
            pending: 0,
            cursor: 0,
            parked: None,
        }
    }
}

/// The switch. Not synchronised: the VMM wraps it in a lock (or gives it a thread).
pub struct Switch {
    config: SwitchConfig,
    ports: Vec<Option<Port>>,
    macs: HashMap<[u8; 6], PortId>,
    stats: SwitchStats,
}

fn is_group(mac: &[u8]) -> bool {
    mac.first().is_some_and(|b| b & 1 != 0)
}

impl Switch {
    pub fn new(config: SwitchConfig) -> Switch {
        Switch {
            config: SwitchConfig {
                queue_frames: config.queue_frames.max(1),
                ..config
            },
            ports: Vec::new(),
            macs: HashMap::new(),
            stats: SwitchStats::default(),
        }
    }

    pub fn stats(&self) -> SwitchStats {
        self.stats
    }

    /// A new port, up.
    pub fn add_port(&mut self) -> PortId {
        let id = self
            .ports
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.ports.len());
        if id == self.ports.len() {
            self.ports.push(None);
        }
        let count = self.ports.len();
        for port in self.ports.iter_mut().flatten() {
            port.inbox.resize_with(count, VecDeque::new);
        }
        self.ports[id] = Some(Port::new(count));
        id
    }

    /// Removes `port`: frames queued for it are discarded (counted), frames it was
    /// owed by blocked sources are forgiven. Returns sources unblocked by this.
    pub fn remove_port(&mut self, port: PortId) -> Vec<PortId> {
        let unblocked = self.set_up(port, false);
        if let Some(slot) = self.ports.get_mut(port) {
            *slot = None;
        }
        // Frames it sent that still wait elsewhere are delivered as usual.
        unblocked
    }

    /// Whether `port` exists and is up.
    pub fn is_up(&self, port: PortId) -> bool {
        self.port(port).is_some_and(|p| p.up)
    }

    /// Brings `port` up or down (its NIC's driver activated it or reset it). Going
    /// down discards what was queued for it (counted), forgets its MACs, drops its own
    /// held frame's remaining destinations and releases sources waiting on it; returns
    /// those sources.
    pub fn set_up(&mut self, port: PortId, up: bool) -> Vec<PortId> {
        let Some(p) = self.port_mut(port) else {
            return Vec::new();
        };
        p.up = up;
        if up {
            return Vec::new();
        }
        let mut discarded = 0;
        for fifo in &mut p.inbox {
            discarded += fifo.len() as u64;
            fifo.clear();
        }
        p.pending = 0;
        if let Some(parked) = p.parked.take() {
            discarded += parked.owed.len() as u64;
        }
        self.stats.discarded += discarded;
        self.macs.retain(|_, &mut owner| owner != port);
        let mut unblocked = Vec::new();
        for (source, p) in self.ports.iter_mut().enumerate() {
            let Some(p) = p else { continue };
            if let Some(parked) = &mut p.parked
                && let Some(at) = parked.owed.iter().position(|&d| d == port)
            {
                parked.owed.remove(at);
                self.stats.discarded += 1;
                if parked.owed.is_empty() {
                    p.parked = None;
                    unblocked.push(source);
                }
            }
        }
        unblocked
    }

    /// Whether `port` is blocked by a held frame.
    pub fn is_blocked(&self, port: PortId) -> bool {
        self.port(port).is_some_and(|p| p.parked.is_some())
    }

    /// Frames waiting for `port`.
    pub fn pending(&self, port: PortId) -> usize {
        self.port(port).map_or(0, |p| p.pending)
    }

    /// The port `mac` was learned on.
    pub fn lookup(&self, mac: &[u8; 6]) -> Option<PortId> {
        self.macs.get(mac).copied()
    }

    fn port(&self, port: PortId) -> Option<&Port> {
        self.ports.get(port)?.as_ref()
    }

    fn port_mut(&mut self, port: PortId) -> Option<&mut Port> {
        self.ports.get_mut(port)?.as_mut()
    }

    /// Where a frame from `source` goes, or why nowhere.
    fn destinations(&mut self, source: PortId, frame: &[u8]) -> Result<Vec<PortId>, DropReason> {
        let destination = &frame[..6];
        if !is_group(destination) {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(destination);
            if let Some(&port) = self.macs.get(&mac) {
                return if port == source {
                    Err(DropReason::Hairpin)
                } else if !self.is_up(port) {
                    Err(DropReason::PortDown)
                } else {
                    Ok(vec![port])
                };
            }
        }
        self.stats.flooded += 1;
        let ports: Vec<PortId> = self
            .ports
            .iter()
            .enumerate()
            .filter(|&(id, p)| id != source && p.as_ref().is_some_and(|p| p.up))
            .map(|(id, _)| id)
            .collect();
        if ports.is_empty() {
            Err(DropReason::NoDestination)
        } else {
            Ok(ports)
        }
    }

    fn learn(&mut self, source: PortId, frame: &[u8]) {
        let mut mac = [0u8; 6];
        mac.copy_from_slice(&frame[6..12]);
        if is_group(&mac) {
            return;
        }
        if self.macs.len() >= self.config.mac_table && !self.macs.contains_key(&mac) {
            self.stats.table_full += 1;
            return;
        }
        self.macs.insert(mac, source);
    }

    fn drop_frame(&mut self, reason: DropReason) -> Ingress {
        let counter = match reason {
            DropReason::Runt => &mut self.stats.runts,
            DropReason::Giant => &mut self.stats.giants,
            DropReason::Hairpin => &mut self.stats.hairpin,
            DropReason::PortDown => &mut self.stats.port_down,
            DropReason::NoDestination => &mut self.stats.no_destination,
            DropReason::BadSource => &mut self.stats.bad_source,
        };
        *counter += 1;
        Ingress::Dropped(reason)
    }

    /// `source` sends `frame` (an Ethernet frame without FCS).
    pub fn ingress(&mut self, source: PortId, frame: &[u8]) -> Ingress {
        match self.port(source) {
            None => return self.drop_frame(DropReason::BadSource),
            Some(p) if !p.up => return self.drop_frame(DropReason::BadSource),
            Some(p) if p.parked.is_some() => return Ingress::Blocked,
            Some(_) => {}
        }
        if frame.len() < ETHERNET_HEADER_LEN {
            return self.drop_frame(DropReason::Runt);
        }
        if frame.len() > self.config.max_frame {
            return self.drop_frame(DropReason::Giant);
        }
        self.stats.received += 1;
        self.learn(source, frame);
        let destinations = match self.destinations(source, frame) {
            Ok(d) => d,
            Err(reason) => return self.drop_frame(reason),
        };
        let shared: Arc<[u8]> = Arc::from(frame);
        let bound = self.config.queue_frames;
        let mut owed = Vec::new();
        let mut queued = 0;
        for &d in &destinations {
            let Some(port) = self.port_mut(d) else {
                continue;
            };
            let fifo = &mut port.inbox[source];
            if fifo.len() < bound {
                fifo.push_back(shared.clone());
                port.pending += 1;
                queued += 1;
            } else {
                owed.push(d);
            }
        }
        self.stats.queued += queued;
        if owed.is_empty() {
            return Ingress::Forwarded(destinations.len());
        }
        self.stats.held += 1;
        if let Some(port) = self.port_mut(source) {
            port.parked = Some(Parked {
                frame: shared,
                owed,
            });
        }
        Ingress::Held
    }

    /// Offers the frames waiting for `destination` to `deliver`, round-robin over
    /// sources, until it refuses one (the receiver has no buffer: the frame stays
    /// first in line) or none are left.
    pub fn egress(
        &mut self,
        destination: PortId,
        mut deliver: impl FnMut(&[u8]) -> bool,
    ) -> Egress {
        let mut egress = Egress::default();
        let Some(mut port) = self.ports.get_mut(destination).and_then(Option::as_mut) else {
            return egress;
        };
        let sources = port.inbox.len();
        while port.pending > 0 {
            let Some(source) = (0..sources)
                .map(|i| (port.cursor + i) % sources)
                .find(|&s| !port.inbox[s].is_empty())
            else {
                break;
            };
            let fifo = &mut port.inbox[source];
            let taken = fifo.front().is_some_and(|frame| deliver(frame));
            if !taken {
                break;
            }
            fifo.pop_front();
            port.pending -= 1;
            port.cursor = (source + 1) % sources;
            egress.delivered += 1;
            egress.unblocked.extend(Self::release(
                &mut self.ports,
                &mut self.stats,
                source,
                destination,
            ));
            // Re-borrow: `release` touched the port table.
            let Some(p) = self.ports.get_mut(destination).and_then(Option::as_mut) else {
                break;
            };
            port = p;
        }
        self.stats.delivered += egress.delivered as u64;
        egress
    }

    /// After `destination` took a frame from `source`: if `source` owes its held frame
    /// to `destination`, queue it there now (there is room); return `source` if that
    /// was the last destination it owed.
    fn release(
        ports: &mut [Option<Port>],
        stats: &mut SwitchStats,
        source: PortId,
        destination: PortId,
    ) -> Option<PortId> {
        let parked = ports.get_mut(source)?.as_mut()?.parked.as_mut()?;
        let at = parked.owed.iter().position(|&d| d == destination)?;
        parked.owed.remove(at);
        let frame = parked.frame.clone();
        let done = parked.owed.is_empty();
        if done && let Some(p) = ports[source].as_mut() {
            p.parked = None;
        }
        let port = ports.get_mut(destination)?.as_mut()?;
        port.inbox[source].push_back(frame);
        port.pending += 1;
        stats.queued += 1;
        done.then_some(source)
    }
}
