//! Credit scheduler parameters in the units people write (ms, us), as node files,
//! `--sched credit:...` and `kumo ctl sched-credit` give them, turned into
//! `sched::Params` with Xen's rules for what is left out.

use anyhow::{Result, anyhow};
use sched::{NS_PER_MS, NS_PER_US, Params};

use super::control::{SchedParams, SchedUpdate};

fn ms_to_ns(what: &str, ms: f64) -> Result<u64> {
    if !ms.is_finite() || ms <= 0.0 || ms > 1e6 {
        return Err(anyhow!("{what} {ms} ms is not a usable duration"));
    }
    Ok((ms * NS_PER_MS as f64).round() as u64)
}

/// Applies `update` to `current`. A new slice without a tick gets Xen's derived tick
/// (3 per slice, 1 under 3 ms), as `xl sched-credit -t` does; a ratelimit left out
/// stays, unless it no longer fits under the slice, where it is turned off (as
/// `Params::with_tslice` does for short slices). The result is validated: the error
/// names the parameter and its range.
pub fn apply(current: Params, update: SchedUpdate) -> Result<Params> {
    let mut p = current;
    if let Some(ms) = update.tslice_ms {
        p.tslice_ns = ms_to_ns("tslice", ms)?;
        if update.tick_ms.is_none() {
            p.tick_ns = Params::default_tick(p.tslice_ns);
        }
        if update.ratelimit_us.is_none() && p.ratelimit_ns >= p.tslice_ns {
            p.ratelimit_ns = 0;
        }
    }
    if let Some(ms) = update.tick_ms {
        p.tick_ns = ms_to_ns("tick", ms)?;
    }
    if let Some(us) = update.ratelimit_us {
        p.ratelimit_ns = us
            .checked_mul(NS_PER_US)
            .ok_or_else(|| anyhow!("ratelimit {us} us is too large"))?;
    }
    if let Some(on) = update.directed_yield {
        p.directed_yield = on;
    }
    if let Some(accounting) = update.accounting {
        p.accounting = accounting.into();
        // Xen 3.4 had no ratelimit: off unless given (then validation refuses it).
        if p.accounting == sched::Accounting::Tick && update.ratelimit_us.is_none() {
            p.ratelimit_ns = 0;
        }
    }
    p.validate().map_err(|e| anyhow!("{e}"))?;
    Ok(p)
}

/// Xen's defaults with `update` applied.
pub fn from_update(update: SchedUpdate) -> Result<Params> {
    apply(Params::default(), update)
}

/// For display and the control API.
pub fn view(p: Params) -> SchedParams {
    SchedParams {
        tslice_ms: p.tslice_ns as f64 / NS_PER_MS as f64,
        tick_ms: p.tick_ns as f64 / NS_PER_MS as f64,
        ratelimit_us: p.ratelimit_ns / NS_PER_US,
        accounting: p.accounting.into(),
        directed_yield: p.directed_yield,
        auto_slice: false,
    }
}

/// `--sched credit:tslice=1ms,tick=1ms,ratelimit=100us` (units required: ms or us).
pub fn parse_spec(spec: &str) -> Result<Params> {
    let Some(rest) = spec.strip_prefix("credit") else {
        return Err(anyhow!(
            "--sched {spec}: only the credit scheduler exists (credit:tslice=..,tick=..,ratelimit=..)"
        ));
    };
    let mut update = SchedUpdate::default();
    let rest = match rest.strip_prefix(':') {
        Some(r) => r,
        None if rest.is_empty() => "",
        None => {
            return Err(anyhow!(
                "--sched {spec}: expected credit or credit:key=value,..."
            ));
        }
    };
    for item in rest.split(',').filter(|s| !s.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| anyhow!("--sched: '{item}' is not key=value"))?;
        if key == "directed_yield" {
            let on = match value {
                "on" => true,
                "off" => false,
                _ => return Err(anyhow!("--sched: directed_yield={value}: give on or off")),
            };
            update.directed_yield = Some(on);
            continue;
        }
        if key == "accounting" {
            let mode: sched::Accounting = value.parse().map_err(|e| anyhow!("--sched: {e}"))?;
            update.accounting = Some(mode.into());
            continue;
        }
        let ns = duration_ns(value).ok_or_else(|| {
            anyhow!("--sched: {key}={value}: give a duration with a unit, like 1ms or 500us")
        })?;
        match key {
            "tslice" => update.tslice_ms = Some(ns as f64 / NS_PER_MS as f64),
            "tick" => update.tick_ms = Some(ns as f64 / NS_PER_MS as f64),
            "ratelimit" => update.ratelimit_us = Some(ns / NS_PER_US),
            _ => {
                return Err(anyhow!(
                    "--sched: unknown parameter '{key}' (known: tslice, tick, ratelimit, accounting, directed_yield)"
                ));
            }
        }
    }
    from_update(update)
}

