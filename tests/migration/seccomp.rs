//! Seccomp on the migration threads: the destination's thread that tells the source
//! the VM runs confines itself; a forbidden call there ends the destination with
//! status 3 naming the thread and the call (tests/vm/seccomp.rs has the other kinds).

use crate::common;
use crate::migration::{free_port, migrate, source, token, wait_listening};
use common::*;

#[test]
fn a_migration_thread_making_a_forbidden_call_ends_kumo_with_status_3() {
    if !kvm_available() {
        return;
    }
    let port = free_port();
    let secret = token("seccomp.token", "seccomp migration secret\n");
    let dst = kumo_background_with_env(
        &[
            "--incoming",
            &format!("tcp:127.0.0.1:{port}"),
            "--token-file",
            secret.to_str().unwrap(),
            "--json",
        ],
        &[(hv::seccomp::TEST_FORBIDDEN_ENV, "migration")],
    );
    wait_listening(port);
    let socket = scratch("seccomp-mig.sock");
    let src = source(&socket);
    // The source may or may not hear "running" before the destination dies: either
    // way its side is not what this test is about.
    let _ = migrate(&socket, port, &secret);
    drop(src);
    let out = dst.finish();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains(
            "kumo: seccomp: thread migrate-ack made forbidden system call 135 (personality)"
        ),
        "{stderr}"
    );
}
