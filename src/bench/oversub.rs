//! `kumo bench oversub`: where the time goes when a VM has more vCPUs than the host has
//! cores. For every benchmark, vCPU count and barrier spin it runs the native twin (as
//! many host threads) and the guest with each barrier wait mechanism, one after another, round
//! after round (so drifts of a shared host hit all settings alike), and reports the
//! medians: the time, its ratio to the native run of the same round, and per barrier
//! what the guest's waits cost (`@kumo barrierstats`, summed over its CPUs) beside what
//! the host saw (how long vCPU threads waited for a host CPU, the wait page's blocks).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail, ensure};
use clap::Args;
use clap::ValueEnum;
use npb::Spec;
use serde::Serialize;

use crate::bench::overhead::median;
use kumo_lab::native;
use kumo_vmm::guest::{self, BarrierWait, VcpuBalloon};
use kumo_vmm::run;

/// One guest run's figures.
#[derive(Clone, Debug, Default)]
struct GuestSample {
    time_s: f64,
    barriers: f64,
    sleeps: f64,
    wakes: f64,
    spin_us: f64,
    sleep_us: f64,
    spread_us: f64,
    resume_us: f64,
    resumes: f64,
    /// Host: all vCPU threads' time runnable without a CPU, and their CPU time.
    run_delay_us: f64,
    cpu_us: f64,
    pv_blocks: f64,
}

/// How long waiters spin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spin {
    /// [`guest::team_spin_us`]: kumo's for one VM or the native twin alone.
    Team,
    /// [`guest::barrier_spin_us`]: nodes', and every run's before issue 16.
    Shared,
    Micros(u64),
}

impl Spin {
    fn parse(text: &str) -> Option<Spin> {
        match text {
            "team" => Some(Spin::Team),
            "shared" => Some(Spin::Shared),
            _ => text
                .parse()
                .ok()
                .filter(|&us| us <= 1_000_000)
                .map(Spin::Micros),
        }
    }

    fn micros(self, threads: u32) -> u64 {
        let cpus = guest::host_cpus();
        match self {
            Spin::Team => guest::team_spin_us(threads, cpus),
            Spin::Shared => guest::barrier_spin_us(threads, cpus),
            Spin::Micros(us) => us,
        }
    }
}

/// One setting (benchmark, vCPUs, mechanism, spin) over all rounds.
struct Setting {
    spec: Spec,
    vcpus: u32,
    /// `None`: the native twin.
    wait: Option<BarrierWait>,
    spin: Spin,
    /// Whether the guest balloons (resolved for `vcpus` on this host).
    balloon: bool,
    samples: Vec<GuestSample>,
}

impl Setting {
    fn name(&self) -> String {
        let wait = self.wait.map_or("native", BarrierWait::name);
        let balloon = if self.balloon { "+bal" } else { "" };
        format!("{wait}/{}us{balloon}", self.spin.micros(self.vcpus))
    }
}

