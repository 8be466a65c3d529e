//! The embedded guest boots on N vCPUs and its NPB results verify.

use crate::common;

use common::*;

/// Runs `kumo --json` with `args` and checks that every named benchmark verified on
/// `vcpus` vCPUs, and that the boot time was reported.
fn assert_verified(args: &[&str], expected: &[(&str, &str)], vcpus: u64) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = kumo(&all);
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "kumo {all:?} failed: {:?}\n{stderr}",
        out.status
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), expected.len() + 1, "{lines:?}");
    for (line, (bench, class)) in lines.iter().zip(expected) {
        assert_eq!(line["benchmark"], *bench, "{line}");
        assert_eq!(line["class"], *class, "{line}");
        assert_eq!(line["vcpus"], vcpus, "{line}");
        assert_eq!(line["verified"], true, "{line}");
        assert!(line["time_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["mops"].as_f64().unwrap() > 0.0, "{line}");
    }
    let summary = lines.last().unwrap();
    assert!(summary["boot_ms"].as_f64().unwrap() > 0.0, "{summary}");
    assert_eq!(summary["ok"], true, "{summary}");
}

/// `kernel.class` for every kernel, and the comma-separated list of them.
fn every_kernel(class: &'static str) -> (Vec<(&'static str, &'static str)>, String) {
    let expected: Vec<_> = npb::Kernel::ALL.iter().map(|k| (k.name(), class)).collect();
    let list = expected
        .iter()
        .map(|(k, c)| format!("{k}.{c}"))
        .collect::<Vec<_>>()
        .join(",");
    (expected, list)
}

fn every_kernel_verifies(class: &'static str, vcpus: u64) {
    let (expected, list) = every_kernel(class);
    let vcpus_arg = vcpus.to_string();
    assert_verified(&["--vcpus", &vcpus_arg, "--npb", &list], &expected, vcpus);
}

#[test]
fn every_kernel_class_s_verifies_on_one_vcpu() {
    if kvm_available() {
        every_kernel_verifies("S", 1);
    }
}

#[test]
fn no_arguments_runs_every_benchmark_class_s_on_two_vcpus() {
    if kvm_available() {
        let (expected, _) = every_kernel("S");
        assert_verified(&[], &expected, 2);
    }
}

/// Three divides none of the problem sizes: every kernel must still verify.
#[test]
fn every_kernel_class_s_verifies_on_three_vcpus() {
    if kvm_available() {
        every_kernel_verifies("S", 3);
    }
}

/// The pseudo-applications' splits (LU's pipelined sweeps above all) on four vCPUs:
/// LU's pipeline then runs three stages deeper than its planes.
#[test]
fn the_pseudo_applications_class_s_verify_on_four_vcpus() {
    if kvm_available() {
        let expected = [("sp", "S"), ("bt", "S"), ("lu", "S")];
        assert_verified(&["--vcpus", "4", "--npb", "sp.S,bt.S,lu.S"], &expected, 4);
    }
}

#[test]
fn ep_s_verifies_on_four_vcpus_on_a_smaller_host() {
    if kvm_available() {
        assert_verified(&["--vcpus", "4", "--npb", "ep.S"], &[("ep", "S")], 4);
    }
}

#[test]
#[ignore = "slow (8 s in a debug build): .ci/run runs it with --include-ignored"]
fn every_kernel_class_w_verifies_on_two_vcpus() {
    if kvm_available() {
        every_kernel_verifies("W", 2);
    }
}

#[test]
fn the_human_table_names_each_benchmark_and_the_boot_time() {
    if kvm_available() {
        let out = kumo(&["--vcpus", "1", "--npb", "ep.S,ep.S"]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("ep ")).collect();
        assert_eq!(rows.len(), 2, "{stdout}");
        assert!(rows.iter().all(|r| r.ends_with("yes")), "{stdout}");
        assert!(stdout.contains("boot: "), "{stdout}");
    }
}

#[test]
fn an_empty_workload_boots_and_exits_cleanly() {
    if kvm_available() {
        let guest = dumped_guest();
        let out = kumo(&[
            "--kernel",
            guest.to_str().unwrap(),
            "--cmdline",
            "npb=",
            "--vcpus",
            "2",
        ]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        assert!(stdout.contains("@kumo boot cpus=2"), "{stdout}");
        assert!(stdout.contains("@kumo end status=0"), "{stdout}");
        assert!(
            text(&out.stderr).contains("workload started"),
            "{}",
            text(&out.stderr)
        );
    }
}

/// `kumo --kernel ... --json`: the guest's `@kumo result` lines become JSON rows with
/// numbers as numbers, then `{"ok", "status"}`; its other lines go to stderr.
#[test]
fn a_kernel_run_prints_its_results_as_json_rows() {
    if kvm_available() {
        let guest = dumped_guest();
        let out = kumo(&[
            "--kernel",
            guest.to_str().unwrap(),
            "--cmdline",
            "npb=ep.S,is.S",
            "--vcpus",
            "2",
            "--json",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = json_lines(&out);
        // Results, beside the guest's measurement lines (rows with a `probe`).
        let results: Vec<&serde_json::Value> = lines
            .iter()
            .filter(|l| l.get("probe").is_none() && l.get("benchmark").is_some())
            .collect();
        let names: Vec<&str> = results
            .iter()
            .map(|l| l["benchmark"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["ep", "is"], "{lines:?}");
        for row in results {
            assert_eq!(row["class"], "S", "{row}");
            assert_eq!(row["verified"], true, "{row}");
            assert!(row["time_s"].as_f64().unwrap() > 0.0, "{row}");
        }
        assert_eq!(
            lines.last().unwrap(),
            &serde_json::json!({"ok": true, "status": 0})
        );
        // Every line on stdout is JSON: the guest's own lines were parsed, not echoed.
        assert!(
            !text(&out.stdout).contains("@kumo"),
            "{}",
            text(&out.stdout)
        );
    }
}

/// `--kvm-stats` adds one JSON line of what KVM counted in the kernel: a VM's counters
/// and each vCPU's, and every vCPU that ran guest code exited to KVM.
#[test]
fn kvm_stats_count_every_vcpus_exits() {
    let out = kumo(&["--json", "--kvm-stats", "--npb", "ep.S", "--vcpus", "2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    let stats = &lines.last().unwrap()["kvm_stats"];
    let vcpus = stats["vcpus"].as_array().expect("a list of vCPUs");
    assert_eq!(vcpus.len(), 2, "{stats}");
    for vcpu in vcpus {
        assert!(vcpu["exits"].as_u64().unwrap() > 0, "{vcpu}");
    }
    assert!(stats["vm"]["remote_tlb_flush"].is_u64(), "{stats}");
}
