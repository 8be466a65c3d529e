//! One backend worker for every device thread of domain 0 (Cloud Hypervisor's
//! `EpollHelper` with its pause and kill eventfds): a named thread that joins domain 0
//! when given one, waits on an epoll set of the backend's file descriptors and hands
//! each event to the backend's [`Handler`], and that can be stopped and paused from
//! outside in one way:
//!
//! - **stop**: [`BackendWorker`]'s drop (or [`BackendWorker::stop`]) wakes the thread
//!   through its stop eventfd and joins it. A paused thread stops too.
//! - **pause** (a VM's quiesce for a snapshot or migration): [`Control::pause`] wakes
//!   the thread through its pause eventfd; between two wake-ups the thread lets the
//!   handler finish what is in flight ([`Handler::quiesce`]) and parks until every
//!   pause is matched by a [`Control::resume`]. Pauses are counted (two VMs of one
//!   network may pause at once), and a pause of a thread that does not run (not
//!   started yet, stopped, died) returns at once.
//!
//! Its users: the network's switch thread (`net.rs`), a disk's backend (`block.rs`),
//! the interrupt test device's responders (`irq_device/`), a passthrough device's
//! generic-path interrupt thread (`passthrough/`) and the generic path's event loop
//! (`irq.rs`). Each registers its descriptors, level-triggered (the handler reads
//! them) or edge-triggered ([`Events::add_edge`]: the handler need not read them, so a
//! wake-up costs one `epoll_wait`, as the blocking `read` it replaces did).
//!
//! A handler never works without bound inside one call: a disk serves a queue's worth
//! of requests, then asks for a zero timeout ([`Handler::timeout`]) and goes on in
//! [`Handler::timed_out`], so a stop or pause is seen between two portions of work
//! and no device thread outlives its VM's stop.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::Error;
use crate::placement::{Membership, ThreadGroup};

/// Tokens from here up are the worker's own (stop and pause); a handler's are below.
pub const RESERVED_TOKENS: u64 = u64::MAX - 1;
const STOP: u64 = u64::MAX;
const PAUSE: u64 = u64::MAX - 1;

fn os(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Os { what, source }
}

/// What a backend does on its worker's thread.
pub trait Handler: Send + 'static {
    /// `events` arrived on the descriptor registered with `token`.
    fn handle(&mut self, token: u64, events: EventSet);

    /// Once, on the worker's thread, after it joined domain 0 and before it waits.
    fn started(&mut self) {}

    /// After the events of one wake-up were handled.
    fn after_events(&mut self) {}

    /// A pause was asked: finish what is in flight before the thread parks (answer
    /// the doorbells already rung, inject what is queued).
    fn quiesce(&mut self) {}

    /// How long the next wait may block: `None` until an event, `Some(ZERO)` to poll.
    fn timeout(&mut self) -> Option<Duration> {
        None
    }

    /// The wait [`Handler::timeout`] allowed ended with no event: a handler that cut
    /// its work short (a budget ran out) goes on here, after the worker looked at stop
    /// and pause.
    fn timed_out(&mut self) {}
}

/// The descriptors a worker waits on. A clone is the same set: a handler keeps one
/// to add descriptors while its thread runs (a NIC hot-plugged into a switch).
#[derive(Clone)]
pub struct Events {
    epoll: Arc<Epoll>,
}

impl Events {
    pub fn new() -> Result<Events, Error> {
        Ok(Events {
            epoll: Arc::new(Epoll::new().map_err(os("creating a backend's epoll"))?),
        })
    }

    /// Wakes the worker with `token` while `fd` is readable (the handler reads it).
    pub fn add(&self, fd: RawFd, token: u64) -> Result<(), Error> {
        self.add_set(fd, token, EventSet::IN)
    }

    /// Wakes the worker with `token` once per write to `fd` (an eventfd the handler
    /// need not read: its counter only grows, which a u64 lets it do for centuries).
    pub fn add_edge(&self, fd: RawFd, token: u64) -> Result<(), Error> {
        self.add_set(fd, token, EventSet::IN | EventSet::EDGE_TRIGGERED)
    }

    fn add_set(&self, fd: RawFd, token: u64, set: EventSet) -> Result<(), Error> {
        if token >= RESERVED_TOKENS {
            return Err(Error::Device(format!(
                "backend worker: token {token:#x} is reserved"
            )));
        }
        self.ctl(fd, token, set)
    }

