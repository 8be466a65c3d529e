//! Turns what the guest reported into kumo's verdict and prints it as a table or JSON.

use std::fmt::Write as _;

use npb::Spec;
use serde::Serialize;

use crate::protocol::{BenchResult, Event, GuestFields, WithGuest};

/// Exit statuses of `kumo` for the embedded guest.
pub const EXIT_OK: u8 = 0;
/// A benchmark did not verify, or the guest reported a problem.
pub const EXIT_UNVERIFIED: u8 = 1;
/// The VM crashed (triple fault, KVM internal error, the watchdog, ...).
pub const EXIT_FAULT: u8 = 3;
/// kumo stopped the VM at its `--timeout`.
pub const EXIT_TIMEOUT: u8 = 4;

/// kumo's exit status for a VM it stopped: [`EXIT_TIMEOUT`], or 128 + the signal's
/// number as a shell reports a process a signal ended (130 for SIGINT, 143 SIGTERM).
pub fn stop_status(cause: hv::StopCause) -> u8 {
    match cause {
        hv::StopCause::Timeout(_) => EXIT_TIMEOUT,
        hv::StopCause::Signal(signal) => 128u8.saturating_add(signal.clamp(0, 127) as u8),
    }
}

/// A benchmark's result fields of its JSON row: time, Mop/s and verdict, or nulls and
/// an error when the guest printed no result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResultFields {
    pub time_s: Option<f64>,
    pub mops: Option<f64>,
    pub verified: bool,
    /// `"no result"`, only without a result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
}

impl ResultFields {
    /// The result's fields, and the guest's other values (checksums and the like).
    pub fn of(result: Option<&BenchResult>) -> (ResultFields, GuestFields) {
        match result {
            Some(r) => (
                ResultFields {
                    time_s: Some(r.time_s),
                    mops: Some(r.mops),
                    verified: r.verified,
                    error: None,
                },
                GuestFields::of(&r.extra),
            ),
            None => (
                ResultFields {
                    time_s: None,
                    mops: None,
                    verified: false,
                    error: Some("no result"),
                },
                GuestFields::default(),
            ),
        }
    }
}

/// A benchmark's row of `kumo --json` and `kumo native --json`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchRow {
    pub benchmark: &'static str,
    pub class: String,
    /// The threads the guest ran it on, or the VM's vCPUs without a result.
    pub vcpus: u32,
    #[serde(flatten)]
    pub result: ResultFields,
}

/// The summary line after the benchmark rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryLine {
    /// `"vm"` or `"native"`.
    pub mode: &'static str,
    pub boot_ms: Option<f64>,
    pub vcpus: u32,
    pub ok: bool,
    pub problems: Vec<String>,
}

/// A line of `kumo --json`: a benchmark's row or the summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum JsonLine {
    Bench(WithGuest<BenchRow>),
    Summary(SummaryLine),
}

/// One requested benchmark and what the guest said about it.
#[derive(Debug)]
pub struct Row {
    pub spec: Spec,
    pub result: Option<BenchResult>,
}

#[derive(Debug)]
pub struct Verdict {
    pub rows: Vec<Row>,
    pub vcpus: u32,
    pub boot_ms: Option<f64>,
    /// Everything that makes the run not a success, one line each.
    pub problems: Vec<String>,
    pub crashed: bool,
    /// kumo stopped the run (time limit, signal): its exit status.
    pub stopped: Option<u8>,
    /// Host threads rather than a VM: no boot, "threads" rather than "vCPUs".
    pub native: bool,
    /// What KVM counted for the VM (None: no VM, or not kept).
    pub kvm_stats: Option<hv::kvm_stats::KvmStats>,
}

/// How the VM ended, as far as the verdict cares.
pub enum Ending<'a> {
    DebugExit(u32),
    Fault(&'a str),
    Stopped(hv::StopCause),
}

