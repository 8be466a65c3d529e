//! Several MPI ranks per vCPU (`kumo mpi --ranks-per-vcpu R`): the guest's own
//! preemptive scheduler multiplexes them, ranks of one VM talk through its shared
//! memory, and the results must be bit for bit those of one rank per vCPU.

use crate::common;

use common::*;

/// One job at a time (as `tests/npb_mpi.rs`): ranks spin, and the host has two cores.
use crate::common::ONE_AT_A_TIME as ONE_JOB;

/// `kumo mpi --npb LIST ARGS --json`: it must succeed; its JSON lines.
fn npb_job(list: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let mut full = vec!["mpi", "--npb", list, "--json", "--timeout", "300"];
    full.extend_from_slice(args);
    let out = kumo(&full);
    assert_eq!(
        out.status.code(),
        Some(0),
        "kumo {full:?}: {}",
        text(&out.stderr)
    );
    json_lines(&out)
}

/// A result row without what may differ between placements (times, and the shape).
fn values(row: &serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    let mut map = row.as_object().unwrap().clone();
    for key in ["time_s", "mops", "vms", "vcpus", "ranks_per_vcpu", "nic"] {
        map.remove(key);
    }
    map
}

/// The results of `list` on 4 ranks placed as `args` say, each verified, as maps of
/// their values.
fn four_ranks(list: &str, args: &[&str]) -> Vec<serde_json::Map<String, serde_json::Value>> {
    let lines = npb_job(list, args);
    let (results, end) = lines.split_at(lines.len() - 1);
    assert_eq!(end[0]["ok"], serde_json::json!(true), "{args:?}");
    assert_eq!(results.len(), list.split(',').count(), "{args:?}");
    for row in results {
        assert_eq!(row["ranks"], serde_json::json!(4), "{args:?}: {row}");
        assert_eq!(row["verified"], serde_json::json!(true), "{args:?}: {row}");
    }
    results.iter().map(values).collect()
}

/// 2 VMs x 1 vCPU x 2 ranks (ranks of a VM over shared memory, across VMs over the
/// NIC, spinning until the tick preempts) give CG's and IS's results bit for bit as 4
/// ranks on 4 VMs of one vCPU do; so does 1 VM x 2 vCPUs x 2 ranks blocking (shared
/// memory across vCPUs, wake-ups by interrupt and bell).
#[test]
fn two_ranks_per_vcpu_give_the_results_of_one_rank_per_vcpu() {
    if !kvm_available() {
        return;
    }
    let list = "cg.S,is.S";
    let one_per_vcpu = four_ranks(list, &["--vms", "4", "--wait", "block"]);
    let spin = four_ranks(
        list,
        &["--vms", "2", "--vcpus", "1", "--ranks-per-vcpu", "2"],
    );
    assert_eq!(spin, one_per_vcpu, "2 VMs x 1 vCPU x 2 ranks, spin");
    let block = four_ranks(
        list,
        &[
            "--vms",
            "1",
            "--vcpus",
            "2",
            "--ranks-per-vcpu",
            "2",
            "--wait",
            "block",
        ],
    );
    assert_eq!(block, one_per_vcpu, "1 VM x 2 vCPUs x 2 ranks, block");
    // CG's official zeta, as the guest printed it.
    let zeta = one_per_vcpu[0]["zeta"].as_f64().unwrap();
    assert!((zeta - 8.597_177_507_864_8).abs() < 1e-10, "{zeta}");
}

/// Every wait and tick rate: four ranks on one vCPU (all in shared memory), yielding
/// at 1000 Hz and blocking at 100 Hz, verify EP and MG with the same values.
#[test]
fn four_ranks_on_one_vcpu_verify_with_every_wait() {
    if !kvm_available() {
        return;
    }
    let list = "ep.S,mg.S";
    let shape = ["--vms", "1", "--vcpus", "1", "--ranks-per-vcpu", "4"];
    let mut yielding = shape.to_vec();
    yielding.extend(["--wait", "yield", "--guest-hz", "1000"]);
    let mut blocking = shape.to_vec();
    blocking.extend(["--wait", "block", "--guest-hz", "100"]);
    let a = four_ranks(list, &yielding);
    let b = four_ranks(list, &blocking);
    assert_eq!(a, b);
}

/// Bad values are refused in one line before any VM starts, and no /dev/kvm is needed
/// for that.
#[test]
fn bad_ranks_per_vcpu_and_guest_hz_are_refused_in_one_line() {
    for (args, needle) in [
        (
            &["mpi", "--npb", "cg.S", "--ranks-per-vcpu", "0"][..],
            "--ranks-per-vcpu must be between 1 and 16, not 0",
        ),
        (
            &["mpi", "--npb", "cg.S", "--ranks-per-vcpu", "17"][..],
            "--ranks-per-vcpu must be between 1 and 16, not 17",
        ),
        (
            &["mpi", "--ranks-per-vcpu", "2", "--guest-hz", "0"][..],
            "--guest-hz must be between 1 and 5000, not 0",
        ),
        (
            &["mpi", "--npb", "cg.S", "--guest-hz", "10000"][..],
            "--guest-hz must be between 1 and 5000, not 10000",
        ),
        (
            &["mpi", "--vms", "33", "--ranks-per-vcpu", "2"][..],
            "an MPI job needs 2 to 64 ranks",
        ),
    ] {
        let out = kumo(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "kumo {args:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "kumo {args:?}: not one line:\n{stderr}");
        assert!(
            lines[0].starts_with("kumo: error: ") && lines[0].contains(needle),
            "kumo {args:?}: {stderr:?} lacks {needle:?}"
        );
    }
}
