//! `kumo bench record`: a fixed, short suite of kumo's primitives, each measured by the
//! same code as its own `kumo bench ...` (in-process; only the whole-process start
//! spawns processes), written as a [`Record`].
//!
//! The suite runs round after round, every primitive once per round, so each
//! primitive's samples are spread over the whole run and the host's speed states (two,
//! ~1.7x apart) fall on all of them alike. A primitive with a reference (QEMU beside
//! kumo's process start, the generic interrupt path beside the fast one, native threads
//! beside the guest) runs beside it in the same round, the order of the two swapped
//! every round, so neither side always runs first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use hv::irq::IrqPath;
use hv::migration::dirty::DirtyLogMode;
use npb::Spec;
use serde_json::Value;

use crate::bench::handover::Mechanism;
use crate::bench::migrate::MigrateBenchArgs;
use crate::bench::record::{self, Better, Figure, Host, Record};
use crate::bench::switch::SwitchArgs;
use crate::bench::{exit, migrate, overhead, process, switch};
use crate::mpi::NetBenchArgs;
use kumo_vmm::args::NicKind;
use kumo_vmm::args::Wait;
use kumo_vmm::guest;
use kumo_vmm::irq::IrqBenchArgs;
use kumo_vmm::run;

/// How much each primitive does per round.
struct Plan {
    rounds: u32,
    quick: bool,
    /// EP.S boots (each one sample of boot_ms).
    boots: u32,
    /// kumo / QEMU whole-process pairs.
    process_pairs: u32,
    /// Exits per exit-loop run (and twice as many in the second run).
    exits: u32,
    /// Doorbell rounds per interrupt path.
    irq_rounds: u32,
    /// How long the switch probe measures, per mechanism.
    switch_ms: u64,
    /// When the migration starts after the guest's.
    migrate_after_ms: u64,
    /// The NPB benchmarks timed in the guest and natively.
    npb: Vec<Spec>,
    /// Guest/native pairs of each (CG.W and MG.W take ~0.06 s here: one is noisy).
    npb_pairs: u32,
}

impl Plan {
    fn new(args: &RecordArgs) -> Result<Plan> {
        let quick = args.quick;
        Ok(Plan {
            rounds: args.rounds.unwrap_or(if quick { 1 } else { 20 }),
            quick,
            boots: if quick { 1 } else { 3 },
            process_pairs: if quick { 1 } else { 3 },
            exits: if quick { 2_048 } else { 16_384 },
            irq_rounds: if quick { 200 } else { 2_000 },
            switch_ms: if quick { 200 } else { 1_000 },
            migrate_after_ms: if quick { 100 } else { 200 },
            npb: guest::parse_specs(if quick { "cg.S,mg.S" } else { "cg.W,mg.W" })?,
            npb_pairs: if quick { 1 } else { 3 },
        })
    }
}

/// Guest memory of the migrated VM, MiB.
const MIGRATE_MIB: u64 = 256;
/// vCPUs of every VM of the suite but the switch probe's and the exit loop's.
const VCPUS: u32 = 2;
/// Guest memory of the whole-process start, as `kumo bench process` gives it.
const PROCESS_MIB: u64 = 256;
/// Messages between VMs: size, wait of the ranks, figure. Fewer round trips than the
/// guest's default (32 MiB / max(size, 16 KiB) + 10) let the ranks' first, descheduled
/// rounds set the median: the default is kept even for --quick.
const MESSAGES: [(u64, Wait, &str); 3] = [
    (8, Wait::Spin, "msg_8b_us"),
    (1 << 20, Wait::Spin, "msg_1mib_us"),
    (8, Wait::Block, "msg_8b_block_us"),
];

/// One measured quantity's samples, in the order they were taken.
struct Series {
    unit: &'static str,
    better: Better,
    samples: Vec<f64>,
}

/// The figures of a record and the references they are set beside, in the order the
/// record lists them; the series of a reference alone (native, QEMU) are no figures:
/// a change there is the host's or QEMU's, not kumo's.
#[derive(Default)]
struct Collector {
    series: BTreeMap<String, Series>,
    figures: Vec<(String, Option<String>)>,
}

impl Collector {
    fn push(&mut self, name: &str, unit: &'static str, better: Better, value: f64) {
        let series = self.series.entry(name.into()).or_insert_with(|| Series {
            unit,
            better,
            samples: Vec::new(),
        });
        series.samples.push(value);
    }

