//! `kumo bench overhead`: what running in a kumo VM costs each benchmark. Native and
//! guest runs alternate (A B A B ...) so slow drifts of a shared host hit both sides
//! alike; each pair gives one guest/native ratio, and the median ratio is the figure.
//! These hosts also switch between two speeds (~1.7x apart, seen in native and guest
//! runs alike), so a pair straddling a switch is an outlier; the ratio of the best
//! times of each side is reported beside the median as the figure robust to that.

use std::path::Path;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use npb::Spec;
use serde::Serialize;

use clap::Args;
use kumo_lab::native;
use kumo_vmm::guest;
use kumo_vmm::protocol::Event;
use kumo_vmm::run;
use kumo_vmm::stats;

/// Times (seconds) of one benchmark's paired runs and what they say. Not
/// `stats::Summary` (one series' median and range): this pairs two series, each
/// native run with the guest run beside it, and summarises their ratios.
#[derive(Debug, PartialEq)]
pub struct Summary {
    pub native_median: f64,
    pub guest_median: f64,
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// Fastest guest time over fastest native time.
    pub best_ratio: f64,
}

/// Summarises paired times; `native[i]` and `guest[i]` were measured back to back.
pub fn summarize(native: &[f64], guest: &[f64]) -> Option<Summary> {
    if native.is_empty() || native.len() != guest.len() {
        return None;
    }
    let ratios: Vec<f64> = guest.iter().zip(native).map(|(g, n)| g / n).collect();
    Some(Summary {
        native_median: median(native),
        guest_median: median(guest),
        ratio_median: median(&ratios),
        ratio_min: min(&ratios),
        ratio_max: stats::max(&ratios).unwrap_or(f64::NAN),
        best_ratio: min(guest) / min(native),
    })
}

fn min(values: &[f64]) -> f64 {
    stats::min(values).unwrap_or(f64::NAN)
}

/// The median (`kumo_vmm::stats`: the mean of the middle two for an even count), NaN
/// for no value: one quantile for every bench.
pub(crate) fn median(values: &[f64]) -> f64 {
    stats::median(values).unwrap_or(f64::NAN)
}

pub fn run_overhead(args: &OverheadArgs) -> Result<u8> {
    let specs = match &args.npb {
        Some(list) => guest::parse_specs(list)?,
        None => guest::default_specs(),
    };
    ensure!(args.runs >= 1, "--runs must be at least 1");
    run::check_guest_vcpus(args.vcpus, &args.kvm_device)?;
    let mut lines = Vec::new();
    for &spec in &specs {
        let (mut native_times, mut guest_times, mut qemu_times, mut unfiltered_times) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 1..=args.runs {
            native_times.push(native_time(spec, args.vcpus, args.huge_pages)?);
            guest_times.push(guest_time(
                spec,
                args.vcpus,
                &args.kvm_device,
                args.huge_pages,
            )?);
            let mut unfiltered = String::new();
            if args.seccomp_off_too {
                unfiltered_times.push(guest_time_unfiltered(spec, args)?);
                unfiltered = format!(
                    ", guest without seccomp {:.3} s",
                    unfiltered_times.last().unwrap()
                );
            }
            let mut qemu = String::new();
            if args.qemu {
                qemu_times.push(qemu_time(spec, args.vcpus, args.huge_pages)?);
                qemu = format!(", QEMU {:.3} s", qemu_times.last().unwrap());
            }
            eprintln!(
                "kumo: {spec} pair {round}/{}: native {:.3} s, guest {:.3} s{unfiltered}{qemu}",
                args.runs,
                native_times.last().unwrap(),
                guest_times.last().unwrap()
            );
        }
        let kumo = summarize(&native_times, &guest_times).expect("runs >= 1, paired");
        let qemu = summarize(&native_times, &qemu_times);
        // Filtered over unfiltered guest runs of the same round: what seccomp costs.
        let seccomp = summarize(&unfiltered_times, &guest_times);
        lines.push((spec, kumo, qemu, seccomp));
    }
    print(&lines, args);
    Ok(0)
}

/// Seconds `spec` takes natively on `threads` threads (an error if it does not verify),
/// its arena on huge pages if `huge_pages`.
pub(crate) fn native_time(spec: Spec, threads: u32, huge_pages: bool) -> Result<f64> {
    let result = native::run_one_paged(spec, threads, huge_pages)?;
    if !result.verified {
        bail!("{spec} did not verify natively: its times measure nothing");
    }
    Ok(result.time_s)
}

