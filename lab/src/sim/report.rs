//! What `kumo sim` prints: per run (program x scenario) the completion time, the
//! speed-up over the program's first scenario, busy-waiting, domain 0's CPU and
//! context switches, then each domain's CPU time; or all of it as one JSON object.
//! Nothing host-dependent is printed (no wall-clock time), so the same file gives
//! the same bytes.

use serde::Serialize;

use super::config::{DOM0, Program, Scenario, Sim};
use super::model::{Outcome, Usage};
use kumo_vmm::spec::sched as sched_params;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Everything a `kumo sim` invocation found.
#[derive(Debug, Serialize)]
pub struct Report {
    pub runs: Vec<Run>,
}

#[derive(Debug, Serialize)]
pub struct Run {
    pub program: String,
    pub scenario: String,
    pub tslice_ms: f64,
    pub tick_ms: f64,
    pub ratelimit_us: u64,
    pub directed_yield: bool,
    pub wait: &'static str,
    /// Every rank finished before `duration_s`.
    pub finished: bool,
    /// When the last rank finished (absent if not all did).
    pub time_s: Option<f64>,
    /// Simulated time covered: `time_s`, or the duration when cut.
    pub simulated_s: f64,
    /// The program's first scenario's time over this one's (1.45 = 45 % faster).
    pub speedup: Option<f64>,
    pub busy_wait_s: f64,
    pub dom0_cpu_s: f64,
    pub switches: u64,
    pub messages: u64,
    pub events: u64,
    pub directed_boosts: u64,
    /// Guest ticks delivered and rank switches inside the guests (absent when no
    /// domain models a guest scheduler).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_ticks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_switches: Option<u64>,
    /// Messages lost for a full receive ring and resent (absent with an unlimited
    /// ring, `rx_ring_frames = 0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_messages: Option<u64>,
    /// With the auto slice (`auto_slice = true`): the share of its epochs that ran
    /// the short setting, and its changes of setting, over all nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_short_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_changes: Option<u64>,
    pub domains: Vec<DomainRow>,
    pub ranks: Vec<RankRow>,
}

#[derive(Debug, Serialize)]
pub struct DomainRow {
    pub node: String,
    pub domain: String,
    pub weight: u32,
    pub cap: u32,
    /// Ranks per vCPU and the guest's tick in this run (absent: one rank, no tick).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks_per_vcpu: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_hz: Option<u32>,
    /// The guest's slice in ticks, where longer than one tick.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_slice_ticks: Option<u32>,
    pub cpu_s: f64,
    pub work_s: f64,
    pub busy_wait_s: f64,
    /// Switch and tick costs, the guest's ticks and rank switches.
    pub overhead_s: f64,
}

#[derive(Debug, Serialize)]
pub struct RankRow {
    pub rank: usize,
    pub node: String,
    pub domain: String,
    pub finish_s: Option<f64>,
    pub cpu_s: f64,
    pub busy_wait_s: f64,
}

impl Run {
    pub fn new(sim: &Sim, program: &Program, scenario: &Scenario, o: &Outcome) -> Self {
        let view = sched_params::view(scenario.params);
        let mut domains = Vec::new();
        let mut total = Usage::default();
        let mut dom0 = 0;
        let mut guest = false;
        for (n, node) in sim.nodes.iter().enumerate() {
            for (d, domain) in node.domains.iter().enumerate() {
                let u = o.domains[n][d];
                if d == 0 {
                    dom0 += u.cpu_ns;
                } else {
                    total.spin_ns += u.spin_ns;
                }
                let (weight, cap) = scenario.shares[n][d];
                // Domain 0 runs no ranks, so no guest scheduler.
                let (hz, slice) = scenario.guest(domain);
                let guest_hz = hz.filter(|_| d != 0);
                guest |= guest_hz.is_some();
                domains.push(DomainRow {
                    node: node.name.clone(),
                    domain: domain.name.clone(),
                    weight,
                    cap,
                    ranks_per_vcpu: (domain.ranks_per_vcpu > 1 || guest_hz.is_some())
                        .then_some(domain.ranks_per_vcpu),
                    guest_hz,
                    guest_slice_ticks: (guest_hz.is_some() && slice > 1).then_some(slice),
                    cpu_s: secs(u.cpu_ns),
                    work_s: secs(u.work_ns),
                    busy_wait_s: secs(u.spin_ns),
                    overhead_s: secs(u.overhead_ns),
                });
            }
        }
        let ranks = o
            .ranks
            .iter()
            .zip(&sim.ranks)
            .enumerate()
            .map(|(r, (ro, place))| RankRow {
                rank: r,
                node: sim.nodes[place.node].name.clone(),
                domain: sim.nodes[place.node].domains[place.domain].name.clone(),
                finish_s: ro.finish_ns.map(secs),
                cpu_s: secs(ro.usage.cpu_ns),
                busy_wait_s: secs(ro.usage.spin_ns),
            })
            .collect();
        Run {
            program: program.name.clone(),
            scenario: scenario.name.clone(),
            tslice_ms: view.tslice_ms,
            tick_ms: view.tick_ms,
            ratelimit_us: view.ratelimit_us,
            directed_yield: view.directed_yield,
            wait: scenario.wait.unwrap_or(program.wait).name(),
            finished: o.finished,
            time_s: o.finished.then(|| secs(o.end_ns)),
            simulated_s: secs(o.end_ns),
            speedup: None,
            busy_wait_s: secs(total.spin_ns),
            dom0_cpu_s: secs(dom0),
            switches: o.switches.iter().sum(),
            messages: o.messages,
            events: o.events,
            directed_boosts: o.directed_boosts,
            guest_ticks: guest.then_some(o.guest_ticks),
            guest_switches: guest.then_some(o.guest_switches),
            lost_messages: (sim.costs.rx_ring_frames > 0.0).then_some(o.lost),
            auto_short_share: o.auto_slice.as_ref().map(|nodes| {
                let (epochs, short) = nodes
                    .iter()
                    .fold((0, 0), |(e, s), &(ne, ns, _)| (e + ne, s + ns));
                if epochs == 0 {
                    0.0
                } else {
                    short as f64 / epochs as f64
                }
            }),
            auto_changes: o
                .auto_slice
                .as_ref()
                .map(|nodes| nodes.iter().map(|&(_, _, c)| c as u64).sum()),
            domains,
            ranks,
        }
    }
}

