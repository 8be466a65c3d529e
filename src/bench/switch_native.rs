//! The switch probe's native twin: two host threads spin on one host CPU in place of
//! the two vCPUs, logging their gaps as the guest does, and the same controller hands
//! the CPU from one to the other with SCHED_FIFO ranks. What it measures is the
//! host's own thread switch, without KVM: the floor a vCPU switch can reach here.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use hv::placement::Policy;
use kumo_abi::switch_probe::{GAP_NS, switch_costs};

use super::handover::alternate;
use super::handover::{CONTROLLER_RANK, Handover, Mechanism, RUNNING_RANK, WAITING_RANK};

/// The two spinners' kernel thread ids, for the controller.
struct HostThreads([AtomicI32; 2]);

impl Handover for HostThreads {
    fn set_policy(&self, who: usize, policy: Policy) -> Result<()> {
        hv::placement::set_policy(self.0[who].load(Ordering::Acquire), policy)?;
        Ok(())
    }

    fn park(&self, _who: usize) -> Result<()> {
        bail!("host threads have no gate to park at")
    }

    fn unpark(&self, _who: usize) {}
}

/// The switch costs in µs of two host threads spinning on `pcpu` for `millis`, handed
/// over every `slice` with SCHED_FIFO ranks (the probe's fifo mechanism).
pub fn measure(pcpu: usize, millis: u64, slice: Duration, kvm_device: &Path) -> Result<Vec<f64>> {
    let tsc_khz = u64::from(hv::host_tsc_khz(kvm_device)?);
    if tsc_khz == 0 {
        bail!("the host's TSC rate is unknown");
    }
    let controller_cpu = (pcpu + 1) % kumo_vmm::guest::host_cpus();
    let threads = Arc::new(HostThreads([AtomicI32::new(0), AtomicI32::new(0)]));
    // The spinners announce themselves, then wait until they are placed.
    let placed = Arc::new(Barrier::new(3));
    let spinners = (0..2)
        .map(|who| {
            let (threads, placed) = (threads.clone(), placed.clone());
            let ticks = millis * tsc_khz;
            std::thread::Builder::new()
                .name(format!("switch-spin{who}"))
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    threads.0[who].store(unsafe { libc::gettid() }, Ordering::Release);
                    placed.wait();
                    spin(ticks, GAP_NS * tsc_khz / 1_000_000)
                })
        })
        .collect::<Result<Vec<_>, _>>()
        .context("spawning the spinner threads")?;
    while threads.0.iter().any(|t| t.load(Ordering::Acquire) == 0) {
        std::thread::yield_now();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let controller = {
        let (threads, stop, placed) = (threads.clone(), stop.clone(), placed.clone());
        std::thread::Builder::new()
            .name("switch-controller".into())
            .spawn(move || -> Result<()> {
                let placement = place(&threads, pcpu, controller_cpu);
                placed.wait();
                placement?;
                alternate(&*threads, Mechanism::Fifo, slice, &stop)?;
                Ok(())
            })
            .context("spawning the controller thread")?
    };
    let logs = spinners
        .into_iter()
        .map(|s| s.join().map_err(|_| anyhow::anyhow!("a spinner panicked")))
        .collect::<Result<Vec<_>>>();
    stop.store(true, Ordering::SeqCst);
    let controlled = controller
        .join()
        .map_err(|_| anyhow::anyhow!("the controller thread panicked"))?;
    let logs = logs?;
    controlled?;
    let mut costs = Vec::new();
    switch_costs(&logs[0], &logs[1], |ticks| {
        costs.push(ticks as f64 * 1000.0 / tsc_khz as f64)
    });
    if costs.is_empty() {
        bail!("the host threads saw no switch");
    }
    Ok(costs)
}

/// Pins the controller to `own_cpu` above both spinners, and the spinners to `pcpu`,
/// the first above the second.
fn place(threads: &HostThreads, pcpu: usize, own_cpu: usize) -> Result<()> {
    hv::placement::pin_thread(0, own_cpu)?;
    hv::placement::set_policy(0, Policy::Fifo(CONTROLLER_RANK))?;
    for (who, rank) in [(0, RUNNING_RANK), (1, WAITING_RANK)] {
        let tid = threads.0[who].load(Ordering::Acquire);
        hv::placement::pin_thread(tid, pcpu)?;
        hv::placement::set_policy(tid, Policy::Fifo(rank))?;
    }
    Ok(())
}

/// Spins for `ticks` of the TSC from its first run, logging each gap longer than
/// `threshold` as `(last seen, first seen again)`; then leaves SCHED_FIFO.
fn spin(ticks: u64, threshold: u64) -> Vec<[u64; 2]> {
    let mut gaps = Vec::with_capacity(16_384);
    let mut last = rdtsc();
    let end = last + ticks;
    while last < end {
        let now = rdtsc();
        if now - last > threshold {
            gaps.push([last, now]);
        }
        last = now;
    }
    // Done: let the other spinner (or anyone) have the CPU without a switch.
    let _ = hv::placement::set_policy(0, Policy::Normal);
    gaps
}

fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no preconditions or side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_a_switch_only_while_the_other_was_stopped_and_resumed_first() {
        // A runs to 100, B from 130 (a switch costing 30); B runs to 200, A from 215
        // (15). A's short gap at 300-305 while B waits (B stopped since 200, resumes
        // at 400, after A did) is no switch.
        let a = [[100, 215], [300, 305]];
        let b = [[0, 130], [200, 400]];
        let mut costs = Vec::new();
        switch_costs(&a, &b, |c| costs.push(c));
        costs.sort_unstable();
        assert_eq!(costs, [15, 30]);
    }
}