/// The verdict on a VM of `vcpus` vCPUs whose results of `specs` each ran on `threads`.
pub fn judge(
    specs: &[Spec],
    vcpus: u32,
    threads: u32,
    events: &[Event],
    ending: Ending,
    boot_ms: Option<f64>,
) -> Verdict {
    let mut problems = Vec::new();
    let mut results = Vec::new();
    let mut end_status = None;
    for event in events {
        match event {
            Event::Boot { cpus, .. } if *cpus != vcpus => {
                problems.push(format!("the guest brought up {cpus} of {vcpus} vCPUs"));
            }
            Event::Boot { .. } => {}
            Event::Result(r) => results.push(r.clone()),
            Event::Error { fields } => {
                problems.push(format!("guest error: {}", fields_text(fields)))
            }
            Event::Fault { fields } => {
                problems.push(format!("guest fault: {}", fields_text(fields)))
            }
            Event::End { status } => end_status = Some(*status),
            Event::Malformed(line) => problems.push(format!("malformed guest line: {line:?}")),
            // Probe results: reported by whoever asked for the probe; progress: read
            // while the guest runs (a node's domain list).
            Event::Measurement { .. } | Event::Progress(_) => {}
        }
    }
    let rows = match_rows(specs, threads, results, &mut problems);
    let mut crashed = false;
    let mut stopped = None;
    match ending {
        Ending::Stopped(cause) => {
            stopped = Some(stop_status(cause));
            problems.push(cause.to_string());
        }
        Ending::Fault(report) => {
            crashed = true;
            problems.push(format!("the VM crashed: {report}"));
        }
        Ending::DebugExit(0) => {}
        Ending::DebugExit(v) => problems.push(format!("the guest exited with status {v}")),
    }
    match end_status {
        None if !crashed && stopped.is_none() => {
            problems.push("the guest did not report its end".to_string())
        }
        Some(s) if s != 0 => problems.push(format!("the guest reported status {s}")),
        _ => {}
    }
    Verdict {
        rows,
        vcpus,
        boot_ms,
        problems,
        crashed,
        stopped,
        native: false,
        kvm_stats: None,
    }
}

/// The verdict on a native run (host threads, no VM).
pub fn judge_native(specs: &[Spec], threads: u32, results: Vec<BenchResult>) -> Verdict {
    let mut problems = Vec::new();
    let rows = match_rows(specs, threads, results, &mut problems);
    Verdict {
        rows,
        vcpus: threads,
        boot_ms: None,
        problems,
        crashed: false,
        stopped: None,
        native: true,
        kvm_stats: None,
    }
}

/// Pairs each requested benchmark with the first unused result of the same name, and
/// records what is missing, unverified or run on the wrong number of threads.
fn match_rows(
    specs: &[Spec],
    threads: u32,
    results: Vec<BenchResult>,
    problems: &mut Vec<String>,
) -> Vec<Row> {
    let mut results: Vec<Option<BenchResult>> = results.into_iter().map(Some).collect();
    specs
        .iter()
        .map(|&spec| {
            let result = results
                .iter_mut()
                .find(|r| {
                    r.as_ref().is_some_and(|r| {
                        r.benchmark == spec.kernel.name()
                            && r.class == spec.class.letter().to_string()
                    })
                })
                .and_then(Option::take);
            match &result {
                None => problems.push(format!("no result for {spec}")),
                Some(r) if !r.verified => problems.push(format!("{spec} did not verify")),
                Some(r) if r.threads != threads => problems.push(format!(
                    "{spec} ran on {} threads, not {threads}",
                    r.threads
                )),
                Some(_) => {}
            }
            Row { spec, result }
        })
        .collect()
}

fn fields_text(fields: &std::collections::BTreeMap<String, String>) -> String {
    let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    parts.join(" ")
}

impl Verdict {
    pub fn exit_code(&self) -> u8 {
        if let Some(status) = self.stopped {
            status
        } else if self.crashed {
            EXIT_FAULT
        } else if self.problems.is_empty() {
            EXIT_OK
        } else {
            EXIT_UNVERIFIED
        }
    }

    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<10} {:<5} {:>7} {:>12} {:>12}  verified",
            "benchmark",
            "class",
            if self.native { "threads" } else { "vCPUs" },
            "time (s)",
            "Mop/s"
        );
        for row in &self.rows {
            let (kernel, class) = (row.spec.kernel.name(), row.spec.class.letter());
            let _ = match &row.result {
                Some(r) => writeln!(
                    out,
                    "{kernel:<10} {class:<5} {:>7} {:>12.3} {:>12.2}  {}",
                    r.threads,
                    r.time_s,
                    r.mops,
                    if r.verified { "yes" } else { "NO" }
                ),
                None => writeln!(
                    out,
                    "{kernel:<10} {class:<5} {:>7} {:>12} {:>12}  NO (no result)",
                    self.vcpus, "-", "-"
                ),
            };
        }
        let _ = match (self.native, self.boot_ms) {
            (true, _) => writeln!(out, "native: {} host threads, no VM", self.vcpus),
            (false, Some(ms)) => {
                writeln!(out, "boot: {ms:.1} ms from kumo's start to workload start")
            }
            (false, None) => writeln!(out, "boot: the guest never marked its workload start"),
        };
        out
    }

    /// One JSON object per benchmark, then one with the run's summary.
    pub fn json_lines(&self) -> Vec<JsonLine> {
        let mut lines: Vec<JsonLine> = self
            .rows
            .iter()
            .map(|row| {
                let (result, guest) = ResultFields::of(row.result.as_ref());
                let kumo = BenchRow {
                    benchmark: row.spec.kernel.name(),
                    class: row.spec.class.letter().to_string(),
                    vcpus: row.result.as_ref().map_or(self.vcpus, |r| r.threads),
                    result,
                };
                JsonLine::Bench(WithGuest::new(kumo, guest))
            })
            .collect();
        lines.push(JsonLine::Summary(SummaryLine {
            mode: if self.native { "native" } else { "vm" },
            boot_ms: self.boot_ms,
            vcpus: self.vcpus,
            ok: self.problems.is_empty(),
            problems: self.problems.clone(),
        }));
        lines
    }
}

