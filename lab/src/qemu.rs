//! QEMU as the yardstick: the same embedded guest on one QEMU VM (q35, qboot), or on
//! two with a modern virtio-net-pci each and one `-netdev stream` wire over a UNIX
//! socket, for benchmarks that set kumo's numbers beside QEMU's in one run.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use kumo_vmm::protocol::{Event, LineParser};

/// How long a QEMU pair may run before it is killed.
const PAIR_LIMIT: Duration = Duration::from_secs(300);

/// A scratch directory holding the embedded guest's ELF, removed when dropped.
struct Scratch {
    dir: PathBuf,
    guest: PathBuf,
}

impl Scratch {
    fn new(what: &str) -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("kumo-qemu-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let guest = dir.join("guest.elf");
        let scratch = Scratch { dir, guest };
        std::fs::write(&scratch.guest, kumo_vmm::guest::EMBEDDED_GUEST)?;
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// QEMU (q35, qboot) booting `guest` by PVH with `append` as its command line, on
/// `vcpus` vCPUs and `memory_mib` MiB of RAM. The RAM is a memfd, as kumo's is, so both
/// VMMs give the guest the same kind of host pages: 4 KiB shared-memory pages unless
/// the host's shmem THP is on, or 2 MiB hugetlbfs pages if `huge_pages`. (QEMU's
/// default anonymous RAM would get THP where `enabled` is `madvise`, as QEMU asks for
/// it.) The console is on stdout.
fn qemu_guest(
    guest: &Path,
    vcpus: u32,
    memory_mib: u64,
    huge_pages: bool,
    append: &str,
) -> Command {
    let hugetlb = if huge_pages {
        ",hugetlb=on,hugetlbsize=2M"
    } else {
        ""
    };
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args([
            "-M",
            "q35,memory-backend=ram",
            "-bios",
            "qboot.rom",
            "-accel",
            "kvm",
        ])
        .args(["-cpu", "host,-cx16,-arch-capabilities,+invtsc"])
        .args(["-smp", &vcpus.to_string(), "-m", &format!("{memory_mib}M")])
        .arg("-object")
        .arg(format!(
            "memory-backend-memfd,id=ram,size={memory_mib}M{hugetlb}"
        ))
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(guest)
        .arg("-append")
        .arg(append)
        .stdin(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// Rank `rank` of two, on one vCPU and 256 MiB, with a virtio-net-pci on `netdev`.
fn qemu_vm(guest: &Path, netdev: &str, rank: u32, append: &str) -> Command {
    let mut command = qemu_guest(guest, 1, 256, false, &format!("mpi={rank}:2 {append}"));
    command.args(["-netdev", netdev, "-device"]).arg(format!(
        "virtio-net-pci,netdev=n0,disable-legacy=on,romfile=,mac=02:6b:75:00:00:{rank:02x}"
    ));
    command
}

/// Waits for `child` (killing it after `limit`); its stdout's events. A thread reads
/// and reaps it, so nothing here wakes while the guest runs (a poll would take turns
/// on the CPUs its vCPUs use).
fn events_of(child: Child, limit: Duration) -> Result<Vec<Event>> {
    let pid = child.id();
    let (done, ended) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut child = child;
        let mut stdout = Vec::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_end(&mut stdout);
        }
        let status = child.wait();
        let _ = done.send(());
        (status, stdout)
    });
    let timed_out = ended.recv_timeout(limit).is_err();
    if timed_out {
        // SAFETY: plain kill(2) of our child: the waiter has not reaped it (it reports
        // right after `wait` returns), so the pid is still ours.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
    let (status, stdout) = waiter.join().expect("the QEMU waiter thread panicked");
    status?;
    if timed_out {
        bail!("QEMU still running after {} s: killed", limit.as_secs());
    }
    let mut events = Vec::new();
    let mut parser = LineParser::default();
    parser.feed(&stdout, |_, event| events.extend(event));
    parser.finish(|_, event| events.extend(event));
    Ok(events)
}

/// Runs the embedded guest on one QEMU VM (`vcpus`, `memory_mib`, on huge pages if
/// `huge_pages`, the guest's command line `cmdline`) and returns its events; `limit`
/// bounds the run.
pub fn run_guest(
    vcpus: u32,
    memory_mib: u64,
    huge_pages: bool,
    cmdline: &str,
    limit: Duration,
) -> Result<Vec<Event>> {
    let scratch = Scratch::new("guest")?;
    let child = qemu_guest(&scratch.guest, vcpus, memory_mib, huge_pages, cmdline)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    events_of(child, limit)
}

/// Runs ranks 0 and 1 of the embedded guest on two QEMU VMs with `append` on their
/// command lines; rank 0's events.
pub fn run_pair(append: &str) -> Result<Vec<Event>> {
    let scratch = Scratch::new("pair")?;
    let guest = &scratch.guest;
    let socket = scratch.dir.join("wire.sock");
    let path = socket.display();
    let server = format!("stream,id=n0,server=on,addr.type=unix,addr.path={path}");
    let client = format!("stream,id=n0,server=off,addr.type=unix,addr.path={path}");
    // Their output is read after they end: the guests print a few lines.
    let first = qemu_vm(guest, &server, 0, append)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    // QEMU 7.2's stream client does not retry: wait for the listener.
    let start = Instant::now();
    while !socket.exists() {
        if start.elapsed() > Duration::from_secs(30) {
            let _ = events_of(first, PAIR_LIMIT);
            bail!("QEMU never listened on {path}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = qemu_vm(guest, &client, 1, append)
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start the second QEMU")?;
    let events = events_of(first, PAIR_LIMIT)?;
    let _ = events_of(second, PAIR_LIMIT)?;
    Ok(events)
}
