//! kumo's embedded guest: the PVH ELF built from `guests/` by build.rs, and what it needs.

use npb::{Class, Kernel, Spec};

/// The guest ELF, built by `build.rs` from `guests/` with the pinned toolchain.
pub static EMBEDDED_GUEST: &[u8] = include_bytes!(env!("KUMO_GUEST_ELF"));

/// Memory the guest needs besides its workload's heap: the image and boot data below
/// the user image's end, plus slack for page-table and allocator rounding.
const GUEST_BASE_MIB: u64 = 32;
/// Per vCPU: a ring-0 stack, a ring-3 stack and, ballooned, a ring-3 stack for its
/// team rank's green thread (256 KiB each, from the low heap), rounded generously.
const GUEST_PER_VCPU_MIB: u64 = 1;
/// Memory is cheap when untouched (memfd pages are only allocated when the guest writes
/// them), so the default leaves room rather than cutting it fine.
const DEFAULT_MIN_MIB: u64 = 64;

/// The benchmarks run when none are named: every kernel kumo has, class S.
pub fn default_specs() -> Vec<Spec> {
    Kernel::ALL
        .iter()
        .map(|&kernel| Spec {
            kernel,
            class: Class::S,
        })
        .collect()
}

/// Rejects more vCPUs than the embedded guest can bring up (its per-CPU tables are
/// fixed-size data, see guests/abi).
pub fn check_vcpus(vcpus: u32) -> anyhow::Result<()> {
    let max = kumo_abi::MAX_CPUS;
    anyhow::ensure!(
        vcpus as usize <= max,
        "--vcpus {vcpus} is more than kumo's NPB guest supports ({max}); --kernel boots other guests"
    );
    Ok(())
}

/// The embedded guest's command line for `specs` on `vcpus` vCPUs on this host.
pub fn npb_cmdline(specs: &[Spec], vcpus: u32, wait: BarrierWait, balloon: VcpuBalloon) -> String {
    let names: Vec<String> = specs.iter().map(ToString::to_string).collect();
    let cpus = host_cpus();
    let keys = barrier_keys(team_spin_us(vcpus, cpus), wait.resolve(vcpus, cpus));
    let balloon = balloon_keys(balloon.resolve(vcpus, cpus));
    format!("npb={} {keys}{balloon}", names.join(","))
}

/// The guest's command-line keys for vCPU ballooning (with a leading space), if on.
/// Its vCPUs at a barrier spin adaptively up to [`DEDICATED_SPIN_US`]: each has a host
/// CPU unless something else takes it, and the spin halves whenever it was in vain
/// (`npb::green::next_spin`); on the loaded 2-core host this beat no spin (README).
pub fn balloon_keys(on: bool) -> String {
    if on {
        format!(" balloon=1 balloon_spin_us={DEDICATED_SPIN_US}")
    } else {
        String::new()
    }
}

/// vCPU ballooning (VCPU-Bal): whether the guest runs its team as green threads on
/// only as many vCPUs as there are host CPUs for it, parking the others (`npb::green`).
#[derive(
    clap::ValueEnum,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum VcpuBalloon {
    /// On when the vCPUs outnumber the host CPUs kumo may use.
    #[default]
    Auto,
    On,
    Off,
}

impl VcpuBalloon {
    pub fn name(self) -> &'static str {
        match self {
            VcpuBalloon::Auto => "auto",
            VcpuBalloon::On => "on",
            VcpuBalloon::Off => "off",
        }
    }

    /// Whether the guest balloons with `vcpus` vCPUs on `host_cpus` CPUs. With a CPU
    /// per vCPU there is nothing to gain, and every team keeps a thread per vCPU.
    pub fn resolve(self, vcpus: u32, host_cpus: usize) -> bool {
        match self {
            VcpuBalloon::Auto => vcpus as usize > host_cpus,
            VcpuBalloon::On => true,
            VcpuBalloon::Off => false,
        }
    }
}

/// Tells `vm`'s guest how many host CPUs it may use (read by a ballooning guest;
/// harmless to any other).
pub fn tell_host_cpus(vm: &hv::Vm) {
    let cpus = u32::try_from(host_cpus()).unwrap_or(u32::MAX);
    vm.control().host_cpus().set(cpus);
}

