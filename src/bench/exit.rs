//! The round trip of one guest exit through kumo's vCPU loop, measured in-process for
//! `kumo bench record` (`benches/exits.rs` is criterion's form of the same guest).
//!
//! A tiny PVH guest does `out dx, al` to a port no device claims (KVM_EXIT_IO, kumo
//! finds nothing there and re-enters) in an unrolled loop, then writes debug-exit.
//! Two runs of n and 2n exits: the difference of their times is n exits, the fixed
//! cost (thread start, first entry, teardown) cancelled.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hv::testing::{PvhImage, asm};
use hv::{GuestExit, VmConfig};

/// Exits per loop iteration: the emulated `dec ecx; jnz` is paid once per UNROLL.
const UNROLL: u32 = 16;
/// `out dx, al` with dx = 0x510 (no device there).
const PIO_EXIT: u8 = 0xee;

fn guest(loops: u32) -> Vec<u8> {
    let body = vec![PIO_EXIT; UNROLL as usize];
    let mut code = vec![0x66, 0xba, 0x10, 0x05]; // mov dx, 0x510
    code.extend(asm::repeat(loops, &body));
    code.extend(asm::debug_exit(0));
    code.extend(asm::halt_forever());
    PvhImage::new(&code).build()
}

/// How long the VM of a guest of `loops * UNROLL` exits takes to run.
fn run(loops: u32, kvm_device: &Path) -> Result<Duration> {
    let vm = hv::builder::build_for_boot(VmConfig {
        vcpus: 1,
        memory_mib: 64,
        kernel: guest(loops).into(),
        cmdline: String::new(),
        modules: Vec::new(),
        kvm_device: kvm_device.to_path_buf(),
        huge_pages: false,
    })?;
    let start = Instant::now();
    let outcome = vm.run(Box::new(std::io::sink()), start)?;
    let took = start.elapsed();
    if outcome.exit != GuestExit::DebugExit(0) {
        bail!("the exit-loop guest ended with {:?}", outcome.exit);
    }
    Ok(took)
}

/// Runs of each size: the shortest counts (a run the host interrupted is longer, never
/// shorter, and one such run could make twice the exits look faster).
const RUNS: usize = 3;

/// Microseconds per exit round trip, from runs of `exits` and twice as many
/// (`exits` rounded up to a multiple of 16), the shortest of [`RUNS`] runs each,
/// alternated.
pub fn round_trip_us(exits: u32, kvm_device: &Path) -> Result<f64> {
    let loops = exits.div_ceil(UNROLL).max(1);
    let (mut once, mut twice) = (Duration::MAX, Duration::MAX);
    for _ in 0..RUNS {
        once = once.min(run(loops, kvm_device)?);
        twice = twice.min(run(loops * 2, kvm_device)?);
    }
    let Some(extra) = twice.checked_sub(once) else {
        bail!(
            "{} exits took less time than {} ({twice:?} < {once:?})",
            loops * 2 * UNROLL,
            loops * UNROLL
        );
    };
    Ok(extra.as_secs_f64() * 1e6 / f64::from(loops * UNROLL))
}
