//! Third-party-style PVH kernels, assembled from tests/kernels/pvh-tiny.S with binutils
//! as ELF32 and as ELF64, boot under `kumo --kernel` and end as they say.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{kumo, kvm_available, scratch, text};

const SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels/pvh-tiny.S");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kernels/pvh-tiny.ld");
const BANNER: &str = "tiny PVH kernel: hello\nlast words before the end\n";

#[derive(Clone, Copy, Debug)]
enum Class {
    Elf32,
    Elf64,
}

/// Assembles and links the tiny kernel; `halt` makes it `cli; hlt` forever instead of
/// exiting with `status`.
fn build(class: Class, status: u8, halt: bool) -> PathBuf {
    let (bits, emulation) = match class {
        Class::Elf32 => ("--32", "elf_i386"),
        Class::Elf64 => ("--64", "elf_x86_64"),
    };
    let name = format!("pvh-{class:?}-{status}-{halt}");
    let object = scratch(&format!("{name}.o"));
    let elf = scratch(&format!("{name}.elf"));
    run(Command::new("as")
        .arg(bits)
        .args(["--defsym", &format!("EXIT_STATUS={status}")])
        .args(["--defsym", &format!("HALT={}", u8::from(halt))])
        .arg("-o")
        .arg(&object)
        .arg(SOURCE));
    run(Command::new("ld")
        .args(["-m", emulation, "-T", SCRIPT, "-o"])
        .arg(&elf)
        .arg(&object));
    elf
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (binutils is needed)"));
    assert!(out.status.success(), "{cmd:?}: {}", text(&out.stderr));
}

fn elf_class(path: &Path) -> u8 {
    std::fs::read(path).unwrap()[4]
}

#[test]
fn elf32_and_elf64_pvh_kernels_boot_and_exit_with_their_status() {
    if !kvm_available() {
        return;
    }
    for (class, status, ident) in [(Class::Elf32, 32, 1), (Class::Elf64, 64, 2)] {
        let elf = build(class, status, false);
        assert_eq!(elf_class(&elf), ident, "{class:?}");
        let out = kumo(&["--kernel", elf.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(i32::from(status)),
            "{class:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), BANNER, "{class:?}");
    }
}

#[test]
fn qemu_boots_the_same_elf32_and_elf64_kernels_alike() {
    if !kvm_available() || !common::qemu_available() {
        return;
    }
    for (class, status) in [(Class::Elf32, 33), (Class::Elf64, 65)] {
        let elf = build(class, status, false);
        let out = common::run_with_hang_guard(
            Command::new("qemu-system-x86_64")
                .args([
                    "-M",
                    "microvm",
                    "-accel",
                    "kvm",
                    "-cpu",
                    "host,-arch-capabilities",
                ])
                .args(["-m", "64", "-nographic", "-nodefaults", "-no-reboot"])
                .args([
                    "-serial",
                    "stdio",
                    "-device",
                    "isa-debug-exit,iobase=0xf4,iosize=4",
                ])
                .arg("-kernel")
                .arg(&elf),
        );
        // QEMU's isa-debug-exit: (status << 1) | 1.
        assert_eq!(
            out.status.code(),
            Some(i32::from(status) << 1 | 1),
            "{class:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), BANNER, "{class:?}");
    }
}

#[test]
fn a_kernel_that_halts_with_interrupts_off_is_reported_at_once() {
    if !kvm_available() {
        return;
    }
    let elf = build(Class::Elf32, 0, true);
    for vcpus in ["1", "2"] {
        // No --timeout: without the halt check this run would never end (the hang
        // guard would fail the test).
        let out = kumo(&["--kernel", elf.to_str().unwrap(), "--vcpus", vcpus]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert_eq!(text(&out.stdout), BANNER);
        assert!(stderr.contains("stopped for good"), "{stderr}");
        assert!(stderr.contains("on vCPU 0"), "{stderr}");
        assert!(
            stderr.contains("vCPU 0 halted at rip 0x1000")
                && stderr.contains("interrupts disabled"),
            "{stderr}"
        );
        assert!(
            stderr.contains(r#"last console line: "last words before the end""#),
            "{stderr}"
        );
        assert_eq!(
            stderr.contains("vCPU 1 never started"),
            vcpus == "2",
            "{stderr}"
        );
    }
}

#[test]
fn the_process_bench_times_kumo_and_qemu_side_by_side() {
    if !kvm_available() {
        return;
    }
    let qemu = common::qemu_available();
    let mut args = vec!["bench", "process", "--runs", "2", "--json"];
    if !qemu {
        args.push("--no-qemu");
    }
    let out = kumo(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = common::json_lines(&out);
    assert_eq!(lines.len(), if qemu { 3 } else { 2 }, "{lines:?}");
    assert_eq!(lines[0]["vmm"], "kumo");
    assert_eq!(lines[0]["runs"], 2);
    assert!(lines[0]["median_ms"].as_f64().unwrap() > 0.0);
    assert!(lines[0]["peak_rss_kib"].as_u64().unwrap() > 0);
    let summary = lines.last().unwrap();
    assert_eq!(summary["qemu"], qemu);
    assert_eq!(summary["qemu_over_kumo_median"].is_f64(), qemu, "{summary}");
    // An ELF32 kernel of our own, with the status it exits with; a kernel that does
    // not end as told is an error, not a measurement.
    let elf = build(Class::Elf32, 5, false);
    let elf = elf.to_str().unwrap();
    let once = [
        "bench",
        "process",
        "--runs",
        "1",
        "--no-qemu",
        "--kernel",
        elf,
    ];
    let out = kumo(&[&once[..], &["--status", "5"]].concat());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = kumo(&once);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("expected exit status 0"), "{stderr}");
}
