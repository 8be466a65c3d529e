//! The vCPU watchdog: notices a vCPU that burns host CPU without making progress and
//! ends the VM with a report, instead of letting kumo wait forever.
//!
//! Why it exists: on kvm_pvm hosts some single guest ring-0 instructions (`vmcall`,
//! `fxsave` with an MMIO operand, a segment load from a GDT in MMIO) never complete:
//! KVM_RUN spins in the host kernel and never returns on its own.
//!
//! What counts as progress, per vCPU:
//! - an exit handled in user space (port or MMIO access, ...), or
//! - at a sampling kick (a signal that makes KVM_RUN return EINTR, as the stop kick
//!   does), registers different from the previous sample's, or the vCPU halted
//!   (waiting for an interrupt is not a hang; a guest that waits forever is what
//!   `--timeout` bounds).
//!
//! Stall time is the vCPU thread's **CPU time** since its last progress, not wall time:
//! a vCPU that is halted, parked by a scheduler or waiting for a host CPU accumulates
//! none, so oversubscription cannot trip the watchdog. A vCPU is sampled only after a
//! quarter of the bound with no exit: a compute-bound vCPU costs one kick (~40-80 µs
//! here) per quarter bound, a busy one none.
//!
//! The policy ([`Watchdog`]) is pure; `vm.rs` feeds it counters and carries out its
//! kicks.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::fault::Registers;

/// What a vCPU thread answers to a sampling kick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Increases with every answered sample.
    pub seq: u64,
    /// The vCPU was halted (KVM_MP_STATE_HALTED).
    pub halted: bool,
    /// An AP not started yet (KVM_MP_STATE_UNINITIALIZED or INIT_RECEIVED): only a
    /// start-up IPI from another vCPU can make it run.
    pub waiting_for_sipi: bool,
    pub registers: Registers,
}

/// One vCPU's side of the watchdog, shared between its thread and the coordinator.
#[derive(Debug, Default)]
pub struct Watch {
    /// Exits handled in user space (every KVM_RUN return but EINTR).
    exits: AtomicU64,
    /// Set by the coordinator before a sampling kick; cleared by the vCPU thread as it
    /// answers.
    sample_wanted: AtomicBool,
    sample: Mutex<Option<Sample>>,
}

