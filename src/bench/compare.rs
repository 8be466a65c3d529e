//! `kumo bench compare OLD NEW`: each figure's change between two performance records
//! against a noise band taken from the records' own spread; exit 1 when a figure got
//! worse beyond its band.
//!
//! The band of a figure is the larger of the two records' relative half-widths of its
//! 10th-90th percentile range, `(p90 - p10) / 2 / median`: a change inside what either
//! run already varied by is not told apart from noise. Where both records have a ratio
//! to an interleaved reference, the ratio is compared instead of the raw median: the
//! host's speed states move a figure and its reference alike, and the ratio keeps what
//! they do not share.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

use crate::bench::record::{Better, Figure, Record};

/// What changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Better,
    Worse,
    WithinNoise,
}

/// Which number of a figure was compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// `ratio`: the figure over its interleaved reference.
    Ratio,
    /// `median` of the raw samples.
    Median,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub name: String,
    /// The figure's unit; a ratio has none ("x").
    pub unit: String,
    pub better: Better,
    pub basis: Basis,
    /// The reference the ratio is taken to (when `basis` is `ratio`).
    pub reference: Option<String>,
    pub old: f64,
    pub new: f64,
    /// `(new - old) / old`, percent.
    pub change_pct: f64,
    /// The noise band, percent either side.
    pub band_pct: f64,
    pub verdict: Verdict,
}

/// Where a record came from, as the comparison names it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Origin {
    pub commit: Option<String>,
    pub date: String,
    pub quick: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub old: Origin,
    pub new: Origin,
    pub figures: Vec<Change>,
    /// Figures one record has and the other does not: listed, never failed.
    pub only_old: Vec<String>,
    pub only_new: Vec<String>,
    /// Figures worse beyond their band.
    pub worse: usize,
}

impl Comparison {
    /// 1 if any figure is worse beyond its band, else 0.
    pub fn exit_code(&self) -> u8 {
        u8::from(self.worse > 0)
    }
}

/// The number compared and its relative half-spread, by basis.
fn point(f: &Figure, basis: Basis) -> (f64, f64) {
    let (m, lo, hi) = match basis {
        Basis::Ratio => (
            f.ratio.unwrap_or(f64::NAN),
            f.ratio_p10.unwrap_or(f64::NAN),
            f.ratio_p90.unwrap_or(f64::NAN),
        ),
        Basis::Median => (f.median, f.p10, f.p90),
    };
    let half = ((hi - lo) / 2.0 / m).abs();
    (m, if half.is_finite() { half } else { 0.0 })
}

fn change(old: &Figure, new: &Figure) -> Change {
    // The ratio only when both have one to the same reference.
    let same_reference = match (&old.reference, &new.reference) {
        (Some(a), Some(b)) => a.name == b.name,
        _ => false,
    };
    let basis = if same_reference && old.ratio.is_some() && new.ratio.is_some() {
        Basis::Ratio
    } else {
        Basis::Median
    };
    let (o, o_half) = point(old, basis);
    let (n, n_half) = point(new, basis);
    let relative = (n - o) / o;
    let band = o_half.max(n_half);
    let worse_way = match new.better {
        Better::Lower => relative,
        Better::Higher => -relative,
    };
    let verdict = if worse_way > band {
        Verdict::Worse
    } else if worse_way < -band {
        Verdict::Better
    } else {
        Verdict::WithinNoise
    };
    Change {
        name: new.name.clone(),
        unit: match basis {
            Basis::Ratio => "x".into(),
            Basis::Median => new.unit.clone(),
        },
        better: new.better,
        basis,
        reference: (basis == Basis::Ratio)
            .then(|| new.reference.as_ref().map(|r| r.name.clone()))
            .flatten(),
        old: o,
        new: n,
        change_pct: relative * 100.0,
        band_pct: band * 100.0,
        verdict,
    }
}

/// Compares every figure `new` shares with `old`, in `new`'s order.
pub fn compare(old: &Record, new: &Record) -> Comparison {
    let figures: Vec<Change> = new
        .figures
        .iter()
        .filter_map(|n| old.figure(&n.name).map(|o| change(o, n)))
        .collect();
    let only = |a: &Record, b: &Record| -> Vec<String> {
        a.figures
            .iter()
            .filter(|f| b.figure(&f.name).is_none())
            .map(|f| f.name.clone())
            .collect()
    };
    let origin = |r: &Record| Origin {
        commit: r.commit.clone(),
        date: r.date.clone(),
        quick: r.quick,
    };
    Comparison {
        old: origin(old),
        new: origin(new),
        worse: figures
            .iter()
            .filter(|c| c.verdict == Verdict::Worse)
            .count(),
        figures,
        only_old: only(old, new),
        only_new: only(new, old),
    }
}

