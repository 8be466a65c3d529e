//! `tslice = "auto"`: the scheduler picks its own slice.
//!
//! S1 found a 1 ms slice speeds up MPI jobs in VMs and S4 that the best setting
//! differs per application; nothing picked it for the workload. A short slice helps in
//! one situation only: a vCPU keeps its pCPU to the end of its slice (it spins, waiting
//! for a message) while another vCPU, often the one it waits for, is queued behind it.
//! The slice is then how long the message waits. Anywhere else a short slice only adds
//! switches: a compute-only domain gains nothing from handing its pCPU over more often,
//! and a vCPU that blocks to wait gives its pCPU up before any slice ends (its partner's
//! wake-up is BOOSTed).
//!
//! So the controller watches, per epoch ([`EPOCH_NS`] of scheduler time):
//! - **queued share**: of the credit ticks that found a vCPU running, the share that
//!   found another queued on the same pCPU (sampled at ticks, so the share does not
//!   depend on the tick's length: the evidence survives the change it causes). A pool
//!   with a vCPU a pCPU, where domain 0's BOOSTed wake-ups preempt and end soon, queues
//!   a vCPU only while domain 0 runs; an oversubscribed one always queues;
//! - **wake-ups**: blocked vCPUs made runnable, per pCPU and second: messages moving
//!   (domain 0 wakes for every batch of frames it forwards; blocking waiters wake for
//!   every message they receive). A compute-only pool wakes almost never.
//!
//! It wants the short setting ([`short_params`]: S1's 1/1 ms, no ratelimit) when
//! vCPUs queue behind running ones most of the time and messages move, else the long
//! one (the parameters
//! configured when auto was turned on). It changes only after [`HOLD_EPOCHS`]
//! consecutive epochs agree (hysteresis: a burst of messages or one quiet epoch does
//! not flap it). Every change is recorded with the signals that made it.
//!
//! The choice is the pool's, as Xen's slice is: `sched`'s slice is also its accounting
//! period, and the signal that tells a communicating domain from a compute-only one in
//! a spin-waiting guest (its frames) is domain 0's, not the domain's own (see
//! `docs/scheduler.md`, "Auto slice").

use crate::params::{NS_PER_MS, Params};

/// How often the controller decides.
pub const EPOCH_NS: u64 = 100 * NS_PER_MS;
/// Consecutive epochs that must want the other setting before it changes.
pub const HOLD_EPOCHS: u32 = 3;
/// The share of ticks that found a vCPU queued from which the pool counts as contended.
pub const QUEUED_SHARE: f64 = 0.5;
/// Ticks an epoch must hold for its share to mean anything.
pub const MIN_TICKS: u64 = 4;
/// Wake-ups per pCPU and second from which messages count as moving (a compute-only
/// pool: a few a second, from timers; S1's node: hundreds).
pub const MIN_WAKES_PER_PCPU_S: f64 = 50.0;
/// The most changes kept (the record is allocated once, so the scheduler's hot path
/// never allocates); later ones are counted in [`AutoSlice::dropped`].
pub const MAX_RECORDED: usize = 4096;

/// Which of its two settings the controller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Setting {
    /// The parameters configured when auto was turned on (Xen's 30 ms by default).
    Long,
    /// S1's tuned slice: [`short_params`].
    Short,
}

impl Setting {
    pub fn name(self) -> &'static str {
        match self {
            Setting::Long => "long",
            Setting::Short => "short",
        }
    }
}

/// S1's 1/1 ms on top of `long`: the slice and the tick 1 ms, no ratelimit (it must
/// stay below the slice, and Xen 3.4 had none); the rest as configured.
pub fn short_params(long: Params) -> Params {
    Params {
        tslice_ns: NS_PER_MS,
        tick_ns: NS_PER_MS,
        ratelimit_ns: 0,
        ..long
    }
}

/// What one epoch saw.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signals {
    /// Credit ticks that found a vCPU running.
    pub ticks: u64,
    /// Those that found another vCPU queued on the same pCPU.
    pub queued: u64,
    /// Blocked vCPUs made runnable.
    pub wakes: u64,
    /// The epoch's length.
    pub span_ns: u64,
}

impl Signals {
    /// The share of ticks that found a vCPU queued (0 with too few to tell).
    pub fn queued_share(&self) -> f64 {
        if self.ticks < MIN_TICKS {
            0.0
        } else {
            self.queued as f64 / self.ticks as f64
        }
    }

