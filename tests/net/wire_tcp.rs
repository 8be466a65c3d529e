//! One MPI job split over two kumo processes joined by a TCP wire (`tcp:HOST:PORT`):
//! on loopback, and across two network namespaces joined by a veth pair, a stand-in
//! for two hosts (each process sees only its own interface and address).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use crate::common::*;

/// Rank 0's and rank 1's `kumo mpi --vms 1 --job-size 2 --npb is.S,cg.S` arguments,
/// with `wire`.
fn rank_args(rank: u32, wire: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "mpi",
        "--vms",
        "1",
        "--job-size",
        "2",
        "--npb",
        "is.S,cg.S",
        "--json",
        "--timeout",
        "120",
        "--wire-wait",
        "60",
        "--wire",
        wire,
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    if rank == 1 {
        args.extend(["--first-rank".into(), "1".into()]);
    }
    args
}

/// Both processes ended well and rank 0's process judged both kernels verified.
fn assert_job_verified(rank0: &std::process::Output, rank1: &std::process::Output) {
    for (rank, out) in [rank0, rank1].iter().enumerate() {
        assert_eq!(
            out.status.code(),
            Some(0),
            "rank {rank}: {}",
            text(&out.stderr)
        );
    }
    let lines = json_lines(rank0);
    let names: Vec<&str> = lines
        .iter()
        .filter_map(|l| l["benchmark"].as_str())
        .collect();
    assert_eq!(names, ["is", "cg"], "{}", text(&rank0.stdout));
    for line in &lines[..2] {
        assert_eq!(line["ranks"], serde_json::json!(2), "{line}");
        assert_eq!(line["verified"], serde_json::json!(true), "{line}");
    }
    assert_eq!(lines[2]["ok"], serde_json::json!(true));
    assert_eq!(
        json_lines(rank1).last().unwrap()["ok"],
        serde_json::json!(true)
    );
}

#[test]
fn an_npb_job_verifies_over_a_tcp_wire_between_two_kumo_processes() {
    if !kvm_available() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Port 0: the listener takes a free port and names it on stderr (no port race
    // with tests running beside this one).
    let mut listening = kumo_command()
        .args(rank_args(0, "listen:tcp:127.0.0.1:0"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut err = BufReader::new(listening.stderr.take().unwrap());
    let mut seen = String::new();
    let address = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let _ = listening.wait();
            panic!("rank 0 named no address: {seen}");
        }
        if let Some(address) = line.trim().strip_prefix("kumo: wire listening on ") {
            break address.to_string();
        }
        seen.push_str(&line);
    };
    assert!(address.starts_with("tcp:127.0.0.1:"), "{address}");
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let rank1 = kumo(
        &rank_args(1, &address)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    // Rank 1 ended, so rank 0 has (or soon will have) too; its stdout to the end.
    let mut stdout = Vec::new();
    std::io::Read::read_to_end(&mut listening.stdout.take().unwrap(), &mut stdout).unwrap();
    let status = listening.wait().unwrap();
    let rank0 = std::process::Output {
        status,
        stdout,
        stderr: rest.join().unwrap().into_bytes(),
    };
    assert_job_verified(&rank0, &rank1);
}

/// Two network namespaces joined by a veth pair; deleted (with the pair) on drop,
/// also when the test fails.
struct Namespaces {
    names: [String; 2],
    veth: String,
}

/// `ip ARGS`, which must succeed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            text(&out.stderr).trim()
        ))
    }
}

impl Namespaces {
    /// `A` at 10.77.0.1/24 and `B` at 10.77.0.2/24 on the two ends of one veth pair.
    fn new() -> Result<Namespaces, String> {
        let pid = std::process::id();
        let ns = Namespaces {
            names: [format!("kumo-{pid}-a"), format!("kumo-{pid}-b")],
            veth: format!("kw{pid}a"), // interface names: 15 bytes at most
        };
        let peer = format!("kw{pid}b");
        let [a, b] = &ns.names;
        ip(&["netns", "add", a])?;
        ip(&["netns", "add", b])?;
        ip(&[
            "link", "add", &ns.veth, "netns", a, "type", "veth", "peer", "name", &peer, "netns", b,
        ])?;
        for (name, dev, address) in [(a, &ns.veth, "10.77.0.1/24"), (b, &peer, "10.77.0.2/24")] {
            ip(&["-n", name, "addr", "add", address, "dev", dev])?;
            ip(&["-n", name, "link", "set", dev, "up"])?;
            ip(&["-n", name, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }

    /// `kumo ARGS` inside namespace `i`.
    fn kumo(&self, i: usize, args: &[String]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.names[i], kumo_bin()])
            .args(args)
            .env("XDG_RUNTIME_DIR", scratch_dir());
        cmd
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = ip(&["netns", "del", name]); // takes its end of the pair with it
        }
        let _ = ip(&["link", "del", &self.veth]); // left in ours by a failed move
    }
}

#[test]
fn an_npb_job_verifies_over_a_tcp_wire_between_two_network_namespaces() {
    if !kvm_available() {
        return;
    }
    let ns = match Namespaces::new() {
        Ok(ns) => ns,
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("two network namespaces are needed (root and iproute2) but CI=true: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: two network namespaces: {why}");
            return;
        }
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rank0 = std::thread::spawn({
        let mut cmd = ns.kumo(0, &rank_args(0, "listen:tcp:10.77.0.1:5000"));
        move || run_with_hang_guard(&mut cmd)
    });
    // The namespaces share nothing but the pair: rank 1 reaches rank 0 only over it.
    let rank1 = run_with_hang_guard(&mut ns.kumo(1, &rank_args(1, "tcp:10.77.0.1:5000")));
    let rank0 = rank0.join().unwrap();
    assert_job_verified(&rank0, &rank1);
}
