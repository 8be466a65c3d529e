//! An independent peer: the embedded guest ELF boots under QEMU's PVH loader and
//! verifies there too, so our boot ABI is the standard one and not kumo's private dialect.

use crate::common;

use common::*;

#[test]
fn the_guest_boots_and_verifies_under_qemu_with_two_vcpus() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let guest = dumped_guest();
    let out = run_with_hang_guard(
        qemu(2)
            .arg("-kernel")
            .arg(&guest)
            .args(["-append", "npb=ep.S"]),
    );
    let stdout = text(&out.stdout);
    // isa-debug-exit turns the guest's status 0 into QEMU's exit status 1.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_ep_s_verified(&stdout, 2);
}
