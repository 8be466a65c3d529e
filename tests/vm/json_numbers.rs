//! `--json`'s first rule, on the cheap commands: every number is a JSON number, never
//! a string that reads as one (docs/json.md), at any depth of any line. The other
//! areas check the same on the lines their tests already print (`net`, `sched`,
//! `migration`, `lab`).

use crate::common;

use common::*;

/// `kumo ARGS --json`: it must exit 0; its lines, each checked.
fn checked(args: &[&str]) -> Vec<serde_json::Value> {
    let mut full = args.to_vec();
    full.push("--json");
    let out = kumo(&full);
    assert_eq!(
        out.status.code(),
        Some(0),
        "kumo {full:?}: {}",
        text(&out.stderr)
    );
    let lines = json_lines(&out);
    assert_numbers_are_numbers(&lines);
    lines
}

#[test]
fn npb_runs_print_numbers_as_numbers() {
    // The native twin needs no KVM; its rows are the VM's less the guest's arena.
    let native = checked(&["native", "--npb", "ep.S,is.S"]);
    assert!(native[0]["time_s"].is_f64(), "{}", native[0]);
    if !kvm_available() {
        return;
    }
    // A result row with the guest's checksums and arena (hex: text), the summary, and
    // KVM's counters.
    let lines = checked(&["--npb", "ep.S", "--kvm-stats"]);
    assert!(
        lines.iter().any(|l| l["kvm_stats"].is_object()),
        "{lines:?}"
    );
    assert!(lines[0]["vcpus"].is_u64(), "{}", lines[0]);
}

#[test]
fn interrupt_runs_print_numbers_as_numbers() {
    if !kvm_available() {
        return;
    }
    let check = checked(&["--irq-check"]);
    assert!(check[0]["delivered"].is_u64(), "{}", check[0]);
    let rounds = checked(&["--irq-check", "--irq-rounds", "50"]);
    assert!(rounds[0]["median_us"].is_number(), "{}", rounds[0]);
    let bench = checked(&["bench", "irq", "--path", "generic", "--rounds", "50"]);
    assert!(bench[0]["host_device_us"].is_f64(), "{}", bench[0]);
}

#[test]
fn the_walk_finds_numbers_hidden_in_strings() {
    let line = serde_json::json!({
        "median_us": "45.55",
        "rows": [{"n": 8, "size": "8"}],
        "fnv": "0123456789012345",
        "arena_start": "0x100000",
        "missing": "NaN",
        "name": "ep",
    });
    let mut found = numeric_strings(&line);
    found.sort();
    assert_eq!(
        found,
        [
            ".median_us = \"45.55\"",
            ".missing = \"NaN\"",
            ".rows[0].size = \"8\""
        ]
    );
}
