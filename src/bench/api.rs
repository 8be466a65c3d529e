//! `kumo bench api`: what the HTTP control API costs. (1) `GET vm.info` round trips
//! on one kept-alive connection to a running VM: median and p90. (2) What 100
//! concurrent clients polling `vm.counters` cost the guest: the same benchmark in a
//! child `kumo --api-socket`, with and without the pollers, alternated (A B A B ...)
//! so the host's slow drifts hit both alike; the median of the pairs' ratios is the
//! figure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use clap::Args;
use serde::Serialize;

use kumo_vmm::api::client::{self, PollCount, Pollers};
use kumo_vmm::{guest, stats};

#[derive(Args, Debug)]
pub struct ApiArgs {
    /// Round trips of GET vm.info to time.
    #[arg(long, value_name = "N", default_value_t = 2000)]
    pub requests: usize,

    /// The guest's benchmark (kernel.class), run in every round.
    #[arg(long, value_name = "SPEC", default_value = "ep.W")]
    pub npb: String,

    /// vCPUs of the guest.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub vcpus: u32,

    /// Pairs of runs (without and with the pollers).
    #[arg(long, value_name = "R", default_value_t = 5)]
    pub runs: u32,

    /// Concurrent clients polling vm.counters.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub clients: usize,

    /// How often each client polls, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub poll_ms: u64,

    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}

/// `kumo bench api --json`: one object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApiBenchRow {
    /// GET vm.info round trips timed, on one kept-alive connection.
    pub requests: usize,
    pub rtt_median_us: f64,
    pub rtt_p90_us: f64,
    pub rtt_min_us: f64,
    pub rtt_max_us: f64,
    pub benchmark: String,
    pub class: String,
    pub vcpus: u32,
    /// Pairs of guest runs.
    pub runs: u32,
    pub clients: usize,
    pub poll_ms: u64,
    /// The benchmark's time in the guest (its own clock), without and with pollers.
    pub quiet_median_s: f64,
    pub polled_median_s: f64,
    /// Per pair, polled over quiet: the median, and the range.
    pub ratio_median: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// Answers (200) the pollers got over all polled runs, and per second of those runs.
    pub polls_answered: u64,
    pub polls_per_s: f64,
    /// Polls that got no 200 (before the socket was up, or after the VM ended).
    pub polls_failed: u64,
}

