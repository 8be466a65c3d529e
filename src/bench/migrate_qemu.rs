//! QEMU's live migration of the same guest, for `kumo bench migrate --qemu`: kumo's
//! embedded guest booted by QEMU through PVH (`-kernel`, microvm), a second QEMU
//! waiting with `-incoming tcp:` on loopback, QMP `migrate` on the source, and
//! `total-time` and `downtime` from `query-migrate` once it completes.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A migration that has not completed after this long has failed.
const LIMIT: Duration = Duration::from_secs(120);

/// What `query-migrate` reported.
pub struct QemuMigration {
    pub total_ms: f64,
    pub downtime_ms: f64,
    pub transferred_bytes: u64,
}

/// The QEMU processes and their scratch directory, ended and removed on drop.
struct Pair {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Drop for Pair {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// QEMU booting `guest`; its serial console goes to the file `console`, if given.
fn qemu(
    guest: &Path,
    vcpus: u32,
    memory_mib: u64,
    cmdline: &str,
    tsc_khz: u32,
    console: Option<&Path>,
) -> Command {
    let serial = console.map_or("null".to_string(), |c| format!("file:{}", c.display()));
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(["-M", "microvm", "-accel", "kvm"])
        .arg("-cpu")
        .arg(format!(
            "host,-arch-capabilities,+invtsc,tsc-frequency={}",
            u64::from(tsc_khz) * 1000
        ))
        .args(["-smp", &vcpus.to_string(), "-m", &memory_mib.to_string()])
        .args(["-nographic", "-nodefaults", "-no-user-config", "-no-reboot"])
        .args(["-serial", &serial])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"])
        .arg("-kernel")
        .arg(guest)
        .arg("-append")
        .arg(cmdline)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// One QMP connection.
struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    fn connect(path: &Path) -> Result<Qmp> {
        let start = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(_) if start.elapsed() < Duration::from_secs(30) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e).context("QEMU's QMP socket never came up"),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
        };
        qmp.line()?; // the greeting
        let _: IgnoredAny = qmp.execute("qmp_capabilities", &NoArguments {})?;
        Ok(qmp)
    }

    fn line(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("QEMU closed its QMP socket");
        }
        serde_json::from_str(&line).context("QEMU sent something that is not JSON")
    }

    /// Runs `command`; its `return` (events met meanwhile are skipped).
    fn execute<A: Serialize, R: DeserializeOwned>(
        &mut self,
        command: &str,
        arguments: &A,
    ) -> Result<R> {
        let request = QmpCommand {
            execute: command,
            arguments,
        };
        writeln!(self.writer, "{}", serde_json::to_string(&request)?)?;
        loop {
            let reply = self.line()?;
            if let Some(error) = reply.get("error") {
                bail!("QMP {command}: {error}");
            }
            if let Some(value) = reply.get("return") {
                return R::deserialize(value)
                    .with_context(|| format!("QMP {command} returned {value}"));
            }
        }
    }
}

