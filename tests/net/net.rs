//! VMs that talk: the embedded guest's MPI over kumo's virtio-net NICs and domain 0's
//! switch (`kumo mpi`, `kumo bench net`), on both interrupt paths and both wait modes.

use crate::common;

use common::*;

/// One job at a time: every rank spins on a vCPU of its own, and several jobs at once
/// on a 2-core host only test how long the guests' patience lasts.
use crate::common::ONE_AT_A_TIME as ONE_JOB;

fn one_job() -> std::sync::MutexGuard<'static, ()> {
    ONE_JOB.lock().unwrap_or_else(|e| e.into_inner())
}

/// `kumo mpi ... --json`: every rank's check verified, and the job line says ok.
fn assert_job_verified(args: &[&str], ranks: usize) {
    let _one = one_job();
    let mut full = vec!["mpi", "--json", "--timeout", "120"];
    full.extend_from_slice(args);
    let out = kumo(&full);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "kumo {full:?}: {stderr}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), ranks + 1, "{}", text(&out.stdout));
    assert_numbers_are_numbers(&lines);
    for (rank, line) in lines[..ranks].iter().enumerate() {
        assert_eq!(line["rank"], serde_json::json!(rank), "{line}");
        assert_eq!(line["verified"], serde_json::json!(true), "{line}");
        assert_eq!(line["mismatches"], serde_json::json!(0), "{line}");
        assert_eq!(line["collectives_failed"], serde_json::json!(0), "{line}");
    }
    assert_eq!(lines[ranks]["ok"], serde_json::json!(true));
}

#[test]
fn two_vms_pass_the_mpi_check_on_both_paths_spinning() {
    if kvm_available() {
        assert_job_verified(&["--irq-path", "generic"], 2);
        assert_job_verified(&["--irq-path", "fast"], 2);
    }
}

#[test]
fn two_vms_pass_the_mpi_check_on_both_paths_blocking() {
    if kvm_available() {
        assert_job_verified(&["--wait", "block", "--irq-path", "generic"], 2);
        assert_job_verified(&["--wait", "block", "--irq-path", "fast"], 2);
    }
}

#[test]
fn two_vms_of_two_vcpus_pass_the_mpi_check_with_one_rank_per_vcpu() {
    if kvm_available() {
        let two_by_two = ["--vms", "2", "--vcpus", "2", "--wait", "block"];
        for path in ["generic", "fast"] {
            let mut args = two_by_two.to_vec();
            args.extend(["--irq-path", path]);
            assert_job_verified(&args, 4);
        }
    }
}

