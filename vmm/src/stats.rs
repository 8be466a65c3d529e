//! Order statistics of repeated measurements: the one definition of a median, a
//! quantile, a minimum and a maximum behind every figure kumo prints (`kumo bench`,
//! `kumo experiment`, `--irq-check`'s host view, the performance record).
//!
//! - A **quantile** `q` (0 to 1) is linear between the closest ranks: the sorted
//!   values' position `q * (n - 1)`, interpolated (numpy's default, R's type 7).
//! - The **median** is the 0.5 quantile: the middle value of an odd count, the mean of
//!   the middle two of an even count.
//! - Values that are not finite (NaN, infinities: a division by a zero time) are left
//!   out; no value left gives `None`, never a panic.
//!
//! A leaf: it imports nothing from the crate, so every layer and crate above can use it.

use serde::{Deserialize, Serialize};

/// The finite values, sorted.
fn finite_sorted(values: &[f64]) -> Vec<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The `q` quantile of sorted, finite, non-empty values.
fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    let at = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo as f64)
}

/// The `q` quantile (0 to 1, clamped), linear between the closest ranks; `None`
/// without a finite value.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let sorted = finite_sorted(values);
    (!sorted.is_empty()).then(|| quantile_sorted(&sorted, q))
}

/// The median: the middle value, or the mean of the middle two; `None` without a
/// finite value.
pub fn median(values: &[f64]) -> Option<f64> {
    quantile(values, 0.5)
}

/// [`median`] of values as an iterator gives them (a field of each of a run's rows).
pub fn median_of(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    median(&values.into_iter().collect::<Vec<_>>())
}

/// The smallest finite value.
pub fn min(values: &[f64]) -> Option<f64> {
    values
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .min_by(f64::total_cmp)
}

/// The largest finite value.
pub fn max(values: &[f64]) -> Option<f64> {
    values
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .max_by(f64::total_cmp)
}

/// A median between a low and a high quantile, symmetric about it: `Spread::of(v,
/// 0.1)` is the 10th percentile, the median and the 90th; `Spread::of(v, 0.0)` the
/// minimum, the median and the maximum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub low: f64,
    pub median: f64,
    pub high: f64,
}

impl Spread {
    /// The `tail` and `1 - tail` quantiles and the median; `None` without a finite
    /// value.
    pub fn of(values: &[f64], tail: f64) -> Option<Spread> {
        let sorted = finite_sorted(values);
        if sorted.is_empty() {
            return None;
        }
        Some(Spread {
            low: quantile_sorted(&sorted, tail),
            median: quantile_sorted(&sorted, 0.5),
            high: quantile_sorted(&sorted, 1.0 - tail),
        })
    }
}

/// Median and range of repeated measurements, and how many there were (finite ones).
/// Serialized as `{"median":..,"min":..,"max":..,"n":..}` (`kumo experiment`'s
/// reports).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    /// `None` without a finite value.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let sorted = finite_sorted(values);
        let (first, last) = (*sorted.first()?, *sorted.last()?);
        Some(Summary {
            median: quantile_sorted(&sorted, 0.5),
            min: first,
            max: last,
            n: sorted.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[1.0, 2.0]), Some(1.5));
        assert_eq!(median_of([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median_of(std::iter::empty()), None);
    }

    #[test]
    fn empty_and_non_finite_input_give_none() {
        assert_eq!(median(&[]), None);
        assert_eq!(quantile(&[], 0.9), None);
        assert_eq!(min(&[]), None);
        assert_eq!(max(&[]), None);
        assert_eq!(Spread::of(&[], 0.1), None);
        assert_eq!(Summary::of(&[]), None);
        assert_eq!(median(&[f64::NAN, f64::INFINITY]), None);
        assert_eq!(Summary::of(&[f64::NAN]), None);
    }

    #[test]
    fn non_finite_values_are_left_out() {
        assert_eq!(median(&[1.0, f64::NAN, 3.0]), Some(2.0));
        assert_eq!(max(&[1.0, f64::INFINITY]), Some(1.0));
        assert_eq!(min(&[f64::NEG_INFINITY, 2.0]), Some(2.0));
        let s = Summary::of(&[f64::NAN, 2.0, 1.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (1.5, 1.0, 2.0, 2));
    }

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let v = [3.0, 1.0, 2.0];
        assert_eq!(quantile(&v, 0.0), Some(1.0));
        assert_eq!(quantile(&v, 1.0), Some(3.0));
        assert!((quantile(&v, 0.1).unwrap() - 1.2).abs() < 1e-12);
        assert!((quantile(&v, 0.9).unwrap() - 2.8).abs() < 1e-12);
        // 1..=100: p90 sits at rank 89.1, p99 at 98.01 (0-based).
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((quantile(&hundred, 0.9).unwrap() - 90.1).abs() < 1e-9);
        assert!((quantile(&hundred, 0.99).unwrap() - 99.01).abs() < 1e-9);
        // Out of range clamps to the extremes.
        assert_eq!(quantile(&v, -1.0), Some(1.0));
        assert_eq!(quantile(&v, 2.0), Some(3.0));
        assert_eq!(quantile(&[5.0], 0.9), Some(5.0));
    }

    #[test]
    fn spread_and_summary() {
        let s = Spread::of(&[1.0, 2.0, 3.0, 4.0], 0.1).unwrap();
        assert!((s.low - 1.3).abs() < 1e-12 && (s.high - 3.7).abs() < 1e-12);
        assert_eq!(s.median, 2.5);
        let r = Spread::of(&[4.0, 1.0, 3.0], 0.0).unwrap();
        assert_eq!((r.low, r.median, r.high), (1.0, 3.0, 4.0));
        let t = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((t.median, t.min, t.max, t.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            r#"{"median":2.0,"min":1.0,"max":3.0,"n":3}"#
        );
    }
}
