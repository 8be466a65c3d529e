//! `kumo ctl`: a client of the control API (`crate::api`), xl-like. Each verb is one
//! request to the running kumo's `--api-socket`; the answer is printed as text, or
//! with `--json` as `{"ok":true, ...}` (the shape scripts read before the API was
//! HTTP). A migration is started (202) and then followed until it ends.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::client::{self, Reply as HttpReply};
use crate::args::OnOff;
pub use crate::spec::control::{
    Accounting, BalloonState, DomainInfo, MigrateRequest, MigrationReply, SchedParams, SchedUpdate,
    SnapshotReport,
};
use crate::spec::control::{
    BalloonRequest, DomainList, DomainSetReply, DomainUpdate, MigrationProgress, MigrationState,
    Reply, ReplyValue, SnapshotRequest,
};

/// How long a quick request may take.
const QUICK: Duration = Duration::from_secs(10);
/// How often a migration's progress is read.
const POLL: Duration = Duration::from_millis(20);

/// Sends `method path` (with `body` as JSON) and parses a 2xx answer as `T`; any
/// other status is an error with the API's message.
fn call<T: DeserializeOwned>(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&impl Serialize>,
    timeout: Option<Duration>,
) -> Result<T> {
    let body = body.map(serde_json::to_vec).transpose()?;
    let reply = client::request(socket, method, path, body, timeout)?;
    parse(socket, &reply)
}

fn parse<T: DeserializeOwned>(socket: &Path, reply: &HttpReply) -> Result<T> {
    if !(200..300).contains(&reply.status) {
        bail!("{}", reply.error_message());
    }
    serde_json::from_slice(&reply.body).with_context(|| {
        format!(
            "bad reply from {}: {:?}",
            socket.display(),
            String::from_utf8_lossy(&reply.body)
        )
    })
}

