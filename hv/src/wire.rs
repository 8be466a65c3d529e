//! A wire out of the process: a switch port whose other end is a stream socket speaking
//! QEMU's `-netdev stream` (and `-netdev socket`) framing — each Ethernet frame as a
//! 4-byte big-endian length and the frame — so kumo VMs share one Ethernet with QEMU
//! VMs or with the VMs of another kumo process, on this host (a UNIX socket) or
//! another (TCP; `crate::wire_socket` holds either and sets TCP's options).
//!
//! Two threads per wire (domain 0's, like the switch): a reader that takes frames off
//! the socket into a bounded inbox, and a writer that sends the switch's frames from a
//! bounded outbox. Neither queue drops: a full inbox stops reading (the stream's own
//! flow control then holds the peer), a full outbox refuses the switch's frame, which
//! stays queued in the switch. Each signals the switch thread's eventfd when it has
//! frames or room. A malformed length ends the wire (counted, logged): the stream has
//! lost its framing and nothing after it can be trusted.
//!
//! A wire that listens (`Wire::start_listening`) outlives its peer: when the peer's
//! connection closes, the reader takes the next connection on the listener as the same
//! port. That is how a VM moved to another process (a live migration) rejoins: the
//! destination connects to the same path once the source's connection is gone. Frames
//! in flight at the swap are lost (the guests' transport resends them); the stream
//! framing has no handshake, so a new connection starts at a frame boundary.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use devices::virtio::net::MAX_FRAME_LEN;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::Error;
use crate::placement::ThreadGroup;
use crate::wire_socket::{WireListener, WireStream};

/// Frames each direction holds.
const QUEUE_FRAMES: usize = 256;

/// How often a listening wire without a peer checks whether it is closing.
const ACCEPT_POLL: Duration = Duration::from_millis(10);

#[derive(Default)]
struct Queue {
    frames: VecDeque<Vec<u8>>,
    /// Outbox only: the next peer's connection, for the writer to take up.
    next_peer: Option<WireStream>,
}

/// Counters of one wire (monotonic).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WireStats {
    pub frames_in: u64,
    pub frames_out: u64,
    /// Frames whose length field was 0 or above the largest frame: the wire closed.
    pub malformed: u64,
    /// Connections taken after the first (a listening wire whose peer came back).
    pub reconnects: u64,
}

pub(crate) struct Wire {
    inbox: Mutex<Queue>,
    inbox_room: Condvar,
    outbox: Mutex<Queue>,
    outbox_ready: Condvar,
    /// Frames arrived, or outbox room appeared: the switch thread has work.
    pub(crate) event: EventFd,
    closed: AtomicBool,
    frames_in: AtomicU64,
    frames_out: AtomicU64,
    malformed: AtomicU64,
    reconnects: AtomicU64,
    /// The current peer's connection (shut down to close the wire).
    socket: Mutex<WireStream>,
    /// A listening wire's listener (non-blocking): the next peer after this one.
    listener: Option<WireListener>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|e| e.into_inner())
}

impl Wire {
    /// Starts the wire's reader and writer on `socket`; the wire ends with it.
    pub(crate) fn start(
        socket: WireStream,
        dom0: Option<Arc<ThreadGroup>>,
    ) -> Result<Arc<Wire>, Error> {
        Wire::start_on(socket, None, dom0)
    }

    /// Starts the wire on `socket`, a connection `listener` accepted; when that peer
    /// closes, the next connection on `listener` takes its place.
    pub(crate) fn start_listening(
        socket: WireStream,
        listener: WireListener,
        dom0: Option<Arc<ThreadGroup>>,
    ) -> Result<Arc<Wire>, Error> {
        listener.set_nonblocking(true).map_err(|source| Error::Os {
            what: "making the wire's listener non-blocking",
            source,
        })?;
        Wire::start_on(socket, Some(listener), dom0)
    }

