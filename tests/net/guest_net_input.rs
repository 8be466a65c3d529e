//! The guest's network keys under kumo (no NIC attached): a bad `mpi=`, `wait=` or
//! `net=` is refused with a named error and status 2 before anything runs, and a
//! well-formed MPI job without a virtio-net device ends with a named error and
//! status 1, never a hang.

use crate::common;

use common::*;

fn boot(cmdline: &str) -> (Option<i32>, String) {
    let guest = dumped_guest();
    let out = kumo(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cmdline",
        cmdline,
        "--vcpus",
        "1",
    ]);
    (out.status.code(), text(&out.stdout))
}

#[test]
fn bad_network_keys_are_refused_by_name() {
    if !kvm_available() {
        return;
    }
    for (cmdline, what) in [
        ("net=check", "what=net-needs-mpi"),
        ("mpi=2:2 net=check", "what=bad-mpi item=2:2"),
        ("mpi=0:65 net=check", "what=bad-mpi item=0:65"),
        (
            "mpi=0:2 wait=sometimes net=check",
            "what=bad-wait item=sometimes",
        ),
        ("mpi=0:2 net=pingpong:", "what=bad-net item=pingpong:"),
        (
            "mpi=0:2 net=check+teleport",
            "what=bad-net item=check+teleport",
        ),
        ("mpi=0:2 net=bw:1,x", "what=bad-net item=bw:1,x"),
        (
            "mpi=0:2 net=check net_rounds=0",
            "what=bad-net-rounds item=0",
        ),
        ("mpi=0:2 net=check net_drop=-1", "what=bad-net-drop item=-1"),
    ] {
        let (code, stdout) = boot(cmdline);
        assert_eq!(code, Some(2), "{cmdline}:\n{stdout}");
        assert!(
            stdout.contains(&format!("@kumo error {what}")),
            "{cmdline}:\n{stdout}"
        );
        assert!(
            stdout.contains("@kumo end status=2"),
            "{cmdline}:\n{stdout}"
        );
        assert!(!stdout.contains("@kumo mpi "), "{cmdline}:\n{stdout}");
    }
}

#[test]
fn an_mpi_job_without_a_nic_fails_cleanly() {
    if !kvm_available() {
        return;
    }
    let (code, stdout) = boot("mpi=0:2 wait=block net=check+pingpong:8");
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("@kumo error what=net item=no-virtio-net"),
        "{stdout}"
    );
    assert!(stdout.contains("@kumo end status=1"), "{stdout}");
}

#[test]
fn a_node_files_bad_net_value_is_one_line_before_any_guest_runs() {
    // The guests would each refuse it (a dozen lines, status 1): kumo refuses it first.
    let node = scratch("bad-net.toml");
    std::fs::write(
        &node,
        "pcpus = [0]\n[network]\nnet = \"check+teleport\"\n\
         [[domain]]\nname = \"a\"\nmpi = true\nvcpus = 2\n",
    )
    .unwrap();
    let out = kumo(&["node", "--config", node.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("'teleport' is not check"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}
