//! The control API's types: the JSON bodies a client sends to `/api/v1/...` and the
//! values the API answers with. Plain serde data; the HTTP server that answers is
//! `crate::api`, its client `kumo ctl` (`crate::ctl`). Request bodies refuse unknown
//! fields, so a misspelt field is an error rather than silently ignored.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Scheduler parameters as the control API shows and sets them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SchedParams {
    pub tslice_ms: f64,
    pub tick_ms: f64,
    pub ratelimit_us: u64,
    /// "exact" or "tick" (Xen 3.4).
    #[serde(default = "exact")]
    pub accounting: Accounting,
    /// Directed yield at barriers (`sched::Params::directed_yield`).
    #[serde(default)]
    pub directed_yield: bool,
    /// The scheduler picks its slice (`sched::auto_slice`); the values above are then
    /// those in force.
    #[serde(default)]
    pub auto_slice: bool,
}

fn exact() -> Accounting {
    Accounting::Exact
}

/// `sched::Accounting` as the control API spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accounting {
    #[default]
    Exact,
    Tick,
}

impl Accounting {
    /// Its name in the API, node files and reports (`sched`'s).
    pub fn name(self) -> &'static str {
        sched::Accounting::from(self).name()
    }
}

impl From<Accounting> for sched::Accounting {
    fn from(a: Accounting) -> sched::Accounting {
        match a {
            Accounting::Exact => sched::Accounting::Exact,
            Accounting::Tick => sched::Accounting::Tick,
        }
    }
}

impl From<sched::Accounting> for Accounting {
    fn from(a: sched::Accounting) -> Accounting {
        match a {
            sched::Accounting::Exact => Accounting::Exact,
            sched::Accounting::Tick => Accounting::Tick,
        }
    }
}

/// A change to some of the parameters (`PUT /api/v1/sched.credit`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tslice_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratelimit_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounting: Option<Accounting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directed_yield: Option<bool>,
    /// true: the scheduler picks its slice from now on (the other values set its long
    /// setting); false: fixed again. Left out: a new slice, tick or ratelimit turns it
    /// off, other changes keep it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_slice: Option<bool>,
}

/// A change to a domain's weight and/or cap (`PUT /api/v1/domains/{name}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Percent of one host CPU; 0 = no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u32>,
}

/// `PUT /api/v1/vm.snapshot`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// Resolved in the server's working directory: send an absolute path.
    pub path: PathBuf,
    /// End the VM once it is saved.
    #[serde(default)]
    pub stop: bool,
}

/// `PUT /api/v1/vm.balloon`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonRequest {
    /// The node's domain (a single VM needs none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Host CPUs the guest is told it may use.
    pub active: u32,
}

/// What kind of kumo answers the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunKind {
    /// One VM (`kumo --api-socket`).
    Vm,
    /// One rank VM of an MPI job (`kumo mpi --vms 1 --npb ... --api-socket`).
    Rank,
    /// A node of several domains (`kumo node`).
    Node,
}

/// Whether the VM runs or was paused through the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    Running,
    Paused,
}

/// `GET /api/v1/vm.info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmInfo {
    pub kind: RunKind,
    pub state: RunState,
    /// vCPUs of the VM (of every domain, for a node).
    pub vcpus: u32,
    /// The node's domains (one for a single VM).
    pub domains: u32,
    /// The kumo process.
    pub pid: u32,
    /// Whether a credit scheduler runs (`--sched`, node `scheduler = credit`).
    pub credit_scheduler: bool,
}

/// One vCPU in `GET /api/v1/vm.counters`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VcpuCounters {
    /// The node's domain (absent for a single VM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    pub vcpu: u32,
    /// Host CPU time of its thread so far (0 before it starts).
    pub cpu_s: f64,
    /// Runnable (running or waiting for a host CPU) rather than asleep.
    pub runnable: bool,
    /// Held at its gate (ballooned out or parked by the scheduler).
    pub parked: bool,
}

/// `GET /api/v1/vm.counters`: cheap per-vCPU counters, read from the host's
/// `/proc` on each request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub vcpus: Vec<VcpuCounters>,
}

