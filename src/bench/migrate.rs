//! `kumo bench migrate`: live migration on loopback inside one kumo, run after run,
//! with the host's view (total time, downtime and its parts, rounds, bytes) beside
//! the guest's (`probe=gap`: the longest time the guest saw pass between two TSC
//! reads, i.e. the downtime as it felt it).
//!
//! Source and destination are the same code paths as `kumo ctl ... migrate` and
//! `kumo --incoming` (`kumo_vmm::migrate::send_vm` / `receive_vm`), over a TCP
//! connection to 127.0.0.1 with a fresh random token per run.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use hv::migration::dirty::DirtyLogMode;
use serde::Serialize;

use super::migrate_qemu::{self, QemuMigration, wait_for_boot};
use kumo_vmm::guest;
use kumo_vmm::migrate::{self, AppState, GUEST_NAME};
use kumo_vmm::run;
use kumo_vmm::stats::Summary;

/// How many of its longest gaps the guest's gap probe reports.
const LONG_GAPS: usize = 8;

/// One run's figures.
pub struct Sample {
    pub dirty: DirtyLogMode,
    pub report: hv::migration::live::Report,
    /// The guest's longest TSC gap, in ms (NaN when the guest ran NPB instead).
    pub guest_gap_ms: f64,
    /// The guest's gap that holds vCPU 0's TSC saved at the pause: it began this
    /// long before the save and ended this long after it (the destination's TSC
    /// runs on from the saved value from when it is restored). NaN if none of the
    /// guest's longest gaps holds it.
    gap_began_before_save_ms: f64,
    gap_ended_after_save_ms: f64,
}

fn token() -> Result<Vec<u8>> {
    let mut t = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut t)?;
    Ok(t.to_vec())
}

/// The guest's command line: `--npb`'s benchmarks, or the TSC gap probe.
fn guest_cmdline(args: &MigrateBenchArgs) -> Result<(String, Option<Vec<npb::Spec>>)> {
    let probe_ms = args.after_ms * 2 + 2000;
    let specs = args.npb.as_deref().map(guest::parse_specs).transpose()?;
    let cmdline = match &specs {
        Some(specs) => guest::npb_cmdline(
            specs,
            args.vcpus,
            guest::BarrierWait::Auto,
            guest::VcpuBalloon::Off,
        ),
        None => format!("npb= probe=gap:{probe_ms}"),
    };
    Ok((cmdline, specs))
}

