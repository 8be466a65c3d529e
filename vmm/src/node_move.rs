//! A node's domains that move to another node (S1's migration of a DomU to a standby
//! host): `kumo ctl --socket NODE.sock migrate --domain NAME --to tcp:HOST:PORT`
//! sends the domain's VM (live pre-copy, or `--stop-and-copy`) to the node whose file
//! declares a domain that waits there (`incoming = "tcp:HOST:PORT"`). The destination
//! plugs its NICs into its own switch (while that switch runs), schedules it with its
//! own credit scheduler (the file's weight and cap), tells it its own CPU count, and
//! announces each of its MACs (a RARP broadcast per MAC) so that the learning switches
//! on both nodes, across their wire, send the moved ranks' frames the new way. The
//! source's switch took the domain's NIC ports down at the hand-off (their MACs
//! forgotten, queued frames dropped: the guests' MPI resends them).
//!
//! What the stream carries is `migrate::AppState`, as for a single VM: the NPB list,
//! the console so far, and for a rank of the node's job its `RankApp` (first rank,
//! job size, MACs, ranks per vCPU) without a wire: the destination's network is its
//! node's.

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hv::Vm;
use hv::credit::{CreditDriver, DomainSpec};
use hv::migration::Hub;
use hv::net::{Network, NicSetup};
use hv::placement::{ThreadGroup, VcpuControl};

use crate::api::{self, Controlled, Refused, SchedTarget};
use crate::migrate::{self, AppState, GUEST_NAME};
use crate::rank::RankApp;
use crate::run::{self, GuestRun};
use crate::sched_control::SchedControl;
use crate::spec::control::{
    DomainInfo, DomainProgress, DomainState, MigrateRequest, MigrationReply,
};
use crate::spec::job::{NicKind, Wait};
use crate::spec::node::{Domain, Node};

/// What the node watches of a domain running here: its vCPUs (have they ended?) and
/// its console so far, kept by its running VM (how many results?).
#[derive(Clone)]
pub struct Watch {
    control: Arc<VcpuControl>,
    console: Arc<Mutex<Vec<u8>>>,
}

impl Watch {
    pub fn new(vm: &Vm, console: Arc<Mutex<Vec<u8>>>) -> Watch {
        Watch {
            control: vm.control(),
            console,
        }
    }

    fn console(&self) -> Vec<u8> {
        self.console
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Its progress; `sent`: a migration of it started (and has not failed).
    fn progress(&self, sent: bool) -> DomainProgress {
        let vcpus = self.control.vcpus();
        let ended = vcpus > 0 && (0..vcpus).all(|v| self.control.has_ended(v));
        let console = self.console.lock().unwrap_or_else(|e| e.into_inner());
        DomainProgress {
            state: state(ended, sent),
            results: crate::protocol::count_results(&console),
            steps: crate::protocol::last_steps(&console),
        }
    }
}

/// A domain's state from whether its vCPUs ended and whether it was sent away.
fn state(ended: bool, sent: bool) -> DomainState {
    match (ended, sent) {
        (true, true) => DomainState::Moved,
        (false, true) => DomainState::Moving,
        (true, false) => DomainState::Ended,
        (false, false) => DomainState::Running,
    }
}

/// A domain of this node that can be sent elsewhere.
pub struct Movable {
    hub: Arc<Hub>,
    watch: Watch,
    /// What the stream says of it (the console and what changes filled in at send).
    app: AppState,
    /// Where it is being (or was) sent: set before the send, cleared if it fails.
    migrated_to: Mutex<Option<String>>,
}

impl Movable {
    /// A running domain's VM, with the console its run records into.
    pub fn new(vm: &Vm, watch: Watch, app: AppState) -> Movable {
        Movable {
            hub: vm.migration_hub(),
            watch,
            app,
            migrated_to: Mutex::new(None),
        }
    }