/// Where a migration started with `PUT /api/v1/vm.migrate` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigrationState {
    Running,
    Succeeded,
    Failed,
}

/// `GET /api/v1/vm.migrate/{id}` (and the 202 reply of `PUT /api/v1/vm.migrate`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigrationProgress {
    pub id: u64,
    pub state: MigrationState,
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Since the request was accepted.
    pub elapsed_ms: f64,
    /// Once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<MigrationReply>,
    /// Once it failed: why (the VM runs on here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Every error reply's body: one message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

/// A domain as `domain list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainInfo {
    pub domain: String,
    pub weight: u32,
    pub cap: u32,
    pub vcpus: u32,
    pub cpu_s: f64,
    /// A node's domain: where it is and how far its guest got (absent for a single
    /// VM, whose progress its own console shows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<DomainProgress>,
}

/// A node's domain's progress, as a balancer reads it (`kumo experiment s5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainProgress {
    pub state: DomainState,
    /// Benchmark results its guest has printed so far, wherever it ran (a migration
    /// carries its console).
    pub results: u32,
    /// An MPI kernel's timed loop: the steps its ranks last showed (absent before
    /// the first, and for plain NPB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<crate::protocol::Steps>,
}

/// Where a node's domain is in its life on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DomainState {
    Running,
    /// Being sent to another node (it runs on here until the hand-off).
    Moving,
    /// Handed off to another node, where it runs on.
    Moved,
    /// Its guest ended here.
    Ended,
}

/// `PUT /api/v1/vm.migrate`'s body.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MigrateRequest {
    /// `tcp:HOST:PORT` of the destination (`kumo --incoming`).
    pub target: String,
    /// The shared secret's file, read by the source.
    pub token_file: Option<PathBuf>,
    /// Stop iterating once the last round would take at most this long.
    pub max_downtime_ms: Option<u64>,
    /// Give up (the VM runs on) if a round is not acknowledged within this long.
    #[serde(default)]
    pub ack_timeout_ms: Option<u64>,
    /// Pause first and copy once (no live rounds).
    #[serde(default)]
    pub stop_and_copy: bool,
    /// The node's domain to move (a node runs several; a single VM needs none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// `snapshot`'s reply: the file, what it holds, how long the VM was paused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotReport {
    pub path: PathBuf,
    pub pages: u64,
    pub bytes: u64,
    pub paused_ms: f64,
    /// The VM ended here (`--stop`).
    pub stopped: bool,
}

/// `migrate`'s reply: what the migration did (host view) and where the VM went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MigrationReply {
    #[serde(flatten)]
    pub report: hv::migration::live::Report,
    /// `tcp:HOST:PORT`, as asked.
    pub target: String,
    /// The node's domain that moved (none for a single VM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// `vcpu-balloon`'s reply: the host CPUs the guest is told it may use, of its vCPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    pub active: u32,
    pub vcpus: u32,
}

/// `domain-list`'s reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainList {
    pub domains: Vec<DomainInfo>,
}

/// `domain-set`'s reply: the domain as it is now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainSetReply {
    pub domain: DomainInfo,
}

/// What a successful request's reply carries, beside `"ok": true`: one shape per
/// command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplyValue {
    Sched(SchedParams),
    Domains(DomainList),
    Domain(DomainSetReply),
    Snapshot(SnapshotReport),
    Migrated(Box<MigrationReply>),
    Balloon(BalloonState),
}

/// What `kumo ctl --json` prints: `{"ok":true, ...the value's fields}` (the shape
/// scripts read since the JSON-lines socket; kept so they keep working).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply<T> {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(flatten)]
    pub value: Option<T>,
}

impl<T> Reply<T> {
    pub fn of(result: Result<T, String>) -> Reply<T> {
        match result {
            Ok(value) => Reply {
                ok: true,
                error: None,
                value: Some(value),
            },
            Err(error) => Reply {
                ok: false,
                error: Some(error),
                value: None,
            },
        }
    }
}
