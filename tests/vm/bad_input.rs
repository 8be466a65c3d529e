//! Every kind of bad input gets a one-line error naming the problem and a non-zero exit,
//! before any guest runs.

use crate::common;

use common::*;

/// Runs kumo, expects failure and a single `kumo: error:` line containing `needle`.
fn assert_rejected(args: &[&str], needle: &str) {
    let out = kumo(args);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "kumo {args:?} succeeded:\n{}",
        text(&out.stdout)
    );
    assert_eq!(out.status.code(), Some(2), "kumo {args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "kumo {args:?}: not one line:\n{stderr}");
    assert!(lines[0].starts_with("kumo: error: "), "{stderr}");
    assert!(
        lines[0].contains(needle),
        "kumo {args:?}: {stderr:?} lacks {needle:?}"
    );
    assert!(
        out.stdout.is_empty(),
        "kumo {args:?} printed {}",
        text(&out.stdout)
    );
}

#[test]
fn a_missing_kernel_is_named() {
    assert_rejected(
        &["--kernel", "/nonexistent/vmlinux"],
        "cannot read kernel /nonexistent/vmlinux",
    );
}

#[test]
fn an_unreadable_kernel_is_named() {
    let dir = scratch("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    assert_rejected(&["--kernel", dir.to_str().unwrap()], "cannot read kernel");
}

#[test]
fn a_missing_module_is_named() {
    if kvm_available() {
        let guest = dumped_guest();
        assert_rejected(
            &[
                "--kernel",
                guest.to_str().unwrap(),
                "--module",
                "/nonexistent/initrd",
            ],
            "cannot read module /nonexistent/initrd",
        );
    }
}

#[test]
fn a_file_that_is_not_an_elf_is_refused() {
    if kvm_available() {
        let path = scratch("not-an-elf");
        std::fs::write(&path, b"#!/bin/sh\necho this is not a kernel\n").unwrap();
        assert_rejected(&["--kernel", path.to_str().unwrap()], "not an ELF");
    }
}

#[test]
fn an_elf_without_the_pvh_note_is_refused() {
    if kvm_available() {
        let path = scratch("no-pvh-note.elf");
        std::fs::write(
            &path,
            hv::testing::PvhImage::new(&[0xf4])
                .without_pvh_note()
                .build(),
        )
        .unwrap();
        assert_rejected(&["--kernel", path.to_str().unwrap()], "PVH");
    }
}

#[test]
fn zero_vcpus_is_refused() {
    if kvm_available() {
        assert_rejected(&["--vcpus", "0"], "--vcpus must be at least 1");
    }
}

#[test]
fn vcpus_above_the_kvm_limit_are_refused_with_the_limit() {
    if kvm_available() {
        assert_rejected(&["--vcpus", "100000"], "KVM limit of");
    }
}

#[test]
fn too_little_memory_for_the_workload_is_refused_before_boot() {
    if kvm_available() {
        assert_rejected(&["--npb", "ep.S", "--memory", "4"], "too small for ep.S");
    }
}

#[test]
fn memory_beyond_what_the_host_allows_is_refused_with_the_limit() {
    if !kvm_available() {
        return;
    }
    // Above kumo's own cap (256 GiB), whatever the host.
    assert_rejected(&["--npb", "ep.S", "--memory", "300000"], "at most");
    assert_rejected(
        &["--npb", "ep.S", "--memory", "18446744073709551615"],
        "at most",
    );
    // Above this host's physical RAM.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    let above = (total_kib / 1024 + 1).to_string();
    assert_rejected(
        &["--npb", "ep.S", "--memory", &above],
        &format!("physical RAM: at most {} MiB", total_kib / 1024),
    );
    // Above an unprivileged address-space limit (ulimit -v 2 GiB).
    let out = run_with_hang_guard(std::process::Command::new("sh").args([
        "-c",
        &format!(
            "ulimit -v 2097152 && exec {} --npb ep.S --memory 3000",
            kumo_bin()
        ),
    ]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("ulimit -v): at most 2048 MiB"), "{err}");
}

#[test]
fn unknown_benchmarks_and_classes_are_named() {
    assert_rejected(&["--npb", "xx.S"], "xx");
    assert_rejected(&["--npb", "ep.Q"], "Q");
    assert_rejected(&["--npb", "ep"], "ep");
    // Every benchmark here has S to C; NPB's larger classes are not here.
    assert_rejected(&["--npb", "sp.S,cg.D"], "D");
}

#[test]
fn a_missing_kvm_device_says_kvm_is_unavailable() {
    assert_rejected(
        &["--kvm-device", "/nonexistent/kvm"],
        "KVM is not available",
    );
}

#[test]
fn a_kvm_device_without_permission_says_so() {
    // Root may open anything, so drop to an unprivileged user for this one.
    if !kvm_available() || !std::path::Path::new("/usr/bin/setpriv").exists() {
        return;
    }
    let out = run_with_hang_guard(
        std::process::Command::new("/usr/bin/setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                kumo_bin(),
            ])
            .args(["--npb", "ep.S"]),
    );
    let stderr = text(&out.stderr);
    if stderr.contains("Permission denied") && !stderr.contains("kumo") {
        // The binary itself is not reachable for that user (a private target dir).
        eprintln!("SKIPPED: {stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("permission"), "{stderr}");
}

#[test]
fn usage_errors_exit_non_zero() {
    for args in [&["--cmdline", "x"][..], &["--vcpus", "many"], &["--bogus"]] {
        let out = kumo(args);
        assert_eq!(out.status.code(), Some(2), "kumo {args:?}");
        assert!(text(&out.stderr).contains("error"), "kumo {args:?}");
    }
}

#[test]
fn more_vcpus_than_the_guest_supports_are_refused() {
    if kvm_available() {
        assert_rejected(&["--vcpus", "65"], "kumo's NPB guest supports (64)");
    }
}

/// `kumo ... | head` closes our stdout early: kumo stops quietly, not with an error.
#[test]
fn a_closed_stdout_ends_kumo_quietly() {
    let mut child = kumo_command()
        .args(["native", "--npb", "ep.S", "--threads", "1"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

#[test]
fn a_control_socket_path_that_is_a_regular_file_is_left_alone() {
    if !kvm_available() {
        return;
    }
    let file = scratch("not-a-socket");
    std::fs::write(&file, b"precious").unwrap();
    assert_rejected(
        &["--ctl-socket", file.to_str().unwrap(), "--timeout", "30"],
        "is not a socket",
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
}