/// Seconds `spec` takes in a VM of the embedded guest on `vcpus` vCPUs, its RAM on
/// huge pages if `huge_pages`.
pub(crate) fn guest_time(
    spec: Spec,
    vcpus: u32,
    kvm_device: &Path,
    huge_pages: bool,
) -> Result<f64> {
    let mut vm = run::npb_spec(&[spec], vcpus);
    vm.machine.huge_pages = huge_pages;
    let verdict = run::run_spec(&vm, kvm_device, Instant::now())?;
    if !verdict.problems.is_empty() {
        bail!("{spec} in the guest: {}", verdict.problems.join("; "));
    }
    match verdict.rows.first().and_then(|row| row.result.as_ref()) {
        Some(result) => Ok(result.time_s),
        None => bail!("{spec} in the guest gave no result"),
    }
}

/// As [`guest_time`] with every seccomp filter off, whatever `--seccomp` says.
fn guest_time_unfiltered(spec: Spec, args: &OverheadArgs) -> Result<f64> {
    let mode = hv::seccomp::mode();
    hv::seccomp::set_mode(hv::seccomp::Mode::Off);
    let time = guest_time(spec, args.vcpus, &args.kvm_device, args.huge_pages);
    hv::seccomp::set_mode(mode);
    time
}

/// How long one QEMU run may take: longer than any class this host can hold.
const QEMU_LIMIT: Duration = Duration::from_secs(3600);

/// Seconds `spec` takes in the embedded guest on QEMU, with the memory and the barrier
/// spin kumo would give it. QEMU has neither kumo's paravirtual wait page nor its
/// count of host CPUs, so the guest halts at barriers and never balloons: as kumo's
/// own guest does when every vCPU has a host CPU.
fn qemu_time(spec: Spec, vcpus: u32, huge_pages: bool) -> Result<f64> {
    let memory_mib = guest::choose_memory_mib_paged(None, &[spec], vcpus, huge_pages)?;
    let cmdline = guest::npb_cmdline(
        &[spec],
        vcpus,
        guest::BarrierWait::Hlt,
        guest::VcpuBalloon::Off,
    );
    let events = kumo_lab::qemu::run_guest(vcpus, memory_mib, huge_pages, &cmdline, QEMU_LIMIT)?;
    let result = events.iter().find_map(|event| match event {
        Event::Result(result) => Some(result),
        _ => None,
    });
    match result {
        Some(result) if result.verified => Ok(result.time_s),
        Some(_) => bail!("{spec} on QEMU did not verify"),
        None => bail!("{spec} on QEMU gave no result (events: {events:?})"),
    }
}

/// A row of `kumo bench overhead --json`: one benchmark's paired runs (times in s).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverheadRow {
    pub benchmark: &'static str,
    pub class: String,
    pub vcpus: u32,
    pub runs: u32,
    pub native_median_s: f64,
    pub guest_median_s: f64,
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    pub best_ratio: f64,
    /// With `--qemu` only (absent without).
    #[serde(flatten)]
    pub qemu: Option<QemuOverhead>,
    /// With `--seccomp-off-too` only (absent without).
    #[serde(flatten)]
    pub seccomp: Option<SeccompOverhead>,
}

/// The guest with its seccomp filters against the same guest without, each round's
/// two runs back to back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeccompOverhead {
    pub seccomp_off_median_s: f64,
    /// Filtered guest time / unfiltered guest time of the same round, median.
    pub seccomp_ratio_median: f64,
    pub seccomp_ratio_min: f64,
    pub seccomp_ratio_max: f64,
    pub seccomp_best_ratio: f64,
}

/// QEMU's side of an overhead row, against the same native runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QemuOverhead {
    pub qemu_median_s: f64,
    pub qemu_ratio_median: f64,
    pub qemu_ratio_min: f64,
    pub qemu_ratio_max: f64,
    pub qemu_best_ratio: f64,
}

type Line = (Spec, Summary, Option<Summary>, Option<Summary>);

