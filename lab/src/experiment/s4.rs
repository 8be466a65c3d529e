//! S4 on real VMs (`../shared/research/SEEDS.md`): what a directly assigned NIC, and a
//! fast path for its interrupts, buy an MPI job on a busy node, against bare metal.
//!
//! S4's four configurations, run time relative to bare metal: (1) bare metal, (2) VMs
//! under a tuned credit scheduler (1/1 ms, domain 0 at weight 1024) with paravirtual
//! I/O, (3) a passthrough NIC, (4) passthrough plus the fast interrupt path. Here: one
//! host CPU shared by both ranks of an NPB-MPI job and a competing domain running EP
//! (the node of `examples/s4-passthrough.toml`); ranks wait for messages by halting
//! until the NIC's interrupt, so the interrupt path is on every message's way.
//! (1) is the same NPB-MPI code as host threads (`kumo native --mpi-ranks`) confined to
//! that CPU beside a competing EP thread; (2) is kumo's emulated NIC (domain 0's switch,
//! generic interrupt path); (3) and (4) are ports of a `kumo nic-server` (vfio-user),
//! its interrupts through kumo's event loop (generic) or irqfds (fast). The scheduler
//! is the tuned one in (2) to (4), so only the NIC and the path change between them.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use npb::{Class, Kernel, Spec};
use serde::Serialize;

use super::{Summary, node_problems, run_interleaved, run_node_text, summary_cell};
use crate::experiment::ExperimentArgs;
use hv::irq::IrqPath;
use kumo_vmm::args::NicKind;

/// The job's ranks (one per VM) and the node's CPU.
const RANKS: u32 = 2;
const NODE_CPU: usize = 0;

/// One of S4's configurations.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Config {
    pub name: &'static str,
    /// None: bare metal (host threads).
    #[serde(skip)]
    nic: Option<(NicKind, IrqPath)>,
    /// S4's overhead over bare metal at class B, as a range of factors.
    pub paper: Option<(f64, f64)>,
}

pub const CONFIGS: &[Config] = &[
    Config {
        name: "bare metal",
        nic: None,
        paper: Some((1.0, 1.0)),
    },
    Config {
        name: "tuned credit, emulated NIC",
        nic: Some((NicKind::Emulated, IrqPath::Generic)),
        paper: None,
    },
    Config {
        name: "passthrough",
        nic: Some((NicKind::Passthrough, IrqPath::Generic)),
        paper: Some((1.05, 1.27)),
    },
    Config {
        name: "passthrough + fast path",
        nic: Some((NicKind::Passthrough, IrqPath::Fast)),
        paper: Some((1.01, 1.20)),
    },
];

/// CG, IS and FT (the MPI forms kumo has that communicate), class S with `--quick`,
/// else W.
pub fn benchmarks(quick: bool) -> Vec<Spec> {
    let class = if quick { Class::S } else { Class::W };
    let kernels: &[Kernel] = if quick {
        &[Kernel::Cg, Kernel::Is]
    } else {
        &[Kernel::Cg, Kernel::Is, Kernel::Ft]
    };
    kernels
        .iter()
        .map(|&kernel| Spec { kernel, class })
        .collect()
}

/// The competing domain's work: long enough to outlast the job.
const COMPETITOR: &str = "ep.A";

fn list(specs: &[Spec]) -> String {
    specs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The node file of a VM configuration.
pub fn node_toml(nic: NicKind, path: IrqPath, specs: &[Spec]) -> String {
    format!(
        "pcpus = [{NODE_CPU}]\n[scheduler]\nkind = \"credit\"\ntslice_ms = 1\ntick_ms = 1\n\
         [dom0]\nweight = 1024\n[network]\nnpb = \"{}\"\nwait = \"block\"\nirq_path = \"{}\"\n\
         nic = \"{}\"\n[[domain]]\nname = \"rank0\"\nmpi = true\n[[domain]]\nname = \"rank1\"\n\
         mpi = true\n[[domain]]\nname = \"competitor\"\nnpb = \"{COMPETITOR}\"\n",
        list(specs),
        path.name(),
        nic.name(),
    )
}

/// One run of one configuration: each benchmark's time and verdict.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub config: &'static str,
    pub round: u32,
    pub results: Vec<(String, Option<f64>, bool)>,
    /// Domain 0's CPU seconds (VM configurations).
    pub dom0_cpu_s: Option<f64>,
    pub problems: Vec<String>,
}

