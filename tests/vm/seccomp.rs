//! Seccomp per thread kind: a thread of each kind that makes a forbidden call after its
//! filter is on (the `KUMO_SECCOMP_TEST_FORBIDDEN` hook: `personality`) ends kumo with
//! status 3 and one line naming the thread and the call. The rest of the suite runs
//! under the default `--seccomp kill`: that every other test passes is the proof that
//! the filters allow what kumo's threads do.

use crate::common;
use common::*;
use std::process::Output;

/// Runs kumo with the hook aimed at thread kind `kind`.
fn forbidden(kind: &str, args: &[&str]) -> Output {
    run_with_hang_guard(
        kumo_command()
            .env(hv::seccomp::TEST_FORBIDDEN_ENV, kind)
            .args(args),
    )
}

/// Status 3 and the report naming a thread that starts with `thread` and the call.
pub(crate) fn assert_stopped(out: &Output, thread: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("kumo: seccomp: thread "))
        .unwrap_or_else(|| panic!("no seccomp report: {stderr}"));
    let rest = &line["kumo: seccomp: thread ".len()..];
    assert!(rest.starts_with(thread), "{line}");
    assert!(
        rest.ends_with("made forbidden system call 135 (personality)"),
        "{line}"
    );
}

#[test]
fn a_vcpu_thread_making_a_forbidden_call_ends_kumo_with_status_3() {
    if !kvm_available() {
        return;
    }
    assert_stopped(
        &forbidden("vcpu", &["--npb", "ep.S", "--vcpus", "1"]),
        "vcpu0",
    );
}

#[test]
fn the_coordinator_making_a_forbidden_call_ends_kumo_with_status_3() {
    if !kvm_available() {
        return;
    }
    assert_stopped(
        &forbidden("coordinator", &["--npb", "ep.S", "--vcpus", "1"]),
        "coordinator",
    );
}

#[test]
fn a_backend_worker_making_a_forbidden_call_ends_kumo_with_status_3() {
    if !kvm_available() {
        return;
    }
    // The interrupt test device's generic path: its event loop and the device's
    // responder are both backend workers; whichever calls first is stopped.
    let out = forbidden("backend", &["--irq-check", "--vcpus", "1"]);
    let stderr = text(&out.stderr);
    let first = stderr
        .lines()
        .find(|l| l.starts_with("kumo: seccomp: thread "))
        .unwrap_or_default();
    let thread = if first.contains("thread irq-loop ") {
        "irq-loop"
    } else {
        "irq-test-device"
    };
    assert_stopped(&out, thread);
}

#[test]
fn the_credit_driver_making_a_forbidden_call_ends_kumo_with_status_3() {
    if !kvm_available() {
        return;
    }
    let _turn = take_turn();
    let out = forbidden(
        "credit",
        &["--sched", "credit", "--npb", "ep.S", "--vcpus", "1"],
    );
    assert_stopped(&out, "credit");
}

#[test]
fn the_api_thread_making_a_forbidden_call_ends_kumo_with_status_3() {
    if !kvm_available() {
        return;
    }
    let socket = scratch("seccomp-api.sock");
    let _ = std::fs::remove_file(&socket);
    let out = forbidden(
        "api",
        &[
            "--npb",
            "ep.S",
            "--vcpus",
            "1",
            "--api-socket",
            socket.to_str().unwrap(),
        ],
    );
    assert_stopped(&out, "kumo-api");
}

#[test]
fn a_nic_server_port_thread_making_a_forbidden_call_ends_it_with_status_3() {
    // No VM: the port thread confines itself as it starts serving.
    let dir = scratch("seccomp-nic");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let out = forbidden(
        "nic-server",
        &["nic-server", "--dir", dir.to_str().unwrap(), "--ports", "1"],
    );
    assert_stopped(&out, "nic-port0");
}

#[test]
fn with_seccomp_off_no_filter_is_installed() {
    if !kvm_available() {
        return;
    }
    // The hook only fires after a filter is on: off means the guest runs to its end.
    let out = forbidden(
        "vcpu",
        &["--npb", "ep.S", "--vcpus", "1", "--seccomp", "off"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn with_seccomp_log_a_forbidden_call_is_let_through() {
    if !kvm_available() {
        return;
    }
    let out = forbidden(
        "vcpu",
        &["--npb", "ep.S", "--vcpus", "1", "--seccomp", "log"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn an_unknown_seccomp_mode_is_refused() {
    // clap's own refusal (status 2), with kumo's reason.
    let out = kumo(&["--seccomp", "strict"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("'strict' is not a seccomp mode (off, log or kill)"),
        "{stderr}"
    );
}