    /// Wake-ups per pCPU and second.
    pub fn wakes_per_pcpu_s(&self, pcpus: u32) -> f64 {
        if self.span_ns == 0 || pcpus == 0 {
            return 0.0;
        }
        self.wakes as f64 * 1e9 / self.span_ns as f64 / pcpus as f64
    }

    /// The setting this epoch asks for.
    pub fn wants(&self, pcpus: u32) -> Setting {
        if self.queued_share() >= QUEUED_SHARE
            && self.wakes_per_pcpu_s(pcpus) >= MIN_WAKES_PER_PCPU_S
        {
            Setting::Short
        } else {
            Setting::Long
        }
    }
}

/// One change of setting, and the epoch's signals that made it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoChange {
    /// Scheduler time of the change.
    pub at_ns: u64,
    pub setting: Setting,
    pub params: Params,
    pub signals: Signals,
}

/// The controller's state, kept by the scheduler while auto is on.
#[derive(Clone, Debug)]
pub struct AutoSlice {
    long: Params,
    setting: Setting,
    /// The current epoch's start and counts.
    epoch_start_ns: u64,
    counts: Signals,
    /// Epochs in a row that wanted the other setting.
    agreeing: u32,
    /// Epochs decided.
    epochs: u64,
    /// Epochs spent in the short setting.
    short_epochs: u64,
    changes: Vec<AutoChange>,
    dropped: u64,
    /// The signals summed over every epoch decided.
    total: Signals,
}

impl AutoSlice {
    /// Auto from `now`, starting in the long setting `long`.
    pub fn new(long: Params, now: u64) -> AutoSlice {
        AutoSlice {
            long,
            setting: Setting::Long,
            epoch_start_ns: now,
            counts: Signals::default(),
            agreeing: 0,
            epochs: 0,
            short_epochs: 0,
            changes: Vec::with_capacity(MAX_RECORDED),
            dropped: 0,
            total: Signals::default(),
        }
    }

    /// The setting in force.
    pub fn setting(&self) -> Setting {
        self.setting
    }

    /// The parameters of the setting in force.
    pub fn params(&self) -> Params {
        match self.setting {
            Setting::Long => self.long,
            Setting::Short => short_params(self.long),
        }
    }

    /// The long setting's parameters (as configured).
    pub fn long(&self) -> Params {
        self.long
    }

    /// Every change so far, in order (at most [`MAX_RECORDED`]).
    pub fn changes(&self) -> &[AutoChange] {
        &self.changes
    }

    /// Changes made but not recorded (beyond [`MAX_RECORDED`]).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The signals summed over every epoch decided so far.
    pub fn total(&self) -> Signals {
        self.total
    }

    /// Epochs decided, and how many of them ran the short setting.
    pub fn epochs(&self) -> (u64, u64) {
        (self.epochs, self.short_epochs)
    }

    pub(crate) fn note_tick(&mut self, queued: bool) {
        self.counts.ticks += 1;
        self.counts.queued += u64::from(queued);
    }

    pub(crate) fn note_wake(&mut self) {
        self.counts.wakes += 1;
    }

    pub(crate) fn note_wakes(&mut self, n: u64) {
        self.counts.wakes = self.counts.wakes.saturating_add(n);
    }