/// Prints the verdict on stdout (table or JSON lines) and its problems on stderr. A
/// closed stdout loses the table, never the problems (see `crate::output`).
pub fn print(verdict: &Verdict, json: bool) {
    if json {
        for line in verdict.json_lines() {
            crate::output::json_line(&line);
        }
    } else {
        crate::out!("{}", verdict.table());
    }
    for problem in &verdict.problems {
        eprintln!("kumo: {problem}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::parse_line;
    use serde_json::json;

    fn events(lines: &[&str]) -> Vec<Event> {
        lines.iter().filter_map(|l| parse_line(l)).collect()
    }

    const EP_S_OK: &str =
        "@kumo result benchmark=ep class=S threads=2 time_s=0.5 mops=67.1 verified=true sx=-3247.8";

    #[test]
    fn a_clean_run_exits_zero_and_prints_both_formats() {
        let specs = vec!["ep.S".parse().unwrap()];
        let ev = events(&[
            "@kumo boot cpus=2 tsc_khz=1000",
            EP_S_OK,
            "@kumo end status=0",
        ]);
        let v = judge(&specs, 2, 2, &ev, Ending::DebugExit(0), Some(12.5));
        assert_eq!(v.problems, Vec::<String>::new());
        assert_eq!(v.exit_code(), EXIT_OK);
        assert!(
            v.table()
                .contains("ep         S           2        0.500        67.10  yes")
        );
        let json: Vec<serde_json::Value> = v
            .json_lines()
            .iter()
            .map(|l| serde_json::to_value(l).unwrap())
            .collect();
        assert_eq!(json[0]["verified"], json!(true));
        assert_eq!(json[0]["vcpus"], json!(2));
        assert_eq!(json[0]["sx"], json!(-3247.8));
        assert_eq!(json[1]["boot_ms"], json!(12.5));
    }

    #[test]
    fn missing_unverified_and_short_runs_fail() {
        let specs: Vec<Spec> = vec!["ep.S".parse().unwrap(), "ep.W".parse().unwrap()];
        let ev = events(&[
            "@kumo boot cpus=1 tsc_khz=1000",
            EP_S_OK,
            "@kumo end status=0",
        ]);
        let v = judge(&specs, 2, 2, &ev, Ending::DebugExit(0), None);
        assert_eq!(v.exit_code(), EXIT_UNVERIFIED);
        assert!(v.problems.iter().any(|p| p.contains("1 of 2 vCPUs")));
        assert!(v.problems.iter().any(|p| p == "no result for ep.W"));
        let line = serde_json::to_value(&v.json_lines()[1]).unwrap();
        assert_eq!(line["error"], json!("no result"));

        let unverified = EP_S_OK.replace("verified=true", "verified=false");
        let ev = events(&[&unverified, "@kumo end status=1"]);
        let v = judge(&specs[..1], 2, 2, &ev, Ending::DebugExit(1), None);
        assert!(v.problems.iter().any(|p| p == "ep.S did not verify"));
        assert!(v.table().contains("NO"));
    }

    #[test]
    fn a_crash_is_its_own_exit_status() {
        let specs = vec!["ep.S".parse().unwrap()];
        let v = judge(
            &specs,
            1,
            1,
            &[],
            Ending::Fault("triple fault on vCPU 0"),
            None,
        );
        assert_eq!(v.exit_code(), EXIT_FAULT);
        assert!(v.problems.iter().any(|p| p.contains("triple fault")));
    }

    #[test]
    fn one_result_cannot_satisfy_two_requests() {
        let specs: Vec<Spec> = vec!["ep.S".parse().unwrap(), "ep.S".parse().unwrap()];
        let ev = events(&[EP_S_OK, "@kumo end status=0"]);
        let v = judge(&specs, 2, 2, &ev, Ending::DebugExit(0), None);
        assert!(v.rows[0].result.is_some());
        assert!(v.rows[1].result.is_none());
    }
}