/// One migration on loopback of a VM `args` describes, tracked by `dirty`.
pub fn one_run(args: &MigrateBenchArgs, dirty: DirtyLogMode, epoch: Instant) -> Result<Sample> {
    let memory_mib = args.memory;
    let (cmdline, specs) = guest_cmdline(args)?;
    let config = run::embedded_config(args.vcpus, memory_mib, cmdline, &args.kvm_device);
    let vm = hv::builder::build_for_boot_with_dirty_log(config, dirty)?;
    let hub = vm.migration_hub();
    let console = Arc::new(Mutex::new(Vec::new()));
    let app = AppState {
        guest: GUEST_NAME.into(),
        npb: String::new(),
        vcpus: args.vcpus,
        console: Vec::new(),
        sched: None,
        irq: None,
        rank: None,
        host_cpus_word: None,
    };
    let app_json = || {
        let console = console.lock().unwrap_or_else(|e| e.into_inner()).clone();
        serde_json::to_string(&AppState {
            console,
            ..app.clone()
        })
        .unwrap_or_default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").context("listening on loopback")?;
    let address = listener.local_addr()?.to_string();
    let token = token()?;
    let dst_token = token.clone();
    let kvm_device = args.kvm_device.clone();
    let destination = std::thread::spawn(move || -> Result<run::GuestRun> {
        let (vm, meta) = migrate::receive_vm(&listener, Some(&dst_token), &kvm_device)?;
        let app = AppState::parse(&meta.app)?;
        run::run_collecting_recorded(vm, epoch, None, &app.console)
    });
    let record = console.clone();
    let source =
        std::thread::spawn(move || run::run_collecting_recorded(vm, epoch, Some(record), &[]));
    // From the guest's start, not the VM's: QEMU's side is timed the same way.
    wait_for_boot(|| Ok(console.lock().unwrap_or_else(|e| e.into_inner()).clone()))?;
    std::thread::sleep(Duration::from_millis(args.after_ms));
    let sent = migrate::send_vm(
        &hub,
        app_json,
        &address,
        Some(&token),
        migrate::pacing(args.max_downtime_ms, false),
        None,
    );
    let source_run = source
        .join()
        .map_err(|_| anyhow::anyhow!("the source's thread panicked"))??;
    let report = match sent {
        Ok(report) => report,
        Err(e) => {
            // Unblock a destination still waiting for a connection.
            let _ = std::net::TcpStream::connect(&address);
            let _ = destination.join();
            return Err(e);
        }
    };
    if source_run.outcome.exit != hv::GuestExit::HandedOff {
        bail!("the source did not hand the VM off");
    }
    let dst_run = destination
        .join()
        .map_err(|_| anyhow::anyhow!("the destination's thread panicked"))??;
    if let Some(specs) = &specs {
        let verdict = dst_run.judge(specs, args.vcpus);
        if verdict.exit_code() != kumo_vmm::report::EXIT_OK {
            bail!("the migrated NPB run did not verify on the destination");
        }
        return Ok(Sample {
            dirty,
            report,
            guest_gap_ms: f64::NAN,
            gap_began_before_save_ms: f64::NAN,
            gap_ended_after_save_ms: f64::NAN,
        });
    }
    let fields = dst_run.measurement("gapprobe")?;
    let gap_us: f64 = fields
        .get("max_gap_us")
        .and_then(|v| v.parse().ok())
        .context("the guest's gapprobe line has no max_gap_us")?;
    // The guest's long gap that holds the pause: where the save falls in it.
    let spans = fields.get("long_gaps").map(String::as_str).unwrap_or("");
    let at_pause = report.saved_tsc.and_then(|saved| {
        spans
            .split(',')
            .filter_map(|g| g.split_once(':'))
            .filter_map(|(s, l)| Some((s.parse::<u64>().ok()?, l.parse::<u64>().ok()?)))
            .find(|&(start, len)| start <= saved && saved <= start.saturating_add(len))
            .map(|(start, len)| (saved - start, start + len - saved))
    });
    let khz = f64::from(report.tsc_khz.max(1));
    let (before, after) = at_pause.map_or((f64::NAN, f64::NAN), |(b, a)| {
        (b as f64 / khz, a as f64 / khz)
    });
    Ok(Sample {
        dirty,
        report,
        guest_gap_ms: gap_us / 1000.0,
        gap_began_before_save_ms: before,
        gap_ended_after_save_ms: after,
    })
}

pub fn run_bench(args: &MigrateBenchArgs, epoch: Instant) -> Result<u8> {
    run::check_guest_vcpus(args.vcpus, &args.kvm_device)?;
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let needed = guest::choose_memory_mib(None, &[], args.vcpus)?;
    if args.memory < needed {
        bail!("--memory {} is below the guest's {needed} MiB", args.memory);
    }
    if args.dirty_log.is_empty() {
        bail!("--dirty-log names no tracker");
    }
    let mut samples = Vec::new();
    let mut qemu = Vec::new();
    for i in 0..args.runs {
        // Trackers taken in turn: each sees the same host load over the run.
        let dirty = args.dirty_log[i as usize % args.dirty_log.len()];
        let s = one_run(args, dirty, epoch).with_context(|| format!("run {}", i + 1))?;
        if args.json {
            let gap = |ms: f64| (!ms.is_nan()).then_some(ms);
            kumo_vmm::output::json_line(&RunLine {
                run: i + 1,
                dirty_log: dirty.name(),
                memory_mib: args.memory,
                vcpus: args.vcpus,
                npb: args.npb.clone(),
                total_ms: s.report.total_ms,
                downtime_ms: s.report.downtime_ms,
                pause_ms: s.report.pause_ms,
                harvest_ms: s.report.harvest_ms,
                final_pages_ms: s.report.final_pages_ms,
                state_ms: s.report.state_ms,
                sent_ms: s.report.sent_ms,
                guest_gap_ms: gap(s.guest_gap_ms),
                gap_began_before_save_ms: gap(s.gap_began_before_save_ms),
                gap_ended_after_save_ms: gap(s.gap_ended_after_save_ms),
                rounds: s.report.rounds.clone(),
                final_pages: s.report.final_pages,
                total_bytes: s.report.total_bytes,
            });
        }
        samples.push(s);
        if args.qemu {
            let q = qemu_run(args).with_context(|| format!("QEMU's run {}", i + 1))?;
            if args.json {
                kumo_vmm::output::json_line(&QemuRunLine {
                    run: i + 1,
                    vmm: "qemu",
                    memory_mib: args.memory,
                    vcpus: args.vcpus,
                    total_ms: q.total_ms,
                    downtime_ms: q.downtime_ms,
                    total_bytes: q.transferred_bytes,
                });
            }
            qemu.push(q);
        }
    }
    if !qemu.is_empty() {
        print_qemu_summary(args, &qemu);
    }
    let mut modes = args.dirty_log.clone();
    modes.dedup();
    modes.sort_by_key(|m| m.name());
    modes.dedup();
    for mode in modes {
        let of_mode: Vec<&Sample> = samples.iter().filter(|s| s.dirty == mode).collect();
        if !of_mode.is_empty() {
            print_summary(args, mode, &of_mode);
        }
    }
    Ok(kumo_vmm::report::EXIT_OK)
}

/// A kumo run of `kumo bench migrate --json` (ms; the guest's gaps `null` when it did
/// not measure them).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunLine {
    pub run: u32,
    /// `"bitmap"` or `"ring"`.
    pub dirty_log: &'static str,
    pub memory_mib: u64,
    pub vcpus: u32,
    pub npb: Option<String>,
    pub total_ms: f64,
    pub downtime_ms: f64,
    pub pause_ms: f64,
    pub harvest_ms: f64,
    pub final_pages_ms: f64,
    pub state_ms: f64,
    pub sent_ms: f64,
    pub guest_gap_ms: Option<f64>,
    pub gap_began_before_save_ms: Option<f64>,
    pub gap_ended_after_save_ms: Option<f64>,
    pub rounds: Vec<hv::migration::live::Round>,
    pub final_pages: u64,
    pub total_bytes: u64,
}

