//! kumo's standard output, which a closed reader cannot turn into a different verdict.
//!
//! `kumo ... | head -c 20` closes the pipe early. Output written after that is lost, as
//! it must be; but the run goes on, its exit status and its stderr reports stay what
//! they would have been. So every line kumo prints goes through [`out`] (or the
//! [`outln!`](crate::outln) / [`out!`](crate::out) macros), which never fails: the
//! first write error closes standard output for the rest of the process and is noted
//! at debug level. (Rust's `println!` would panic on a closed pipe instead.)

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to standard output and flushes it; after a failed write, nothing.
pub fn out(text: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        close(&e);
    }
}

/// True once a write to standard output has failed (the reader went away).
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

fn close(error: &std::io::Error) {
    if !CLOSED.swap(true, Ordering::Relaxed) {
        tracing::debug!("standard output closed ({error}); the run goes on without it");
    }
}

/// Standard output as a writer for a guest's console: never fails, discards once the
/// reader is gone.
pub struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !CLOSED.load(Ordering::Relaxed)
            && let Err(e) = std::io::stdout().lock().write_all(buf)
        {
            close(&e);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !CLOSED.load(Ordering::Relaxed)
            && let Err(e) = std::io::stdout().lock().flush()
        {
            close(&e);
        }
        Ok(())
    }
}

/// `print!` that survives a closed standard output.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::output::out(format_args!($($arg)*)) };
}

/// `println!` that survives a closed standard output.
#[macro_export]
macro_rules! outln {
    () => { $crate::output::out(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::output::out(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Prints `value` as one compact JSON line on standard output (`--json`'s lines).
pub fn json_line<T: serde::Serialize>(value: &T) {
    match serde_json::to_string(value) {
        Ok(line) => out(format_args!("{line}\n")),
        // Only a map with non-string keys or a failing Serialize impl refuse; kumo's
        // types have neither.
        Err(e) => eprintln!("kumo: cannot print a JSON line: {e}"),
    }
}

/// Aligns `rows` in columns: the first `left` left-aligned, the others right.
pub fn table(rows: &[Vec<String>], left: usize) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, s)| {
                if c < left {
                    format!("{s:<w$}", w = widths[c])
                } else {
                    format!("{s:>w$}", w = widths[c])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_left_then_right() {
        let rows = vec![
            vec!["a".to_string(), "bb".to_string(), "1".to_string()],
            vec!["ccc".to_string(), "d".to_string(), "22".to_string()],
        ];
        assert_eq!(table(&rows, 1), "a    bb   1\nccc   d  22\n");
    }
}

/// An error and its causes on one line, `outer: cause: cause`, each text once: many
/// errors quote their cause in their own text (`VM stream: {0}`, a context naming the
/// I/O error) and name it as their source too, which `{:#}` would print again.
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// A socket timeout (`EAGAIN` from a read or write with `SO_RCVTIMEO`/`SO_SNDTIMEO`,
/// printed as "Resource temporarily unavailable") said as what it is: `stalled()`
/// names the peer and what it failed to do ("the source 10.0.0.1:4444 sent nothing
/// for 60 s"). Other errors pass unchanged.
pub fn name_timeout(e: std::io::Error, stalled: impl FnOnce() -> String) -> std::io::Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            std::io::Error::new(std::io::ErrorKind::TimedOut, stalled())
        }
        _ => e,
    }
}

/// Seconds, as timeouts are shown: `60`, `0.2`.
pub fn seconds(d: Option<std::time::Duration>) -> String {
    d.map_or_else(|| "ever".into(), |d| format!("{}", d.as_secs_f64()))
}

#[cfg(test)]
mod chain_tests {
    /// An error that quotes its cause and names it as its source (as thiserror's
    /// `#[error("VM stream: {0}")] Stream(#[from] ...)` does).
    #[derive(Debug)]
    struct Quoting(std::io::Error);

    impl std::fmt::Display for Quoting {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "VM stream: {}", self.0)
        }
    }

    impl std::error::Error for Quoting {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_quoted_by_its_error_is_printed_once() {
        let io = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the stream ended");
        let err = anyhow::Error::from(Quoting(io)).context("cannot restore x.snap");
        assert_eq!(
            format!("{err:#}"),
            "cannot restore x.snap: VM stream: the stream ended: the stream ended",
            "what {{:#}} prints"
        );
        assert_eq!(
            super::error_chain(&err),
            "cannot restore x.snap: VM stream: the stream ended"
        );
        // Causes that are not quoted are all kept, in order.
        let err = anyhow::anyhow!("EOF")
            .context("reading")
            .context("migration to h:1");
        assert_eq!(super::error_chain(&err), "migration to h:1: reading: EOF");
    }
}