pub fn run_api(args: &ApiArgs) -> Result<u8> {
    ensure!(args.runs >= 1, "--runs must be at least 1");
    ensure!(args.requests >= 1, "--requests must be at least 1");
    ensure!(args.poll_ms >= 1, "--poll-ms must be at least 1");
    let specs = guest::parse_specs(&args.npb)?;
    let [spec] = specs[..] else {
        bail!("--npb: give one benchmark (not {})", specs.len());
    };
    kumo_vmm::run::check_guest_vcpus(args.vcpus, &args.kvm_device)?;
    let dir = std::env::temp_dir().join(format!("kumo-bench-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let socket = dir.join("api.sock");

    // (1) Round trips, to a VM running the benchmark (a long one: class A).
    let busy = format!("{}.A", spec.kernel.name());
    let mut vm = Child::start(&socket, &busy, args.vcpus, &args.kvm_device)?;
    vm.wait_for_socket()?;
    let rtts = client::round_trips(&socket, "/api/v1/vm.info", args.requests)?;
    vm.kill();
    let rtts_us: Vec<f64> = rtts.iter().map(|d| d.as_secs_f64() * 1e6).collect();

    // (2) The guest with and without pollers, alternated.
    let (mut quiet, mut polled) = (Vec::new(), Vec::new());
    let mut polls = PollCount::default();
    let mut polled_s = 0.0;
    for round in 1..=args.runs {
        quiet.push(run_guest(&socket, &args.npb, args)?);
        let started = Instant::now();
        let (time, count) = {
            let pollers = Pollers::start(
                &socket,
                "/api/v1/vm.counters",
                args.clients,
                Duration::from_millis(args.poll_ms),
            )?;
            let time = run_guest(&socket, &args.npb, args);
            (time, pollers.stop())
        };
        polled_s += started.elapsed().as_secs_f64();
        polled.push(time?);
        polls.answered += count.answered;
        polls.failed += count.failed;
        eprintln!(
            "kumo: {} pair {round}/{}: quiet {:.3} s, polled {:.3} s ({} answers)",
            args.npb,
            args.runs,
            quiet.last().unwrap_or(&f64::NAN),
            polled.last().unwrap_or(&f64::NAN),
            count.answered
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    if polls.answered == 0 {
        bail!("the pollers got no answer: the overhead measures nothing");
    }
    let ratios: Vec<f64> = polled.iter().zip(&quiet).map(|(p, q)| p / q).collect();
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    let row = ApiBenchRow {
        requests: args.requests,
        rtt_median_us: nan(stats::median(&rtts_us)),
        rtt_p90_us: nan(stats::quantile(&rtts_us, 0.9)),
        rtt_min_us: nan(stats::min(&rtts_us)),
        rtt_max_us: nan(stats::max(&rtts_us)),
        benchmark: spec.kernel.name().to_string(),
        class: spec.class.letter().to_string(),
        vcpus: args.vcpus,
        runs: args.runs,
        clients: args.clients,
        poll_ms: args.poll_ms,
        quiet_median_s: nan(stats::median(&quiet)),
        polled_median_s: nan(stats::median(&polled)),
        ratio_median: nan(stats::median(&ratios)),
        ratio_min: nan(stats::min(&ratios)),
        ratio_max: nan(stats::max(&ratios)),
        polls_answered: polls.answered,
        polls_per_s: polls.answered as f64 / polled_s,
        polls_failed: polls.failed,
    };
    if args.json {
        kumo_vmm::output::json_line(&row);
    } else {
        kumo_vmm::outln!(
            "GET vm.info round trip over {} requests: median {:.1} us, p90 {:.1} us (min {:.1}, max {:.1})",
            row.requests,
            row.rtt_median_us,
            row.rtt_p90_us,
            row.rtt_min_us,
            row.rtt_max_us
        );
        kumo_vmm::outln!(
            "{}.{} on {} vCPUs, {} pairs: quiet {:.3} s, with {} clients polling vm.counters every {} ms {:.3} s; ratio median {:.3} (range {:.3}..{:.3}); {} answers ({:.0}/s)",
            row.benchmark,
            row.class,
            row.vcpus,
            row.runs,
            row.quiet_median_s,
            row.clients,
            row.poll_ms,
            row.polled_median_s,
            row.ratio_median,
            row.ratio_min,
            row.ratio_max,
            row.polls_answered,
            row.polls_per_s
        );
    }
    Ok(0)
}

/// One guest run under `--api-socket`: the benchmark's time in the guest.
fn run_guest(socket: &Path, npb: &str, args: &ApiArgs) -> Result<f64> {
    let vm = Child::start(socket, npb, args.vcpus, &args.kvm_device)?;
    vm.result_time()
}

/// A child `kumo --npb SPEC --api-socket SOCKET --json`.
struct Child {
    child: std::process::Child,
    socket: PathBuf,
}

impl Child {
    fn start(socket: &Path, npb: &str, vcpus: u32, kvm_device: &Path) -> Result<Child> {
        let exe = std::env::current_exe().context("finding the kumo binary")?;
        let child = Command::new(exe)
            .args(["--npb", npb, "--vcpus", &vcpus.to_string(), "--json"])
            .arg("--api-socket")
            .arg(socket)
            .arg("--kvm-device")
            .arg(kvm_device)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting a child kumo")?;
        Ok(Child {
            child,
            socket: socket.to_path_buf(),
        })
    }

    fn wait_for_socket(&mut self) -> Result<()> {
        let start = Instant::now();
        while !self.socket.exists() {
            if let Some(status) = self.child.try_wait()? {
                bail!("the child kumo ended ({status}) before its API socket appeared");
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the child kumo's API socket did not appear within 60 s");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for it to end; its benchmark must have verified.
    fn result_time(self) -> Result<f64> {
        let out = self
            .child
            .wait_with_output()
            .context("waiting for the child kumo")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "the child kumo failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let row: serde_json::Value = stdout
            .lines()
            .next()
            .and_then(|l| serde_json::from_str(l).ok())
            .with_context(|| format!("the child kumo printed no result: {stdout:?}"))?;
        if row["verified"] != true {
            bail!("the guest's benchmark did not verify: {row}");
        }
        row["time_s"]
            .as_f64()
            .with_context(|| format!("no time_s in {row}"))
    }
}
