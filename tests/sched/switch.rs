//! `kumo bench switch`: both mechanisms really hand one host CPU back and forth
//! between two vCPUs (the guest sees the switches), and bad input is refused.

use crate::common;

use common::*;

fn switch(mechanism: &str) -> serde_json::Value {
    let out = kumo(&[
        "bench",
        "switch",
        "--mechanism",
        mechanism,
        "--millis",
        "300",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_numbers_are_numbers(&lines);
    lines[0].clone()
}

#[test]
fn both_mechanisms_switch_the_host_cpu_between_vcpus() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    for mechanism in ["fifo", "park"] {
        let row = switch(mechanism);
        assert_eq!(row["mechanism"], mechanism);
        let requested = row["switches_requested"].as_f64().unwrap();
        let seen = row["switches_seen"].as_f64().unwrap();
        // The guest only sees switches that happened: never more than requested (+1
        // for the boot hand-over), and with a 1 ms slice over 300 ms, some.
        assert!(seen > 0.0 && seen <= requested + 1.0, "{row}");
        let median = row["median_us"].as_f64().unwrap();
        let max = row["max_us"].as_f64().unwrap();
        assert!(median > 0.0 && median <= max, "{row}");
    }
}

#[test]
fn the_native_twin_switches_two_host_threads_beside_the_vcpus() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    let out = kumo(&["bench", "switch", "--native", "--millis", "300", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    assert_numbers_are_numbers(&lines);
    let threads = &lines[0]["host_threads"];
    // Two host threads handed over every 1 ms for 300 ms: the matcher finds switches,
    // each a positive time no longer than the longest.
    assert!(threads["switches"].as_u64().unwrap() > 0, "{threads}");
    let median = threads["median_us"].as_f64().unwrap();
    assert!(
        median > 0.0 && median <= threads["max_us"].as_f64().unwrap(),
        "{threads}"
    );
}

#[test]
fn bad_switch_arguments_are_refused() {
    let _turn = take_turn();
    let out = kumo(&["bench", "switch", "--pcpu", "4096"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--pcpu 4096 does not exist"),
        "{}",
        text(&out.stderr)
    );
    let out = kumo(&["bench", "switch", "--slice-us", "5"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--slice-us must be at least 100"));
    let out = kumo(&["bench", "switch", "--native", "--mechanism", "park"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("fifo only"),
        "{}",
        text(&out.stderr)
    );
}