fn duration_ns(text: &str) -> Option<u64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, NS_PER_MS as f64)
    } else if let Some(n) = text.strip_suffix("us") {
        (n, NS_PER_US as f64)
    } else {
        return None;
    };
    let value: f64 = number.parse().ok()?;
    (value.is_finite() && value >= 0.0).then(|| (value * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xen_defaults_and_derived_ticks() {
        let p = from_update(SchedUpdate::default()).unwrap();
        assert_eq!(
            view(p),
            SchedParams {
                tslice_ms: 30.0,
                tick_ms: 10.0,
                ratelimit_us: 1000,
                accounting: crate::spec::control::Accounting::Exact,
                directed_yield: false,
                auto_slice: false,
            }
        );
        // S1's setting: 1 ms slice; the tick follows, the ratelimit no longer fits.
        let p = apply(
            p,
            SchedUpdate {
                tslice_ms: Some(1.0),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            view(p),
            SchedParams {
                tslice_ms: 1.0,
                tick_ms: 1.0,
                ratelimit_us: 0,
                accounting: crate::spec::control::Accounting::Exact,
                directed_yield: false,
                auto_slice: false,
            }
        );
        // The tick is independent when given.
        let p = apply(
            Params::default(),
            SchedUpdate {
                tslice_ms: Some(30.0),
                tick_ms: Some(1.0),
                ratelimit_us: None,
                accounting: None,
                directed_yield: None,
                auto_slice: None,
            },
        )
        .unwrap();
        assert_eq!(p.tick_ns, NS_PER_MS);
    }

    #[test]
    fn out_of_range_values_name_the_range() {
        let err = |u: SchedUpdate| apply(Params::default(), u).unwrap_err().to_string();
        assert!(
            err(SchedUpdate {
                tslice_ms: Some(2000.0),
                ..Default::default()
            })
            .contains("tslice")
        );
        assert!(
            err(SchedUpdate {
                tick_ms: Some(50.0),
                ..Default::default()
            })
            .contains("tick")
        );
        assert!(
            err(SchedUpdate {
                ratelimit_us: Some(40_000),
                ..Default::default()
            })
            .contains("ratelimit")
        );
        assert!(
            err(SchedUpdate {
                tslice_ms: Some(f64::NAN),
                ..Default::default()
            })
            .contains("not a usable duration")
        );
    }

    #[test]
    fn sched_specs_parse_with_units() {
        let p = parse_spec("credit:tslice=1ms,tick=1ms,ratelimit=100us").unwrap();
        assert_eq!(
            (p.tslice_ns, p.tick_ns, p.ratelimit_ns),
            (NS_PER_MS, NS_PER_MS, 100 * NS_PER_US)
        );
        assert_eq!(parse_spec("credit").unwrap(), Params::default());
        assert!(
            parse_spec("credit2")
                .unwrap_err()
                .to_string()
                .contains("expected credit")
        );
        assert!(
            parse_spec("rr")
                .unwrap_err()
                .to_string()
                .contains("only the credit")
        );
        assert!(
            parse_spec("credit:tslice=1")
                .unwrap_err()
                .to_string()
                .contains("with a unit")
        );
        assert!(
            parse_spec("credit:weight=1ms")
                .unwrap_err()
                .to_string()
                .contains("unknown parameter")
        );
    }

    #[test]
    fn tick_accounting_turns_the_ratelimit_off_unless_given() {
        let p = parse_spec("credit:tslice=30ms,tick=10ms,accounting=tick").unwrap();
        assert_eq!(p.accounting, sched::Accounting::Tick);
        assert_eq!(p.ratelimit_ns, 0);
        assert_eq!(view(p).accounting, crate::spec::control::Accounting::Tick);
        let err = parse_spec("credit:accounting=tick,ratelimit=1ms")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no ratelimit"), "{err}");
        assert!(parse_spec("credit:accounting=xen").is_err());
        // Directed yield is off unless asked for, and kept by later updates.
        assert!(!parse_spec("credit").unwrap().directed_yield);
        let p = parse_spec("credit:tslice=1ms,directed_yield=on").unwrap();
        assert!(p.directed_yield && view(p).directed_yield);
        let p = apply(
            p,
            SchedUpdate {
                tick_ms: Some(1.0),
                ..Default::default()
            },
        )
        .unwrap();
        assert!(p.directed_yield);
        let off = SchedUpdate {
            directed_yield: Some(false),
            ..Default::default()
        };
        assert!(!apply(p, off).unwrap().directed_yield);
        let err = parse_spec("credit:directed_yield=yes")
            .unwrap_err()
            .to_string();
        assert!(err.contains("on or off"), "{err}");
    }
}
