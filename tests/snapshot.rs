//! Snapshot and restore of the embedded NPB guest through the control socket.

mod common;

use common::*;

/// `kumo ctl ... snapshot`, retried while the VM has not started its vCPUs yet
/// (the socket is up a moment before the VM runs).
fn snapshot(socket: &std::path::Path, path: &std::path::Path, stop: bool) -> std::process::Output {
    let mut args = vec![
        "ctl",
        "--socket",
        socket.to_str().unwrap(),
        "snapshot",
        path.to_str().unwrap(),
    ];
    if stop {
        args.push("--stop");
    }
    loop {
        let out = kumo(&args);
        if out.status.success() || !text(&out.stderr).contains("not running yet") {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn assert_ep_w_verified(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        text(&out.stderr)
    );
    let lines = json_lines(out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["benchmark"], "ep");
    assert_eq!(lines[0]["class"], "W");
    assert_eq!(lines[0]["verified"], true, "{}", lines[0]);
    assert_eq!(lines[1]["ok"], true, "{}", lines[1]);
}

#[test]
fn a_vm_stopped_into_a_snapshot_finishes_its_run_when_restored() {
    if !kvm_available() {
        return;
    }
    let socket = scratch("stop.sock");
    let file = scratch("stop.snap");
    let source = kumo_background(&[
        "--npb",
        "ep.W",
        "--json",
        "--ctl-socket",
        socket.to_str().unwrap(),
    ]);
    wait_for_path(&socket);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the control socket is private");
    let ctl = snapshot(&socket, &file, true);
    assert!(ctl.status.success(), "snapshot: {}", text(&ctl.stderr));
    assert!(
        text(&ctl.stdout).contains("the VM stopped"),
        "{}",
        text(&ctl.stdout)
    );
    let source_out = source.finish();
    assert!(source_out.status.success(), "{}", text(&source_out.stderr));
    assert!(
        text(&source_out.stdout).is_empty(),
        "the source reports no result: it stopped midway\n{}",
        text(&source_out.stdout)
    );
    assert!(text(&source_out.stderr).contains("handed off"));
    assert!(!socket.exists(), "the socket is removed when kumo ends");

    let file_mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(
        file_mode & 0o777,
        0o600,
        "the snapshot holds guest memory: private"
    );
    let restored = kumo(&["--restore", file.to_str().unwrap(), "--json"]);
    assert_ep_w_verified(&restored);
}

#[test]
fn a_vm_snapshotted_while_running_goes_on_and_its_snapshot_runs_too() {
    if !kvm_available() {
        return;
    }
    let socket = scratch("live.sock");
    let file = scratch("live.snap");
    let source = kumo_background(&[
        "--npb",
        "ep.W",
        "--json",
        "--ctl-socket",
        socket.to_str().unwrap(),
    ]);
    wait_for_path(&socket);
    let ctl = snapshot(&socket, &file, false);
    assert!(ctl.status.success(), "snapshot: {}", text(&ctl.stderr));
    assert_ep_w_verified(&source.finish());
    assert_ep_w_verified(&kumo(&["--restore", file.to_str().unwrap(), "--json"]));

    // A damaged copy is refused with one line naming the damage.
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    let bad = scratch("live-bad.snap");
    std::fs::write(&bad, &bytes).unwrap();
    let out = kumo(&["--restore", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("kumo: error: ") && err.contains("checksum"),
        "{err}"
    );
}

#[test]
fn restore_refuses_what_is_not_a_snapshot() {
    let missing = scratch("missing.snap");
    let out = kumo(&["--restore", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot open snapshot"));
    let not_a_snapshot = scratch("not.snap");
    std::fs::write(&not_a_snapshot, b"hello").unwrap();
    let out = kumo(&["--restore", not_a_snapshot.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("truncated") || text(&out.stderr).contains("magic"));
    let out = kumo(&["--restore", "x", "--kernel", "y"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--restore and --kernel conflict"
    );
}