pub fn run(args: &OversubArgs) -> Result<u8> {
    let specs = guest::parse_specs(&args.npb)?;
    let counts = parse_list(&args.vcpus, "--vcpus", |t| {
        t.parse::<u32>().ok().filter(|&n| n >= 1)
    })?;
    let waits = parse_list(&args.wait, "--wait", |t| {
        BarrierWait::from_str(t, false).ok()
    })?;
    let spins = parse_list(&args.spin, "--spin", Spin::parse)?;
    let balloons = parse_list(&args.balloon, "--balloon", |t| {
        VcpuBalloon::from_str(t, false).ok()
    })?;
    ensure!(args.runs >= 1, "--runs must be at least 1");
    for &vcpus in &counts {
        run::check_guest_vcpus(vcpus, &args.kvm_device)?;
    }
    let mut settings = Vec::new();
    for &spec in &specs {
        for &vcpus in &counts {
            for &spin in &spins {
                let native = (None, false);
                // Each resolved balloon setting once (auto is off or on here).
                let mut ballooned: Vec<bool> = balloons
                    .iter()
                    .map(|b| b.resolve(vcpus, guest::host_cpus()))
                    .collect();
                ballooned.dedup();
                let guests = waits
                    .iter()
                    .flat_map(|&w| ballooned.iter().map(move |&b| (Some(w), b)));
                for (wait, balloon) in std::iter::once(native).chain(guests) {
                    settings.push(Setting {
                        spec,
                        vcpus,
                        wait,
                        spin,
                        balloon,
                        samples: Vec::new(),
                    });
                }
            }
        }
    }
    for round in 1..=args.runs {
        for setting in &mut settings {
            let spin = setting.spin.micros(setting.vcpus);
            let sample = match setting.wait {
                None => native_sample(setting.spec, setting.vcpus, spin)?,
                Some(wait) => {
                    let wait = wait.resolve(setting.vcpus, guest::host_cpus());
                    let keys = (wait, spin, setting.balloon);
                    guest_sample(setting.spec, setting.vcpus, keys, args)?
                }
            };
            eprintln!(
                "kumo: round {round}/{}: {} on {} {}: {:.3} s",
                args.runs,
                setting.spec,
                setting.vcpus,
                setting.name(),
                sample.time_s
            );
            setting.samples.push(sample);
        }
    }
    print(&settings, args);
    Ok(0)
}

fn parse_list<T>(text: &str, what: &str, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<T>> {
    let items = text
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| parse(t).ok_or_else(|| anyhow::anyhow!("{what}: {t:?} is not a valid item")))
        .collect::<Result<Vec<_>>>()?;
    ensure!(!items.is_empty(), "{what}: the list is empty");
    Ok(items)
}

fn native_sample(spec: Spec, threads: u32, spin_us: u64) -> Result<GuestSample> {
    let result = native::run_one_with_spin(spec, threads, spin_us);
    if !result.verified {
        bail!("{spec} did not verify natively on {threads} threads");
    }
    Ok(GuestSample {
        time_s: result.time_s,
        ..GuestSample::default()
    })
}

/// One guest run of `spec` with `(wait, spin_us, balloon)`.
fn guest_sample(
    spec: Spec,
    vcpus: u32,
    (wait, spin_us, balloon): (BarrierWait, u64, bool),
    args: &OversubArgs,
) -> Result<GuestSample> {
    let memory_mib = guest::choose_memory_mib(None, &[spec], vcpus)?;
    let cmdline = format!(
        "npb={spec} {}{}",
        guest::barrier_keys(spin_us, wait),
        guest::balloon_keys(balloon)
    );
    let config = run::embedded_config(vcpus, memory_mib, cmdline, &args.kvm_device);
    let (run, ()) = run::boot_embedded(config, Instant::now(), |vm| guest::tell_host_cpus(vm))?;
    let verdict = run.judge(&[spec], vcpus);
    if !verdict.problems.is_empty() {
        bail!("{spec} on {vcpus} vCPUs: {}", verdict.problems.join("; "));
    }
    let Some(time_s) = verdict
        .rows
        .first()
        .and_then(|row| row.result.as_ref())
        .map(|r| r.time_s)
    else {
        bail!("{spec} on {vcpus} vCPUs gave no result");
    };
    let fields = run.measurement("barrierstats")?;
    let field = |key: &str| -> Result<f64> {
        fields
            .get(key)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| anyhow::anyhow!("barrierstats without a number for {key}"))
    };
    let outcome = &run.outcome;
    let micros = |d: &[std::time::Duration]| d.iter().map(|d| d.as_secs_f64() * 1e6).sum();
    Ok(GuestSample {
        time_s,
        barriers: field("barriers")?,
        sleeps: field("sleeps")?,
        wakes: field("wakes")?,
        spin_us: field("spin_us")?,
        sleep_us: field("sleep_us")?,
        spread_us: field("spread_us")?,
        resume_us: field("resume_us")?,
        resumes: field("resumes")?,
        run_delay_us: micros(&outcome.vcpu_run_delay),
        cpu_us: micros(&outcome.vcpu_cpu_time),
        pv_blocks: outcome.pvwait.blocks as f64,
    })
}

