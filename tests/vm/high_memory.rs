//! Guest memory above the 32-bit hole: what does not fit below 3 GiB is a second RAM
//! region at 4 GiB, and the guest runs its workloads' arenas there.

use crate::common;

use common::*;

const FOUR_GIB: u64 = 1 << 32;

/// Each benchmark of `out` verified with its arena in `[4 GiB, 4 GiB + high)`.
fn assert_verified_above_4_gib(out: &std::process::Output, benchmarks: &[&str], high: u64) {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        text(&out.stderr)
    );
    let lines = json_lines(out);
    assert_eq!(lines.len(), benchmarks.len() + 1, "{lines:?}");
    for (line, name) in lines.iter().zip(benchmarks) {
        assert_eq!(line["benchmark"], *name, "{line}");
        assert_eq!(line["verified"], true, "{line}");
        let (start, end) = arena(line);
        assert!(
            start >= FOUR_GIB && start < end && end <= FOUR_GIB + high,
            "the arena [{start:#x}, {end:#x}) is not in the RAM above 4 GiB"
        );
    }
    assert_eq!(lines.last().unwrap()["ok"], true);
}

#[test]
fn a_6_gib_guest_runs_its_workloads_in_memory_above_4_gib() {
    if !kvm_available() {
        return;
    }
    let out = kumo(&["--npb", "ep.S,cg.S", "--memory", "6144", "--json"]);
    // 6144 MiB: 3072 below the hole, 3072 from 4 GiB.
    assert_verified_above_4_gib(&out, &["ep", "cg"], 3072 << 20);

    // Below the hole only, the same workloads stay there.
    let out = kumo(&["--npb", "ep.S", "--memory", "3072", "--json"]);
    let lines = json_lines(&out);
    assert_eq!(lines[0]["verified"], true, "{lines:?}");
    assert!(arena(&lines[0]).1 <= 3 << 30, "{}", lines[0]);
}
