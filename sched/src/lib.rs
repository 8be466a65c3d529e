//! Xen's credit1 scheduler (`xen/common/sched/credit.c`) as a pure,
//! deterministic state machine: no threads, no clocks, no allocation on the
//! hot paths. The caller passes the time (monotonic `u64` nanoseconds) and
//! events; the scheduler answers with decisions and with the pCPUs that must
//! reschedule ([`Tickles`], Xen's SCHEDULE_SOFTIRQ).
//!
//! # Driving it
//! 1. At [`Scheduler::next_deadline`] of a pCPU call [`Scheduler::tick`]
//!    (credit tick, accounting on pCPU 0, slice end).
//! 2. On guest events call [`Scheduler::wake`], [`Scheduler::block`],
//!    [`Scheduler::yield_vcpu`] (and the control calls).
//! 3. Call [`Scheduler::schedule`] on every pCPU in the returned tickles and
//!    in the decisions' own tickles, until none is left.
//!
//! [`drive::Sim`] is a complete deterministic driver with synthetic workloads.
//!
//! ```
//! use sched::{Params, PcpuId, Scheduler};
//! let mut s = Scheduler::new(Params::default(), 2, 0).unwrap();
//! let dom = s.add_domain(256, 0).unwrap();
//! let v = s.add_vcpu(0, dom).unwrap(); // starts blocked
//! let mut pending = s.wake(0, v);
//! while let Some(p) = pending.pop_first() {
//!     let d = s.schedule(0, p);
//!     pending.extend(d.tickles);
//!     if d.run == Some(v) {
//!         assert_eq!(d.until_ns, 10_000_000); // first tick
//!     }
//! }
//! assert_eq!(s.current(PcpuId(0)), Some(v));
//! assert_eq!(s.next_deadline(PcpuId(0)), 10_000_000);
//! ```
//!
//! # Semantics
//! - Credits: 10 per ms of run time (Xen `CSCHED_CREDITS_PER_MSEC`); a slice
//!   is worth `10 * tslice_ms` credits per pCPU (300 for 30 ms): the amount
//!   per slice scales with the slice, the burn rate is fixed, as Xen's
//!   `credits_per_tslice`. Internally credits are milli-credits (1 = 100 ns)
//!   so that slices down to 100 µs (1 credit) still divide among domains.
//! - The tick is a separate parameter (default: Xen's `tslice / 3`, or
//!   `tslice` below 3 ms). It burns the running vCPU, ends its BOOST and
//!   activates it; the slice end reschedules; accounting runs every slice.
//! - Priorities BOOST > UNDER > OVER > IDLE, recomputed at accounting only
//!   (plus BOOST at wake and its end at a tick), as in Xen.
//!
//! # Deviations from Xen
//! - By default accounting first burns the running vCPUs up to `now`
//!   ([`Params::sync_accounting`]; `false` restores Xen). Xen reads each
//!   credit as of its pCPU's last tick; with a tick as long as the slice that
//!   lag, through the -1 slice clamp, lets a 6 % cap run 7 ms in 60 ms
//!   (exact: 4 ms; bound: cap + 2 slices = 5.6 ms). Since
//!   priorities only change at accounting, this also means the tick no longer
//!   affects decisions through the debit, only through BOOST end and
//!   activation; set `sync_accounting: false` to study the tick as in Xen.
//! - A wake-up is queued directly on a free pCPU (Xen queues it on its old
//!   pCPU and tickles an idler, which steals it), else on the pCPU running
//!   the lowest priority below its own (Xen only considers its own pCPU).
//! - Stealing scans all peers from `p + 1` with no load-balance ratelimit and
//!   may take a vCPU that just yielded (Xen skips those), so that an idle pCPU
//!   never leaves a queued vCPU waiting. Yield only puts a vCPU behind its
//!   equals (Xen also tries to put it behind one lower-priority vCPU).
//! - No affinity, pCPU hot-plug or migration at tick (`_csched_cpu_pick`);
//!   removing a cap unparks at once. Topology is only modules (cores sharing a
//!   front end and L2, [`Modules`]), and only with [`Scheduler::set_modules`]: a
//!   module-aware pick, off by default, that S3 names as future work for Xen.
#![forbid(unsafe_code)]

mod accounting;
pub mod auto_slice;
pub mod drive;
mod error;
mod hints;
mod ids;
mod invariants;
mod params;
mod runq;
mod scheduler;
mod stats;
mod topology;

pub use error::DomainError;
pub use ids::{DomainId, MAX_PCPUS, PcpuId, Tickles, VcpuId};
pub use params::*;
pub use scheduler::{DEFAULT_WEIGHT, Decision, Scheduler};
pub use stats::{DomainStats, Priority, VcpuState, VcpuStats};
pub use topology::Modules;
