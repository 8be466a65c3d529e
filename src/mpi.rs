//! MPI jobs across VMs of this host: `kumo mpi` (the guests' MPI self-check and, as
//! they arrive, NPB-MPI kernels) and `kumo bench net` (ping-pong latency and
//! streaming bandwidth between two VMs). Every VM boots the embedded guest with a
//! virtio-net NIC on one switch, served by domain 0's switch thread (`hv::net`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hv::irq::IrqPath;
use kumo_vmm::protocol::{GuestFields, OkLine, WithGuest};
use npb::Spec;
use serde::Serialize;
use serde_json::Value;

use clap::Args;
use kumo_vmm::args::LimitArgs;
use kumo_vmm::job::{Job, NpbReport, run_job, run_job_in};
use kumo_vmm::migrate::{self, AppState, GUEST_NAME};
use kumo_vmm::rank;
use kumo_vmm::run::GuestRun;
use kumo_vmm::spec::job::{
    MEMORY_MIB, NicKind, Wait, WireAddr, WireSpec, npb_extra, npb_memory_mib, parse_npb,
    sched_words,
};
use kumo_vmm::spec::vm::{self, VmSpec};

/// Why rank `rank`'s run has no `kind` line, or its fields.
fn measurement<'a>(
    run: &'a GuestRun,
    kind: &str,
    rank: usize,
) -> Result<&'a BTreeMap<String, String>> {
    run.measurement(kind)
        .with_context(|| format!("rank {rank}"))
}

/// `kumo mpi`: the MPI self-check across `--vms` VMs, or with `--npb` the NPB-MPI
/// kernels.
pub fn run_mpi(args: &MpiArgs, epoch: Instant) -> Result<u8> {
    if let Some(list) = &args.npb {
        return run_npb(args, list, epoch);
    }
    if args.api_socket.is_some() {
        bail!("--api-socket applies to --npb jobs (a rank VM that can move)");
    }
    let sched = sched_words(args.ranks_per_vcpu, args.guest_hz)?;
    let local = args.vcpus.saturating_mul(args.ranks_per_vcpu);
    let extra = format!("wait={} net=check{sched}", args.wait.name());
    let job = Job {
        size: args.job_size.unwrap_or(args.vms.saturating_mul(local)),
        first_rank: args.first_rank,
        wire: args.wire.clone(),
        wire_patience: Duration::from_secs_f64(args.wire_wait),
        nic: args.nic,
        nic_server: args.nic_server.clone(),
    };
    let runs = run_job_in(
        args.vms,
        (args.vcpus, local),
        args.irq_path,
        &extra,
        &job,
        &args.kvm_device,
        epoch,
        MEMORY_MIB * u64::from(local),
    )?
    .runs;
    let mut ok = true;
    let mut rows = Vec::new();
    let ranks = runs.iter().enumerate().flat_map(|(vm, run)| {
        (0..local).map(move |k| (job.first_rank + vm as u32 * local + k, run))
    });
    for (rank, run) in ranks {
        let (verified, fields) = match run.rank_measurement("netcheck", rank) {
            Ok(fields) => (
                fields.get("verified").map(String::as_str) == Some("true"),
                Some(fields),
            ),
            Err(e) => {
                eprintln!("kumo: rank {rank}: {}", kumo_vmm::output::error_chain(&e));
                (false, None)
            }
        };
        ok &= verified;
        let kumo = RankRow {
            rank,
            vms: args.vms,
            vcpus: args.vcpus,
            wait: Wait::name(args.wait),
            irq_path: args.irq_path.name(),
            nic: args.nic.name(),
            verified,
        };
        let guest = fields.map(GuestFields::of).unwrap_or_default();
        rows.push(WithGuest::new(kumo, guest));
    }
    if args.json {
        for row in &rows {
            kumo_vmm::output::json_line(row);
        }
        kumo_vmm::output::json_line(&OkLine { ok });
    } else {
        kumo_vmm::outln!("rank  messages        bytes  stress_s  verified");
        for row in rows.iter().map(as_map) {
            let row = &row;
            kumo_vmm::outln!(
                "{:<5} {:>8} {:>12} {:>9} {:>9}",
                row["rank"],
                text(row, "messages"),
                text(row, "bytes"),
                text(row, "stress_s"),
                if row["verified"] == Value::Bool(true) {
                    "yes"
                } else {
                    "NO"
                }
            );
        }
        kumo_vmm::outln!(
            "MPI check: {} VMs x {} ranks here (of {} ranks), wait={}, irq path {}, nic {}",
            args.vms,
            args.vcpus,
            job.size,
            Wait::name(args.wait),
            args.irq_path.name(),
            args.nic.name()
        );
    }
    Ok(if ok {
        kumo_vmm::report::EXIT_OK
    } else {
        kumo_vmm::report::EXIT_UNVERIFIED
    })
}

