//! `kumo bench soak`: many boots of the embedded guest and many loopback live
//! migrations in one process, watching the process's own resident memory, open file
//! descriptors and threads. A VMM that leaks per VM (a descriptor, a thread left
//! running, memory kept) shows it here long before a node that runs for weeks does.
//!
//! The migrations are spread evenly among the boots, so the warm-up (the first tenth
//! of the iterations) has been through both paths before the baseline is taken. After
//! it, the run fails (exit [`EXIT_GREW`], one line naming the resource) if RSS grew by
//! more than [`RSS_SLACK_BYTES`] or the descriptors or threads by anything at all
//! (issue 30's targets).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use hv::GuestExit;
use hv::migration::dirty::DirtyLogMode;
use serde::Serialize;

use super::migrate::{self, MigrateBenchArgs};
use crate::heap::Heap;
use kumo_vmm::{guest, run};

/// How much RSS may grow after the warm-up (allocator noise, not a leak per VM).
pub const RSS_SLACK_BYTES: u64 = 1 << 20;
/// The exit status when a resource grew (as `bench compare`'s when a figure got worse;
/// 2 stays for bad input).
pub const EXIT_GREW: u8 = 1;
/// The guest's vCPUs, as other benches boot it.
const VCPUS: u32 = 2;
/// How long a migrated guest runs before it moves (its gap probe then runs on).
const MIGRATE_AFTER_MS: u64 = 100;

#[derive(Args, Debug)]
pub struct SoakArgs {
    /// Boots of the embedded guest (each a new VM that runs to its end).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub boots: u32,

    /// Live migrations on loopback (each a new VM, sent and received in this process),
    /// spread evenly among the boots; dirty trackers bitmap and ring taken in turn.
    #[arg(long, value_name = "M", default_value_t = 100)]
    pub migrations: u32,

    /// Record the resources every this many iterations (and after the last).
    #[arg(long, value_name = "K", default_value_t = 50)]
    pub every: u32,

    /// Print one JSON object per sample and a verdict line.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

/// What this process holds at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Resources {
    /// Resident set size (`/proc/self/statm`'s second field, in bytes), after
    /// `malloc_trim` when the soak samples it.
    pub rss_bytes: u64,
    /// Open file descriptors (entries of `/proc/self/fd`, the listing's own excluded).
    pub fds: u64,
    /// Threads (`/proc/self/status`'s `Threads:`).
    pub threads: u64,
}

impl Resources {
    /// This process's resources now, after glibc has handed the free memory it keeps
    /// back to the host (see [`return_free_heap`]).
    pub fn trimmed() -> Result<Self> {
        return_free_heap();
        Self::now()
    }

    /// This process's resources now.
    pub fn now() -> Result<Self> {
        Ok(Self {
            rss_bytes: rss_bytes()?,
            fds: open_fds()?,
            threads: threads()?,
        })
    }
}

/// `malloc_trim` returns the free pages malloc can, so a sample counts less of what
/// the allocator merely keeps (`crate::heap` says what else keeps RSS flat); a leak,
/// which cannot be trimmed, still shows.
fn return_free_heap() {
    // SAFETY: malloc_trim only releases free pages of malloc's own heaps; it takes
    // malloc's locks and touches no memory of ours.
    unsafe { libc::malloc_trim(0) };
}

fn rss_bytes() -> Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .context("/proc/self/statm has no resident page count")?;
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096);
    Ok(pages * page)
}

fn open_fds() -> Result<u64> {
    let listed = std::fs::read_dir("/proc/self/fd")
        .context("listing /proc/self/fd")?
        .count() as u64;
    // The listing itself holds one descriptor while it runs.
    Ok(listed.saturating_sub(1))
}

fn threads() -> Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .context("/proc/self/status has no Threads: line")
}

/// One `--json` row: the resources after `iteration` iterations.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SampleLine {
    pub iteration: u32,
    pub boots: u32,
    pub migrations: u32,
    pub seconds: f64,
    #[serde(flatten)]
    pub resources: Resources,
    /// What glibc malloc held at the sample (after the trim): the evidence for whether
    /// RSS growth is memory kumo holds or memory the allocator keeps.
    #[serde(flatten)]
    pub heap: Heap,
}

/// The `--json` verdict line: the baseline after the warm-up, the last sample, and
/// what grew beyond its bound (empty when the run passed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictLine {
    pub iterations: u32,
    pub warmup_iterations: u32,
    pub seconds: f64,
    pub first: Resources,
    pub baseline: Resources,
    pub last: Resources,
    pub grew: Vec<Growth>,
}

