//! virtio-blk end to end: kumo's guest drives a disk from ring 3 (`blk=check`) on an
//! image file, with requests served on the vCPU thread and on a backend thread.

use crate::common;

use common::{assert_refused, dumped_guest, kumo, kumo_background, kvm_available, scratch, text};

const SECTORS: usize = 256;
const PATTERN: &[u8] = b"written by kumo's guest through virtio-blk\n";

/// An image whose every byte is known: byte `i` = `i * 7 + i / 512`.
fn image(name: &str) -> (std::path::PathBuf, Vec<u8>) {
    let bytes: Vec<u8> = (0..SECTORS * 512)
        .map(|i| (i * 7 + i / 512) as u8)
        .collect();
    let path = scratch(name);
    std::fs::write(&path, &bytes).unwrap();
    (path, bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Runs the guest's disk check on `disk` (a --disk value); returns its `@kumo blk` line.
fn check(disk: &str) -> String {
    let guest = dumped_guest();
    let out = kumo(&[
        "--kernel",
        guest.to_str().unwrap(),
        "--cmdline",
        "blk=check",
        "--vcpus",
        "1",
        "--disk",
        disk,
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    stdout
        .lines()
        .find(|l| l.starts_with("@kumo blk "))
        .unwrap_or_else(|| panic!("no @kumo blk line: {stdout}"))
        .to_string()
}

#[test]
fn the_guest_reads_the_image_and_its_writes_reach_the_file() {
    if !kvm_available() {
        return;
    }
    for io in ["vcpu", "thread"] {
        let (path, bytes) = image(&format!("rw-{io}.img"));
        let line = check(&format!("{},io={io}", path.display()));
        assert!(
            line.contains(&format!("sectors={SECTORS} readonly=0")),
            "{line}"
        );
        assert!(line.contains("id=kumo-disk-0"), "{line}");
        assert!(
            line.contains(&format!("sector0={}", hex(&bytes[..16]))),
            "{line}"
        );
        assert!(
            line.contains("write1=ok flush=ok read1=ok readback=pattern"),
            "{line}"
        );
        assert!(line.contains("beyond=refused"), "{line}");
        assert!(line.ends_with("ok=1"), "{line}");
        let after = std::fs::read(&path).unwrap();
        assert_eq!(after.len(), bytes.len());
        assert_eq!(&after[512..512 + PATTERN.len()], PATTERN, "{io}");
        assert!(
            after[512 + PATTERN.len()..1024].iter().all(|&b| b == 0),
            "{io}"
        );
        assert_eq!(after[..512], bytes[..512], "{io}: sector 0 untouched");
        assert_eq!(after[1024..], bytes[1024..], "{io}: the rest untouched");
    }
}

#[test]
fn a_read_only_disk_refuses_the_guests_writes() {
    if !kvm_available() {
        return;
    }
    let (path, bytes) = image("ro.img");
    let line = check(&format!("{},readonly", path.display()));
    assert!(line.contains("readonly=1"), "{line}");
    assert!(line.contains("write1=status1"), "{line}");
    assert!(line.contains("readback=other"), "{line}");
    assert!(line.ends_with("ok=1"), "{line}");
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn bad_disks_are_refused_in_one_line() {
    let k = scratch("disk-kernel.elf");
    std::fs::write(&k, hv::testing::PvhImage::new(&[0xf4]).build()).unwrap();
    let k = k.to_str().unwrap();
    let tiny = scratch("tiny.img");
    std::fs::write(&tiny, [0u8; 100]).unwrap();
    let dir = std::env::temp_dir();
    assert_refused(
        &["--kernel", k, "--disk", "/nonexistent/disk.img"],
        "disk image /nonexistent/disk.img: No such file",
    );
    assert_refused(
        &["--kernel", k, "--disk", tiny.to_str().unwrap()],
        "smaller than one 512-byte sector",
    );
    assert_refused(
        &[
            "--kernel",
            k,
            "--disk",
            &format!("{},readonly", dir.display()),
        ],
        "not a regular file",
    );
    assert_refused(
        &["--disk", tiny.to_str().unwrap()],
        "--disk does not apply to runs of the embedded NPB guest",
    );
}

/// The line without what legitimately differs between VMMs: the serial, the time and
/// the notifications (a device may suppress some while it works).
fn comparable(line: &str) -> String {
    line.split(' ')
        .filter(|f| {
            !["id=", "read4k_ns=", "kicks="]
                .iter()
                .any(|k| f.starts_with(k))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn qemu_and_kumo_disks_look_the_same_to_the_guest() {
    if !kvm_available() || !common::qemu_available() {
        return;
    }
    let guest = dumped_guest();
    for readonly in [false, true] {
        let (kumo_image, _) = image(&format!("peer-kumo-{readonly}.img"));
        let (qemu_image, _) = image(&format!("peer-qemu-{readonly}.img"));
        let suffix = if readonly { ",readonly" } else { "" };
        let kumo_line = check(&format!("{}{suffix}", kumo_image.display()));
        let drive = format!(
            "file={},format=raw,if=none,id=d0{}",
            qemu_image.display(),
            if readonly { ",readonly=on" } else { "" }
        );
        let out = common::run_with_hang_guard(
            common::qemu(1)
                .args(["-M", "q35", "-bios", "qboot.rom"])
                .args(["-drive", &drive])
                .args([
                    "-device",
                    "virtio-blk-pci,drive=d0,disable-legacy=on,serial=qemu-disk-0,romfile=",
                ])
                .arg("-kernel")
                .arg(&guest)
                .args(["-append", "blk=check"]),
        );
        // QEMU's isa-debug-exit: (status << 1) | 1.
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        let qemu_line = stdout
            .lines()
            .find(|l| l.starts_with("@kumo blk "))
            .unwrap_or_else(|| panic!("QEMU: no @kumo blk line: {stdout}"));
        assert!(qemu_line.contains("id=qemu-disk-0"), "{qemu_line}");
        assert_eq!(comparable(&kumo_line), comparable(qemu_line));
        assert_eq!(
            std::fs::read(&kumo_image).unwrap(),
            std::fs::read(&qemu_image).unwrap(),
            "readonly={readonly}: the two images differ afterwards"
        );
    }
}

#[test]
fn rust_hypervisor_firmware_finds_the_disk_then_stops_and_kumo_says_so() {
    if !kvm_available() {
        return;
    }
    let Some(fw) = common::peer_firmware() else {
        return;
    };
    // A blank image: the firmware finds the virtio-blk device, finds no GPT on it and
    // halts for good (`cli; hlt`), which kumo reports at once instead of waiting.
    let blank = scratch("blank.img");
    std::fs::write(&blank, vec![0u8; 1 << 20]).unwrap();
    let out = kumo(&[
        "--kernel",
        fw.to_str().unwrap(),
        "--disk",
        &format!("{},readonly", blank.display()),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Virtio block device configured. Capacity: 2048 sectors"),
        "{stdout}"
    );
    assert!(stderr.contains("the guest stopped for good"), "{stderr}");
    assert!(
        stderr.contains(r#"last console line: "Unable to boot from any virtio-blk device""#),
        "{stderr}"
    );
}

/// The guest's status when a hostile disk probe got through (`blk.rs`'s
/// `STATUS_PROBE_DONE`).
const PROBE_DONE: i32 = 7;

/// The image `blk=loop` feeds on: sector `j` holds avail.flags 1, avail.idx `j + 2`,
/// ring entries 0 (head 0) and, in its last 16 bytes, a read header for sector `j + 1`
/// (both mod 2^16, so the loop closes on itself).
fn self_perpetuating_image(name: &str) -> std::path::PathBuf {
    let mut bytes = vec![0u8; 65536 * 512];
    for (j, sector) in bytes.chunks_mut(512).enumerate() {
        sector[0..2].copy_from_slice(&1u16.to_le_bytes());
        sector[2..4].copy_from_slice(&((j + 2) as u16).to_le_bytes());
        // Header at 496: type 0 (read), reserved, sector.
        sector[504..512].copy_from_slice(&(((j + 1) % 65536) as u64).to_le_bytes());
    }
    let path = scratch(name);
    std::fs::write(&path, &bytes).unwrap();
    path
}

/// The disk's two I/O paths, each hostile probe run against both.
const IO_MODES: [&str; 2] = ["thread", "vcpu"];

/// kumo's arguments for `guest`'s hostile disk probe `blk=PROBE` (one vCPU) on
/// `image`, its requests served by `io`.
fn blk_probe_args(
    guest: &std::path::Path,
    probe: &str,
    image: &std::path::Path,
    io: &str,
) -> Vec<String> {
    [
        "--kernel".into(),
        guest.to_str().unwrap().into(),
        "--cmdline".into(),
        format!("blk={probe}"),
        "--vcpus".into(),
        "1".into(),
        "--disk".into(),
        format!("{},io={io}", image.display()),
    ]
    .into()
}

/// Runs kumo; `None` if it had not ended after `limit` (then it is killed).
fn kumo_within(args: &[&str], limit: std::time::Duration) -> Option<std::process::Output> {
    let mut run = kumo_background(args);
    let start = std::time::Instant::now();
    while run.running() {
        if start.elapsed() > limit {
            return None; // dropped: killed
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Some(run.finish())
}

#[test]
fn a_self_perpetuating_queue_cannot_keep_kumo_running() {
    if !kvm_available() {
        return;
    }
    let image = self_perpetuating_image("blk-loop.img");
    let guest = dumped_guest();
    for io in IO_MODES {
        let mut args = blk_probe_args(&guest, "loop", &image, io);
        args.extend(["--timeout".into(), "20".into()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // The guest ends at once; kumo must follow it, well before --timeout's 20 s
        // would have to (the limit only keeps a hung kumo from hanging the suite).
        let out = kumo_within(&args, std::time::Duration::from_secs(60))
            .unwrap_or_else(|| panic!("io={io}: kumo still running 60 s after its guest ended"));
        assert_eq!(
            out.status.code(),
            Some(PROBE_DONE),
            "io={io}: {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

#[test]
fn a_bad_ring_rung_many_times_is_reported_in_a_few_lines() {
    if !kvm_available() {
        return;
    }
    let (image, _) = image("blk-badring.img");
    let guest = dumped_guest();
    for io in IO_MODES {
        let args = blk_probe_args(&guest, "badring", &image, io);
        let out = kumo(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(PROBE_DONE), "io={io}: {stderr}");
        // 2000 doorbells on a ring the device refuses: said, but not 2000 times.
        let said = stderr.lines().filter(|l| l.contains("ring")).count();
        assert!(said >= 1, "io={io}: the bad ring went unreported: {stderr}");
        assert!(
            stderr.lines().count() <= 10,
            "io={io}: {} lines for one bad ring:\n{}",
            stderr.lines().count(),
            &stderr[..stderr.len().min(2000)]
        );
    }
}