/// `kumo mpi --npb LIST`: one job running every benchmark in turn; rank 0's results
/// judged as `kumo`'s, the other ranks' runs must end cleanly.
fn run_npb(args: &MpiArgs, list: &str, epoch: Instant) -> Result<u8> {
    let sched = sched_words(args.ranks_per_vcpu, args.guest_hz)?;
    let local = args.vcpus.saturating_mul(args.ranks_per_vcpu);
    let ranks = args.job_size.unwrap_or(args.vms.saturating_mul(local));
    let specs = parse_npb(list, ranks)?;
    if args.api_socket.is_some() {
        return run_controlled(args, &specs, &sched, epoch);
    }
    let job = Job {
        size: ranks,
        first_rank: args.first_rank,
        wire: args.wire.clone(),
        wire_patience: Duration::from_secs_f64(args.wire_wait),
        nic: args.nic,
        nic_server: args.nic_server.clone(),
    };
    let runs = run_job_in(
        args.vms,
        (args.vcpus, local),
        args.irq_path,
        &(npb_extra(&specs, args.wait) + &sched),
        &job,
        &args.kvm_device,
        epoch,
        npb_memory_mib(&specs, ranks, local),
    )?
    .runs;
    let report = NpbReport {
        specs: &specs,
        ranks,
        vms: args.vms,
        vcpus: args.vcpus,
        ranks_per_vcpu: args.ranks_per_vcpu,
        wait: args.wait,
        irq_path: args.irq_path,
        nic: args.nic,
        json: args.json,
    };
    let firsts = (0..).map(|i: u32| job.first_rank + i * local);
    Ok(report.print(firsts.zip(&runs)))
}

/// kumo's fields of a rank's row of `kumo mpi --json` (beside the guest's `netcheck`
/// fields).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankRow {
    pub rank: u32,
    pub vms: u32,
    pub vcpus: u32,
    /// `"spin"` or `"block"`.
    pub wait: &'static str,
    /// `"generic"` or `"fast"`.
    pub irq_path: &'static str,
    /// `"emulated"` or `"passthrough"`.
    pub nic: &'static str,
    pub verified: bool,
}

/// kumo's fields of a `kumo bench net --json` row (beside the guest's `pingpong`
/// fields).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PingPongRow {
    /// `"generic"`, `"fast"`, or `"qemu"` on QEMU's rows.
    pub irq_path: &'static str,
    /// `"emulated"`, `"passthrough"`, or `"qemu"`.
    pub nic: &'static str,
    pub wait: &'static str,
    /// Domain 0's switch thread over the whole run; absent on QEMU's and
    /// passthrough's rows, which have none.
    #[serde(flatten)]
    pub switch: Option<SwitchCost>,
}

/// What domain 0's switch thread did over a whole `kumo bench net` job (all sizes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SwitchCost {
    pub switch_wakeups: u64,
    pub switch_frames: u64,
    /// µs the thread was busy (woken to done).
    pub switch_busy_us: f64,
}

