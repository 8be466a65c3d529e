//! S2 on real VMs (`../shared/research/SEEDS.md`): what a VM's NIC costs an MPI
//! message, as IMB PingPong and a streaming test measure it, directly assigned against
//! paravirtual, beside bare metal.
//!
//! Two ranks of kumo's guest MPI (`guests/user/src/mpi.rs`) exchange messages of 8 B to
//! 1 MiB: half round trip (one-way latency, median of the rounds) and streaming
//! throughput (bursts of 64 messages, each burst answered with 4 bytes), ranks
//! busy-polling as MPI libraries do. Configurations: bare metal (the same MPI on two
//! host threads, frames through memory: no NIC, no VM, no exit), two VMs with kumo's
//! emulated NIC (domain 0's switch), and two VMs with ports of a `kumo nic-server`
//! (vfio-user passthrough), generic and fast interrupt path. S2's numbers come from a
//! hardware InfiniBand NIC whose latency is common to all its rows; this bare metal has
//! no wire at all, so kumo's ratios measure the whole software NIC path.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use super::{Summary, run_interleaved, summary_cell};
use crate::experiment::ExperimentArgs;
use crate::guest_mpi::{self, Mpi, Wait};
use crate::loopback::{MemoryLink, Wire};
use hv::irq::IrqPath;
use kumo_vmm::args::NicKind;
use kumo_vmm::protocol::Event;

/// Message sizes (IMB's powers of two, thinned).
pub const SIZES: &[u64] = &[8, 128, 1024, 8192, 65536, 1 << 20];
pub const QUICK_SIZES: &[u64] = &[8, 1024, 65536];
/// `--quick`: this many ping-pong rounds and streaming bursts per size (the guest's
/// `net_rounds=`), instead of about 32 MiB of ping-pong and 64 MiB of stream.
pub const QUICK_ROUNDS: usize = 50;

/// One of S2's configurations: bare metal, or two VMs with a NIC on a path.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Config {
    pub name: &'static str,
    #[serde(skip)]
    nic: Option<(NicKind, IrqPath)>,
}

pub const CONFIGS: &[Config] = &[
    Config {
        name: "bare metal",
        nic: None,
    },
    Config {
        name: "emulated NIC",
        nic: Some((NicKind::Emulated, IrqPath::Generic)),
    },
    Config {
        name: "passthrough",
        nic: Some((NicKind::Passthrough, IrqPath::Generic)),
    },
    Config {
        name: "passthrough + fast path",
        nic: Some((NicKind::Passthrough, IrqPath::Fast)),
    },
];

/// S2's one-way latency, inter-node, µs: bare metal, Xen, KVM (InfiniBand passed through).
pub const PAPER_LATENCY_US: [(&str, f64); 3] =
    [("bare metal", 1.79), ("Xen 3.4.3", 3.30), ("KVM", 1.71)];
/// S2's throughput of 1 GB messages before passthrough, MB/s (paravirtual and emulated).
pub const PAPER_PV_MBPS: [(&str, f64); 4] = [
    ("bare metal", 967.0),
    ("Xen PV", 305.0),
    ("Xen HVM", 175.0),
    ("KVM virtio", 98.0),
];

/// What one run of a configuration measured, per size (in [`Report::sizes`] order).
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub config: &'static str,
    pub round: u32,
    pub latency_us: Vec<f64>,
    pub mbps: Vec<f64>,
}

/// A configuration at one size over every run.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub config: &'static str,
    pub size: u64,
    pub latency_us: Option<Summary>,
    pub mbps: Option<Summary>,
    /// Median latency over bare metal's, and median throughput over bare metal's.
    pub latency_vs_bare: Option<f64>,
    pub mbps_vs_bare: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub experiment: &'static str,
    pub quick: bool,
    pub runs_per_config: u32,
    pub sizes: Vec<u64>,
    pub rows: Vec<Row>,
    pub runs: Vec<Run>,
    pub ok: bool,
}