    /// Declares `name` a figure, beside `reference` if it has one (once, at first use).
    fn figure(&mut self, name: &str, reference: Option<&str>) {
        if !self.figures.iter().any(|(n, _)| n == name) {
            self.figures
                .push((name.into(), reference.map(str::to_string)));
        }
    }

    fn into_figures(self) -> Vec<Figure> {
        let samples = |name: &str| self.series.get(name);
        self.figures
            .iter()
            .filter_map(|(name, reference)| {
                let s = samples(name)?;
                let reference = reference
                    .as_deref()
                    .and_then(|r| samples(r).map(|rs| (r, rs.samples.clone())));
                Some(Figure::new(
                    name,
                    s.unit,
                    s.better,
                    s.samples.clone(),
                    reference,
                ))
            })
            .collect()
    }
}

/// `kumo bench record`.
pub fn run_record(args: &RecordArgs) -> Result<u8> {
    let plan = Plan::new(args)?;
    if plan.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    run::check_guest_vcpus(VCPUS, &args.kvm_device)?;
    // The switch probe's two vCPUs share host CPU 1; its controller runs on CPU 0.
    guest::check_host_cpu("the switch probe's host CPU", 1)?;
    let load_before = record::load_average();
    let date = record::now_utc();
    let mut host = Host::this(load_before);
    let kernel = process::write_trivial_kernel()?;
    let mut collector = Collector::default();
    let started = Instant::now();
    let mut result = Ok(());
    for round in 0..plan.rounds {
        result = one_round(
            &plan,
            round,
            &kernel,
            host.qemu.is_some(),
            args,
            &mut collector,
        )
        .with_context(|| format!("round {} of {}", round + 1, plan.rounds));
        if result.is_err() {
            break;
        }
    }
    let _ = std::fs::remove_file(&kernel);
    result?;
    host.load_after = record::load_average();
    let record = Record {
        schema: record::SCHEMA,
        commit: record::commit(),
        date,
        host,
        quick: plan.quick,
        rounds: plan.rounds,
        figures: collector.into_figures(),
    };
    record.write(&args.out)?;
    eprintln!(
        "kumo: record: {} figures, {} rounds in {:.0} s, written to {}",
        record.figures.len(),
        plan.rounds,
        started.elapsed().as_secs_f64(),
        args.out.display()
    );
    Ok(kumo_vmm::report::EXIT_OK)
}

/// Runs `a` and `b` back to back, `b` first when `flip`; returns their values as (a, b).
fn pair<A, B>(
    flip: bool,
    a: impl FnOnce() -> Result<A>,
    b: impl FnOnce() -> Result<B>,
) -> Result<(A, B)> {
    if flip {
        let vb = b()?;
        Ok((a()?, vb))
    } else {
        let va = a()?;
        Ok((va, b()?))
    }
}

fn progress(round: u32, plan: &Plan, what: &str, text: String) {
    eprintln!("kumo: record {}/{}: {what}: {text}", round + 1, plan.rounds);
}

