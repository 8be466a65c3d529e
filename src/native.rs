//! The native twin: the guest's NPB code run as ordinary host threads, same source and
//! same thread count, so guest/native ratios measure the VM and nothing else.

use anyhow::{Result, bail};
use npb::Spec;

use crate::cli::NativeArgs;
use crate::guest;
use crate::protocol::BenchResult;
use crate::report;

pub fn run_native(args: &NativeArgs) -> Result<u8> {
    let specs = match &args.npb {
        Some(list) => guest::parse_specs(list)?,
        None => guest::default_specs(),
    };
    if args.threads == 0 {
        bail!("--threads must be at least 1");
    }
    let results = specs
        .iter()
        .map(|&spec| run_one(spec, args.threads))
        .collect();
    let verdict = report::judge_native(&specs, args.threads, results);
    report::print(&verdict, args.json);
    Ok(verdict.exit_code())
}

/// Runs one benchmark on `threads` host threads: the guest's kernel code, timed over
/// the same region, printed the same way.
pub fn run_one(spec: Spec, threads: u32) -> BenchResult {
    let spin = guest::barrier_spin_us(threads, guest::host_cpus());
    let outcome = npb::host::run_with_spin(
        spec,
        threads as usize,
        std::time::Duration::from_micros(spin),
    );
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