/// QEMU's run (`--qemu`), after kumo's of the same number.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QemuRunLine {
    pub run: u32,
    pub vmm: &'static str,
    pub memory_mib: u64,
    pub vcpus: u32,
    pub total_ms: f64,
    pub downtime_ms: f64,
    pub total_bytes: u64,
}

/// A figure's median and range over QEMU's runs (`null` each without one).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct QemuRange {
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

/// QEMU's figures over its runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QemuFigures {
    pub total_ms: QemuRange,
    pub downtime_ms: QemuRange,
    pub sent_mib: QemuRange,
}

/// QEMU's summary line (`--qemu`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QemuSummaryLine {
    pub vmm: &'static str,
    pub runs: usize,
    pub summary: QemuFigures,
}

/// A figure's median and range in ms over a tracker's runs (`null` each when no run
/// measured it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MsRange {
    pub median_ms: Option<f64>,
    pub min_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// A dirty-page tracker's summary line: each figure of its runs, by name (`total`,
/// `downtime_host`, ..., `gap_after_save`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrackerSummaryLine {
    pub dirty_log: &'static str,
    pub runs: usize,
    /// Runs whose pause fell in none of the guest's longest gaps.
    pub pause_in_no_long_gap: usize,
    pub summary: BTreeMap<&'static str, MsRange>,
}

