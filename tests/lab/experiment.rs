//! `kumo experiment`: S1 (and its migration), S2 and S4 on real VMs end to end (quick
//! forms), S3 simulated, and bad input.

use crate::common;

use common::{assert_refused, kumo, kvm_available, scratch, text};

/// Experiments take the host's CPUs (S1's credit scheduler runs its vCPUs at
/// SCHED_FIFO on both): they take turns, as a researcher would run them.
use crate::common::ONE_AT_A_TIME;

/// `kumo experiment NAME --quick --runs 1 --json --out DIR` (DIR fresh): it must
/// succeed; its report and DIR.
fn quick_run(name: &str) -> (serde_json::Value, std::path::PathBuf) {
    let out_dir = scratch(&format!("{name}-out"));
    let _ = std::fs::remove_dir_all(&out_dir);
    let out = kumo(&[
        "experiment",
        name,
        "--quick",
        "--runs",
        "1",
        "--json",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = serde_json::from_slice(&out.stdout).expect("one JSON object");
    (report, out_dir)
}

#[test]
#[ignore = "slow (117 s in a debug build, both families): .ci/run runs it with --include-ignored"]
fn s1_quick_runs_real_vms_and_writes_its_report_and_figure() {
    if !kvm_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (report, out_dir) = quick_run("s1");
    assert_eq!(report["experiment"], "s1");
    assert_eq!(report["ok"], true, "{report}");
    let rows = report["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for row in rows {
        assert_eq!(row["verified"], true, "{row}");
        assert!(row["time_s"]["median"].as_f64().unwrap() > 0.0, "{row}");
        // Each family is simulated, with its own domain 0.
        assert!(row["sim_time_s"].as_f64().is_some(), "simulated: {row}");
    }
    assert_eq!(
        report["dom0_families"],
        serde_json::json!(["kumo", "loaded"])
    );
    assert!(
        rows.iter()
            .any(|r| r["scenario"]["name"] == "loaded-xen3.4-1/1"),
        "the loaded family ran"
    );
    for benchmark in ["cg.W", "ep.A"] {
        let speedup = rows
            .iter()
            .find(|r| r["benchmark"] == benchmark && r["scenario"]["name"] == "xen3.4-1/1")
            .and_then(|r| r["speedup_pct"].as_f64());
        assert!(speedup.is_some(), "{benchmark} at 1/1 has a speed-up");
    }
    let calibration = &report["calibration"];
    assert!(
        calibration["per_frame_us"].as_f64().unwrap() > 0.0,
        "{calibration}"
    );
    // The files: the same report, the simulation file, a well-formed SVG.
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("s1.json")).unwrap()).unwrap();
    assert_eq!(saved, report);
    let svg = std::fs::read_to_string(out_dir.join("s1-speedup.svg")).unwrap();
    let doc = roxmltree::Document::parse(&svg).expect("well-formed SVG");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let sim = std::fs::read_to_string(out_dir.join("s1-sim.toml")).unwrap();
    assert!(sim.contains("[[scenario]]"), "{sim}");
    assert!(!sim.contains("dom0_per_frame_us"), "kumo's domain 0: {sim}");
    let loaded = std::fs::read_to_string(out_dir.join("s1-sim-loaded.toml")).unwrap();
    assert!(
        loaded.contains("name = \"loaded-xen3.4-1/1\"") && loaded.contains("dom0_per_frame_us"),
        "{loaded}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
#[ignore = "real VMs, one at a time (keeps the default run under 6 minutes): .ci/run runs it with --include-ignored"]
fn s1_loaded_domain_0_runs_its_quick_scenarios_on_real_vms() {
    if !kvm_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // EP.S: the family's three quick scenarios in a few seconds; the switch still costs
    // each of its frames.
    let out = kumo(&[
        "experiment",
        "s1",
        "--quick",
        "--runs",
        "1",
        "--dom0",
        "loaded",
        "--bench",
        "ep.S",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["dom0_families"], serde_json::json!(["loaded"]));
    let cost = &report["loaded_dom0_cost"];
    assert!(cost["frame_us"].as_f64().unwrap() > 0.0, "{report}");
    assert!(cost["kib_us"].as_f64().unwrap() > 0.0, "{report}");
    let rows = report["rows"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["scenario"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "loaded-xen3.4-30/10",
            "loaded-xen3.4-1/1",
            "loaded-xen3.4-1/1-dom0-1024"
        ]
    );
    for row in rows {
        assert_eq!(row["scenario"]["dom0"], "loaded", "{row}");
        assert_eq!(row["benchmark"], "ep.S", "{row}");
        assert_eq!(row["verified"], true, "{row}");
        assert!(row["sim_time_s"].as_f64().is_some(), "simulated: {row}");
    }
    for run in report["real_runs"].as_array().unwrap() {
        assert_eq!(run["dom0"], "loaded", "{run}");
        assert!(run["frames"].as_u64().unwrap() > 0, "{run}");
    }
}

#[test]
#[ignore = "slow (23 s in a debug build): .ci/run runs it with --include-ignored"]
fn s4_quick_sets_passthrough_beside_the_emulated_nic_and_bare_metal() {
    if !kvm_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (report, out_dir) = quick_run("s4");
    let figure = std::fs::read_to_string(out_dir.join("s4.svg")).unwrap();
    assert!(figure.contains("<svg") && figure.contains("passthrough + fast path"));
    let _ = std::fs::remove_dir_all(&out_dir);
    assert_eq!(report["ok"], true, "{report}");
    let rows = report["rows"].as_array().unwrap();
    // CG and IS, each under the four configurations.
    assert_eq!(rows.len(), 2 * 4, "{report}");
    for row in rows {
        assert_eq!(row["verified"], true, "{row}");
        assert!(row["relative"].as_f64().unwrap() > 0.0, "{row}");
    }
    let bare: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["config"]["name"] == "bare metal")
        .collect();
    assert!(bare.iter().all(|r| r["relative"] == 1.0), "{bare:?}");
}

#[test]
fn s2_quick_measures_every_configuration_and_size_and_draws_both_figures() {
    if !kvm_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (report, out_dir) = quick_run("s2");
    assert_eq!(report["ok"], true, "{report}");
    let rows = report["rows"].as_array().unwrap();
    // Three sizes, each under bare metal, the emulated NIC and passthrough on both paths.
    assert_eq!(rows.len(), 3 * 4, "{report}");
    for row in rows {
        assert!(row["latency_us"]["median"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["mbps"]["median"].as_f64().unwrap() > 0.0, "{row}");
        if row["config"] == "bare metal" {
            assert_eq!(row["latency_vs_bare"], 1.0, "{row}");
        }
    }
    for file in ["s2.json", "s2-latency.svg", "s2-throughput.svg"] {
        let text = std::fs::read_to_string(out_dir.join(file)).unwrap();
        assert!(!text.is_empty(), "{file}");
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
#[ignore = "slow (70 s in a debug build): .ci/run runs it with --include-ignored"]
fn migrate_quick_moves_a_domu_of_a_running_mpi_job_to_a_standby_node_under_both_slices() {
    if !kvm_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (report, out_dir) = quick_run("migrate");
    assert_eq!(report["experiment"], "migrate");
    assert_eq!(report["ok"], true, "{report}");
    // S1's benchmark, its DomU moved between two nodes (`kumo ctl migrate --domain`).
    assert_eq!(report["benchmark"], "sp.S", "{report}");
    // Its ranks wait as `s1`'s do by default.
    assert_eq!(report["wait"], "yield", "{report}");
    let runs = report["runs"].as_array().unwrap();
    // Both scenarios, each without and with one stop-and-copy migration.
    assert_eq!(runs.len(), 2 * 2, "{report}");
    for run in runs {
        assert_eq!(run["verified"], true, "{run}");
        let moved = run["migrations"].as_array().unwrap();
        if run["mode"] == "no migration" {
            assert!(moved.is_empty(), "{run}");
        } else {
            // Moved once, in one copy with the VM stopped, before the job's end (the
            // node's end, in seconds from the moving VM's control socket).
            assert_eq!(moved.len(), 1, "{run}");
            let m = &moved[0];
            assert_eq!(m["rounds"], 1, "{run}");
            assert!(m["bytes"].as_u64().unwrap() > 0, "{run}");
            let moved_by = m["at_s"].as_f64().unwrap() + m["total_ms"].as_f64().unwrap() / 1e3;
            let job_end = run["job_start_s"].as_f64().unwrap() + run["time_s"].as_f64().unwrap();
            assert!(moved_by < job_end, "{run}");
        }
    }
    let tuned_moved = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scenario"] == "xen3.4-1/1-dom0-1024" && r["mode"] == "1 stop-and-copy")
        .expect("the tuned stop-and-copy row");
    assert!(
        tuned_moved["speedup_pct"].as_f64().is_some(),
        "{tuned_moved}"
    );
    assert_eq!(tuned_moved["paper_pct"], 10.2, "{tuned_moved}");
    let svg = std::fs::read_to_string(out_dir.join("migrate-speedup.svg")).unwrap();
    roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
#[ignore = "slow (about 70 s): .ci/run runs it with --include-ignored"]
fn s5_quick_balances_vms_from_the_slow_host_and_loses_no_result() {
    if !kvm_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (report, out_dir) = quick_run("s5");
    assert_eq!(report["experiment"], "s5");
    assert_eq!(report["simulated"], false);
    assert_eq!(report["ok"], true, "{report}");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(
        runs.len(),
        2,
        "static and balanced jobs, once each (MPI in the full form only): {report}"
    );
    for run in runs {
        // Every VM printed every result verified, wherever it ended.
        assert_eq!(run["verified"], true, "{run}");
        let moves = run["moves"].as_array().unwrap();
        let jobs = run["workload"] == "jobs";
        assert_eq!(
            run["verified_results"],
            if jobs { 6 * 6 } else { 1 },
            "{run}"
        );
        if run["placement"] == "static" {
            assert!(moves.is_empty(), "{run}");
        } else if jobs {
            // A 2x speed difference: the balancer moves a VM off the slow host.
            assert!(!moves.is_empty(), "{run}");
            assert_eq!(moves[0]["from"], "slow", "{run}");
            assert_eq!(moves[0]["to"], "fast", "{run}");
        }
    }
    let speedups = report["speedups"].as_array().unwrap();
    assert!(speedups[0]["speedup"].as_f64().is_some(), "{report}");
    let svg = std::fs::read_to_string(out_dir.join("s5-timeline.svg")).unwrap();
    roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// S3 is simulated: no KVM, no CPUs taken, a few seconds.
#[test]
fn s3_quick_is_simulated_and_writes_its_report_and_figure() {
    let (report, out_dir) = quick_run("s3");
    assert_eq!(report["experiment"], "s3");
    assert_eq!(report["simulated"], true);
    assert!(report["note"].as_str().unwrap().starts_with("SIMULATED"));
    let sim = &report["sim"];
    assert_eq!(sim["topology"]["sockets"], 2);
    assert_eq!(sim["topology"]["cores_per_socket"], 16);
    assert_eq!(sim["workload"]["vcpus"], 16);
    let placements: Vec<&str> = sim["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for name in [
        "one-socket",
        "8-8",
        "7-9",
        "even-cores",
        "free",
        "free-module-aware",
    ] {
        assert!(placements.contains(&name), "{name} in {placements:?}");
    }
    let runs = sim["runs"].as_array().unwrap();
    let threads = sim["workload"]["threads"].as_array().unwrap().len();
    assert_eq!(runs.len(), placements.len() * threads);
    for run in runs {
        for key in ["time_ms", "speedup", "efficiency", "contended_modules"] {
            assert!(run[key].as_f64().is_some_and(|v| v >= 0.0), "{key}: {run}");
        }
        assert!(run["contended_modules_max"].is_u64(), "{run}");
        assert!(run["threads"].is_u64(), "{run}");
    }
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 6);
    for f in findings {
        assert!(f["paper"].is_string() && f["simulated"].is_string() && f["holds"].is_boolean());
    }
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("s3.json")).unwrap()).unwrap();
    assert_eq!(saved, report, "the file is the report printed");
    let svg = std::fs::read_to_string(out_dir.join("s3.svg")).unwrap();
    roxmltree::Document::parse(&svg).expect("well-formed SVG");
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn bad_experiment_input_is_refused_in_one_line() {
    assert_refused(
        &["experiment", "s9"],
        "unknown experiment 's9' (known: s1, s2, s3, s4, s5, migrate)",
    );
    assert_refused(
        &["experiment", "s1", "--runs", "0"],
        "--runs must be at least 1",
    );
    assert_refused(
        &["experiment", "s2", "--dom0", "loaded"],
        "--dom0 is for s1 only",
    );
    assert_refused(
        &["experiment", "s2", "--wait", "yield"],
        "--wait is for s1 and migrate only",
    );
    // clap's own refusal (its usage lines follow), exit 2.
    let out = kumo(&["experiment", "s1", "--dom0", "xen"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("invalid value 'xen'"),
        "{}",
        text(&out.stderr)
    );
    assert_refused(
        &["experiment", "s1", "--bench", "is.A"],
        "--bench is.A: S1 runs only BT, CG, EP, FT, LU, MG and SP",
    );
    let file = scratch("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    let under_file = file.join("out");
    assert_refused(
        &["experiment", "s1", "--out", under_file.to_str().unwrap()],
        "cannot create the directory",
    );
    let _ = std::fs::remove_file(&file);
}
