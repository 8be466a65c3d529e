//! What a hostile guest and careless input must not do: lose the verdict when stdout is
//! closed, make kumo read without bound, be silently ignored, leave sockets behind, or
//! hang kumo forever.

use crate::common;

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

    assert_refused(&["--kernel", fifo], "not a regular file (a FIFO)");
    assert_refused(&["--kernel", "/dev/zero"], "a character device");
    assert_refused(
        &["--kernel", ok, "--module", "/dev/zero"],
        "a character device",
    );
    assert_refused(&["--kernel", ok, "--module", fifo], "a FIFO");
    assert_refused(
        &["--kernel", ok, "--module", sparse],
        "is 4294967296 bytes; at most 268435456 fit",
    );
    assert_refused(&["node", "--config", "/dev/zero"], "a character device");
    assert_refused(&["node", "--config", fifo], "a FIFO");
    assert_refused(&["node", "--config", sparse], "at most 1048576 fit");
    assert_refused(&["sim", "--config", "/dev/zero"], "a character device");
}

#[test]
fn a_vcpu_stuck_on_vmcall_ends_within_the_watchdog_bound_with_a_report() {
    if kvm_available() {
        // `vmcall` at CPL0: this host's KVM never returns from KVM_RUN (on hosts that
        // complete it, the guest goes on to spin in place: no progress either way).
        let k = kernel("vmcall.elf", &[vec![0x0f, 0x01, 0xc1], asm::spin_forever()]);
        let out = kumo(&["--kernel", k.to_str().unwrap(), "--watchdog", "1"]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(stderr.contains("no progress"), "{stderr}");
        assert!(stderr.contains("on vCPU 0"), "{stderr}");
        assert!(stderr.contains("rip 0x00000000001000"), "{stderr}");
    }
}

#[test]
fn a_guest_that_computes_or_halts_is_not_stuck() {
    if kvm_available() {
        // Registers change without exits (a count-down loop), then waits for interrupts
        // that never come: --timeout ends it, not the watchdog (nor the halt check:
        // interrupts are enabled).
        let k = kernel(
            "busy-then-halt.elf",
            &[asm::repeat(200_000_000, &[0x90]), asm::wait_forever()],
        );
        let out = kumo(&[
            "--kernel",
            k.to_str().unwrap(),
            "--watchdog",
            "0.5",
            "--timeout",
            "3",
        ]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{stderr}");
        assert!(stderr.contains("time limit of 3.000 s"), "{stderr}");
    }
}

#[test]
fn a_passthrough_device_cannot_be_snapshotted_or_migrated() {
    // Its state lives in the device, not in kumo: refused rather than left out.
    let out = kumo(&[
        "--passthrough",
        "vfio-user:/x",
        "--ctl-socket",
        "/tmp/kumo-x.sock",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot be used with"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn options_a_run_would_ignore_are_refused() {
    let k = kernel("exit0.elf", &[asm::debug_exit(0)]);
    let k = k.to_str().unwrap();
    for (args, needle) in [
        (
            vec!["--kernel", k, "--sched", "bogus"],
            "--sched does not apply to --kernel",
        ),
        (
            vec!["--kernel", k, "--npb", "ep.S"],
            "--npb does not apply to --kernel",
        ),
        (
            vec!["--irq-path", "fast"],
            "--irq-path applies to --passthrough devices and --irq-check runs",
        ),
        (
            vec!["--kernel", k, "--irq-path", "fast"],
            "--irq-path applies to --passthrough devices and --irq-check runs",
        ),
        (
            vec!["--cmdline", "x"],
            "--cmdline does not apply to runs of the embedded",
        ),
        (
            vec!["--module", k],
            "--module does not apply to runs of the embedded",
        ),
        (
            vec!["--irq-check", "--memory", "64"],
            "--memory does not apply to --irq-check",
        ),
        (
            vec!["--irq-check", "--npb", "ep.S"],
            "--npb does not apply to --irq-check",
        ),
        (
            vec!["--dump-guest", "/tmp/x", "--vcpus", "2"],
            "--vcpus does not apply to --dump-guest",
        ),
        (
            vec!["--dump-guest", "/tmp/x", "--timeout", "2"],
            "--timeout does not apply",
        ),
        (
            vec!["--restore", "/tmp/x", "--kvm-stats"],
            "--kvm-stats does not apply to --restore runs",
        ),
    ] {
        assert_refused(&args, needle);
    }
}

/// Starts kumo, waits until `ready` holds, sends `signal`, and returns its output.
fn signalled(
    args: &[&str],
    signal: i32,
    mut ready: impl FnMut(u32) -> bool,
) -> std::process::Output {
    use std::process::Stdio;
    let child = kumo_command()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let start = std::time::Instant::now();
    while !ready(pid) {
        assert!(start.elapsed().as_secs() < 60, "kumo never got ready");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // SAFETY: kill(2) with a live child's pid and a valid signal number.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
    child.wait_with_output().expect("wait")
}

#[test]
fn sigterm_stops_a_scheduled_run_reports_what_finished_and_removes_its_socket() {
    if kvm_available() {
        let socket = |pid: u32| scratch_dir().join(format!("kumo-{pid}.sock"));
        let mut seen = None;
        let out = signalled(
            &[
                "--npb",
                "ep.S,ep.A,ep.A,ep.A",
                "--sched",
                "credit",
                "--json",
            ],
            libc::SIGTERM,
            |pid| {
                seen = Some(socket(pid));
                socket(pid).exists()
            },
        );
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(143), "{stderr}");
        assert!(stderr.contains("stopped by SIGTERM"), "{stderr}");
        let socket = seen.expect("pid");
        assert!(!socket.exists(), "{} left behind", socket.display());
        // What finished is reported: a verdict line per benchmark and the final one.
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 5, "{}", text(&out.stdout));
        assert_eq!(lines[4]["ok"], serde_json::json!(false));
    }
}

#[test]
fn sigint_and_sighup_end_a_stuck_vm_with_their_status() {
    if kvm_available() {
        let k = kernel("spin.elf", &[asm::spin_forever()]);
        let k = k.to_str().unwrap();
        for (signal, status) in [(libc::SIGINT, 130), (libc::SIGHUP, 129)] {
            // Ready once the vCPU thread exists.
            let out = signalled(&["--kernel", k, "--watchdog", "0"], signal, |pid| {
                std::fs::read_dir(format!("/proc/{pid}/task"))
                    .map(|d| d.count() >= 3)
                    .unwrap_or(false)
            });
            assert_eq!(out.status.code(), Some(status), "{}", text(&out.stderr));
        }
    }
}
