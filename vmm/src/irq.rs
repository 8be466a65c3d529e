//! Interrupt delivery from the command line: `kumo --irq-check` (the guest checks that
//! every vector of the test device arrives where its MSI-X entry points, re-targeted
//! live, and that masking holds it in the PBA) and `kumo bench irq` (doorbell-to-handler
//! latency per path, with and without a noisy neighbour on the generic path).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use hv::builder::{Backends, DeviceSpec};
use hv::irq::IrqPath;
use hv::irq_device::responder::Round;
use hv::irq_device::{IrqDeviceSetup, IrqDevices};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{GuestFields, WithGuest};
use crate::run::{self, GuestRun, RunOptions};
use crate::spec::vm::VmSpec;

/// Memory of the interrupt guests: the bench keeps one u64 sample per round on the heap.
use crate::launch::IRQ_CHECK_MEMORY_MIB as MEMORY_MIB;
/// Most rounds a bench may ask for (its samples must fit the guest heap).
const MAX_ROUNDS: u32 = 1_000_000;

/// `kumo --irq-check [--irq-path P] [--irq-rounds N]`: the embedded guest with the
/// interrupt test device of `spec` (`devices.irq_test`), running its check.
pub fn run_check(spec: &VmSpec, options: &RunOptions, epoch: Instant) -> Result<u8> {
    let test = spec
        .devices
        .irq_test
        .context("an interrupt check needs devices.irq_test")?;
    let run = IrqRun {
        path: test.irq_path,
        rounds: test.rounds,
    };
    run.check_rounds()?;
    let built = crate::launch::build(spec, &options.kvm_device, Backends::default())
        .context("attaching the interrupt test device")?;
    let guest = run::run_collecting(built.vm, epoch)?;
    let devices = built
        .attached
        .irq_test
        .context("the interrupt test device was not attached")?;
    run.report(&guest, spec.machine.vcpus, &devices, options.json)
}

/// What the guest of an `--irq-check` run does, and on which path: all a restored
/// or migrated VM needs to rebuild its device and judge its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqRun {
    #[serde(with = "path_name")]
    pub path: IrqPath,
    /// `--irq-rounds`: doorbell rounds on vector 0 instead of the delivery check.
    pub rounds: Option<u32>,
}

impl IrqRun {
    pub fn check_rounds(&self) -> Result<()> {
        match self.rounds {
            Some(r) if r == 0 || r > MAX_ROUNDS => {
                bail!("--irq-rounds must be between 1 and {MAX_ROUNDS}")
            }
            _ => Ok(()),
        }
    }

    /// The guest's command line.
    pub fn cmdline(&self) -> String {
        crate::launch::irq_check_cmdline(self.rounds)
    }

    /// The test device as this run has it (no delay, no noise).
    pub fn setup(&self) -> IrqDeviceSetup {
        IrqDeviceSetup {
            path: self.path,
            delay: Duration::ZERO,
            noise_hz: None,
        }
    }

    /// Prints the guest's verdict (with how many rounds this kumo's device answered:
    /// on a migrated VM, those after the move) and returns the exit status.
    pub fn report(
        &self,
        guest: &GuestRun,
        vcpus: u32,
        devices: &IrqDevices,
        as_json: bool,
    ) -> Result<u8> {
        let host_rounds = devices.host_rounds().len();
        let Some(rounds) = self.rounds else {
            return report_check(guest, self.path, vcpus, host_rounds, as_json);
        };
        let fields = guest.measurement("irqbench")?;
        let ok = fields.get("lost").is_some_and(|v| v == "0")
            && fields
                .get("rounds")
                .is_some_and(|v| *v == rounds.to_string());
        let kumo = IrqRoundsRow {
            path: self.path.name(),
            vcpus,
            host_rounds,
            verified: ok,
        };
        if as_json {
            crate::output::json_line(&WithGuest::new(kumo, GuestFields::of(fields)));
        } else {
            crate::outln!(
                "interrupt rounds, {} path, {vcpus} vCPUs: {} rounds, lost {}, median {} us; \
                 {host_rounds} answered by this kumo's device: {}",
                self.path.name(),
                text(fields, "rounds"),
                text(fields, "lost"),
                text(fields, "median_us"),
                if ok { "verified" } else { "FAILED" },
            );
        }
        Ok(if ok { 0 } else { 1 })
    }
}

