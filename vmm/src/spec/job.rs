//! What an MPI job across VMs is made of, as plain values: its limits, each rank's
//! MAC, the wire to ranks elsewhere, how ranks wait, which NIC they get, and the NPB
//! list with the guest memory it needs. Running a job is `crate::job`'s.

use std::path::PathBuf;

use anyhow::{Result, bail};
use npb::Spec;

use crate::guest::memory_with_heap_mib;

/// Guest memory of each VM: the MPI runtime's per-peer rings and the check's 16 MiB
/// exchange fit with room to spare.
pub const MEMORY_MIB: u64 = 256;
/// Most ranks in one job (the guest's MPI takes at most 64), so most VMs too.
pub const MAX_RANKS: u32 = 64;
pub const MAX_VMS: u32 = MAX_RANKS;

/// The MAC of rank `rank`'s NIC: locally administered, "ku" and the rank.
pub fn mac(rank: u32) -> [u8; 6] {
    [0x02, 0x6b, 0x75, 0x00, (rank >> 8) as u8, rank as u8]
}

/// Which NIC the VMs of an MPI job get.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum NicKind {
    /// kumo's virtio-net, its frames carried by domain 0's switch thread.
    #[default]
    Emulated,
    /// A port of a NIC server (vfio-user) attached by PCI passthrough.
    Passthrough,
}

impl NicKind {
    pub fn name(self) -> &'static str {
        match self {
            NicKind::Emulated => "emulated",
            NicKind::Passthrough => "passthrough",
        }
    }
}

/// How a guest's MPI rank waits for the network.
#[derive(
    clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Wait {
    /// Busy-poll the NIC's rings (as MPI libraries do).
    Spin,
    /// Poll briefly, then halt until the NIC's interrupt.
    Block,
    /// Poll briefly, then hand the vCPU to another rank on it (sched_yield).
    Yield,
}

impl Wait {
    /// The word the guest's command line takes (`wait=`).
    pub fn name(self) -> &'static str {
        match self {
            Wait::Spin => "spin",
            Wait::Block => "block",
            Wait::Yield => "yield",
        }
    }
}

/// Most ranks the guest multiplexes on one vCPU (`kumo_abi::sched::MAX_TASKS`).
pub const MAX_RANKS_PER_VCPU: u32 = 16;
/// The guest tick's range: the LAPIC timer's period is at least 200 µs on some hosts.
pub const MAX_GUEST_HZ: u32 = 5000;

/// The guest's words for `ranks_per_vcpu` ranks per vCPU and its tick (`guest_hz`),
/// checked (empty: one rank per vCPU, no tick).
pub fn sched_words(ranks_per_vcpu: u32, guest_hz: Option<u32>) -> Result<String> {
    if !(1..=MAX_RANKS_PER_VCPU).contains(&ranks_per_vcpu) {
        bail!("--ranks-per-vcpu must be between 1 and {MAX_RANKS_PER_VCPU}, not {ranks_per_vcpu}");
    }
    let mut words = String::new();
    if ranks_per_vcpu > 1 {
        words.push_str(&format!(" ranks_per_vcpu={ranks_per_vcpu}"));
    }
    if let Some(hz) = guest_hz {
        if !(1..=MAX_GUEST_HZ).contains(&hz) {
            bail!("--guest-hz must be between 1 and {MAX_GUEST_HZ}, not {hz}");
        }
        words.push_str(&format!(" guest_hz={hz}"));
    }
    Ok(words)
}

/// The forms a wire takes, for messages.
const WIRE_FORMS: &str = "a wire is unix:PATH or tcp:HOST:PORT (connect), \
     listen:unix:PATH or listen:tcp:HOST:PORT (listen); an IPv6 HOST in brackets: tcp:[::1]:5000";

/// Where a wire's other end is: a UNIX socket's path, or a TCP host (an IPv4 or IPv6
/// literal, or a name) and port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireAddr {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