    /// Where the domain went, if a migration handed it off.
    pub fn migrated_to(&self) -> Option<String> {
        self.migrated_to
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn app_json(&self, driver: Option<&CreditDriver>) -> String {
        let app = AppState {
            console: self.watch.console(),
            sched: driver.map(|d| crate::spec::sched::view(d.params())),
            host_cpus_word: self.watch.control.host_cpus().word_gpa(),
            ..self.app.clone()
        };
        serde_json::to_string(&app).unwrap_or_default()
    }
}

/// A domain as the control socket's `migrate` sees it.
#[derive(Clone)]
pub enum Slot {
    Movable(Arc<Movable>),
    /// It cannot move: why.
    Fixed(String),
    /// It has not arrived yet (an incoming domain).
    Waiting,
}

/// What the stream would say of `domain` of `node`, or why it cannot move.
pub fn app_of(node: &Node, domain: &Domain) -> std::result::Result<AppState, String> {
    if !domain.passthrough.is_empty() {
        return Err("its passthrough devices cannot move (their state is their server's)".into());
    }
    if domain.irq_path.is_some() {
        return Err("a node's domain with the interrupt test device does not move".into());
    }
    let rank = match (&domain.mpi, &node.network) {
        (Some(part), Some(net)) => {
            if net.nic == NicKind::Passthrough {
                return Err(
                    "its NICs are ports of the node's NIC server, which cannot move".into(),
                );
            }
            let Some(npb) = &net.npb else {
                return Err(
                    "the node's MPI job runs net= workloads; only NPB-MPI ranks move".into(),
                );
            };
            let wait = match net.wait.as_str() {
                "block" => Wait::Block,
                "yield" => Wait::Yield,
                _ => Wait::Spin,
            };
            Some((
                npb.clone(),
                RankApp {
                    first_rank: part.first,
                    job_size: part.size,
                    wait,
                    irq_path: net.irq_path,
                    macs: domain.ranks().map(crate::spec::job::mac).collect(),
                    wire: None,
                    wire_wait_s: 0.0,
                    ranks_per_vcpu: domain.ranks_per_vcpu,
                    guest_hz: domain.guest_hz,
                },
            ))
        }
        _ => None,
    };
    let (npb, rank) = match rank {
        Some((npb, rank)) => (npb, Some(rank)),
        None if domain.specs.is_empty() => {
            return Err("it runs no NPB benchmarks to judge where it goes".into());
        }
        None => (crate::spec::job::npb_list(&domain.specs), None),
    };
    Ok(AppState {
        guest: GUEST_NAME.into(),
        npb,
        vcpus: domain.vcpus,
        console: Vec::new(),
        sched: None,
        irq: None,
        rank,
        host_cpus_word: None,
    })
}

/// The node's control socket: its scheduler (as `SchedControl`) and its domains'
/// migrations.
pub struct NodeControl {
    sched: SchedControl,
    driver: Option<Arc<CreditDriver>>,
    slots: Mutex<Vec<(String, Slot)>>,
    /// The domains that run (or ran) here, by name: their progress.
    watches: Mutex<Vec<(String, Watch)>>,
}

impl NodeControl {
    pub fn new(
        sched: SchedControl,
        driver: Option<Arc<CreditDriver>>,
        slots: Vec<(String, Slot)>,
        watches: Vec<(String, Watch)>,
    ) -> NodeControl {
        NodeControl {
            sched,
            driver,
            slots: Mutex::new(slots),
            watches: Mutex::new(watches),
        }
    }

    /// Watches `name`, which arrived here.
    fn watch(&self, name: &str, watch: Watch) {
        let mut watches = self.watches.lock().unwrap_or_else(|e| e.into_inner());
        watches.retain(|(n, _)| n != name);
        watches.push((name.to_string(), watch));
    }

    /// `name`'s progress here, if it runs or ran here.
    fn progress(&self, name: &str) -> Option<DomainProgress> {
        let watch = self
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, w)| w.clone())?;
        let sent = match self.slot(name) {
            Some(Slot::Movable(m)) => m.migrated_to().is_some(),
            _ => false,
        };
        Some(watch.progress(sent))
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<(String, Slot)>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `name`'s slot now.
    pub fn slot(&self, name: &str) -> Option<Slot> {
        self.slots()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, slot)| slot.clone())
    }

    fn set_slot(&self, name: &str, slot: Slot) {
        if let Some(entry) = self.slots().iter_mut().find(|(n, _)| n == name) {
            entry.1 = slot;
        }
    }

    fn migrate_domain(&self, request: &MigrateRequest) -> Result<MigrationReply> {
        let Some(name) = &request.domain else {
            let names: Vec<String> = self.slots().iter().map(|(n, _)| n.clone()).collect();
            bail!(
                "migrate: name the node's domain with --domain ({})",
                names.join(", ")
            );
        };
        let movable = match self.slot(name) {
            Some(Slot::Movable(m)) => m,
            Some(Slot::Fixed(why)) => bail!("migrate --domain {name}: {why}"),
            Some(Slot::Waiting) => bail!("migrate --domain {name}: it has not arrived here yet"),
            None => bail!("migrate --domain {name}: the node has no such domain"),
        };
        if let Some(to) = movable.migrated_to() {
            bail!("migrate --domain {name}: it is moving (or moved) to {to}");
        }
        let address = migrate::parse_tcp(&request.target)?;
        let token = request
            .token_file
            .as_deref()
            .map(migrate::read_token)
            .transpose()?;
        *movable
            .migrated_to
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(request.target.clone());
        let driver = self.driver.clone();
        let sent = migrate::send_vm(
            &movable.hub,
            || movable.app_json(driver.as_deref()),
            address,
            token.as_deref(),
            migrate::pacing(request.max_downtime_ms, request.stop_and_copy),
            request.ack_timeout_ms.map(Duration::from_millis),
        );
        let report = match sent {
            Ok(report) => report,
            Err(e) => {
                *movable
                    .migrated_to
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()) = None;
                return Err(e.context(format!("domain '{name}'")));
            }
        };
        Ok(MigrationReply {
            report,
            target: request.target.clone(),
            domain: Some(name.clone()),
        })
    }
}