/// `IrqPath` as its command-line name in a stream.
/// An `IrqPath` in serde as its name (`generic`, `fast`).
pub(crate) mod path_name {
    use hv::irq::IrqPath;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(path: &IrqPath, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(path.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IrqPath, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

fn report_check(
    guest: &GuestRun,
    path: IrqPath,
    vcpus: u32,
    host_rounds: usize,
    as_json: bool,
) -> Result<u8> {
    let fields = guest.measurement("irqcheck")?;
    let verified = fields.get("verified").is_some_and(|v| v == "true");
    if as_json {
        let kumo = IrqCheckRow {
            path: path.name(),
            host_rounds,
        };
        crate::output::json_line(&WithGuest::new(kumo, GuestFields::of(fields)));
    } else {
        crate::outln!(
            "interrupt check, {} path, {} vCPUs: {} vectors x {} CPUs delivered {} \
             (misrouted {}, lost {}); masked and held {}, delivered on unmask {}: {}",
            path.name(),
            vcpus,
            text(fields, "vectors"),
            text(fields, "cpus"),
            text(fields, "delivered"),
            text(fields, "misrouted"),
            text(fields, "lost"),
            text(fields, "masked_held"),
            text(fields, "unmask_delivered"),
            if verified { "verified" } else { "FAILED" },
        );
    }
    Ok(if verified { 0 } else { 1 })
}

/// `kumo bench irq`.
pub fn run_bench(args: &IrqBenchArgs, epoch: Instant) -> Result<u8> {
    run::check_guest_vcpus(args.vcpus, &args.kvm_device)?;
    if args.target_vcpu >= args.vcpus {
        bail!(
            "--target-vcpu {} does not exist: the guest has vCPUs 0..={}",
            args.target_vcpu,
            args.vcpus - 1
        );
    }
    if args.rounds == 0 || args.rounds > MAX_ROUNDS {
        bail!("--rounds must be between 1 and {MAX_ROUNDS}");
    }
    if !(args.noise_rate >= 0.0 && args.noise_rate <= 1_000_000.0) {
        bail!("--noise-rate must be between 0 and 1000000 interrupts per second");
    }
    if args.delay_us > 1_000_000 {
        bail!("--delay-us must be at most 1000000");
    }
    let paths = match args.path {
        Some(path) => vec![path],
        None => vec![IrqPath::Generic, IrqPath::Fast],
    };
    let rows = paths
        .into_iter()
        .map(|path| bench_path(args, path, epoch))
        .collect::<Result<Vec<_>>>()?;
    print_bench(&rows, args.json);
    let lost = rows
        .iter()
        .any(|r| r.guest.get("lost").and_then(Value::as_f64) != Some(0.0));
    Ok(if lost { 1 } else { 0 })
}

/// One path's doorbell rounds as `kumo bench irq --json` prints them (the guest's
/// `irqbench` fields: `median_us`, `p90_us`, ...; and the host's view).
pub fn bench_path(
    args: &IrqBenchArgs,
    path: IrqPath,
    epoch: Instant,
) -> Result<WithGuest<IrqBenchRow>> {
    let setup = IrqDeviceSetup {
        path,
        delay: Duration::from_micros(args.delay_us),
        noise_hz: (args.noise_rate > 0.0).then_some(args.noise_rate),
    };
    let cmdline = format!("irq=bench:{}:{}", args.rounds, args.target_vcpu);
    let (guest, devices) = boot(&cmdline, args.vcpus, &setup, &args.kvm_device, epoch)?;
    let fields = guest.measurement("irqbench")?;
    let host = HostView::of(&devices.host_rounds());
    let kumo = IrqBenchRow {
        path: path.name(),
        vcpus: args.vcpus,
        noise_rate: args.noise_rate,
        delay_us: args.delay_us,
        host_rounds: host.rounds,
        host_device_us: host.device_us,
        host_period_us: host.period_us,
        noise_raised: devices.noise_raised(),
    };
    Ok(WithGuest::new(kumo, GuestFields::of(fields)))
}

/// kumo's fields of `kumo --irq-check --irq-rounds N --json` (beside the guest's
/// `irqbench` fields).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IrqRoundsRow {
    /// `"generic"` or `"fast"`.
    pub path: &'static str,
    pub vcpus: u32,
    /// Doorbells this kumo's device answered (after the move, on a migrated VM).
    pub host_rounds: usize,
    /// No interrupt lost, and the rounds asked for made.
    pub verified: bool,
}

/// kumo's fields of `kumo --irq-check --json` (beside the guest's `irqcheck` fields).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IrqCheckRow {
    pub path: &'static str,
    pub host_rounds: usize,
}

/// kumo's fields of a `kumo bench irq --json` row (beside the guest's `irqbench`
/// fields).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IrqBenchRow {
    pub path: &'static str,
    pub vcpus: u32,
    /// `--noise-rate`, interrupts per second.
    pub noise_rate: f64,
    pub delay_us: u64,
    pub host_rounds: usize,
    /// Median µs, doorbell seen to interrupt raised (host clock); 0.0 without a round.
    pub host_device_us: f64,
    /// Median µs, doorbell to doorbell; 0.0 with fewer than two rounds.
    pub host_period_us: f64,
    /// Interrupts the noise device raised.
    pub noise_raised: usize,
}

