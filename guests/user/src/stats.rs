//! Latency summaries the probes print: nearest-rank quantiles of TSC tick samples,
//! in microseconds.

/// Sorts `ticks` and returns a function giving the `q` quantile (0..=1) in
/// microseconds; NaN when there are no samples.
pub fn quantiles(ticks: &mut [u64], tsc_khz: u64) -> impl Fn(f64) -> f64 + '_ {
    ticks.sort_unstable();
    let ticks = &*ticks;
    move |q: f64| {
        if ticks.is_empty() {
            return f64::NAN;
        }
        let rank = libm::ceil(q * ticks.len() as f64) as usize;
        ticks[rank.clamp(1, ticks.len()) - 1] as f64 * 1000.0 / tsc_khz as f64
    }
}