/// Ping-pong rounds and streaming bursts of a size, as the guest counts them
/// (`pingpong:`, `bw:` and `net_rounds=` in docs/guest-abi.md).
fn counts(size: u64, rounds: Option<usize>) -> (usize, usize) {
    rounds.map_or_else(
        || {
            (
                ((32u64 << 20) / size.max(16_384) + 10) as usize,
                ((64u64 << 20) / (size.max(1024) * BURST as u64)).max(2) as usize,
            )
        },
        |r| (r, r),
    )
}
const BURST: usize = 64;

/// Bare metal: the guest's MPI on two host threads over the in-memory wire, the guest's
/// ping-pong and streaming loops.
fn bare_metal(sizes: &[u64], rounds: Option<usize>, round: u32) -> Result<Run> {
    let largest = sizes.iter().copied().max().unwrap_or(8) as usize;
    let results =
        crate::loopback::run_ranks_with(Wire::new(2, 0), 1 << 20, Wait::Spin, |rank, mpi| {
            measure_loopback(mpi, rank, sizes, rounds, largest)
        });
    let mut latency_us = Vec::new();
    let mut mbps = Vec::new();
    for (result, _) in results {
        let (lat, bw) = result.map_err(|e| anyhow::anyhow!("bare metal: the MPI failed: {e:?}"))?;
        if !lat.is_empty() {
            (latency_us, mbps) = (lat, bw);
        }
    }
    Ok(Run {
        config: CONFIGS[0].name,
        round,
        latency_us,
        mbps,
    })
}

