//! What a guest did wrong, logged without letting the guest flood the log: a guest
//! that rings a doorbell on a broken ring 100,000 times must not write 100,000 lines
//! (the second hostile probe saw 17.8 MB on stderr). The first [`SHOWN`] errors of a
//! device are logged as they come; after them, the rest are counted and summarised at
//! most once every [`SUMMARY_EVERY`] (when the next one comes) and when the device is
//! dropped, so a flood costs a few lines and nothing is hidden.

use std::fmt::Display;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Errors logged one by one, per device.
pub const SHOWN: u64 = 3;
/// The shortest time between two summaries of a device's further errors.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(5);

#[derive(Default)]
struct State {
    /// Every error reported, shown or not.
    total: u64,
    /// Errors since the last line (counted, not shown).
    unshown: u64,
    /// When the last summary was written.
    summarised: Option<Instant>,
}

/// The guest errors of one device (its name starts each line).
pub struct GuestErrorLog {
    device: String,
    period: Duration,
    state: Mutex<State>,
}

impl GuestErrorLog {
    pub fn new(device: impl Into<String>) -> GuestErrorLog {
        GuestErrorLog::with_period(device, SUMMARY_EVERY)
    }

    /// Summaries at most once per `period` (tests choose theirs).
    pub fn with_period(device: impl Into<String>, period: Duration) -> GuestErrorLog {
        GuestErrorLog {
            device: device.into(),
            period,
            state: Mutex::new(State::default()),
        }
    }

    /// The guest did something wrong: log it, or count it if enough were logged.
    pub fn report(&self, error: impl Display) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.total += 1;
        if state.total <= SHOWN {
            tracing::error!("{}: {error}", self.device);
            if state.total == SHOWN {
                tracing::error!(
                    "{}: further guest errors are counted and summarised every {} s",
                    self.device,
                    self.period.as_secs()
                );
                state.summarised = Some(Instant::now());
            }
            return;
        }
        state.unshown += 1;
        let due = state
            .summarised
            .is_none_or(|at| at.elapsed() >= self.period);
        if due {
            tracing::error!(
                "{}: {} more guest errors (latest: {error})",
                self.device,
                state.unshown
            );
            state.unshown = 0;
            state.summarised = Some(Instant::now());
        }
    }

    /// Every error reported so far, shown or not.
    pub fn total(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Drop for GuestErrorLog {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if state.unshown > 0 {
            tracing::error!(
                "{}: {} more guest errors ({} in all)",
                self.device,
                state.unshown,
                state.total
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Counts the events logged while it is the thread's default subscriber.
    #[derive(Clone, Default)]
    struct Count(Arc<std::sync::atomic::AtomicU64>);

    impl tracing::Subscriber for Count {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn a_flood_of_errors_costs_a_few_lines_and_is_counted() {
        let lines = Count::default();
        // A period no test run reaches: no summary until the end.
        let log = GuestErrorLog::with_period("test-device", Duration::from_secs(1 << 30));
        tracing::subscriber::with_default(lines.clone(), || {
            for i in 0..100_000 {
                log.report(format_args!("bad ring {i}"));
            }
            assert_eq!(log.total(), 100_000);
            // The first three and the note that the rest are counted.
            let shown = lines.0.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(shown, SHOWN + 1);
            drop(log);
            let after = lines.0.load(std::sync::atomic::Ordering::Relaxed);
            assert_eq!(after, shown + 1, "the count is said at the end");
        });
    }

    #[test]
    fn errors_past_the_first_are_summarised_once_a_period() {
        let lines = Count::default();
        // A zero period: every error past the first few is a due summary of one.
        let log = GuestErrorLog::with_period("test-device", Duration::ZERO);
        tracing::subscriber::with_default(lines.clone(), || {
            for _ in 0..SHOWN + 5 {
                log.report("bad ring");
            }
            drop(log);
        });
        assert_eq!(
            lines.0.load(std::sync::atomic::Ordering::Relaxed),
            SHOWN + 1 + 5,
            "nothing left unsaid at the end"
        );
    }

    #[test]
    fn a_few_errors_are_each_shown_and_nothing_is_left_to_say() {
        let lines = Count::default();
        tracing::subscriber::with_default(lines.clone(), || {
            let log = GuestErrorLog::new("test-device");
            log.report("one");
            log.report("two");
            drop(log);
        });
        assert_eq!(lines.0.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
