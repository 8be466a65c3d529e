//! A guest that faults is reported (reason, vCPU, registers) and kumo exits non-zero:
//! never a hang.

use crate::common;

use common::*;

fn boot_faulting(kind: &str, vcpus: &str) -> (Option<i32>, String, String) {
    let guest = dumped_guest();
    let cmdline = format!("fault={kind}");
    let out = kumo(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cmdline",
        &cmdline,
        "--vcpus",
        vcpus,
    ]);
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

#[test]
fn a_triple_fault_stops_the_vm_with_a_report() {
    if kvm_available() {
        let (code, stdout, stderr) = boot_faulting("triple", "2");
        assert_eq!(code, Some(3), "{stdout}\n{stderr}");
        assert!(stderr.contains("triple fault"), "{stderr}");
        assert!(stderr.contains("vCPU 0"), "{stderr}");
        assert!(stderr.contains("rip"), "{stderr}");
    }
}

#[test]
fn a_ring0_invalid_opcode_is_reported_by_the_guest() {
    if kvm_available() {
        let (code, stdout, stderr) = boot_faulting("ud", "1");
        assert_eq!(code, Some(3), "{stdout}\n{stderr}");
        assert!(stdout.contains("@kumo fault"), "{stdout}");
        assert!(stdout.contains("vector=6"), "{stdout}");
    }
}

#[test]
fn a_ring0_page_fault_is_reported_by_the_guest() {
    if kvm_available() {
        let (code, stdout, stderr) = boot_faulting("pagefault", "2");
        assert_eq!(code, Some(3), "{stdout}\n{stderr}");
        assert!(stdout.contains("vector=14"), "{stdout}");
    }
}