/// Rank 0's half round trips (median, µs) and throughputs (MB/s) per size; rank 1
/// answers and returns nothing.
fn measure_loopback(
    mpi: &mut Mpi<MemoryLink>,
    rank: usize,
    sizes: &[u64],
    rounds: Option<usize>,
    largest: usize,
) -> Result<(Vec<f64>, Vec<f64>), guest_mpi::Error> {
    let out = vec![0x5Au8; largest];
    let mut inn = vec![0u8; largest];
    let (mut latency, mut mbps) = (Vec::new(), Vec::new());
    for &size in sizes {
        let len = size as usize;
        let (pingpongs, bursts) = counts(size, rounds);
        mpi.barrier()?;
        let mut samples = Vec::with_capacity(pingpongs);
        for i in 0..pingpongs + 5 {
            let t = Instant::now();
            if rank == 0 {
                mpi.send(1, 1, &out[..len])?;
                mpi.recv(1, 2, &mut inn[..len])?;
            } else {
                mpi.recv(0, 1, &mut inn[..len])?;
                mpi.send(0, 2, &out[..len])?;
            }
            if i >= 5 {
                samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
            }
        }
        mpi.barrier()?;
        let start = Instant::now();
        for _ in 0..bursts {
            if rank == 0 {
                for _ in 0..BURST {
                    mpi.send(1, 3, &out[..len])?;
                }
                mpi.recv(1, 4, &mut inn[..4])?;
            } else {
                for _ in 0..BURST {
                    mpi.recv(0, 3, &mut inn[..len])?;
                }
                mpi.send(0, 4, &out[..4])?;
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        if rank == 0 {
            latency.push(Summary::of(&samples).map_or(f64::NAN, |s| s.median));
            mbps.push((bursts * BURST) as f64 * size as f64 / seconds / 1e6);
        }
    }
    Ok((latency, mbps))
}

/// Two VMs of one vCPU with `nic` on `path`: the guest's `pingpong:` and `bw:` items.
fn vms(
    config: &Config,
    (nic, path): (NicKind, IrqPath),
    sizes: &[u64],
    rounds: Option<usize>,
    round: u32,
    kvm_device: &std::path::Path,
    epoch: Instant,
) -> Result<Run> {
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let list = list.join(",");
    let mut extra = format!("wait=spin net=pingpong:{list}+bw:{list}");
    if let Some(rounds) = rounds {
        extra.push_str(&format!(" net_rounds={rounds}"));
    }
    let job = kumo_vmm::job::Job {
        nic,
        ..Default::default()
    };
    let runs = kumo_vmm::job::run_job(2, 1, path, &extra, &job, kvm_device, epoch)
        .with_context(|| format!("{}: the VMs", config.name))?
        .runs;
    let value = |kind: &str, field: &str, size: u64| -> Result<f64> {
        runs[0]
            .events
            .iter()
            .find_map(|e| match e {
                Event::Measurement { kind: k, fields }
                    if k == kind && fields.get("size") == Some(&size.to_string()) =>
                {
                    fields.get(field)?.parse::<f64>().ok()
                }
                _ => None,
            })
            .with_context(|| {
                let problems = runs[0].judge(&[], 1).problems.join("; ");
                format!(
                    "{}: rank 0 reported no {kind} {field} for {size} bytes ({problems})",
                    config.name
                )
            })
    };
    let mut run = Run {
        config: config.name,
        round,
        latency_us: Vec::new(),
        mbps: Vec::new(),
    };
    for &size in sizes {
        run.latency_us.push(value("pingpong", "median_us", size)?);
        run.mbps.push(value("bandwidth", "mbps", size)?);
    }
    Ok(run)
}

pub fn rows(sizes: &[u64], runs: &[Run]) -> Vec<Row> {
    let summary = |config: &str, i: usize, pick: fn(&Run) -> &Vec<f64>| {
        let values: Vec<f64> = runs
            .iter()
            .filter(|r| r.config == config)
            .filter_map(|r| pick(r).get(i).copied())
            .collect();
        Summary::of(&values)
    };
    let ratio = |a: Option<Summary>, b: Option<Summary>| match (a, b) {
        (Some(a), Some(b)) if b.median > 0.0 => Some(a.median / b.median),
        _ => None,
    };
    let mut out = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let bare_latency = summary(CONFIGS[0].name, i, |r| &r.latency_us);
        let bare_mbps = summary(CONFIGS[0].name, i, |r| &r.mbps);
        for config in CONFIGS {
            let latency_us = summary(config.name, i, |r| &r.latency_us);
            let mbps = summary(config.name, i, |r| &r.mbps);
            out.push(Row {
                config: config.name,
                size,
                latency_us,
                mbps,
                latency_vs_bare: ratio(latency_us, bare_latency),
                mbps_vs_bare: ratio(mbps, bare_mbps),
            });
        }
    }
    out
}

pub fn run(args: &ExperimentArgs, epoch: Instant) -> Result<u8> {
    let (sizes, rounds) = if args.quick {
        (QUICK_SIZES, Some(QUICK_ROUNDS))
    } else {
        (SIZES, None)
    };
    let names: Vec<&str> = CONFIGS.iter().map(|c| c.name).collect();
    let runs = run_interleaved(&names, args.runs, |item, round| {
        let config = &CONFIGS[item];
        match config.nic {
            None => bare_metal(sizes, rounds, round),
            Some(nic) => vms(config, nic, sizes, rounds, round, &args.kvm_device, epoch),
        }
    })?;
    let complete = runs.len() == CONFIGS.len() * args.runs as usize;
    if !complete {
        bail!("the experiment was stopped before every run finished");
    }
    let report = Report {
        experiment: "s2",
        quick: args.quick,
        runs_per_config: args.runs,
        sizes: sizes.to_vec(),
        rows: rows(sizes, &runs),
        runs,
        ok: complete,
    };
    super::conclude(
        args,
        &report,
        text,
        |r| {
            let latency = super::plot::lines(
                "S2: one-way latency (half round trip), kumo's guest MPI, 2 ranks",
                "message size (bytes)",
                "latency (µs)",
                &series(r, |r| r.latency_us),
            )?;
            let throughput = super::plot::lines(
                "S2: streaming throughput, kumo's guest MPI, 2 ranks",
                "message size (bytes)",
                "throughput (MB/s)",
                &series(r, |r| r.mbps),
            )?;
            Ok(vec![
                ("s2-latency.svg", latency),
                ("s2-throughput.svg", throughput),
            ])
        },
        &[],
        true,
    )
}

/// One line per configuration: (size, median) points.
fn series(report: &Report, pick: fn(&Row) -> Option<Summary>) -> Vec<super::plot::Line> {
    CONFIGS
        .iter()
        .map(|config| super::plot::Line {
            name: config.name.to_string(),
            points: report
                .rows
                .iter()
                .filter(|r| r.config == config.name)
                .filter_map(|r| Some((r.size as f64, pick(r)?.median)))
                .collect(),
        })
        .collect()
}

/// The tables beside S2's numbers.
pub fn text(report: &Report) -> String {
    let mut out = format!(
        "S2 on real VMs: 2 ranks of kumo's guest MPI, busy-polling; {} run(s) per \
         configuration, medians [min-max]\n\n",
        report.runs_per_config
    );
    for (title, unit, pick, vs) in [
        (
            "one-way latency",
            "µs",
            (|r: &Row| r.latency_us) as fn(&Row) -> Option<Summary>,
            (|r: &Row| r.latency_vs_bare) as fn(&Row) -> Option<f64>,
        ),
        (
            "throughput",
            "MB/s",
            |r: &Row| r.mbps,
            |r: &Row| r.mbps_vs_bare,
        ),
    ] {
        out.push_str(&format!("{title} ({unit}; x bare metal)\n"));
        let mut table = vec![
            std::iter::once("size".to_string())
                .chain(CONFIGS.iter().map(|c| c.name.to_string()))
                .collect::<Vec<_>>(),
        ];
        for &size in &report.sizes {
            let mut line = vec![size_name(size)];
            for config in CONFIGS {
                let row = report
                    .rows
                    .iter()
                    .find(|r| r.config == config.name && r.size == size);
                line.push(match row {
                    Some(r) if config.nic.is_none() => summary_cell(pick(r)),
                    Some(r) => format!(
                        "{} ({})",
                        summary_cell(pick(r)),
                        vs(r).map_or("-".into(), |x| format!("{x:.2}x"))
                    ),
                    None => "-".into(),
                });
            }
            table.push(line);
        }
        out.push_str(&kumo_vmm::output::table(&table, 1));
        out.push('\n');
    }
    let bare = PAPER_LATENCY_US[0].1;
    out.push_str("S2 (IMB PingPong, ConnectX QDR InfiniBand passed through, inter-node):\n");
    for (name, us) in PAPER_LATENCY_US {
        out.push_str(&format!("  {name}: {us:.2} µs ({:.2}x)\n", us / bare));
    }
    out.push_str("S2 before passthrough, 1 GB messages (paravirtual and emulated NICs):\n");
    let bare = PAPER_PV_MBPS[0].1;
    for (name, mbps) in PAPER_PV_MBPS {
        out.push_str(&format!("  {name}: {mbps:.0} MB/s ({:.2}x)\n", mbps / bare));
    }
    out.push_str(
        "With passthrough S2's throughput was close to bare metal (~2.5 GB/s MPI). Here bare \
         metal has no wire at all (frames through memory), so kumo's ratios hold the whole \
         software NIC path: exits, the device model, the switch or NIC server, interrupts.\n",
    );
    out
}

fn size_name(size: u64) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_relative_to_bare_metal_at_each_size() {
        let run = |config: &'static str, lat: [f64; 2], mbps: [f64; 2]| Run {
            config,
            round: 0,
            latency_us: lat.to_vec(),
            mbps: mbps.to_vec(),
        };
        let runs = vec![
            run("bare metal", [1.0, 10.0], [100.0, 1000.0]),
            run("emulated NIC", [20.0, 40.0], [10.0, 500.0]),
        ];
        let rows = rows(&[8, 1024], &runs);
        let get = |config: &str, size: u64| {
            rows.iter()
                .find(|r| r.config == config && r.size == size)
                .unwrap()
        };
        assert_eq!(get("emulated NIC", 8).latency_vs_bare, Some(20.0));
        assert_eq!(get("emulated NIC", 1024).latency_vs_bare, Some(4.0));
        assert_eq!(get("emulated NIC", 1024).mbps_vs_bare, Some(0.5));
        assert!(get("passthrough", 8).latency_us.is_none(), "no runs");
        assert_eq!(size_name(1 << 20), "1 MiB");
        assert_eq!(size_name(8192), "8 KiB");
        assert_eq!(size_name(128), "128 B");
    }

    #[test]
    fn bare_metal_measures_every_size() {
        let run = bare_metal(&[8, 4096], Some(20), 0).unwrap();
        assert_eq!(run.latency_us.len(), 2);
        assert!(run.latency_us.iter().all(|&us| us > 0.0), "{run:?}");
        assert!(run.mbps.iter().all(|&m| m > 0.0), "{run:?}");
    }
}
