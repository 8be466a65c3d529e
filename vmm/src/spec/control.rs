//! The control protocol's types: what a `kumo ctl` client sends (one JSON object per
//! line, [`Request`]) and the values replies carry. Plain serde data; the server that
//! answers is `crate::ctl`.

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

/// A change to some of the parameters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
pub struct SchedUpdate {
    pub tslice_ms: Option<f64>,
    pub tick_ms: Option<f64>,
    pub ratelimit_us: Option<u64>,
    pub accounting: Option<Accounting>,
    pub directed_yield: Option<bool>,
}

/// A domain as `domain list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainInfo {
    pub domain: String,
    pub weight: u32,
    pub cap: u32,
    pub vcpus: u32,
    pub cpu_s: f64,
}

/// `migrate`'s parameters as the control socket receives them.
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

/// One request line of the control socket (`kumo ctl` sends it, the server reads it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    SchedCredit {
        #[serde(skip_serializing_if = "Option::is_none")]
        tslice_ms: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tick_ms: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        ratelimit_us: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        accounting: Option<Accounting>,
        #[serde(skip_serializing_if = "Option::is_none")]
        directed_yield: Option<bool>,
    },
    DomainList {},
    DomainSet {
        name: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        weight: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cap: Option<u32>,
    },
    Snapshot {
        path: PathBuf,
        #[serde(default)]
        stop: bool,
    },
    Migrate(MigrateRequest),
    VcpuBalloon {
        domain: Option<String>,
        active: Option<u32>,
    },
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

/// One reply line: `{"ok":true, ...the value's fields}` or `{"ok":false,
/// "error":"..."}`.
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
