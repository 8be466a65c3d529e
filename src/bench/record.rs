//! The performance record `kumo bench record` writes and `kumo bench compare` reads:
//! one JSON object per run of the suite, with every sample kept, so a later reader can
//! recompute what this file summarises. The suite itself is `bench::suite`.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use kumo_vmm::stats::Spread;
use serde::{Deserialize, Serialize};

/// The record's format. A reader refuses any other (bad input, exit 2).
pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    /// The commit the measuring binary was built from (null if built outside a checkout).
    pub commit: Option<String>,
    /// When the suite started, UTC, RFC 3339 (`2026-11-29T08:15:00Z`).
    pub date: String,
    pub host: Host,
    /// `--quick`: shorter runs and smaller inputs; not comparable with a full record.
    pub quick: bool,
    /// Rounds of the suite (each primitive's samples are spread over all of them).
    pub rounds: u32,
    pub figures: Vec<Figure>,
}

/// What the numbers were taken on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// Host CPUs kumo may use.
    pub cpus: usize,
    /// `uname -r`.
    pub kernel: String,
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: Option<String>,
    /// `qemu-system-x86_64 --version`'s first line; null when it is not installed
    /// (then the whole-process figure has no reference).
    pub qemu: Option<String>,
    /// The 1-minute load average before and after the suite: above ~0.5 the host was
    /// shared with something (a build, another test run).
    pub load_before: Option<f64>,
    pub load_after: Option<f64>,
}

/// Which way a figure improves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    Lower,
    Higher,
}

/// One primitive's samples and their spread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub name: String,
    pub unit: String,
    pub better: Better,
    pub samples: Vec<f64>,
    pub median: f64,
    pub p10: f64,
    pub p90: f64,
    /// What ran beside it, interleaved (the same round, order alternated): a ratio to
    /// it survives the host's speed states, which move both alike.
    pub reference: Option<Reference>,
    /// Median of the pairwise ratios `samples[i] / reference.samples[i]`.
    pub ratio: Option<f64>,
    pub ratio_p10: Option<f64>,
    pub ratio_p90: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    pub name: String,
    pub samples: Vec<f64>,
    pub median: f64,
}

impl Figure {
    /// A figure from its samples and, if it has one, its reference's samples (taken in
    /// pairs: `reference.1[i]` beside `samples[i]`).
    pub fn new(
        name: &str,
        unit: &str,
        better: Better,
        samples: Vec<f64>,
        reference: Option<(&str, Vec<f64>)>,
    ) -> Figure {
        let (median, p10, p90) = spread(&samples);
        let ratios: Option<Vec<f64>> = reference
            .as_ref()
            .map(|(_, base)| samples.iter().zip(base).map(|(s, b)| s / b).collect());
        let ratio_spread = ratios.as_deref().map(spread);
        Figure {
            name: name.into(),
            unit: unit.into(),
            better,
            median,
            p10,
            p90,
            reference: reference.map(|(name, samples)| Reference {
                name: name.into(),
                median: spread(&samples).0,
                samples,
            }),
            ratio: ratio_spread.map(|s| s.0),
            ratio_p10: ratio_spread.map(|s| s.1),
            ratio_p90: ratio_spread.map(|s| s.2),
            samples,
        }
    }
}

/// Median, 10th and 90th percentile (`kumo_vmm::stats`: linear between the closest
/// ranks); NaN each for no finite sample (a record that `Record::parse` refuses).
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    Spread::of(values, 0.1).map_or((f64::NAN, f64::NAN, f64::NAN), |s| {
        (s.median, s.low, s.high)
    })
}

impl Record {
    /// Parses a record, refusing another schema and numbers no comparison can use.
    pub fn parse(text: &str) -> Result<Record> {
        let value: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
        match value.get("schema").and_then(serde_json::Value::as_u64) {
            Some(s) if s == u64::from(SCHEMA) => {}
            Some(s) => bail!("schema {s}, but this kumo reads schema {SCHEMA}"),
            None => bail!("no \"schema\" number: not a kumo performance record"),
        }
        let record: Record = serde_json::from_value(value).context("not a performance record")?;
        for f in &record.figures {
            let finite = [f.median, f.p10, f.p90].iter().all(|v| v.is_finite());
            if f.samples.is_empty() || !finite || f.median <= 0.0 {
                bail!(
                    "figure {} has no samples or a median that is not a positive number",
                    f.name
                );
            }
            if f.ratio.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
                bail!(
                    "figure {} has a ratio that is not a positive number",
                    f.name
                );
            }
        }
        Ok(record)
    }

    /// Reads and parses `path`; the error names the file.
    pub fn read(path: &Path) -> Result<Record> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Record::parse(&text).with_context(|| format!("{}", path.display()))
    }

    pub fn write(&self, path: &Path) -> Result<()> {
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
    }

    pub fn figure(&self, name: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.name == name)
    }
}

