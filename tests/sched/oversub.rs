//! More vCPUs than host CPUs: every kernel verifies at 12 vCPUs with each barrier wait
//! mechanism (and under the credit scheduler), and `kumo bench oversub` reports
//! counters that agree with each other.

use crate::common;

use common::*;

const TWELVE: &str = "12";

/// Every kernel at class S on 12 vCPUs with `extra` options: all verified; with
/// `--vcpu-balloon on` as green threads (the guest reports the host CPUs it ran on),
/// with `off` one thread per vCPU.
fn every_kernel_s_verifies_on_12_vcpus(extra: &[&str]) {
    let list: Vec<String> = npb::Kernel::ALL
        .iter()
        .map(|k| format!("{}.S", k.name()))
        .collect();
    let list = list.join(",");
    let mut args = vec!["--json", "--vcpus", TWELVE, "--npb", &list];
    args.extend_from_slice(extra);
    let out = kumo(&args);
    assert!(
        out.status.success(),
        "kumo {args:?}: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    let lines = json_lines(&out);
    assert_eq!(lines.len(), npb::Kernel::ALL.len() + 1, "{lines:?}");
    for (line, kernel) in lines.iter().zip(npb::Kernel::ALL) {
        assert_eq!(line["benchmark"], kernel.name(), "{line}");
        assert_eq!(line["vcpus"], 12, "{line}");
        assert_eq!(line["verified"], true, "{line}");
        // Only a ballooning guest reports the host CPUs it was told of (`auto`, the
        // default, depends on this host's CPUs: not checked).
        let chosen = extra.windows(2).find(|w| w[0] == "--vcpu-balloon");
        if let Some(on) = chosen.map(|w| w[1] == "on") {
            assert_eq!(line.get("balloon_host_cpus").is_some(), on, "{line}");
        }
    }
}

#[test]
fn every_kernel_verifies_on_12_vcpus_blocking_in_kumo() {
    let _turn = take_turn();
    if kvm_available() {
        every_kernel_s_verifies_on_12_vcpus(&["--barrier-wait", "pv", "--vcpu-balloon", "off"]);
    }
}

#[test]
fn every_kernel_verifies_on_12_vcpus_halting() {
    let _turn = take_turn();
    if kvm_available() {
        every_kernel_s_verifies_on_12_vcpus(&["--barrier-wait", "hlt", "--vcpu-balloon", "off"]);
    }
}

#[test]
fn every_kernel_verifies_on_12_vcpus_ballooned_with_either_wait() {
    let _turn = take_turn();
    if kvm_available() {
        for wait in ["pv", "hlt"] {
            every_kernel_s_verifies_on_12_vcpus(&["--barrier-wait", wait, "--vcpu-balloon", "on"]);
        }
    }
}

/// `kumo ctl vcpu-balloon` moves a running VM's team between 4, 1 and 3 vCPUs; every
/// benchmark still verifies, the last one ran with the last count, and counts the VM
/// cannot take are refused with one line.
#[test]
fn the_ballooned_vcpu_count_changes_while_the_vm_runs() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    let socket = scratch("balloon.sock");
    let list = ["cg.W"; 8].join(",");
    let vm = kumo_background(&[
        "--npb",
        &list,
        "--vcpus",
        "12",
        "--vcpu-balloon",
        "on",
        "--json",
        "--ctl-socket",
        socket.to_str().unwrap(),
    ]);
    wait_for_path(&socket);
    let path = socket.to_str().unwrap();
    for active in ["4", "1", "3"] {
        set_vcpu_balloon(path, &["--active", active], active.parse().unwrap(), 12);
    }
    assert_refused(
        &["ctl", "--socket", path, "vcpu-balloon", "--active", "13"],
        "the VM has 12 vCPUs (give 1 to 12)",
    );
    assert_refused(
        &["ctl", "--socket", path, "vcpu-balloon", "--active", "0"],
        "--active 0: the VM has 12 vCPUs",
    );
    let out = vm.finish();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    let results: Vec<_> = lines
        .iter()
        .filter(|l| l.get("benchmark").is_some())
        .collect();
    assert_eq!(results.len(), 8, "{lines:?}");
    for line in &results {
        assert_eq!(line["verified"], true, "{line}");
    }
    assert_eq!(results[7]["balloon_host_cpus"], 3.0, "{:?}", results[7]);
}

