//! The test device's "hardware": a thread of its own that waits for doorbells (or a
//! periodic timer, for the noise source) and raises the matching vector, after a fixed
//! delay. Doorbells are eventfds that KVM signals directly on the guest's MMIO write
//! (ioeventfd), so neither the ring nor the answer passes through a vCPU thread.
//!
//! It also keeps the host's view of every round (when the doorbell was seen, when the
//! vector was raised), which `kumo bench irq` sets beside the guest's measurements.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};
use vmm_sys_util::timerfd::TimerFd;

use crate::Error;
use crate::placement::ThreadGroup;

/// The last part of a delay is spun rather than slept.
const SPIN_BELOW: Duration = Duration::from_micros(150);

/// Rounds the host log keeps (a bench's rounds fit; beyond, the oldest are kept).
const LOG_CAPACITY: usize = 1 << 20;

/// Raises vector `index` (through the device's MSI-X logic and its interrupt path).
pub type Fire = Box<dyn Fn(usize) + Send>;

/// What starts the responder's rounds.
pub enum Trigger {
    /// One eventfd per vector: a write asks for that vector.
    Doorbells(Vec<EventFd>),
    /// Vector 0 every `period` (the noise source).
    Periodic(Duration),
}

/// One round seen from the host: nanoseconds since the responder started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    pub vector: u16,
    /// The doorbell (or timer) was seen by the responder thread.
    pub rung_ns: u64,
    /// The vector was handed to the interrupt path.
    pub raised_ns: u64,
}

/// The host-side log of rounds.
#[derive(Default)]
pub struct HostLog {
    rounds: Mutex<Vec<Round>>,
}

impl HostLog {
    fn push(&self, round: Round) {
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        if rounds.len() < LOG_CAPACITY {
            rounds.push(round);
        }
    }

    /// A copy of the rounds so far.
    pub fn rounds(&self) -> Vec<Round> {
        self.rounds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The running responder thread; stopped and joined on drop.
pub struct Responder {
    control: Arc<Control>,
    thread: Option<JoinHandle<()>>,
    log: Arc<HostLog>,
}

/// How long [`Control::quiesce`] waits for the thread to park (it parks within one
/// round; a thread that has died never will).
const PARK_TIMEOUT: Duration = Duration::from_secs(2);

/// Stopping and holding the responder thread from outside.
pub struct Control {
    stop: AtomicBool,
    /// Wakes the thread from its epoll wait.
    wake: EventFd,
    hold: Mutex<Hold>,
    changed: Condvar,
}

#[derive(Default)]
struct Hold {
    /// Someone wants the thread parked.
    requested: bool,
    /// The thread answered every doorbell that had rung and is parked.
    parked: bool,
}

impl Control {
    fn lock(&self) -> std::sync::MutexGuard<'_, Hold> {
        self.hold.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Has the thread answer every doorbell rung so far (without its delay), then
    /// park until [`Control::resume`]. Returns once it is parked.
    pub fn quiesce(&self) {
        self.lock().requested = true;
        let _ = self.wake.write(1);
        let mut hold = self.lock();
        let deadline = Instant::now() + PARK_TIMEOUT;
        while !hold.parked && !self.stop.load(Ordering::SeqCst) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                tracing::warn!("the test device's thread did not park");
                return;
            };
            hold = self
                .changed
                .wait_timeout(hold, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Lets a parked thread go on.
    pub fn resume(&self) {
        self.lock().requested = false;
        self.changed.notify_all();
    }
}

/// Epoll data of the stop eventfd (doorbells use their vector index).
const STOP_TOKEN: u64 = u64::MAX;

impl Responder {
    /// Starts thread `name` answering `trigger` with `fire` after `delay`, a member of
    /// `dom0` if given (device emulation is the VMM's work: domain 0's).
    pub fn start(
        name: &str,
        trigger: Trigger,
        delay: Duration,
        fire: Fire,
        dom0: Option<Arc<ThreadGroup>>,
    ) -> Result<Responder, Error> {
        let os = |what: &'static str| move |source: std::io::Error| Error::Os { what, source };
        let epoll = Epoll::new().map_err(os("creating the test device's epoll"))?;
        let wake = EventFd::new(EFD_NONBLOCK).map_err(os("creating an eventfd"))?;
        let wake_fd = wake.try_clone().map_err(os("duplicating an eventfd"))?;
        let add = |fd: i32, token: u64| {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(EventSet::IN, token),
                )
                .map_err(os("adding to the test device's epoll"))
        };
        add(wake_fd.as_raw_fd(), STOP_TOKEN)?;
        let source = match trigger {
            Trigger::Doorbells(doorbells) => {
                for (index, fd) in doorbells.iter().enumerate() {
                    add(fd.as_raw_fd(), index as u64)?;
                }
                Source::Doorbells(doorbells)
            }
            Trigger::Periodic(period) => {
                let errno =
                    |e: vmm_sys_util::errno::Error| std::io::Error::from_raw_os_error(e.errno());
                let mut timer = TimerFd::new()
                    .map_err(errno)
                    .map_err(os("creating a timerfd"))?;
                let period = period.max(Duration::from_micros(1));
                timer
                    .reset(period, Some(period))
                    .map_err(errno)
                    .map_err(os("arming a timerfd"))?;
                add(timer.as_raw_fd(), 0)?;
                Source::Timer(timer)
            }
        };
        let control = Arc::new(Control {
            stop: AtomicBool::new(false),
            wake,
            hold: Mutex::new(Hold::default()),
            changed: Condvar::new(),
        });
        let log = Arc::new(HostLog::default());
        let worker = Worker {
            epoll,
            source,
            delay,
            fire,
            control: control.clone(),
            log: log.clone(),
            origin: Instant::now(),
            wake_fd,
        };
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _member = dom0.map(|group| group.join_current());
                worker.run()
            })
            .map_err(os("spawning the test device's thread"))?;
        Ok(Responder {
            control,
            thread: Some(thread),
            log,
        })
    }

