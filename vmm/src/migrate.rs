//! A single VM that can be saved and moved: its API socket (`--api-socket`),
//! `snapshot` to a file and `kumo --restore`, `migrate` to `kumo --incoming`. The VMM side (pausing, state, the
//! stream) is `hv::migration`; this module adds what the program knows: which NPB
//! benchmarks the guest runs and what its console printed so far, so a restored run
//! is judged like one that never moved.

use std::fs::OpenOptions;
use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hv::migration::Hub;
use hv::migration::stream::Reply;
use hv::{GuestExit, Vm};
use npb::Spec;
use serde::{Deserialize, Serialize};

use crate::api::{self, Controlled, Refused, SchedTarget};
use crate::guest;
use crate::irq::IrqRun;
use crate::rank::RankApp;
use crate::report::{self, EXIT_OK};
use crate::run::{self, HANDED_OFF, RunOptions};
use crate::sched_control::SchedControl;
use crate::spec::control::{
    BalloonState, Counters, MigrateRequest, MigrationReply, RunKind, RunState, SchedParams,
    SchedUpdate, SnapshotReport, VmInfo,
};
use crate::spec::vm::{Guest, VmSpec};

/// What a snapshot or migration stream carries for kumo itself (META's `app`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppState {
    /// Always [`GUEST_NAME`]: other guests cannot be restored by this program yet.
    pub guest: String,
    /// The NPB list, as `--npb` takes it.
    pub npb: String,
    pub vcpus: u32,
    /// Everything the guest wrote to its console so far (results already printed).
    pub console: Vec<u8>,
    /// The credit scheduler's parameters in force, if the VM runs under it: the
    /// destination (or the restored VM) runs under the same ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sched: Option<SchedParams>,
    /// An `--irq-check` run instead of NPB: the interrupt test device is rebuilt
    /// where the VM goes (its state travels with the PCI bus's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq: Option<IrqRun>,
    /// A rank VM of an MPI job (`kumo mpi --api-socket`): its NICs are rebuilt where
    /// the VM goes (their state travels with the PCI bus's) and it rejoins the wire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<RankApp>,
    /// Where the guest keeps the host CPU count (vCPU ballooning, `hv::pvwait`), if
    /// it named a word: the restored VM is told its new host's count there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cpus_word: Option<u64>,
}

pub const GUEST_NAME: &str = "kumo-npb";

impl AppState {
    pub fn parse(app: &str) -> Result<AppState> {
        let state: AppState =
            serde_json::from_str(app).context("the stream does not describe a kumo NPB guest")?;
        if state.guest != GUEST_NAME {
            bail!(
                "the stream holds a '{}' guest; kumo restores only its own NPB guest",
                state.guest
            );
        }
        Ok(state)
    }

    pub fn specs(&self) -> Result<Vec<Spec>> {
        match &self.rank {
            Some(rank) => rank.specs(&self.npb),
            None => guest::parse_specs(&self.npb),
        }
    }

    /// The scheduler parameters the VM runs under (None: the host schedules it).
    pub fn sched_params(&self) -> Result<Option<sched::Params>> {
        self.sched
            .map(|p| {
                crate::spec::sched::from_update(SchedUpdate {
                    tslice_ms: Some(p.tslice_ms),
                    tick_ms: Some(p.tick_ms),
                    ratelimit_us: Some(p.ratelimit_us),
                    accounting: Some(p.accounting),
                    directed_yield: Some(p.directed_yield),
                    auto_slice: None,
                })
                .context("the stream's scheduler parameters")
            })
            .transpose()
    }
}

/// The control socket's view of one running VM.
pub struct VmTarget {
    hub: Arc<Hub>,
    app: AppState,
    /// The console so far, kept up to date by the running VM's console.
    console: Arc<Mutex<Vec<u8>>>,
    /// The credit scheduler, if the VM runs under it, and its control.
    driver: Option<Arc<hv::credit::CreditDriver>>,
    sched: SchedControl,
    /// The vCPU threads' control: the host CPU count the guest sees.
    control: Arc<hv::placement::VcpuControl>,
    /// Held paused through the API (`vm.pause`).
    pause: crate::vm_pause::PauseHold,
}