/// A VM's two ranks each sleep on their own NIC's interrupts: on the fast path each NIC's
/// vectors have GSIs of their own in the VM's one routing table (a second table per
/// device once left the second NIC's interrupts undelivered: its rank only woke at its
/// timeouts).
#[test]
fn every_nic_of_a_vm_wakes_its_own_rank_on_both_paths() {
    if !kvm_available() {
        return;
    }
    let _one = one_job();
    for path in ["generic", "fast"] {
        let config = scratch(&format!("one-vm-two-ranks-{path}.toml"));
        std::fs::write(
            &config,
            format!(
                "pcpus = [0, 1]\n[network]\nnet = \"check\"\nwait = \"block\"\n\
                 irq_path = \"{path}\"\n[[domain]]\nname = \"a\"\nvcpus = 2\nmpi = true\n"
            ),
        )
        .unwrap();
        let out = kumo(&["node", "--config", config.to_str().unwrap(), "--json"]);
        assert_eq!(out.status.code(), Some(0), "{path}: {}", text(&out.stderr));
        let domain = &json_lines(&out)[0];
        let stats: Vec<&serde_json::Value> = domain["probes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["probe"] == "mpistats")
            .collect();
        assert_eq!(stats.len(), 2, "{path}: {domain}");
        for rank in stats {
            let sleeps = rank["sleeps"].as_f64().unwrap();
            let interrupts = rank["interrupts"].as_f64().unwrap();
            assert!(
                sleeps == 0.0 || interrupts > 0.0,
                "{path}: rank {} slept {sleeps} times and no interrupt woke it",
                rank["rank"]
            );
        }
    }
}

#[test]
fn four_vms_pass_the_mpi_check() {
    if kvm_available() {
        assert_job_verified(&["--vms", "4"], 4);
    }
}

#[test]
fn the_net_bench_reports_every_size() {
    if kvm_available() {
        let _one = one_job();
        let out = kumo(&[
            "bench",
            "net",
            "--sizes",
            "8,64K",
            "--rounds",
            "20",
            "--irq-path",
            "fast",
            "--wait",
            "spin",
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let lines = json_lines(&out);
        // Numbers are JSON numbers (jq and pandas users get numbers, not text).
        assert_numbers_are_numbers(&lines);
        let sizes: Vec<u64> = lines.iter().map(|l| l["size"].as_u64().unwrap()).collect();
        assert_eq!(sizes, [8, 65536, 8, 65536]);
        // Both NICs side by side, each with its switch thread's work.
        let nics: Vec<&str> = lines.iter().map(|l| l["nic"].as_str().unwrap()).collect();
        assert_eq!(nics, ["emulated", "emulated", "passthrough", "passthrough"]);
        for line in &lines {
            let median = line["median_us"].as_f64().unwrap();
            assert!(median > 0.0, "{line}");
            assert!(line["switch_frames"].as_u64().unwrap() >= 40, "{line}");
            assert!(line["switch_busy_us"].as_f64().unwrap() > 0.0, "{line}");
        }
    }
}

#[test]
fn bad_network_input_is_refused_in_one_line() {
    for (args, needle) in [
        (
            &["mpi", "--vms", "0"][..],
            "--vms must be between 1 and 64, not 0",
        ),
        (
            &["mpi", "--vms", "1"][..],
            "an MPI job needs 2 to 64 ranks (one per vCPU), not 1",
        ),
        (
            &["mpi", "--vms", "33", "--vcpus", "2"][..],
            "an MPI job needs 2 to 64 ranks (one per vCPU), not 66",
        ),
        (&["mpi", "--vms", "65"][..], "not 65"),
        (&["bench", "net", "--sizes", "0"][..], "bad message size"),
        (&["bench", "net", "--sizes", "65M"][..], "bad message size"),
    ] {
        assert_refused(args, needle);
    }
}

#[test]
fn two_kumo_processes_share_one_wire() {
    if kvm_available() {
        let _one = one_job();
        let socket = scratch("kumo-kumo.sock");
        let _ = std::fs::remove_file(&socket);
        let listen = format!("listen:unix:{}", socket.display());
        let connect = format!("unix:{}", socket.display());
        let first = std::thread::spawn(move || {
            kumo(&[
                "mpi",
                "--vms",
                "1",
                "--job-size",
                "2",
                "--wire",
                &listen,
                "--json",
                "--timeout",
                "120",
            ])
        });
        let second = kumo(&[
            "mpi",
            "--vms",
            "1",
            "--job-size",
            "2",
            "--first-rank",
            "1",
            "--wire",
            &connect,
            "--json",
            "--timeout",
            "120",
        ]);
        let first = first.join().unwrap();
        for (rank, out) in [first, second].iter().enumerate() {
            assert_eq!(
                out.status.code(),
                Some(0),
                "rank {rank}: {}",
                text(&out.stderr)
            );
            let lines = json_lines(out);
            assert_eq!(lines[0]["rank"], serde_json::json!(rank));
            assert_eq!(lines[0]["verified"], serde_json::json!(true));
        }
        assert!(!socket.exists(), "the listener's socket was left behind");
    }
}

#[test]
fn bad_wire_input_is_refused_in_one_line() {
    for (args, needle) in [
        (
            &[
                "mpi",
                "--vms",
                "1",
                "--job-size",
                "2",
                "--wire",
                "unix:/nonexistent/w.sock",
                "--wire-wait",
                "0.1",
            ][..],
            "cannot reach the wire /nonexistent/w.sock",
        ),
        (
            &[
                "mpi",
                "--vms",
                "1",
                "--job-size",
                "2",
                "--wire",
                "tcp:127.0.0.1:1",
                "--wire-wait",
                "0.1",
            ][..],
            "cannot reach the wire tcp:127.0.0.1:1 within 0.1 s: Connection refused",
        ),
        (
            &[
                "mpi",
                "--vms",
                "1",
                "--job-size",
                "2",
                "--wire",
                "listen:tcp:192.0.2.1:5000",
            ][..],
            "cannot listen on tcp:192.0.2.1:5000",
        ),
        (
            &["mpi", "--vms", "1", "--job-size", "2"][..],
            "give a --wire",
        ),
        (
            &[
                "mpi",
                "--vms",
                "2",
                "--job-size",
                "3",
                "--first-rank",
                "2",
                "--wire",
                "unix:/x",
            ][..],
            "do not fit",
        ),
    ] {
        assert_refused(args, needle);
    }
}

#[test]
#[ignore = "slow (8 s in a debug build): .ci/run runs it with --include-ignored"]
fn a_node_runs_an_mpi_job_under_the_credit_scheduler_with_its_switch_in_domain_0() {
    if kvm_available() {
        let _one = one_job();
        let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mpi.toml");
        let out = kumo(&["node", "--config", config, "--json", "--timeout", "120"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let lines = json_lines(&out);
        let domains: Vec<&serde_json::Value> =
            lines.iter().filter(|l| l.get("domain").is_some()).collect();
        assert_eq!(domains.len(), 2, "{}", text(&out.stdout));
        for d in &domains {
            assert_eq!(d["ok"], serde_json::json!(true), "{d}");
        }
        // The switch's work was charged to domain 0.
        let node = lines.iter().find(|l| l.get("dom0_cpu_s").is_some());
        let dom0 = node.and_then(|n| n["dom0_cpu_s"].as_f64()).unwrap_or(0.0);
        assert!(dom0 > 0.0, "{}", text(&out.stdout));
    }
}

#[test]
fn a_node_runs_npb_mpi_across_domains_consolidated_on_one_pcpu() {
    if kvm_available() {
        let _one = one_job();
        let config = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/s1-mpi.toml");
        let out = kumo(&["node", "--config", config, "--json", "--timeout", "300"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        let lines = json_lines(&out);
        let rank0 = lines
            .iter()
            .find(|l| l["domain"] == "rank0")
            .expect("rank0's line");
        assert_eq!(rank0["ok"], serde_json::json!(true), "{rank0}");
        let results = rank0["results"].as_array().expect("results");
        assert_eq!(results.len(), 1, "{rank0}");
        assert_eq!(results[0]["benchmark"], "cg", "{rank0}");
        assert_eq!(results[0]["verified"], serde_json::json!(true), "{rank0}");
    }
}

#[test]
fn blocking_ranks_really_halt_between_messages() {
    if kvm_available() {
        let _one = one_job();
        // Two ranks on one pCPU, waiting by halting: each must sleep (the guest counts
        // its sleeps), or the rank it waits for cannot run until the slice ends.
        let config = scratch("block.toml");
        std::fs::write(
            &config,
            "pcpus = [0]\n[scheduler]\nkind = \"credit\"\ntslice_ms = 30\ntick_ms = 10\n\
             [network]\nnpb = \"cg.S\"\nwait = \"block\"\n\
             [[domain]]\nname = \"rank0\"\nmpi = true\n[[domain]]\nname = \"rank1\"\nmpi = true\n",
        )
        .unwrap();
        let lines = node_json(&config, 300);
        for rank in ["rank0", "rank1"] {
            let domain = lines.iter().find(|l| l["domain"] == rank).expect(rank);
            let stats = domain["probes"]
                .as_array()
                .and_then(|p| p.iter().find(|p| p["probe"] == "mpistats"))
                .unwrap_or_else(|| panic!("{rank}: no mpistats: {domain}"));
            let sleeps = stats["sleeps"].as_f64().unwrap_or(0.0);
            assert!(sleeps > 0.0, "{rank} never halted: {stats}");
        }
    }
}
