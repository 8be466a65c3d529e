//! `kumo bench process`: the whole-process cost of booting a trivial kernel, from
//! spawning the hypervisor to its exit (wall time, and peak RSS from `wait4`), for
//! `kumo --kernel` and, when `qemu-system-x86_64` is installed, QEMU's microvm on the
//! same ELF. Runs alternate (kumo, QEMU, kumo, ...) so a drifting host hits both alike;
//! the ratio is QEMU's time over kumo's per pair, its median reported.
//!
//! The default kernel is built here (`hv::testing`): it prints one line on COM1 and
//! writes 0 to the debug-exit port, the "trivial PVH kernel".

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use kumo_vmm::stats;
use serde::Serialize;

use crate::bench::overhead::{median, summarize};

/// One finished run: wall time and peak resident set.
#[derive(Debug, Clone, Copy)]
struct Sample {
    wall: Duration,
    max_rss_kib: u64,
}

/// Spawns `command` and waits for it with `wait4`; fails unless it exits with `status`.
fn measure(command: &mut Command, status: i32) -> Result<Sample> {
    let start = Instant::now();
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {:?}", command.get_program()))?;
    let mut raw_status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child with valid pointers to locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut raw_status, 0, &mut usage) };
    let wall = start.elapsed();
    if pid < 0 {
        bail!("wait4: {}", std::io::Error::last_os_error());
    }
    let code = libc::WIFEXITED(raw_status).then(|| libc::WEXITSTATUS(raw_status));
    if code != Some(status) {
        bail!(
            "{:?} ended with {code:?}, expected exit status {status}",
            command.get_program()
        );
    }
    Ok(Sample {
        wall,
        max_rss_kib: usage.ru_maxrss as u64,
    })
}

/// QEMU's microvm booting `kernel` as a PVH ELF, its console to stdout, the
/// debug-exit port at 0xF4 (QEMU exits with `value << 1 | 1`).
fn qemu_microvm(kernel: &Path, memory_mib: u64) -> Command {
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(["-M", "microvm", "-accel", "kvm"])
        .args(["-cpu", "host,-arch-capabilities", "-smp", "1"])
        .args(["-m", &memory_mib.to_string()])
        .args(["-nographic", "-nodefaults", "-no-user-config", "-no-reboot"])
        .args(["-serial", "stdio"])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(kernel);
    command
}

fn kumo_kernel(kernel: &Path, memory_mib: u64) -> Result<Command> {
    let mut command = Command::new(std::env::current_exe().context("where is kumo?")?);
    command
        .arg("--kernel")
        .arg(kernel)
        .args(["--vcpus", "1", "--memory", &memory_mib.to_string()]);
    Ok(command)
}

/// The trivial kernel: a line on COM1, then debug-exit 0.
fn trivial_kernel() -> Vec<u8> {
    use hv::testing::{PvhImage, asm};
    PvhImage::new(
        &[
            asm::com1_print(b"trivial PVH kernel\n"),
            asm::debug_exit(0),
            asm::halt_forever(),
        ]
        .concat(),
    )
    .build()
}

/// Wall milliseconds of one whole `kumo --kernel` process on the trivial kernel at
/// `kernel` (for `bench record`).
pub fn kumo_ms(kernel: &Path, memory_mib: u64) -> Result<f64> {
    Ok(measure(&mut kumo_kernel(kernel, memory_mib)?, 0)?
        .wall
        .as_secs_f64()
        * 1e3)
}

/// The same for QEMU's microvm.
pub fn qemu_ms(kernel: &Path, memory_mib: u64) -> Result<f64> {
    Ok(measure(&mut qemu_microvm(kernel, memory_mib), 1)?
        .wall
        .as_secs_f64()
        * 1e3)
}

/// Writes the trivial kernel to a fresh file in the temporary directory; the caller
/// removes it.
pub fn write_trivial_kernel() -> Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("kumo-trivial-{}.elf", std::process::id()));
    std::fs::write(&path, trivial_kernel())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

pub fn qemu_installed() -> bool {
    Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn run_process(args: &ProcessBenchArgs) -> Result<u8> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let scratch: PathBuf;
    let (kernel, status) = match &args.kernel {
        Some(path) => (path.clone(), args.status),
        None => {
            scratch = write_trivial_kernel()?;
            (scratch.clone(), 0)
        }
    };
    let result = run_pairs(args, &kernel, status);
    if args.kernel.is_none() {
        let _ = std::fs::remove_file(&kernel);
    }
    result
}

/// A VMM's line of `kumo bench process --json` (ms: process spawn to exit).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VmmLine {
    /// `"kumo"` or `"qemu-microvm"`.
    pub vmm: &'static str,
    pub runs: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// The largest peak RSS of its runs.
    pub peak_rss_kib: u64,
}

