//! The processes, scratch directories and ports of experiments that run more than
//! one kumo: a child kumo killed if the experiment ends first, a directory removed
//! with the run, and a port for a node to listen on.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A child process killed (if still running) when dropped, its stderr in a file.
pub struct Process {
    pub(super) child: Child,
    pub(super) name: String,
    pub stderr: PathBuf,
}

impl Process {
    pub fn start(name: &str, dir: &Path, args: &[String]) -> Result<Process> {
        Process::spawn(name, dir, args, Stdio::null())
    }

    /// As [`Process::start`], its standard output written to `stdout`.
    pub fn start_capturing(
        name: &str,
        dir: &Path,
        args: &[String],
        stdout: &Path,
    ) -> Result<Process> {
        let file = std::fs::File::create(stdout)
            .with_context(|| format!("creating {}", stdout.display()))?;
        Process::spawn(name, dir, args, file.into())
    }

    fn spawn(name: &str, dir: &Path, args: &[String], stdout: Stdio) -> Result<Process> {
        let exe = std::env::current_exe().context("finding kumo's own executable")?;
        let stderr = dir.join(format!("{name}.err"));
        let child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Process {
            child,
            name: name.to_string(),
            stderr,
        })
    }

    /// Waits for the process to end while the job runs (until `job_over`), then up to
    /// `patience` more; a problem unless it ended with status 0. The patience counts
    /// from the job's end: without a migration this is called as the job starts, and
    /// at 30/10 ms the job takes most of a minute (a patience counted from the call
    /// killed the moving VM of slow runs, and the node's ranks then timed out).
    pub fn finish(&mut self, job_over: &AtomicBool, patience: Duration) -> Option<String> {
        let mut deadline = None;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return None,
                Ok(Some(status)) => {
                    return Some(format!("{} {status}: {}", self.name, self.last_line()));
                }
                Ok(None) => {
                    if deadline.is_none() && job_over.load(Ordering::SeqCst) {
                        deadline = Some(Instant::now() + patience);
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Some(format!(
                            "{} did not end within {:.1} s of the job's end",
                            self.name,
                            patience.as_secs_f64()
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Some(format!("{}: {e}", self.name)),
            }
        }
    }

    /// Asks the process to stop (SIGTERM) and waits up to `patience` for it: a problem
    /// unless it ended with status 0 or by the request (a node then ends the domains
    /// still waiting for a VM, reports what ran, and exits with 128 + SIGTERM).
    pub fn stop(&mut self, patience: Duration) -> Option<String> {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with our own child's pid (not reaped before the wait
            // below, so not reused) and a valid signal.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + patience;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return None,
                Ok(Some(status)) if status.code() == Some(128 + libc::SIGTERM) => return None,
                Ok(Some(status)) => {
                    return Some(format!("{} {status}: {}", self.name, self.last_line()));
                }
                Ok(None) if Instant::now() >= deadline => {
                    return Some(format!(
                        "{} did not stop within {:.1} s",
                        self.name,
                        patience.as_secs_f64()
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => return Some(format!("{}: {e}", self.name)),
            }
        }
    }

    /// Whether it has ended (its status is kept for [`Process::state`]).
    pub fn ended(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// What became of it so far, for an error elsewhere that it may explain: its exit
    /// status and last line, or that it still runs (with its last line, if any).
    pub fn state(&mut self) -> String {
        let line = self.last_line();
        let said = if line.is_empty() {
            String::new()
        } else {
            format!(": {line}")
        };
        match self.child.try_wait() {
            Ok(Some(status)) => format!("{} ended ({status}){said}", self.name),
            Ok(None) => format!("{} still ran{said}", self.name),
            Err(e) => format!("{}: {e}", self.name),
        }
    }

    fn last_line(&self) -> String {
        std::fs::read_to_string(&self.stderr)
            .ok()
            .and_then(|text| text.lines().last().map(str::to_string))
            .unwrap_or_default()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// A run's directory (sockets, token, logs), removed with it.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn new() -> Result<RunDir> {
        static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "kumo-experiment-{}-{}",
            std::process::id(),
            RUNS.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(RunDir(dir))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port on 127.0.0.1 that is free now, for a node to listen on later. Taken below
/// Linux's ephemeral range (32768-60999 by default): a port the kernel picked (bind
/// to port 0) could be handed out again, in the meantime, as the local port of any
/// outgoing connection on the host, and the node's bind would then fail.
pub fn free_port() -> Result<u16> {
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 12_000;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    // Start where this process's earlier calls left off, spread by its pid so that
    // concurrent experiments start apart.
    let start = std::process::id().wrapping_mul(2_654_435_761) % u32::from(COUNT);
    for _ in 0..COUNT {
        let k = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % u32::from(COUNT);
        let port = FIRST + k as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free port on 127.0.0.1 in {FIRST}..{}", FIRST + COUNT)
}
