//! Interrupt delivery end to end: the guest drives kumo's PCI test device, and every
//! vector arrives where its MSI-X entry points, on both paths, with 1, 2 and 4 vCPUs;
//! re-targeting works while live; a masked vector is held in the PBA and delivered on
//! unmask. `kumo bench irq` counts the same rounds the host saw.

use crate::common;

use common::*;

fn check(path: &str, vcpus: &str) -> serde_json::Value {
    let out = kumo(&[
        "--irq-check",
        "--irq-path",
        path,
        "--vcpus",
        vcpus,
        "--json",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?} {}", text(&out.stderr));
    assert!(out.status.success(), "{} {}", lines[0], text(&out.stderr));
    lines[0].clone()
}

#[test]
fn every_vector_reaches_the_vcpu_its_entry_names_on_both_paths() {
    if !kvm_available() {
        return;
    }
    for path in ["generic", "fast"] {
        for vcpus in [1u32, 2, 4] {
            let row = check(path, &vcpus.to_string());
            assert_eq!(row["path"], path);
            assert_eq!(row["verified"], true, "{row}");
            let vectors = row["vectors"].as_f64().unwrap();
            assert!(vectors >= 4.0, "{row}");
            // Every vector aimed at every vCPU in turn (re-targeted while live).
            assert_eq!(row["cpus"].as_f64(), Some(f64::from(vcpus)), "{row}");
            assert_eq!(
                row["delivered"].as_f64(),
                Some(vectors * f64::from(vcpus)),
                "{row}"
            );
            assert_eq!(row["misrouted"].as_f64(), Some(0.0), "{row}");
            assert_eq!(row["lost"].as_f64(), Some(0.0), "{row}");
            // Masked: held pending (PBA bit set), then delivered on unmask.
            assert_eq!(row["masked_held"].as_f64(), Some(vectors), "{row}");
            assert_eq!(row["unmask_delivered"].as_f64(), Some(vectors), "{row}");
        }
    }
}

#[test]
fn the_bench_measures_both_paths_and_the_host_sees_every_round() {
    if !kvm_available() {
        return;
    }
    let out = kumo(&[
        "bench",
        "irq",
        "--rounds",
        "100",
        "--noise-rate",
        "2000",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, path) in rows.iter().zip(["generic", "fast"]) {
        assert_eq!(row["path"], path);
        assert_eq!(row["lost"].as_f64(), Some(0.0), "{row}");
        // Cross-check: the device thread answered exactly the guest's doorbells.
        assert_eq!(row["host_rounds"].as_f64(), Some(100.0), "{row}");
        assert!(row["noise_raised"].as_f64().unwrap() > 0.0, "{row}");
        let (min, median, max) = (
            row["min_us"].as_f64().unwrap(),
            row["median_us"].as_f64().unwrap(),
            row["max_us"].as_f64().unwrap(),
        );
        assert!(0.0 < min && min <= median && median <= max, "{row}");
        // The guest's round trip lies inside the host's doorbell-to-doorbell period.
        assert!(median <= row["host_period_us"].as_f64().unwrap(), "{row}");
    }
}

#[test]
fn the_device_answers_after_its_delay_and_not_before() {
    if !kvm_available() {
        return;
    }
    let out = kumo(&[
        "bench",
        "irq",
        "--path",
        "fast",
        "--delay-us",
        "300",
        "--rounds",
        "20",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    // Physical lower bounds, not timing thresholds: nothing can arrive before the
    // device has waited its delay.
    assert!(row["host_device_us"].as_f64().unwrap() >= 300.0, "{row}");
    assert!(row["min_us"].as_f64().unwrap() >= 300.0, "{row}");
    assert_eq!(row["host_rounds"].as_f64(), Some(20.0), "{row}");
}

#[test]
fn bad_interrupt_bench_input_is_refused_before_boot() {
    for (args, needle) in [
        (
            &["--vcpus", "2", "--target-vcpu", "2"][..],
            "--target-vcpu 2 does not exist",
        ),
        (&["--rounds", "0"][..], "--rounds must be between"),
        (&["--noise-rate=-5"][..], "--noise-rate must be between"),
        (&["--path", "posted"][..], "unknown interrupt path 'posted'"),
    ] {
        let mut full = vec!["bench", "irq"];
        full.extend_from_slice(args);
        let out = kumo(&full);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            text(&out.stderr).contains(needle),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let out = kumo(&["--irq-path", "fast"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--irq-check"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn node_domains_get_the_test_device_on_the_path_their_file_names() {
    if !kvm_available() {
        return;
    }
    let out = kumo(&["node", "--config", "examples/irq.toml", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let rows = json_lines(&out);
    let probe = |domain: &str| -> serde_json::Value {
        let row = rows
            .iter()
            .find(|r| r["domain"] == domain)
            .unwrap_or_else(|| panic!("no {domain} in {rows:?}"));
        row["probes"][0].clone()
    };
    let check = probe("nic-fast");
    assert_eq!(check["probe"], "irqcheck");
    assert_eq!(check["verified"], true, "{check}");
    let bench = probe("nic-generic");
    assert_eq!(bench["probe"], "irqbench");
    assert_eq!(bench["rounds"].as_f64(), Some(500.0), "{bench}");
    assert_eq!(bench["lost"].as_f64(), Some(0.0), "{bench}");
}