/// A resource that grew beyond its bound after the warm-up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Growth {
    /// `"rss_bytes"`, `"fds"` or `"threads"`.
    pub resource: &'static str,
    pub baseline: u64,
    pub last: u64,
    pub allowed: u64,
}

/// What grew from `baseline` to `last` by more than its bound: RSS by more than
/// [`RSS_SLACK_BYTES`], descriptors or threads by any.
pub fn growth(baseline: Resources, last: Resources) -> Vec<Growth> {
    [
        (
            "rss_bytes",
            baseline.rss_bytes,
            last.rss_bytes,
            RSS_SLACK_BYTES,
        ),
        ("fds", baseline.fds, last.fds, 0),
        ("threads", baseline.threads, last.threads, 0),
    ]
    .into_iter()
    .filter(|&(_, b, l, allowed)| l > b.saturating_add(allowed))
    .map(|(resource, baseline, last, allowed)| Growth {
        resource,
        baseline,
        last,
        allowed,
    })
    .collect()
}

/// Whether iteration `i` (0-based) of `total` is a migration: `migrations` of them
/// spread evenly, the first at the start of its share.
pub fn is_migration(i: u32, total: u32, migrations: u32) -> bool {
    if migrations == 0 || total == 0 {
        return false;
    }
    let i = u64::from(i);
    let (total, migrations) = (u64::from(total), u64::from(migrations));
    // The k-th migration is at floor(k * total / migrations).
    let k = (i * migrations).div_ceil(total);
    k < migrations && k * total / migrations == i
}

/// Migrations the warm-up holds, where there are that many: the migration buffers
/// kumo keeps for the next migration (two: `hv::migration::stream`'s spares) fill
/// their pages over the first few, up to the largest section seen.
const WARMUP_MIGRATIONS: u32 = 3;

/// Iterations of the warm-up: the first tenth (at least one), and at least up to the
/// end of the [`WARMUP_MIGRATIONS`]-th migration.
pub fn warmup(total: u32, migrations: u32) -> u32 {
    let tenth = total.div_ceil(10).max(1);
    let nth_migration = (0..total)
        .filter(|&i| is_migration(i, total, migrations))
        .nth(WARMUP_MIGRATIONS.min(migrations).saturating_sub(1) as usize)
        .map_or(0, |i| i + 1);
    tenth.max(nth_migration)
}

pub fn run_soak(args: &SoakArgs, epoch: Instant) -> Result<u8> {
    ensure!(args.every >= 1, "--every must be at least 1");
    let total = args
        .boots
        .checked_add(args.migrations)
        .context("--boots plus --migrations is too large")?;
    ensure!(
        total >= 2,
        "--boots plus --migrations must be at least 2 (a warm-up and a run after it)"
    );
    run::check_guest_vcpus(VCPUS, &args.kvm_device)?;
    let warmup = warmup(total, args.migrations).min(total - 1);
    let memory_mib = guest::choose_memory_mib(None, &[], VCPUS)?;
    let migrate_args = MigrateBenchArgs {
        vcpus: VCPUS,
        memory: memory_mib,
        after_ms: MIGRATE_AFTER_MS,
        max_downtime_ms: None,
        runs: 1,
        dirty_log: vec![DirtyLogMode::Bitmap, DirtyLogMode::Ring],
        npb: None,
        qemu: false,
        json: false,
        kvm_device: args.kvm_device.clone(),
    };
    let start = Instant::now();
    let first = Resources::trimmed()?;
    let mut baseline = None;
    let mut last = first;
    let (mut boots, mut migrations) = (0u32, 0u32);
    for i in 0..total {
        if is_migration(i, total, args.migrations) {
            let dirty = migrate_args.dirty_log[migrations as usize % 2];
            migrate::one_run(&migrate_args, dirty, epoch)
                .with_context(|| format!("migration {}", migrations + 1))?;
            migrations += 1;
        } else {
            boot_once(memory_mib, &args.kvm_device, epoch)
                .with_context(|| format!("boot {}", boots + 1))?;
            boots += 1;
        }
        let done = i + 1;
        if done == warmup {
            baseline = Some(Resources::trimmed()?);
        }
        if done % args.every == 0 || done == total {
            last = Resources::trimmed()?;
            let heap = Heap::now();
            let seconds = start.elapsed().as_secs_f64();
            let mib = |b: u64| b as f64 / f64::from(1 << 20);
            eprintln!(
                "kumo: soak {done}/{total} ({boots} boots, {migrations} migrations, {seconds:.1} s): \
                 RSS {:.2} MiB, {} fds, {} threads; malloc: {:.2} MiB in use, {:.2} MiB free, \
                 {} arenas",
                mib(last.rss_bytes),
                last.fds,
                last.threads,
                mib(heap.heap_in_use_bytes),
                mib(heap.heap_free_bytes),
                heap.arenas
            );
            if args.json {
                kumo_vmm::output::json_line(&SampleLine {
                    iteration: done,
                    boots,
                    migrations,
                    seconds,
                    resources: last,
                    heap,
                });
            }
        }
    }
    let baseline = baseline.context("the warm-up never ended")?;
    let grew = growth(baseline, last);
    let seconds = start.elapsed().as_secs_f64();
    if args.json {
        kumo_vmm::output::json_line(&VerdictLine {
            iterations: total,
            warmup_iterations: warmup,
            seconds,
            first,
            baseline,
            last,
            grew: grew.clone(),
        });
    } else {
        kumo_vmm::outln!(
            "soak: {boots} boots, {migrations} migrations in {seconds:.1} s; after {warmup} \
             warm-up iterations"
        );
        kumo_vmm::outln!(
            "{:<10} {:>14} {:>14} {:>14}",
            "",
            "first",
            "baseline",
            "last"
        );
        for (name, f, b, l) in [
            (
                "RSS bytes",
                first.rss_bytes,
                baseline.rss_bytes,
                last.rss_bytes,
            ),
            ("fds", first.fds, baseline.fds, last.fds),
            ("threads", first.threads, baseline.threads, last.threads),
        ] {
            kumo_vmm::outln!("{name:<10} {f:>14} {b:>14} {l:>14}");
        }
    }
    if let Some(g) = grew.first() {
        let others = if grew.len() > 1 {
            format!(" (and {} more)", grew.len() - 1)
        } else {
            String::new()
        };
        eprintln!(
            "kumo: soak failed: {} grew from {} to {} after the warm-up, more than the {} \
             allowed{others}",
            g.resource, g.baseline, g.last, g.allowed
        );
        return Ok(EXIT_GREW);
    }
    Ok(kumo_vmm::report::EXIT_OK)
}

