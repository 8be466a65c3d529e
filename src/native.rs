//! The native twin: the guest's NPB code run as ordinary host threads, same source and
//! same thread count, so guest/native ratios measure the VM and nothing else.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Result, bail};
use npb::{Class, Kernel, Spec, ep};

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
    report::print(&verdict, args.json)?;
    Ok(verdict.exit_code())
}

/// Runs one benchmark on `threads` host threads, timed like the guest times it: from
/// the fork to the join, excluding nothing the guest includes.
pub fn run_one(spec: Spec, threads: u32) -> BenchResult {
    match spec.kernel {
        Kernel::Ep => run_ep(spec.class, threads),
    }
}

fn run_ep(class: Class, threads: u32) -> BenchResult {
    let total = ep::batches(ep::m(class));
    let start = Instant::now();
    let parts: Vec<ep::Partial> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let mut scratch = vec![0.0; ep::SCRATCH_LEN];
                    ep::run_batches(ep::batch_range(total, t, threads), &mut scratch)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("EP worker panicked"))
            .collect()
    });
    let time_s = start.elapsed().as_secs_f64();
    let sum = ep::combine(&parts);
    let extra = BTreeMap::from([
        ("sx".to_string(), format!("{:e}", sum.sx)),
        ("sy".to_string(), format!("{:e}", sum.sy)),
    ]);
    BenchResult {
        benchmark: Kernel::Ep.name().to_string(),
        class: class.letter().to_string(),
        threads,
        time_s,
        mops: ep::mops(class, time_s),
        verified: ep::verify(class, &sum),
        extra,
    }
}
