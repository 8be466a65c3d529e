//! Noticing a guest that has stopped for good: every vCPU halted with interrupts
//! disabled (or an AP never started), which no interrupt kumo's devices raise can end.
//! That is where firmware and kernels go when they give up (`cli; hlt`), and without
//! this kumo would wait for them forever (or until `--timeout`).
//!
//! How, cheaply: the coordinator looks at each vCPU's exit count and thread CPU time at
//! every poll. Only when no vCPU has exited or used CPU time since the last poll are the
//! vCPUs sampled (a kick each: registers and MP state, on their own threads, see
//! `watchdog::Watch`). If every answer says "halted with IF = 0" or "waiting for SIPI"
//! and none exited meanwhile, the VM is dead. A guest that halts with interrupts
//! enabled (waiting for a timer or a NIC) is sampled again after a growing pause
//! (100 ms doubling to 1.6 s), so an idle guest costs a few kicks per second at most
//! and a busy one none.
//!
//! What could still wake such a vCPU: an NMI, INIT or SMI. kumo's devices raise
//! ordinary MSIs only (an MSI the guest programmed as NMI is the one exception), and
//! every vCPU that could send an IPI is itself halted.
//!
//! The policy ([`HaltDetector`]) is pure; `vm.rs` feeds it what the watchdog also reads.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::watchdog::{Observation, Sample};

/// RFLAGS.IF.
const RFLAGS_IF: u64 = 1 << 9;
/// CPU time a vCPU may use between two polls and still count as idle: answering a
/// sample costs a few ioctls (tens of µs), far below one poll of guest execution.
const IDLE_CPU: Duration = Duration::from_millis(1);
/// Polls to wait before sampling again after a sample found the guest only waiting.
const FIRST_PAUSE: u32 = 5;
const LONGEST_PAUSE: u32 = 80;

/// What the coordinator must do after a poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HaltVerdict {
    Fine,
    /// Sample these vCPUs (request, then kick).
    Sample(Vec<usize>),
    /// No vCPU can ever run again. `vcpu` is the lowest halted one, `samples` every
    /// vCPU's answer (index = vCPU).
    Dead {
        vcpu: usize,
        samples: Vec<Sample>,
    },
}

/// Whether one sampled vCPU can never run again on its own.
pub fn stopped_for_good(sample: &Sample) -> bool {
    sample.waiting_for_sipi || (sample.halted && sample.registers.rflags & RFLAGS_IF == 0)
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Watching,
    /// Samples requested; the sequence numbers and exit counts at the request.
    Sampling {
        seqs: Vec<u64>,
        exits: Vec<u64>,
        polls: u32,
    },
}

/// The policy over all vCPUs of a VM, one call per coordinator poll.
#[derive(Debug)]
pub struct HaltDetector {
    previous: Option<Vec<(u64, Option<Duration>)>>,
    phase: Phase,
    /// Polls left before sampling is allowed again, and the next pause's length.
    pause: u32,
    next_pause: u32,
    /// The last check saw a vCPU exit or use CPU time.
    busy: bool,
}

impl Default for HaltDetector {
    fn default() -> Self {
        Self {
            previous: None,
            phase: Phase::Watching,
            pause: 0,
            next_pause: FIRST_PAUSE,
            busy: false,
        }
    }
}

impl HaltDetector {
    /// Whether the last [`check`](Self::check) found the guest active: until it is idle
    /// nothing can be halted for good, and the coordinator may look less often.
    pub fn busy(&self) -> bool {
        self.busy
    }