/// Boots `cmdline` on QEMU, migrates it after `after` to a second QEMU on loopback
/// with a `max_downtime` target, and reports what QEMU measured.
pub fn migrate_once(
    kvm_device: &Path,
    vcpus: u32,
    memory_mib: u64,
    cmdline: &str,
    after: Duration,
    max_downtime: Duration,
) -> Result<QemuMigration> {
    let dir = std::env::temp_dir().join(format!(
        "kumo-qemu-migrate-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut pair = Pair {
        dir: dir.clone(),
        children: Vec::new(),
    };
    let guest = dir.join("guest.elf");
    std::fs::write(&guest, kumo_vmm::guest::EMBEDDED_GUEST)?;
    // A migratable `+invtsc` CPU needs its TSC rate stated.
    let khz = hv::host_tsc_khz(kvm_device)?;
    // For the destination QEMU to listen on (below the ephemeral range: see the helper).
    let port = kumo_lab::experiment::process::free_port()?;
    let qmp_arg = |name: &str| format!("unix:{},server=on,wait=off", dir.join(name).display());
    let console = dir.join("src.console");
    let start_qemu = |extra: &[String], console: Option<&Path>| -> Result<Child> {
        qemu(&guest, vcpus, memory_mib, cmdline, khz, console)
            .args(extra)
            .spawn()
            .context("cannot start qemu-system-x86_64 (apt-get install qemu-system-x86)")
    };
    pair.children.push(start_qemu(
        &[
            "-qmp".into(),
            qmp_arg("dst.qmp"),
            "-incoming".into(),
            format!("tcp:127.0.0.1:{port}"),
        ],
        None,
    )?);
    let mut dst = Qmp::connect(&dir.join("dst.qmp"))?;
    pair.children.push(start_qemu(
        &["-qmp".into(), qmp_arg("src.qmp")],
        Some(&console),
    )?);
    let mut src = Qmp::connect(&dir.join("src.qmp"))?;
    // `after` counts from the guest's start, as on kumo's side.
    wait_for_boot(|| Ok(std::fs::read(&console).unwrap_or_default()))?;
    std::thread::sleep(after);
    let _: IgnoredAny = src.execute(
        "migrate-set-parameters",
        &MigrateParameters {
            downtime_limit: max_downtime.as_millis() as u64,
            max_bandwidth: 10u64 << 30,
        },
    )?;
    let _: IgnoredAny = src.execute(
        "migrate",
        &MigrateArguments {
            uri: format!("tcp:127.0.0.1:{port}"),
        },
    )?;
    let started = Instant::now();
    let info = loop {
        let info: MigrationInfo = src.execute("query-migrate", &NoArguments {})?;
        match info.status.as_deref() {
            Some("completed") => break info,
            Some("failed" | "cancelled") => bail!("QEMU's migration failed: {info:?}"),
            _ if started.elapsed() > LIMIT => bail!("QEMU's migration did not complete"),
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    // The destination runs the guest on (it finishes loading just after the source
    // says completed).
    loop {
        let status: StatusInfo = match dst.execute("query-status", &NoArguments {}) {
            Ok(status) => status,
            // Gone already: the guest ran to its end there (its debug exit ends QEMU).
            Err(_) if pair.children[0].try_wait()?.is_some() => break,
            Err(e) => return Err(e),
        };
        if status.running {
            break;
        }
        if started.elapsed() > LIMIT {
            bail!("QEMU's destination does not run the guest: {status:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(QemuMigration {
        total_ms: info.total_time.context("query-migrate has no total-time")?,
        downtime_ms: info.downtime.context("query-migrate has no downtime")?,
        transferred_bytes: info.ram.map_or(0, |r| r.transferred),
    })
}

/// A QMP command line.
#[derive(Serialize)]
struct QmpCommand<'a, A> {
    execute: &'a str,
    arguments: &'a A,
}

/// `{}`: a command without arguments.
#[derive(Serialize)]
struct NoArguments {}

/// `migrate-set-parameters`' arguments (ms, bytes per second).
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct MigrateParameters {
    downtime_limit: u64,
    max_bandwidth: u64,
}

/// `migrate`'s arguments.
#[derive(Serialize)]
struct MigrateArguments {
    uri: String,
}

/// What `query-migrate` returns that we read (ms, bytes).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MigrationInfo {
    status: Option<String>,
    total_time: Option<f64>,
    downtime: Option<f64>,
    ram: Option<RamInfo>,
}

#[derive(Debug, Deserialize)]
struct RamInfo {
    transferred: u64,
}

/// What `query-status` returns that we read.
#[derive(Debug, Deserialize)]
struct StatusInfo {
    running: bool,
}

/// Waits until the guest's console (as `read` gives it so far) says its ring 3 has
/// started (`@kumo boot`): `--after-ms` counts from there on kumo and on QEMU alike,
/// whose boots take different times.
pub(crate) fn wait_for_boot(read: impl Fn() -> Result<Vec<u8>>) -> Result<()> {
    let started = Instant::now();
    while !String::from_utf8_lossy(&read()?).contains("@kumo boot") {
        if started.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("the guest did not start within 120 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}