impl NodeControl {
    /// What can be told before a domain's migration starts: the domain is named, is
    /// here, can move and is not moving already; the target parses.
    fn check_domain_move(&self, request: &MigrateRequest) -> Result<(), Refused> {
        let Some(name) = &request.domain else {
            let names: Vec<String> = self.slots().iter().map(|(n, _)| n.clone()).collect();
            return Err(Refused::bad(format!(
                "migrate: name the node's domain with --domain ({})",
                names.join(", ")
            )));
        };
        match self.slot(name) {
            Some(Slot::Movable(m)) => match m.migrated_to() {
                Some(to) => Err(Refused::conflict(format!(
                    "migrate --domain {name}: it is moving (or moved) to {to}"
                ))),
                None => Ok(()),
            },
            Some(Slot::Fixed(why)) => {
                Err(Refused::conflict(format!("migrate --domain {name}: {why}")))
            }
            Some(Slot::Waiting) => Err(Refused::conflict(format!(
                "migrate --domain {name}: it has not arrived here yet"
            ))),
            None => Err(Refused::not_found(format!(
                "migrate --domain {name}: the node has no such domain"
            ))),
        }?;
        migrate::parse_tcp(&request.target).map_err(|e| Refused::bad(format!("{e:#}")))?;
        Ok(())
    }
}

/// A node's control: its scheduler's, and its domains' moves.
impl Controlled for NodeControl {
    fn sched(&self) -> &dyn SchedTarget {
        &self.sched
    }
    fn domains(&self) -> Vec<DomainInfo> {
        let mut domains = SchedTarget::domains(&self.sched);
        for info in &mut domains {
            info.progress = self.progress(&info.domain);
        }
        domains
    }
    fn check_migrate(&self, request: &MigrateRequest) -> Result<(), Refused> {
        self.check_domain_move(request)
    }
    fn migrate(&self, request: &MigrateRequest) -> Result<MigrationReply, Refused> {
        self.migrate_domain(request)
            .map_err(|e| Refused::failed(format!("{e:#}")))
    }
}

/// Serves the node's API at `path` (its threads domain 0's).
pub fn serve(
    control: Arc<NodeControl>,
    path: &Path,
    dom0: Arc<ThreadGroup>,
) -> Result<api::Server> {
    let server = api::Server::start(path, control, move || dom0.join_current())?;
    server.announce();
    Ok(server)
}

/// An incoming domain's listener (bound when the node starts) and secret.
pub struct Arrival {
    listener: TcpListener,
    token: Option<Vec<u8>>,
}

/// Binds `domain`'s incoming address and reads its token file.
pub fn listen(domain: &Domain) -> Result<Option<Arrival>> {
    let Some(incoming) = &domain.incoming else {
        return Ok(None);
    };
    let what = || format!("domain '{}'", domain.name);
    let address = migrate::parse_tcp(&incoming.address).with_context(what)?;
    let token = incoming
        .token_file
        .as_deref()
        .map(migrate::read_token)
        .transpose()
        .with_context(what)?;
    let listener = TcpListener::bind(address)
        .with_context(|| format!("domain '{}': cannot listen on {address}", domain.name))?;
    eprintln!(
        "kumo: domain '{}' waits for its VM on {}",
        domain.name,
        listener.local_addr()?
    );
    Ok(Some(Arrival { listener, token }))
}