/// Percent-encodes a domain name for a path segment or query.
fn encode(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

const NO_BODY: Option<&()> = None;

/// Starts a migration and follows it until it ends.
fn migrate(socket: &Path, request: &MigrateRequest) -> Result<MigrationReply> {
    let started: MigrationProgress = call(
        socket,
        "PUT",
        "/api/v1/vm.migrate",
        Some(request),
        Some(QUICK),
    )?;
    let path = format!("/api/v1/vm.migrate/{}", started.id);
    loop {
        let progress: MigrationProgress = call(socket, "GET", &path, NO_BODY, Some(QUICK))
            .with_context(|| {
                format!("following migration {} at {}", started.id, socket.display())
            })?;
        match progress.state {
            MigrationState::Running => std::thread::sleep(POLL),
            MigrationState::Succeeded => {
                return progress
                    .result
                    .context("the API said the migration succeeded but sent no report");
            }
            MigrationState::Failed => bail!(
                "{}",
                progress.error.as_deref().unwrap_or("the migration failed")
            ),
        }
    }
}

/// `kumo ctl`: one verb, its answer printed.
pub fn run_ctl(args: &CtlArgs) -> Result<u8> {
    let socket = args.socket.as_path();
    let reply = match &args.command {
        CtlCommand::SchedCredit {
            tslice_ms,
            tick_ms,
            ratelimit_us,
            accounting,
            directed_yield,
        } => {
            let update = SchedUpdate {
                tslice_ms: match tslice_ms {
                    Some(Slice::Ms(ms)) => Some(*ms),
                    _ => None,
                },
                auto_slice: matches!(tslice_ms, Some(Slice::Auto)).then_some(true),
                tick_ms: *tick_ms,
                ratelimit_us: *ratelimit_us,
                accounting: accounting.map(Accounting::from),
                directed_yield: directed_yield.map(OnOff::is_on),
            };
            let params = if update == SchedUpdate::default() {
                call(socket, "GET", "/api/v1/sched.credit", NO_BODY, Some(QUICK))?
            } else {
                call(
                    socket,
                    "PUT",
                    "/api/v1/sched.credit",
                    Some(&update),
                    Some(QUICK),
                )?
            };
            ReplyValue::Sched(params)
        }
        CtlCommand::Domain(DomainCommand::List) => ReplyValue::Domains(call::<DomainList>(
            socket,
            "GET",
            "/api/v1/domains",
            NO_BODY,
            Some(QUICK),
        )?),
        CtlCommand::Domain(DomainCommand::Set { name, weight, cap }) => {
            if weight.is_none() && cap.is_none() {
                bail!("domain set {name}: give --weight and/or --cap");
            }
            let update = DomainUpdate {
                weight: *weight,
                cap: *cap,
            };
            let domain = call(
                socket,
                "PUT",
                &format!("/api/v1/domains/{}", encode(name)),
                Some(&update),
                Some(QUICK),
            )?;
            ReplyValue::Domain(DomainSetReply { domain })
        }
        CtlCommand::Snapshot { path, stop } => {
            // The server resolves the path in its own working directory: make it ours.
            let path = std::path::absolute(path)
                .with_context(|| format!("bad snapshot path {}", path.display()))?;
            let request = SnapshotRequest { path, stop: *stop };
            ReplyValue::Snapshot(call(
                socket,
                "PUT",
                "/api/v1/vm.snapshot",
                Some(&request),
                None,
            )?)
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
            let request = MigrateRequest {
                target: target.clone(),
                token_file,
                max_downtime_ms: *max_downtime_ms,
                ack_timeout_ms: *ack_timeout_ms,
                stop_and_copy: *stop_and_copy,
                domain: domain.clone(),
            };
            ReplyValue::Migrated(Box::new(migrate(socket, &request)?))
        }
        CtlCommand::VcpuBalloon { domain, active } => {
            let state = match active {
                Some(active) => call(
                    socket,
                    "PUT",
                    "/api/v1/vm.balloon",
                    Some(&BalloonRequest {
                        domain: domain.clone(),
                        active: *active,
                    }),
                    Some(QUICK),
                )?,
                None => {
                    let query = domain
                        .as_deref()
                        .map_or(String::new(), |d| format!("?domain={}", encode(d)));
                    call(
                        socket,
                        "GET",
                        &format!("/api/v1/vm.balloon{query}"),
                        NO_BODY,
                        Some(QUICK),
                    )?
                }
            };
            ReplyValue::Balloon(state)
        }
    };
    if args.json {
        crate::output::json_line(&Reply::of(Ok(reply)));
        return Ok(0);
    }
    match reply {
        ReplyValue::Sched(p) => crate::outln!(
            "credit: tslice {:?} ms{}, tick {:?} ms, ratelimit {} us, accounting {}, directed yield {}",
            p.tslice_ms,
            if p.auto_slice { " (auto)" } else { "" },
            p.tick_ms,
            p.ratelimit_us,
            p.accounting.name(),
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
    /// The kumo's API socket (`--api-socket`; `kumo node` prints it at start).
    #[arg(long, value_name = "PATH", visible_alias = "api-socket")]
    pub socket: PathBuf,

    /// Print the node's JSON reply instead of text.
    #[arg(long)]
    pub json: bool,

    #[command(subcommand)]
    pub command: CtlCommand,
}

/// `--tslice-ms`: milliseconds, or auto.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slice {
    Ms(f64),
    Auto,
}

fn parse_slice(text: &str) -> Result<Slice, String> {
    if text == "auto" {
        return Ok(Slice::Auto);
    }
    text.parse()
        .map(Slice::Ms)
        .map_err(|_| format!("'{text}' is not milliseconds or auto"))
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Show the credit scheduler's parameters, or set some of them.
    SchedCredit {
        /// Time slice in milliseconds, or auto: the scheduler picks it (S1's 1 ms
        /// while spinning vCPUs queue behind each other and messages move, else the
        /// other parameters' long setting).
        #[arg(long, value_name = "MS|auto", value_parser = parse_slice)]
        tslice_ms: Option<Slice>,
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
    use super::*;

    #[test]
    fn the_slice_flag_takes_milliseconds_or_auto() {
        assert_eq!(parse_slice("auto"), Ok(Slice::Auto));
        assert_eq!(parse_slice("1"), Ok(Slice::Ms(1.0)));
        assert_eq!(parse_slice("0.5"), Ok(Slice::Ms(0.5)));
        let e = parse_slice("fast").unwrap_err();
        assert!(e.contains("not milliseconds or auto"), "{e}");
    }
}