/// How the embedded guest's threads sleep at a barrier once their spin is over.
#[derive(
    clap::ValueEnum,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BarrierWait {
    /// `pv` when the vCPUs outnumber the host's CPUs, `hlt` when each has one.
    #[default]
    Auto,
    /// Blocked in kumo on the barrier's word (the paravirtual wait page, hv::pvwait):
    /// no guest ring-0 code and no interrupt, which are slow on nested hosts.
    Pv,
    /// `hlt` in the guest's supervisor until an IPI: what any hypervisor offers.
    Hlt,
}

impl BarrierWait {
    pub fn name(self) -> &'static str {
        match self {
            BarrierWait::Auto => "auto",
            BarrierWait::Pv => "pv",
            BarrierWait::Hlt => "hlt",
        }
    }

    /// `Auto` decided for `threads` vCPUs on `host_cpus` CPUs. With a CPU each, sleeps
    /// are rare (2 ms spin) and a halted vCPU that KVM polls for resumes without a
    /// host context switch: halting stays as it was (on the loaded host of
    /// 2026-11-24, `pv` was no better there, sometimes worse: README).
    pub fn resolve(self, threads: u32, host_cpus: usize) -> BarrierWait {
        match self {
            BarrierWait::Auto if threads as usize > host_cpus => BarrierWait::Pv,
            BarrierWait::Auto => BarrierWait::Hlt,
            chosen => chosen,
        }
    }
}

/// The guest's command-line keys for waiting at barriers: spin `spin_us`, then sleep
/// the `wait` way.
pub fn barrier_keys(spin_us: u64, wait: BarrierWait) -> String {
    let spin = spin_us;
    match wait {
        BarrierWait::Pv => format!("spin_us={spin} pvwait=1"),
        BarrierWait::Hlt | BarrierWait::Auto => format!("spin_us={spin}"),
    }
}