/// What an incoming domain's thread needs of its node.
pub struct Destination<'a> {
    pub node: &'a Node,
    pub network: Option<&'a Network>,
    pub dom0: &'a Arc<ThreadGroup>,
    pub driver: Option<&'a Arc<CreditDriver>>,
    pub control: &'a NodeControl,
    pub kvm_device: &'a Path,
    pub epoch: Instant,
}

/// An incoming domain's run.
pub struct Arrived {
    pub run: GuestRun,
    pub app: AppState,
}

impl Arrived {
    /// The benchmarks its results are judged on (rank 0's domain prints the job's).
    pub fn specs(&self) -> Vec<npb::Spec> {
        match &self.app.rank {
            Some(rank) if rank.first_rank != 0 => Vec::new(),
            _ => self.app.specs().unwrap_or_default(),
        }
    }
}

/// Waits for `domain`'s VM on `arrival`, receives it, puts it on this node (NICs on
/// the switch, under the scheduler, movable again) and runs it to its end. None: the
/// node was told to stop before any source came (nothing was sent, nothing is lost).
pub fn receive_and_run(
    to: &Destination,
    domain: &Domain,
    arrival: Arrival,
) -> Result<Option<Arrived>> {
    if !wait_for_source(&arrival.listener)? {
        return Ok(None);
    }
    let (mut vm, meta) = migrate::receive_vm_in(
        &arrival.listener,
        arrival.token.as_deref(),
        to.kvm_device,
        Some(to.dom0.clone()),
    )?;
    drop(arrival);
    let app = AppState::parse(&meta.app)?;
    if app.irq.is_some() {
        bail!("the VM runs the interrupt check, which a node's domain does not");
    }
    let mut announce = Vec::new();
    if let Some(rank) = &app.rank {
        rank.check_nics(app.vcpus)?;
        app.specs()?;
        let network = to
            .network
            .context("the VM's NICs need the node's [network] (its switch)")?;
        if to.node.network.as_ref().map(|n| n.nic) == Some(NicKind::Passthrough) {
            bail!("the node's NICs are a NIC server's ports; the VM's NICs are emulated");
        }
        for (k, &mac) in rank.macs.iter().enumerate() {
            let setup = NicSetup {
                mac,
                irq_path: rank.irq_path,
            };
            let port = network
                .attach(&mut vm, &setup, Some(to.dom0))
                .with_context(|| format!("attaching rank {}'s NIC", rank.first_rank + k as u32))?;
            announce.push((port, mac));
        }
    } else {
        app.specs()?;
    }
    // This node's CPUs are what a ballooning guest may use.
    let control = vm.control();
    control
        .host_cpus()
        .set(u32::try_from(to.node.pcpus.len()).unwrap_or(u32::MAX));
    if let Some(gpa) = app.host_cpus_word {
        control.host_cpus().register(vm.memory(), gpa);
    }
    match to.driver {
        Some(driver) => driver.add_domain(DomainSpec {
            name: domain.name.clone(),
            weight: domain.weight as u16,
            cap: domain.cap,
            control: control.clone(),
        })?,
        None => confine_when_started(control.clone(), to.node.pcpus.clone()),
    }
    let console = Arc::new(Mutex::new(app.console.clone()));
    let watch = Watch::new(&vm, console.clone());
    to.control.watch(&domain.name, watch.clone());
    to.control.set_slot(
        &domain.name,
        Slot::Movable(Arc::new(Movable::new(
            &vm,
            watch,
            AppState {
                console: Vec::new(),
                ..app.clone()
            },
        ))),
    );
    if let Some(network) = to.network {
        for (port, mac) in announce {
            network.announce(port, mac);
        }
    }
    eprintln!("kumo: domain '{}' arrived", domain.name);
    let run = run::run_collecting_recorded(vm, to.epoch, Some(console), &app.console)?;
    Ok(Some(Arrived { run, app }))
}

/// Waits until a source connects to `listener` (true) or kumo is told to stop (false).
fn wait_for_source(listener: &TcpListener) -> Result<bool> {
    let _counted = hv::stop::Waiting::enter();
    loop {
        if hv::stop::requested().is_some() {
            return Ok(false);
        }
        let mut fd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, for the length given; the listener outlives it.
        let n = unsafe { libc::poll(&mut fd, 1, 100) };
        if n > 0 {
            return Ok(true);
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e).context("waiting for the source");
            }
        }
    }
}

