//! Run-time control, xl-like: a UNIX socket per kumo process (mode 0600) that speaks
//! one JSON object per line each way, and the `kumo ctl` client.
//!
//! Requests: `{"cmd":"sched-credit"}` (show), `{"cmd":"sched-credit","tslice_ms":1,
//! "tick_ms":1,"ratelimit_us":0}` (set any of them), `{"cmd":"domain-list"}`,
//! `{"cmd":"domain-set","name":"a","weight":512,"cap":50}`. Replies carry `"ok"`,
//! and either the state or `"error"`. The peer is the local owner, but its bytes are
//! still untrusted: bad JSON or unknown commands get an error reply, never a panic.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::args::OnOff;
pub use crate::spec::control::{
    Accounting, BalloonState, DomainInfo, MigrateRequest, MigrationReply, SchedParams, SchedUpdate,
    SnapshotReport,
};
use crate::spec::control::{DomainList, DomainSetReply, Reply, ReplyValue, Request};
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

/// Longest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;
/// A client that sends nothing is dropped after this.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a running kumo lets the control socket see and change.
pub trait Controlled: Send + Sync {
    fn sched_params(&self) -> SchedParams;
    /// Applies `update` to the running scheduler; the error says which value is out
    /// of which range.
    fn set_sched_params(&self, update: SchedUpdate) -> Result<SchedParams, String>;
    fn domains(&self) -> Vec<DomainInfo>;
    fn set_domain(
        &self,
        name: &str,
        weight: Option<u32>,
        cap: Option<u32>,
    ) -> Result<DomainInfo, String>;
    /// Saves the VM to `path`; with `stop` the VM then ends here. Only a kumo running
    /// one VM has this.
    fn snapshot(&self, _path: &Path, _stop: bool) -> Result<SnapshotReport, String> {
        Err(NO_SINGLE_VM.into())
    }
    /// Moves the VM to another kumo (`kumo --incoming`); see `crate::migrate`.
    fn migrate(&self, _request: &MigrateRequest) -> Result<MigrationReply, String> {
        Err(NO_SINGLE_VM.into())
    }
    /// The host CPUs the guest of the VM (or of the node's `domain`) is told it may
    /// use (vCPU ballooning), set to `active` first if given.
    fn vcpu_balloon(
        &self,
        _domain: Option<&str>,
        _active: Option<u32>,
    ) -> Result<BalloonState, String> {
        Err("vcpu-balloon needs a kumo running a VM or a node (started with --ctl-socket)".into())
    }
}

/// `vcpu-balloon` on one VM: checks `active` against its vCPUs, sets it, and replies
/// with what is in force.
pub fn vcpu_balloon_of(
    control: &hv::placement::VcpuControl,
    active: Option<u32>,
) -> Result<BalloonState, String> {
    let vcpus = u32::try_from(control.vcpus()).unwrap_or(u32::MAX);
    if let Some(n) = active {
        if !(1..=vcpus).contains(&n) {
            return Err(format!(
                "vcpu-balloon --active {n}: the VM has {vcpus} vCPUs (give 1 to {vcpus})"
            ));
        }
        control.host_cpus().set(n);
    }
    Ok(BalloonState {
        active: control.host_cpus().count(),
        vcpus,
    })
}

const NO_SINGLE_VM: &str =
    "snapshot and migrate need a kumo running one VM (started with --ctl-socket)";

/// Answers one request line.
pub fn answer(target: &dyn Controlled, line: &str) -> Reply<ReplyValue> {
    let request: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => return Reply::of(Err(format!("bad request: {e}"))),
    };
    Reply::of(match request {
        Request::SchedCredit {
            tslice_ms: None,
            tick_ms: None,
            ratelimit_us: None,
            accounting: None,
            directed_yield: None,
        } => Ok(ReplyValue::Sched(target.sched_params())),
        Request::SchedCredit {
            tslice_ms,
            tick_ms,
            ratelimit_us,
            accounting,
            directed_yield,
        } => target
            .set_sched_params(SchedUpdate {
                tslice_ms,
                tick_ms,
                ratelimit_us,
                accounting,
                directed_yield,
            })
            .map(ReplyValue::Sched),
        Request::DomainList {} => Ok(ReplyValue::Domains(DomainList {
            domains: target.domains(),
        })),
        Request::DomainSet { name, weight, cap } => target
            .set_domain(&name, weight, cap)
            .map(|domain| ReplyValue::Domain(DomainSetReply { domain })),
        Request::Snapshot { path, stop } => target.snapshot(&path, stop).map(ReplyValue::Snapshot),
        Request::Migrate(request) => target
            .migrate(&request)
            .map(|m| ReplyValue::Migrated(Box::new(m))),
        Request::VcpuBalloon { domain, active } => target
            .vcpu_balloon(domain.as_deref(), active)
            .map(ReplyValue::Balloon),
    })
}