/// Parses `--npb LIST`; the error names the offending item.
pub fn parse_specs(list: &str) -> anyhow::Result<Vec<Spec>> {
    let specs = list
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.parse::<Spec>()
                .map_err(|e| anyhow::anyhow!("--npb: {e}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        !specs.is_empty(),
        "--npb: no benchmark named (e.g. --npb ep.S)"
    );
    Ok(specs)
}

/// The least memory (MiB) with which the embedded guest can run `specs` on `vcpus`.
/// Benchmarks run one after another, so the largest heap decides. A heap must lie in
/// one RAM region: one too large for the RAM below the 32-bit hole needs all of that
/// below and the heap above 4 GiB (`hv::memory_map`).
pub fn required_memory_mib(specs: &[Spec], vcpus: u32) -> u64 {
    let heap = specs
        .iter()
        .map(|&s| npb::workload_heap_bytes(s, vcpus))
        .max()
        .unwrap_or(0);
    memory_with_heap_mib(
        GUEST_BASE_MIB + GUEST_PER_VCPU_MIB * u64::from(vcpus),
        heap.div_ceil(1 << 20),
    )
}

/// Guest memory for `base_mib` of runtime and a heap of `heap_mib` that must lie in one
/// RAM region: below the 32-bit hole if both fit there, else all the RAM below it and
/// the heap above 4 GiB, where the guest puts it (`hv::memory_map`; its page tables come
/// from the low heap). The guest maps the high region in whole 2 MiB pages and drops a
/// partial last one, so the heap there is rounded up to 2 MiB (`kumo --npb mg.C` got
/// 6481 MiB and died out of memory, 1 MiB short).
pub fn memory_with_heap_mib(base_mib: u64, heap_mib: u64) -> u64 {
    let low_max_mib = hv::memory_map::LOW_RAM_MAX >> 20;
    if base_mib + heap_mib <= low_max_mib {
        base_mib + heap_mib
    } else {
        low_max_mib + heap_mib.next_multiple_of(HIGH_PAGE_MIB)
    }
}

/// The page size the guest maps RAM above 4 GiB with.
const HIGH_PAGE_MIB: u64 = 2;

/// As [`choose_memory_mib`], for RAM on 2 MiB huge pages if `huge_pages`: the size
/// kumo picks is then rounded up to whole pages (one the user gives is kept, and an
/// odd one refused when the VM is built).
pub fn choose_memory_mib_paged(
    memory: Option<u64>,
    specs: &[Spec],
    vcpus: u32,
    huge_pages: bool,
) -> anyhow::Result<u64> {
    let mib = choose_memory_mib(memory, specs, vcpus)?;
    Ok(if huge_pages && memory.is_none() {
        mib.next_multiple_of(2)
    } else {
        mib
    })
}

/// `--memory` if given (checked against the need), else a size that fits.
pub fn choose_memory_mib(
    requested: Option<u64>,
    specs: &[Spec],
    vcpus: u32,
) -> anyhow::Result<u64> {
    let need = required_memory_mib(specs, vcpus);
    match requested {
        Some(mib) if mib < need => {
            let names: Vec<String> = specs.iter().map(ToString::to_string).collect();
            anyhow::bail!(
                "--memory {mib} MiB is too small for {} on {vcpus} vCPUs: it needs at least {need} MiB",
                names.join(",")
            )
        }
        Some(mib) => Ok(mib),
        None => Ok(need.max(DEFAULT_MIN_MIB)),
    }
}

/// How long a guest (or native) thread waiting at a barrier spins before it sleeps.
/// With a host CPU for every thread, spinning is free and waking a halted vCPU is not
/// (tens of microseconds, milliseconds at the tail, on nested hosts); when threads
/// share CPUs, a long spin steals time from the thread being waited for.
pub fn barrier_spin_us(threads: u32, host_cpus: usize) -> u64 {
    if threads as usize <= host_cpus {
        DEDICATED_SPIN_US
    } else {
        SHARED_SPIN_US
    }
}

/// Spins (microseconds) for dedicated and for shared host CPUs.
pub const DEDICATED_SPIN_US: u64 = 2000;
pub const SHARED_SPIN_US: u64 = 50;

/// The spin of one team (a VM's vCPUs, or the native twin's threads) alone on this
/// host: with a CPU per thread, as [`barrier_spin_us`]; with more threads than CPUs,
/// none at all. The threads a waiter waits for need its CPU, and a sleep costs about
/// one exit (~40 us here, `kumo bench oversub`), while CG.W's phases on 12 threads are
/// a few microseconds of work each: any spin only delays them (12 threads on 2 CPUs,
/// native: 0.15-0.21 s with no spin, 0.34-0.41 s with 10 us, 0.96-1.15 s with 50 us).
/// This is libgomp's choice too: it throttles spinning when threads outnumber CPUs.
/// Nodes keep [`barrier_spin_us`]: their guests' MPI waits use the same spin.
pub fn team_spin_us(threads: u32, host_cpus: usize) -> u64 {
    match barrier_spin_us(threads, host_cpus) {
        SHARED_SPIN_US => OVERSUBSCRIBED_SPIN_US,
        dedicated => dedicated,
    }
}

pub const OVERSUBSCRIBED_SPIN_US: u64 = 0;

/// Refuses a host CPU number this host does not have (`what` names the option).
pub fn check_host_cpu(what: &str, cpu: usize) -> anyhow::Result<()> {
    let host_cpus = host_cpus();
    if cpu >= host_cpus {
        anyhow::bail!(
            "{what} {cpu} does not exist: this host has CPUs 0..={}",
            host_cpus - 1
        );
    }
    Ok(())
}

/// Host CPUs this process may use.
pub fn host_cpus() -> usize {
    hv::placement::host_cpus()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guest's own arithmetic (`guests/user/src/highmem.rs`): the high range is
    /// whole 2 MiB pages from 4 GiB, and a heap that does not fit below the hole must
    /// fit there.
    #[test]
    fn the_default_memory_holds_every_benchmark_and_class_on_1_to_4_vcpus() {
        let low_max = hv::memory_map::LOW_RAM_MAX;
        for &kernel in npb::Kernel::ALL {
            for &class in kernel.classes() {
                let spec = Spec { kernel, class };
                for vcpus in 1..=4 {
                    let heap = npb::workload_heap_bytes(spec, vcpus);
                    let total = choose_memory_mib(None, &[spec], vcpus).unwrap() << 20;
                    if total > low_max {
                        let high = (hv::memory_map::HIGH_RAM_BASE + total - low_max)
                            & !((HIGH_PAGE_MIB << 20) - 1);
                        let room = high - hv::memory_map::HIGH_RAM_BASE;
                        assert!(room >= heap, "{spec} on {vcpus}: {room} < {heap}");
                    } else {
                        assert!(total >= heap + (GUEST_BASE_MIB << 20), "{spec} on {vcpus}");
                    }
                }
            }
        }
    }

    #[test]
    fn embedded_guest_is_an_elf() {
        assert_eq!(&EMBEDDED_GUEST[..4], b"\x7fELF");
    }

    #[test]
    fn parses_lists_and_names_the_bad_item() {
        let specs = parse_specs("ep.S, ep.W").unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[1].to_string(), "ep.W");
        let err = parse_specs("ep.S,xx.S").unwrap_err().to_string();
        assert!(err.contains("xx"), "{err}");
        let err = parse_specs("ep.Q").unwrap_err().to_string();
        assert!(err.contains('Q'), "{err}");
        assert!(parse_specs(",").is_err());
    }

    #[test]
    fn a_heap_too_large_for_low_memory_is_counted_above_4_gib() {
        let ft_c: Vec<Spec> = parse_specs("ft.C").unwrap();
        let heap_mib = npb::workload_heap_bytes(ft_c[0], 2).div_ceil(1 << 20);
        assert!(heap_mib > 3072, "FT.C's heap needs the high region");
        // All of the RAM below the hole, then the heap above 4 GiB in whole 2 MiB pages.
        assert_eq!(
            required_memory_mib(&ft_c, 2),
            3072 + heap_mib.next_multiple_of(2)
        );
        let small = parse_specs("ft.A").unwrap();
        assert!(required_memory_mib(&small, 2) < 3072);
    }

    #[test]
    fn memory_grows_with_vcpus_and_rejects_too_little() {
        let specs = default_specs();
        assert!(required_memory_mib(&specs, 8) > required_memory_mib(&specs, 1));
        let need = required_memory_mib(&specs, 2);
        assert_eq!(choose_memory_mib(Some(need), &specs, 2).unwrap(), need);
        let err = choose_memory_mib(Some(need - 1), &specs, 2)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("at least {need} MiB")), "{err}");
        assert!(choose_memory_mib(None, &specs, 2).unwrap() >= need);
    }

    #[test]
    fn a_team_alone_spins_only_with_a_cpu_per_thread() {
        assert_eq!(team_spin_us(2, 2), DEDICATED_SPIN_US);
        assert_eq!(team_spin_us(12, 2), OVERSUBSCRIBED_SPIN_US);
        assert_eq!(barrier_keys(0, BarrierWait::Pv), "spin_us=0 pvwait=1");
    }

    #[test]
    fn the_balloon_is_on_by_default_only_when_vcpus_outnumber_cpus() {
        assert!(VcpuBalloon::Auto.resolve(12, 2));
        assert!(!VcpuBalloon::Auto.resolve(2, 2));
        assert!(!VcpuBalloon::Auto.resolve(1, 8));
        assert!(VcpuBalloon::On.resolve(2, 2));
        assert!(!VcpuBalloon::Off.resolve(12, 2));
        assert_eq!(balloon_keys(false), "");
        assert_eq!(balloon_keys(true), " balloon=1 balloon_spin_us=2000");
        assert_eq!(barrier_keys(50, BarrierWait::Hlt), "spin_us=50");
        assert_eq!(BarrierWait::Auto.resolve(12, 2), BarrierWait::Pv);
        assert_eq!(BarrierWait::Auto.resolve(2, 2), BarrierWait::Hlt);
        assert_eq!(BarrierWait::Pv.resolve(2, 2), BarrierWait::Pv);
    }

    #[test]
    fn barrier_spins_long_only_with_a_cpu_per_thread() {
        assert_eq!(barrier_spin_us(2, 2), DEDICATED_SPIN_US);
        assert_eq!(barrier_spin_us(3, 2), SHARED_SPIN_US);
        assert_eq!(barrier_spin_us(1, 1), DEDICATED_SPIN_US);
    }
}