impl std::fmt::Display for WireAddr {
    /// As it is written after `unix:` / `tcp:` (an IPv6 host in brackets).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireAddr::Unix(path) => write!(f, "unix:{}", path.display()),
            WireAddr::Tcp { host, port } if host.contains(':') => {
                write!(f, "tcp:[{host}]:{port}")
            }
            WireAddr::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

/// The other end of a wire in QEMU's stream framing (`-netdev stream`): a UNIX socket
/// (`addr.type=unix`) or TCP (`addr.type=inet`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireSpec {
    /// Connect to a listener (QEMU's `-netdev stream,server=on`, another kumo's
    /// `listen:`), retrying while it is not there yet.
    Connect(WireAddr),
    /// Listen (QEMU's `server=off`, another kumo's `unix:`/`tcp:`): one peer at a
    /// time, the next taking the port when one leaves. A TCP port of 0 takes a free
    /// one (logged).
    Listen(WireAddr),
}

/// `HOST:PORT` after `tcp:`, with an IPv6 HOST in brackets.
fn parse_tcp(rest: &str, listen: bool) -> Result<WireAddr, String> {
    let (host, port) = if let Some(bracketed) = rest.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or("an IPv6 host's bracket is not closed")?;
        host.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("{host:?} in brackets is not an IPv6 address"))?;
        let port = after
            .strip_prefix(':')
            .ok_or("no :PORT after the bracketed host")?;
        (host, port)
    } else {
        let (host, port) = rest.rsplit_once(':').ok_or("no :PORT")?;
        if host.contains(':') {
            return Err(format!("{host:?}: an IPv6 host goes in brackets"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err("no HOST".into());
    }
    if host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{host:?} is not a host name or address"));
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("the port {port:?} is not a number from 0 to 65535"))?;
    if port == 0 && !listen {
        return Err("port 0 names no peer to connect to".into());
    }
    Ok(WireAddr::Tcp {
        host: host.into(),
        port,
    })
}

impl std::str::FromStr for WireSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<WireSpec, String> {
        let (listen, rest) = match text.strip_prefix("listen:") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let addr = if let Some(path) = rest.strip_prefix("unix:") {
            if path.is_empty() {
                Err("no PATH".to_string())
            } else {
                Ok(WireAddr::Unix(path.into()))
            }
        } else if let Some(host_port) = rest.strip_prefix("tcp:") {
            parse_tcp(host_port, listen)
        } else {
            Err("neither unix: nor tcp:".into())
        };
        let addr = addr.map_err(|why| format!("{text:?}: {why}; {WIRE_FORMS}"))?;
        Ok(if listen {
            WireSpec::Listen(addr)
        } else {
            WireSpec::Connect(addr)
        })
    }
}

impl std::fmt::Display for WireSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireSpec::Connect(addr) => write!(f, "{addr}"),
            WireSpec::Listen(addr) => write!(f, "listen:{addr}"),
        }
    }
}

/// `--npb LIST`: the benchmarks, each checked against the job's rank count.
pub fn parse_npb(list: &str, ranks: u32) -> Result<Vec<Spec>> {
    let specs = list
        .split(',')
        .map(|item| {
            item.trim()
                .parse::<Spec>()
                .map_err(|e| anyhow::anyhow!("--npb: {e}"))
        })
        .collect::<Result<Vec<Spec>>>()?;
    for spec in &specs {
        if let Err(why) = npb::mpi::supports(*spec, ranks as usize) {
            bail!("{spec} cannot run on {ranks} MPI ranks: {why}");
        }
    }
    Ok(specs)
}

/// Guest memory of a VM running `local` of the job's `ranks` ranks of `specs`: per rank,
/// the largest kernel's heap, the MPI's rings (a send and a receive ring of 1 MiB per
/// peer) and the runtime, at least [`MEMORY_MIB`]; the heaps all below the PCI hole or
/// all above it (the guest gives each rank its share of either).
pub fn npb_memory_mib(specs: &[Spec], ranks: u32, local: u32) -> u64 {
    let heap = specs
        .iter()
        .map(|&spec| npb::mpi::heap_bytes(spec, ranks as usize))
        .max()
        .unwrap_or(0) as u64;
    let local = u64::from(local.max(1));
    memory_with_heap_mib(
        local * (2 * u64::from(ranks) + 96),
        local * heap.div_ceil(1 << 20),
    )
    .max(local * MEMORY_MIB)
}

