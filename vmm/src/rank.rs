//! One rank VM of an MPI job that can be moved: `kumo mpi --vms 1 --npb LIST
//! --api-socket PATH` runs this process's VM of the job under an API socket, and
//! `kumo ctl ... migrate` sends it to a `kumo --incoming`. What the destination needs
//! to rebuild it travels in the stream's program state ([`RankApp`]): it plugs the
//! NICs into the same PCI slots (their state, with the PCI bus's, goes in before the
//! first `KVM_RUN`), starts a switch and connects to the same wire, whose listening
//! side takes the new connection as the same port once the source's is gone
//! (`hv::wire`). Frames lost in the move are resent by the guests' MPI.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use devices::net::switch::SwitchConfig;
use hv::Vm;
use hv::irq::IrqPath;
use hv::net::{Network, NicSetup, RunningNetwork};
use npb::Spec;
use serde::{Deserialize, Serialize};

use crate::args::NicKind;
use crate::args::Wait;
use crate::job::{Job, NpbReport};
use crate::run::GuestRun;
use crate::spec::job::{self as mpi, WireAddr, WireSpec};
use crate::wire::{WireAttach, WireGuard};

/// What makes a VM one rank (or, with several vCPUs, several ranks) of a job: the
/// program's state in a snapshot or migration stream beside the NPB list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankApp {
    /// The rank of the VM's first vCPU (the others follow).
    pub first_rank: u32,
    /// Ranks of the whole job.
    pub job_size: u32,
    pub wait: Wait,
    #[serde(with = "crate::irq::path_name")]
    pub irq_path: IrqPath,
    /// Each rank's NIC, in slot order (`ranks_per_vcpu` per vCPU).
    pub macs: Vec<[u8; 6]>,
    /// The wire to the job's other ranks: the path this VM's side connects to (None:
    /// the whole job runs in this VM).
    pub wire: Option<PathBuf>,
    /// How long to wait for the wire's other side, in seconds.
    pub wire_wait_s: f64,
    /// MPI ranks per vCPU, multiplexed by the guest's scheduler on its periodic LAPIC
    /// timer tick (the tick's state travels with the vCPU's LAPIC).
    #[serde(default = "one")]
    pub ranks_per_vcpu: u32,
    /// The guest scheduler's tick in Hz, if the job named one (the guest's default
    /// otherwise); the guest was booted with it, so this only describes the rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_hz: Option<u32>,
}

fn one() -> u32 {
    1
}

/// The longest wait for a wire a stream may ask for.
pub const MAX_WIRE_WAIT_S: f64 = 3600.0;

impl RankApp {
    /// Checks a description that came from a stream (a file or a peer) against the
    /// VM's `vcpus`.
    fn check(&self, vcpus: u32) -> Result<()> {
        self.check_nics(vcpus)?;
        if !(0.0..=MAX_WIRE_WAIT_S).contains(&self.wire_wait_s) {
            bail!(
                "the stream's wire wait ({} s) is not 0 to {MAX_WIRE_WAIT_S} s",
                self.wire_wait_s
            );
        }
        self.job()
            .check_shape(1, self.local_ranks(vcpus))
            .map(|_| ())
    }

    /// Checks the rank's NICs and ranks per vCPU against the VM's `vcpus` (a node's
    /// domain, whose network is its node's, needs no more).
    pub fn check_nics(&self, vcpus: u32) -> Result<()> {
        if !(1..=mpi::MAX_RANKS_PER_VCPU).contains(&self.ranks_per_vcpu) {
            bail!(
                "the stream's rank has {} ranks per vCPU (1 to {})",
                self.ranks_per_vcpu,
                mpi::MAX_RANKS_PER_VCPU
            );
        }
        if let Some(hz) = self.guest_hz
            && !(1..=mpi::MAX_GUEST_HZ).contains(&hz)
        {
            bail!(
                "the stream's guest tick ({hz} Hz) is not 1 to {} Hz",
                mpi::MAX_GUEST_HZ
            );
        }
        let local = self.local_ranks(vcpus);
        if self.macs.len() != local as usize {
            bail!(
                "the stream's rank has {} NICs for {vcpus} vCPUs x {} ranks",
                self.macs.len(),
                self.ranks_per_vcpu
            );
        }
        Ok(())
    }

    /// The ranks a VM of `vcpus` vCPUs runs.
    pub fn local_ranks(&self, vcpus: u32) -> u32 {
        vcpus.saturating_mul(self.ranks_per_vcpu)
    }

    pub fn job(&self) -> Job {
        Job {
            size: self.job_size,
            first_rank: self.first_rank,
            wire: self
                .wire
                .clone()
                .map(|path| WireSpec::Connect(WireAddr::Unix(path))),
            wire_patience: Duration::from_secs_f64(self.wire_wait_s),
            nic: NicKind::Emulated,
            nic_server: None,
        }
    }

    /// The kernels, checked against the job's size.
    pub fn specs(&self, npb: &str) -> Result<Vec<Spec>> {
        mpi::parse_npb(npb, self.job_size)
    }

    /// Judges and prints this VM's run as `kumo mpi` does its VMs'.
    pub fn report(&self, specs: &[Spec], vcpus: u32, run: &GuestRun, json: bool) -> u8 {
        NpbReport {
            specs,
            ranks: self.job_size,
            vms: 1,
            vcpus,
            ranks_per_vcpu: self.ranks_per_vcpu,
            wait: self.wait,
            irq_path: self.irq_path,
            nic: NicKind::Emulated,
            json,
        }
        .print([(self.first_rank, run)])
    }
}

