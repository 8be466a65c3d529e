//! `kumo sim`: deterministic, exact where the answer is known, faithful to the
//! scheduler's shares, and S1's direction on the example cluster.

mod common;

use common::*;
use serde_json::Value;

fn sim(name: &str, body: &str) -> Vec<Value> {
    let path = scratch(name);
    std::fs::write(&path, body).unwrap();
    let out = kumo(&["sim", "--config", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    json_lines(&out)
}

/// One node with `pcpus` and one single-vCPU domain per weight.
fn cluster(pcpus: u32, weights: &[u32], program: &str, duration_s: f64) -> String {
    let mut body = format!(
        "duration_s = {duration_s}\n[costs]\nswitch_us = 0\nnotify_us = 0\n\n[program]\n{program}\n\n\
         [[node]]\nname = \"n\"\npcpus = {pcpus}\n"
    );
    for (i, w) in weights.iter().enumerate() {
        body.push_str(&format!("[[node.domain]]\nname = \"d{i}\"\nweight = {w}\n"));
    }
    body.push_str("\n[[scenario]]\nname = \"default\"\n");
    body
}

fn without_host_time(mut rows: Vec<Value>) -> Vec<Value> {
    for row in &mut rows {
        row.as_object_mut().unwrap().remove("host_s");
    }
    rows
}

#[test]
fn the_same_file_gives_the_same_results() {
    let a = without_host_time(sim(
        "sim-det-a.toml",
        &std::fs::read_to_string("examples/sim-s1.toml").unwrap(),
    ));
    let b = without_host_time(sim(
        "sim-det-b.toml",
        &std::fs::read_to_string("examples/sim-s1.toml").unwrap(),
    ));
    assert_eq!(a, b);
    assert_eq!(a.len(), 5);
}

#[test]
fn compute_only_ranks_with_a_pcpu_each_take_exactly_their_work() {
    let rows = sim(
        "sim-exact.toml",
        &cluster(
            2,
            &[256, 256],
            "iterations = 100\ncompute_ms = 3.5\npattern = \"none\"",
            600.0,
        ),
    );
    assert_eq!(rows[0]["finished"], true);
    assert_eq!(rows[0]["time_s"].as_f64(), Some(0.35), "{}", rows[0]);
    assert_eq!(rows[0]["messages"].as_u64(), Some(0));
}

#[test]
fn busy_domains_share_one_pcpu_by_weight() {
    // Far more work than 20 s: the run is cut at duration_s with both still busy.
    let rows = sim(
        "sim-weights.toml",
        &cluster(
            1,
            &[256, 512],
            "iterations = 1\ncompute_ms = 60000\npattern = \"none\"",
            20.0,
        ),
    );
    let row = &rows[0];
    assert_eq!(row["finished"], false);
    let cpu = |i: usize| row["domains"][i]["cpu_s"].as_f64().unwrap();
    let ratio = cpu(1) / cpu(0);
    assert!((1.9..=2.1).contains(&ratio), "512:256 gave {ratio}: {row}");
    assert!(
        (cpu(0) + cpu(1) - 20.0).abs() < 0.01,
        "work conserving: {row}"
    );
}

#[test]
fn a_short_slice_speeds_up_busy_waiting_mpi_as_in_s1() {
    let rows = sim(
        "sim-s1.toml",
        &std::fs::read_to_string("examples/sim-s1.toml").unwrap(),
    );
    let time = |name: &str| {
        rows.iter().find(|r| r["scenario"] == name).unwrap()["time_s"]
            .as_f64()
            .unwrap()
    };
    assert!(rows.iter().all(|r| r["finished"] == true), "{rows:?}");
    assert!(time("ts1-tick1") < 0.9 * time("xen-default"), "{rows:?}");
    assert!(time("ts1-tick1-dom0-1024") <= time("ts1-tick1"), "{rows:?}");
    // Busy-waiting is what the short slice removes.
    let spin = |name: &str| -> f64 {
        rows.iter().find(|r| r["scenario"] == name).unwrap()["domains"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["spin_s"].as_f64().unwrap())
            .sum()
    };
    assert!(spin("ts1-tick1") < spin("xen-default"), "{rows:?}");
}

#[test]
fn compute_only_programs_do_not_care_about_the_slice() {
    let mut text = cluster(
        1,
        &[256, 256],
        "iterations = 50\ncompute_ms = 10\npattern = \"none\"",
        600.0,
    );
    text.push_str("[[scenario]]\nname = \"short\"\ntslice_ms = 1\ntick_ms = 1\n");
    let rows = sim("sim-ep.toml", &text);
    let (a, b) = (
        rows[0]["time_s"].as_f64().unwrap(),
        rows[1]["time_s"].as_f64().unwrap(),
    );
    // Both domains need 0.5 s of one pCPU: 1.0 s either way (switches cost nothing here).
    assert!((a - 1.0).abs() < 1e-6 && (b - 1.0).abs() < 1e-6, "{rows:?}");
}

#[test]
fn bad_simulation_files_are_refused_with_the_reason() {
    let good = cluster(
        1,
        &[256],
        "iterations = 1\ncompute_ms = 1\npattern = \"none\"",
        1.0,
    );
    for (name, body, needle) in [
        (
            "sim-bad-key.toml",
            good.replace("duration_s", "duraton_s"),
            "unknown field `duraton_s`",
        ),
        (
            "sim-bad-slice.toml",
            format!("{good}[[scenario]]\nname = \"x\"\ntslice_ms = 5000\n"),
            "scenario 'x'",
        ),
        (
            "sim-bad-weight.toml",
            good.replace("weight = 256", "weight = 0"),
            "weight 0 is outside",
        ),
        (
            "sim-bad-ranks.toml",
            good.replace("pattern = \"none\"", "pattern = \"ring\""),
            "needs at least 2 ranks",
        ),
        (
            "sim-bad-pattern.toml",
            good.replace("pattern = \"none\"", "pattern = \"star\""),
            "unknown variant `star`",
        ),
    ] {
        let path = scratch(name);
        std::fs::write(&path, &body).unwrap();
        let out = kumo(&["sim", "--config", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        assert!(
            text(&out.stderr).contains(needle),
            "{name}: {}",
            text(&out.stderr)
        );
    }
    let out = kumo(&["sim", "--config", "/nonexistent/sim.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read simulation file"));
}

#[test]
fn blocking_receives_spin_never_and_still_finish() {
    let text = std::fs::read_to_string("examples/sim-s1.toml")
        .unwrap()
        .replace("wait = \"spin\"", "wait = \"block\"")
        .replace("iterations = 1200", "iterations = 200");
    assert!(
        text.contains("wait = \"block\""),
        "examples/sim-s1.toml changed shape"
    );
    let rows = sim("sim-block.toml", &text);
    for row in &rows {
        assert_eq!(row["finished"], true, "{row}");
        for d in row["domains"].as_array().unwrap() {
            assert_eq!(d["spin_s"].as_f64(), Some(0.0), "{row}");
        }
        // 200 iterations of 2 ms compute at least, plus messages.
        assert!(row["time_s"].as_f64().unwrap() > 0.4, "{row}");
    }
}
