//! The control API: HTTP/1.1 over a UNIX socket (mode 0600) at `--api-socket PATH`,
//! served by one thread (`kumo-api`) on a tokio current-thread runtime. It is the only
//! async part of kumo: its handlers call [`Controlled`]'s synchronous methods, and the
//! slow ones (snapshot, migration) run on a thread of their own (`kumo-api-job`).
//!
//! `routes` maps method and path to a request, `server` owns the socket and the
//! per-connection limits, `socket` binds it privately, `client` is what `kumo ctl`
//! and `kumo bench api` speak.

pub mod client;
mod jobs;
pub mod routes;
mod server;
mod socket;

use std::path::{Path, PathBuf};

pub use server::{Limits, Server};
pub use socket::remove_stale_socket;

use crate::spec::control::{
    BalloonState, Counters, DomainInfo, MigrateRequest, MigrationReply, SchedParams, SchedUpdate,
    SnapshotReport, VmInfo,
};

/// Why a request was refused: the HTTP status it is answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A value out of range or a request that makes no sense here (400).
    BadValue,
    /// No such domain or migration (404).
    NotFound,
    /// The run's state forbids it now: paused, busy, not started, ended, or a kind
    /// of run that has no such thing (409).
    Conflict,
    /// The operation itself failed (500): e.g. the snapshot file could not be written.
    Failed,
}

/// A refusal and its one-line message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub kind: Refusal,
    pub message: String,
}

impl Refused {
    pub fn bad(message: impl Into<String>) -> Refused {
        Refused {
            kind: Refusal::BadValue,
            message: message.into(),
        }
    }
    pub fn not_found(message: impl Into<String>) -> Refused {
        Refused {
            kind: Refusal::NotFound,
            message: message.into(),
        }
    }
    pub fn conflict(message: impl Into<String>) -> Refused {
        Refused {
            kind: Refusal::Conflict,
            message: message.into(),
        }
    }
    pub fn failed(message: impl Into<String>) -> Refused {
        Refused {
            kind: Refusal::Failed,
            message: message.into(),
        }
    }
}

/// The scheduler's side of a run: parameters, domains, ballooning, counters. One
/// implementation (`crate::sched_control::SchedControl`) serves every kind of run.
pub trait SchedTarget: Send + Sync {
    fn sched_params(&self) -> SchedParams;
    /// Applies `update` to the running scheduler; the error says which value is out
    /// of which range.
    fn set_sched_params(&self, update: SchedUpdate) -> Result<SchedParams, Refused>;
    fn domains(&self) -> Vec<DomainInfo>;
    fn set_domain(
        &self,
        name: &str,
        weight: Option<u32>,
        cap: Option<u32>,
    ) -> Result<DomainInfo, Refused>;
    /// The host CPUs the guest of the node's `domain` is told it may use (vCPU
    /// ballooning), set to `active` first if given.
    fn vcpu_balloon(
        &self,
        domain: Option<&str>,
        active: Option<u32>,
    ) -> Result<BalloonState, Refused>;
    /// What `vm.info` says of a node.
    fn info(&self) -> VmInfo;
    /// Every domain's vCPUs.
    fn counters(&self) -> Counters;
}

/// What a running kumo lets the API see and change. Each kind of run says only what
/// differs from its scheduler's answers ([`Controlled::sched`]).
pub trait Controlled: Send + Sync {
    /// The scheduler view the scheduling and domain requests go to.
    fn sched(&self) -> &dyn SchedTarget;

    fn sched_params(&self) -> SchedParams {
        self.sched().sched_params()
    }
    fn set_sched_params(&self, update: SchedUpdate) -> Result<SchedParams, Refused> {
        self.sched().set_sched_params(update)
    }
    fn domains(&self) -> Vec<DomainInfo> {
        self.sched().domains()
    }
    fn set_domain(
        &self,
        name: &str,
        weight: Option<u32>,
        cap: Option<u32>,
    ) -> Result<DomainInfo, Refused> {
        self.sched().set_domain(name, weight, cap)
    }
    fn vcpu_balloon(
        &self,
        domain: Option<&str>,
        active: Option<u32>,
    ) -> Result<BalloonState, Refused> {
        self.sched().vcpu_balloon(domain, active)
    }
    fn info(&self) -> VmInfo {
        self.sched().info()
    }
    fn counters(&self) -> Counters {
        self.sched().counters()
    }
    /// Stops every vCPU until [`Controlled::resume`]. Only a kumo running one VM has
    /// this.
    fn pause(&self) -> Result<VmInfo, Refused> {
        Err(Refused::conflict(NO_SINGLE_VM))
    }
    fn resume(&self) -> Result<VmInfo, Refused> {
        Err(Refused::conflict(NO_SINGLE_VM))
    }
    /// Saves the VM to `path`; with `stop` the VM then ends here. Only a kumo running
    /// one VM has this. Slow: the API runs it off its thread.
    fn snapshot(&self, _path: &Path, _stop: bool) -> Result<SnapshotReport, Refused> {
        Err(Refused::conflict(NO_SINGLE_VM))
    }
    /// Checks a migration request before it is accepted (202): what can be told at
    /// once (a bad target, a missing domain, a paused VM) is refused at once.
    fn check_migrate(&self, _request: &MigrateRequest) -> Result<(), Refused> {
        Err(Refused::conflict(NO_SINGLE_VM))
    }
    /// Moves the VM (or the node's domain) to another kumo (`kumo --incoming`); see
    /// `crate::migrate`. Slow: the API runs it off its thread.
    fn migrate(&self, _request: &MigrateRequest) -> Result<MigrationReply, Refused> {
        Err(Refused::conflict(NO_SINGLE_VM))
    }
}

const NO_SINGLE_VM: &str =
    "pause, resume, snapshot and migrate need a kumo running one VM (started with --api-socket)";

/// `vm.balloon` on one VM: checks `active` against its vCPUs, sets it, and replies
/// with what is in force.
pub fn vcpu_balloon_of(
    control: &hv::placement::VcpuControl,
    active: Option<u32>,
) -> Result<BalloonState, Refused> {
    let vcpus = u32::try_from(control.vcpus()).unwrap_or(u32::MAX);
    if let Some(n) = active {
        if !(1..=vcpus).contains(&n) {
            return Err(Refused::bad(format!(
                "vcpu-balloon --active {n}: the VM has {vcpus} vCPUs (give 1 to {vcpus})"
            )));
        }
        control.host_cpus().set(n);
    }
    Ok(BalloonState {
        active: control.host_cpus().count(),
        vcpus,
    })
}

/// The counters of one VM's vCPUs (`domain`: the node's name for it).
pub fn vcpu_counters(
    control: &hv::placement::VcpuControl,
    domain: Option<&str>,
) -> Vec<crate::spec::control::VcpuCounters> {
    (0..control.vcpus())
        .map(|v| crate::spec::control::VcpuCounters {
            domain: domain.map(str::to_string),
            vcpu: u32::try_from(v).unwrap_or(u32::MAX),
            cpu_s: control.cpu_time(v).unwrap_or_default().as_secs_f64(),
            runnable: control.runnable(v, false).unwrap_or(false),
            parked: control.is_parked(v),
        })
        .collect()
}

/// The default API socket of this process.
pub fn default_socket_path() -> PathBuf {
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    dir.join(format!("kumo-{}.sock", std::process::id()))
}

#[cfg(test)]
mod tests;
