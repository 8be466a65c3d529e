//! `kumo bench wake`: how long a halted vCPU waits to run once its interrupt arrives,
//! beside a busy vCPU on the same host CPU, under the credit scheduler, per slice.
//!
//! Each setting is a node on one host CPU with two single-vCPU domains: `sleeper`
//! sleeps on its TSC-deadline timer every period and measures how late it runs
//! (`probe=wake`), `hog` spins (`probe=busy`). A waking UNDER vCPU is BOOSTed and
//! should preempt the hog at once; the tail shows when it is not.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use clap::Args;
use kumo_vmm::ctl::SchedUpdate;
use kumo_vmm::node;
use kumo_vmm::spec::node::{self as config, Domain, Node, SchedulerFile};
use kumo_vmm::spec::sched as sched_params;

pub fn run_wake(args: &WakeArgs, epoch: Instant) -> Result<u8> {
    kumo_vmm::guest::check_host_cpu("--pcpu", args.pcpu)?;
    if !(10..=1_000_000).contains(&args.period_us) {
        bail!("--period-us must be between 10 and 1000000");
    }
    if args.millis == 0 || args.millis > 600_000 {
        bail!("--millis must be between 1 and 600000");
    }
    let mut rows = Vec::new();
    for tslice in args.tslice_ms.split(',') {
        let tslice_ms: f64 = tslice
            .trim()
            .parse()
            .with_context(|| format!("--tslice-ms: '{tslice}' is not a number"))?;
        let params = sched_params::from_update(SchedUpdate {
            tslice_ms: Some(tslice_ms),
            ..Default::default()
        })?;
        let node = Node {
            pcpus: vec![args.pcpu],
            scheduler: SchedulerFile::default(),
            params,
            auto_slice: false,
            speed_percent: 100,
            driver: hv::credit::DriverPlace::Auto,
            domains: vec![
                domain(
                    "sleeper",
                    format!("wake:{}:{}", args.millis, args.period_us),
                ),
                domain("hog", format!("busy:{}", args.millis)),
            ],
            dom0_weight: config::DEFAULT_WEIGHT,
            dom0_cost: Default::default(),
            network: None,
        };
        let reports = node::run(&node, &args.kvm_device, None, epoch)?.reports;
        let fields = reports[0]
            .measurements
            .iter()
            .find(|(kind, _)| kind == "wakeprobe")
            .map(|(_, f)| f)
            .context("the sleeper domain reported no wake-up measurement")?;
        let num = |key: &str| {
            kumo_vmm::protocol::f64_field(fields, key)
                .with_context(|| format!("the wake probe has no numeric {key}"))
        };
        let view = sched_params::view(params);
        rows.push(WakeRow {
            tslice_ms: view.tslice_ms,
            tick_ms: view.tick_ms,
            ratelimit_us: view.ratelimit_us,
            period_us: args.period_us,
            wakes: kumo_vmm::protocol::u64_field(fields, "wakes")
                .context("the wake probe has no count of wakes")?,
            median_us: num("median_us")?,
            p90_us: num("p90_us")?,
            p99_us: num("p99_us")?,
            max_us: num("max_us")?,
            hog_cpu_s: reports[1].cpu.as_secs_f64(),
        });
    }
    print(&rows, args.json);
    Ok(0)
}

fn domain(name: &str, probe: String) -> Domain {
    Domain {
        name: name.into(),
        vcpus: 1,
        memory_mib: 64,
        weight: config::DEFAULT_WEIGHT,
        cap: 0,
        specs: Vec::new(),
        idle_ms: None,
        probe: Some(probe),
        irq: None,
        irq_path: None,
        spin_us: kumo_vmm::guest::SHARED_SPIN_US,
        barrier_wait: kumo_vmm::guest::BarrierWait::Hlt,
        vcpu_balloon: false,
        mpi: None,
        ranks_per_vcpu: 1,
        guest_hz: None,
        passthrough: Vec::new(),
        passthrough_irq_path: hv::irq::IrqPath::Generic,
        incoming: None,
    }
}

/// A row of `kumo bench wake --json`: one slice's setting and the sleeper's wake-up
/// latency (µs, guest TSC).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WakeRow {
    pub tslice_ms: f64,
    pub tick_ms: f64,
    pub ratelimit_us: u64,
    pub period_us: u64,
    pub wakes: u64,
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// CPU time the busy domain got.
    pub hog_cpu_s: f64,
}

fn print(rows: &[WakeRow], json: bool) {
    if json {
        for row in rows {
            kumo_vmm::output::json_line(row);
        }
        return;
    }
    kumo_vmm::outln!(
        "{:>9} {:>8} {:>10} {:>7} {:>10} {:>10} {:>10} {:>10}",
        "slice ms",
        "tick ms",
        "ratelim us",
        "wakes",
        "median us",
        "p90 us",
        "p99 us",
        "max us"
    );
    for r in rows {
        kumo_vmm::outln!(
            "{:>9} {:>8} {:>10} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            r.tslice_ms,
            r.tick_ms,
            r.ratelimit_us,
            r.wakes,
            r.median_us,
            r.p90_us,
            r.p99_us,
            r.max_us
        );
    }
    kumo_vmm::outln!(
        "wake-up latency: TSC deadline -> the sleeping vCPU's next ring-3 instruction, beside a busy vCPU on one host CPU"
    );
}

#[derive(Args, Debug)]
pub struct WakeArgs {
    /// Credit slices to compare, in milliseconds, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "30,1")]
    pub tslice_ms: String,

    /// How long each setting measures, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 3000)]
    pub millis: u64,

    /// The sleeper's timer period, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 1000)]
    pub period_us: u64,

    /// The host CPU both domains share.
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub pcpu: usize,

    /// Print one JSON object per setting.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}
