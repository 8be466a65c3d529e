//! Scheduler parameters (Xen `xl sched-credit -s`) and their validation.

use thiserror::Error;

/// Nanoseconds per millisecond.
pub const NS_PER_MS: u64 = 1_000_000;
/// Nanoseconds per microsecond.
pub const NS_PER_US: u64 = 1_000;

/// Xen `CSCHED_CREDITS_PER_MSEC`: credit burnt per millisecond of run time.
pub const CREDITS_PER_MSEC: i64 = 10;
/// Credits are kept internally in milli-credits so that slices down to 100 µs
/// (1 Xen credit) still divide fairly among many domains. All Xen formulas are
/// applied unchanged on milli-credits; reported credits are divided back.
pub const CREDIT_SCALE: i64 = 1_000;
/// Run time worth one milli-credit (1 ms / (10 * 1000) = 100 ns).
pub const NS_PER_MCREDIT: u64 = NS_PER_MS / (CREDITS_PER_MSEC * CREDIT_SCALE) as u64;

/// Xen `CSCHED_DEFAULT_TSLICE_MS`.
pub const DEFAULT_TSLICE_NS: u64 = 30 * NS_PER_MS;
/// Xen `CSCHED_TICKS_PER_TSLICE`.
pub const TICKS_PER_TSLICE: u64 = 3;
/// Xen's default `sched_ratelimit_us` (1000 µs).
pub const DEFAULT_RATELIMIT_NS: u64 = NS_PER_MS;

/// Smallest slice accepted (Xen stops at 1 ms; we allow 100 µs, S1's direction).
pub const MIN_TSLICE_NS: u64 = 100 * NS_PER_US;
/// Xen `XEN_SYSCTL_CSCHED_TSLICE_MAX` (1000 ms).
pub const MAX_TSLICE_NS: u64 = 1_000 * NS_PER_MS;
/// Smallest tick accepted.
pub const MIN_TICK_NS: u64 = 100 * NS_PER_US;
/// Xen `XEN_SYSCTL_SCHED_RATELIMIT_MIN` (100 µs).
pub const MIN_RATELIMIT_NS: u64 = 100 * NS_PER_US;
/// Xen `XEN_SYSCTL_SCHED_RATELIMIT_MAX` (500 ms).
pub const MAX_RATELIMIT_NS: u64 = 500 * NS_PER_MS;
/// Xen `XEN_SYSCTL_CSCHED_MGR_DLY_MAX_US` (100 ms).
pub const MAX_MIGRATION_DELAY_NS: u64 = 100 * NS_PER_MS;

/// Global (per-pool) parameters. The tick is independent of the slice, unlike
/// upstream Xen where it is always derived from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Time slice, and the accounting period.
    pub tslice_ns: u64,
    /// Period of the credit-burning tick on a busy pCPU.
    pub tick_ns: u64,
    /// Minimum run time before a vCPU may be preempted (0 = off).
    pub ratelimit_ns: u64,
    /// A vCPU descheduled less than this long ago is cache-hot and not stolen.
    pub migration_delay_ns: u64,
    /// Burn the running vCPUs up to the accounting instant before sharing
    /// credit (default). `false` is Xen's behaviour: accounting sees each
    /// running vCPU's credit as of its pCPU's last tick, so the tick length
    /// also sets how stale accounting is (and lets caps leak, see
    /// `accounting.rs`).
    pub sync_accounting: bool,
    /// How run time becomes debited credit.
    pub accounting: Accounting,
    /// Answer [`crate::Scheduler::yield_to`] hints (a vCPU waiting at a barrier names
    /// the vCPUs of its domain it waits for) with a directed yield: those still
    /// queued UNDER are BOOSTed ahead of other domains. Off by default (Xen has no
    /// such hint); hints are then ignored.
    pub directed_yield: bool,
}

/// How run time becomes debited credit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Accounting {
    /// Every nanosecond run is debited (at deschedule, tick and accounting): Xen since
    /// "Accurate accounting for credit scheduler" (4.x).
    #[default]
    Exact,
    /// Xen 3.4's credit1: each tick debits a whole tick's credit from the vCPU it finds
    /// running, and nothing else is debited (a vCPU that is never running at a tick
    /// runs free; one that always is pays for whole ticks). No ratelimit existed.
    Tick,
}

impl Accounting {
    pub fn name(self) -> &'static str {
        match self {
            Accounting::Exact => "exact",
            Accounting::Tick => "tick",
        }
    }
}

impl std::str::FromStr for Accounting {
    type Err = String;
    fn from_str(text: &str) -> Result<Accounting, String> {
        match text {
            "exact" => Ok(Accounting::Exact),
            "tick" => Ok(Accounting::Tick),
            _ => Err(format!("accounting '{text}' is not exact or tick")),
        }
    }
}