fn one_round(
    plan: &Plan,
    round: u32,
    kernel: &Path,
    qemu: bool,
    args: &RecordArgs,
    c: &mut Collector,
) -> Result<()> {
    let flip = round % 2 == 1;
    let kvm = &args.kvm_device;
    use Better::Lower;

    c.figure("boot_ms", None);
    for _ in 0..plan.boots {
        let ms = boot_ms(kvm).context("boot")?;
        c.push("boot_ms", "ms", Lower, ms);
        progress(round, plan, "boot", format!("{ms:.2} ms"));
    }

    c.figure("process_kumo_ms", qemu.then_some("process_qemu_ms"));
    for _ in 0..plan.process_pairs {
        let (kumo, qemu_ms) = pair(
            flip,
            || process::kumo_ms(kernel, PROCESS_MIB),
            || {
                qemu.then(|| process::qemu_ms(kernel, PROCESS_MIB))
                    .transpose()
            },
        )
        .context("whole-process start")?;
        c.push("process_kumo_ms", "ms", Lower, kumo);
        let mut text = format!("kumo {kumo:.1} ms");
        if let Some(q) = qemu_ms {
            c.push("process_qemu_ms", "ms", Lower, q);
            text.push_str(&format!(", QEMU {q:.1} ms"));
        }
        progress(round, plan, "process start", text);
    }

    c.figure("exit_round_trip_us", None);
    let us = exit::round_trip_us(plan.exits, kvm).context("exit round trip")?;
    c.push("exit_round_trip_us", "us", Lower, us);
    progress(round, plan, "exit round trip", format!("{us:.2} us"));

    c.figure("irq_generic_us", None);
    c.figure("irq_generic_p90_us", None);
    c.figure("irq_fast_us", Some("irq_generic_us"));
    c.figure("irq_fast_p90_us", Some("irq_generic_p90_us"));
    let (fast, generic) = pair(
        flip,
        || irq(plan, IrqPath::Fast, kvm),
        || irq(plan, IrqPath::Generic, kvm),
    )
    .context("interrupt to a halted vCPU")?;
    c.push("irq_fast_us", "us", Lower, fast.0);
    c.push("irq_fast_p90_us", "us", Lower, fast.1);
    c.push("irq_generic_us", "us", Lower, generic.0);
    c.push("irq_generic_p90_us", "us", Lower, generic.1);
    progress(
        round,
        plan,
        "interrupt to a halted vCPU",
        format!(
            "fast {:.1} us (p90 {:.1}), generic {:.1} us (p90 {:.1})",
            fast.0, fast.1, generic.0, generic.1
        ),
    );

    c.figure("switch_fifo_threads_us", None);
    c.figure("switch_fifo_us", Some("switch_fifo_threads_us"));
    c.figure("switch_park_us", None);
    let (fifo, park) = pair(
        flip,
        || switch_us(plan, Mechanism::Fifo, kvm),
        || switch_us(plan, Mechanism::Park, kvm),
    )
    .context("vCPU switch")?;
    let threads = switch::native_quantiles(&switch_args(plan, Mechanism::Fifo, kvm))
        .context("host threads' switch")?
        .median_us;
    c.push("switch_fifo_us", "us", Lower, fifo);
    c.push("switch_park_us", "us", Lower, park);
    c.push("switch_fifo_threads_us", "us", Lower, threads);
    progress(
        round,
        plan,
        "vCPU switch",
        format!("fifo {fifo:.1} us, park {park:.1} us, host threads {threads:.1} us"),
    );

    for (_, _, name) in MESSAGES {
        c.figure(name, None);
    }
    let mut text = Vec::new();
    for wait in [Wait::Spin, Wait::Block] {
        let these: Vec<(u64, &str)> = MESSAGES
            .iter()
            .filter(|m| m.1 == wait)
            .map(|&(size, _, name)| (size, name))
            .collect();
        let sizes: Vec<u64> = these.iter().map(|m| m.0).collect();
        let times = messages_us(&sizes, wait, kvm).context("messages between VMs")?;
        for ((size, name), us) in these.into_iter().zip(times) {
            c.push(name, "us", Lower, us);
            text.push(format!("{size} B {} {us:.1} us", Wait::name(wait)));
        }
    }
    progress(round, plan, "messages between VMs", text.join(", "));

    c.figure("dirty_harvest_us_per_gib", None);
    c.figure("migrate_256mib_total_ms", None);
    c.figure("migrate_256mib_downtime_ms", None);
    let report = migration(plan, kvm).context("migration")?;
    let per_gib = report.harvest_ms * 1e3 / (MIGRATE_MIB as f64 / 1024.0);
    c.push("dirty_harvest_us_per_gib", "us", Lower, per_gib);
    c.push("migrate_256mib_total_ms", "ms", Lower, report.total_ms);
    c.push(
        "migrate_256mib_downtime_ms",
        "ms",
        Lower,
        report.downtime_ms,
    );
    progress(
        round,
        plan,
        "migration",
        format!(
            "total {:.1} ms, downtime {:.1} ms, last harvest {per_gib:.0} us/GiB",
            report.total_ms, report.downtime_ms
        ),
    );

    for &spec in &plan.npb {
        let (name, native) = (format!("npb_{spec}_s"), format!("npb_{spec}_native_s"));
        c.figure(&name, Some(&native));
        for _ in 0..plan.npb_pairs {
            let (g, n) = pair(
                flip,
                || overhead::guest_time(spec, VCPUS, kvm, false),
                || overhead::native_time(spec, VCPUS, false),
            )
            .with_context(|| format!("{spec}"))?;
            c.push(&name, "s", Lower, g);
            c.push(&native, "s", Lower, n);
            progress(
                round,
                plan,
                &spec.to_string(),
                format!("guest {g:.3} s, native {n:.3} s, ratio {:.3}", g / n),
            );
        }
    }
    Ok(())
}