fn vm_run(
    config: &Config,
    nic: NicKind,
    path: IrqPath,
    specs: &[Spec],
    round: u32,
    kvm_device: &Path,
    epoch: Instant,
) -> Result<Run> {
    let outcome = run_node_text(&node_toml(nic, path, specs), kvm_device, epoch)
        .with_context(|| format!("configuration '{}'", config.name))?;
    let rank0 = outcome.reports.iter().find(|r| r.domain.name == "rank0");
    let results = specs
        .iter()
        .map(|spec| {
            let result = rank0.and_then(|r| {
                r.verdict
                    .rows
                    .iter()
                    .find(|row| row.spec == *spec)
                    .and_then(|row| row.result.clone())
            });
            (
                spec.to_string(),
                result.as_ref().map(|r| r.time_s),
                result.is_some_and(|r| r.verified),
            )
        })
        .collect();
    Ok(Run {
        config: config.name,
        round,
        results,
        dom0_cpu_s: Some(outcome.overhead.dom0.as_secs_f64()),
        problems: node_problems(&outcome),
    })
}

/// Bare metal: the ranks as host threads and a competing EP thread, all confined to
/// the node's CPU.
fn native_run(config: &Config, specs: &[Spec], round: u32) -> Result<Run> {
    let confine = |cpus: &[usize]| {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        hv::placement::confine_thread(tid, cpus)
    };
    let everywhere = hv::placement::process_cpus();
    confine(&[NODE_CPU]).context("confining the native ranks")?;
    let competitor_spec: Spec = COMPETITOR.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let results = std::thread::scope(|scope| {
        // Spawned threads inherit the confinement.
        let competitor = scope.spawn(|| crate::native::run_one(competitor_spec, 1));
        let results: Vec<_> = specs
            .iter()
            .map(|&spec| match crate::native::run_one_mpi(spec, RANKS) {
                Ok(r) => (spec.to_string(), Some(r.time_s), r.verified),
                Err(_) => (spec.to_string(), None, false),
            })
            .collect();
        let _ = competitor.join();
        results
    });
    confine(&everywhere).context("releasing the native ranks")?;
    Ok(Run {
        config: config.name,
        round,
        results,
        dom0_cpu_s: None,
        problems: Vec::new(),
    })
}

/// A row of the table: a benchmark under a configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub benchmark: String,
    pub config: Config,
    pub time_s: Option<Summary>,
    /// Median time over bare metal's median.
    pub relative: Option<f64>,
    pub verified: bool,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub experiment: &'static str,
    pub quick: bool,
    pub runs_per_config: u32,
    pub rows: Vec<Row>,
    pub runs: Vec<Run>,
    pub ok: bool,
}

pub fn rows(specs: &[Spec], runs: &[Run]) -> Vec<Row> {
    let times = |config: &str, bench: &str| -> Vec<(f64, bool)> {
        runs.iter()
            .filter(|r| r.config == config)
            .flat_map(|r| r.results.iter())
            .filter(|(b, _, _)| b == bench)
            .map(|(_, t, v)| (t.unwrap_or(f64::NAN), *v))
            .collect()
    };
    let mut out = Vec::new();
    for spec in specs {
        let bench = spec.to_string();
        let base = Summary::of(
            &times(CONFIGS[0].name, &bench)
                .iter()
                .map(|(t, _)| *t)
                .collect::<Vec<_>>(),
        );
        for config in CONFIGS {
            let mine = times(config.name, &bench);
            let time = Summary::of(&mine.iter().map(|(t, _)| *t).collect::<Vec<_>>());
            out.push(Row {
                benchmark: bench.clone(),
                config: *config,
                time_s: time,
                relative: match (time, base) {
                    (Some(t), Some(b)) if b.median > 0.0 => Some(t.median / b.median),
                    _ => None,
                },
                verified: !mine.is_empty() && mine.iter().all(|(t, v)| *v && t.is_finite()),
            });
        }
    }
    out
}