/// `kumo ctl --socket PATH vcpu-balloon ARGS` succeeds and replies that the guest now
/// has `active` host CPUs for its `vcpus` vCPUs.
fn set_vcpu_balloon(path: &str, args: &[&str], active: u64, vcpus: u64) {
    let mut all = vec!["ctl", "--socket", path, "--json", "vcpu-balloon"];
    all.extend_from_slice(args);
    let out = kumo(&all);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let seen = (reply["active"].as_u64(), reply["vcpus"].as_u64());
    assert_eq!(seen, (Some(active), Some(vcpus)), "{reply}");
}

/// In a node, `kumo ctl vcpu-balloon` names the domain; a missing or unknown one is
/// refused, and the domain's benchmarks verify after its count changed.
#[test]
fn a_node_domains_ballooned_vcpu_count_changes_while_it_runs() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    let (config, socket) = (
        scratch("balloon-ctl-node.toml"),
        scratch("balloon-node.sock"),
    );
    let list = ["cg.W"; 6].join(",");
    std::fs::write(
        &config,
        format!(
            "pcpus = [0, 1]\n[[domain]]\nname = \"a\"\nvcpus = 12\nnpb = \"{list}\"\n\
             barrier_wait = \"pv\"\nvcpu_balloon = \"on\"\n"
        ),
    )
    .unwrap();
    let path = socket.to_str().unwrap();
    let node = kumo_background(&[
        "node",
        "--config",
        config.to_str().unwrap(),
        "--ctl-socket",
        path,
        "--json",
    ]);
    wait_for_path(&socket);
    set_vcpu_balloon(path, &["--domain", "a", "--active", "1"], 1, 12);
    assert_refused(
        &["ctl", "--socket", path, "vcpu-balloon", "--active", "2"],
        "name the node's domain with --domain (a)",
    );
    assert_refused(
        &["ctl", "--socket", path, "vcpu-balloon", "--domain", "b"],
        "no domain 'b' (the node has a)",
    );
    let out = node.finish();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    let results = lines[0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "{}", lines[0]);
    assert!(
        results.iter().all(|r| r["verified"] == true),
        "{}",
        lines[0]
    );
    assert_eq!(results[5]["balloon_host_cpus"], 1.0, "{}", results[5]);
}