impl VmTarget {
    /// The program's state now (call with the vCPUs paused for a consistent console).
    fn app_json(&self) -> String {
        let console = self
            .console
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let app = AppState {
            console,
            // What is in force now: `kumo ctl sched-credit` may have changed it.
            sched: self
                .driver
                .as_ref()
                .map(|d| crate::spec::sched::view(d.params())),
            host_cpus_word: self.control.host_cpus().word_gpa(),
            ..self.app.clone()
        };
        serde_json::to_string(&app).unwrap_or_default()
    }

    fn write_snapshot(&self, path: &Path, stop: bool) -> Result<SnapshotReport> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let (paused, written) =
            match hv::migration::write_snapshot(&self.hub, &mut w, || self.app_json()) {
                Ok(done) => done,
                Err(e) => {
                    drop(w);
                    let _ = std::fs::remove_file(path);
                    return Err(e.into());
                }
            };
        let paused_ms = paused.paused_for().as_secs_f64() * 1e3;
        // A VM that goes on does not wait for the disk: its snapshot is whole in the
        // page cache, and the guest would see the sync as time it lost (its clock runs
        // on through the pause). One that stops ends only once its snapshot is safe.
        let stopping = if stop {
            Some(paused)
        } else {
            drop(paused);
            None
        };
        let synced = w
            .into_inner()
            .map_err(|e| e.into_error())
            .and_then(|f| f.sync_data());
        if let Err(e) = synced {
            drop(stopping); // the VM runs on
            let _ = std::fs::remove_file(path);
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
        if let Some(paused) = stopping {
            paused.hand_off();
        }
        Ok(SnapshotReport {
            path: path.to_path_buf(),
            pages: written.pages,
            bytes: written.bytes,
            paused_ms,
            stopped: stop,
        })
    }
}

/// Connecting, authenticating, and waiting for the destination's confirmation.
const PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the source waits for a copy round's acknowledgement unless told
/// (`kumo ctl migrate --ack-timeout-ms`): a destination silent this long is given up
/// on like one that vanished, and the VM runs on here.
const ACK_TIMEOUT: Duration = PEER_TIMEOUT;
/// The destination gives up on a source that stops sending for this long.
const STREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// The whole handshake (authentication) on either side: a peer that trickles a byte
/// at a time gets each read within [`PEER_TIMEOUT`], but not the handshake within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `stream` with every read and write ending by one deadline, `at`: a peer cannot
/// stretch the exchange by answering each read just in time, as it can a per-read
/// timeout.
struct Deadline<'a> {
    stream: &'a TcpStream,
    at: Instant,
}

impl Deadline<'_> {
    fn expired() -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "the handshake did not finish within {} s",
                HANDSHAKE_TIMEOUT.as_secs()
            ),
        )
    }

    /// Time left, or the deadline's error.
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(Self::expired())
        } else {
            Ok(left)
        }
    }

    fn timed_out(e: std::io::Error) -> std::io::Error {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Self::expired(),
            _ => e,
        }
    }
}

impl std::io::Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        std::io::Read::read(&mut self.stream, buf).map_err(Self::timed_out)
    }
}

impl std::io::Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        std::io::Write::write(&mut self.stream, buf).map_err(Self::timed_out)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The migration's connection, its timeouts said as which peer stalled at what
/// (not "Resource temporarily unavailable").
struct Watched<'a> {
    stream: &'a TcpStream,
    /// "the source 10.0.0.1:4444", "the destination h:4444".
    peer: &'a str,
}

impl std::io::Read for Watched<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        std::io::Read::read(&mut self.stream, buf).map_err(|e| {
            crate::output::name_timeout(e, || {
                format!(
                    "{} sent nothing for {} s",
                    self.peer,
                    crate::output::seconds(self.stream.read_timeout().ok().flatten())
                )
            })
        })
    }
}

impl std::io::Write for Watched<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::Write::write(&mut self.stream, buf).map_err(|e| {
            crate::output::name_timeout(e, || {
                format!(
                    "{} took nothing for {} s (its receive window stayed full)",
                    self.peer,
                    crate::output::seconds(self.stream.write_timeout().ok().flatten())
                )
            })
        })
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut self.stream)
    }
}

/// `tcp:HOST:PORT` -> `HOST:PORT`.
pub fn parse_tcp(address: &str) -> Result<&str> {
    match address.strip_prefix("tcp:") {
        Some(rest)
            if rest
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
        {
            Ok(rest)
        }
        _ => bail!("'{address}' is not tcp:HOST:PORT"),
    }
}