    /// Holding the thread (for a pause of the VM).
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// The host's log of rounds.
    pub fn log(&self) -> &Arc<HostLog> {
        &self.log
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.control.stop.store(true, Ordering::SeqCst);
        let _ = self.control.wake.write(1);
        self.control.resume();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

enum Source {
    Doorbells(Vec<EventFd>),
    Timer(TimerFd),
}

struct Worker {
    epoll: Epoll,
    source: Source,
    delay: Duration,
    fire: Fire,
    control: Arc<Control>,
    log: Arc<HostLog>,
    origin: Instant,
    /// The epoll's side of `Control::wake`.
    wake_fd: EventFd,
}

impl Worker {
    fn run(mut self) {
        let mut events = [EpollEvent::default(); 32];
        while !self.control.stop.load(Ordering::SeqCst) {
            if self.control.lock().requested {
                self.park();
                continue;
            }
            let ready = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("test device: epoll_wait failed ({e}); stopping");
                    return;
                }
            };
            for event in &events[..ready] {
                let token = event.data();
                if token == STOP_TOKEN {
                    let _ = self.wake_fd.read();
                    continue;
                }
                let rung = self.origin.elapsed();
                // Rings that arrived together are answered once, as coalesced MSIs are.
                let asked = match &mut self.source {
                    Source::Doorbells(fds) => fds
                        .get(token as usize)
                        .is_some_and(|fd| fd.read().is_ok_and(|n| n > 0)),
                    Source::Timer(timer) => timer.wait().is_ok_and(|n| n > 0),
                };
                if asked {
                    self.answer(token as usize, rung);
                }
            }
        }
    }

    /// Answers every doorbell that has rung (a paused VM's vCPUs ring no more), then
    /// waits until resumed or stopped.
    fn park(&mut self) {
        if let Source::Doorbells(fds) = &self.source {
            let rung: Vec<usize> = (0..fds.len())
                .filter(|&i| fds[i].read().is_ok_and(|n| n > 0))
                .collect();
            let now = self.origin.elapsed();
            for vector in rung {
                self.fire_now(vector, now);
            }
        }
        let control = self.control.clone();
        let mut hold = control.lock();
        hold.parked = true;
        control.changed.notify_all();
        while hold.requested && !control.stop.load(Ordering::SeqCst) {
            hold = control
                .changed
                .wait(hold)
                .unwrap_or_else(|e| e.into_inner());
        }
        hold.parked = false;
    }

    fn answer(&self, vector: usize, rung: Duration) {
        if !self.delay.is_zero() {
            // Sleep most of the delay and spin the end: a sleep alone overshoots by
            // ~100 us here (timer slack under nested virtualization).
            let until = self.origin + rung + self.delay;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                if left > SPIN_BELOW {
                    std::thread::sleep(left - SPIN_BELOW);
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        self.fire_now(vector, rung);
    }

    fn fire_now(&self, vector: usize, rung: Duration) {
        let raised = self.origin.elapsed();
        (self.fire)(vector);
        self.log.push(Round {
            vector: vector as u16,
            rung_ns: rung.as_nanos() as u64,
            raised_ns: raised.as_nanos() as u64,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    #[test]
    fn a_doorbell_fires_its_vector_after_the_delay() {
        let (tx, rx) = mpsc::channel();
        let doorbells: Vec<EventFd> = (0..3)
            .map(|_| EventFd::new(EFD_NONBLOCK).unwrap())
            .collect();
        let rings: Vec<EventFd> = doorbells.iter().map(|d| d.try_clone().unwrap()).collect();
        let delay = Duration::from_millis(2);
        let responder = Responder::start(
            "test-responder",
            Trigger::Doorbells(doorbells),
            delay,
            Box::new(move |v| tx.send(v).unwrap()),
            None,
        )
        .unwrap();
        rings[2].write(1).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(2));
        rings[0].write(1).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(0));
        // The round is logged just after it fires.
        let deadline = Instant::now() + Duration::from_secs(5);
        while responder.log().rounds().len() < 2 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let rounds = responder.log().rounds();
        assert_eq!(rounds.iter().map(|r| r.vector).collect::<Vec<_>>(), [2, 0]);
        for round in rounds {
            assert!(round.raised_ns - round.rung_ns >= delay.as_nanos() as u64);
        }
    }

    #[test]
    fn the_periodic_source_keeps_firing_vector_zero_until_dropped() {
        let (tx, rx) = mpsc::channel();
        let responder = Responder::start(
            "test-noise",
            Trigger::Periodic(Duration::from_millis(1)),
            Duration::ZERO,
            Box::new(move |v| {
                let _ = tx.send(v);
            }),
            None,
        )
        .unwrap();
        for _ in 0..5 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(0));
        }
        drop(responder);
        // Drained and stopped: the channel's sender is gone with the thread.
        while rx.try_recv().is_ok() {}
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(50)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