impl QemuRange {
    fn of(s: Option<Summary>) -> Self {
        Self {
            median: s.map(|s| s.median),
            min: s.map(|s| s.min),
            max: s.map(|s| s.max),
        }
    }
}

impl MsRange {
    fn of(s: Option<Summary>) -> Self {
        Self {
            median_ms: s.map(|s| s.median),
            min_ms: s.map(|s| s.min),
            max_ms: s.map(|s| s.max),
        }
    }
}

/// QEMU migrating the same guest, as `kumo bench migrate --qemu` sets it beside.
fn qemu_run(args: &MigrateBenchArgs) -> Result<QemuMigration> {
    let (cmdline, _) = guest_cmdline(args)?;
    migrate_qemu::migrate_once(
        &args.kvm_device,
        args.vcpus,
        args.memory,
        &cmdline,
        Duration::from_millis(args.after_ms),
        Duration::from_millis(args.max_downtime_ms.unwrap_or(300)),
    )
}

fn print_qemu_summary(args: &MigrateBenchArgs, runs: &[QemuMigration]) {
    let stats =
        |f: &dyn Fn(&QemuMigration) -> f64| Summary::of(&runs.iter().map(f).collect::<Vec<_>>());
    let total = stats(&|q| q.total_ms);
    let down = stats(&|q| q.downtime_ms);
    let mib = stats(&|q| q.transferred_bytes as f64 / (1024.0 * 1024.0));
    if args.json {
        kumo_vmm::output::json_line(&QemuSummaryLine {
            vmm: "qemu",
            runs: runs.len(),
            summary: QemuFigures {
                total_ms: QemuRange::of(total),
                downtime_ms: QemuRange::of(down),
                sent_mib: QemuRange::of(mib),
            },
        });
    } else {
        kumo_vmm::outln!(
            "QEMU 7.2 (query-migrate), same guest, {} vCPUs, {} MiB, {} runs",
            args.vcpus,
            args.memory,
            runs.len()
        );
        kumo_vmm::outln!("{:<40} {:>10} {:>10} {:>10}", "", "median", "min", "max");
        for (name, summary) in [
            ("total-time (ms)", total),
            ("downtime (ms, to the last byte sent)", down),
            ("RAM sent (MiB)", mib),
        ] {
            // (NaN, as before, if no QEMU run measured it.)
            let (m, lo, hi) =
                summary.map_or((f64::NAN, f64::NAN, f64::NAN), |s| (s.median, s.min, s.max));
            kumo_vmm::outln!("{name:<40} {m:>10.2} {lo:>10.2} {hi:>10.2}");
        }
    }
}

