//! QEMU as the yardstick: the same embedded guest on two QEMU VMs (q35, qboot, a
//! modern virtio-net-pci each, one `-netdev stream` wire over a UNIX socket), for
//! benchmarks that set kumo's numbers beside QEMU's in one run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::protocol::{Event, LineParser};

/// How long a QEMU pair may run before it is killed.
const LIMIT: Duration = Duration::from_secs(300);

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn qemu_vm(guest: &Path, netdev: &str, rank: u32, append: &str) -> Command {
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(["-M", "q35", "-bios", "qboot.rom", "-accel", "kvm"])
        .args(["-cpu", "host,-cx16,-arch-capabilities,+invtsc", "-smp", "1"])
        .args(["-m", "256", "-nographic", "-no-reboot", "-nodefaults"])
        .args([
            "-serial",
            "stdio",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=4",
        ])
        .args(["-netdev", netdev, "-device"])
        .arg(format!(
            "virtio-net-pci,netdev=n0,disable-legacy=on,romfile=,mac=02:6b:75:00:00:{rank:02x}"
        ))
        .arg("-kernel")
        .arg(guest)
        .arg("-append")
        .arg(format!("mpi={rank}:2 {append}"))
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Waits for `child` (killing it after [`LIMIT`]); its stdout's events.
fn events_of(mut child: Child) -> Result<Vec<Event>> {
    let start = Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("QEMU still running after {} s: killed", LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut stdout = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        std::io::Read::read_to_end(&mut out, &mut stdout)?;
    }
    let mut events = Vec::new();
    let mut parser = LineParser::default();
    parser.feed(&stdout, |_, event| events.extend(event));
    parser.finish(|_, event| events.extend(event));
    Ok(events)
}

/// Runs ranks 0 and 1 of the embedded guest on two QEMU VMs with `append` on their
/// command lines; rank 0's events.
pub fn run_pair(append: &str) -> Result<Vec<Event>> {
    let dir = std::env::temp_dir().join(format!("kumo-qemu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let scratch = Scratch(dir);
    let guest = scratch.0.join("guest.elf");
    std::fs::write(&guest, crate::guest::EMBEDDED_GUEST)?;
    let socket = scratch.0.join("wire.sock");
    let path = socket.display();
    let server = format!("stream,id=n0,server=on,addr.type=unix,addr.path={path}");
    let client = format!("stream,id=n0,server=off,addr.type=unix,addr.path={path}");
    // Their output is read after they end: the guests print a few lines.
    let first = qemu_vm(&guest, &server, 0, append)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    // QEMU 7.2's stream client does not retry: wait for the listener.
    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = events_of(first);
            bail!("QEMU never listened on {path}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = qemu_vm(&guest, &client, 1, append)
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start the second QEMU")?;
    let events = events_of(first)?;
    let _ = events_of(second)?;
    Ok(events)
}