/// The shared secret: the file's bytes less trailing whitespace; never empty.
pub fn read_token(path: &Path) -> Result<Vec<u8>> {
    let mut token = std::fs::read(path)
        .with_context(|| format!("cannot read token file {}", path.display()))?;
    while token.last().is_some_and(u8::is_ascii_whitespace) {
        token.pop();
    }
    if token.is_empty() {
        bail!("token file {} is empty", path.display());
    }
    Ok(token)
}

impl VmTarget {
    fn migrate_to(&self, request: &MigrateRequest) -> Result<MigrationReply> {
        if let Some(name) = &request.domain {
            bail!("migrate --domain {name}: this kumo runs one VM, not a node");
        }
        let address = parse_tcp(&request.target)?;
        let token = request.token_file.as_deref().map(read_token).transpose()?;
        let report = send_vm(
            &self.hub,
            || self.app_json(),
            address,
            token.as_deref(),
            pacing(request.max_downtime_ms, request.stop_and_copy),
            request.ack_timeout_ms.map(Duration::from_millis),
        )?;
        Ok(MigrationReply {
            report,
            target: request.target.clone(),
            domain: None,
        })
    }
}

/// The destination's replies on the migration's connection: each round's
/// acknowledgement within `ack_timeout`, the confirmation within [`PEER_TIMEOUT`].
struct Replies<'a> {
    stream: &'a TcpStream,
    ack_timeout: Duration,
}

impl Replies<'_> {
    fn timeout(&self, timeout: Duration) -> Result<(), hv::Error> {
        self.stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| hv::Error::Migration(format!("setting the reply timeout: {e}")))
    }
}

impl hv::migration::live::Destination for Replies<'_> {
    fn applied(&mut self, round: u32) -> Result<(), hv::Error> {
        self.timeout(self.ack_timeout)?;
        hv::migration::live::await_applied(&mut &*self.stream, round)
    }
    fn running(&mut self) -> Result<(), hv::Error> {
        self.timeout(PEER_TIMEOUT)?;
        hv::migration::live::await_running(&mut &*self.stream)
    }
}

/// How a migration is paced: its downtime target (QEMU's 300 ms unless given), or
/// stop-and-copy.
pub fn pacing(max_downtime_ms: Option<u64>, stop_and_copy: bool) -> hv::migration::live::Options {
    let defaults = hv::migration::live::Options::default();
    hv::migration::live::Options {
        max_downtime: max_downtime_ms.map_or(defaults.max_downtime, Duration::from_millis),
        stop_and_copy,
        ..defaults
    }
}

/// Moves the VM behind `hub` to the kumo listening at `address` (HOST:PORT):
/// connect, authenticate, pre-copy, hand off once the destination runs it. `app`
/// describes the program's side (asked for at the start and with the vCPUs stopped).
pub fn send_vm(
    hub: &Hub,
    app: impl Fn() -> String,
    address: &str,
    token: Option<&[u8]>,
    options: hv::migration::live::Options,
    ack_timeout: Option<Duration>,
) -> Result<hv::migration::live::Report> {
    hub.check_running()?;
    let peer = address
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {address}"))?
        .next()
        .with_context(|| format!("{address} resolves to nothing"))?;
    let stream = TcpStream::connect_timeout(&peer, PEER_TIMEOUT)
        .with_context(|| format!("cannot connect to {address}"))?;
    stream.set_nodelay(true)?;
    let mut handshake = Deadline {
        stream: &stream,
        at: Instant::now() + HANDSHAKE_TIMEOUT,
    };
    hv::migration::auth::source(&mut handshake, token)
        .with_context(|| format!("migration to {address}"))?;
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(STREAM_TIMEOUT))?;
    let peer = format!("the destination {address}");
    let mut w = BufWriter::with_capacity(
        1 << 20,
        Watched {
            stream: &stream,
            peer: &peer,
        },
    );
    let mut replies = Replies {
        stream: &stream,
        ack_timeout: ack_timeout.unwrap_or(ACK_TIMEOUT),
    };
    hv::migration::live::send(hub, &mut w, app(), &app, &options, &mut replies)
        .with_context(|| format!("migration to {address}"))
}

