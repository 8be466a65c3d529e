//! `kumo bench record --quick` end to end, and `kumo bench compare` on what it wrote.
//! No timing is asserted: the record's numbers are measurements; the comparison's
//! verdicts come from numbers this test sets itself.

use crate::common;

use common::*;

/// The figures every record has (`process_kumo_ms` has QEMU beside it when installed).
const FIGURES: [&str; 15] = [
    "boot_ms",
    "process_kumo_ms",
    "exit_round_trip_us",
    "irq_generic_us",
    "irq_generic_p90_us",
    "irq_fast_us",
    "irq_fast_p90_us",
    "switch_fifo_us",
    "switch_park_us",
    "msg_8b_us",
    "msg_1mib_us",
    "msg_8b_block_us",
    "dirty_harvest_us_per_gib",
    "migrate_256mib_total_ms",
    "migrate_256mib_downtime_ms",
];

#[test]
#[ignore = "slow (14 s in a debug build): .ci/run runs it with --include-ignored"]
fn a_quick_record_has_every_figure_and_compares_with_itself() {
    if !kvm_available() {
        return;
    }
    // It pins vCPUs, runs SCHED_FIFO and a two-VM job: alone, as the other such tests.
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let path = scratch("record.json");
    let out = kumo(&[
        "bench",
        "record",
        "--quick",
        "--out",
        path.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("record 1/1: boot:"), "progress: {stderr}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(record["schema"], 1);
    assert_eq!(record["quick"], true);
    assert_eq!(record["rounds"], 1);
    assert!(record["host"]["cpus"].as_u64().is_some_and(|n| n >= 2));
    let figures = record["figures"].as_array().unwrap();
    let names: Vec<&str> = figures
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for name in FIGURES.iter().chain(&["npb_cg.S_s", "npb_mg.S_s"]) {
        assert!(names.contains(name), "{name} missing from {names:?}");
    }
    for f in figures {
        let median = f["median"].as_f64().unwrap();
        assert!(median > 0.0 && median.is_finite(), "{f}");
        assert!(!f["samples"].as_array().unwrap().is_empty(), "{f}");
        assert!(
            f["p10"].as_f64().unwrap() <= f["p90"].as_f64().unwrap(),
            "{f}"
        );
    }
    let by_name = |n: &str| figures.iter().find(|f| f["name"] == n).unwrap();
    for (name, reference) in [
        ("npb_cg.S_s", "npb_cg.S_native_s"),
        ("irq_fast_us", "irq_generic_us"),
    ] {
        assert_eq!(by_name(name)["reference"]["name"], reference);
        assert!(by_name(name)["ratio"].as_f64().is_some_and(|r| r > 0.0));
    }
    let qemu = !record["host"]["qemu"].is_null();
    assert_eq!(!by_name("process_kumo_ms")["reference"].is_null(), qemu);

    // A record against itself: nothing changed, exit 0.
    let p = path.to_str().unwrap();
    let out = kumo(&["bench", "compare", p, p, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let c = &json_lines(&out)[0];
    assert_eq!(c["worse"], 0);
    assert_eq!(c["figures"].as_array().unwrap().len(), figures.len());
    assert!(
        c["figures"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["verdict"] == "within_noise")
    );

    // The exit round trip made 1.5x slower by hand (one round: no spread, no band).
    let mut slower = record.clone();
    let exit = slower["figures"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|f| f["name"] == "exit_round_trip_us")
        .unwrap();
    for key in ["median", "p10", "p90"] {
        exit[key] = (exit[key].as_f64().unwrap() * 1.5).into();
    }
    let slower_path = scratch("record-slower.json");
    std::fs::write(&slower_path, slower.to_string()).unwrap();
    let out = kumo(&["bench", "compare", p, slower_path.to_str().unwrap()]);
    let table = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let line = table
        .lines()
        .find(|l| l.starts_with("exit_round_trip_us"))
        .unwrap();
    assert!(line.contains("+50.0%") && line.contains("WORSE"), "{table}");
}

#[test]
fn compare_refuses_what_is_not_a_record_of_this_schema() {
    let good = scratch("compare-good.json");
    std::fs::write(
        &good,
        r#"{"schema":1,"commit":null,"date":"2026-11-29T08:00:00Z",
            "host":{"cpus":2,"kernel":"6.18","cpu_model":null,"qemu":null,"load_before":null,"load_after":null},
            "quick":false,"rounds":1,"figures":[]}"#,
    )
    .unwrap();
    let other = scratch("compare-schema-2.json");
    std::fs::write(
        &other,
        std::fs::read_to_string(&good)
            .unwrap()
            .replace(r#""schema":1"#, r#""schema":2"#),
    )
    .unwrap();
    let g = good.to_str().unwrap();
    let out = kumo(&["bench", "compare", g, g]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_refused(
        &["bench", "compare", g, other.to_str().unwrap()],
        "schema 2, but this kumo reads schema 1",
    );
    assert_refused(
        &["bench", "compare", "/nonexistent/old.json", g],
        "cannot read /nonexistent/old.json",
    );
}
