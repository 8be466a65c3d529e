//! What a hostile guest and careless input must not do: lose the verdict when stdout is
//! closed, make kumo read without bound, be silently ignored, leave sockets behind, or
//! hang kumo forever.

mod common;

use common::*;
use hv::testing::{PvhImage, asm};

/// A kernel image written to a scratch file.
fn kernel(name: &str, parts: &[Vec<u8>]) -> std::path::PathBuf {
    let path = scratch(name);
    std::fs::write(&path, PvhImage::new(&parts.concat()).build()).unwrap();
    path
}

#[test]
fn a_closed_stdout_keeps_the_guest_exit_status() {
    if kvm_available() {
        let k = kernel(
            "print-then-5.elf",
            &[asm::com1_print(&[b'x'; 200]), asm::debug_exit(5)],
        );
        let out = kumo_with_stdout_closed(&["--kernel", k.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    }
}

#[test]
fn a_closed_stdout_keeps_the_crash_report() {
    if kvm_available() {
        let guest = dumped_guest();
        let out = kumo_with_stdout_closed(&[
            "--kernel",
            guest.to_str().unwrap(),
            "--cmdline",
            "fault=triple",
            "--vcpus",
            "1",
        ]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(stderr.contains("triple fault"), "{stderr}");
        assert!(stderr.contains("rip"), "{stderr}");
    }
}

#[test]
fn a_closed_stdout_keeps_the_guests_own_verdict() {
    if kvm_available() {
        // fault=ud: our guest reports the ring-0 fault and exits with its fault status.
        let guest = dumped_guest();
        let out = kumo_with_stdout_closed(&[
            "--kernel",
            guest.to_str().unwrap(),
            "--cmdline",
            "npb=ep.S fault=ud",
            "--vcpus",
            "1",
        ]);
        assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
        // The embedded-guest mode: its table is lost, its exit status is not.
        let ok = kumo_with_stdout_closed(&["--npb", "ep.S", "--vcpus", "1", "--json"]);
        assert_eq!(ok.status.code(), Some(0), "{}", text(&ok.stderr));
    }
}

fn assert_refused_quickly(args: &[&str], needle: &str) {
    let out = kumo(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "kumo {args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(needle),
        "kumo {args:?}: {stderr:?} lacks {needle:?}"
    );
}

#[test]
fn devices_fifos_and_huge_files_are_refused_before_reading() {
    let fifo = scratch("a-fifo");
    let _ = std::fs::remove_file(&fifo);
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let fifo = fifo.to_str().unwrap();
    // A sparse file far larger than guest memory: refused by its size, unread.
    let sparse = scratch("sparse-4g");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    let sparse = sparse.to_str().unwrap();
    let ok = kernel("ok.elf", &[asm::debug_exit(0)]);
    let ok = ok.to_str().unwrap();

    assert_refused_quickly(&["--kernel", fifo], "not a regular file (a FIFO)");
    assert_refused_quickly(&["--kernel", "/dev/zero"], "a character device");
    assert_refused_quickly(
        &["--kernel", ok, "--module", "/dev/zero"],
        "a character device",
    );
    assert_refused_quickly(&["--kernel", ok, "--module", fifo], "a FIFO");
    assert_refused_quickly(
        &["--kernel", ok, "--module", sparse],
        "is 4294967296 bytes; at most 268435456 fit",
    );
    assert_refused_quickly(&["node", "--config", "/dev/zero"], "a character device");
    assert_refused_quickly(&["node", "--config", fifo], "a FIFO");
    assert_refused_quickly(&["node", "--config", sparse], "at most 1048576 fit");
    assert_refused_quickly(&["sim", "--config", "/dev/zero"], "a character device");
}