/// `kumo --incoming tcp:HOST:PORT`: waits for one VM, proves the token, receives
/// it, tells the source once its vCPUs run here, and runs it to its end.
pub fn run_incoming(spec: &VmSpec, options: &RunOptions, epoch: Instant) -> Result<u8> {
    crate::launch::refuse_for_saved(spec)?;
    let Guest::Incoming { addr, token_file } = &spec.guest else {
        bail!("an --incoming run needs an incoming guest");
    };
    let address = parse_tcp(addr)?;
    let token = token_file.as_deref().map(read_token).transpose()?;
    if token.is_none() {
        refuse_open_listener(address)?;
    }
    let listener =
        TcpListener::bind(address).with_context(|| format!("cannot listen on {address}"))?;
    eprintln!("kumo: waiting for a VM on {}", listener.local_addr()?);
    let (vm, meta) = receive_vm(&listener, token.as_deref(), &options.kvm_device)?;
    let app = AppState::parse(&meta.app)?;
    let socket = spec.migration.api_socket.as_deref();
    run_vm(vm, app, socket, epoch, options.json)
}

/// Without a token, whoever reaches the port may hand kumo a VM to run: only a
/// loopback address (every address `address` resolves to) may listen so.
fn refuse_open_listener(address: &str) -> Result<()> {
    let addrs: Vec<_> = address
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {address}"))?
        .collect();
    if let Some(open) = addrs.iter().find(|a| !a.ip().is_loopback()) {
        bail!(
            "--incoming tcp:{address} listens beyond this host ({}) without --token-file: \
             give one, or a loopback address such as 127.0.0.1",
            open.ip()
        );
    }
    Ok(())
}

/// Accepts one source on `listener`, checks its token, and builds the VM it sends.
/// A thread tells the source once the returned VM's vCPU threads run (so the caller
/// must run it).
pub fn receive_vm(
    listener: &TcpListener,
    token: Option<&[u8]>,
    kvm_device: &Path,
) -> Result<(Vm, hv::migration::Meta)> {
    receive_vm_in(listener, token, kvm_device, None)
}

/// As [`receive_vm`], the thread that tells the source a member of `dom0` (a node's
/// domain 0, whose work that is) if given.
pub fn receive_vm_in(
    listener: &TcpListener,
    token: Option<&[u8]>,
    kvm_device: &Path,
    dom0: Option<Arc<hv::placement::ThreadGroup>>,
) -> Result<(Vm, hv::migration::Meta)> {
    let (stream, peer) = listener.accept().context("accepting the source")?;
    stream.set_nodelay(true)?;
    // A client that fails the handshake, or does not finish it in time, ends this
    // kumo as a bad token does (one line, exit 2).
    let mut handshake = Deadline {
        stream: &stream,
        at: Instant::now() + HANDSHAKE_TIMEOUT,
    };
    hv::migration::auth::destination(&mut handshake, token)
        .with_context(|| format!("incoming migration from {peer}"))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    stream.set_read_timeout(Some(STREAM_TIMEOUT))?;
    // Each round is acknowledged as soon as it is in RAM: the source pauses the VM
    // only once this side has caught up.
    let source = format!("the source {peer}");
    let watched = || Watched {
        stream: &stream,
        peer: &source,
    };
    let (vm, meta) = crate::launch::receive(
        &mut BufReader::with_capacity(1 << 20, watched()),
        kvm_device,
        |round| {
            hv::migration::stream::write_reply(&mut watched(), Reply::Applied(round))
                .map_err(hv::Error::from)
        },
    )
    .with_context(|| format!("incoming migration from {peer}"))?;
    tracing::debug!("incoming VM restored");
    let control = vm.control();
    // Confirmed only once every vCPU thread runs (the devices took their state).
    std::thread::Builder::new()
        .name("migrate-ack".into())
        .spawn(move || {
            let _member = dom0.as_ref().map(|group| group.join_current());
            hv::seccomp::apply_or_exit(hv::seccomp::ThreadKind::Migration);
            if control.wait_started(PEER_TIMEOUT)
                && let Err(e) = hv::migration::stream::write_reply(&mut &stream, Reply::Running)
                    .inspect(|()| tracing::debug!("incoming VM runs; source told"))
            {
                tracing::warn!("telling the source the VM runs failed: {e}");
            }
        })?;
    Ok((vm, meta))
}

impl VmTarget {
    /// Refuses what a VM held paused through the API cannot do.
    fn running(&self) -> Result<(), Refused> {
        if self.pause.is_paused() {
            return Err(Refused::conflict(
                "the VM is paused (PUT /api/v1/vm.resume first)",
            ));
        }
        self.hub
            .check_running()
            .map_err(|e| Refused::conflict(e.to_string()))
    }
}