    fn start_on(
        socket: WireStream,
        listener: Option<WireListener>,
        dom0: Option<Arc<ThreadGroup>>,
    ) -> Result<Arc<Wire>, Error> {
        let os = |what| move |source| Error::Os { what, source };
        socket
            .prepare()
            .map_err(os("setting up the wire's socket"))?;
        let wire = Arc::new(Wire {
            inbox: Mutex::default(),
            inbox_room: Condvar::new(),
            outbox: Mutex::default(),
            outbox_ready: Condvar::new(),
            event: EventFd::new(EFD_NONBLOCK).map_err(os("creating an eventfd"))?,
            closed: AtomicBool::new(false),
            frames_in: AtomicU64::new(0),
            frames_out: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            socket: Mutex::new(
                socket
                    .try_clone()
                    .map_err(os("duplicating the wire's socket"))?,
            ),
            listener,
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        for (name, reader) in [("net-wire-rx", true), ("net-wire-tx", false)] {
            let wire2 = wire.clone();
            let dom0 = dom0.clone();
            let stream = socket
                .try_clone()
                .map_err(os("duplicating the wire's socket"))?;
            threads.push(
                std::thread::Builder::new()
                    .name(name.into())
                    .spawn(move || {
                        let _member = dom0.as_ref().map(|g| g.join_current());
                        if reader {
                            wire2.read_frames(stream);
                        } else {
                            wire2.write_frames(stream);
                        }
                    })
                    .map_err(os("spawning a wire thread"))?,
            );
        }
        *wire.threads.lock().unwrap_or_else(|e| e.into_inner()) = threads;
        Ok(wire)
    }

    pub(crate) fn stats(&self) -> WireStats {
        WireStats {
            frames_in: self.frames_in.load(Ordering::Relaxed),
            frames_out: self.frames_out.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
        }
    }

    /// The reader: frames from each peer in turn (one, unless the wire listens).
    fn read_frames(&self, mut stream: WireStream) {
        let mut previous_peer_last_frame = None;
        loop {
            let last_frame = self.read_peer(&mut stream, previous_peer_last_frame);
            match self.next_peer() {
                Some(next) => {
                    stream = next;
                    previous_peer_last_frame = last_frame;
                }
                None => break,
            }
        }
    }

    /// Waits for the next peer of a listening wire and hands it to the writer too;
    /// None once the wire closes (or does not listen).
    fn next_peer(&self) -> Option<WireStream> {
        let listener = self.listener.as_ref()?;
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return None;
            }
            match listener.accept() {
                Ok(stream) => {
                    let ready = || -> std::io::Result<(WireStream, WireStream)> {
                        stream.prepare()?;
                        Ok((stream.try_clone()?, stream.try_clone()?))
                    };
                    let (for_writer, for_close) = match ready() {
                        Ok(clones) => clones,
                        Err(e) => {
                            tracing::warn!("wire: taking a new peer: {e}");
                            continue;
                        }
                    };
                    *self.socket.lock().unwrap_or_else(|e| e.into_inner()) = for_close;
                    if self.closed.load(Ordering::SeqCst) {
                        return None; // close() may have shut the previous socket
                    }
                    lock(&self.outbox).next_peer = Some(for_writer);
                    self.outbox_ready.notify_all();
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("wire: a new peer ({}) took the port", stream.peer());
                    return Some(stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(ACCEPT_POLL);
                }
                Err(e) => {
                    tracing::warn!("wire: accepting the next peer: {e}; the wire ends");
                    return None;
                }
            }
        }
    }

    /// Frames from one peer until it closes (or the wire does, or its framing breaks).
    /// A listening wire returns when the last frame came, and logs how long the port
    /// was silent between `previous_peer_last_frame` and this peer's first frame: a
    /// moved VM's absence as the other side of the wire saw it.
    fn read_peer(
        &self,
        stream: &mut WireStream,
        mut previous_peer_last_frame: Option<Instant>,
    ) -> Option<Instant> {
        let mut last_frame = None;
        let mut length = [0u8; 4];
        while !self.closed.load(Ordering::SeqCst) {
            if stream.read_exact(&mut length).is_err() {
                break; // the peer closed the wire (or we did)
            }
            let len = u32::from_be_bytes(length) as usize;
            if len == 0 || len > MAX_FRAME_LEN {
                self.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "wire: a frame of {len} bytes: the stream lost its framing; closing"
                );
                break;
            }
            let mut frame = vec![0u8; len];
            if stream.read_exact(&mut frame).is_err() {
                break;
            }
            if self.listener.is_some() {
                let now = Instant::now();
                if let Some(before) = previous_peer_last_frame.take() {
                    tracing::info!(
                        "wire: a new peer's first frame, {:.1} ms after the previous peer's last",
                        (now - before).as_secs_f64() * 1e3
                    );
                }
                last_frame = Some(now);
            }
            let mut inbox = lock(&self.inbox);
            while inbox.frames.len() >= QUEUE_FRAMES && !self.closed.load(Ordering::SeqCst) {
                inbox = self
                    .inbox_room
                    .wait(inbox)
                    .unwrap_or_else(|e| e.into_inner());
            }
            inbox.frames.push_back(frame);
            drop(inbox);
            self.frames_in.fetch_add(1, Ordering::Relaxed);
            let _ = self.event.write(1);
        }
        last_frame.or(previous_peer_last_frame)
    }