/// A row as a JSON object, for the table's lookups by key.
fn as_map<T: Serialize>(row: &T) -> serde_json::Map<String, Value> {
    match serde_json::to_value(row) {
        Ok(Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

/// A row's value as the table prints it.
fn text(row: &serde_json::Map<String, Value>, key: &str) -> String {
    match row.get(key) {
        None | Some(Value::Null) => "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(value) => value.to_string(),
    }
}

/// `kumo bench net`: ping-pong between two VMs, one row per message size, for each
/// interrupt path and wait mode asked (side by side in one run).
pub fn run_bench(args: &NetBenchArgs, epoch: Instant) -> Result<u8> {
    let sizes = parse_sizes(&args.sizes)?;
    let paths = match args.irq_path {
        Some(p) => vec![p],
        None => vec![IrqPath::Generic, IrqPath::Fast],
    };
    let waits = match args.wait {
        Some(w) => vec![w],
        None => vec![Wait::Spin, Wait::Block],
    };
    let nics = match args.nic {
        Some(n) => vec![n],
        None => vec![NicKind::Emulated, NicKind::Passthrough],
    };
    let mut rows = Vec::new();
    for &wait in &waits {
        // kumo with each NIC on each path, then (if asked) QEMU with the same guest
        // and sizes.
        let mut settings: Vec<Option<(NicKind, IrqPath)>> = nics
            .iter()
            .flat_map(|&nic| paths.iter().map(move |&path| Some((nic, path))))
            .collect();
        if args.qemu {
            settings.push(None);
        }
        for setting in settings {
            rows.extend(pingpong(args, &sizes, wait, setting, epoch)?);
        }
    }
    if args.json {
        for row in &rows {
            kumo_vmm::output::json_line(row);
        }
    } else {
        kumo_vmm::outln!(
            "{:<12} {:<8} {:<6} {:>9} {:>7} {:>10} {:>10} {:>10} {:>12}",
            "nic",
            "path",
            "wait",
            "size",
            "rounds",
            "median_us",
            "p99_us",
            "MB/s",
            "sw_us/frame"
        );
        for row in rows.iter().map(as_map) {
            let row = &row;
            let per_frame = match (
                row.get("switch_busy_us").and_then(Value::as_f64),
                row.get("switch_frames").and_then(Value::as_u64),
            ) {
                (Some(busy), Some(frames)) if frames > 0 => format!("{:.2}", busy / frames as f64),
                _ => "-".into(),
            };
            kumo_vmm::outln!(
                "{:<12} {:<8} {:<6} {:>9} {:>7} {:>10} {:>10} {:>10} {:>12}",
                text(row, "nic"),
                text(row, "irq_path"),
                text(row, "wait"),
                text(row, "size"),
                text(row, "rounds"),
                text(row, "median_us"),
                text(row, "p99_us"),
                text(row, "mbps"),
                per_frame
            );
        }
        kumo_vmm::outln!(
            "half round trip between two VMs (guest TSC); MB/s = size / half round trip;\n\
             nic emulated: domain 0's switch thread; nic passthrough: a port each of a kumo nic-server (vfio-user);\n\
             sw_us/frame: the switch thread's busy time (woken to done: both copies, the interrupt) per frame delivered, over the whole run (all sizes);\n\
             path qemu: the same guest on two QEMU VMs, virtio-net-pci on one -netdev stream wire"
        );
    }
    Ok(kumo_vmm::report::EXIT_OK)
}

/// One ping-pong job of `kumo bench net`: two VMs (kumo's with `setting`'s NIC and
/// interrupt path, or QEMU's for None) whose ranks wait by `wait`, one row per size.
pub fn pingpong(
    args: &NetBenchArgs,
    sizes: &[u64],
    wait: Wait,
    setting: Option<(NicKind, IrqPath)>,
    epoch: Instant,
) -> Result<Vec<WithGuest<PingPongRow>>> {
    let list: Vec<String> = sizes.iter().map(u64::to_string).collect();
    let mut extra = format!("wait={} net=pingpong:{}", Wait::name(wait), list.join(","));
    if let Some(rounds) = args.rounds {
        extra.push_str(&format!(" net_rounds={rounds}"));
    }
    let (events, switch) = match setting {
        Some((nic, path)) => {
            let job = Job {
                nic,
                ..Job::default()
            };
            let mut job = run_job(2, 1, path, &extra, &job, &args.kvm_device, epoch)?;
            measurement(&job.runs[0], "pingpong", 0)?;
            (job.runs.swap_remove(0).events, job.switch)
        }
        None => (kumo_lab::qemu::run_pair(&extra)?, None),
    };
    let found: Vec<_> = events
        .into_iter()
        .filter_map(|e| match e {
            kumo_vmm::protocol::Event::Measurement { kind, fields } if kind == "pingpong" => {
                Some(fields)
            }
            _ => None,
        })
        .collect();
    if found.len() != sizes.len() {
        bail!(
            "rank 0 reported {} of {} ping-pong sizes",
            found.len(),
            sizes.len()
        );
    }
    let mut rows = Vec::new();
    for fields in found {
        let kumo = PingPongRow {
            irq_path: setting.map_or("qemu", |(_, path)| path.name()),
            nic: setting.map_or("qemu", |(nic, _)| nic.name()),
            wait: Wait::name(wait),
            // The whole run's (every size): the switch thread's own time.
            switch: switch.as_ref().map(|s| SwitchCost {
                switch_wakeups: s.wakeups,
                switch_frames: s.delivered,
                switch_busy_us: s.busy.as_secs_f64() * 1e6,
            }),
        };
        rows.push(WithGuest::new(kumo, GuestFields::of(&fields)));
    }
    Ok(rows)
}

/// Message sizes: `8,1K,64K,1M` (K and M are binary), 1 to 16 of them, each at most
/// 64 MiB (the guest's limits).
fn parse_sizes(list: &str) -> Result<Vec<u64>> {
    let sizes = list
        .split(',')
        .map(|item| {
            let item = item.trim();
            let (digits, unit) = match item.char_indices().last() {
                Some((at, 'K' | 'k')) => (&item[..at], 1u64 << 10),
                Some((at, 'M' | 'm')) => (&item[..at], 1 << 20),
                _ => (item, 1),
            };
            digits
                .parse::<u64>()
                .ok()
                .and_then(|n| n.checked_mul(unit))
                .filter(|&n| (1..=64 << 20).contains(&n))
                .with_context(|| format!("bad message size {item:?}: 1 byte to 64M"))
        })
        .collect::<Result<Vec<_>>>()?;
    if sizes.is_empty() || sizes.len() > 16 {
        bail!("--sizes takes 1 to 16 sizes");
    }
    Ok(sizes)
}

/// `kumo mpi --vms 1 --npb LIST --api-socket PATH`: this process's VM of the job,
/// saveable and movable while it runs; `sched` holds the guest scheduler's words
/// (`--ranks-per-vcpu`, `--guest-hz`).
pub fn run_controlled(args: &MpiArgs, specs: &[Spec], sched: &str, epoch: Instant) -> Result<u8> {
    let socket = args
        .api_socket
        .as_deref()
        .context("--api-socket needs a path")?;
    if args.vms != 1 {
        bail!(
            "--api-socket serves one VM: give --vms 1 (not {})",
            args.vms
        );
    }
    if args.nic != NicKind::Emulated || args.nic_server.is_some() {
        bail!("--api-socket moves emulated NICs only: a passthrough NIC's server cannot move");
    }
    let wire = match &args.wire {
        Some(WireSpec::Listen(_)) => bail!(
            "--api-socket: a listening wire cannot move with its VM; give this side \
             --wire unix:PATH (and the other side listen:unix:PATH)"
        ),
        Some(WireSpec::Connect(WireAddr::Unix(path))) => Some(path.clone()),
        // The migration stream names the wire by a path (`rank::RankApp`).
        Some(WireSpec::Connect(WireAddr::Tcp { .. })) => bail!(
            "--api-socket: a rank VM that moves rejoins over a UNIX wire only; give this \
             side --wire unix:PATH (and the other side listen:unix:PATH)"
        ),
        None => None,
    };
    let first = args.first_rank;
    let local = args.vcpus.saturating_mul(args.ranks_per_vcpu);
    let rank = rank::RankApp {
        first_rank: first,
        job_size: args.job_size.unwrap_or(local),
        wait: args.wait,
        irq_path: args.irq_path,
        macs: (first..first.saturating_add(local))
            .map(kumo_vmm::spec::job::mac)
            .collect(),
        wire,
        wire_wait_s: args.wire_wait.min(rank::MAX_WIRE_WAIT_S),
        ranks_per_vcpu: args.ranks_per_vcpu,
        guest_hz: args.guest_hz,
    };
    rank.job().check_shape(1, local)?;
    // The rank's NICs are attached by `migrate::run_vm` (as where it goes).
    let spec = VmSpec {
        machine: vm::Machine {
            vcpus: args.vcpus,
            memory_mib: Some(npb_memory_mib(specs, rank.job_size, local)),
            huge_pages: false,
        },
        guest: vm::Guest::Npb {
            benchmarks: specs.iter().map(ToString::to_string).collect(),
            barrier_wait: vm::BarrierWait::Auto,
            vcpu_balloon: vm::VcpuBalloon::Auto,
            cmdline: Some(format!(
                "mpi={first}:{}:{local} {}{sched}",
                rank.job_size,
                npb_extra(specs, args.wait)
            )),
        },
        devices: vm::Devices::default(),
        sched: None,
        migration: vm::Migration::default(),
    };
    let vm = kumo_vmm::launch::build(&spec, &args.kvm_device, Default::default())?.vm;
    let app = AppState {
        guest: GUEST_NAME.into(),
        npb: kumo_vmm::spec::job::npb_list(specs),
        vcpus: args.vcpus,
        console: Vec::new(),
        sched: None,
        irq: None,
        rank: Some(rank),
        host_cpus_word: None,
    };
    migrate::run_vm(vm, app, Some(socket), epoch, args.json)
}

#[derive(Args, Debug)]
pub struct MpiArgs {
    /// VMs of this host in the job.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vms: u32,

    /// vCPUs of each VM: one MPI rank per vCPU, each with its own NIC.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub vcpus: u32,

    /// MPI ranks per vCPU (1 to 16), multiplexed by the guest's own preemptive
    /// scheduler; ranks of one VM then talk through its shared memory.
    #[arg(long, value_name = "R", default_value_t = 1)]
    pub ranks_per_vcpu: u32,

    /// The guest scheduler's tick in Hz (1 to 5000) [default: 250 with
    /// --ranks-per-vcpu above 1, else no tick].
    #[arg(long, value_name = "HZ")]
    pub guest_hz: Option<u32>,

    /// Ranks of the whole job, when some run across --wire [default: --vms x --vcpus].
    #[arg(long, value_name = "S")]
    pub job_size: Option<u32>,

    /// The rank of this process's first VM's first vCPU (the others follow).
    #[arg(long, value_name = "R", default_value_t = 0)]
    pub first_rank: u32,

    /// A wire to VMs outside this process, in QEMU's `-netdev stream` framing:
    /// `unix:PATH` or `tcp:HOST:PORT` connects (to QEMU's `server=on`; an IPv6 HOST in
    /// brackets), `listen:unix:PATH` or `listen:tcp:HOST:PORT` waits for a peer (QEMU's
    /// `server=off`, or another kumo's `unix:`/`tcp:`) and, when it leaves,
    /// takes the next one on the same port (a rank VM migrated elsewhere rejoining).
    #[arg(long, value_name = "SPEC")]
    pub wire: Option<WireSpec>,

    /// Seconds the wire waits for its peer (to listen, or to connect).
    #[arg(long, value_name = "SECONDS", default_value_t = 30.0, value_parser = kumo_vmm::args::seconds)]
    pub wire_wait: f64,

    /// How ranks wait for messages.
    #[arg(long, value_enum, default_value_t = Wait::Spin)]
    pub wait: Wait,

    /// NPB-MPI kernels to run across the ranks, comma-separated (`ep.S,is.S,cg.S`;
    /// kernels with an MPI form: ep, is, cg, ft, mg, lu, sp, bt). Without it: the MPI
    /// self-check.
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// Interrupt path of every NIC.
    #[arg(long, value_name = "PATH", default_value = "generic", value_parser = kumo_vmm::args::irq_path)]
    pub irq_path: hv::irq::IrqPath,

    /// The VMs' NIC: emulated (domain 0's switch) or passthrough (a port each of a
    /// `kumo nic-server` this run starts, or of the one at --nic-server).
    #[arg(long, value_enum, default_value_t = NicKind::Emulated)]
    pub nic: NicKind,

    /// With --nic passthrough: use the running `kumo nic-server --dir DIR` instead of
    /// starting one (rank R on port R - first rank).
    #[arg(long, value_name = "DIR")]
    pub nic_server: Option<PathBuf>,

    /// Print one JSON object per rank, then one for the job.
    #[arg(long)]
    pub json: bool,

    /// Serve the HTTP control API (UNIX socket, mode 0600) of this process's one VM
    /// (--vms 1, with --npb): `kumo ctl ... migrate` moves the rank to a `kumo
    /// --incoming`, which rejoins the job on the same wire (the VM's side must
    /// connect: --wire unix:PATH). `--ctl-socket` is an alias.
    #[arg(long, value_name = "PATH", alias = "ctl-socket")]
    pub api_socket: Option<PathBuf>,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,

    #[command(flatten)]
    pub limits: LimitArgs,
}

#[derive(Args, Debug)]
pub struct NetBenchArgs {
    /// Message sizes, comma-separated (K and M are binary units).
    #[arg(long, value_name = "LIST", default_value = "8,1K,64K,1M")]
    pub sizes: String,

    /// Interrupt path of both NICs [default: both, side by side].
    #[arg(long, value_name = "PATH", value_parser = kumo_vmm::args::irq_path)]
    pub irq_path: Option<hv::irq::IrqPath>,

    /// How the ranks wait [default: both, side by side].
    #[arg(long, value_enum)]
    pub wait: Option<Wait>,

    /// Round trips per size [default: the guest's, 32 MiB / max(size, 16 KiB) + 10].
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,

    /// NIC of both VMs [default: emulated and passthrough, side by side].
    #[arg(long, value_enum)]
    pub nic: Option<NicKind>,

    /// Also run the same guest and sizes on two QEMU VMs (virtio-net-pci on a
    /// `-netdev stream` wire), beside kumo's rows.
    #[arg(long)]
    pub qemu: bool,

    /// Print one JSON object per size and setting.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kumo_vmm::spec::job::{MEMORY_MIB, mac};

    #[test]
    fn sizes_take_binary_units_and_refuse_the_rest() {
        assert_eq!(
            parse_sizes("8,1K,64k,1M").unwrap(),
            [8, 1024, 65536, 1 << 20]
        );
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("65M").is_err());
        assert!(parse_sizes("x").is_err());
        assert!(parse_sizes(&vec!["8"; 17].join(",")).is_err());
    }

    #[test]
    fn npb_lists_parse_and_rank_counts_are_checked() {
        let specs = parse_npb("ep.S,is.S,cg.W", 2).unwrap();
        assert_eq!(specs.len(), 3);
        assert_eq!(specs[2].to_string(), "cg.W");
        assert!(parse_npb("ep.S", 3).is_ok());
        let e = parse_npb("ep.S,is.S", 3).unwrap_err().to_string();
        assert_eq!(
            e,
            "is.S cannot run on 3 MPI ranks: needs a power-of-two number of ranks"
        );
        assert!(parse_npb("mg.S", 2).is_ok() && parse_npb("mg.S", 3).is_err());
        assert!(parse_npb("ft.W", 32).is_ok() && parse_npb("ft.W", 64).is_err());
        // FT class A's slabs need more than the default guest memory on 2 ranks.
        assert!(npb_memory_mib(&parse_npb("ft.A", 2).unwrap(), 2, 1) > MEMORY_MIB);
        assert_eq!(
            npb_memory_mib(&parse_npb("ep.S", 2).unwrap(), 2, 1),
            MEMORY_MIB
        );
        // A VM of two ranks holds two of everything.
        let ft = parse_npb("ft.A", 4).unwrap();
        assert!(npb_memory_mib(&ft, 4, 2) >= 2 * npb_memory_mib(&ft, 4, 1) - 96);
        assert!(parse_npb("xx.S", 2).is_err());
    }

    #[test]
    fn macs_are_local_unicast_and_distinct() {
        assert_eq!(mac(0)[0] & 0b11, 0b10);
        assert_ne!(mac(1), mac(257));
    }
}
