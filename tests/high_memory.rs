//! Guest memory above the 32-bit hole: what does not fit below 3 GiB is a second RAM
//! region at 4 GiB, and the guest runs its workloads' arenas there.

mod common;

use common::*;

const FOUR_GIB: u64 = 1 << 32;

fn hex(v: &serde_json::Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

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
        let (start, end) = (hex(&line["arena_start"]), hex(&line["arena_end"]));
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
    assert!(hex(&lines[0]["arena_end"]) <= 3 << 30, "{}", lines[0]);
}

/// 4608 MiB: the high region holds 1.5 GiB, but a snapshot holds only the pages the
/// guest wrote (the memfd's holes are skipped), so it stays small.
#[test]
fn a_guest_with_memory_above_4_gib_is_snapshotted_and_restored() {
    if !kvm_available() {
        return;
    }
    let socket = scratch("high.sock");
    let file = scratch("high.snap");
    let source = kumo_background(&[
        "--npb",
        "ep.A",
        "--memory",
        "4608",
        "--json",
        "--ctl-socket",
        socket.to_str().unwrap(),
    ]);
    wait_for_path(&socket);
    let ctl = loop {
        let out = kumo(&[
            "ctl",
            "--socket",
            socket.to_str().unwrap(),
            "snapshot",
            file.to_str().unwrap(),
            "--stop",
        ]);
        if out.status.success() || !text(&out.stderr).contains("not running yet") {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(ctl.status.success(), "snapshot: {}", text(&ctl.stderr));
    let source_out = source.finish();
    assert!(
        text(&source_out.stdout).is_empty(),
        "the source stopped midway\n{}",
        text(&source_out.stdout)
    );
    let restored = kumo(&["--restore", file.to_str().unwrap(), "--json"]);
    assert_verified_above_4_gib(&restored, &["ep"], 1536 << 20);
}