/// A row of `kumo bench oversub --json`: one setting's rounds and their medians.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OversubRow {
    pub benchmark: &'static str,
    pub class: String,
    pub vcpus: u32,
    /// `"native"`, `"pv"`, `"hlt"` or `"auto"`.
    pub wait: &'static str,
    pub spin_us: u64,
    pub balloon: bool,
    pub runs: usize,
    pub times_s: Vec<f64>,
    pub median_s: f64,
    /// `null` on the native row.
    pub ratio_to_native_median: Option<f64>,
    /// Barriers per run (a median, so a float); 0.0 on the native row.
    pub barriers: f64,
    pub per_barrier: PerBarrier,
    pub resume_us_per_waiter: f64,
}

/// Per-barrier medians of a setting (counts, and µs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PerBarrier {
    pub sleeps: f64,
    pub wakes: f64,
    pub spin_us: f64,
    pub sleep_us: f64,
    pub arrival_spread_us: f64,
    pub vcpu_cpu_wait_us: f64,
    pub vcpu_cpu_us: f64,
    pub pv_blocks: f64,
}

/// A setting's medians over its rounds: the time, its range, the ratio to native and
/// every per-barrier figure. Not `stats::Summary`: that summarises one series, this
/// takes the median of a dozen series of guest samples, some per barrier or per
/// resumed waiter first.
struct Summary {
    time_s: f64,
    min_s: f64,
    max_s: f64,
    /// Median over rounds of this time / the native time of the same round.
    ratio: Option<f64>,
    /// Per barrier (`barriers` itself a count, `resume_us` per resumed waiter).
    per: GuestSample,
}