    /// Ends the epoch if it is over; returns the new parameters if the setting
    /// changed.
    pub(crate) fn decide(&mut self, now: u64, pcpus: u32) -> Option<Params> {
        if now < self.epoch_start_ns.saturating_add(EPOCH_NS) {
            return None;
        }
        let signals = Signals {
            span_ns: now - self.epoch_start_ns,
            ..self.counts
        };
        self.counts = Signals::default();
        self.epoch_start_ns = now;
        self.total.ticks += signals.ticks;
        self.total.queued += signals.queued;
        self.total.wakes += signals.wakes;
        self.total.span_ns += signals.span_ns;
        self.epochs += 1;
        if self.setting == Setting::Short {
            self.short_epochs += 1;
        }
        let wants = signals.wants(pcpus);
        if wants == self.setting {
            self.agreeing = 0;
            return None;
        }
        self.agreeing += 1;
        if self.agreeing < HOLD_EPOCHS {
            return None;
        }
        self.agreeing = 0;
        self.setting = wants;
        let params = self.params();
        let change = AutoChange {
            at_ns: now,
            setting: self.setting,
            params,
            signals,
        };
        if self.changes.len() < MAX_RECORDED {
            self.changes.push(change);
        } else {
            self.dropped += 1;
        }
        Some(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(ticks: u64, queued: u64, wakes: u64) -> Signals {
        Signals {
            ticks,
            queued,
            wakes,
            span_ns: EPOCH_NS,
        }
    }

    #[test]
    fn an_epoch_wants_the_short_slice_only_when_contended_and_messaging() {
        // (ticks, ticks with a vCPU queued, wakes in 100 ms on 2 pCPUs) -> setting
        let table = [
            // Oversubscribed, spinning, messages moving (S1's 1/1 case).
            ((20, 20, 200), Setting::Short),
            ((20, 10, 10), Setting::Short),
            // Oversubscribed but compute-only (EP): no messages.
            ((20, 20, 2), Setting::Long),
            // Messages but rarely a vCPU queued (S1's node: a vCPU a pCPU, domain 0
            // preempting now and then).
            ((20, 0, 500), Setting::Long),
            ((20, 6, 500), Setting::Long),
            // Too few ticks to tell (vCPUs block before a tick).
            ((3, 3, 500), Setting::Long),
            ((0, 0, 5000), Setting::Long),
        ];
        for ((e, c, w), want) in table {
            assert_eq!(epoch(e, c, w).wants(2), want, "{e} {c} {w}");
        }
        assert_eq!(epoch(4, 4, 10).wakes_per_pcpu_s(2), 50.0);
        assert_eq!(epoch(4, 4, 10).wakes_per_pcpu_s(0), 0.0);
        assert_eq!(epoch(20, 5, 0).queued_share(), 0.25);
    }

    /// Runs `epochs` epochs of the given signals through `auto`, returning the
    /// setting after each.
    fn run(auto: &mut AutoSlice, start: u64, epochs: &[(u64, u64, u64)]) -> Vec<Setting> {
        let mut now = start;
        epochs
            .iter()
            .map(|&(e, c, w)| {
                for i in 0..e {
                    auto.note_tick(i < c);
                }
                for _ in 0..w {
                    auto.note_wake();
                }
                now += EPOCH_NS;
                auto.decide(now, 2);
                auto.setting()
            })
            .collect()
    }

    #[test]
    fn it_changes_only_after_three_epochs_agree() {
        use Setting::{Long, Short};
        let long = Params::default();
        let mut auto = AutoSlice::new(long, 0);
        let hot = (20, 20, 200);
        let cold = (20, 0, 200);
        // Two hot epochs, a cold one, then three hot: the change comes at the third
        // hot epoch in a row only.
        let seen = run(&mut auto, 0, &[hot, hot, cold, hot, hot, hot, hot]);
        assert_eq!(seen, [Long, Long, Long, Long, Long, Short, Short]);
        assert_eq!(auto.params(), short_params(long));
        assert_eq!(auto.params().tslice_ns, NS_PER_MS);
        assert!(auto.params().validate().is_ok());
        // A single cold epoch does not bring the long slice back; three do.
        let seen = run(&mut auto, 7 * EPOCH_NS, &[cold, hot, cold, cold, cold]);
        assert_eq!(seen, [Short, Short, Short, Short, Long]);
        assert_eq!(auto.params(), long);
        let changes = auto.changes();
        assert_eq!(changes.len(), 2);
        assert_eq!(changes[0].setting, Short);
        assert_eq!(changes[0].at_ns, 6 * EPOCH_NS);
        assert_eq!(changes[0].signals.queued, 20);
        assert_eq!(changes[1].setting, Long);
        assert_eq!(auto.epochs(), (12, 6));
    }

    #[test]
    fn nothing_is_decided_before_an_epoch_has_passed() {
        let mut auto = AutoSlice::new(Params::default(), 1_000);
        for _ in 0..10 {
            auto.note_tick(true);
        }
        assert_eq!(auto.decide(1_000 + EPOCH_NS - 1, 2), None);
        assert_eq!(auto.epochs(), (0, 0));
        assert_eq!(auto.decide(1_000 + EPOCH_NS, 2), None);
        assert_eq!(auto.epochs(), (1, 0));
    }

    #[test]
    fn the_short_setting_keeps_everything_but_slice_tick_and_ratelimit() {
        let long = Params {
            accounting: crate::Accounting::Tick,
            ratelimit_ns: 0,
            directed_yield: true,
            ..Params::default()
        };
        let short = short_params(long);
        assert_eq!(
            (short.tslice_ns, short.tick_ns, short.ratelimit_ns),
            (NS_PER_MS, NS_PER_MS, 0)
        );
        assert_eq!(short.accounting, crate::Accounting::Tick);
        assert!(short.directed_yield);
        assert!(short.validate().is_ok());
        assert!(short_params(Params::default()).validate().is_ok());
    }
}