/// The last line of `kumo bench process --json`: QEMU's time over kumo's, per
/// interleaved pair (`null` without QEMU).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComparisonLine {
    pub kernel: String,
    pub memory_mib: u64,
    pub qemu: bool,
    pub qemu_over_kumo_median: Option<f64>,
    pub qemu_over_kumo_min: Option<f64>,
    pub qemu_over_kumo_max: Option<f64>,
}

fn run_pairs(args: &ProcessBenchArgs, kernel: &Path, status: u8) -> Result<u8> {
    let qemu = !args.no_qemu && qemu_installed();
    let mut kumo_runs = Vec::new();
    let mut qemu_runs = Vec::new();
    for _ in 0..args.runs {
        kumo_runs.push(measure(
            &mut kumo_kernel(kernel, args.memory)?,
            i32::from(status),
        )?);
        if qemu {
            qemu_runs.push(measure(
                &mut qemu_microvm(kernel, args.memory),
                i32::from(status) << 1 | 1,
            )?);
        }
    }
    let ms =
        |runs: &[Sample]| -> Vec<f64> { runs.iter().map(|s| s.wall.as_secs_f64() * 1e3).collect() };
    let rss = |runs: &[Sample]| runs.iter().map(|s| s.max_rss_kib).max().unwrap_or(0);
    let (kumo_ms, qemu_ms) = (ms(&kumo_runs), ms(&qemu_runs));
    let pairs = summarize(&kumo_ms, &qemu_ms);
    let range = |v: &[f64]| {
        (
            stats::min(v).unwrap_or(f64::NAN),
            stats::max(v).unwrap_or(f64::NAN),
        )
    };
    let rows: Vec<(&str, &[f64], u64)> = if qemu {
        vec![
            ("kumo", &kumo_ms, rss(&kumo_runs)),
            ("qemu-microvm", &qemu_ms, rss(&qemu_runs)),
        ]
    } else {
        vec![("kumo", &kumo_ms, rss(&kumo_runs))]
    };
    if args.json {
        for &(name, times, peak) in &rows {
            let (lo, hi) = range(times);
            kumo_vmm::output::json_line(&VmmLine {
                vmm: name,
                runs: times.len(),
                median_ms: median(times),
                min_ms: lo,
                max_ms: hi,
                peak_rss_kib: peak,
            });
        }
        kumo_vmm::output::json_line(&ComparisonLine {
            kernel: kernel.display().to_string(),
            memory_mib: args.memory,
            qemu,
            qemu_over_kumo_median: pairs.as_ref().map(|p| p.ratio_median),
            qemu_over_kumo_min: pairs.as_ref().map(|p| p.ratio_min),
            qemu_over_kumo_max: pairs.as_ref().map(|p| p.ratio_max),
        });
    } else {
        kumo_vmm::outln!(
            "{:<14} {:>5} {:>11} {:>9} {:>9} {:>13}",
            "vmm",
            "runs",
            "median ms",
            "min ms",
            "max ms",
            "peak RSS KiB"
        );
        for (name, times, peak) in &rows {
            let (lo, hi) = range(times);
            kumo_vmm::outln!(
                "{name:<14} {:>5} {:>11.2} {:>9.2} {:>9.2} {peak:>13}",
                times.len(),
                median(times),
                lo,
                hi
            );
        }
        match &pairs {
            Some(p) => kumo_vmm::outln!(
                "QEMU / kumo, per interleaved pair: median {:.2}x (range {:.2}-{:.2}x)",
                p.ratio_median,
                p.ratio_min,
                p.ratio_max
            ),
            None => kumo_vmm::outln!("QEMU not run (not installed, or --no-qemu)"),
        }
    }
    Ok(kumo_vmm::report::EXIT_OK)
}

#[derive(Args, Debug)]
pub struct ProcessBenchArgs {
    /// The PVH ELF to boot [default: a trivial kernel that prints a line and exits].
    #[arg(long, value_name = "ELF")]
    pub kernel: Option<PathBuf>,

    /// The exit status --kernel's kernel ends with (its debug-exit value).
    #[arg(long, value_name = "N", default_value_t = 0, requires = "kernel")]
    pub status: u8,

    /// Guest memory of both VMMs, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    pub memory: u64,

    /// Runs of each VMM (interleaved).
    #[arg(long, value_name = "R", default_value_t = 20)]
    pub runs: u32,

    /// Leave QEMU out even if it is installed.
    #[arg(long)]
    pub no_qemu: bool,

    /// Print one JSON object per VMM and one for the comparison.
    #[arg(long)]
    pub json: bool,
}
