//! Shared helpers for kumo's integration tests: run the real binary, guard against hangs,
//! and insist on KVM in CI.
#![allow(dead_code)] // each test crate uses a different subset

#[allow(unused_imports)] // not every test crate boots a VM
pub use hv::testing::kvm_available;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Tests that take the host's CPUs (a node under the credit scheduler, an MPI job of
/// several VMs, an experiment) take turns across every module of a test binary, as
/// they did when each file was a binary of its own.
pub static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes this binary's turn (see `ONE_AT_A_TIME`); a test that failed while holding it
/// does not stop the others.
pub fn take_turn() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// A hang guard, not a performance threshold: far above any healthy run on 2 cores.
const HANG_LIMIT: Duration = Duration::from_secs(300);

pub fn kumo_bin() -> &'static str {
    env!("CARGO_BIN_EXE_kumo")
}

/// A `kumo` command whose default API socket (`$XDG_RUNTIME_DIR/kumo-<pid>.sock`) is
/// in this process's scratch directory, so a kumo a test kills leaves nothing in /tmp
/// (a run of the tests used to leave one socket there).
pub fn kumo_command() -> Command {
    let mut command = Command::new(kumo_bin());
    command.env("XDG_RUNTIME_DIR", scratch_dir());
    command
}

pub fn kumo(args: &[&str]) -> Output {
    run_with_hang_guard(kumo_command().args(args))
}

/// Runs a command to completion; a process still running after HANG_LIMIT is killed
/// and the test fails, so a hung VM can never hang the suite.
pub fn run_with_hang_guard(cmd: &mut Command) -> Output {
    run_guarded(cmd.stdout(Stdio::piped()))
}

/// Runs kumo with its standard output a pipe whose reader is already gone (as
/// `kumo ... | head -c 0` would leave it): every write to stdout fails with EPIPE.
pub fn kumo_with_stdout_closed(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    run_guarded(kumo_command().args(args).stdout(writer))
}

/// As [`run_with_hang_guard`], with stdout as the caller set it (captured if piped).
fn run_guarded(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let out = child.stdout.take();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || out.map(|mut o| read_all(&mut o)).unwrap_or_default());
    let err_t = std::thread::spawn(move || read_all(&mut err));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > HANG_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} still running after {HANG_LIMIT:?}: hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

