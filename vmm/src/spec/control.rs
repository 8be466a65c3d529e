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
#[derive(Debug, Clone, PartialEq, Serialize)]
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

/// One request line of the control socket.
#[derive(Debug, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    SchedCredit {
        tslice_ms: Option<f64>,
        tick_ms: Option<f64>,
        ratelimit_us: Option<u64>,
        accounting: Option<Accounting>,
        directed_yield: Option<bool>,
    },
    DomainList {},
    DomainSet {
        name: String,
        weight: Option<u32>,
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
