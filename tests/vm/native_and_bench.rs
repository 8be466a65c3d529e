//! The native twin verifies what the guest verifies, and `kumo bench overhead` pairs
//! the two. No timing is asserted: ratios are measurements, not pass/fail criteria.

use crate::common;

use common::*;

/// The same set the guest tests verify: every kernel at S on 1, 2 and 3 threads, and
/// at W on 2.
#[test]
fn the_native_twin_verifies_every_kernel() {
    for (class, threads) in [("S", "1"), ("S", "2"), ("S", "3"), ("W", "2")] {
        let specs: Vec<String> = npb::Kernel::ALL
            .iter()
            .map(|k| format!("{}.{class}", k.name()))
            .collect();
        let out = kumo(&[
            "native",
            "--npb",
            &specs.join(","),
            "--threads",
            threads,
            "--json",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = json_lines(&out);
        assert_eq!(lines.len(), specs.len() + 1, "{lines:?}");
        for (line, kernel) in lines.iter().zip(npb::Kernel::ALL) {
            assert_eq!(line["benchmark"], kernel.name(), "{line}");
            assert_eq!(line["class"], class, "{line}");
            assert_eq!(line["verified"], true, "{line}");
            assert_eq!(line["vcpus"].to_string(), threads, "{line}");
        }
        assert_eq!(lines[specs.len()]["mode"], "native");
    }
}

#[test]
fn the_native_twin_runs_the_mpi_forms_on_host_ranks() {
    for ranks in ["1", "2", "4"] {
        let out = kumo(&[
            "native",
            "--mpi-ranks",
            ranks,
            "--npb",
            "ep.S,is.S,cg.S,ft.S,mg.W",
            "--json",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 6, "{lines:?}");
        for line in &lines[..5] {
            assert_eq!(line["verified"], true, "{line}");
            assert_eq!(line["vcpus"].to_string(), ranks, "{line}");
        }
    }
    assert_refused(
        &["native", "--mpi-ranks", "3", "--npb", "cg.S"],
        "cg.S cannot run on 3 MPI ranks",
    );
}

#[test]
fn zero_native_threads_are_refused() {
    let out = kumo(&["native", "--threads", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--threads must be at least 1"));
}

#[test]
fn preempt_times_guest_and_native_with_and_without_the_waker() {
    if !kvm_available() {
        return;
    }
    for vcpus in ["1", "2"] {
        let out = kumo(&[
            "bench", "preempt", "--npb", "ep.S", "--runs", "1", "--hz", "500", "--vcpus", vcpus,
            "--json",
        ]);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(stderr.matches("round 1/1").count(), 1, "{stderr}");
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert_eq!(
            (
                line["benchmark"].as_str(),
                line["hz"].as_u64(),
                line["vcpus"].as_u64()
            ),
            (Some("ep"), Some(500), vcpus.parse().ok())
        );
        for key in [
            "native_s",
            "native_woken_s",
            "guest_s",
            "guest_woken_s",
            "wakes_per_s",
        ] {
            assert!(line[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {line}");
        }
        for key in ["native_us_per_preemption", "guest_us_per_preemption"] {
            assert!(
                line[key].as_f64().is_some_and(f64::is_finite),
                "{key}: {line}"
            );
        }
    }
}

#[test]
fn preempt_refuses_a_rate_or_cpu_it_cannot_have() {
    let out = kumo(&["bench", "preempt", "--hz", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--hz must be between 1 and 20000"));
    let out = kumo(&["bench", "preempt", "--pcpu", "4096"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--pcpu 4096 does not exist"));
}

#[test]
fn overhead_pairs_native_and_guest_runs() {
    if kvm_available() {
        let out = kumo(&[
            "bench", "overhead", "--npb", "ep.S", "--runs", "2", "--vcpus", "2", "--json",
        ]);
        let stderr = text(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(stderr.matches("pair ").count(), 2, "{stderr}");
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert_eq!(
            (line["benchmark"].as_str(), line["runs"].as_u64()),
            (Some("ep"), Some(2))
        );
        let (min, median, max) = (
            line["ratio_min"].as_f64().unwrap(),
            line["ratio_median"].as_f64().unwrap(),
            line["ratio_max"].as_f64().unwrap(),
        );
        assert!(min > 0.0 && min <= median && median <= max, "{line}");
        assert!(line["best_ratio"].as_f64().unwrap() > 0.0, "{line}");
    }
}

#[test]
fn overhead_with_qemu_runs_the_same_guest_on_qemu_in_every_round() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let out = kumo(&[
        "bench", "overhead", "--npb", "ep.S", "--runs", "2", "--vcpus", "2", "--qemu", "--json",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches(", QEMU ").count(), 2, "{stderr}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    let (min, median, max) = (
        line["qemu_ratio_min"].as_f64().unwrap(),
        line["qemu_ratio_median"].as_f64().unwrap(),
        line["qemu_ratio_max"].as_f64().unwrap(),
    );
    assert!(min > 0.0 && min <= median && median <= max, "{line}");
    assert!(line["qemu_median_s"].as_f64().unwrap() > 0.0, "{line}");
    // Without --qemu there is no QEMU column.
    let out = kumo(&[
        "bench", "overhead", "--npb", "ep.S", "--runs", "1", "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(json_lines(&out)[0].get("qemu_ratio_median").is_none());
}