fn read_all(r: &mut impl std::io::Read) -> Vec<u8> {
    let mut buf = Vec::new();
    let _ = r.read_to_end(&mut buf);
    buf
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A scratch path unique to this test process and name, in a directory removed when
/// the process exits (a test binary's scratch held ~50 MB of guest images and disks,
/// and every run left one behind).
pub fn scratch(name: &str) -> PathBuf {
    scratch_dir().join(name)
}

/// This test process's scratch directory (see [`scratch`]).
pub fn scratch_dir() -> &'static Path {
    SCRATCH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("kumo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // SAFETY: `remove_scratch` is an `extern "C"` function that takes nothing
        // and only reads `SCRATCH`, which is set before the process can exit.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
}

static SCRATCH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Runs at exit (the harness returns from `main`, or exits 101 on a failure).
extern "C" fn remove_scratch() {
    if let Some(dir) = SCRATCH.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Writes the embedded guest ELF to a scratch file of its own via `kumo --dump-guest`
/// (one per call: tests run in parallel, and one must not rewrite a file another boots).
pub fn dumped_guest() -> PathBuf {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = scratch(&format!("guest-{n}.elf"));
    let out = kumo(&["--dump-guest", path.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "--dump-guest failed: {}",
        text(&out.stderr)
    );
    path
}

/// `kumo node --config CONFIG --json --timeout SECONDS`: it must succeed; its JSON lines.
pub fn node_json(config: &std::path::Path, timeout_s: u32) -> Vec<serde_json::Value> {
    let timeout = timeout_s.to_string();
    let out = kumo(&[
        "node",
        "--config",
        config.to_str().unwrap(),
        "--json",
        "--timeout",
        &timeout,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    json_lines(&out)
}

/// Keys whose values are text by contract even when they are all digits: `fnv`, a
/// hash in hex (docs/json.md, `TEXT_FIELDS` in vmm/src/protocol.rs).
const TEXT_KEYS: &[&str] = &["fnv"];

/// The path (`[2].results[0].time_s`) of every string in `value` that reads as a
/// number (`"45.55"`, `"8"`, `"NaN"`), at any depth.
pub fn numeric_strings(value: &serde_json::Value) -> Vec<String> {
    fn walk(value: &serde_json::Value, path: String, key: Option<&str>, out: &mut Vec<String>) {
        match value {
            serde_json::Value::String(s) => {
                let text = key.is_some_and(|k| TEXT_KEYS.contains(&k));
                if !text && s.trim().parse::<f64>().is_ok() {
                    out.push(format!("{path} = {s:?}"));
                }
            }
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, format!("{path}[{i}]"), key, out);
                }
            }
            serde_json::Value::Object(map) => {
                for (k, v) in map {
                    walk(v, format!("{path}.{k}"), Some(k), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, String::new(), None, &mut out);
    out
}

/// `--json`'s rule: every number is a JSON number, never a string that reads as one.
pub fn assert_numbers_are_numbers(lines: &[serde_json::Value]) {
    assert!(!lines.is_empty(), "no JSON line to check");
    for (i, line) in lines.iter().enumerate() {
        let found = numeric_strings(line);
        assert!(
            found.is_empty(),
            "line {i}: numbers as strings {found:?}: {line}"
        );
    }
}

/// The JSON lines kumo printed.
pub fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect()
}

/// The guest-physical `[start, end)` of a result line's arena (`arena_start`,
/// `arena_end`, hexadecimal).
pub fn arena(result: &serde_json::Value) -> (u64, u64) {
    let hex = |key: &str| {
        let v = result[key]
            .as_str()
            .unwrap_or_else(|| panic!("no {key}: {result}"));
        u64::from_str_radix(v.trim_start_matches("0x"), 16)
            .unwrap_or_else(|e| panic!("{key}: {v}: {e}"))
    };
    (hex("arena_start"), hex("arena_end"))
}

/// A kumo running in the background (pipes drained on threads), finished with
/// [`Background::finish`] under the same hang guard as [`kumo`].
pub struct Background {
    child: std::process::Child,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
}

pub fn kumo_background(args: &[&str]) -> Background {
    kumo_background_with_env(args, &[])
}

/// [`kumo_background`] with environment variables set.
pub fn kumo_background_with_env(args: &[&str], env: &[(&str, &str)]) -> Background {
    let mut child = kumo_command()
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    Background {
        child,
        out: Some(std::thread::spawn(move || read_all(&mut out))),
        err: Some(std::thread::spawn(move || read_all(&mut err))),
    }
}

impl Background {
    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    pub fn finish(mut self) -> Output {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if start.elapsed() > HANG_LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("background kumo still running after {HANG_LIMIT:?}: hung");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            status,
            stdout: self.out.take().unwrap().join().unwrap(),
            stderr: self.err.take().unwrap().join().unwrap(),
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.out.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits (hang guard) until `path` exists: a background kumo's socket is up.
pub fn wait_for_path(path: &std::path::Path) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < HANG_LIMIT,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs kumo and expects it refused: exit status 2 and one stderr line containing
/// `needle` (bad input is named in one line, never a usage screen or a panic).
pub fn assert_refused(args: &[&str], needle: &str) {
    let out = kumo(args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "kumo {args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "kumo {args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "kumo {args:?}: {stderr:?} lacks {needle:?}"
    );
}

/// True if QEMU (the independent peer) is installed. Without it the peer tests are
/// skipped loudly, except in CI (`CI=true`), where .ci/run must have installed it.
pub fn qemu_available() -> bool {
    let found = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .is_ok();
    if !found && std::env::var("CI").as_deref() == Ok("true") {
        panic!("qemu-system-x86_64 is missing but CI=true: .ci/run must install it");
    }
    if !found {
        eprintln!("SKIPPED: qemu-system-x86_64 is not installed");
    }
    found
}

/// QEMU as the peer tests run it: KVM, the host's CPU less CX16 (kumo hides it: ring 0
/// cannot emulate it on kvm_pvm) and arch-capabilities (kvm_pvm refuses it) with an
/// invariant TSC, 256 MiB, no default devices, the serial console on stdout and
/// isa-debug-exit at kumo's debug-exit port. The caller adds machine, devices, kernel.
pub fn qemu(vcpus: u32) -> Command {
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args([
            "-accel",
            "kvm",
            "-cpu",
            "host,-cx16,-arch-capabilities,+invtsc",
        ])
        .args(["-smp", &vcpus.to_string(), "-m", "256"])
        .args([
            "-nographic",
            "-no-reboot",
            "-nodefaults",
            "-serial",
            "stdio",
        ])
        .args(["-device", "isa-debug-exit,iobase=0xf4,iosize=4"]);
    command
}

/// Asserts that the guest's console shows it booted on `cpus` CPUs, verified EP.S with
/// that many threads and ended with status 0.
pub fn assert_ep_s_verified(console: &str, cpus: u32) {
    assert!(
        console.contains(&format!("@kumo boot cpus={cpus} ")),
        "{console}"
    );
    let result = console
        .lines()
        .find(|l| {
            l.starts_with(&format!(
                "@kumo result benchmark=ep class=S threads={cpus} "
            ))
        })
        .unwrap_or_else(|| {
            panic!(
                "no EP.S result:
{console}"
            )
        });
    assert!(result.contains(" verified=true"), "{result}");
    assert!(console.contains("@kumo end status=0"), "{console}");
}

/// The third-party firmware kept beside the repository (`../shared/peers/`, not part of
/// kumo's source), or where `KUMO_PEERS_DIR` says.
pub fn peer_firmware() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("KUMO_PEERS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/peers")
        });
    let fw = dir.join("rust-hypervisor-firmware/hypervisor-fw");
    if fw.is_file() {
        Some(fw)
    } else {
        eprintln!("SKIPPED: {} is not there", fw.display());
        None
    }
}

/// `kumo ARGS` (a `kumo ctl` request), retried while the VM has not started its vCPUs
/// yet (the socket is up a moment before the VM runs).
pub fn ctl_once_running(args: &[&str]) -> Output {
    loop {
        let out = kumo(args);
        if out.status.success() || !text(&out.stderr).contains("not running yet") {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `kumo ctl ... snapshot`, retried while the VM has not started yet.
pub fn snapshot(
    socket: &std::path::Path,
    path: &std::path::Path,
    stop: bool,
) -> std::process::Output {
    let mut args = vec![
        "ctl",
        "--socket",
        socket.to_str().unwrap(),
        "snapshot",
        path.to_str().unwrap(),
    ];
    if stop {
        args.push("--stop");
    }
    ctl_once_running(&args)
}

/// `kumo ctl --socket SOCKET --json migrate WHERE... --token-file TOKEN OPTIONS...`
/// (`WHERE`: a VM's `tcp:HOST:PORT`, or a node's `--domain NAME --to tcp:HOST:PORT`),
/// retried while the VM has not started yet.
pub fn migrate_once_running(
    socket: &std::path::Path,
    to: &[&str],
    token: &std::path::Path,
    options: &[&str],
) -> Output {
    let mut args = vec![
        "ctl",
        "--socket",
        socket.to_str().unwrap(),
        "--json",
        "migrate",
    ];
    args.extend_from_slice(to);
    args.extend_from_slice(&["--token-file", token.to_str().unwrap()]);
    args.extend_from_slice(options);
    ctl_once_running(&args)
}

/// `kumo --npb ep.A --json --ctl-socket SOCKET EXTRA...` in the background, once its
/// socket is up.
pub fn ep_a_source(socket: &std::path::Path, extra: &[&str]) -> Background {
    let mut args = vec![
        "--npb",
        "ep.A",
        "--json",
        "--ctl-socket",
        socket.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let source = kumo_background(&args);
    wait_for_path(socket);
    source
}

/// A run of one EP (of `class`) that ended well: it verified, and the summary is ok.
pub fn assert_ep_verified(out: &Output, class: &str) {
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = json_lines(out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["benchmark"], "ep");
    assert_eq!(lines[0]["class"], class);
    assert_eq!(lines[0]["verified"], true, "{}", lines[0]);
    assert_eq!(lines[1]["ok"], true, "{}", lines[1]);
}