impl Report {
    /// Fills in each run's speed-up over its program's first scenario.
    pub fn new(mut runs: Vec<Run>) -> Self {
        for i in 0..runs.len() {
            let first = runs.iter().find(|r| r.program == runs[i].program);
            let base = first.and_then(|r| r.time_s);
            runs[i].speedup = match (base, runs[i].time_s) {
                (Some(b), Some(t)) if t > 0.0 => Some(b / t),
                _ => None,
            };
        }
        Report { runs }
    }

    pub fn json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    pub fn text(&self) -> String {
        let mut main = vec![
            [
                "program",
                "scenario",
                "slice",
                "tick",
                "ratelimit",
                "wait",
                "dom0 w",
                "time (s)",
                "speed-up",
                "busy-wait (s)",
                "dom0 cpu (s)",
                "switches",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for run in &self.runs {
            let dom0_weights: Vec<u32> = run
                .domains
                .iter()
                .filter(|d| d.domain == DOM0)
                .map(|d| d.weight)
                .collect();
            let dom0_w = if dom0_weights.windows(2).all(|w| w[0] == w[1]) {
                dom0_weights.first().map_or("-".into(), u32::to_string)
            } else {
                "mixed".into()
            };
            main.push(vec![
                run.program.clone(),
                run.scenario.clone(),
                format!("{} ms", run.tslice_ms),
                format!("{} ms", run.tick_ms),
                format!("{} us", run.ratelimit_us),
                run.wait.into(),
                dom0_w,
                match run.time_s {
                    Some(t) => format!("{t:.3}"),
                    None => format!(">{:.3}", run.simulated_s),
                },
                match run.speedup {
                    Some(s) => format!("{:+.1} %", (s - 1.0) * 100.0),
                    None => "-".into(),
                },
                format!("{:.3}", run.busy_wait_s),
                format!("{:.3}", run.dom0_cpu_s),
                run.switches.to_string(),
            ]);
        }
        let mut out = kumo_vmm::output::table(&main, 2);
        out.push_str(
            "time: simulated completion (max over ranks; '>' = cut at duration_s); speed-up \
             over the program's first scenario; busy-wait: domain CPU spent spinning\n\n",
        );
        let Some(first) = self.runs.first() else {
            return out;
        };
        let mut header = vec!["program".to_string(), "scenario".to_string()];
        header.extend(
            first
                .domains
                .iter()
                .map(|d| format!("{}/{}", d.node, d.domain)),
        );
        let mut cpu = vec![header];
        for run in &self.runs {
            let mut row = vec![run.program.clone(), run.scenario.clone()];
            row.extend(run.domains.iter().map(|d| {
                if d.domain == DOM0 {
                    format!("{:.3}", d.cpu_s)
                } else {
                    format!("{:.3} ({:.3})", d.cpu_s, d.busy_wait_s)
                }
            }));
            cpu.push(row);
        }
        out.push_str("CPU time per domain in s (busy-waiting in brackets)\n");
        out.push_str(&kumo_vmm::output::table(&cpu, 2));
        let mut guests = vec![
            ["program", "scenario", "guest ticks", "rank switches"]
                .map(String::from)
                .to_vec(),
        ];
        for run in &self.runs {
            if let (Some(ticks), Some(switches)) = (run.guest_ticks, run.guest_switches) {
                guests.push(vec![
                    run.program.clone(),
                    run.scenario.clone(),
                    ticks.to_string(),
                    switches.to_string(),
                ]);
            }
        }
        if guests.len() > 1 {
            out.push_str("\nGuest schedulers (several ranks per vCPU, or a guest tick)\n");
            out.push_str(&kumo_vmm::output::table(&guests, 2));
        }
        out
    }
}