fn print_summary(args: &MigrateBenchArgs, mode: DirtyLogMode, samples: &[&Sample]) {
    // Summary::of leaves out what a run did not measure (NaN).
    let pick = |f: &dyn Fn(&Sample) -> f64| -> Option<Summary> {
        Summary::of(&samples.iter().map(|s| f(s)).collect::<Vec<_>>())
    };
    let rows: [(&str, &str, Option<Summary>); 13] = [
        ("total", "total", pick(&|s| s.report.total_ms)),
        (
            "downtime (host)",
            "downtime_host",
            pick(&|s| s.report.downtime_ms),
        ),
        ("  pausing the vCPUs", "pause", pick(&|s| s.report.pause_ms)),
        (
            "  last dirty harvest",
            "harvest",
            pick(&|s| s.report.harvest_ms),
        ),
        (
            "  last pages sent",
            "final_pages",
            pick(&|s| s.report.final_pages_ms),
        ),
        (
            "  state taken and sent",
            "state",
            pick(&|s| s.report.state_ms),
        ),
        (
            "  until the last byte sent",
            "sent",
            pick(&|s| s.report.sent_ms),
        ),
        (
            "live rounds' harvest+copy",
            "rounds",
            pick(&|s| s.report.rounds.iter().map(|r| r.ms).sum()),
        ),
        (
            "  of it waiting for the destination's acks",
            "ack_wait",
            pick(&|s| s.report.rounds.iter().map(|r| r.ack_wait_ms).sum()),
        ),
        (
            "downtime (guest: its longest gap)",
            "downtime_guest",
            pick(&|s| s.guest_gap_ms),
        ),
        (
            "guest's gap holding the pause",
            "gap_at_pause",
            pick(&|s| s.gap_began_before_save_ms + s.gap_ended_after_save_ms),
        ),
        (
            "  of it before the TSC save",
            "gap_before_save",
            pick(&|s| s.gap_began_before_save_ms),
        ),
        (
            "  of it after the TSC save",
            "gap_after_save",
            pick(&|s| s.gap_ended_after_save_ms),
        ),
    ];
    if args.json {
        let summary = rows
            .iter()
            .map(|&(_, key, summary)| (key, MsRange::of(summary)))
            .collect();
        let unseen = samples
            .iter()
            .filter(|s| !s.guest_gap_ms.is_nan() && s.gap_began_before_save_ms.is_nan())
            .count();
        kumo_vmm::output::json_line(&TrackerSummaryLine {
            dirty_log: mode.name(),
            runs: samples.len(),
            pause_in_no_long_gap: unseen,
            summary,
        });
    } else {
        kumo_vmm::outln!(
            "migration on loopback, {} dirty log, {} vCPUs, {} MiB, {}, after {} ms, {} runs",
            mode.name(),
            args.vcpus,
            args.memory,
            args.npb.as_deref().unwrap_or("TSC gap probe"),
            args.after_ms,
            samples.len()
        );
        kumo_vmm::outln!("{:<40} {:>10} {:>10} {:>10}", "", "median ms", "min", "max");
        // Rows no run measured (the guest's gaps when it runs NPB) are left out.
        for (name, _, summary) in rows {
            let Some(Summary {
                median: m,
                min: lo,
                max: hi,
                ..
            }) = summary
            else {
                continue;
            };
            kumo_vmm::outln!("{name:<40} {m:>10.2} {lo:>10.2} {hi:>10.2}");
        }
        let unseen = samples
            .iter()
            .filter(|s| !s.guest_gap_ms.is_nan() && s.gap_began_before_save_ms.is_nan())
            .count();
        if unseen > 0 {
            kumo_vmm::outln!(
                "(in {unseen} of {} runs the pause fell in none of the guest's {} longest gaps: \
                 shorter than all of them)",
                samples.len(),
                LONG_GAPS
            );
        }
    }
}

#[derive(Args, Debug)]
pub struct MigrateBenchArgs {
    /// vCPUs of the guest.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub memory: u64,

    /// Migrate this long after the VM starts, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub after_ms: u64,

    /// Downtime target of the copy rounds [default: 300, QEMU's].
    #[arg(long, value_name = "MS")]
    pub max_downtime_ms: Option<u64>,

    /// Migrations to make (one VM each).
    #[arg(long, value_name = "R", default_value_t = 5)]
    pub runs: u32,

    /// Dirty-page trackers to measure, comma-separated, taken in turn run after run
    /// (interleaved): bitmap (KVM_GET_DIRTY_LOG), ring (KVM's dirty ring).
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "bitmap,ring", value_parser = kumo_vmm::args::dirty_log)]
    pub dirty_log: Vec<hv::migration::dirty::DirtyLogMode>,

    /// Run these NPB benchmarks in the guest instead of the TSC gap probe (the
    /// destination must verify them; there is no guest-seen downtime then).
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// After each kumo run, QEMU migrates the same guest (PVH on microvm, QMP
    /// `migrate` to `-incoming tcp:` on loopback): its total time and downtime beside.
    #[arg(long)]
    pub qemu: bool,

    /// Print one JSON object per run and a summary.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}