/// Binds a socket that only its owner can reach from the moment it appears at
/// `path`: it is bound under a temporary name beside `path`, restricted to
/// mode 0600 and then renamed into place, so no one can connect (and no one
/// watching for `path` can see it) while it is still open to all.
fn bind_private(path: &Path) -> Result<UnixListener> {
    let name = path
        .file_name()
        .with_context(|| format!("{} is not a socket path", path.display()))?;
    let mut hidden = std::ffi::OsString::from(".");
    hidden.push(name);
    hidden.push(format!(".{}.tmp", std::process::id()));
    let staging = path.with_file_name(hidden);
    remove_stale_socket(&staging)?;
    let listener = UnixListener::bind(&staging)
        .with_context(|| format!("cannot create control socket {}", path.display()))?;
    let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("cannot restrict {} to its owner", path.display()))
        .and_then(|()| {
            std::fs::rename(&staging, path)
                .with_context(|| format!("cannot create control socket {}", path.display()))
        });
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&staging);
        return Err(e);
    }
    Ok(listener)
}

/// Removes what is at `path` only if kumo can prove it a stale socket (a crashed
/// kumo's): a socket whose connections are refused. Nothing there is fine; anything
/// else (a regular file, a directory, a link, a socket someone listens on or kumo may
/// not reach) is refused and left alone.
pub fn remove_stale_socket(path: &Path) -> Result<()> {
    let shown = path.display();
    let meta = match path.symlink_metadata() {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => bail!("cannot inspect {shown}: {e}"),
    };
    if !meta.file_type().is_socket() {
        bail!("{shown} exists and is not a socket: not removing it");
    }
    match UnixStream::connect(path) {
        Ok(_) => bail!("{shown} is in use by another kumo"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)
            .map_err(|e| anyhow::anyhow!("cannot remove stale socket {shown}: {e}")),
        Err(e) => bail!("{shown} is a socket kumo cannot tell is stale ({e}): not removing it"),
    }
}

/// The listening socket; removed when dropped.
pub struct Server {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `path` (mode 0600) and serves `target` from a thread (`ctl`), which
    /// first runs `setup` and keeps what it returns while it serves (e.g. its
    /// membership of domain 0).
    pub fn start<K: Send + 'static>(
        path: &Path,
        target: Arc<dyn Controlled>,
        setup: impl FnOnce() -> K + Send + 'static,
    ) -> Result<Server> {
        remove_stale_socket(path)?;
        let listener = bind_private(path)?;
        crate::signals::track_socket(path.to_path_buf());
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ctl".into())
            .spawn(move || {
                let _kept = setup();
                hv::seccomp::apply_or_exit(hv::seccomp::ThreadKind::Api);
                serve(&listener, target.as_ref(), &thread_stop)
            })?;
        Ok(Server {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The thread sleeps in accept(): a connection of our own wakes it to see `stop`.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
        crate::signals::untrack_socket(&self.path);
    }
}

/// Accepts clients one at a time (control traffic is a few requests per run). It
/// sleeps in accept() in between: the thread belongs to domain 0, and a thread that
/// woke up to poll would be scheduled (and charged) for nothing.
fn serve(listener: &UnixListener, target: &dyn Controlled, stop: &AtomicBool) {
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, _)) => {
                if let Err(e) = serve_client(stream, target) {
                    tracing::debug!("control client: {e}");
                }
            }
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn serve_client(stream: UnixStream, target: &dyn Controlled) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IDLE_TIMEOUT))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream.take(MAX_REQUEST));
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let reply = if line.ends_with('\n') {
            answer(target, line.trim())
        } else {
            Reply::of(Err("request too long or not newline-terminated".to_string()))
        };
        writeln!(writer, "{}", serde_json::to_string(&reply)?)?;
    }
}

