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
