//! The guest's network side against an independent device: two QEMU VMs, each with
//! QEMU's virtio-net-pci (modern only), on one Ethernet (`-netdev stream` over a UNIX
//! socket in a scratch directory, or `-netdev dgram` over loopback UDP, which drops
//! frames when bursts outrun its socket buffer), run kumo's MPI over raw frames: a
//! checksummed stress of random sizes and patterns, the collectives, and a ping-pong.
//! Both ranks must verify, in both wait modes (busy-polling, and sleeping until the
//! MSI-X interrupt), and on lossy wires (retransmission).

use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

/// Two VMs per test on a 2-core host: the tests take turns.
use crate::common::ONE_AT_A_TIME;

/// One VM: q35 (its MCFG gives the guest ECAM) with qboot as firmware (it boots in
/// ~0.1 s where SeaBIOS takes seconds of emulated real mode on kvm_pvm hosts; it leaves
/// BARs to the guest, whose driver assigns them), one vCPU, a modern-only virtio-net
/// with a fixed MAC on the netdev `netdev`.
fn vm(guest: &Path, netdev: &str, rank: u32, append: &str) -> Command {
    let mut command = Command::new("qemu-system-x86_64");
    command.args([
        "-M",
        "q35",
        "-bios",
        "qboot.rom",
        "-accel",
        "kvm",
        "-cpu",
        "host,-cx16,-arch-capabilities,+invtsc",
        "-smp",
        "1",
        "-m",
        "128",
        "-nographic",
        "-no-reboot",
        "-nodefaults",
        "-serial",
        "stdio",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=4",
        "-netdev",
        netdev,
        "-device",
        &format!(
            "virtio-net-pci,netdev=n0,disable-legacy=on,romfile=,mac=02:6b:75:00:00:{rank:02x}"
        ),
        "-kernel",
        guest.to_str().unwrap(),
        "-append",
        &format!("mpi={rank}:2 {append}"),
    ]);
    command
}

/// Boots rank 0 (listening) and rank 1 (connecting) on a stream wire and returns both
/// outputs.
fn pair(name: &str, append: &str) -> [Output; 2] {
    let guest = dumped_guest();
    let socket = scratch(&format!("{name}.sock"));
    let _ = std::fs::remove_file(&socket);
    let path = socket.to_str().unwrap().to_owned();
    let server = format!("stream,id=n0,server=on,addr.type=unix,addr.path={path}");
    let client = format!("stream,id=n0,server=off,addr.type=unix,addr.path={path}");
    let mut rank0 = vm(&guest, &server, 0, append);
    let first = std::thread::spawn(move || run_with_hang_guard(&mut rank0));
    // QEMU 7.2's stream client does not retry: wait (bounded) for the listener.
    let start = Instant::now();
    while !socket.exists() && start.elapsed() < Duration::from_secs(30) && !first.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(socket.exists(), "rank 0's QEMU never listened on {path}");
    let second = run_with_hang_guard(&mut vm(&guest, &client, 1, append));
    let first = first.join().unwrap();
    let _ = std::fs::remove_file(&socket);
    [first, second]
}

/// Two free loopback UDP ports (taken from the kernel, then released for QEMU).
fn free_udp_ports() -> [u16; 2] {
    let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    [
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    ]
}

/// Boots both ranks on a dgram wire: each VM's UDP socket on 127.0.0.1 sends to the
/// other's.
fn dgram_pair(append: &str) -> [Output; 2] {
    let guest = dumped_guest();
    let ports = free_udp_ports();
    let netdev = |me: usize| {
        format!(
            "dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port={},\
             remote.type=inet,remote.host=127.0.0.1,remote.port={}",
            ports[me],
            ports[1 - me]
        )
    };
    let mut rank0 = vm(&guest, &netdev(0), 0, append);
    let first = std::thread::spawn(move || run_with_hang_guard(&mut rank0));
    let second = run_with_hang_guard(&mut vm(&guest, &netdev(1), 1, append));
    [first.join().unwrap(), second]
}

/// The value of `key=` in a `@kumo` line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line}"))
}

fn lines<'a>(stdout: &'a str, event: &str) -> Vec<&'a str> {
    let prefix = format!("@kumo {event} ");
    stdout.lines().filter(|l| l.starts_with(&prefix)).collect()
}