/// One VM of the embedded guest with no workload: built, booted, run to its end.
fn boot_once(memory_mib: u64, kvm_device: &std::path::Path, epoch: Instant) -> Result<()> {
    let config = run::embedded_config(VCPUS, memory_mib, "npb=".into(), kvm_device);
    let (guest_run, ()) = run::boot_embedded(config, epoch, |_| ())?;
    if guest_run.outcome.exit != GuestExit::DebugExit(0) {
        bail!("the guest ended with {:?}", guest_run.outcome.exit);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_spread_evenly_and_counted_exactly() {
        for (total, migrations) in [(1100, 100), (110, 10), (3, 3), (10, 1), (7, 0), (5, 4)] {
            let at: Vec<u32> = (0..total)
                .filter(|&i| is_migration(i, total, migrations))
                .collect();
            assert_eq!(at.len() as u32, migrations, "{total} {migrations}");
            if migrations > 1 {
                let gaps: Vec<u32> = at.windows(2).map(|w| w[1] - w[0]).collect();
                let (lo, hi) = (gaps.iter().min().unwrap(), gaps.iter().max().unwrap());
                assert!(hi - lo <= 1, "{total} {migrations}: {gaps:?}");
            }
        }
        // The warm-up of 1,100 iterations (110) holds migrations.
        assert_eq!(warmup(1100, 100), 110);
        assert!((0..warmup(1100, 100)).any(|i| is_migration(i, 1100, 100)));
        // The CI form's (110 iterations, 10 migrations) holds three: 0, 11 and 22.
        assert_eq!(warmup(110, 10), 23);
        assert_eq!(warmup(4, 0), 1);
    }

    #[test]
    fn growth_allows_a_mebibyte_of_rss_and_no_fd_or_thread() {
        let base = Resources {
            rss_bytes: 10 << 20,
            fds: 5,
            threads: 2,
        };
        assert!(growth(base, base).is_empty());
        let noisy = Resources {
            rss_bytes: base.rss_bytes + RSS_SLACK_BYTES,
            ..base
        };
        assert!(growth(base, noisy).is_empty());
        let leaky = Resources {
            rss_bytes: base.rss_bytes + RSS_SLACK_BYTES + 1,
            fds: 6,
            threads: 2,
        };
        let names: Vec<&str> = growth(base, leaky).iter().map(|g| g.resource).collect();
        assert_eq!(names, ["rss_bytes", "fds"]);
    }

    #[test]
    fn the_process_resources_are_read() {
        let r = Resources::now().unwrap();
        assert!(r.rss_bytes > 0 && r.fds >= 3 && r.threads >= 1, "{r:?}");
    }
}
