//! The run coordinator: the thread that called `Vm::run` waits here for whatever ends
//! the VM (a vCPU's exit or fault, a stop request, a device failure, the time limit,
//! the watchdog, a guest halted for good), then stops and joins every vCPU thread.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::signal::Killable;

use crate::halt::{self, ConsoleTail, HaltDetector, HaltVerdict};
use crate::kick;
use crate::migration::Hub;
use crate::placement::VcpuControl;
use crate::stop::{self, RunLimits, StopCause};
use crate::vcpu::{Shared, ToCoordinator, VcpuEnd};
use crate::watchdog::{Observation, Verdict, Watchdog};
use crate::{Error, FaultReason, FaultReport, GuestExit};

/// The first failure of a device of the VM that lives outside kumo (a passthrough
/// device's process died or stopped answering).
#[derive(Default)]
pub struct DeviceHealth {
    failed: std::sync::Mutex<Option<String>>,
    /// Wakes the running VM's coordinator, which does not poll for failures.
    wake: std::sync::Mutex<Option<mpsc::Sender<ToCoordinator>>>,
}

impl std::fmt::Debug for DeviceHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceHealth")
            .field("failed", &self.failure())
            .finish()
    }
}

impl DeviceHealth {
    /// Records `why` (the first report wins) and has the VM's coordinator look at it.
    pub fn fail(&self, why: String) {
        let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
        failed.get_or_insert(why);
        drop(failed);
        if let Some(tx) = &*self.wake.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = tx.send(ToCoordinator::Look);
        }
    }

    pub(crate) fn set_wake(&self, tx: Option<mpsc::Sender<ToCoordinator>>) {
        *self.wake.lock().unwrap_or_else(|e| e.into_inner()) = tx;
    }

    pub fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Takes the coordinator's channel back from the VM's device health when the run ends.
pub(crate) struct Unwake(pub(crate) Arc<DeviceHealth>);

impl Drop for Unwake {
    fn drop(&mut self) {
        self.0.set_wake(None);
    }
}

/// How long the coordinator waits between kicks of vCPUs that have not stopped yet.
const REKICK: Duration = Duration::from_millis(10);

/// The vCPU threads of a running VM, as the coordinator tracks them.
pub(crate) struct Coordinator<'a> {
    pub rx: mpsc::Receiver<ToCoordinator>,
    pub shared: &'a Shared,
    pub control: &'a VcpuControl,
    pub health: &'a DeviceHealth,
    pub tail: &'a ConsoleTail,
    pub handles: Vec<JoinHandle<()>>,
    ended: Vec<bool>,
    remaining: usize,
}

impl<'a> Coordinator<'a> {
    pub fn new(
        rx: mpsc::Receiver<ToCoordinator>,
        shared: &'a Shared,
        control: &'a VcpuControl,
        health: &'a DeviceHealth,
        tail: &'a ConsoleTail,
        handles: Vec<JoinHandle<()>>,
    ) -> Coordinator<'a> {
        let count = handles.len();
        Coordinator {
            rx,
            shared,
            control,
            health,
            tail,
            handles,
            ended: vec![false; count],
            remaining: count,
        }
    }

    /// Waits for the VM's outcome: the first vCPU to end the VM decides it, unless kumo
    /// ends it first (a stop request, a device failure, the time limit, the watchdog,
    /// or every vCPU halted for good). `failed`: a vCPU thread could not be started.
    pub fn decide(&mut self, limits: RunLimits, failed: Option<Error>) -> Result<GuestExit, Error> {
        let mut decision: Option<Result<GuestExit, Error>> = failed.map(Err);
        let started = Instant::now();
        let count = self.handles.len();
        let mut watchdog = limits
            .watchdog
            .map(|bound| (Watchdog::new(count, bound), started));
        // The watchdog, if any, needs a look every period.
        let dog_period = watchdog.as_ref().map(|(w, _)| w.period());
        let pace = |poll: Duration| dog_period.map_or(poll, |period| period.min(poll));
        let mut poll = pace(stop::POLL);
        let mut halts = HaltDetector::default();
        let deadline = limits.deadline(started);
        while decision.is_none() {
            let wait = match deadline {
                Some(at) => poll.min(at.saturating_duration_since(Instant::now())),
                None => poll,
            };
            match self.rx.recv_timeout(wait) {
                Ok(ToCoordinator::Ended(index, end)) => {
                    self.mark_ended(index);
                    match end {
                        VcpuEnd::Exit(exit) => decision = Some(Ok(exit)),
                        VcpuEnd::Error(e) => decision = Some(Err(e)),
                        VcpuEnd::Stopped => {}
                    }
                }
                Ok(ToCoordinator::Look) | Err(mpsc::RecvTimeoutError::Timeout) => {}
                // Not while this run's stop registration holds a sender; kept for safety.
                Err(mpsc::RecvTimeoutError::Disconnected) => self.remaining = 0,
            }
            // Every vCPU stopped without deciding (the channel stays open: the stop
            // registration and the device health hold senders).
            if decision.is_none() && self.remaining == 0 {
                decision = Some(Err(Error::VcpuThread {
                    index: 0,
                    why: "every vCPU thread ended without an outcome".into(),
                }));
            }
            if decision.is_some() {
                break;
            }
            if let Some(signal) = stop::requested() {
                decision = Some(Ok(GuestExit::Stopped(StopCause::Signal(signal))));
            } else if let Some(why) = self.health.failure() {
                decision = Some(Err(Error::Device(why)));
            } else if let Some(limit) = limits.timeout
                && deadline.is_some_and(|at| Instant::now() >= at)
            {
                decision = Some(Ok(GuestExit::Stopped(StopCause::Timeout(limit))));
            } else {
                let seen = observe(self.shared, self.control);
                if let Some((dog, next)) = &mut watchdog
                    && Instant::now() >= *next
                {
                    *next = Instant::now() + dog.period();
                    decision = watch(dog, &seen, self.shared, &self.handles).map(Ok);
                }
                if decision.is_none() {
                    decision =
                        halted_for_good(&mut halts, &seen, self.shared, &self.handles, self.tail)
                            .map(Ok);
                }
                // A busy guest needs no halt checks: look rarely, so as not to take its CPUs.
                poll = pace(if halts.busy() {
                    stop::BUSY_POLL
                } else {
                    stop::POLL
                });
            }
        }
        decision.expect("loop ends with a decision")
    }

    fn mark_ended(&mut self, index: u32) {
        if let Some(ended) = self.ended.get_mut(index as usize)
            && !*ended
        {
            *ended = true;
            self.remaining -= 1;
        }
    }

    /// Stops the vCPUs still running: flag first (and open every scheduler gate), then
    /// kick until each has acknowledged; then joins every thread.
    pub fn stop_all(mut self, hub: &Hub) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.control.release_all();
        hub.vm_ending();
        while self.remaining > 0 {
            for (h, _) in self.handles.iter().zip(&self.ended).filter(|(_, e)| !**e) {
                if let Err(e) = h.kill(kick::kick_signal()) {
                    tracing::debug!("kicking a vCPU thread failed: {e}");
                }
            }
            let deadline = Instant::now() + REKICK;
            while self.remaining > 0 {
                let Some(wait) = deadline.checked_duration_since(Instant::now()) else {
                    break;
                };
                match self.rx.recv_timeout(wait) {
                    Ok(ToCoordinator::Ended(index, end)) => {
                        self.mark_ended(index);
                        if let VcpuEnd::Error(e) = end {
                            tracing::debug!("vCPU {index} failed while stopping: {e}");
                        }
                    }
                    Ok(ToCoordinator::Look) => {}
                    Err(mpsc::RecvTimeoutError::Timeout) => break,
                    Err(mpsc::RecvTimeoutError::Disconnected) => self.remaining = 0,
                }
            }
        }
        for (index, h) in self.handles.into_iter().enumerate() {
            if h.join().is_err() {
                tracing::error!("vCPU {index} thread panicked");
            }
        }
    }
}

