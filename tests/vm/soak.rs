//! `kumo bench soak`: boots and loopback migrations in one process, failing if RSS,
//! descriptors or threads grow after the warm-up. No timing is asserted.
//!
//! The tests hold all three to the target: exit 0, nothing grew (RSS within 1 MiB of
//! the baseline, descriptors and threads not at all). RSS stays flat because kumo
//! keeps glibc's mmap threshold fixed (`kumo::heap`; docs/results/2026-11-28-soak.md).

use crate::common;

use common::*;

/// Runs `kumo bench soak --json` with `args`; its sample rows and its verdict line.
fn soak(args: &[&str]) -> (Vec<serde_json::Value>, serde_json::Value) {
    let mut all = vec!["bench", "soak", "--json"];
    all.extend_from_slice(args);
    let out = kumo(&all);
    let stderr = text(&out.stderr);
    let mut lines = json_lines(&out);
    assert_numbers_are_numbers(&lines);
    let verdict = lines.pop().expect("a verdict line");
    let grew: Vec<&str> = verdict["grew"]
        .as_array()
        .expect("grew is a list")
        .iter()
        .map(|g| g["resource"].as_str().unwrap())
        .collect();
    assert_eq!(out.status.code(), Some(0), "{verdict}\n{stderr}");
    assert!(grew.is_empty(), "{verdict}");
    (lines, verdict)
}

/// What a soak's verdict says stayed flat: the descriptors and threads after the
/// warm-up, as the last sample.
fn assert_flat(samples: &[serde_json::Value], verdict: &serde_json::Value) {
    let (baseline, last) = (&verdict["baseline"], &verdict["last"]);
    assert_eq!(baseline["fds"], last["fds"], "{verdict}");
    assert_eq!(baseline["threads"], last["threads"], "{verdict}");
    let last_sample = samples.last().expect("samples");
    for key in ["rss_bytes", "fds", "threads"] {
        assert_eq!(last_sample[key], last[key], "{key}: {verdict}");
    }
}

#[test]
fn a_few_boots_leave_no_descriptor_or_thread_behind() {
    if !kvm_available() {
        return;
    }
    let (samples, verdict) = soak(&["--boots", "4", "--migrations", "0", "--every", "2"]);
    let iterations: Vec<u64> = samples
        .iter()
        .map(|s| s["iteration"].as_u64().unwrap())
        .collect();
    assert_eq!(iterations, [2, 4]);
    assert_eq!(samples[1]["boots"], 4);
    assert_eq!(verdict["warmup_iterations"], 1, "{verdict}");
    assert_flat(&samples, &verdict);
}

/// The short form of the soak (the long one is 1,000 boots and 100 migrations:
/// docs/results/2026-11-28-soak.md).
#[test]
#[ignore = "about a minute: 100 boots and 10 live migrations"]
fn a_hundred_boots_and_ten_migrations_hold_resources_flat() {
    if !kvm_available() {
        return;
    }
    let (samples, verdict) = soak(&["--boots", "100", "--migrations", "10", "--every", "10"]);
    assert_eq!(samples.len(), 11, "{samples:?}");
    let last = samples.last().unwrap();
    assert_eq!(
        (last["boots"].as_u64(), last["migrations"].as_u64()),
        (Some(100), Some(10))
    );
    assert_flat(&samples, &verdict);
}

#[test]
fn soak_refuses_an_interval_of_zero() {
    assert_refused(
        &["bench", "soak", "--every", "0"],
        "--every must be at least 1",
    );
}