impl Default for Params {
    /// Xen's defaults: 30 ms slice, 10 ms tick, 1 ms ratelimit, no migration delay.
    fn default() -> Self {
        Self::with_tslice(DEFAULT_TSLICE_NS)
    }
}

impl Params {
    /// Parameters for a slice with Xen's derived tick and the default
    /// ratelimit (turned off when the slice is not longer than it, since
    /// ratelimit must stay below the slice).
    pub fn with_tslice(tslice_ns: u64) -> Self {
        Self {
            tslice_ns,
            tick_ns: Self::default_tick(tslice_ns),
            ratelimit_ns: if tslice_ns > DEFAULT_RATELIMIT_NS {
                DEFAULT_RATELIMIT_NS
            } else {
                0
            },
            migration_delay_ns: 0,
            sync_accounting: true,
            accounting: Accounting::Exact,
            directed_yield: false,
        }
    }

    /// Xen `__csched_set_tslice`: 3 ticks per slice, 1 if the slice is under
    /// 3 ms; the tick is rounded down to whole microseconds as Xen does.
    pub fn default_tick(tslice_ns: u64) -> u64 {
        if tslice_ns < TICKS_PER_TSLICE * NS_PER_MS {
            tslice_ns
        } else {
            tslice_ns / TICKS_PER_TSLICE / NS_PER_US * NS_PER_US
        }
    }

    /// Xen `credits_per_tslice` in whole credits (10 per ms, 300 for 30 ms).
    pub fn credits_per_tslice(&self) -> i64 {
        self.mcredits_per_tslice() / CREDIT_SCALE
    }

    /// What one tick debits under [`Accounting::Tick`], in milli-credits (Xen 3.4's
    /// `CSCHED_CREDITS_PER_TICK`, 100 for a 10 ms tick).
    pub fn mcredits_per_tick(&self) -> i64 {
        (self.tick_ns / NS_PER_MCREDIT) as i64
    }

    /// Credits per slice in milli-credits: scales linearly with the slice.
    pub fn mcredits_per_tslice(&self) -> i64 {
        (self.tslice_ns / NS_PER_MCREDIT) as i64
    }

    /// Checks every range; the error names the parameter and its range.
    pub fn validate(&self) -> Result<(), ParamError> {
        if !(MIN_TSLICE_NS..=MAX_TSLICE_NS).contains(&self.tslice_ns) {
            return Err(ParamError::Tslice(self.tslice_ns));
        }
        if !(MIN_TICK_NS..=self.tslice_ns).contains(&self.tick_ns) {
            return Err(ParamError::Tick {
                tick_ns: self.tick_ns,
                tslice_ns: self.tslice_ns,
            });
        }
        if self.ratelimit_ns != 0
            && (!(MIN_RATELIMIT_NS..=MAX_RATELIMIT_NS).contains(&self.ratelimit_ns)
                || self.ratelimit_ns >= self.tslice_ns)
        {
            return Err(ParamError::Ratelimit {
                ratelimit_ns: self.ratelimit_ns,
                tslice_ns: self.tslice_ns,
            });
        }
        if self.accounting == Accounting::Tick && self.ratelimit_ns != 0 {
            return Err(ParamError::TickAccountingRatelimit(self.ratelimit_ns));
        }
        if self.migration_delay_ns > MAX_MIGRATION_DELAY_NS {
            return Err(ParamError::MigrationDelay(self.migration_delay_ns));
        }
        Ok(())
    }
}

/// An invalid global parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ParamError {
    #[error("tslice_ns = {0}: must be in 100000..=1000000000 (100 us to 1000 ms)")]
    Tslice(u64),
    #[error("tick_ns = {tick_ns}: must be in 100000..={tslice_ns} (100 us to tslice_ns)")]
    Tick { tick_ns: u64, tslice_ns: u64 },
    #[error(
        "ratelimit_ns = {ratelimit_ns}: must be 0 (off) or in 100000..=500000000 \
         (100 us to 500 ms) and below tslice_ns = {tslice_ns}"
    )]
    Ratelimit { ratelimit_ns: u64, tslice_ns: u64 },
    #[error("ratelimit_ns = {0}: tick accounting (Xen 3.4) has no ratelimit; give ratelimit 0")]
    TickAccountingRatelimit(u64),
    #[error("migration_delay_ns = {0}: must be in 0..=100000000 (0 to 100 ms)")]
    MigrationDelay(u64),
    #[error("pcpus = {0}: must be in 1..=256")]
    Pcpus(u32),
    #[error(
        "cores_per_module = {cores_per_module}: must be at least 1 and divide the {pcpus} pCPUs"
    )]
    Modules { pcpus: u32, cores_per_module: u32 },
    #[error("the module topology describes {given} pCPUs; the scheduler has {pcpus}")]
    ModulesSize { given: u32, pcpus: u32 },
    #[error("speed_percent = {0}: must be in 1..=100")]
    Speed(u32),
}