/// What the coordinator knows of every vCPU now: CPU time, exits, latest sample.
fn observe(shared: &Shared, control: &VcpuControl) -> Vec<Observation> {
    shared
        .watch
        .iter()
        .enumerate()
        .map(|(vcpu, w)| Observation {
            cpu: control.cpu_time(vcpu),
            exits: w.exits(),
            sample: w.latest(),
        })
        .collect()
}

/// Asks `vcpus` for a sample of their state: request, then kick out of KVM_RUN.
fn request_samples(shared: &Shared, handles: &[JoinHandle<()>], vcpus: &[usize]) {
    for &vcpu in vcpus {
        shared.watch[vcpu].want_sample();
        if let Some(h) = handles.get(vcpu)
            && let Err(e) = h.kill(kick::kick_signal())
        {
            tracing::debug!("kicking vCPU {vcpu} for a sample failed: {e}");
        }
    }
}

/// One halt check: samples the vCPUs when all are idle, and ends the VM when every
/// one of them is stopped for good.
fn halted_for_good(
    halts: &mut HaltDetector,
    seen: &[Observation],
    shared: &Shared,
    handles: &[JoinHandle<()>],
    tail: &ConsoleTail,
) -> Option<GuestExit> {
    match halts.check(seen) {
        HaltVerdict::Fine => None,
        HaltVerdict::Sample(vcpus) => {
            request_samples(shared, handles, &vcpus);
            None
        }
        HaltVerdict::Dead { vcpu, samples } => Some(GuestExit::Fault(FaultReport {
            reason: FaultReason::HaltedForever {
                vcpus: halt::describe(&samples),
                last_line: tail.last_line(),
            },
            vcpu: vcpu as u32,
            registers: Ok(samples[vcpu].registers.clone()),
        })),
    }
}

/// One watchdog check: samples the vCPUs it asks for (request, then kick), and ends
/// the VM if one is stuck.
fn watch(
    dog: &mut Watchdog,
    seen: &[Observation],
    shared: &Shared,
    handles: &[JoinHandle<()>],
) -> Option<GuestExit> {
    match dog.check(seen) {
        Verdict::Fine => None,
        Verdict::Sample(vcpus) => {
            request_samples(shared, handles, &vcpus);
            None
        }
        Verdict::Stuck {
            vcpu,
            stalled,
            last,
        } => Some(GuestExit::Fault(FaultReport {
            reason: FaultReason::NoProgress { cpu_time: stalled },
            vcpu: vcpu as u32,
            registers: last
                .map(|s| s.registers)
                .ok_or_else(|| "never sampled".to_string()),
        })),
    }
}