/// Boots the embedded guest with `cmdline` and the test devices of `setup`.
fn boot(
    cmdline: &str,
    vcpus: u32,
    setup: &IrqDeviceSetup,
    kvm_device: &Path,
    epoch: Instant,
) -> Result<(GuestRun, IrqDevices)> {
    let config = run::embedded_config(vcpus, MEMORY_MIB, cmdline.into(), kvm_device);
    let spec = DeviceSpec {
        irq_test: Some(*setup),
        ..DeviceSpec::default()
    };
    let (vm, attached) = hv::builder::build_with_devices(config, &spec, Backends::default())
        .context("attaching the interrupt test device")?;
    let guest = run::run_collecting(vm, epoch)?;
    let devices = attached
        .irq_test
        .context("the interrupt test device was not attached")?;
    Ok((guest, devices))
}

/// The rounds as the host saw them: how many, the device's own time (doorbell seen to
/// interrupt raised) and the doorbell-to-doorbell period (the guest's round trip plus
/// its loop), medians in microseconds.
struct HostView {
    rounds: usize,
    device_us: f64,
    period_us: f64,
}

impl HostView {
    fn of(rounds: &[Round]) -> HostView {
        let us = |ns: u64| ns as f64 / 1e3;
        let device: Vec<f64> = rounds
            .iter()
            .map(|r| us(r.raised_ns.saturating_sub(r.rung_ns)))
            .collect();
        let period: Vec<f64> = rounds
            .windows(2)
            .map(|w| us(w[1].rung_ns.saturating_sub(w[0].rung_ns)))
            .collect();
        HostView {
            rounds: rounds.len(),
            // 0.0 with no round (or one, for the period): kumo's printed shape.
            device_us: crate::stats::median(&device).unwrap_or(0.0),
            period_us: crate::stats::median(&period).unwrap_or(0.0),
        }
    }
}

fn text<'a>(fields: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    fields.get(key).map_or("?", String::as_str)
}

fn print_bench(rows: &[WithGuest<IrqBenchRow>], as_json: bool) {
    if as_json {
        for row in rows {
            crate::output::json_line(row);
        }
        return;
    }
    let num = |row: &WithGuest<IrqBenchRow>, key: &str| {
        let own = serde_json::to_value(&row.kumo).unwrap_or(Value::Null);
        own.get(key)
            .or_else(|| row.guest.get(key))
            .and_then(Value::as_f64)
            .unwrap_or(f64::NAN)
    };
    crate::outln!(
        "{:<8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>5} {:>7} {:>11} {:>11}",
        "path",
        "rounds",
        "median_us",
        "p90_us",
        "p99_us",
        "max_us",
        "lost",
        "noise",
        "host_dev_us",
        "host_per_us"
    );
    for row in rows {
        crate::outln!(
            "{:<8} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>5} {:>7} {:>11.1} {:>11.1}",
            row.kumo.path,
            num(row, "rounds"),
            num(row, "median_us"),
            num(row, "p90_us"),
            num(row, "p99_us"),
            num(row, "max_us"),
            num(row, "lost"),
            num(row, "noise_irqs"),
            num(row, "host_device_us"),
            num(row, "host_period_us"),
        );
    }
    if let [generic, fast] = rows {
        crate::outln!(
            "fast/generic median: {:.2}  (latency: guest doorbell write to handler entry, \
             TSC; host_dev = doorbell seen to interrupt raised, host_per = doorbell to \
             doorbell, host clock)",
            num(fast, "median_us") / num(generic, "median_us")
        );
    }
}

#[derive(Args, Debug)]
pub struct IrqBenchArgs {
    /// The path to measure: generic (one event-loop thread, KVM_SIGNAL_MSI) or fast
    /// (irqfd per vector) [default: both, side by side].
    #[arg(long, value_name = "PATH", value_parser = crate::args::irq_path)]
    pub path: Option<hv::irq::IrqPath>,

    /// Interrupts per second of a second, noisy device on the generic path (0: none).
    #[arg(long, value_name = "HZ", default_value_t = 0.0)]
    pub noise_rate: f64,

    /// vCPUs of the guest.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// The vCPU the test vector is aimed at.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub target_vcpu: u32,

    /// Doorbell rounds (one interrupt outstanding at a time).
    #[arg(long, value_name = "R", default_value_t = 2000)]
    pub rounds: u32,

    /// The device's delay between doorbell and interrupt, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 0)]
    pub delay_us: u64,

    /// Print one JSON object per path.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}