/// A rank VM's network: its NICs' switch, running, and the wire plugged into it.
pub struct RankNetwork {
    // Dropped in this order: the switch thread (and the wire's threads), the wire's
    // socket file, the switch.
    _running: RunningNetwork,
    _wire: Option<WireGuard>,
    _network: Network,
}

/// Plugs the rank's NICs into `vm` (before it runs; a restored VM's NICs take their
/// saved state when it starts), connects the wire and starts the switch thread.
pub fn attach(vm: &mut Vm, rank: &RankApp, vcpus: u32) -> Result<RankNetwork> {
    rank.check(vcpus)?;
    let network = Network::new(SwitchConfig::default())?;
    // The network is this VM's: its wire goes with it when it moves.
    network.moves_with_its_vm();
    for (k, &mac) in rank.macs.iter().enumerate() {
        let setup = NicSetup {
            mac,
            irq_path: rank.irq_path,
        };
        network
            .attach(vm, &setup, None)
            .with_context(|| format!("attaching rank {}'s NIC", rank.first_rank + k as u32))?;
    }
    let job = rank.job();
    let wire = job
        .wire
        .as_ref()
        .map(|wire| wire.attach(&network, job.wire_patience, None))
        .transpose()?;
    let running = network.start(None)?;
    Ok(RankNetwork {
        _running: running,
        _wire: wire,
        _network: network,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migrate::{AppState, GUEST_NAME};

    fn rank() -> RankApp {
        RankApp {
            first_rank: 1,
            job_size: 2,
            wait: Wait::Spin,
            irq_path: IrqPath::Generic,
            macs: vec![mpi::mac(1)],
            wire: Some("/tmp/w.sock".into()),
            wire_wait_s: 30.0,
            ranks_per_vcpu: 1,
            guest_hz: None,
        }
    }

    #[test]
    fn a_rank_travels_as_json_and_a_damaged_one_is_refused_before_anything_is_built() {
        let app = AppState {
            guest: GUEST_NAME.into(),
            npb: "cg.W".into(),
            vcpus: 1,
            console: Vec::new(),
            sched: None,
            irq: None,
            rank: Some(rank()),
            host_cpus_word: None,
        };
        let text = serde_json::to_string(&app).unwrap();
        let back = AppState::parse(&text).unwrap();
        assert_eq!(back, app);
        assert_eq!(back.specs().unwrap()[0].to_string(), "cg.W");
        assert!(rank().check(1).is_ok());
        let refused = |r: RankApp, vcpus: u32, needle: &str| {
            let e = format!("{:#}", r.check(vcpus).unwrap_err());
            assert!(e.contains(needle), "{e} (wanted {needle})");
        };
        refused(rank(), 2, "1 NICs for 2 vCPUs x 1 ranks");
        // Two ranks per vCPU: two NICs per vCPU, and the tick's rate in range.
        let two = RankApp {
            job_size: 4,
            first_rank: 2,
            macs: vec![mpi::mac(2), mpi::mac(3)],
            ranks_per_vcpu: 2,
            guest_hz: Some(1000),
            ..rank()
        };
        assert!(two.check(1).is_ok());
        refused(two.clone(), 2, "2 NICs for 2 vCPUs x 2 ranks");
        refused(
            RankApp {
                ranks_per_vcpu: 17,
                ..two.clone()
            },
            1,
            "17 ranks per vCPU",
        );
        refused(
            RankApp {
                guest_hz: Some(0),
                ..two.clone()
            },
            1,
            "guest tick (0 Hz)",
        );
        refused(
            RankApp {
                first_rank: 3,
                ..two.clone()
            },
            1,
            "do not fit a job of 4 ranks",
        );
        // A stream of a kumo before ranks per vCPU travelled: one per vCPU.
        let old = serde_json::to_string(&rank())
            .unwrap()
            .replace(",\"ranks_per_vcpu\":1", "");
        assert!(!old.contains("ranks_per_vcpu"), "{old}");
        let back: RankApp = serde_json::from_str(&old).unwrap();
        assert_eq!(back, rank());
        for wait in [f64::NAN, -1.0, 1e9] {
            refused(
                RankApp {
                    wire_wait_s: wait,
                    ..rank()
                },
                1,
                "wire wait",
            );
        }
        refused(
            RankApp {
                first_rank: 2,
                ..rank()
            },
            1,
            "do not fit a job of 2 ranks",
        );
        refused(
            RankApp {
                wire: None,
                ..rank()
            },
            1,
            "give a --wire",
        );
        // A kernel the job's size cannot run, and fields that do not parse.
        let bad_npb = AppState {
            npb: "is.S".into(),
            rank: Some(RankApp {
                job_size: 3,
                first_rank: 0,
                macs: vec![mpi::mac(0); 3],
                ..rank()
            }),
            vcpus: 3,
            ..app.clone()
        };
        assert!(bad_npb.specs().is_err());
        let bad_path = text.replace("\"generic\"", "\"sideways\"");
        assert!(AppState::parse(&bad_path).is_err());
        let bad_wait = text.replace("\"spin\"", "\"nap\"");
        assert!(AppState::parse(&bad_wait).is_err());
    }
}