/// Both ranks ended with status 0, verified the stress and the collectives, and rank
/// 0 timed every ping-pong size; on a `lossless` wire no frame arrived out of order.
/// Returns both ranks' `mpistats` lines.
fn assert_verified(
    outputs: &[Output; 2],
    wait: &str,
    sizes: &[u64],
    lossless: bool,
) -> Vec<String> {
    let mut all_stats = Vec::new();
    for (rank, out) in outputs.iter().enumerate() {
        let stdout = text(&out.stdout);
        // isa-debug-exit turns the guest's status 0 into QEMU's exit status 1.
        assert_eq!(
            out.status.code(),
            Some(1),
            "rank {rank}:\n{stdout}\n{}",
            text(&out.stderr)
        );
        assert!(
            stdout.contains("@kumo end status=0"),
            "rank {rank}:\n{stdout}"
        );
        let mpi = lines(&stdout, "mpi");
        assert_eq!(mpi.len(), 1, "rank {rank}:\n{stdout}");
        assert_eq!(field(mpi[0], "rank"), rank.to_string());
        assert_eq!(field(mpi[0], "wait"), wait);
        assert_eq!(field(mpi[0], "mac"), format!("02:6b:75:00:00:{rank:02x}"));
        let check = lines(&stdout, "netcheck");
        assert_eq!(check.len(), 1, "rank {rank}:\n{stdout}");
        assert_eq!(field(check[0], "verified"), "true", "{}", check[0]);
        assert_eq!(field(check[0], "mismatches"), "0", "{}", check[0]);
        assert_eq!(field(check[0], "collectives_failed"), "0", "{}", check[0]);
        // Every message was counted, and the 16 MiB exchange is among them.
        let bytes: u64 = field(check[0], "bytes").parse().unwrap();
        assert!(bytes >= 16 << 20, "{}", check[0]);
        let stats = lines(&stdout, "mpistats");
        assert_eq!(stats.len(), 1, "rank {rank}:\n{stdout}");
        if lossless {
            assert_eq!(field(stats[0], "out_of_order"), "0", "{}", stats[0]);
        }
        assert_eq!(field(stats[0], "rx_bad"), "0", "{}", stats[0]);
        all_stats.push(stats[0].to_owned());
    }
    let stdout = text(&outputs[0].stdout);
    let pingpongs = lines(&stdout, "pingpong");
    assert_eq!(pingpongs.len(), sizes.len(), "{stdout}");
    for (line, size) in pingpongs.iter().zip(sizes) {
        assert_eq!(field(line, "size"), size.to_string(), "{line}");
        let median: f64 = field(line, "median_us").parse().unwrap();
        assert!(median > 0.0, "{line}");
        eprintln!("{line}");
    }
    all_stats
}

fn count(stats: &str, key: &str) -> u64 {
    field(stats, key).parse().unwrap()
}

#[test]
fn two_qemu_vms_run_the_mpi_check_and_a_ping_pong_busy_polling() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outputs = pair(
        "spin",
        "wait=spin net=check+pingpong:8,1024,65536,262144 net_rounds=100 net_seed=11",
    );
    assert_verified(&outputs, "spin", &[8, 1024, 65536, 262144], true);
}

#[test]
fn ranks_sleeping_until_the_nic_interrupts_verify_and_resend_lost_frames() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Each guest also drops every 97th data frame it receives, as a lossy wire would.
    let outputs = pair(
        "block",
        "wait=block net=check+pingpong:8+bw:1024 net_rounds=80 net_seed=12 net_drop=97",
    );
    let all_stats = assert_verified(&outputs, "block", &[8], false);
    // 80 bursts of 64 messages of 1 KiB streamed to rank 1, timed by rank 0.
    let stdout = text(&outputs[0].stdout);
    let bandwidth = lines(&stdout, "bandwidth");
    assert_eq!(bandwidth.len(), 1, "{stdout}");
    assert_eq!(field(bandwidth[0], "messages"), "5120", "{}", bandwidth[0]);
    let mbps: f64 = field(bandwidth[0], "mbps").parse().unwrap();
    assert!(mbps > 0.0, "{}", bandwidth[0]);
    eprintln!("{}", bandwidth[0]);
    let mut resent = 0;
    for stats in &all_stats {
        // Interrupt-driven: the NIC's MSI-X vector fired and woke the rank.
        assert!(count(stats, "interrupts") > 0, "{stats}");
        assert!(count(stats, "sleeps") > 0, "{stats}");
        assert!(count(stats, "dropped") > 0, "{stats}");
        assert!(count(stats, "out_of_order") > 0, "{stats}");
        resent += count(stats, "resent");
    }
    assert!(resent > 0, "{all_stats:?}");
}

#[test]
fn two_qemu_vms_on_a_udp_dgram_wire_verify_despite_its_losses() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outputs = dgram_pair("wait=spin net=check+pingpong:8,65536 net_rounds=60 net_seed=14");
    assert_verified(&outputs, "spin", &[8, 65536], false);
}

/// kumo's rank 0 (`kumo mpi --vms 1 --job-size 2 ... EXTRA`) and QEMU's rank 1 (its
/// guest command line `append`) on one stream wire: QEMU listens, kumo connects (it
/// waits for the socket). Returns (kumo's output, QEMU's).
fn kumo_beside_qemu(name: &str, append: &str, extra: &[&str]) -> (Output, Output) {
    let socket = scratch(&format!("{name}.sock"));
    let _ = std::fs::remove_file(&socket);
    let path = socket.to_str().unwrap().to_owned();
    let server = format!("stream,id=n0,server=on,addr.type=unix,addr.path={path}");
    let outputs = kumo_beside_qemu_on(&server, &format!("unix:{path}"), append, extra);
    let _ = std::fs::remove_file(&socket);
    outputs
}