fn print(lines: &[Line], args: &OverheadArgs) {
    if args.json {
        for (spec, s, qemu, seccomp) in lines {
            kumo_vmm::output::json_line(&OverheadRow {
                benchmark: spec.kernel.name(),
                class: spec.class.letter().to_string(),
                vcpus: args.vcpus,
                runs: args.runs,
                native_median_s: s.native_median,
                guest_median_s: s.guest_median,
                ratio_median: s.ratio_median,
                ratio_min: s.ratio_min,
                ratio_max: s.ratio_max,
                best_ratio: s.best_ratio,
                qemu: qemu.as_ref().map(|q| QemuOverhead {
                    qemu_median_s: q.guest_median,
                    qemu_ratio_median: q.ratio_median,
                    qemu_ratio_min: q.ratio_min,
                    qemu_ratio_max: q.ratio_max,
                    qemu_best_ratio: q.best_ratio,
                }),
                seccomp: seccomp.as_ref().map(|q| SeccompOverhead {
                    seccomp_off_median_s: q.native_median,
                    seccomp_ratio_median: q.ratio_median,
                    seccomp_ratio_min: q.ratio_min,
                    seccomp_ratio_max: q.ratio_max,
                    seccomp_best_ratio: q.best_ratio,
                }),
            });
        }
        return;
    }
    let qemu_head = if args.qemu {
        format!(
            " {:>9} {:>11} {:>15}",
            "QEMU (s)", "QEMU ratio", "ratio min-max"
        )
    } else {
        String::new()
    };
    kumo_vmm::outln!(
        "{:<10} {:<5} {:>5} {:>4} {:>11} {:>11} {:>8} {:>15} {:>10}{qemu_head}",
        "benchmark",
        "class",
        "vCPUs",
        "runs",
        "native (s)",
        "guest (s)",
        "ratio",
        "ratio min-max",
        "best ratio"
    );
    for (spec, s, qemu, seccomp) in lines {
        let seccomp = seccomp.as_ref().map_or(String::new(), |q| {
            format!(
                " {:>10.3} {:>13.4} {:>7.4}-{:<7.4}",
                q.native_median, q.ratio_median, q.ratio_min, q.ratio_max
            )
        });
        let qemu = qemu.as_ref().map_or(String::new(), |q| {
            format!(
                " {:>9.3} {:>11.3} {:>7.3}-{:<7.3}",
                q.guest_median, q.ratio_median, q.ratio_min, q.ratio_max
            )
        });
        kumo_vmm::outln!(
            "{:<10} {:<5} {:>5} {:>4} {:>11.3} {:>11.3} {:>8.3} {:>7.3}-{:<7.3} {:>10.3}{qemu}",
            spec.kernel.name(),
            spec.class.letter(),
            args.vcpus,
            args.runs,
            s.native_median,
            s.guest_median,
            s.ratio_median,
            s.ratio_min,
            s.ratio_max,
            s.best_ratio
        );
        if !seccomp.is_empty() {
            kumo_vmm::outln!(
                "{:<10} seccomp: off (s), filtered/off ratio, min-max:{seccomp}",
                ""
            );
        }
    }
    kumo_vmm::outln!(
        "ratio = guest time / native time of the same benchmark, median over the pairs; \
         best ratio = fastest guest / fastest native"
    );
    if args.qemu {
        kumo_vmm::outln!("QEMU ratio = QEMU's guest time / the same round's native time");
    }
}

#[derive(Args, Debug)]
pub struct OverheadArgs {
    /// Benchmarks, comma-separated kernel.class items [default: every kernel, class S].
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// vCPUs of the guest and threads of the native run.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// Native/guest pairs per benchmark.
    #[arg(long, value_name = "R", default_value_t = 5)]
    pub runs: u32,

    /// Also run the same guest on QEMU (same vCPUs, memory and command line, RAM on a
    /// memfd as kumo's) in every round, after the native and kumo runs.
    #[arg(long)]
    pub qemu: bool,

    /// Both sides on the host's 2 MiB huge pages: the guest's RAM (`kumo --huge-pages`,
    /// and QEMU's with `--qemu`) and the native arena (`kumo native --huge-pages`).
    #[arg(long)]
    pub huge_pages: bool,

    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Also run the guest with every seccomp filter off in every round, right after the
    /// filtered guest (`--seccomp`'s mode, kill by default): the filters' cost.
    #[arg(long)]
    pub seccomp_off_too: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn ratios_are_taken_pairwise_not_from_the_medians() {
        // Pairwise ratios 2.0, 1.0, 0.5: median 1.0, although the medians give 2/2 too.
        let s = summarize(&[1.0, 2.0, 4.0], &[2.0, 2.0, 2.0]).unwrap();
        assert_eq!(s.ratio_median, 1.0);
        assert_eq!((s.ratio_min, s.ratio_max), (0.5, 2.0));
        assert_eq!((s.native_median, s.guest_median), (2.0, 2.0));
        assert_eq!(s.best_ratio, 2.0);
        // A slow pair moves the median ratio only as far as its rank allows.
        let s = summarize(&[1.0, 1.0, 1.0], &[1.01, 1.02, 5.0]).unwrap();
        assert_eq!(s.ratio_median, 1.02);
    }

    #[test]
    fn unpaired_or_empty_input_has_no_summary() {
        assert_eq!(summarize(&[], &[]), None);
        assert_eq!(summarize(&[1.0], &[1.0, 2.0]), None);
    }
}
