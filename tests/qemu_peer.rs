//! An independent peer: the embedded guest ELF boots under QEMU's PVH loader and
//! verifies there too, so our boot ABI is the standard one and not kumo's private dialect.

mod common;

use std::process::Command;

use common::*;

#[test]
fn the_guest_boots_and_verifies_under_qemu_with_two_vcpus() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let guest = dumped_guest();
    let out = run_with_hang_guard(Command::new("qemu-system-x86_64").args([
        "-accel",
        "kvm",
        "-cpu",
        "host,-cx16,-arch-capabilities,+invtsc",
        "-smp",
        "2",
        "-m",
        "256",
        "-nographic",
        "-no-reboot",
        "-nodefaults",
        "-serial",
        "stdio",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=4",
        "-kernel",
        guest.to_str().unwrap(),
        "-append",
        "npb=ep.S",
    ]));
    let stdout = text(&out.stdout);
    // isa-debug-exit turns the guest's status 0 into QEMU's exit status 1.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("@kumo boot cpus=2"), "{stdout}");
    let result = stdout
        .lines()
        .find(|l| l.starts_with("@kumo result benchmark=ep class=S threads=2"))
        .unwrap_or_else(|| panic!("no EP.S result from QEMU:\n{stdout}"));
    assert!(result.contains("verified=true"), "{result}");
    assert!(stdout.contains("@kumo end status=0"), "{stdout}");
}
