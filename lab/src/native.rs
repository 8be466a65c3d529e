//! The native twin: the guest's NPB code run as ordinary host threads, same source and
//! same thread count, so guest/native ratios measure the VM and nothing else.

use anyhow::{Result, bail};
use npb::Spec;

use clap::Args;
use kumo_vmm::guest;
use kumo_vmm::protocol::BenchResult;
use kumo_vmm::report;

pub fn run_native(args: &NativeArgs) -> Result<u8> {
    let specs = match &args.npb {
        Some(list) => guest::parse_specs(list)?,
        None => guest::default_specs(),
    };
    if let Some(ranks) = args.mpi_ranks {
        return run_mpi_native(args, ranks);
    }
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let results = specs
        .iter()
        .map(|&spec| run_one_paged(spec, args.threads, args.huge_pages))
        .collect::<Result<_>>()?;
    let verdict = report::judge_native(&specs, args.threads, results);
    report::print(&verdict, args.json);
    Ok(verdict.exit_code())
}

/// Runs one benchmark on `threads` host threads: the guest's kernel code, timed over
/// the same region, printed the same way.
pub fn run_one(spec: Spec, threads: u32) -> BenchResult {
    run_one_with_spin(
        spec,
        threads,
        guest::team_spin_us(threads, guest::host_cpus()),
    )
}

/// As [`run_one`], with the team's arena on the host's 2 MiB huge pages if
/// `huge_pages` (the native side of a guest whose RAM is on them).
pub fn run_one_paged(spec: Spec, threads: u32, huge_pages: bool) -> Result<BenchResult> {
    if !huge_pages {
        return Ok(run_one(spec, threads));
    }
    let bytes = npb::workload_heap_bytes(spec, threads) as usize;
    let mut arena = HugeArena::new(bytes)?;
    let spin = guest::team_spin_us(threads, guest::host_cpus());
    let outcome = npb::host::run_with_spin_in(
        spec,
        threads as usize,
        std::time::Duration::from_micros(spin),
        arena.bytes(),
    );
    Ok(result_of(spec, threads, outcome))
}

/// Zeroed anonymous memory on the host's 2 MiB huge pages (`MAP_HUGETLB`), unmapped
/// when dropped.
struct HugeArena {
    ptr: *mut u8,
    len: usize,
}

impl HugeArena {
    fn new(bytes: usize) -> Result<HugeArena> {
        const HUGE_PAGE: usize = 2 << 20;
        let len = bytes.max(1).next_multiple_of(HUGE_PAGE);
        // SAFETY: a new private anonymous mapping; nothing else is touched. A private
        // hugetlb mapping reserves its pages here, so a short pool fails now.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "cannot map {} MiB of 2 MiB huge pages for the native arena ({}): reserve more (echo N > /proc/sys/vm/nr_hugepages)",
                len >> 20,
                std::io::Error::last_os_error()
            );
        }
        Ok(HugeArena {
            ptr: ptr.cast(),
            len,
        })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes mapped read-write in `new`, zeroed by the kernel, and
        // borrowed mutably from `self`, which owns the mapping.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HugeArena {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; no borrow of it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// As [`run_one`], with a barrier spin of `spin_us` microseconds.
pub fn run_one_with_spin(spec: Spec, threads: u32, spin_us: u64) -> BenchResult {
    let outcome = npb::host::run_with_spin(
        spec,
        threads as usize,
        std::time::Duration::from_micros(spin_us),
    );
    result_of(spec, threads, outcome)
}

/// What a native run of `spec` on `threads` threads reports.
fn result_of(spec: Spec, threads: u32, outcome: npb::Outcome) -> BenchResult {
    BenchResult {
        benchmark: spec.kernel.name().to_string(),
        class: spec.class.letter().to_string(),
        threads,
        time_s: outcome.seconds,
        mops: outcome.mops,
        verified: outcome.verified,
        extra: outcome
            .values
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect(),
    }
}

/// The MPI forms on `ranks` host threads (one rank each, channels between them): the
/// same kernel code as `kumo mpi --npb`, so guest/native ratios of MPI jobs measure the
/// VMs, their NICs, domain 0's switch and the guests' MPI, and nothing else.
fn run_mpi_native(args: &NativeArgs, ranks: u32) -> Result<u8> {
    let list = args.npb.as_deref().unwrap_or("ep.S,is.S,cg.S,ft.S");
    let specs = kumo_vmm::spec::job::parse_npb(list, ranks)?;
    let results = specs
        .iter()
        .map(|&spec| run_one_mpi(spec, ranks))
        .collect::<Result<Vec<_>>>()?;
    let verdict = report::judge_native(&specs, ranks, results);
    report::print(&verdict, args.json);
    if !args.json {
        kumo_vmm::outln!("MPI forms: {ranks} ranks, one host thread each, channels between them");
    }
    Ok(verdict.exit_code())
}

/// One MPI benchmark on `ranks` host threads (reported as that many threads); rank 0's
/// outcome (every rank returns the same).
pub fn run_one_mpi(spec: Spec, ranks: u32) -> Result<BenchResult> {
    let bytes = npb::mpi::heap_bytes(spec, ranks as usize);
    let outcomes = npb::mpi::host::run_ranks(ranks as usize, bytes, |comm, arena| {
        npb::mpi::run(spec, comm, arena)
    });
    let outcome = match outcomes.into_iter().next() {
        Some(Ok(outcome)) => outcome,
        Some(Err(e)) => bail!("{spec} on {ranks} host ranks failed: {e}"),
        None => bail!("{spec}: no rank ran"),
    };
    Ok(BenchResult {
        benchmark: spec.kernel.name().to_string(),
        class: spec.class.letter().to_string(),
        threads: ranks,
        time_s: outcome.seconds,
        mops: outcome.mops,
        verified: outcome.verified,
        extra: outcome
            .values
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect(),
    })
}

#[derive(Args, Debug)]
pub struct NativeArgs {
    /// Benchmarks, comma-separated kernel.class items [default: every kernel, class S].
    #[arg(long, value_name = "LIST")]
    pub npb: Option<String>,

    /// Worker threads [default: 2, like the VM's default vCPUs].
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub threads: u32,

    /// Run the NPB-MPI forms (`kumo mpi --npb`) on N ranks, one host thread each,
    /// messages over in-process channels: the native twin of an MPI job.
    #[arg(long, value_name = "N", conflicts_with = "threads")]
    pub mpi_ranks: Option<u32>,

    /// Put the team's arena on the host's 2 MiB huge pages (`MAP_HUGETLB`, from the
    /// pool of /proc/sys/vm/nr_hugepages): the native side of `kumo --huge-pages`.
    #[arg(long, conflicts_with = "mpi_ranks")]
    pub huge_pages: bool,

    /// Print one JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}