fn summarize(setting: &Setting, native: Option<&Setting>) -> Summary {
    let samples = &setting.samples;
    let of = |f: &dyn Fn(&GuestSample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
    let per_barrier = |f: &dyn Fn(&GuestSample) -> f64| {
        of(&|s: &GuestSample| {
            if s.barriers > 0.0 {
                f(s) / s.barriers
            } else {
                0.0
            }
        })
    };
    let ratio = native.filter(|_| setting.wait.is_some()).map(|n| {
        let ratios: Vec<f64> = samples
            .iter()
            .zip(&n.samples)
            .map(|(g, n)| g.time_s / n.time_s)
            .collect();
        median(&ratios)
    });
    let times: Vec<f64> = samples.iter().map(|s| s.time_s).collect();
    Summary {
        time_s: median(&times),
        min_s: times.iter().copied().fold(f64::INFINITY, f64::min),
        max_s: times.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ratio,
        per: GuestSample {
            time_s: median(&times),
            barriers: of(&|s| s.barriers),
            sleeps: per_barrier(&|s| s.sleeps),
            wakes: per_barrier(&|s| s.wakes),
            spin_us: per_barrier(&|s| s.spin_us),
            sleep_us: per_barrier(&|s| s.sleep_us),
            spread_us: per_barrier(&|s| s.spread_us),
            resume_us: of(&|s| {
                if s.resumes > 0.0 {
                    s.resume_us / s.resumes
                } else {
                    0.0
                }
            }),
            resumes: of(&|s| s.resumes),
            run_delay_us: per_barrier(&|s| s.run_delay_us),
            cpu_us: per_barrier(&|s| s.cpu_us),
            pv_blocks: per_barrier(&|s| s.pv_blocks),
        },
    }
}

fn print(settings: &[Setting], args: &OversubArgs) {
    let native_of = |s: &Setting| {
        settings.iter().find(|n| {
            n.wait.is_none() && n.spec == s.spec && n.vcpus == s.vcpus && n.spin == s.spin
        })
    };
    if !args.json {
        kumo_vmm::outln!(
            "{:<6} {:>5} {:<14} {:>8} {:>15} {:>7} | per barrier: {:>7} {:>7} {:>8} {:>7} {:>8} {:>8} {:>9}",
            "bench",
            "vCPUs",
            "wait/spin",
            "time(s)",
            "range",
            "/native",
            "sleeps",
            "spin_us",
            "spread_us",
            "resume",
            "cpuwait",
            "vcpu_cpu",
            "barriers"
        );
    }
    for setting in settings {
        let s = summarize(setting, native_of(setting));
        if args.json {
            kumo_vmm::output::json_line(&OversubRow {
                benchmark: setting.spec.kernel.name(),
                class: setting.spec.class.letter().to_string(),
                vcpus: setting.vcpus,
                wait: setting.wait.map_or("native", BarrierWait::name),
                spin_us: setting.spin.micros(setting.vcpus),
                balloon: setting.balloon,
                runs: setting.samples.len(),
                times_s: setting.samples.iter().map(|x| x.time_s).collect(),
                median_s: s.time_s,
                ratio_to_native_median: s.ratio,
                barriers: s.per.barriers,
                per_barrier: PerBarrier {
                    sleeps: s.per.sleeps,
                    wakes: s.per.wakes,
                    spin_us: s.per.spin_us,
                    sleep_us: s.per.sleep_us,
                    arrival_spread_us: s.per.spread_us,
                    vcpu_cpu_wait_us: s.per.run_delay_us,
                    vcpu_cpu_us: s.per.cpu_us,
                    pv_blocks: s.per.pv_blocks,
                },
                resume_us_per_waiter: s.per.resume_us,
            });
            continue;
        }
        let ratio = s.ratio.map_or("-".to_string(), |r| format!("{r:.2}"));
        let range = format!("{:.3}-{:.3}", s.min_s, s.max_s);
        if setting.wait.is_none() {
            kumo_vmm::outln!(
                "{:<6} {:>5} {:<14} {:>8.3} {:>15} {:>7} |",
                setting.spec.to_string(),
                setting.vcpus,
                setting.name(),
                s.time_s,
                range,
                ratio
            );
            continue;
        }
        kumo_vmm::outln!(
            "{:<6} {:>5} {:<14} {:>8.3} {:>15} {:>7} | {:>20.1} {:>7.0} {:>8.0} {:>7.0} {:>8.0} {:>8.0} {:>9.0}",
            setting.spec.to_string(),
            setting.vcpus,
            setting.name(),
            s.time_s,
            range,
            ratio,
            s.per.sleeps,
            s.per.spin_us,
            s.per.spread_us,
            s.per.resume_us,
            s.per.run_delay_us,
            s.per.cpu_us,
            s.per.barriers
        );
    }
    if !args.json {
        kumo_vmm::outln!(
            "per barrier, summed over the guest's CPUs: sleeps; spin_us spent spinning; spread_us from the \
             first to the last arrival; resume: us from the release to each waiter running; cpuwait: us \
             vCPU threads were runnable without a host CPU; vcpu_cpu: us of host CPU the vCPU threads used"
        );
    }
}

#[derive(Args, Debug)]
pub struct OversubArgs {
    /// Benchmarks, comma-separated kernel.class items.
    #[arg(long, value_name = "LIST", default_value = "cg.W")]
    pub npb: String,

    /// vCPU (and native thread) counts, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "2,12")]
    pub vcpus: String,

    /// Guest wait mechanisms to compare, comma-separated (pv, hlt).
    #[arg(long, value_name = "LIST", default_value = "pv,hlt")]
    pub wait: String,

    /// Rounds; each runs every setting once, in turn.
    #[arg(long, value_name = "R", default_value_t = 3)]
    pub runs: u32,

    /// vCPU ballooning settings to compare for each guest run, comma-separated (off,
    /// on, auto: on when the vCPUs outnumber the host CPUs).
    #[arg(long, value_name = "LIST", default_value = "off,auto")]
    pub balloon: String,

    /// Barrier spins to compare, comma-separated: `team` (kumo's for a VM alone:
    /// none when vCPUs outnumber host CPUs), `shared` (the spin before issue 16 and
    /// of nodes: 50 us when they do), or microseconds. Both with a CPU per thread:
    /// 2000 us.
    #[arg(long, value_name = "LIST", default_value = "team")]
    pub spin: String,

    /// Print one JSON object per setting instead of a table.
    #[arg(long)]
    pub json: bool,

    /// The KVM device to open.
    #[arg(long, value_name = "PATH", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,
}