/// A ballooned VM saved and restored keeps following `kumo ctl vcpu-balloon`: the
/// snapshot carries the guest's word for the count.
#[test]
fn a_restored_ballooned_vm_follows_a_new_count() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    let (first, second, file) = (
        scratch("balloon-src.sock"),
        scratch("balloon-dst.sock"),
        scratch("balloon.snap"),
    );
    let list = ["cg.W"; 6].join(",");
    let source = kumo_background(&[
        "--npb",
        &list,
        "--vcpus",
        "6",
        "--vcpu-balloon",
        "on",
        "--ctl-socket",
        first.to_str().unwrap(),
    ]);
    wait_for_path(&first);
    let save = [
        "ctl",
        "--socket",
        first.to_str().unwrap(),
        "snapshot",
        file.to_str().unwrap(),
        "--stop",
    ];
    // The guest names its word at boot, before the save (the snapshot carries it) or
    // after it (on the restored side): either way the restored VM's kumo knows it.
    loop {
        let out = kumo(&save);
        if out.status.success() {
            break;
        }
        assert!(
            text(&out.stderr).contains("not running yet"),
            "{}",
            text(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(source.finish().status.success());
    let restored = kumo_background(&[
        "--restore",
        file.to_str().unwrap(),
        "--json",
        "--ctl-socket",
        second.to_str().unwrap(),
    ]);
    wait_for_path(&second);
    set_vcpu_balloon(second.to_str().unwrap(), &["--active", "1"], 1, 6);
    let out = restored.finish();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    let last = lines.iter().rfind(|l| l.get("benchmark").is_some());
    let last = last.expect("the restored VM reported results");
    assert_eq!(last["verified"], true, "{last}");
    assert_eq!(last["balloon_host_cpus"], 1.0, "{last}");
}

#[test]
fn a_bad_vcpu_balloon_is_refused() {
    let _turn = take_turn();
    let out = kumo(&["--vcpu-balloon", "maybe", "--npb", "ep.S"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("maybe"), "{}", text(&out.stderr));
    assert_refused(
        &["--kernel", "/nonexistent", "--vcpu-balloon", "on"],
        "--vcpu-balloon does not apply to --kernel runs",
    );
}

#[test]
fn every_kernel_verifies_on_12_vcpus_under_the_credit_scheduler() {
    let _turn = take_turn();
    if kvm_available() {
        every_kernel_s_verifies_on_12_vcpus(&["--sched", "credit:tslice=1ms,tick=1ms"]);
    }
}

#[test]
fn every_kernel_verifies_on_12_vcpus_under_the_credit_scheduler_with_directed_yield() {
    let _turn = take_turn();
    if kvm_available() {
        every_kernel_s_verifies_on_12_vcpus(&[
            "--sched",
            "credit:tslice=1ms,tick=1ms,directed_yield=on",
        ]);
    }
}

#[test]
fn a_bad_barrier_wait_is_refused() {
    let _turn = take_turn();
    let out = kumo(&["--barrier-wait", "yield", "--npb", "ep.S"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("yield"), "{}", text(&out.stderr));
    assert_refused(
        &["--kernel", "/nonexistent", "--barrier-wait", "hlt"],
        "--barrier-wait does not apply to --kernel runs",
    );
}

#[test]
fn bench_oversub_reports_each_setting_and_consistent_counters() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    let out = kumo(&[
        "bench",
        "oversub",
        "--npb",
        "cg.S",
        "--vcpus",
        "3",
        "--runs",
        "1",
        "--balloon",
        "off,on",
        "--json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    let waits: Vec<&str> = lines.iter().map(|l| l["wait"].as_str().unwrap()).collect();
    assert_eq!(waits, ["native", "pv", "pv", "hlt", "hlt"]);
    let ballooned: Vec<bool> = lines
        .iter()
        .map(|l| l["balloon"].as_bool().unwrap())
        .collect();
    assert_eq!(ballooned, [false, false, true, false, true]);
    for line in &lines {
        assert_eq!(line["vcpus"], 3, "{line}");
        assert!(line["median_s"].as_f64().unwrap() > 0.0, "{line}");
    }
    for line in &lines[1..] {
        let barriers = line["barriers"].as_f64().unwrap();
        // CG.S: 15 outer iterations of 25 inner ones, three barriers each, and more.
        assert!(barriers > 15.0 * 25.0 * 3.0, "{line}");
        assert!(
            line["ratio_to_native_median"].as_f64().unwrap() > 0.0,
            "{line}"
        );
    }
    // Only the paravirtual mechanism uses kumo's wait page.
    for line in &lines[3..] {
        assert_eq!(line["per_barrier"]["pv_blocks"], 0.0, "{line}");
    }
    for (flag, list) in [("--wait", "pv,spin"), ("--balloon", "off,maybe")] {
        let bad = kumo(&["bench", "oversub", flag, list]);
        assert_eq!(bad.status.code(), Some(2));
        let needle = list.split(',').nth(1).unwrap();
        assert!(text(&bad.stderr).contains(needle), "{}", text(&bad.stderr));
    }
}

#[test]
fn a_node_domain_of_12_vcpus_verifies_blocking_in_kumo_under_the_credit_scheduler() {
    let _turn = take_turn();
    if kvm_available() {
        node_domain_of_12_vcpus_verifies("oversub-node.toml", "");
    }
}

#[test]
fn a_ballooned_node_domain_of_12_vcpus_verifies_under_the_credit_scheduler() {
    let _turn = take_turn();
    if kvm_available() {
        node_domain_of_12_vcpus_verifies("balloon-node.toml", "vcpu_balloon = \"on\"\n");
    }
}

/// A node of one 12-vCPU domain (with `extra` keys) on 2 pcpus under the credit
/// scheduler: both benchmarks verify (ballooned if `extra` turns it on).
fn node_domain_of_12_vcpus_verifies(file: &str, extra: &str) {
    let path = scratch(file);
    std::fs::write(
        &path,
        format!(
            "pcpus = [0, 1]\n[scheduler]\nkind = \"credit\"\ntslice_ms = 1\ntick_ms = 1\n\
             [[domain]]\nname = \"a\"\nvcpus = 12\nnpb = \"cg.S,mg.S\"\nbarrier_wait = \"pv\"\n{extra}"
        ),
    )
    .unwrap();
    let out = kumo(&["node", "--config", path.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = json_lines(&out);
    assert_eq!(lines[0]["ok"], true, "{}", lines[0]);
    let results = lines[0]["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{}", lines[0]);
    assert!(
        results.iter().all(|r| r["verified"] == true),
        "{}",
        lines[0]
    );
    // A ballooning guest reports the host CPUs it was told of: the node's 2.
    let ballooned = extra.contains("\"on\"");
    for result in results {
        assert_eq!(
            result.get("balloon_host_cpus").is_some(),
            ballooned,
            "{result}"
        );
    }
}

/// Directed yield in a node: a 12-vCPU domain blocking at barriers in kumo beside a
/// domain that never blocks. Off, no vCPU is ever boosted by it; on, the barrier's
/// laggards are (the hint reaches the scheduler), and every result still verifies.
#[test]
fn directed_yield_boosts_a_barriers_laggards_in_a_node_only_when_on() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    for on in [false, true] {
        let path = scratch(&format!("oversub-directed-{on}.toml"));
        std::fs::write(
            &path,
            format!(
                "pcpus = [0, 1]\n[scheduler]\nkind = \"credit\"\ntslice_ms = 1\ntick_ms = 1\n\
                 directed_yield = {on}\n\
                 [[domain]]\nname = \"a\"\nvcpus = 12\nnpb = \"cg.S,mg.S\"\nbarrier_wait = \"pv\"\n\
                 [[domain]]\nname = \"hog\"\nvcpus = 2\nprobe = \"busy:1500\"\n"
            ),
        )
        .unwrap();
        let out = kumo(&["node", "--config", path.to_str().unwrap(), "--json"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let lines = json_lines(&out);
        let a = &lines[0];
        assert_eq!(a["ok"], true, "{a}");
        let results = a["results"].as_array().unwrap();
        assert_eq!(results.len(), 2, "{a}");
        assert!(results.iter().all(|r| r["verified"] == true), "{a}");
        let boosts = a["directed_boosts"].as_u64().unwrap();
        assert_eq!(boosts > 0, on, "directed yield {on}: {boosts} boosts: {a}");
        assert_eq!(lines[1]["directed_boosts"], 0, "{}", lines[1]);
        let node = lines.last().unwrap();
        assert_eq!(node["sched"]["directed_yield"], on, "{node}");
    }
}

/// Most of an oversubscribed VM's vCPUs are blocked in kumo at any moment: a snapshot
/// must still pause every one of them (the kick ends the block), and the restored VM
/// must finish and verify.
#[test]
fn an_oversubscribed_vm_blocked_in_kumo_snapshots_and_restores() {
    let _turn = take_turn();
    if !kvm_available() {
        return;
    }
    let socket = scratch("oversub.sock");
    let file = scratch("oversub.snap");
    let source = kumo_background(&[
        "--npb",
        "cg.W,cg.W,cg.W",
        "--vcpus",
        "6",
        "--json",
        "--ctl-socket",
        socket.to_str().unwrap(),
    ]);
    wait_for_path(&socket);
    let args = [
        "ctl",
        "--socket",
        socket.to_str().unwrap(),
        "snapshot",
        file.to_str().unwrap(),
        "--stop",
    ];
    let ctl = ctl_once_running(&args);
    assert!(ctl.status.success(), "snapshot: {}", text(&ctl.stderr));
    let source_out = source.finish();
    assert!(source_out.status.success(), "{}", text(&source_out.stderr));
    let restored = kumo(&["--restore", file.to_str().unwrap(), "--json"]);
    assert!(restored.status.success(), "{}", text(&restored.stderr));
    let lines = json_lines(&restored);
    let results: Vec<_> = lines
        .iter()
        .filter(|l| l.get("benchmark").is_some())
        .collect();
    assert!(!results.is_empty(), "{lines:?}");
    for line in results {
        assert_eq!(line["benchmark"], "cg", "{line}");
        assert_eq!(line["vcpus"], 6, "{line}");
        assert_eq!(line["verified"], true, "{line}");
    }
}