    fn ctl(&self, fd: RawFd, token: u64, set: EventSet) -> Result<(), Error> {
        self.epoll
            .ctl(ControlOperation::Add, fd, EpollEvent::new(set, token))
            .map_err(os("adding to a backend's epoll"))
    }
}

#[derive(Default)]
struct State {
    /// Pauses under way.
    holds: u32,
    /// The thread is parked (it finished what was in flight).
    parked: bool,
    /// The thread runs (only a running thread is waited for).
    running: bool,
    /// The worker is ending: nothing parks or waits any more.
    stopping: bool,
}

/// Stopping and pausing a worker from other threads. Made before the worker starts, so
/// a device can hand it to its VM's quiesce hook at attach.
pub struct Control {
    stop: EventFd,
    pause: EventFd,
    /// `State::holds`, read without the lock on every wake-up.
    wanted: AtomicU32,
    state: Mutex<State>,
    changed: Condvar,
}

impl Control {
    pub fn new() -> Result<Arc<Control>, Error> {
        let eventfd = || EventFd::new(EFD_NONBLOCK).map_err(os("creating an eventfd"));
        Ok(Arc::new(Control {
            stop: eventfd()?,
            pause: eventfd()?,
            wanted: AtomicU32::new(0),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// Pauses the worker: returns once it finished what was in flight and parked (at
    /// once if it does not run). Match every call with [`Control::resume`].
    pub fn pause(&self) {
        let mut state = self.lock();
        state.holds += 1;
        self.wanted.store(state.holds, Ordering::SeqCst);
        if !state.running || state.stopping {
            return;
        }
        drop(state);
        let _ = self.pause.write(1);
        let mut state = self.lock();
        while state.running && !state.parked && !state.stopping {
            state = self.wait(state);
        }
    }

    /// Ends one pause; the worker goes on when none is left.
    pub fn resume(&self) {
        let mut state = self.lock();
        state.holds = state.holds.saturating_sub(1);
        self.wanted.store(state.holds, Ordering::SeqCst);
        drop(state);
        self.changed.notify_all();
    }

    /// Whether the worker is parked now.
    pub fn is_parked(&self) -> bool {
        self.lock().parked
    }

    /// Whether the worker's thread runs.
    pub fn is_running(&self) -> bool {
        self.lock().running
    }

    /// Pauses under way.
    pub fn holds(&self) -> u32 {
        self.lock().holds
    }

    fn set(&self, update: impl FnOnce(&mut State)) {
        update(&mut self.lock());
        self.changed.notify_all();
    }

    /// The thread's side, between two wake-ups: parks while paused. Whether the
    /// worker is stopping.
    fn park(&self) -> bool {
        let mut state = self.lock();
        if state.holds == 0 || state.stopping {
            return state.stopping;
        }
        state.parked = true;
        self.changed.notify_all();
        while state.holds > 0 && !state.stopping {
            state = self.wait(state);
        }
        state.parked = false;
        state.stopping
    }
}

/// A backend's thread; stopped and joined when dropped.
pub struct BackendWorker {
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
}

/// Marks the worker not running when its thread ends, however it ends.
struct Running(Arc<Control>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.set(|s| {
            s.running = false;
            s.parked = false;
        });
    }
}

impl BackendWorker {
    /// Starts thread `name` serving `events` with `handler`, a member of `dom0` if
    /// given (backends are the VMM's work: domain 0's), stopped and paused through
    /// `control`.
    pub fn spawn<H: Handler>(
        name: &str,
        control: Arc<Control>,
        events: Events,
        dom0: Option<Arc<ThreadGroup>>,
        mut handler: H,
    ) -> Result<BackendWorker, Error> {
        events.ctl(control.stop.as_raw_fd(), STOP, EventSet::IN)?;
        events.ctl(control.pause.as_raw_fd(), PAUSE, EventSet::IN)?;
        control.set(|s| {
            s.running = true;
            s.stopping = false;
        });
        let thread_control = control.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _running = Running(thread_control.clone());
                let member = dom0.map(|group| group.join_current());
                handler.started();
                crate::seccomp::apply_or_exit(crate::seccomp::ThreadKind::Backend);
                run(&events, &thread_control, member.as_ref(), &mut handler);
            })
            .map_err(|e| {
                control.set(|s| s.running = false);
                os("spawning a backend thread")(e)
            })?;
        Ok(BackendWorker {
            control,
            thread: Some(thread),
        })
    }

    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Stops the thread and waits for it (also when paused). Idempotent.
    pub fn stop(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.control.set(|s| s.stopping = true);
        let _ = self.control.stop.write(1);
        if thread.join().is_err() {
            tracing::error!("a backend thread panicked");
        }
    }
}

impl Drop for BackendWorker {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(
    events: &Events,
    control: &Control,
    member: Option<&Membership>,
    handler: &mut impl Handler,
) {
    let mut ready = [EpollEvent::default(); 64];
    loop {
        // One atomic load a wake-up; a stop that is not asked while paused arrives as
        // the stop eventfd's event.
        if control.wanted.load(Ordering::SeqCst) > 0 {
            handler.quiesce();
            if crate::presence::asleep(|| control.park()) {
                return;
            }
        }
        let timeout = handler
            .timeout()
            .map_or(-1, |t| i32::try_from(t.as_millis()).unwrap_or(i32::MAX));
        let n = match crate::presence::asleep(|| events.epoll.wait(timeout, &mut ready)) {
            Ok(0) => {
                // Polled, nothing yet (the stop and pause checks are behind us).
                handler.timed_out();
                continue;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!("backend thread: epoll_wait failed ({e}); it stops");
                return;
            }
        };
        // Domain 0 woke to work: the credit driver may sleep through its ticks
        // until then (`credit.rs`, "tickless").
        if let Some(member) = member {
            member.note_activity();
        }
        for event in &ready[..n] {
            match event.data() {
                STOP => return,
                PAUSE => {
                    let _ = control.pause.read();
                }
                token => handler.handle(token, event.event_set()),
            }
        }
        handler.after_events();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{self, Receiver, Sender};

    use super::*;

    const WAIT: Duration = Duration::from_secs(10);

    /// Reports every event and hook to the test.
    struct Probe {
        fd: EventFd,
        edge: bool,
        tx: Sender<&'static str>,
    }

    impl Handler for Probe {
        fn handle(&mut self, token: u64, events: EventSet) {
            assert_eq!(token, 7);
            assert!(events.contains(EventSet::IN));
            if !self.edge {
                let _ = self.fd.read();
            }
            let _ = self.tx.send("event");
        }
        fn started(&mut self) {
            let _ = self.tx.send("started");
        }
        fn quiesce(&mut self) {
            let _ = self.tx.send("quiesce");
        }
    }

    fn start(edge: bool) -> (BackendWorker, EventFd, Receiver<&'static str>) {
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        let events = Events::new().unwrap();
        if edge {
            events.add_edge(fd.as_raw_fd(), 7).unwrap();
        } else {
            events.add(fd.as_raw_fd(), 7).unwrap();
        }
        let (tx, rx) = mpsc::channel();
        let probe = Probe {
            fd: fd.try_clone().unwrap(),
            edge,
            tx,
        };
        let worker =
            BackendWorker::spawn("test-worker", Control::new().unwrap(), events, None, probe)
                .unwrap();
        assert_eq!(rx.recv_timeout(WAIT), Ok("started"));
        (worker, fd, rx)
    }

    #[test]
    fn an_event_is_dispatched_to_its_handler() {
        for edge in [false, true] {
            let (_worker, fd, rx) = start(edge);
            fd.write(1).unwrap();
            assert_eq!(rx.recv_timeout(WAIT), Ok("event"));
            fd.write(1).unwrap();
            assert_eq!(rx.recv_timeout(WAIT), Ok("event"), "edge-triggered: {edge}");
        }
    }

    #[test]
    fn stop_ends_the_thread_and_drops_its_handler() {
        let (mut worker, _fd, rx) = start(false);
        worker.stop();
        assert!(!worker.control().is_running());
        // The handler (and its sender) went with the thread.
        assert_eq!(
            rx.recv_timeout(WAIT),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        worker.stop(); // idempotent
    }

    #[test]
    fn a_paused_worker_quiesces_parks_and_handles_nothing_until_resumed() {
        let (worker, fd, rx) = start(false);
        let control = worker.control().clone();
        control.pause();
        assert_eq!(
            rx.try_recv(),
            Ok("quiesce"),
            "quiesced before pause returned"
        );
        assert!(control.is_parked());
        fd.write(1).unwrap();
        // Parked: the event waits. (Nothing can prove "never"; a second pause and
        // resume pair, counted, must not release it either.)
        control.pause();
        control.resume();
        assert!(control.is_parked(), "one pause is still held");
        assert_eq!(control.holds(), 1);
        control.resume();
        assert_eq!(rx.recv_timeout(WAIT), Ok("event"), "handled once resumed");
        assert!(!control.is_parked());
    }

    #[test]
    fn a_paused_worker_still_stops() {
        let (worker, _fd, rx) = start(false);
        let control = worker.control().clone();
        control.pause();
        assert_eq!(rx.try_recv(), Ok("quiesce"));
        drop(worker);
        assert!(!control.is_running());
        // A pause of a worker that no longer runs returns at once.
        control.pause();
        assert_eq!(control.holds(), 2);
    }

    #[test]
    fn a_pause_before_the_worker_starts_returns_at_once_and_holds_it() {
        let control = Control::new().unwrap();
        control.pause();
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        let events = Events::new().unwrap();
        events.add(fd.as_raw_fd(), 7).unwrap();
        let (tx, rx) = mpsc::channel();
        let probe = Probe {
            fd: fd.try_clone().unwrap(),
            edge: false,
            tx,
        };
        let _worker =
            BackendWorker::spawn("test-worker", control.clone(), events, None, probe).unwrap();
        assert_eq!(rx.recv_timeout(WAIT), Ok("started"));
        // It parks at once, quiescing first.
        assert_eq!(rx.recv_timeout(WAIT), Ok("quiesce"));
        fd.write(1).unwrap();
        control.resume();
        assert_eq!(rx.recv_timeout(WAIT), Ok("event"));
    }

    /// Works forever in portions, as a disk on a self-perpetuating queue would.
    struct Endless {
        portions: Arc<AtomicU32>,
    }

    impl Handler for Endless {
        fn handle(&mut self, _token: u64, _events: EventSet) {
            self.timed_out();
        }
        fn timeout(&mut self) -> Option<Duration> {
            Some(Duration::ZERO)
        }
        fn timed_out(&mut self) {
            self.portions.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_handler_with_endless_work_still_pauses_and_stops() {
        let portions = Arc::new(AtomicU32::new(0));
        let handler = Endless {
            portions: portions.clone(),
        };
        let mut worker = BackendWorker::spawn(
            "test-endless",
            Control::new().unwrap(),
            Events::new().unwrap(),
            None,
            handler,
        )
        .unwrap();
        while portions.load(Ordering::SeqCst) < 3 {
            std::thread::yield_now();
        }
        let control = worker.control().clone();
        control.pause();
        assert!(control.is_parked());
        let parked_at = portions.load(Ordering::SeqCst);
        control.resume();
        while portions.load(Ordering::SeqCst) == parked_at {
            std::thread::yield_now();
        }
        worker.stop();
        assert!(!control.is_running());
    }

    #[test]
    fn reserved_tokens_are_refused() {
        let events = Events::new().unwrap();
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        assert!(events.add(fd.as_raw_fd(), STOP).is_err());
        assert!(events.add_edge(fd.as_raw_fd(), PAUSE).is_err());
        events.add(fd.as_raw_fd(), RESERVED_TOKENS - 1).unwrap();
    }

    #[test]
    fn a_worker_joins_domain_0_while_it_runs() {
        let dom0 = Arc::new(ThreadGroup::default());
        let (tx, rx) = mpsc::channel();
        let fd = EventFd::new(EFD_NONBLOCK).unwrap();
        let probe = Probe {
            fd: fd.try_clone().unwrap(),
            edge: false,
            tx,
        };
        let worker = BackendWorker::spawn(
            "test-worker",
            Control::new().unwrap(),
            Events::new().unwrap(),
            Some(dom0.clone()),
            probe,
        )
        .unwrap();
        assert_eq!(rx.recv_timeout(WAIT), Ok("started"));
        assert_eq!(dom0.joins(), 1);
        assert_eq!(dom0.runnable(false).map(|_| ()), Some(()), "a member now");
        drop(worker);
        assert_eq!(dom0.runnable(false), None, "left when it stopped");
    }
}