pub fn run(args: &ExperimentArgs, epoch: Instant) -> Result<u8> {
    let specs = benchmarks(args.quick);
    let names: Vec<&str> = CONFIGS.iter().map(|c| c.name).collect();
    let runs = run_interleaved(&names, args.runs, |item, round| {
        let config = &CONFIGS[item];
        match config.nic {
            None => native_run(config, &specs, round),
            Some((nic, path)) => vm_run(config, nic, path, &specs, round, &args.kvm_device, epoch),
        }
    })?;
    let rows = rows(&specs, &runs);
    let complete = runs.len() == CONFIGS.len() * args.runs as usize;
    let ok = complete && rows.iter().all(|r| r.verified);
    let report = Report {
        experiment: "s4",
        quick: args.quick,
        runs_per_config: args.runs,
        rows,
        runs,
        ok,
    };
    let problems: Vec<String> = report
        .runs
        .iter()
        .flat_map(|run| {
            run.problems
                .iter()
                .map(move |p| format!("{} (run {}): {p}", run.config, run.round + 1))
        })
        .collect();
    super::conclude(
        args,
        &report,
        text,
        |r| Ok(vec![("s4.svg", figure(r)?)]),
        &problems,
        ok,
    )
}

/// Run time relative to bare metal: a group per benchmark, a bar per configuration.
pub fn figure(report: &Report) -> Result<String> {
    let mut benchmarks: Vec<String> = Vec::new();
    for row in &report.rows {
        if !benchmarks.contains(&row.benchmark) {
            benchmarks.push(row.benchmark.clone());
        }
    }
    let series: Vec<super::plot::BarSeries> = CONFIGS
        .iter()
        .map(|config| super::plot::BarSeries {
            name: config.name.to_string(),
            values: benchmarks
                .iter()
                .map(|b| {
                    report
                        .rows
                        .iter()
                        .find(|r| &r.benchmark == b && r.config.name == config.name)
                        .and_then(|r| r.relative)
                })
                .collect(),
        })
        .collect();
    super::plot::bars(
        "S4 on real VMs: run time on a busy host CPU, relative to bare metal",
        "time / bare metal's",
        &benchmarks,
        &series,
    )
}

/// The table beside S4's figures.
pub fn text(report: &Report) -> String {
    let mut out = format!(
        "S4 on real VMs: {RANKS} ranks (one per VM, halting until the NIC's interrupt) and a \
         competing {COMPETITOR} on host CPU {NODE_CPU}; {} run(s) per configuration, \
         medians [min-max]\n\n",
        report.runs_per_config
    );
    let mut table = vec![
        [
            "benchmark",
            "configuration",
            "time (s)",
            "vs bare metal",
            "S4 (class B)",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for r in &report.rows {
        table.push(vec![
            r.benchmark.clone(),
            r.config.name.to_string(),
            summary_cell(r.time_s),
            r.relative.map_or("-".into(), |x| format!("{x:.2}x")),
            match r.config.paper {
                Some((lo, hi)) if lo == hi => format!("{lo:.2}x"),
                Some((lo, hi)) => format!("{lo:.2}-{hi:.2}x"),
                None => "-".into(),
            },
        ]);
    }
    out.push_str(&kumo_vmm::output::table(&table, 2));
    out.push_str(
        "\nS4: Xen 3.4.3, 8 nodes x 64 processes, an Intel 82574L GbE passed through, NPB \
         class B; (4) was 1-6 % faster than (3) and beat (2) except for FT and CG at class C.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vm_configuration_is_a_valid_node() {
        for config in CONFIGS {
            let Some((nic, path)) = config.nic else {
                continue;
            };
            let text = node_toml(nic, path, &benchmarks(true));
            let n = kumo_vmm::spec::node::parse(&text).unwrap_or_else(|e| panic!("{text}\n{e:#}"));
            let net = n.network.as_ref().unwrap();
            assert_eq!((net.nic, net.irq_path), (nic, path));
            assert_eq!(n.dom0_weight, 1024);
            assert_eq!(n.domains.len(), 3);
        }
    }

    #[test]
    fn rows_are_relative_to_bare_metal() {
        let run = |config: &'static str, t: f64| Run {
            config,
            round: 0,
            results: vec![("cg.S".into(), Some(t), true)],
            dom0_cpu_s: None,
            problems: vec![],
        };
        let runs = vec![
            run("bare metal", 1.0),
            run("tuned credit, emulated NIC", 1.5),
            run("passthrough", 1.25),
        ];
        let rows = rows(&["cg.S".parse().unwrap()], &runs);
        let get = |name: &str| rows.iter().find(|r| r.config.name == name).unwrap();
        assert_eq!(get("bare metal").relative, Some(1.0));
        assert_eq!(get("tuned credit, emulated NIC").relative, Some(1.5));
        assert_eq!(get("passthrough").relative, Some(1.25));
        assert!(
            !get("passthrough + fast path").verified,
            "no runs: not verified"
        );
    }
}
