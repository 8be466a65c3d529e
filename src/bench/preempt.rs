//! `kumo bench preempt`: what one preemption costs a PVM vCPU, beside what it costs a
//! native thread running the same code.
//!
//! With one vCPU everything runs on one host CPU: the guest (or the native twin on one
//! thread) and a waker thread that sleeps to absolute deadlines at `--hz` and does
//! nothing else. Each wake-up preempts the workload, and the workload's extra time over
//! a run without the waker, divided by the wake-ups inside the timed part, is what one
//! preemption cost it: the switches, and the caches and TLB it finds cold afterwards.
//! With `--vcpus N` the guest (or N native threads) spreads over the host's CPUs and
//! only the waker is confined to `--pcpu`: it preempts one vCPU, and at the next
//! barrier the others wait for it, so the figure is what one preemption costs the team.
//! Runs alternate (native, guest, native with the waker, guest with the waker) so a
//! drift of the host hits every kind alike.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use clap::Args;
use serde::Serialize;

use crate::bench::overhead::{guest_time, median, native_time};
use kumo_vmm::guest;
use kumo_vmm::run;

/// One side's times (s) without and with the waker, and the waker's measured rate.
#[derive(Debug, Default)]
struct Side {
    quiet: Vec<f64>,
    woken: Vec<f64>,
    rates: Vec<f64>,
}

impl Side {
    /// Microseconds each wake-up cost: the medians' difference over the wake-ups that
    /// fell inside the median woken run.
    fn cost_us(&self) -> f64 {
        let (quiet, woken) = (median(&self.quiet), median(&self.woken));
        (woken - quiet) / (median(&self.rates) * woken) * 1e6
    }
}

pub fn run_preempt(args: &PreemptArgs) -> Result<u8> {
    guest::check_host_cpu("--pcpu", args.pcpu)?;
    ensure!(args.runs >= 1, "--runs must be at least 1");
    if !(1..=20_000).contains(&args.hz) {
        bail!("--hz must be between 1 and 20000");
    }
    let specs = guest::parse_specs(&args.npb)?;
    ensure!(args.vcpus >= 1, "--vcpus must be at least 1");
    run::check_guest_vcpus(args.vcpus, &args.kvm_device)?;
    if args.vcpus == 1 {
        // This thread, the vCPU and native threads it starts, and the waker all
        // inherit the one CPU.
        hv::placement::pin_thread(0, args.pcpu)?;
    }
    let mut rows = Vec::new();
    for &spec in &specs {
        let (mut native_side, mut guest_side) = (Side::default(), Side::default());
        for round in 1..=args.runs {
            native_side
                .quiet
                .push(native_time(spec, args.vcpus, false)?);
            guest_side
                .quiet
                .push(guest_time(spec, args.vcpus, &args.kvm_device, false)?);
            let (t, rate) = woken(args, || native_time(spec, args.vcpus, false))?;
            native_side.woken.push(t);
            native_side.rates.push(rate);
            let (t, rate) = woken(args, || {
                guest_time(spec, args.vcpus, &args.kvm_device, false)
            })?;
            guest_side.woken.push(t);
            guest_side.rates.push(rate);
            eprintln!(
                "kumo: {spec} round {round}/{}: native {:.3} / {:.3} s, guest {:.3} / {:.3} s \
                 (without / with the waker)",
                args.runs,
                native_side.quiet[round as usize - 1],
                native_side.woken[round as usize - 1],
                guest_side.quiet[round as usize - 1],
                guest_side.woken[round as usize - 1],
            );
        }
        let (native_us, guest_us) = (native_side.cost_us(), guest_side.cost_us());
        rows.push(PreemptRow {
            benchmark: spec.kernel.name(),
            class: spec.class.letter().to_string(),
            pcpu: args.pcpu,
            vcpus: args.vcpus,
            hz: args.hz,
            runs: args.runs,
            wakes_per_s: median(&guest_side.rates),
            native_s: median(&native_side.quiet),
            native_woken_s: median(&native_side.woken),
            guest_s: median(&guest_side.quiet),
            guest_woken_s: median(&guest_side.woken),
            native_us_per_preemption: native_us,
            guest_us_per_preemption: guest_us,
            guest_minus_native_us: guest_us - native_us,
        });
    }
    print(&rows, args.json);
    Ok(0)
}

/// Runs `work` beside a waker at `--hz` on `--pcpu`; its time and the wake-ups per
/// second the waker really made.
fn woken(args: &PreemptArgs, work: impl FnOnce() -> Result<f64>) -> Result<(f64, f64)> {
    let waker = Waker::start(args.hz, args.pcpu)?;
    let started = Instant::now();
    let time = work();
    let wall = started.elapsed();
    let wakes = waker.stop();
    Ok((time?, wakes as f64 / wall.as_secs_f64()))
}

