//! `kumo sim`: the credit scheduler (`sched`, the very code that places real vCPUs)
//! driving a modelled cluster, to explore settings faster than real runs can: S1's
//! question of how the slice, the tick and domain 0's weight change an MPI code whose
//! ranks busy-wait. [`config`] is the file, [`model`] the cluster.

pub mod config;
pub mod model;

use std::time::Instant;

use anyhow::Result;
use serde_json::{Value, json};

use crate::cli::SimArgs;
use crate::sched_params;

pub fn run_sim(args: &SimArgs) -> Result<u8> {
    let sim = config::load(&args.config)?;
    let mut rows = Vec::new();
    let mut baseline = None;
    for scenario in &sim.scenarios {
        let started = Instant::now();
        let outcome = model::simulate(&sim, scenario)?;
        let host_s = started.elapsed().as_secs_f64();
        let time_s = outcome.makespan_ns as f64 / 1e9;
        let base = *baseline.get_or_insert(time_s);
        rows.push(row(scenario, &outcome, time_s, base / time_s, host_s));
    }
    print(&rows, args.json);
    Ok(0)
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn row(
    scenario: &config::Scenario,
    outcome: &model::Outcome,
    time_s: f64,
    speedup: f64,
    host_s: f64,
) -> Value {
    let view = sched_params::view(scenario.params);
    json!({
        "scenario": scenario.name,
        "tslice_ms": view.tslice_ms,
        "tick_ms": view.tick_ms,
        "ratelimit_us": view.ratelimit_us,
        "dom0_weight": scenario.dom0_weight,
        "finished": outcome.finished,
        "time_s": time_s,
        "speedup": speedup,
        "switches": outcome.switches,
        "messages": outcome.messages,
        "events": outcome.steps,
        "host_s": host_s,
        "domains": outcome.domains.iter().map(|d| json!({
            "node": d.node,
            "domain": d.name,
            "weight": d.weight,
            "cpu_s": secs(d.cpu_ns),
            "spin_s": secs(d.spin_ns),
        })).collect::<Vec<_>>(),
        "dom0": outcome.dom0.iter().map(|d| json!({
            "node": d.node,
            "weight": scenario.dom0_weight.unwrap_or(d.weight),
            "cpu_s": secs(d.cpu_ns),
        })).collect::<Vec<_>>(),
    })
}

fn print(rows: &[Value], as_json: bool) {
    if as_json {
        for row in rows {
            println!("{row}");
        }
        return;
    }
    println!(
        "{:<20} {:>7} {:>7} {:>6} {:>10} {:>8} {:>9} {:>9} {:>9} {:>8}",
        "scenario",
        "slice",
        "tick",
        "dom0w",
        "time (s)",
        "speedup",
        "spin (s)",
        "dom0 (s)",
        "switches",
        "host (s)"
    );
    for row in rows {
        let sum = |key: &str, field: &str| -> f64 {
            row[key]
                .as_array()
                .map_or(0.0, |a| a.iter().filter_map(|d| d[field].as_f64()).sum())
        };
        let dom0w = match row["dom0_weight"].as_u64() {
            Some(w) => w.to_string(),
            None => "node".into(),
        };
        let ms = |key: &str| format!("{}ms", row[key].as_f64().unwrap_or(f64::NAN));
        println!(
            "{:<20} {:>7} {:>7} {:>6} {:>10.3}{} {:>7.2}x {:>9.3} {:>9.3} {:>9} {:>8.3}",
            row["scenario"].as_str().unwrap_or("?"),
            ms("tslice_ms"),
            ms("tick_ms"),
            dom0w,
            row["time_s"].as_f64().unwrap_or(f64::NAN),
            if row["finished"] == true { " " } else { "+" },
            row["speedup"].as_f64().unwrap_or(f64::NAN),
            sum("domains", "spin_s"),
            sum("dom0", "cpu_s"),
            row["switches"],
            row["host_s"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!(
        "time = simulated completion of the program (+ = cut at duration_s); speedup over \
         the first scenario; spin = domain CPU spent busy-waiting; host = real seconds taken"
    );
}
