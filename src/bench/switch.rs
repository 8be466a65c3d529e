//! `kumo bench switch`: the real cost of switching a host CPU from one vCPU to another,
//! with each of the two mechanisms a scheduler can use (`hv::placement`).
//!
//! A 2-vCPU guest runs `probe=switch:MS` (each vCPU spins and logs when it was not
//! running; the guest matches one vCPU's stop with the other's resume). Both vCPU
//! threads are pinned to one host CPU, and a controller thread on another CPU hands
//! that CPU from one vCPU to the other every slice:
//! - `fifo`: both vCPU threads are SCHED_FIFO; the controller swaps their priorities,
//!   and the kernel preempts at once (the running vCPU stays inside KVM_RUN);
//! - `park`: the controller parks the running vCPU (gate closed, signal kicks it out of
//!   KVM_RUN) and unparks the other (it leaves its wait and enters KVM_RUN).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use hv::placement::{Policy, VcpuControl};
use kumo_vmm::guest;
use kumo_vmm::run;
use serde::Serialize;

use super::handover::{CONTROLLER_RANK, Mechanism, alternate, hold_first};

pub fn run_switch(args: &SwitchArgs, epoch: Instant) -> Result<u8> {
    let mut row = measure(args, epoch)?;
    if args.native {
        row.host_threads = Some(native_quantiles(args)?);
    }
    if args.json {
        kumo_vmm::output::json_line(&row);
    } else {
        kumo_vmm::outln!(
            "mechanism {}: {} switches seen ({} requested, slice {} us on host CPU {}): \
             median {} us, p90 {} us, p99 {} us, max {} us",
            args.mechanism.name(),
            row.switches_seen,
            row.switches_requested,
            args.slice_us,
            args.pcpu,
            row.median_us,
            row.p90_us,
            row.p99_us,
            row.max_us,
        );
        if let Some(t) = &row.host_threads {
            kumo_vmm::outln!(
                "two host threads, same hand-over (no KVM): {} switches: median {:.2} us, \
                 p90 {:.2} us, p99 {:.2} us, max {:.2} us; the vCPU switch is {:.2}x",
                t.switches,
                t.median_us,
                t.p90_us,
                t.p99_us,
                t.max_us,
                row.median_us / t.median_us,
            );
        }
    }
    Ok(0)
}

/// The native twin's switch costs (`switch_native`) as quantiles.
pub fn native_quantiles(args: &SwitchArgs) -> Result<HostThreadSwitch> {
    let costs = super::switch_native::measure(
        args.pcpu,
        args.millis,
        Duration::from_micros(args.slice_us),
        &args.kvm_device,
    )?;
    let at = |q| kumo_vmm::stats::quantile(&costs, q).unwrap_or(f64::NAN);
    Ok(HostThreadSwitch {
        switches: costs.len() as u64,
        median_us: at(0.5),
        p90_us: at(0.9),
        p99_us: at(0.99),
        max_us: at(1.0),
    })
}

/// One run of the switch probe: the row `--json` prints (`bench record` takes its
/// median from it).
pub fn measure(args: &SwitchArgs, epoch: Instant) -> Result<SwitchRow> {
    kumo_vmm::guest::check_host_cpu("--pcpu", args.pcpu)?;
    if args.slice_us < 100 {
        bail!("--slice-us must be at least 100");
    }
    if args.native && args.mechanism != Mechanism::Fifo {
        bail!("--native measures host threads under fifo only (park gates KVM_RUN)");
    }
    if args.millis == 0 || args.millis > 600_000 {
        bail!("--millis must be between 1 and 600000");
    }
    let controller_cpu = (args.pcpu + 1) % guest::host_cpus();
    let config = run::embedded_config(
        2,
        64,
        format!("probe=switch:{}", args.millis),
        &args.kvm_device,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (guest, controller) = run::boot_embedded(config, epoch, |vm| {
        let control = vm.control();
        let stop = stop.clone();
        let (mechanism, pcpu, slice) = (
            args.mechanism,
            args.pcpu,
            Duration::from_micros(args.slice_us),
        );
        std::thread::Builder::new()
            .name("switch-controller".into())
            .spawn(move || control_loop(&control, mechanism, pcpu, controller_cpu, slice, &stop))
    })?;
    let controller = controller.context("spawning the controller thread")?;
    stop.store(true, Ordering::SeqCst);
    let switches = controller
        .join()
        .map_err(|_| anyhow::anyhow!("the controller thread panicked"))??;
    let fields = guest.measurement("switchprobe")?;
    let get = |key: &str| {
        kumo_vmm::protocol::f64_field(fields, key)
            .with_context(|| format!("the guest's switchprobe line has no numeric {key}"))
    };
    Ok(SwitchRow {
        mechanism: args.mechanism.name(),
        slice_us: args.slice_us,
        pcpu: args.pcpu,
        millis: args.millis,
        switches_requested: switches,
        switches_seen: kumo_vmm::protocol::u64_field(fields, "switches")
            .context("the guest's switchprobe line has no count of switches")?,
        median_us: get("median_us")?,
        p90_us: get("p90_us")?,
        p99_us: get("p99_us")?,
        max_us: get("max_us")?,
        host_threads: None,
    })
}

/// `kumo bench switch --json`'s object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SwitchRow {
    pub mechanism: &'static str,
    pub slice_us: u64,
    pub pcpu: usize,
    pub millis: u64,
    /// Switches the controller made.
    pub switches_requested: u64,
    /// Switches the guest saw.
    pub switches_seen: u64,
    /// µs of a hand-over, guest TSC.
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// With `--native`: the same hand-over between two host threads, without KVM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_threads: Option<HostThreadSwitch>,
}

/// The switch between two host threads spinning on the same CPU under the same
/// controller (fifo): the host's floor for a vCPU switch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostThreadSwitch {
    pub switches: u64,
    pub median_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// Pins both vCPUs to `pcpu` and alternates them every `slice` until `stop`. Returns
/// the number of switches it made.
fn control_loop(
    control: &VcpuControl,
    mechanism: Mechanism,
    pcpu: usize,
    own_cpu: usize,
    slice: Duration,
    stop: &AtomicBool,
) -> Result<u64> {
    if !control.wait_started(Duration::from_secs(10)) {
        bail!("the vCPU threads did not start");
    }
    hv::placement::pin_thread(0, own_cpu)?;
    hv::placement::set_policy(0, Policy::Fifo(CONTROLLER_RANK))?;
    let result = hold_first(control, mechanism)
        .and_then(|()| (0..2).try_for_each(|vcpu| Ok(control.pin(vcpu, pcpu)?)))
        .and_then(|()| alternate(control, mechanism, slice, stop));
    // Leave nothing parked or real-time behind, whatever happened.
    for vcpu in 0..2 {
        control.unpark(vcpu);
        let _ = control.set_policy(vcpu, Policy::Normal);
    }
    let _ = hv::placement::set_policy(0, Policy::Normal);
    result
}

#[derive(Args, Debug)]
pub struct SwitchArgs {
    /// The mechanism to measure.
    #[arg(long, value_enum, default_value_t = Mechanism::Fifo)]
    pub mechanism: Mechanism,

    /// Time each vCPU holds the host CPU before the switch, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 1000)]
    pub slice_us: u64,

    /// How long the guest measures, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub millis: u64,

    /// The host CPU both vCPUs share (the controller runs on the next one).
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub pcpu: usize,

    /// Also measure the same hand-over between two host threads spinning on the CPU,
    /// after the VM (fifo only): the host's own switch, without KVM.
    #[arg(long)]
    pub native: bool,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}