    fn write_frames(&self, mut stream: WireStream) {
        // After a failed write: no peer until the reader takes the next one.
        let mut lost_peer = false;
        loop {
            let mut outbox = lock(&self.outbox);
            loop {
                if let Some(next) = outbox.next_peer.take() {
                    stream = next;
                    lost_peer = false;
                }
                let closed = self.closed.load(Ordering::SeqCst);
                if closed || (!lost_peer && !outbox.frames.is_empty()) {
                    break;
                }
                outbox = self
                    .outbox_ready
                    .wait(outbox)
                    .unwrap_or_else(|e| e.into_inner());
            }
            if lost_peer {
                return; // closed while waiting for a peer
            }
            let Some(frame) = outbox.frames.pop_front() else {
                return; // closed and empty
            };
            let was_full = outbox.frames.len() + 1 >= QUEUE_FRAMES;
            drop(outbox);
            let header = (frame.len() as u32).to_be_bytes();
            if stream
                .write_all(&header)
                .and_then(|()| stream.write_all(&frame))
                .is_err()
            {
                tracing::debug!("wire: the peer closed the stream");
                if self.listener.is_none() {
                    return;
                }
                // The frame is lost with the peer; the next one gets what follows.
                lost_peer = true;
                continue;
            }
            self.frames_out.fetch_add(1, Ordering::Relaxed);
            if was_full {
                let _ = self.event.write(1);
            }
        }
    }

    /// Offers frames that arrived to `ingress` in order until it refuses one (kept for
    /// the next call).
    pub(crate) fn take_frames(&self, mut ingress: impl FnMut(&[u8]) -> bool) {
        let mut inbox = lock(&self.inbox);
        let mut taken = false;
        while let Some(frame) = inbox.frames.front() {
            if !ingress(frame) {
                break;
            }
            inbox.frames.pop_front();
            taken = true;
        }
        if taken {
            self.inbox_room.notify_one();
        }
    }

    /// Queues `frame` for the peer; false if the outbox is full (offer it again when
    /// the wire's event fires).
    pub(crate) fn send(&self, frame: &[u8]) -> bool {
        let mut outbox = lock(&self.outbox);
        if outbox.frames.len() >= QUEUE_FRAMES {
            return false;
        }
        outbox.frames.push_back(frame.to_vec());
        self.outbox_ready.notify_one();
        true
    }