/// A thread that wakes at a fixed rate and does nothing else.
struct Waker {
    stop: Arc<AtomicBool>,
    wakes: Arc<AtomicU64>,
    thread: JoinHandle<()>,
}

impl Waker {
    fn start(hz: u32, cpu: usize) -> Result<Waker> {
        let (stop, wakes) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let period = Duration::from_secs(1) / hz;
        let thread = std::thread::Builder::new().name("waker".into()).spawn({
            let (stop, wakes) = (stop.clone(), wakes.clone());
            move || {
                if let Err(e) = hv::placement::pin_thread(0, cpu) {
                    tracing::warn!("the waker runs unpinned: {e}");
                }
                // Deadlines on a fixed grid, so a late wake-up does not slow the rate.
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    next += period;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    wakes.fetch_add(1, Ordering::Relaxed);
                }
            }
        })?;
        Ok(Waker {
            stop,
            wakes,
            thread,
        })
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.wakes.load(Ordering::Relaxed)
    }
}

/// A row of `kumo bench preempt --json`: one benchmark's medians over the rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreemptRow {
    pub benchmark: &'static str,
    pub class: String,
    /// The host CPU the waker ran on.
    pub pcpu: usize,
    pub vcpus: u32,
    /// The waker's wake-ups per second asked for.
    pub hz: u32,
    pub runs: u32,
    /// The waker's wake-ups per second made (beside the guest).
    pub wakes_per_s: f64,
    pub native_s: f64,
    pub native_woken_s: f64,
    pub guest_s: f64,
    pub guest_woken_s: f64,
    pub native_us_per_preemption: f64,
    pub guest_us_per_preemption: f64,
    pub guest_minus_native_us: f64,
}

fn print(rows: &[PreemptRow], json: bool) {
    if json {
        for row in rows {
            kumo_vmm::output::json_line(row);
        }
        return;
    }
    kumo_vmm::outln!(
        "{:<10} {:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11}",
        "benchmark",
        "class",
        "wakes/s",
        "native s",
        "+waker s",
        "guest s",
        "+waker s",
        "native us",
        "guest us"
    );
    for r in rows {
        kumo_vmm::outln!(
            "{:<10} {:>6} {:>8.0} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>11.1} {:>11.1}",
            r.benchmark,
            r.class,
            r.wakes_per_s,
            r.native_s,
            r.native_woken_s,
            r.guest_s,
            r.guest_woken_s,
            r.native_us_per_preemption,
            r.guest_us_per_preemption,
        );
    }
    kumo_vmm::outln!(
        "us = the workload's extra time with the waker per wake-up in its timed part, \
         the waker on host CPU {} with {} vCPU(s) / thread(s) (medians of the rounds)",
        rows.first().map_or(0, |r| r.pcpu),
        rows.first().map_or(1, |r| r.vcpus),
    );
}

#[derive(Args, Debug)]
pub struct PreemptArgs {
    /// Benchmarks, comma-separated kernel.class items, each run on one thread / vCPU.
    #[arg(long, value_name = "LIST", default_value = "ep.W,bt.W")]
    pub npb: String,

    /// The waker's wake-ups per second.
    #[arg(long, value_name = "HZ", default_value_t = 2000)]
    pub hz: u32,

    /// vCPUs of the guest and threads of the native twin. With 1, everything runs on
    /// `--pcpu`; with more, only the waker does.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: u32,

    /// Rounds (each: native, guest, native with the waker, guest with the waker).
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub runs: u32,

    /// The host CPU the waker (and with one vCPU, everything) runs on.
    #[arg(long, value_name = "CPU", default_value_t = 1)]
    pub pcpu: usize,

    /// Print one JSON object per benchmark.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_per_preemption_is_the_extra_time_over_the_wakes_in_the_woken_run() {
        let side = Side {
            quiet: vec![1.0, 1.2, 1.0],
            woken: vec![1.1, 1.1, 1.3],
            rates: vec![1000.0, 1000.0, 1000.0],
        };
        // Medians 1.0 and 1.1 s: 0.1 s over 1100 wake-ups.
        assert!((side.cost_us() - 0.1 / 1100.0 * 1e6).abs() < 1e-9);
    }

    #[test]
    fn the_waker_wakes_about_as_often_as_asked() {
        let waker = Waker::start(1000, 0).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let wakes = waker.stop();
        // A grid of deadlines: never more than asked (plus the one in flight).
        assert!((1..=201).contains(&wakes), "{wakes}");
    }
}
