//! `kumo bench migrate`: live migration on loopback inside one kumo, run after run,
//! with the host's view (total time, downtime and its parts, rounds, bytes) beside
//! the guest's (`probe=gap`: the longest time the guest saw pass between two TSC
//! reads, i.e. the downtime as it felt it).
//!
//! Source and destination are the same code paths as `kumo ctl ... migrate` and
//! `kumo --incoming` (`crate::migrate::send_vm` / `receive_vm`), over a TCP
//! connection to 127.0.0.1 with a fresh random token per run.

use std::io::Read;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hv::Vm;
use serde_json::json;

use crate::bench::overhead::median;
use crate::cli::MigrateBenchArgs;
use crate::guest;
use crate::migrate::{self, AppState, GUEST_NAME};
use crate::run;

/// One run's figures.
struct Sample {
    report: hv::migration::live::Report,
    /// The guest's longest TSC gap, in ms.
    guest_gap_ms: f64,
}

fn token() -> Result<Vec<u8>> {
    let mut t = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut t)?;
    Ok(t.to_vec())
}

fn one_run(args: &MigrateBenchArgs, epoch: Instant) -> Result<Sample> {
    let probe_ms = args.after_ms * 2 + 2000;
    let memory_mib = args.memory;
    let cmdline = format!("npb= probe=gap:{probe_ms}");
    let config = run::embedded_config(args.vcpus, memory_mib, cmdline, &args.kvm_device);
    let vm = Vm::new(config)?;
    let hub = vm.migration_hub();
    let console = Arc::new(Mutex::new(Vec::new()));
    let app = AppState {
        guest: GUEST_NAME.into(),
        npb: String::new(),
        vcpus: args.vcpus,
        console: Vec::new(),
        sched: None,
        irq: None,
    };
    let app_json = || {
        let console = console.lock().unwrap_or_else(|e| e.into_inner()).clone();
        serde_json::to_string(&AppState {
            console,
            ..app.clone()
        })
        .unwrap_or_default()
    };
    let listener = TcpListener::bind("127.0.0.1:0").context("listening on loopback")?;
    let address = listener.local_addr()?.to_string();
    let token = token()?;
    let dst_token = token.clone();
    let kvm_device = args.kvm_device.clone();
    let destination = std::thread::spawn(move || -> Result<run::GuestRun> {
        let (vm, meta) = migrate::receive_vm(&listener, Some(&dst_token), &kvm_device)?;
        let app = AppState::parse(&meta.app)?;
        run::run_collecting_recorded(vm, epoch, None, &app.console)
    });
    let record = console.clone();
    let source =
        std::thread::spawn(move || run::run_collecting_recorded(vm, epoch, Some(record), &[]));
    std::thread::sleep(Duration::from_millis(args.after_ms));
    let sent = migrate::send_vm(
        &hub,
        app_json,
        &address,
        Some(&token),
        args.max_downtime_ms.map(Duration::from_millis),
    );
    let source_run = source
        .join()
        .map_err(|_| anyhow::anyhow!("the source's thread panicked"))??;
    let report = match sent {
        Ok(report) => report,
        Err(e) => {
            // Unblock a destination still waiting for a connection.
            let _ = std::net::TcpStream::connect(&address);
            let _ = destination.join();
            return Err(e);
        }
    };
    if source_run.outcome.exit != hv::GuestExit::HandedOff {
        bail!("the source did not hand the VM off");
    }
    let dst_run = destination
        .join()
        .map_err(|_| anyhow::anyhow!("the destination's thread panicked"))??;
    let fields = dst_run.measurement("gapprobe")?;
    let gap_us: f64 = fields
        .get("max_gap_us")
        .and_then(|v| v.parse().ok())
        .context("the guest's gapprobe line has no max_gap_us")?;
    Ok(Sample {
        report,
        guest_gap_ms: gap_us / 1000.0,
    })
}

pub fn run_bench(args: &MigrateBenchArgs, epoch: Instant) -> Result<u8> {
    run::check_guest_vcpus(args.vcpus, &args.kvm_device)?;
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let needed = guest::choose_memory_mib(None, &[], args.vcpus)?;
    if args.memory < needed {
        bail!("--memory {} is below the guest's {needed} MiB", args.memory);
    }
    let mut samples = Vec::new();
    for i in 0..args.runs {
        let s = one_run(args, epoch).with_context(|| format!("run {}", i + 1))?;
        if args.json {
            println!(
                "{}",
                json!({
                    "run": i + 1,
                    "memory_mib": args.memory,
                    "vcpus": args.vcpus,
                    "total_ms": s.report.total_ms,
                    "downtime_ms": s.report.downtime_ms,
                    "pause_ms": s.report.pause_ms,
                    "sent_ms": s.report.sent_ms,
                    "guest_gap_ms": s.guest_gap_ms,
                    "rounds": s.report.rounds,
                    "final_pages": s.report.final_pages,
                    "total_bytes": s.report.total_bytes,
                })
            );
        }
        samples.push(s);
    }
    let pick = |f: &dyn Fn(&Sample) -> f64| -> (f64, f64, f64) {
        let v: Vec<f64> = samples.iter().map(f).collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (median(&v), lo, hi)
    };
    let rows: [(&str, &str, (f64, f64, f64)); 5] = [
        ("total", "total", pick(&|s| s.report.total_ms)),
        (
            "downtime (host)",
            "downtime_host",
            pick(&|s| s.report.downtime_ms),
        ),
        ("  pausing the vCPUs", "pause", pick(&|s| s.report.pause_ms)),
        (
            "  until the last byte sent",
            "sent",
            pick(&|s| s.report.sent_ms),
        ),
        (
            "downtime (guest)",
            "downtime_guest",
            pick(&|s| s.guest_gap_ms),
        ),
    ];
    if args.json {
        let summary: serde_json::Map<String, serde_json::Value> = rows
            .iter()
            .map(|(_, key, (m, lo, hi))| {
                (
                    key.to_string(),
                    json!({"median_ms": m, "min_ms": lo, "max_ms": hi}),
                )
            })
            .collect();
        println!("{}", json!({"runs": args.runs, "summary": summary}));
    } else {
        println!(
            "migration on loopback, {} vCPUs, {} MiB, after {} ms, {} runs",
            args.vcpus, args.memory, args.after_ms, args.runs
        );
        println!("{:<28} {:>10} {:>10} {:>10}", "", "median ms", "min", "max");
        for (name, _, (m, lo, hi)) in rows {
            println!("{name:<28} {m:>10.2} {lo:>10.2} {hi:>10.2}");
        }
    }
    Ok(crate::report::EXIT_OK)
}