/// Under the host's scheduler: the VM's vCPU threads go to the node's CPUs once
/// they exist (as the node does for the domains it starts with).
fn confine_when_started(control: Arc<VcpuControl>, pcpus: Vec<usize>) {
    let spawned = std::thread::Builder::new()
        .name("confine".into())
        .spawn(move || {
            if control.wait_started(Duration::from_secs(10)) {
                for vcpu in 0..control.vcpus() {
                    let _ = control.confine(vcpu, &pcpus);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot confine an arriving domain's vCPUs: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(text: &str) -> Node {
        crate::spec::node::parse(text).unwrap()
    }

    const JOB: &str = "pcpus = [0]\n[network]\nnpb = \"cg.S\"\nwait = \"yield\"\n\
        [[domain]]\nname = \"u0\"\nmpi = true\nranks_per_vcpu = 2\nguest_hz = 500\n\
        [[domain]]\nname = \"u1\"\nmpi = true\nranks_per_vcpu = 2\n\
        [[domain]]\nname = \"plain\"\nnpb = \"ep.S\"\n\
        [[domain]]\nname = \"irqd\"\nirq = \"check\"\n";

    #[test]
    fn a_rank_domain_travels_with_its_ranks_and_without_a_wire() {
        let n = node(JOB);
        let app = app_of(&n, &n.domains[1]).unwrap();
        let rank = app.rank.clone().unwrap();
        assert_eq!((rank.first_rank, rank.job_size), (2, 4));
        assert_eq!(rank.ranks_per_vcpu, 2);
        assert_eq!(
            rank.macs,
            vec![crate::spec::job::mac(2), crate::spec::job::mac(3)]
        );
        assert_eq!(rank.wait, Wait::Yield);
        assert!(
            rank.wire.is_none(),
            "the destination's network is its node's"
        );
        assert!(rank.check_nics(1).is_ok());
        assert_eq!(app.specs().unwrap()[0].to_string(), "cg.S");
        assert_eq!(
            app_of(&n, &n.domains[0]).unwrap().rank.unwrap().guest_hz,
            Some(500)
        );
        // A domain outside the job travels as a plain NPB guest.
        let plain = app_of(&n, &n.domains[2]).unwrap();
        assert!(plain.rank.is_none());
        assert_eq!(plain.npb, "ep.S");
        let why = app_of(&n, &n.domains[3]).unwrap_err();
        assert!(why.contains("interrupt test device"), "{why}");
        let net = node(
            "pcpus = [0]\n[network]\n[[domain]]\nname = \"a\"\nmpi = true\n\
             [[domain]]\nname = \"b\"\nmpi = true\n",
        );
        let why = app_of(&net, &net.domains[0]).unwrap_err();
        assert!(why.contains("net= workloads"), "{why}");
    }

    #[test]
    fn a_domain_sent_away_is_moving_until_its_vcpus_end() {
        assert_eq!(state(false, false), DomainState::Running);
        assert_eq!(state(false, true), DomainState::Moving);
        assert_eq!(state(true, true), DomainState::Moved);
        assert_eq!(state(true, false), DomainState::Ended);
    }

    #[test]
    fn a_node_refuses_what_it_cannot_move_in_one_line() {
        use crate::api::Refusal;
        let control = NodeControl::new(
            SchedControl::new(None, Vec::new()),
            None,
            vec![
                ("fixed".into(), Slot::Fixed("it cannot".into())),
                ("later".into(), Slot::Waiting),
            ],
            Vec::new(),
        );
        let request = |domain: Option<&str>| MigrateRequest {
            target: "tcp:127.0.0.1:1".into(),
            token_file: None,
            max_downtime_ms: None,
            ack_timeout_ms: None,
            stop_and_copy: false,
            domain: domain.map(Into::into),
        };
        for (domain, wanted, kind) in [
            (
                None,
                "migrate: name the node's domain with --domain (fixed, later)",
                Refusal::BadValue,
            ),
            (
                Some("fixed"),
                "migrate --domain fixed: it cannot",
                Refusal::Conflict,
            ),
            (
                Some("later"),
                "migrate --domain later: it has not arrived here yet",
                Refusal::Conflict,
            ),
            (
                Some("zz"),
                "migrate --domain zz: the node has no such domain",
                Refusal::NotFound,
            ),
        ] {
            // Refused before the API accepts it (with the status it answers)...
            let checked = control.check_migrate(&request(domain)).unwrap_err();
            assert_eq!((checked.kind, checked.message.as_str()), (kind, wanted));
            // ...and by the migration itself, in the same one line.
            let e = control.migrate(&request(domain)).unwrap_err();
            assert_eq!(e.message, wanted);
            assert!(!e.message.contains('\n'));
        }
    }
}