/// Sends one request and returns the reply's value (the `kumo ctl` side).
pub fn request(socket: &Path, request: &Request) -> Result<ReplyValue> {
    request_waiting(socket, request, Some(IDLE_TIMEOUT))
}

/// As [`request`], waiting up to `timeout` for the reply (`None`: as long as it
/// takes, for snapshots and migrations).
pub fn request_waiting(
    socket: &Path,
    request: &Request,
    timeout: Option<Duration>,
) -> Result<ReplyValue> {
    let stream = UnixStream::connect(socket).with_context(|| {
        format!(
            "cannot connect to {} (is a kumo node running there?)",
            socket.display()
        )
    })?;
    stream.set_read_timeout(timeout)?;
    let mut writer = stream.try_clone()?;
    writeln!(writer, "{}", serde_json::to_string(request)?)?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).map_err(|e| {
        crate::output::name_timeout(e, || {
            format!(
                "the kumo at {} sent no reply within {} s",
                socket.display(),
                crate::output::seconds(timeout)
            )
        })
    })?;
    let parsed: Reply<ReplyValue> = serde_json::from_str(&reply)
        .with_context(|| format!("bad reply from {}: {reply:?}", socket.display()))?;
    match parsed {
        Reply {
            ok: true,
            value: Some(value),
            ..
        } => Ok(value),
        Reply { ok: true, .. } => bail!("bad reply from {}: {reply:?}", socket.display()),
        Reply { error, .. } => bail!(
            "{}",
            error.as_deref().unwrap_or("the node refused the request")
        ),
    }
}

/// `kumo ctl`: one request, its reply printed.
pub fn run_ctl(args: &CtlArgs) -> Result<u8> {
    let req = match &args.command {
        CtlCommand::SchedCredit {
            tslice_ms,
            tick_ms,
            ratelimit_us,
            accounting,
            directed_yield,
        } => Request::SchedCredit {
            tslice_ms: *tslice_ms,
            tick_ms: *tick_ms,
            ratelimit_us: *ratelimit_us,
            accounting: accounting.map(Accounting::from),
            directed_yield: directed_yield.map(OnOff::is_on),
        },
        CtlCommand::Domain(DomainCommand::List) => Request::DomainList {},
        CtlCommand::Domain(DomainCommand::Set { name, weight, cap }) => {
            if weight.is_none() && cap.is_none() {
                bail!("domain set {name}: give --weight and/or --cap");
            }
            Request::DomainSet {
                name: name.clone(),
                weight: *weight,
                cap: *cap,
            }
        }
        CtlCommand::Snapshot { path, stop } => {
            // The server resolves the path in its own working directory: make it ours.
            let path = std::path::absolute(path)
                .with_context(|| format!("bad snapshot path {}", path.display()))?;
            Request::Snapshot { path, stop: *stop }
        }
        CtlCommand::Migrate {
            target,
            to,
            domain,
            token_file,
            max_downtime_ms,
            ack_timeout_ms,
            stop_and_copy,
        } => {
            let target = match (target, to) {
                (Some(target), None) | (None, Some(target)) => target,
                (Some(_), Some(_)) => bail!("migrate: give the destination once (TARGET or --to)"),
                (None, None) => bail!("migrate: give the destination, tcp:HOST:PORT (or --to)"),
            };
            let token_file = token_file
                .as_ref()
                .map(std::path::absolute)
                .transpose()
                .context("bad --token-file path")?;
            Request::Migrate(MigrateRequest {
                target: target.clone(),
                token_file,
                max_downtime_ms: *max_downtime_ms,
                ack_timeout_ms: *ack_timeout_ms,
                stop_and_copy: *stop_and_copy,
                domain: domain.clone(),
            })
        }
        CtlCommand::VcpuBalloon { domain, active } => Request::VcpuBalloon {
            domain: domain.clone(),
            active: *active,
        },
    };
    // Snapshots and migrations take as long as they take (a migration waits up to
    // its acknowledgement timeout per round): no idle limit on their reply.
    let long = matches!(
        args.command,
        CtlCommand::Snapshot { .. } | CtlCommand::Migrate { .. }
    );
    let reply = request_waiting(&args.socket, &req, (!long).then_some(IDLE_TIMEOUT))?;
    if args.json {
        crate::output::json_line(&Reply::of(Ok(reply)));
        return Ok(0);
    }
    match reply {
        ReplyValue::Sched(p) => crate::outln!(
            "credit: tslice {:?} ms, tick {:?} ms, ratelimit {} us, accounting {}, directed yield {}",
            p.tslice_ms,
            p.tick_ms,
            p.ratelimit_us,
            match p.accounting {
                Accounting::Exact => "exact",
                Accounting::Tick => "tick",
            },
            if p.directed_yield { "on" } else { "off" }
        ),
        ReplyValue::Domains(list) => {
            crate::outln!(
                "{:<12} {:>6} {:>4} {:>5} {:>9}",
                "domain",
                "weight",
                "cap",
                "vCPUs",
                "cpu (s)"
            );
            for d in &list.domains {
                crate::outln!(
                    "{:<12} {:>6} {:>4} {:>5} {:>9.3}",
                    d.domain,
                    d.weight,
                    d.cap,
                    d.vcpus,
                    d.cpu_s
                );
            }
        }
        ReplyValue::Snapshot(s) => crate::outln!(
            "snapshot {}: {} pages, {} bytes, VM paused {:.1} ms{}",
            s.path.display(),
            s.pages,
            s.bytes,
            s.paused_ms,
            if s.stopped { "; the VM stopped" } else { "" }
        ),
        ReplyValue::Migrated(m) => print_migration(&m),
        ReplyValue::Balloon(b) => {
            crate::outln!("vcpu-balloon: {} host CPUs for {} vCPUs", b.active, b.vcpus)
        }
        ReplyValue::Domain(DomainSetReply { domain: d }) => {
            crate::outln!("{}: weight {}, cap {}", d.domain, d.weight, d.cap);
        }
    }
    Ok(0)
}