    pub fn check(&mut self, seen: &[Observation]) -> HaltVerdict {
        let now: Vec<(u64, Option<Duration>)> = seen.iter().map(|o| (o.exits, o.cpu)).collect();
        let idle = self.previous.as_ref().is_some_and(|prev| {
            prev.len() == now.len()
                && prev.iter().zip(&now).all(|((e0, c0), (e1, c1))| {
                    e0 == e1
                        && match (c0, c1) {
                            (Some(c0), Some(c1)) => c1.saturating_sub(*c0) <= IDLE_CPU,
                            _ => false,
                        }
                })
        });
        self.previous = Some(now);
        self.busy = !idle;
        if !idle {
            // Activity: start over, and sample promptly the next time it stops.
            self.phase = Phase::Watching;
            self.pause = 0;
            self.next_pause = FIRST_PAUSE;
            return HaltVerdict::Fine;
        }
        match &mut self.phase {
            Phase::Watching => {
                if self.pause > 0 {
                    self.pause -= 1;
                    return HaltVerdict::Fine;
                }
                self.phase = Phase::Sampling {
                    seqs: seen.iter().map(|o| seq(&o.sample)).collect(),
                    exits: seen.iter().map(|o| o.exits).collect(),
                    polls: 0,
                };
                HaltVerdict::Sample((0..seen.len()).collect())
            }
            Phase::Sampling { seqs, exits, polls } => {
                if seen.iter().zip(exits.iter()).any(|(o, e)| o.exits != *e) {
                    self.phase = Phase::Watching;
                    return HaltVerdict::Fine;
                }
                let unanswered: Vec<usize> = seen
                    .iter()
                    .zip(seqs.iter())
                    .enumerate()
                    .filter(|(_, (o, s))| seq(&o.sample) == **s)
                    .map(|(v, _)| v)
                    .collect();
                if !unanswered.is_empty() {
                    // Parked or paused vCPUs answer once they run again; ask again now
                    // and then in case a kick was lost.
                    *polls += 1;
                    return if (*polls).is_multiple_of(10) {
                        HaltVerdict::Sample(unanswered)
                    } else {
                        HaltVerdict::Fine
                    };
                }
                let samples: Vec<Sample> = seen.iter().filter_map(|o| o.sample.clone()).collect();
                let halted = samples.iter().position(|s| s.halted);
                if let Some(vcpu) = halted
                    && samples.iter().all(stopped_for_good)
                {
                    return HaltVerdict::Dead { vcpu, samples };
                }
                // Only waiting (interrupts on): look again later, less often.
                self.phase = Phase::Watching;
                self.pause = self.next_pause;
                self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE);
                HaltVerdict::Fine
            }
        }
    }
}

fn seq(sample: &Option<Sample>) -> u64 {
    sample.as_ref().map_or(0, |s| s.seq)
}