/// `kumo bench compare`.
pub fn run_compare(args: &CompareArgs) -> Result<u8> {
    let old = Record::read(&args.old)?;
    let new = Record::read(&args.new)?;
    let comparison = compare(&old, &new);
    if args.json {
        kumo_vmm::outln!("{}", serde_json::to_string(&comparison)?);
    } else {
        print(&comparison);
    }
    Ok(comparison.exit_code())
}

fn print(c: &Comparison) {
    let name = |o: &Origin| {
        format!(
            "{} ({}{})",
            o.commit
                .as_deref()
                .map_or("no commit", |s| &s[..s.len().min(10)]),
            o.date,
            if o.quick { ", quick" } else { "" }
        )
    };
    kumo_vmm::outln!("old: {}\nnew: {}", name(&c.old), name(&c.new));
    if c.old.quick != c.new.quick {
        kumo_vmm::outln!("(one record is --quick, the other not: their figures differ in size)");
    }
    let mut rows = vec![
        [
            "figure", "compared", "old", "new", "unit", "change", "band", "verdict",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for ch in &c.figures {
        rows.push(vec![
            ch.name.clone(),
            match (&ch.basis, &ch.reference) {
                (Basis::Ratio, Some(r)) => format!("ratio to {r}"),
                _ => "median".into(),
            },
            number(ch.old),
            number(ch.new),
            ch.unit.clone(),
            format!("{:+.1}%", ch.change_pct),
            format!("±{:.1}%", ch.band_pct),
            match ch.verdict {
                Verdict::Better => "better",
                Verdict::Worse => "WORSE",
                Verdict::WithinNoise => "within noise",
            }
            .into(),
        ]);
    }
    kumo_vmm::out!("{}", kumo_vmm::output::table(&rows, 2));
    for (list, which) in [(&c.only_old, "old"), (&c.only_new, "new")] {
        if !list.is_empty() {
            kumo_vmm::outln!("only in the {which} record: {}", list.join(", "));
        }
    }
    kumo_vmm::outln!(
        "{} worse beyond the noise band (the larger of the two records' (p90-p10)/2/median)",
        c.worse
    );
}

/// Four significant digits, without a trail of zeros past them.
fn number(v: f64) -> String {
    let digits = if v.abs() >= 1000.0 {
        0
    } else {
        (3 - v.abs().log10().floor() as i32).clamp(0, 6) as usize
    };
    format!("{v:.digits$}")
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The record before the change.
    #[arg(value_name = "OLD.json")]
    pub old: PathBuf,

    /// The record after it.
    #[arg(value_name = "NEW.json")]
    pub new: PathBuf,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::{Host, SCHEMA};

    fn record(figures: Vec<Figure>) -> Record {
        Record {
            schema: SCHEMA,
            commit: None,
            date: "2026-11-29T08:00:00Z".into(),
            host: Host {
                cpus: 2,
                kernel: "6.18".into(),
                cpu_model: None,
                qemu: None,
                load_before: None,
                load_after: None,
            },
            quick: false,
            rounds: 5,
            figures,
        }
    }

    /// Five samples around `m`, ±1 % (a band of about 1 %).
    fn tight(m: f64) -> Vec<f64> {
        [0.99, 0.995, 1.0, 1.005, 1.01]
            .iter()
            .map(|k| k * m)
            .collect()
    }

    fn raw(name: &str, samples: Vec<f64>) -> Figure {
        Figure::new(name, "us", Better::Lower, samples, None)
    }

    #[test]
    fn a_figure_20_percent_slower_beyond_its_band_fails() {
        let old = record(vec![raw("irq_fast_us", tight(50.0))]);
        let new = record(vec![raw("irq_fast_us", tight(60.0))]);
        let c = compare(&old, &new);
        assert_eq!(c.figures[0].verdict, Verdict::Worse);
        assert!((c.figures[0].change_pct - 20.0).abs() < 1e-9);
        assert!(c.figures[0].band_pct < 1.0);
        assert_eq!(c.worse, 1);
        assert_eq!(c.exit_code(), 1);
        // The other way it is better, and passes.
        let c = compare(&new, &old);
        assert_eq!(c.figures[0].verdict, Verdict::Better);
        assert_eq!(c.exit_code(), 0);
    }

    #[test]
    fn a_change_inside_either_records_spread_is_noise() {
        // New is 20 % slower, but the old run itself spread ±22 % (p10-p90).
        let old = record(vec![raw("boot_ms", vec![1.4, 1.8, 2.0, 2.2, 2.6])]);
        let new = record(vec![raw("boot_ms", tight(2.4))]);
        let c = compare(&old, &new);
        assert_eq!(c.figures[0].verdict, Verdict::WithinNoise);
        assert!(c.figures[0].band_pct > 20.0);
        assert_eq!(c.exit_code(), 0);
    }

    #[test]
    fn higher_is_better_figures_fail_when_they_drop() {
        let f = |m| Figure::new("mbps", "MB/s", Better::Higher, tight(m), None);
        let c = compare(&record(vec![f(100.0)]), &record(vec![f(80.0)]));
        assert_eq!(c.figures[0].verdict, Verdict::Worse);
        let c = compare(&record(vec![f(100.0)]), &record(vec![f(120.0)]));
        assert_eq!(c.figures[0].verdict, Verdict::Better);
    }

    #[test]
    fn figures_in_one_record_only_are_listed_not_failed() {
        let old = record(vec![raw("a", tight(1.0)), raw("gone", tight(1.0))]);
        let new = record(vec![raw("a", tight(1.0)), raw("added", tight(9.0))]);
        let c = compare(&old, &new);
        assert_eq!(c.figures.len(), 1);
        assert_eq!(c.only_old, ["gone"]);
        assert_eq!(c.only_new, ["added"]);
        assert_eq!(c.exit_code(), 0);
    }

    #[test]
    fn the_ratio_is_compared_where_both_have_one() {
        // The host got 1.7x slower between the records: raw times 70 % worse, the
        // guest/native ratio unchanged.
        let guest = |k: f64| {
            Figure::new(
                "npb_cg.W_s",
                "s",
                Better::Lower,
                tight(1.02 * k),
                Some(("npb_cg.W_native_s", tight(k))),
            )
        };
        let c = compare(&record(vec![guest(1.0)]), &record(vec![guest(1.7)]));
        let ch = &c.figures[0];
        assert_eq!(ch.basis, Basis::Ratio);
        assert_eq!(ch.reference.as_deref(), Some("npb_cg.W_native_s"));
        assert_eq!(ch.verdict, Verdict::WithinNoise);
        assert!(ch.change_pct.abs() < 1e-9);
        assert_eq!(c.exit_code(), 0);
        // Without a reference on one side the raw medians are compared, and fail.
        let plain = raw("npb_cg.W_s", tight(1.7 * 1.02));
        let c = compare(&record(vec![guest(1.0)]), &record(vec![plain]));
        assert_eq!(c.figures[0].basis, Basis::Median);
        assert_eq!(c.figures[0].verdict, Verdict::Worse);
    }

    #[test]
    fn a_slower_figure_beside_an_unchanged_reference_fails_on_its_ratio() {
        let fast = |m: f64| {
            Figure::new(
                "irq_fast_us",
                "us",
                Better::Lower,
                tight(m),
                Some(("irq_generic_us", tight(70.0))),
            )
        };
        let c = compare(&record(vec![fast(50.0)]), &record(vec![fast(60.0)]));
        assert_eq!(c.figures[0].basis, Basis::Ratio);
        assert_eq!(c.figures[0].verdict, Verdict::Worse);
        assert_eq!(c.exit_code(), 1);
    }

    #[test]
    fn json_output_has_numbers_and_verdicts() {
        let old = record(vec![raw("a", tight(1.0))]);
        let new = record(vec![raw("a", tight(1.5))]);
        let v = serde_json::to_value(compare(&old, &new)).unwrap();
        assert_eq!(v["figures"][0]["verdict"], "worse");
        assert_eq!(v["figures"][0]["basis"], "median");
        assert!(v["figures"][0]["change_pct"].is_f64());
        assert_eq!(v["worse"], 1);
    }

    #[test]
    fn numbers_keep_four_significant_digits() {
        assert_eq!(number(2.41234), "2.412");
        assert_eq!(number(68.456), "68.46");
        assert_eq!(number(0.98761), "0.9876");
        assert_eq!(number(12345.6), "12346");
    }
}