/// The guest's command-line words for an NPB-MPI job (beside `mpi=`).
pub fn npb_extra(specs: &[Spec], wait: Wait) -> String {
    let items: Vec<String> = specs.iter().map(Spec::to_string).collect();
    format!("wait={} npb={}", wait.name(), items.join(","))
}

/// The NPB list as the guest's `npb=` word and a stream's program state write it.
pub fn npb_list(specs: &[Spec]) -> String {
    specs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> WireAddr {
        WireAddr::Tcp {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn wires_parse_in_every_accepted_form_and_print_back() {
        for (text, spec) in [
            (
                "unix:/tmp/w.sock",
                WireSpec::Connect(WireAddr::Unix("/tmp/w.sock".into())),
            ),
            (
                "listen:unix:/tmp/w.sock",
                WireSpec::Listen(WireAddr::Unix("/tmp/w.sock".into())),
            ),
            (
                "tcp:127.0.0.1:5000",
                WireSpec::Connect(tcp("127.0.0.1", 5000)),
            ),
            (
                "tcp:node-b.example:65535",
                WireSpec::Connect(tcp("node-b.example", 65535)),
            ),
            ("tcp:[::1]:5000", WireSpec::Connect(tcp("::1", 5000))),
            (
                "listen:tcp:0.0.0.0:5000",
                WireSpec::Listen(tcp("0.0.0.0", 5000)),
            ),
            ("listen:tcp:[::]:5000", WireSpec::Listen(tcp("::", 5000))),
            (
                "listen:tcp:localhost:0",
                WireSpec::Listen(tcp("localhost", 0)),
            ),
        ] {
            assert_eq!(text.parse::<WireSpec>(), Ok(spec.clone()), "{text}");
            assert_eq!(spec.to_string(), text);
        }
    }

    #[test]
    fn bad_wires_are_refused_naming_the_fault_and_the_accepted_forms() {
        let forms = "a wire is unix:PATH or tcp:HOST:PORT (connect), listen:unix:PATH or \
                     listen:tcp:HOST:PORT (listen); an IPv6 HOST in brackets: tcp:[::1]:5000";
        for (text, why) in [
            ("/tmp/w.sock", "neither unix: nor tcp:"),
            ("", "neither unix: nor tcp:"),
            ("listen:", "neither unix: nor tcp:"),
            ("udp:1.2.3.4:5", "neither unix: nor tcp:"),
            ("unix:", "no PATH"),
            ("listen:unix:", "no PATH"),
            ("tcp:", "no :PORT"),
            ("tcp:127.0.0.1", "no :PORT"),
            ("tcp::5000", "no HOST"),
            ("tcp:[]:5000", "\"\" in brackets is not an IPv6 address"),
            ("tcp:127.0.0.1:0", "port 0 names no peer to connect to"),
            (
                "tcp:h:65536",
                "the port \"65536\" is not a number from 0 to 65535",
            ),
            ("tcp:h:", "the port \"\" is not a number from 0 to 65535"),
            (
                "tcp:h:-1",
                "the port \"-1\" is not a number from 0 to 65535",
            ),
            ("tcp:::1:5000", "\"::1\": an IPv6 host goes in brackets"),
            ("tcp:[::1:5000", "an IPv6 host's bracket is not closed"),
            ("tcp:[::1]5000", "no :PORT after the bracketed host"),
            (
                "tcp:[host]:5000",
                "\"host\" in brackets is not an IPv6 address",
            ),
            ("tcp:a b:5000", "\"a b\" is not a host name or address"),
        ] {
            assert_eq!(
                text.parse::<WireSpec>(),
                Err(format!("{text:?}: {why}; {forms}")),
                "{text}"
            );
        }
    }
}