/// One line per vCPU for the report: where each one stopped.
pub fn describe(samples: &[Sample]) -> String {
    samples
        .iter()
        .enumerate()
        .map(|(v, s)| {
            if s.waiting_for_sipi {
                format!("vCPU {v} never started")
            } else {
                format!(
                    "vCPU {v} halted at rip {:#x} with interrupts {}",
                    s.registers.rip,
                    if s.registers.rflags & RFLAGS_IF == 0 {
                        "disabled"
                    } else {
                        "enabled"
                    }
                )
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The most of a console line kept for the report.
const TAIL_MAX: usize = 200;

/// Remembers the last line a guest wrote to its console (the report's "last words").
#[derive(Debug, Clone, Default)]
pub struct ConsoleTail(Arc<Mutex<TailState>>);

#[derive(Debug, Default)]
struct TailState {
    /// The last complete line.
    last: Vec<u8>,
    /// The line being written (no newline yet).
    current: Vec<u8>,
}

impl ConsoleTail {
    /// `out`, with everything written to it also seen by this tail.
    pub fn wrap(&self, out: Box<dyn Write + Send>) -> Box<dyn Write + Send> {
        Box::new(Tee {
            out,
            tail: self.clone(),
        })
    }

    fn see(&self, bytes: &[u8]) {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for &b in bytes {
            match b {
                b'\n' if !t.current.is_empty() => t.last = std::mem::take(&mut t.current),
                b'\n' | b'\r' => {}
                _ if t.current.len() < TAIL_MAX => t.current.push(b),
                _ => {}
            }
        }
    }

    /// The line being written if there is one, else the last complete line (lossy
    /// UTF-8); empty if the guest printed nothing.
    pub fn last_line(&self) -> String {
        let t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let line = if t.current.is_empty() {
            &t.last
        } else {
            &t.current
        };
        String::from_utf8_lossy(line).into_owned()
    }
}

struct Tee {
    out: Box<dyn Write + Send>,
    tail: ConsoleTail,
}

impl Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.tail.see(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::Registers;

    fn sample(seq: u64, halted: bool, interrupts: bool, sipi: bool) -> Option<Sample> {
        Some(Sample {
            seq,
            halted,
            waiting_for_sipi: sipi,
            registers: Registers {
                rip: 0x100000 + seq,
                rflags: if interrupts { 0x202 } else { 0x2 },
                ..Registers::default()
            },
        })
    }

    fn obs(cpu_ms: u64, exits: u64, sample: Option<Sample>) -> Observation {
        Observation {
            cpu: Some(Duration::from_millis(cpu_ms)),
            exits,
            sample,
        }
    }

    #[test]
    fn busy_until_a_look_finds_no_vcpu_active() {
        let mut d = HaltDetector::default();
        assert!(!d.busy(), "nothing seen yet");
        d.check(&[obs(5, 3, None), obs(1, 0, None)]);
        assert!(d.busy(), "the first look has nothing to compare with");
        d.check(&[obs(50, 3, None), obs(1, 0, None)]);
        assert!(d.busy(), "vCPU 0 used 45 ms");
        d.check(&[obs(50, 3, None), obs(1, 1, None)]);
        assert!(d.busy(), "vCPU 1 exited");
        d.check(&[obs(50, 3, None), obs(1, 1, None)]);
        assert!(!d.busy(), "neither ran nor exited");
    }

    #[test]
    fn halted_with_interrupts_off_everywhere_is_dead_after_one_sample() {
        let mut d = HaltDetector::default();
        assert_eq!(
            d.check(&[obs(5, 3, None), obs(1, 0, None)]),
            HaltVerdict::Fine
        );
        assert_eq!(
            d.check(&[obs(5, 3, None), obs(1, 0, None)]),
            HaltVerdict::Sample(vec![0, 1])
        );
        match d.check(&[
            obs(5, 3, sample(1, true, false, false)),
            obs(1, 0, sample(1, false, false, true)),
        ]) {
            HaltVerdict::Dead { vcpu: 0, samples } => {
                assert_eq!(samples.len(), 2);
                let text = describe(&samples);
                assert!(text.contains("vCPU 0 halted at rip 0x100001 with interrupts disabled"));
                assert!(text.contains("vCPU 1 never started"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_busy_vcpu_is_never_sampled() {
        let mut d = HaltDetector::default();
        for i in 0..100 {
            // vCPU 1 computes without exits: its CPU time moves.
            let v = d.check(&[obs(5, 3, None), obs(i * 20, 0, None)]);
            assert_eq!(v, HaltVerdict::Fine);
        }
    }

    #[test]
    fn an_exit_between_request_and_answer_starts_over() {
        let mut d = HaltDetector::default();
        d.check(&[obs(0, 1, None)]);
        assert_eq!(d.check(&[obs(0, 1, None)]), HaltVerdict::Sample(vec![0]));
        assert_eq!(
            d.check(&[obs(0, 2, sample(1, true, false, false))]),
            HaltVerdict::Fine
        );
    }

    #[test]
    fn waiting_with_interrupts_on_is_fine_and_sampled_less_and_less_often() {
        let mut d = HaltDetector::default();
        let mut seq = 0;
        let mut samples_at = Vec::new();
        d.check(&[obs(0, 1, None)]);
        for poll in 0..400 {
            match d.check(&[obs(0, 1, sample(seq, true, true, false))]) {
                HaltVerdict::Sample(_) => {
                    samples_at.push(poll);
                    seq += 1;
                }
                HaltVerdict::Fine => {}
                HaltVerdict::Dead { .. } => panic!("an interruptible halt is not dead"),
            }
        }
        let gaps: Vec<i32> = samples_at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "{gaps:?}");
        assert_eq!(*gaps.last().unwrap() as u32, LONGEST_PAUSE + 2, "{gaps:?}");
    }

    #[test]
    fn an_unanswered_vcpu_delays_the_verdict_and_is_asked_again() {
        let mut d = HaltDetector::default();
        d.check(&[obs(0, 0, None), obs(0, 0, None)]);
        d.check(&[obs(0, 0, None), obs(0, 0, None)]);
        let mut asked_again = false;
        for _ in 0..20 {
            match d.check(&[obs(0, 0, sample(1, true, false, false)), obs(0, 0, None)]) {
                HaltVerdict::Sample(v) => {
                    assert_eq!(v, vec![1]);
                    asked_again = true;
                }
                HaltVerdict::Fine => {}
                HaltVerdict::Dead { .. } => panic!("vCPU 1 never answered"),
            }
        }
        assert!(asked_again);
    }

    #[test]
    fn the_tail_keeps_the_last_line_and_bounds_it() {
        let tail = ConsoleTail::default();
        assert_eq!(tail.last_line(), "");
        let sink: Vec<u8> = Vec::new();
        let mut out = tail.wrap(Box::new(std::io::Cursor::new(sink)));
        out.write_all(b"first\r\nsecond\n").unwrap();
        assert_eq!(tail.last_line(), "second");
        out.write_all(b"\npart").unwrap();
        assert_eq!(tail.last_line(), "part");
        out.write_all(&[b'x'; 1000]).unwrap();
        assert_eq!(tail.last_line().len(), TAIL_MAX);
    }
}