/// kumo's start of a VM to the start of its workload: EP.S on 2 vCPUs, measured from
/// the call (in-process: the process's own start is `process_kumo_ms`).
fn boot_ms(kvm: &Path) -> Result<f64> {
    let spec: Spec = "ep.S".parse().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let verdict = run::run_guest(&[spec], VCPUS, None, kvm, Instant::now())?;
    if !verdict.problems.is_empty() {
        bail!("EP.S: {}", verdict.problems.join("; "));
    }
    verdict
        .boot_ms
        .context("the guest reported no workload start")
}

/// A number field of a bench's row, as its `--json` prints it.
fn number<T: serde::Serialize>(row: &T, key: &str) -> Result<f64> {
    let row = serde_json::to_value(row)?;
    row.get(key)
        .and_then(Value::as_f64)
        .with_context(|| format!("no numeric {key} in {row}"))
}

/// Median and p90 of doorbell-to-handler latency to halted vCPU 1, on `path`.
fn irq(plan: &Plan, path: IrqPath, kvm: &Path) -> Result<(f64, f64)> {
    let args = IrqBenchArgs {
        path: Some(path),
        noise_rate: 0.0,
        vcpus: VCPUS,
        target_vcpu: 1,
        rounds: plan.irq_rounds,
        delay_us: 0,
        json: true,
        kvm_device: kvm.to_path_buf(),
    };
    let row = kumo_vmm::irq::bench_path(&args, path, Instant::now())?;
    if number(&row, "lost")? != 0.0 {
        bail!("{} path: interrupts were lost", path.name());
    }
    Ok((number(&row, "median_us")?, number(&row, "p90_us")?))
}

/// Median cost of handing one host CPU from one vCPU to the other, by `mechanism`.
fn switch_args(plan: &Plan, mechanism: Mechanism, kvm: &Path) -> SwitchArgs {
    SwitchArgs {
        mechanism,
        slice_us: 1000,
        millis: plan.switch_ms,
        pcpu: 1,
        native: false,
        json: true,
        kvm_device: kvm.to_path_buf(),
    }
}

fn switch_us(plan: &Plan, mechanism: Mechanism, kvm: &Path) -> Result<f64> {
    Ok(switch::measure(&switch_args(plan, mechanism, kvm), Instant::now())?.median_us)
}

/// Median half round trip of each of `sizes` between two VMs whose ranks wait by
/// `wait`: emulated NIC, generic path (`kumo bench net`'s first rows).
fn messages_us(sizes: &[u64], wait: Wait, kvm: &Path) -> Result<Vec<f64>> {
    let args = NetBenchArgs {
        sizes: String::new(),
        irq_path: Some(IrqPath::Generic),
        wait: Some(wait),
        rounds: None,
        nic: Some(NicKind::Emulated),
        qemu: false,
        json: true,
        kvm_device: kvm.to_path_buf(),
    };
    let setting = Some((NicKind::Emulated, IrqPath::Generic));
    let rows = crate::mpi::pingpong(&args, sizes, wait, setting, Instant::now())?;
    sizes
        .iter()
        .map(|&size| {
            let row = rows
                .iter()
                .find(|r| r.guest.get("size").and_then(Value::as_u64) == Some(size))
                .with_context(|| format!("no ping-pong row for {size} bytes"))?;
            number(row, "median_us")
        })
        .collect()
}

/// One live migration of a 256 MiB, 2-vCPU VM on loopback, dirty bitmap.
fn migration(plan: &Plan, kvm: &Path) -> Result<hv::migration::live::Report> {
    let args = MigrateBenchArgs {
        vcpus: VCPUS,
        memory: MIGRATE_MIB,
        after_ms: plan.migrate_after_ms,
        max_downtime_ms: None,
        runs: 1,
        dirty_log: vec![DirtyLogMode::Bitmap],
        npb: None,
        qemu: false,
        json: true,
        kvm_device: PathBuf::from(kvm),
    };
    Ok(migrate::one_run(&args, DirtyLogMode::Bitmap, Instant::now())?.report)
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// The record to write (docs/results/perf/YYYY-MM-DD-<short commit>.json for one to
    /// keep).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Rounds of the suite; each runs every primitive once (with its reference) [default:
    /// 20, under 3 minutes on a quiet 2-core host; 1 with --quick].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: Option<u32>,

    /// A much shorter suite (smaller inputs, fewer repetitions, class S instead of W):
    /// for tests, not a record to compare with a full one.
    #[arg(long)]
    pub quick: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}