impl Controlled for VmTarget {
    fn sched(&self) -> &dyn SchedTarget {
        &self.sched
    }
    fn info(&self) -> VmInfo {
        VmInfo {
            kind: if self.app.rank.is_some() {
                RunKind::Rank
            } else {
                RunKind::Vm
            },
            state: if self.pause.is_paused() {
                RunState::Paused
            } else {
                RunState::Running
            },
            vcpus: u32::try_from(self.control.vcpus()).unwrap_or(u32::MAX),
            domains: 1,
            pid: std::process::id(),
            credit_scheduler: self.driver.is_some(),
        }
    }
    fn counters(&self) -> Counters {
        Counters {
            vcpus: api::vcpu_counters(&self.control, None),
        }
    }
    fn pause(&self) -> Result<VmInfo, Refused> {
        self.pause.pause(&self.hub).map_err(Refused::conflict)?;
        Ok(self.info())
    }
    fn resume(&self) -> Result<VmInfo, Refused> {
        self.pause.resume().map_err(Refused::conflict)?;
        Ok(self.info())
    }
    fn snapshot(&self, path: &Path, stop: bool) -> Result<SnapshotReport, Refused> {
        self.running()?;
        self.write_snapshot(path, stop)
            .map_err(|e| Refused::failed(crate::output::error_chain(&e)))
    }
    fn check_migrate(&self, request: &MigrateRequest) -> Result<(), Refused> {
        if let Some(name) = &request.domain {
            return Err(Refused::bad(format!(
                "migrate --domain {name}: this kumo runs one VM, not a node"
            )));
        }
        parse_tcp(&request.target).map_err(|e| Refused::bad(format!("{e:#}")))?;
        self.running()
    }
    fn migrate(&self, request: &MigrateRequest) -> Result<MigrationReply, Refused> {
        self.running()?;
        self.migrate_to(request)
            .map_err(|e| Refused::failed(crate::output::error_chain(&e)))
    }
    fn vcpu_balloon(
        &self,
        domain: Option<&str>,
        active: Option<u32>,
    ) -> Result<BalloonState, Refused> {
        if let Some(name) = domain {
            return Err(Refused::bad(format!(
                "vcpu-balloon --domain {name}: this kumo runs one VM, not a node"
            )));
        }
        api::vcpu_balloon_of(&self.control, active)
    }
}

/// `kumo --api-socket PATH [--npb ...]` (or `--irq-check`): the embedded guest,
/// saveable while it runs.
pub fn run_controlled(spec: &VmSpec, options: &RunOptions, epoch: Instant) -> Result<u8> {
    let Guest::Npb { .. } = &spec.guest else {
        bail!("--api-socket runs the embedded guest");
    };
    // What a snapshot carries must rebuild the VM where it goes: these devices it
    // cannot (a passthrough device's state is outside kumo).
    let d = &spec.devices;
    if !d.passthrough.is_empty() {
        bail!("a passthrough device cannot be migrated: --api-socket refuses --passthrough");
    }
    if !d.disks.is_empty() || !d.nics.is_empty() {
        bail!("--api-socket VMs of the embedded guest take no disks or NICs");
    }
    let irq = d
        .irq_test
        .map(|test| {
            let irq = IrqRun {
                path: test.irq_path,
                rounds: test.rounds,
            };
            irq.check_rounds().map(|()| irq)
        })
        .transpose()?;
    let mut resolved = crate::launch::resolve(spec, &options.kvm_device)?;
    // `run_vm` attaches the test device from `irq`, as it does on a restored VM.
    resolved.devices.irq_test = None;
    let built = crate::launch::build_resolved(resolved, hv::builder::Backends::default())?;
    let sched = built
        .sched
        .as_ref()
        .map(|(params, _)| crate::spec::sched::view(*params));
    let app = AppState {
        guest: GUEST_NAME.into(),
        npb: crate::spec::job::npb_list(&built.benchmarks),
        vcpus: spec.machine.vcpus,
        console: Vec::new(),
        sched,
        irq,
        rank: None,
        host_cpus_word: None,
    };
    run_vm(
        built.vm,
        app,
        spec.migration.api_socket.as_deref(),
        epoch,
        options.json,
    )
}