    /// Stops both threads and waits for them.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self
            .socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shutdown(std::net::Shutdown::Both);
        self.inbox_room.notify_all();
        self.outbox_ready.notify_all();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|e| e.into_inner()));
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a wire thread panicked");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    /// Each test runs over both stream types a wire takes.
    #[derive(Clone, Copy, Debug)]
    enum Kind {
        Unix,
        Tcp,
    }

    /// A connected pair: the wire's end and the peer's.
    fn pair(kind: Kind) -> (WireStream, WireStream) {
        match kind {
            Kind::Unix => {
                let (ours, peer) = UnixStream::pair().unwrap();
                (ours.into(), peer.into())
            }
            Kind::Tcp => {
                let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                let peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
                let (ours, _) = listener.accept().unwrap();
                (ours.into(), peer.into())
            }
        }
    }

    /// A listener peers connect to (its socket file's directory removed on drop).
    struct Endpoint {
        listener: Option<WireListener>,
        address: Address,
    }

    enum Address {
        Unix(PathBuf),
        Tcp(std::net::SocketAddr),
    }

    impl Endpoint {
        fn new(kind: Kind) -> Endpoint {
            match kind {
                Kind::Unix => {
                    let dir =
                        std::env::temp_dir().join(format!("kumo-wire-{}", std::process::id()));
                    let _ = std::fs::create_dir_all(&dir);
                    let path = dir.join("w.sock");
                    let _ = std::fs::remove_file(&path);
                    Endpoint {
                        listener: Some(UnixListener::bind(&path).unwrap().into()),
                        address: Address::Unix(path),
                    }
                }
                Kind::Tcp => {
                    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
                    let address = Address::Tcp(listener.local_addr().unwrap());
                    Endpoint {
                        listener: Some(listener.into()),
                        address,
                    }
                }
            }
        }

        fn connect(&self) -> WireStream {
            match &self.address {
                Address::Unix(path) => UnixStream::connect(path).unwrap().into(),
                Address::Tcp(addr) => TcpStream::connect(addr).unwrap().into(),
            }
        }
    }

    impl Drop for Endpoint {
        fn drop(&mut self) {
            if let Address::Unix(path) = &self.address {
                let _ = std::fs::remove_file(path);
            }
        }
    }

    /// Waits (bounded) until `done` holds.
    fn eventually(what: &str, done: impl Fn() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{what} never happened"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn frame(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    fn send_framed(peer: &mut WireStream, f: &[u8]) {
        peer.write_all(&(f.len() as u32).to_be_bytes()).unwrap();
        peer.write_all(f).unwrap();
    }

    fn read_framed(peer: &mut WireStream) -> Vec<u8> {
        let mut length = [0u8; 4];
        peer.read_exact(&mut length).unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(length) as usize];
        peer.read_exact(&mut body).unwrap();
        body
    }

    fn frames_cross_both_ways_in_order(kind: Kind) {
        let (ours, mut peer) = pair(kind);
        let wire = Wire::start(ours, None).unwrap();
        // Peer to us: length (big-endian) and frame, three times.
        for seed in 0..3u8 {
            send_framed(&mut peer, &frame(60 + usize::from(seed), seed));
        }
        eventually("three frames in", || wire.stats().frames_in == 3);
        let mut got = Vec::new();
        wire.take_frames(|f| {
            got.push(f.to_vec());
            true
        });
        assert_eq!(
            got,
            (0..3u8)
                .map(|s| frame(60 + usize::from(s), s))
                .collect::<Vec<_>>()
        );
        // Us to the peer: the length on the wire, big-endian, then the frame.
        assert!(wire.send(&frame(1514, 9)));
        let mut length = [0u8; 4];
        peer.read_exact(&mut length).unwrap();
        assert_eq!(u32::from_be_bytes(length), 1514);
        let mut body = vec![0u8; 1514];
        peer.read_exact(&mut body).unwrap();
        assert_eq!(body, frame(1514, 9));
        wire.close();
    }

    #[test]
    fn frames_cross_in_qemu_stream_framing_both_ways_in_order_unix() {
        frames_cross_both_ways_in_order(Kind::Unix);
    }

    #[test]
    fn frames_cross_in_qemu_stream_framing_both_ways_in_order_tcp() {
        frames_cross_both_ways_in_order(Kind::Tcp);
    }

    fn refused_frame_stays_first_and_full_outbox_refuses(kind: Kind) {
        let (ours, mut peer) = pair(kind);
        let wire = Wire::start(ours, None).unwrap();
        for seed in 0..2u8 {
            send_framed(&mut peer, &frame(64, seed));
        }
        eventually("two frames in", || wire.stats().frames_in == 2);
        wire.take_frames(|_| false);
        let mut first = None;
        wire.take_frames(|f| {
            first.get_or_insert_with(|| f.to_vec());
            false
        });
        assert_eq!(
            first.unwrap(),
            frame(64, 0),
            "the refused frame is still first"
        );
        // The peer reads nothing: the writer blocks once the socket buffers are full,
        // then the outbox fills and refuses instead of dropping or growing.
        let mut refused = false;
        for _ in 0..100_000 {
            if !wire.send(&frame(1500, 1)) {
                refused = true;
                break;
            }
        }
        assert!(refused, "the outbox never refused");
        wire.close();
    }

    #[test]
    fn a_refused_frame_stays_first_and_a_full_outbox_refuses_unix() {
        refused_frame_stays_first_and_full_outbox_refuses(Kind::Unix);
    }

    #[test]
    fn a_refused_frame_stays_first_and_a_full_outbox_refuses_tcp() {
        refused_frame_stays_first_and_full_outbox_refuses(Kind::Tcp);
    }

    fn listening_wire_takes_the_next_peer(kind: Kind) {
        let mut endpoint = Endpoint::new(kind);
        let mut first = endpoint.connect();
        let listener = endpoint.listener.take().unwrap();
        let ours = listener.accept().unwrap();
        let wire = Wire::start_listening(ours, listener, None).unwrap();
        send_framed(&mut first, &frame(64, 1));
        eventually("the first peer's frame", || wire.stats().frames_in == 1);
        // The next peer connects while the first still holds the port: it waits.
        let mut second = endpoint.connect();
        send_framed(&mut second, &frame(64, 2));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            wire.stats().frames_in,
            1,
            "taken before the first peer left"
        );
        assert!(wire.send(&frame(80, 3)));
        assert_eq!(read_framed(&mut first), frame(80, 3));
        drop(first);
        eventually("the second peer's frame", || wire.stats().frames_in == 2);
        assert_eq!(wire.stats().reconnects, 1);
        let mut got = Vec::new();
        wire.take_frames(|f| {
            got.push(f.to_vec());
            true
        });
        assert_eq!(got, [frame(64, 1), frame(64, 2)]);
        // Frames now go to the second peer (the first one sent to the gone peer may
        // be lost: the writer learns of it by failing).
        set_read_timeout(&second, Duration::from_secs(10));
        let mut seen = false;
        for seed in 10..20u8 {
            assert!(wire.send(&frame(90, seed)));
            if read_framed(&mut second) == frame(90, seed) {
                seen = true;
                break;
            }
        }
        assert!(seen, "the second peer receives the wire's frames");
        wire.close();
    }

    fn set_read_timeout(stream: &WireStream, timeout: Duration) {
        match stream {
            WireStream::Unix(s) => s.set_read_timeout(Some(timeout)).unwrap(),
            WireStream::Tcp(s) => s.set_read_timeout(Some(timeout)).unwrap(),
        }
    }

    #[test]
    fn a_listening_wire_takes_the_next_peer_as_the_same_port_once_the_first_closes_unix() {
        listening_wire_takes_the_next_peer(Kind::Unix);
    }

    #[test]
    fn a_listening_wire_takes_the_next_peer_as_the_same_port_once_the_first_closes_tcp() {
        listening_wire_takes_the_next_peer(Kind::Tcp);
    }

    fn bad_length_closes_the_wire_counted(kind: Kind, length: u32) {
        let (ours, mut peer) = pair(kind);
        let wire = Wire::start(ours, None).unwrap();
        peer.write_all(&length.to_be_bytes()).unwrap();
        eventually("the bad length counted", || wire.stats().malformed == 1);
        // Nothing after it is read: the stream lost its framing.
        let f = frame(64, 0);
        let _ = peer.write_all(&(f.len() as u32).to_be_bytes());
        let _ = peer.write_all(&f);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(wire.stats().frames_in, 0);
        wire.close();
    }

    #[test]
    fn a_length_past_the_largest_frame_closes_the_wire_counted_unix() {
        bad_length_closes_the_wire_counted(Kind::Unix, MAX_FRAME_LEN as u32 + 1);
    }

    #[test]
    fn a_length_past_the_largest_frame_closes_the_wire_counted_tcp() {
        bad_length_closes_the_wire_counted(Kind::Tcp, MAX_FRAME_LEN as u32 + 1);
        bad_length_closes_the_wire_counted(Kind::Tcp, u32::MAX);
        bad_length_closes_the_wire_counted(Kind::Tcp, 0);
    }

    #[test]
    fn a_tcp_peer_that_closes_mid_frame_ends_the_wire_quietly() {
        let (ours, mut peer) = pair(Kind::Tcp);
        let wire = Wire::start(ours, None).unwrap();
        peer.write_all(&100u32.to_be_bytes()).unwrap();
        peer.write_all(&[1; 10]).unwrap();
        drop(peer);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            wire.stats(),
            WireStats::default(),
            "nothing taken, nothing malformed"
        );
        wire.close();
    }
}