/// As [`kumo_beside_qemu`] with QEMU's netdev `server` and kumo's `--wire wire`.
fn kumo_beside_qemu_on(server: &str, wire: &str, append: &str, extra: &[&str]) -> (Output, Output) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let guest = dumped_guest();
    let mut qemu = vm(&guest, server, 1, append);
    let peer = std::thread::spawn(move || run_with_hang_guard(&mut qemu));
    let mut args = vec![
        "mpi",
        "--vms",
        "1",
        "--job-size",
        "2",
        "--wire",
        wire,
        "--json",
        "--timeout",
        "120",
    ];
    args.extend_from_slice(extra);
    let ours = kumo(&args);
    let theirs = peer.join().unwrap();
    (ours, theirs)
}

#[test]
fn a_kumo_vm_and_a_qemu_vm_share_one_wire_and_both_verify() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let (ours, theirs) = kumo_beside_qemu("kumo-qemu", "net=check", &[]);
    assert_both_checked(&ours, &theirs);
}

/// The same over TCP: QEMU's `-netdev stream,addr.type=inet` listens, kumo's
/// `tcp:127.0.0.1:PORT` connects; the framing is the same.
#[test]
fn a_kumo_vm_and_a_qemu_vm_share_a_tcp_wire_and_both_verify() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    // A free port for QEMU to listen on (below the ephemeral range: see the helper).
    let port = kumo_lab::experiment::process::free_port().unwrap();
    let server =
        format!("stream,id=n0,server=on,addr.type=inet,addr.host=127.0.0.1,addr.port={port}");
    let (ours, theirs) =
        kumo_beside_qemu_on(&server, &format!("tcp:127.0.0.1:{port}"), "net=check", &[]);
    assert_both_checked(&ours, &theirs);
}

/// kumo's rank 0 and QEMU's rank 1 both verified the network check.
fn assert_both_checked(ours: &Output, theirs: &Output) {
    assert_eq!(ours.status.code(), Some(0), "{}", text(&ours.stderr));
    let rows = json_lines(ours);
    assert_eq!(
        rows[0]["rank"],
        serde_json::json!(0),
        "{}",
        text(&ours.stdout)
    );
    assert_eq!(rows[0]["verified"], serde_json::json!(true));
    let stdout = text(&theirs.stdout);
    let check = lines(&stdout, "netcheck");
    assert_eq!(check.len(), 1, "QEMU's rank 1:\n{stdout}");
    assert_eq!(field(check[0], "verified"), "true", "{}", check[0]);
}

#[test]
fn the_net_bench_sets_qemu_beside_kumo_in_one_run() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let out = kumo(&[
        "bench",
        "net",
        "--sizes",
        "8,64K",
        "--rounds",
        "20",
        "--irq-path",
        "fast",
        "--wait",
        "spin",
        "--nic",
        "emulated",
        "--qemu",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rows: Vec<(String, String)> = json_lines(&out)
        .iter()
        .map(|r| {
            (
                r["irq_path"].as_str().unwrap().to_owned(),
                r["size"].as_u64().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        ("fast", "8"),
        ("fast", "65536"),
        ("qemu", "8"),
        ("qemu", "65536"),
    ]
    .iter()
    .map(|(p, s)| (p.to_string(), s.to_string()))
    .collect();
    assert_eq!(rows, expected);
}

/// Rank 0's `@kumo result` lines: (benchmark, verified).
fn results(stdout: &str) -> Vec<(String, String)> {
    lines(stdout, "result")
        .iter()
        .map(|l| {
            (
                field(l, "benchmark").to_owned(),
                field(l, "verified").to_owned(),
            )
        })
        .collect()
}

#[test]
fn two_qemu_vms_run_npb_mpi_cg_and_is_and_verify() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let outputs = pair("npb", "wait=spin npb=cg.S,is.S");
    for (rank, out) in outputs.iter().enumerate() {
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "rank {rank}:\n{stdout}");
        assert!(
            stdout.contains("@kumo end status=0"),
            "rank {rank}:\n{stdout}"
        );
    }
    let expected: Vec<(String, String)> = [("cg", "true"), ("is", "true")]
        .iter()
        .map(|(b, v)| (b.to_string(), v.to_string()))
        .collect();
    assert_eq!(results(&text(&outputs[0].stdout)), expected);
}

#[test]
fn a_kumo_vm_and_a_qemu_vm_run_npb_mpi_cg_together() {
    if !kvm_available() || !qemu_available() {
        return;
    }
    let (ours, theirs) = kumo_beside_qemu("kumo-qemu-cg", "wait=spin npb=cg.S", &["--npb", "cg.S"]);
    assert_eq!(ours.status.code(), Some(0), "{}", text(&ours.stderr));
    let rows = json_lines(&ours);
    assert_eq!(rows[0]["benchmark"], "cg", "{}", text(&ours.stdout));
    assert_eq!(rows[0]["verified"], true, "{}", rows[0]);
    let stdout = text(&theirs.stdout);
    assert!(
        stdout.contains("@kumo end status=0"),
        "QEMU's rank 1:\n{stdout}"
    );
}