/// `kumo --restore PATH`: runs a saved VM on from where it was saved.
pub fn run_restore(spec: &VmSpec, options: &RunOptions, epoch: Instant) -> Result<u8> {
    crate::launch::refuse_for_saved(spec)?;
    let Guest::Snapshot { path } = &spec.guest else {
        bail!("a --restore run needs a snapshot guest");
    };
    // A regular file only: a FIFO without a writer would block the open for ever.
    let (file, _) = crate::input::open_regular("snapshot", path)?;
    let (vm, meta) = crate::launch::restore(&mut BufReader::new(file), &options.kvm_device)
        .with_context(|| format!("cannot restore {}", path.display()))?;
    let app = AppState::parse(&meta.app)?;
    run_vm(
        vm,
        app,
        spec.migration.api_socket.as_deref(),
        epoch,
        options.json,
    )
}

/// Runs a created or restored VM of the embedded guest, serving `socket` if given,
/// and reports it; a VM handed off elsewhere reports that instead.
pub fn run_vm(
    mut vm: Vm,
    app: AppState,
    socket: Option<&Path>,
    epoch: Instant,
    json: bool,
) -> Result<u8> {
    let specs = match app.irq {
        Some(_) => Vec::new(),
        None => app.specs()?,
    };
    // The same devices in the same slots as where the VM was made; a restored VM's
    // devices take their saved registers and routes when the VM starts. A rank's
    // NICs come with their switch and wire (before the ctl socket: the VM may move
    // only once it is on the job's network).
    let _rank_network = app
        .rank
        .as_ref()
        .map(|rank| crate::rank::attach(&mut vm, rank, app.vcpus))
        .transpose()?;
    let irq_devices = app
        .irq
        .map(|irq| hv::irq_device::attach(&mut vm, &irq.setup(), None))
        .transpose()
        .context("attaching the interrupt test device")?;
    // This host's CPUs, also for a VM saved or migrated from another (whose guest
    // named its word there).
    guest::tell_host_cpus(&vm);
    if let Some(gpa) = app.host_cpus_word {
        vm.control().host_cpus().register(vm.memory(), gpa);
    }
    let console = Arc::new(Mutex::new(app.console.clone()));
    let replay = app.console.clone();
    let credit = app
        .sched_params()?
        .map(|params| run::start_credit_driver(&vm, params, &crate::spec::vm::Sched::default()))
        .transpose()?;
    let driver = credit.as_ref().map(|c| c.driver.clone());
    let target = Arc::new(VmTarget {
        hub: vm.migration_hub(),
        app: app.clone(),
        console: console.clone(),
        driver: driver.clone(),
        sched: SchedControl::new(driver, Vec::new()),
        control: vm.control(),
        pause: crate::vm_pause::PauseHold::default(),
    });
    let dom0 = credit.as_ref().map(|c| c.dom0.clone());
    let server = socket
        .map(|path| -> Result<api::Server> {
            // The API's threads are domain 0's work when a scheduler runs.
            let server = api::Server::start(path, target, move || {
                dom0.as_ref().map(|group| group.join_current())
            })?;
            server.announce();
            Ok(server)
        })
        .transpose()?;
    let run = run::run_collecting_recorded(vm, epoch, Some(console), &replay);
    // The server (it holds the scheduler too), then the scheduler (it returns every
    // thread to normal scheduling), then domain 0's membership.
    drop(server);
    drop(credit);
    let run = run?;
    if run.outcome.exit == GuestExit::HandedOff {
        eprintln!("kumo: {HANDED_OFF}");
        return Ok(EXIT_OK);
    }
    if let Some(rank) = &app.rank {
        return Ok(rank.report(&specs, app.vcpus, &run, json));
    }
    if let (Some(irq), Some(devices)) = (app.irq, &irq_devices) {
        return irq.report(&run, app.vcpus, devices, json);
    }
    let verdict = run.judge(&specs, app.vcpus);
    report::print(&verdict, json);
    Ok(verdict.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stalled_peer_is_named_with_what_it_did_not_do() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _silent = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut watched = Watched {
            stream: &stream,
            peer: "the source 127.0.0.1:9",
        };
        let err = std::io::Read::read_exact(&mut watched, &mut [0u8; 8]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(
            err.to_string(),
            "the source 127.0.0.1:9 sent nothing for 0.1 s"
        );
    }
}
