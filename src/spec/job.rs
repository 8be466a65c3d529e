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

/// The other end of a wire: a UNIX socket in QEMU's stream framing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireSpec {
    /// Connect to a listener (QEMU's `-netdev stream,server=on`, another kumo's
    /// `listen:`), retrying while it is not there yet.
    Connect(PathBuf),
    /// Listen (QEMU's `server=off`, another kumo's `unix:`): one peer at a time, the
    /// next taking the port when one leaves.
    Listen(PathBuf),
}

impl std::str::FromStr for WireSpec {
    type Err = String;
    fn from_str(text: &str) -> Result<WireSpec, String> {
        let (listen, rest) = match text.strip_prefix("listen:") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        match rest.strip_prefix("unix:") {
            Some(path) if !path.is_empty() => Ok(if listen {
                WireSpec::Listen(path.into())
            } else {
                WireSpec::Connect(path.into())
            }),
            _ => Err(format!("{text:?}: a wire is unix:PATH or listen:unix:PATH")),
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
