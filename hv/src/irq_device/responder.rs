//! The test device's "hardware": a thread of its own that waits for doorbells (or a
//! periodic timer, for the noise source) and raises the matching vector, after a fixed
//! delay. Doorbells are eventfds that KVM signals directly on the guest's MMIO write
//! (ioeventfd), so neither the ring nor the answer passes through a vCPU thread.
//!
//! It also keeps the host's view of every round (when the doorbell was seen, when the
//! vector was raised), which `kumo bench irq` sets beside the guest's measurements.

use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::Error;
use crate::backend_worker::{BackendWorker, Control, Events, Handler};
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

/// The running responder thread, on the [`BackendWorker`]: stopped and joined on drop;
/// a pause ([`Responder::control`]) answers the doorbells already rung, without their
/// delay, then parks it.
pub struct Responder {
    worker: BackendWorker,
    log: Arc<HostLog>,
}

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
        let events = Events::new()?;
        let source = match trigger {
            Trigger::Doorbells(doorbells) => {
                for (index, fd) in doorbells.iter().enumerate() {
                    events.add(fd.as_raw_fd(), index as u64)?;
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
                events.add(timer.as_raw_fd(), 0)?;
                Source::Timer(timer)
            }
        };
        let log = Arc::new(HostLog::default());
        let worker = BackendWorker::spawn(
            name,
            Control::new()?,
            events,
            dom0,
            Answer {
                source,
                delay,
                fire,
                log: log.clone(),
                origin: Instant::now(),
            },
        )?;
        Ok(Responder { worker, log })
    }

    /// Holding the thread (for a pause of the VM).
    pub fn control(&self) -> &Arc<Control> {
        self.worker.control()
    }

    /// The host's log of rounds.
    pub fn log(&self) -> &Arc<HostLog> {
        &self.log
    }
}

enum Source {
    Doorbells(Vec<EventFd>),
    Timer(TimerFd),
}

/// The responder's handler.
struct Answer {
    source: Source,
    delay: Duration,
    fire: Fire,
    log: Arc<HostLog>,
    origin: Instant,
}

impl Handler for Answer {
    fn handle(&mut self, token: u64, _events: EventSet) {
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

    /// Answers every doorbell that has rung (a paused VM's vCPUs ring no more), before
    /// the worker parks.
    fn quiesce(&mut self) {
        if let Source::Doorbells(fds) = &self.source {
            let rung: Vec<usize> = (0..fds.len())
                .filter(|&i| fds[i].read().is_ok_and(|n| n > 0))
                .collect();
            let now = self.origin.elapsed();
            for vector in rung {
                self.fire_now(vector, now);
            }
        }
    }
}

impl Answer {
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

    use vmm_sys_util::eventfd::EFD_NONBLOCK;

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