impl Host {
    /// This host, now.
    pub fn this(load_before: Option<f64>) -> Host {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
        let qemu = Command::new("qemu-system-x86_64")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .map(str::to_string)
            });
        Host {
            cpus: hv::placement::host_cpus(),
            kernel,
            cpu_model,
            qemu,
            load_before,
            load_after: None,
        }
    }
}

/// The 1-minute load average.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The commit this binary was built from (`build.rs`; None when built outside a git
/// checkout). Not the checkout it runs in: an old binary keeps its own name.
pub fn commit() -> Option<String> {
    option_env!("KUMO_COMMIT").map(str::to_string)
}

/// Now, UTC, as RFC 3339 to the second.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (the civil-from-days algorithm of
/// Howard Hinnant's date library: no calendar crate for one date).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_record() -> Record {
        Record {
            schema: SCHEMA,
            commit: Some("9248d61".into()),
            date: "2026-11-29T08:00:00Z".into(),
            host: Host {
                cpus: 2,
                kernel: "6.18".into(),
                cpu_model: None,
                qemu: None,
                load_before: Some(0.1),
                load_after: Some(0.2),
            },
            quick: false,
            rounds: 3,
            figures: vec![
                Figure::new("boot_ms", "ms", Better::Lower, vec![2.0, 2.5, 3.0], None),
                Figure::new(
                    "npb_cg.W_s",
                    "s",
                    Better::Lower,
                    vec![1.01, 1.7, 1.02],
                    Some(("npb_cg.W_native_s", vec![1.0, 1.69, 1.0])),
                ),
            ],
        }
    }

    #[test]
    fn a_record_survives_a_round_trip_through_its_json() {
        let record = sample_record();
        let text = serde_json::to_string_pretty(&record).unwrap();
        assert_eq!(Record::parse(&text).unwrap(), record);
        // Numbers are JSON numbers; the reference and ratio are where readers look.
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema"], 1);
        assert!(v["figures"][0]["median"].is_f64());
        assert!(v["figures"][0]["reference"].is_null());
        assert_eq!(v["figures"][1]["reference"]["name"], "npb_cg.W_native_s");
        assert!(v["figures"][1]["ratio"].is_f64());
        assert_eq!(v["figures"][0]["better"], "lower");
    }

    #[test]
    fn spread_is_the_median_and_the_10th_and_90th_percentiles() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (2.0, 1.2, 2.8));
        assert_eq!(spread(&[5.0]), (5.0, 5.0, 5.0));
        assert!(spread(&[]).0.is_nan());
    }

    #[test]
    fn ratios_are_pairwise() {
        let f = Figure::new(
            "x",
            "s",
            Better::Lower,
            vec![2.0, 4.0, 1.0],
            Some(("y", vec![1.0, 4.0, 1.0])),
        );
        // Pairs 2.0, 1.0, 1.0: the median pair, not median over median (2/1.0).
        assert_eq!(f.ratio, Some(1.0));
        assert_eq!(f.reference.unwrap().median, 1.0);
    }

    #[test]
    fn another_schema_or_a_broken_figure_is_refused() {
        let mut v = serde_json::to_value(sample_record()).unwrap();
        v["schema"] = 2.into();
        let e = Record::parse(&v.to_string()).unwrap_err();
        assert!(format!("{e:#}").contains("schema 2"), "{e:#}");
        assert!(Record::parse("{}").is_err());
        assert!(Record::parse("not json").is_err());
        let mut v = serde_json::to_value(sample_record()).unwrap();
        v["figures"][0]["median"] = 0.into();
        assert!(Record::parse(&v.to_string()).is_err());
    }

    #[test]
    fn the_commit_is_the_one_built_from_a_full_hash() {
        // Built from a checkout (as tests are): the build script's full hash.
        if let Some(rev) = commit() {
            assert_eq!(rev.len(), 40, "{rev}");
            assert!(rev.bytes().all(|b| b.is_ascii_hexdigit()), "{rev}");
        }
    }

    #[test]
    fn dates_are_utc_civil_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        // 2024-02-29 12:34:56 UTC: a leap day.
        assert_eq!(utc(1_709_210_096), "2024-02-29T12:34:56Z");
    }
}