impl Watch {
    /// Counts an exit (the vCPU thread, on every KVM_RUN return but EINTR).
    #[inline]
    pub fn exit(&self) {
        self.exits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn exits(&self) -> u64 {
        self.exits.load(Ordering::Relaxed)
    }

    /// Asks the vCPU thread for a sample at its next EINTR (the caller then kicks it).
    pub fn want_sample(&self) {
        self.sample_wanted.store(true, Ordering::SeqCst);
    }

    /// True once per request: the vCPU thread should take a sample now.
    pub fn sample_requested(&self) -> bool {
        self.sample_wanted.swap(false, Ordering::SeqCst)
    }

    /// Stores the vCPU's state as the answer to a request.
    pub fn answer(&self, halted: bool, waiting_for_sipi: bool, registers: Registers) {
        let mut sample = self.sample.lock().unwrap_or_else(|e| e.into_inner());
        let seq = sample.as_ref().map_or(1, |s| s.seq + 1);
        *sample = Some(Sample {
            seq,
            halted,
            waiting_for_sipi,
            registers,
        });
    }

    pub fn latest(&self) -> Option<Sample> {
        self.sample
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What the coordinator knows of one vCPU at a check.
#[derive(Debug, Clone)]
pub struct Observation {
    /// CPU time of the vCPU thread so far (None: not known yet).
    pub cpu: Option<Duration>,
    pub exits: u64,
    pub sample: Option<Sample>,
}

/// What the coordinator must do after a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Everyone made progress or has not stalled long enough.
    Fine,
    /// Sample these vCPUs (request, then kick).
    Sample(Vec<usize>),
    /// This vCPU used `stalled` of CPU time without progress; its last sample.
    Stuck {
        vcpu: usize,
        stalled: Duration,
        last: Option<Box<Sample>>,
    },
}

#[derive(Debug, Clone, Default)]
struct Track {
    exits: u64,
    seen_seq: u64,
    last_registers: Option<Registers>,
    /// CPU time at the last progress.
    progress_cpu: Option<Duration>,
}

/// The watchdog's policy over all vCPUs of a VM.
#[derive(Debug)]
pub struct Watchdog {
    bound: Duration,
    tracks: Vec<Track>,
}

impl Watchdog {
    pub fn new(vcpus: usize, bound: Duration) -> Self {
        Self {
            bound,
            tracks: vec![Track::default(); vcpus],
        }
    }

    /// How often the coordinator should check.
    pub fn period(&self) -> Duration {
        (self.bound / 4).max(Duration::from_millis(5))
    }

    /// One check over every vCPU's observation (index = vCPU).
    pub fn check(&mut self, seen: &[Observation]) -> Verdict {
        let mut to_sample = Vec::new();
        for (vcpu, (track, obs)) in self.tracks.iter_mut().zip(seen).enumerate() {
            let Some(cpu) = obs.cpu else { continue };
            let exited = obs.exits != track.exits || track.progress_cpu.is_none();
            let mut progressed = exited;
            track.exits = obs.exits;
            if let Some(sample) = &obs.sample
                && sample.seq != track.seen_seq
            {
                track.seen_seq = sample.seq;
                let moved = track.last_registers.as_ref() != Some(&sample.registers);
                progressed |= sample.halted || moved;
                track.last_registers = Some(sample.registers.clone());
            }
            if progressed {
                track.progress_cpu = Some(cpu);
            } else {
                let stalled = cpu.saturating_sub(track.progress_cpu.unwrap_or(cpu));
                if stalled >= self.bound {
                    return Verdict::Stuck {
                        vcpu,
                        stalled,
                        last: obs.sample.clone().map(Box::new),
                    };
                }
            }
            // No exit since the last check: only a sample can show progress next time.
            if !exited {
                to_sample.push(vcpu);
            }
        }
        if to_sample.is_empty() {
            Verdict::Fine
        } else {
            Verdict::Sample(to_sample)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(2);

    fn ms(n: u64) -> Option<Duration> {
        Some(Duration::from_millis(n))
    }

    fn regs(rip: u64) -> Registers {
        Registers {
            rip,
            ..Registers::default()
        }
    }

    fn sample(seq: u64, halted: bool, rip: u64) -> Option<Sample> {
        Some(Sample {
            seq,
            halted,
            waiting_for_sipi: false,
            registers: regs(rip),
        })
    }

    fn obs(cpu: Option<Duration>, exits: u64, sample: Option<Sample>) -> Observation {
        Observation { cpu, exits, sample }
    }

    #[test]
    fn exits_are_progress() {
        let mut w = Watchdog::new(1, BOUND);
        for (i, t) in (0..20).map(|i| (i, i * 500)) {
            assert_eq!(w.check(&[obs(ms(t), i, None)]), Verdict::Fine);
        }
    }

    #[test]
    fn a_vcpu_with_no_exit_is_sampled_then_declared_stuck_on_cpu_time() {
        let mut w = Watchdog::new(1, BOUND);
        assert_eq!(w.check(&[obs(ms(0), 7, None)]), Verdict::Fine);
        assert_eq!(w.check(&[obs(ms(500), 7, None)]), Verdict::Sample(vec![0]));
        // The sample shows the same registers again and again.
        let s = |seq| sample(seq, false, 0x1234);
        assert_eq!(w.check(&[obs(ms(1000), 7, s(1))]), Verdict::Sample(vec![0]));
        assert_eq!(w.check(&[obs(ms(1900), 7, s(2))]), Verdict::Sample(vec![0]));
        // The first sample was the baseline (at 1 s of CPU time).
        assert_eq!(w.check(&[obs(ms(2900), 7, s(3))]), Verdict::Sample(vec![0]));
        match w.check(&[obs(ms(3000), 7, s(4))]) {
            Verdict::Stuck {
                vcpu: 0,
                stalled,
                last: Some(last),
            } => {
                assert_eq!(stalled, BOUND);
                assert_eq!(last.registers.rip, 0x1234);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_stall_is_counted_from_the_last_change_of_registers() {
        let mut w = Watchdog::new(1, BOUND);
        w.check(&[obs(ms(0), 0, None)]);
        w.check(&[obs(ms(1000), 0, sample(1, false, 1))]);
        w.check(&[obs(ms(2500), 0, sample(2, false, 2))]); // moved: progress at 2.5 s
        assert_eq!(
            w.check(&[obs(ms(4400), 0, sample(3, false, 2))]),
            Verdict::Sample(vec![0])
        );
        assert!(matches!(
            w.check(&[obs(ms(4600), 0, sample(4, false, 2))]),
            Verdict::Stuck { .. }
        ));
    }

    #[test]
    fn a_halted_vcpu_is_never_stuck() {
        let mut w = Watchdog::new(1, BOUND);
        for seq in 0..50u64 {
            let verdict = w.check(&[obs(ms(seq * 1000), 0, sample(seq, true, 0x10))]);
            assert!(!matches!(verdict, Verdict::Stuck { .. }), "{verdict:?}");
        }
    }

    #[test]
    fn wall_time_without_cpu_time_is_not_a_stall() {
        // A parked or descheduled vCPU: its CPU time does not move.
        let mut w = Watchdog::new(1, BOUND);
        for seq in 0..50u64 {
            let verdict = w.check(&[obs(ms(100), 0, sample(seq, false, 0x10))]);
            assert!(!matches!(verdict, Verdict::Stuck { .. }), "{verdict:?}");
        }
    }

    #[test]
    fn vcpus_are_judged_apart_and_unknown_cpu_time_is_skipped() {
        let mut w = Watchdog::new(3, BOUND);
        w.check(&[obs(ms(0), 0, None), obs(ms(0), 0, None), obs(None, 0, None)]);
        let verdict = w.check(&[
            obs(ms(3000), 1, None),
            obs(ms(600), 0, None),
            obs(None, 0, None),
        ]);
        assert_eq!(verdict, Verdict::Sample(vec![1]));
    }
}