/// The default control socket of this process.
pub fn default_socket_path() -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("kumo-{}.sock", std::process::id()))
}

/// `kumo ctl ... migrate` without --json.
pub fn print_migration(reply: &MigrationReply) {
    let m = &reply.report;
    let rounds = m.rounds.len();
    let domain = reply
        .domain
        .as_deref()
        .map_or(String::new(), |d| format!("domain '{d}' "));
    crate::outln!(
        "migrated {domain}to {}: total {:.1} ms, downtime {:.1} ms, {} live round{} + final {} pages, {:.1} MiB sent",
        reply.target,
        m.total_ms,
        m.downtime_ms,
        rounds,
        if rounds == 1 { "" } else { "s" },
        m.final_pages,
        m.total_bytes as f64 / (1024.0 * 1024.0),
    );
}

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The node's control socket (printed by `kumo node` at start).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,

    /// Print the node's JSON reply instead of text.
    #[arg(long)]
    pub json: bool,

    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Show the credit scheduler's parameters, or set some of them.
    SchedCredit {
        /// Time slice in milliseconds.
        #[arg(long, value_name = "MS")]
        tslice_ms: Option<f64>,
        /// Accounting tick in milliseconds.
        #[arg(long, value_name = "MS")]
        tick_ms: Option<f64>,
        /// Minimum run time before preemption in microseconds (0 = off).
        #[arg(long, value_name = "US")]
        ratelimit_us: Option<u64>,
        /// exact, or tick (Xen 3.4: each tick debits a whole tick from the vCPU it
        /// finds running; no ratelimit).
        #[arg(long, value_name = "MODE")]
        accounting: Option<sched::Accounting>,
        /// on: a vCPU blocked at a barrier (paravirtual wait page) BOOSTs its
        /// domain's queued vCPUs that have not arrived; off (default): ignore it.
        #[arg(long, value_name = "on|off")]
        directed_yield: Option<OnOff>,
    },
    /// Domains of the node.
    #[command(subcommand)]
    Domain(DomainCommand),
    /// vCPU ballooning (`kumo --vcpu-balloon`): show how many host CPUs the running
    /// VM's guest is told it has, or change it; a ballooning guest then runs its
    /// team on that many vCPUs from its next barrier and parks the others.
    VcpuBalloon {
        /// The node's domain (a node has several VMs; a single VM needs none).
        #[arg(long, value_name = "NAME")]
        domain: Option<String>,
        /// Host CPUs for the guest (1 up to its vCPU count).
        #[arg(long, value_name = "N")]
        active: Option<u32>,
    },
    /// Save the running VM to a file (`kumo --restore PATH` runs it again).
    Snapshot {
        /// The snapshot file to write (mode 0600).
        path: PathBuf,
        /// End the VM once it is saved (otherwise it runs on).
        #[arg(long)]
        stop: bool,
    },
    /// Move the running VM to another kumo started with `--incoming`; the source
    /// ends only once the destination runs it.
    Migrate {
        /// The destination, tcp:HOST:PORT.
        target: Option<String>,
        /// The destination (the same as TARGET).
        #[arg(long, value_name = "ADDR")]
        to: Option<String>,
        /// The node's domain to move to the node whose domain waits at the
        /// destination (`incoming = "tcp:HOST:PORT"` in its node file).
        #[arg(long, value_name = "NAME")]
        domain: Option<String>,
        /// A file holding the secret both ends share.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Iterate copy rounds until the last one would take at most this long.
        #[arg(long, value_name = "MS")]
        max_downtime_ms: Option<u64>,
        /// Give up, the VM running on here, if the destination does not acknowledge
        /// a copy round within this long (default 30000).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
        ack_timeout_ms: Option<u64>,
        /// Pause the VM first and copy it once (non-live): the downtime is the whole
        /// transfer.
        #[arg(long, conflicts_with = "max_downtime_ms")]
        stop_and_copy: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum DomainCommand {
    /// Every domain with its weight, cap and CPU time so far.
    List,
    /// Change a domain's weight and/or cap.
    Set {
        /// The domain's name.
        name: String,
        #[arg(long, value_name = "W")]
        weight: Option<u32>,
        /// Percent of one host CPU; 0 = no cap.
        #[arg(long, value_name = "C")]
        cap: Option<u32>,
    },
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use serde_json::{Value, json};

    /// The reply as the client reads it.
    fn answer_json(target: &dyn Controlled, line: &str) -> Value {
        serde_json::to_value(answer(target, line)).unwrap()
    }

    struct Fake {
        params: Mutex<SchedParams>,
        weight: Mutex<u32>,
    }

    impl Controlled for Fake {
        fn sched_params(&self) -> SchedParams {
            *self.params.lock().unwrap()
        }
        fn set_sched_params(&self, u: SchedUpdate) -> Result<SchedParams, String> {
            let mut p = self.params.lock().unwrap();
            if let Some(t) = u.tslice_ms {
                if t < 0.1 {
                    return Err("tslice_ms 0.01 is outside 0.1..=1000".into());
                }
                p.tslice_ms = t;
            }
            if let Some(r) = u.ratelimit_us {
                p.ratelimit_us = r;
            }
            Ok(*p)
        }
        fn domains(&self) -> Vec<DomainInfo> {
            vec![DomainInfo {
                domain: "a".into(),
                weight: *self.weight.lock().unwrap(),
                cap: 0,
                vcpus: 1,
                cpu_s: 0.5,
            }]
        }
        fn set_domain(
            &self,
            name: &str,
            w: Option<u32>,
            _c: Option<u32>,
        ) -> Result<DomainInfo, String> {
            if name != "a" {
                return Err(format!("no domain '{name}'"));
            }
            if let Some(w) = w {
                *self.weight.lock().unwrap() = w;
            }
            Ok(self.domains().remove(0))
        }
    }

    fn fake() -> Arc<Fake> {
        Arc::new(Fake {
            params: Mutex::new(SchedParams {
                tslice_ms: 30.0,
                tick_ms: 10.0,
                ratelimit_us: 1000,
                accounting: Accounting::Exact,
                directed_yield: false,
            }),
            weight: Mutex::new(256),
        })
    }

    #[test]
    fn requests_are_answered_and_bad_ones_refused() {
        let f = fake();
        let show = answer_json(f.as_ref(), r#"{"cmd":"sched-credit"}"#);
        assert_eq!(show["ok"], true);
        assert_eq!(show["tslice_ms"], 30.0);
        let set = answer_json(
            f.as_ref(),
            r#"{"cmd":"sched-credit","tslice_ms":1,"ratelimit_us":0}"#,
        );
        assert_eq!(
            (set["ok"].clone(), set["tslice_ms"].clone()),
            (json!(true), json!(1.0))
        );
        assert_eq!(f.sched_params().ratelimit_us, 0);
        let out_of_range = answer_json(f.as_ref(), r#"{"cmd":"sched-credit","tslice_ms":0.01}"#);
        assert_eq!(out_of_range["ok"], false);
        assert!(
            out_of_range["error"]
                .as_str()
                .unwrap()
                .contains("0.1..=1000")
        );
        let set = answer_json(
            f.as_ref(),
            r#"{"cmd":"domain-set","name":"a","weight":512}"#,
        );
        assert_eq!(set["domain"]["weight"], 512);
        // A node has no single VM to save or move.
        let snap = answer_json(f.as_ref(), r#"{"cmd":"snapshot","path":"/tmp/x"}"#);
        assert_eq!(snap["ok"], false);
        assert!(snap["error"].as_str().unwrap().contains("--ctl-socket"));
        let bad = answer_json(f.as_ref(), r#"{"cmd":"migrate","target":"tcp:h:1","x":1}"#);
        assert!(bad["error"].as_str().unwrap().starts_with("bad request"));
        let missing = answer_json(f.as_ref(), r#"{"cmd":"domain-set","name":"zz"}"#);
        assert_eq!(missing["error"], "no domain 'zz'");
        for bad in [
            "",
            "{",
            "[]",
            r#"{"cmd":"reboot"}"#,
            r#"{"cmd":"domain-list","x":1}"#,
        ] {
            let reply = answer_json(f.as_ref(), bad);
            assert_eq!(reply["ok"], false, "{bad}");
            assert!(
                reply["error"].as_str().unwrap().starts_with("bad request"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_server_that_never_replies_is_named_not_eagain() {
        let dir = std::env::temp_dir().join(format!("kumo-ctl-mute-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("mute.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let held = std::thread::spawn(move || listener.accept().map(|(s, _)| s));
        let err = request_waiting(
            &path,
            &Request::DomainList {},
            Some(Duration::from_millis(200)),
        )
        .unwrap_err();
        let text = crate::output::error_chain(&err);
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("no reply within 0.2 s"), "{text}");
        assert!(!text.contains("os error 11"), "{text}");
        drop(held.join());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn only_a_socket_proven_stale_is_replaced() {
        let dir = std::env::temp_dir().join(format!("kumo-ctl-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl.sock");
        // A regular file is not a socket: refused and left alone.
        std::fs::write(&path, b"precious").unwrap();
        let err = Server::start(&path, fake(), || ()).err().expect("refused");
        assert!(format!("{err:#}").contains("not a socket"), "{err:#}");
        assert_eq!(std::fs::read(&path).unwrap(), b"precious");
        std::fs::remove_file(&path).unwrap();
        // A directory neither.
        std::fs::create_dir(&path).unwrap();
        assert!(Server::start(&path, fake(), || ()).is_err());
        assert!(path.is_dir());
        std::fs::remove_dir(&path).unwrap();
        // A socket nobody listens on (a crashed kumo's) is replaced.
        drop(UnixListener::bind(&path).unwrap());
        let server = Server::start(&path, fake(), || ()).unwrap();
        let reply = request(&path, &Request::DomainList {}).unwrap();
        let ReplyValue::Domains(list) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(list.domains[0].domain, "a");
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_socket_is_private_and_serves_requests() {
        let dir = std::env::temp_dir().join(format!("kumo-ctl-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl.sock");
        let f = fake();
        let server = Server::start(&path, f.clone(), || ()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let reply = request(&path, &Request::DomainList {}).unwrap();
        let ReplyValue::Domains(list) = reply else {
            panic!("{reply:?}")
        };
        assert_eq!(list.domains[0].domain, "a");
        let set_b = Request::DomainSet {
            name: "b".into(),
            weight: None,
            cap: None,
        };
        let err = request(&path, &set_b).unwrap_err();
        assert_eq!(err.to_string(), "no domain 'b'");
        // A second server on a live socket is refused; a dropped one cleans up.
        assert!(Server::start(&path, f.clone(), || ()).is_err());
        drop(server);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
