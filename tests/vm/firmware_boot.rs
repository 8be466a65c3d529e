//! Booting kumo's NPB guest the way a cloud image boots: rust-hypervisor-firmware (a
//! third-party PVH firmware, `../shared/peers/`) finds the virtio-blk disk `kumo
//! disk-image` wrote, reads its GPT, FAT partition and Boot Loader Specification entry,
//! and starts the guest through the Linux boot protocol. Under kumo, and under QEMU
//! with the same firmware and image (the peer check).

use crate::common;

use common::{assert_refused, kumo, kvm_available, scratch, text};

/// Writes a disk image for `npb` with `kumo disk-image`.
fn disk_image(name: &str, npb: &str) -> std::path::PathBuf {
    let path = scratch(name);
    let out = kumo(&["disk-image", "--out", path.to_str().unwrap(), "--npb", npb]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("npb=ep.S"),
        "{}",
        text(&out.stdout)
    );
    path
}

/// The firmware got to the guest through its boot entry, and the guest verified EP.S
/// on 2 CPUs and ended with status 0 (its lines on the serial console).
fn assert_booted_through_the_firmware(console: &str) {
    assert!(console.contains("Found EFI partition"), "{console}");
    assert!(console.contains("Jumping to kernel"), "{console}");
    common::assert_ep_s_verified(console, 2);
}

#[test]
fn the_firmware_boots_the_npb_guest_from_a_generated_disk_under_kumo() {
    if !kvm_available() {
        return;
    }
    let Some(fw) = common::peer_firmware() else {
        return;
    };
    let image = disk_image("fw-ep.img", "ep.S");
    let before = std::fs::read(&image).unwrap();
    let out = kumo(&[
        "--kernel",
        fw.to_str().unwrap(),
        "--disk",
        &format!("{},readonly", image.display()),
        "--vcpus",
        "2",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_booted_through_the_firmware(&stdout);
    assert_eq!(std::fs::read(&image).unwrap(), before);
}

#[test]
fn qemu_boots_the_same_image_with_the_same_firmware() {
    if !kvm_available() || !common::qemu_available() {
        return;
    }
    let Some(fw) = common::peer_firmware() else {
        return;
    };
    let image = disk_image("fw-ep-qemu.img", "ep.S");
    // SeaBIOS (QEMU's default firmware) assigns the PCI BARs, which the PVH-booted
    // firmware expects of whoever started it; it then boots the firmware as a PVH
    // kernel. The device must be virtio 1.x only (device ID 0x1042), as on kumo.
    let drive = format!(
        "file={},format=raw,if=none,id=d0,readonly=on",
        image.display()
    );
    let out = common::run_with_hang_guard(
        std::process::Command::new("qemu-system-x86_64")
            .args(["-M", "q35", "-accel", "kvm"])
            .args(["-cpu", "host,-cx16,-arch-capabilities,+invtsc", "-smp", "2"])
            .args(["-m", "256", "-nographic", "-no-reboot", "-nodefaults"])
            .args(["-serial", "stdio"])
            .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
            .args(["-drive", &drive])
            .args([
                "-device",
                "virtio-blk-pci,drive=d0,disable-legacy=on,romfile=",
            ])
            .arg("-kernel")
            .arg(&fw),
    );
    let stdout = text(&out.stdout);
    // QEMU's isa-debug-exit: (status << 1) | 1.
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert_booted_through_the_firmware(&stdout);
}

#[test]
fn bad_disk_image_requests_are_refused_in_one_line() {
    let out = scratch("refused.img");
    let out = out.to_str().unwrap();
    assert_refused(&["disk-image", "--out", out, "--npb", "xx.S"], "unknown");
    assert_refused(
        &["disk-image", "--out", out, "--cmdline", "a\nlinux /other"],
        "printable ASCII only",
    );
    assert_refused(
        &["disk-image", "--out", "/nonexistent/dir/disk.img"],
        "cannot create /nonexistent/dir/disk.img",
    );
}
