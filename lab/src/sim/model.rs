//! The cluster model: per node one `sched::Scheduler` (the code that places real
//! vCPUs in `kumo node`) decides which modelled vCPU each pCPU runs; the vCPUs do
//! modelled work. The parent module's documentation describes the model in words.
//!
//! Event-driven: a binary heap of timed events ordered by (time, insertion number),
//! so ties resolve in a fixed order and a run is deterministic. Events:
//! - `Timer`: a pCPU's scheduler deadline (`next_deadline`: tick, slice end,
//!   accounting) -> `tick`.
//! - `Done`: the running vCPU's current activity completes on its pCPU (a compute
//!   phase or a domain 0 job ends, or a spinning rank sees what it waits for).
//! - `Wake`: an interrupt reaches a halted vCPU (`wake_us` after its cause) -> `wake`.
//! - `Wire`: a message reaches the receiving node's domain 0.
//! - `Alarm`: a sleeping rank's timer, on a vCPU of several ranks (with one rank,
//!   the timer is its vCPU's `Wake`).
//! - `Lost`: a message lost for a full receive ring is resent by its sender's
//!   domain 0 (the sender's TCP retransmission timer expired).
//!
//! A rank vCPU runs its ranks as tasks of a guest scheduler (one task, and no guest
//! tick, unless the domain says otherwise): `Vcpu::act` is what its current task
//! does, the others' activities are parked in their `Rank::parked`. A guest tick is
//! not an event of its own: the running vCPU's `Done` comes at its next tick at the
//! latest, and a tick that fell while it did not run comes at its next progress.
//!
//! `Timer` and `Done` events carry an epoch per pCPU; a newer one
//! makes older ones stale (skipped), so deadlines can move without searching
//! the heap. After every event the pCPUs the scheduler tickled are rescheduled
//! (lowest first) until none is left, as `sched::drive::Sim` does.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use anyhow::{Result, anyhow, bail};
use sched::{PcpuId, Scheduler, Tickles, VcpuId};

use super::config::{Program, Scenario, Sim};
use super::program::Phase;
use kumo_vmm::spec::job::Wait;

/// Check for a deadlock (everyone waiting, nothing on the way) this often.
const DEADLOCK_CHECK_EVERY: u64 = 4096;

fn ns(us: f64) -> u64 {
    (us * 1e3).round() as u64
}

/// Costs in nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Costs {
    switch: u64,
    wake: u64,
    tick: u64,
    send: u64,
    guest_tick: u64,
    guest_switch: u64,
    shm: u64,
    yield_spin: u64,
    dom0_message: u64,
    dom0_kib_us: f64,
    dom0_frame: u64,
    dom0_frame_kib_us: f64,
    frame_payload: f64,
    extra_frames: f64,
    rto: u64,
    /// Receive ring frames per DomU (0: unlimited), and a lost message's first resend.
    ring: f64,
    lost_resend: u64,
    latency: u64,
    mb_s: f64,
}

impl Costs {
    fn new(c: &super::config::Costs) -> Self {
        Costs {
            switch: ns(c.switch_us),
            wake: ns(c.wake_us),
            tick: ns(c.tick_us),
            send: ns(c.send_us),
            guest_tick: ns(c.guest_tick_us),
            guest_switch: ns(c.guest_switch_us),
            shm: ns(c.shm_us),
            yield_spin: ns(c.yield_spin_us),
            dom0_message: ns(c.dom0_per_message_us),
            dom0_kib_us: c.dom0_per_kib_us,
            dom0_frame: ns(c.dom0_per_frame_us),
            dom0_frame_kib_us: c.dom0_per_frame_kib_us,
            frame_payload: c.frame_payload_bytes,
            extra_frames: c.extra_frames_per_message,
            rto: ns(c.retransmit_after_ms * 1e3),
            ring: c.rx_ring_frames,
            lost_resend: ns(c.lost_resend_ms * 1e3),
            latency: ns(c.network_latency_us),
            mb_s: c.network_mb_s,
        }
    }

    /// Domain 0's CPU for one side of a message.
    fn dom0(&self, bytes: u64) -> u64 {
        self.dom0_message + ns(self.dom0_kib_us * bytes as f64 / 1024.0)
    }

    /// Frames a message of `bytes` takes through a switch: its data frames (the
    /// stream's 16-byte message header included) and the extra ones (acknowledgements),
    /// with the bytes they carry (an extra frame is a minimum frame: 60 bytes).
    fn frames(&self, bytes: u64) -> (f64, f64) {
        let data = self.data_frames(bytes);
        (
            data + self.extra_frames,
            bytes as f64 + 60.0 * self.extra_frames,
        )
    }

    /// Domain 0's CPU for a message entering a node's switch (from a rank, or from
    /// the wire): its side of the message and its frames.
    fn dom0_entering(&self, bytes: u64) -> u64 {
        self.dom0(bytes) + self.dom0_frames(bytes)
    }

    /// Domain 0's per-frame CPU for a message entering a node's switch.
    fn dom0_frames(&self, bytes: u64) -> u64 {
        if self.dom0_frame == 0 && self.dom0_frame_kib_us == 0.0 {
            return 0;
        }
        let (frames, wire_bytes) = self.frames(bytes);
        (frames * self.dom0_frame as f64).round() as u64
            + ns(self.dom0_frame_kib_us * wire_bytes / 1024.0)
    }

    /// Domain 0's CPU for what the sender's retransmission timer adds to a message
    /// acknowledged `delay` after it was sent (its receiver consumed it), as kumo's
    /// guest MPI does (`guests/user/src/mpi.rs`): a probe and its answer per timeout
    /// (the timer doubles from `rto`, up to 20 times it). Nothing is sent again: a
    /// probe that arrives after the data it repeats is answered without GAP. 0 if
    /// it was acknowledged in time.
    fn dom0_resend(&self, delay: u64) -> u64 {
        if self.rto == 0 || delay <= self.rto {
            return 0;
        }
        let (mut timeouts, mut at, mut rto) = (0u64, 0u64, self.rto);
        while at + rto < delay {
            at += rto;
            timeouts += 1;
            rto = (rto * 2).min(20 * self.rto);
        }
        let frames = 2.0 * timeouts as f64;
        let wire_bytes = 120.0 * timeouts as f64;
        (frames * self.dom0_frame as f64).round() as u64
            + ns(self.dom0_frame_kib_us * wire_bytes / 1024.0)
    }

    /// A message's data frames (the stream's 16-byte header included).
    fn data_frames(&self, bytes: u64) -> f64 {
        ((bytes as f64 + 16.0) / self.frame_payload).ceil()
    }

    /// When a message lost `losses` times so far is resent, after its latest loss:
    /// the retransmission timeout, doubled per earlier loss, at most 120 s (Linux's
    /// TCP_RTO_MAX).
    fn resend_after(&self, losses: u32) -> u64 {
        (self.lost_resend << losses.min(20)).min(120_000_000_000)
    }

    /// Time on the link (1 MB/s = 1 byte/us, so bytes * 1000 / MB/s is ns).
    fn serialize(&self, bytes: u64) -> u64 {
        (bytes as f64 * 1e3 / self.mb_s).round() as u64
    }
}

/// One run's results, in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Every rank finished within the duration.
    pub finished: bool,
    /// When the last rank finished; the duration if not all did.
    pub end_ns: u64,
    /// Per node, per domain (domain 0 first), summed over its vCPUs.
    pub domains: Vec<Vec<Usage>>,
    pub ranks: Vec<RankOutcome>,
    /// Per node: times a pCPU started running another vCPU than the one it ran last.
    pub switches: Vec<u64>,
    pub messages: u64,
    pub events: u64,
    /// Times a directed yield BOOSTed a rank's vCPU (`directed_yield`), all nodes.
    pub directed_boosts: u64,
    /// Guest ticks delivered and rank switches inside guests, all vCPUs.
    pub guest_ticks: u64,
    pub guest_switches: u64,
    /// Messages lost for a full receive ring (each loss counted; `rx_ring_frames`).
    pub lost: u64,
    /// With the auto slice: per node, its epochs, those in the short setting, and its
    /// changes of setting.
    pub auto_slice: Option<Vec<(u64, u64, usize)>>,
}

/// CPU a vCPU (or domain) received, split by what it did with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Everything: from dispatch to deschedule.
    pub cpu_ns: u64,
    /// Useful work: compute phases, send costs, domain 0 jobs.
    pub work_ns: u64,
    /// Busy-waiting for a message or for domain 0.
    pub spin_ns: u64,
    /// The rest: switch and tick costs, the guest's ticks and rank switches.
    pub overhead_ns: u64,
}

impl Usage {
    fn add(&mut self, o: &Usage) {
        self.cpu_ns += o.cpu_ns;
        self.work_ns += o.work_ns;
        self.spin_ns += o.spin_ns;
        self.overhead_ns += o.overhead_ns;
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RankOutcome {
    pub finish_ns: Option<u64>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Msg {
    from: u32,
    to: u32,
    bytes: u64,
    /// When its sender handed it on (its retransmission timer starts).
    sent_at: u64,
    /// Times it was lost for a full receive ring.
    losses: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Timer { node: u32, pcpu: u32, epoch: u32 },
    Done { node: u32, pcpu: u32, epoch: u32 },
    Wake { vcpu: u32 },
    Wire { msg: Msg },
    Alarm { rank: u32 },
    Lost { msg: Msg },
}

/// What a vCPU is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Needs this much more CPU progress (0: continue as soon as it runs).
    Work(u64),
    /// A rank busy-waiting: runnable, burning CPU, until its wait is satisfied.
    Spin,
    /// Halted: blocked in the scheduler (waiting, finished, or domain 0 idle).
    Off,
}

#[derive(Debug, Clone, Copy)]
enum Job {
    /// Domain 0's sending side of a message.
    Send(Msg),
    /// Domain 0's receiving side: then the message is delivered.
    Receive(Msg),
    /// Work a rank asked for (`io:US`); the rank waits for it.
    Io(u32),
    /// Frames a sender's retransmission timer sent again (no effect but the CPU).
    Resend,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Dom0,
    /// Runs ranks (`Vcpu::tasks`).
    Ranks,
}

/// The guest scheduler of a rank vCPU: its ranks are tasks, switched round robin
/// when the current one has had `slice_ticks` of its periodic ticks, and when it
/// yields or sleeps.
struct Guest {
    /// Its ranks, task order (task k is rank `tasks[0] + k`).
    tasks: Vec<usize>,
    current: usize,
    /// Nanoseconds between ticks (0: no tick).
    period: u64,
    /// Ticks a task keeps the vCPU (1: it is switched at every tick).
    slice_ticks: u32,
    /// Ticks the current task has left of its slice.
    slice_left: u32,
    /// When the next tick comes (host time, a multiple of `period`); one in the past
    /// is pending (it came while the vCPU did not run).
    next_tick: u64,
    /// Guest kernel CPU (ticks, switches) the vCPU owes before its task progresses.
    debt: u64,
    /// With `wait = "yield"` and `yield_spin_us`: the current task's poll left before
    /// it yields, in progress of the vCPU.
    poll_left: u64,
}

struct Vcpu {
    node: usize,
    id: VcpuId,
    /// Index into the node's domains (0 = domain 0).
    domain: usize,
    role: Role,
    act: Act,
    /// Domain 0: the job in progress.
    job: Option<(Job, u64)>,
    /// The pCPU it runs on.
    pcpu: Option<usize>,
    /// A `Wake` event is on the way.
    wake_pending: bool,
    usage: Usage,
    guest: Guest,
    /// Frames in its domain's receive ring that the guest has not drained (it drains
    /// them when it runs).
    ring: f64,
}

struct Rank {
    vcpu: usize,
    /// Its task's activity while another task of the vCPU is current.
    parked: Act,
    /// Its share of the vCPU's time (with several ranks per vCPU).
    usage: Usage,
    body: Vec<Phase>,
    iteration: u64,
    index: usize,
    /// The current phase's CPU part is done (compute, send) or it was issued (io,
    /// sleep).
    started: bool,
    io_done: bool,
    /// Messages arrived and not yet received, by sender.
    mailbox: Vec<u32>,
    /// When the messages in its mailbox that came through domain 0 were sent, by
    /// sender, oldest first (their senders' retransmission timers run until it
    /// consumes them and acknowledges).
    unacked: std::collections::BTreeMap<u32, VecDeque<u64>>,
    /// By sender: when this rank last acknowledged one (a sender has one timer per
    /// peer, restarted by progress).
    acked_at: std::collections::BTreeMap<u32, u64>,
    finish: Option<u64>,
}

struct Pcpu {
    running: Option<usize>,
    /// The last vCPU it ran (switching to another one costs `switch`).
    last: Option<usize>,
    dispatched: u64,
    /// The running vCPU makes progress from here on (after switch and tick costs).
    progress_from: u64,
    timer_at: u64,
    timer_epoch: u32,
    done_epoch: u32,
}

struct Node {
    sched: Scheduler,
    pcpus: Vec<Pcpu>,
    /// Local vCPU id -> index into `Model::vcpus`.
    local: Vec<usize>,
    dom0: Vec<usize>,
    jobs: VecDeque<(Job, u64)>,
    /// The link is busy sending until then.
    link_free: u64,
    tickles: Tickles,
    switches: u64,
    /// When domain 0 was last given work (kumo's driver ticks while it is busy).
    dom0_busy_at: Option<u64>,
}

struct Model<'a> {
    program: &'a Program,
    wait: Wait,
    costs: Costs,
    duration: u64,
    now: u64,
    nodes: Vec<Node>,
    vcpus: Vec<Vcpu>,
    ranks: Vec<Rank>,
    heap: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    /// `Wake` and `Wire` events in the heap (work on the way).
    in_flight: u64,
    unfinished: usize,
    messages: u64,
    events: u64,
    /// Events between deadlock checks (`DEADLOCK_CHECK_EVERY`; tests check at each).
    deadlock_check_every: u64,
    guest_ticks: u64,
    guest_switches: u64,
    lost: u64,
}

/// Runs `program` on the cluster of `sim` under `scenario`.
pub fn simulate(sim: &Sim, program: &Program, scenario: &Scenario) -> Result<Outcome> {
    let mut model = Model::build(sim, program, scenario)?;
    model.run()?;
    Ok(model.outcome())
}

impl<'a> Model<'a> {
    fn build(sim: &Sim, program: &'a Program, scenario: &Scenario) -> Result<Self> {
        let n_ranks = sim.ranks.len();
        let mut m = Model {
            program,
            wait: scenario.wait.unwrap_or(program.wait),
            costs: Costs::new(&sim.costs),
            duration: sim.duration_ns,
            now: 0,
            nodes: Vec::new(),
            vcpus: Vec::new(),
            ranks: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            in_flight: 0,
            unfinished: 0,
            messages: 0,
            events: 0,
            deadlock_check_every: DEADLOCK_CHECK_EVERY,
            guest_ticks: 0,
            guest_switches: 0,
            lost: 0,
        };
        for (n, node) in sim.nodes.iter().enumerate() {
            let mut sched = Scheduler::new(scenario.params, node.pcpus, 0)
                .map_err(|e| anyhow!("node '{}': {e}", node.name))?;
            sched.set_auto(0, scenario.auto_slice);
            let mut local = Vec::new();
            let mut dom0 = Vec::new();
            for (d, domain) in node.domains.iter().enumerate() {
                let (weight, cap) = scenario.shares[n][d];
                let (hz, slice_ticks) = scenario.guest(domain);
                let period = hz.map_or(0, |hz| (1e9 / f64::from(hz)).round() as u64);
                let dom = sched
                    .add_domain(weight as u16, cap)
                    .map_err(|e| anyhow!("node '{}' domain '{}': {e}", node.name, domain.name))?;
                for _ in 0..domain.vcpus {
                    let id = sched
                        .add_vcpu(0, dom)
                        .map_err(|e| anyhow!("node '{}': {e}", node.name))?;
                    let index = m.vcpus.len();
                    let mut tasks = Vec::new();
                    let role = if d == 0 {
                        dom0.push(index);
                        Role::Dom0
                    } else {
                        // Ranks in order: this vCPU's R consecutive ones (config).
                        for _ in 0..domain.ranks_per_vcpu {
                            let r = m.ranks.len();
                            tasks.push(r);
                            m.ranks.push(Rank {
                                vcpu: index,
                                parked: Act::Work(0),
                                usage: Usage::default(),
                                body: program.bodies[r].clone(),
                                iteration: 0,
                                index: 0,
                                started: false,
                                io_done: false,
                                mailbox: vec![0; n_ranks],
                                unacked: Default::default(),
                                acked_at: Default::default(),
                                finish: None,
                            });
                        }
                        Role::Ranks
                    };
                    local.push(index);
                    m.vcpus.push(Vcpu {
                        node: n,
                        id,
                        domain: d,
                        role,
                        act: Act::Off,
                        job: None,
                        pcpu: None,
                        wake_pending: false,
                        usage: Usage::default(),
                        guest: Guest {
                            tasks,
                            current: 0,
                            period,
                            slice_ticks,
                            slice_left: slice_ticks,
                            next_tick: period,
                            debt: 0,
                            poll_left: 0,
                        },
                        ring: 0.0,
                    });
                }
            }
            let pcpus = (0..node.pcpus)
                .map(|_| Pcpu {
                    running: None,
                    last: None,
                    dispatched: 0,
                    progress_from: 0,
                    timer_at: u64::MAX,
                    timer_epoch: 0,
                    done_epoch: 0,
                })
                .collect();
            m.nodes.push(Node {
                sched,
                pcpus,
                local,
                dom0,
                jobs: VecDeque::new(),
                link_free: 0,
                tickles: Tickles::new(),
                switches: 0,
                dom0_busy_at: None,
            });
        }
        if m.ranks.len() != n_ranks {
            bail!(
                "internal: {} ranks placed, {n_ranks} expected",
                m.ranks.len()
            );
        }
        // Every rank starts at once (no wake-up cost: the program is started, not
        // interrupted); domain 0 stays halted until it has work. Each vCPU starts
        // with its first task (the others are parked, ready to start).
        m.unfinished = m.ranks.len();
        for r in 0..m.ranks.len() {
            let v = m.ranks[r].vcpu;
            if m.vcpus[v].guest.tasks[0] != r {
                continue;
            }
            m.vcpus[v].act = Act::Work(0);
            let (node, id) = (m.vcpus[v].node, m.vcpus[v].id);
            let t = m.nodes[node].sched.wake(0, id);
            m.nodes[node].tickles.extend(t);
        }
        for n in 0..m.nodes.len() {
            m.reschedule(n);
            for p in 0..m.nodes[n].pcpus.len() {
                m.refresh_timer(n, p);
            }
        }
        Ok(m)
    }

    fn push(&mut self, at: u64, event: Event) {
        if matches!(
            event,
            Event::Wake { .. } | Event::Wire { .. } | Event::Alarm { .. } | Event::Lost { .. }
        ) {
            self.in_flight += 1;
        }
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, event)));
    }

    fn run(&mut self) -> Result<()> {
        while self.unfinished > 0 {
            let Some(Reverse((at, _, event))) = self.heap.pop() else {
                bail!("internal: no event left with ranks unfinished");
            };
            if at > self.duration {
                self.now = self.duration;
                // Cut short: say so if it would never have finished.
                return if self.in_flight == 0 {
                    self.check_deadlock()
                } else {
                    Ok(())
                };
            }
            self.now = at;
            self.events += 1;
            match event {
                Event::Timer { node, pcpu, epoch } => {
                    self.on_timer(node as usize, pcpu as usize, epoch)
                }
                Event::Done { node, pcpu, epoch } => {
                    self.on_done(node as usize, pcpu as usize, epoch)
                }
                Event::Wake { vcpu } => self.on_wake(vcpu as usize),
                Event::Wire { msg } => self.on_wire(msg),
                Event::Alarm { rank } => self.on_alarm(rank as usize),
                Event::Lost { msg } => self.on_lost(msg),
            }
            if self.in_flight == 0 && self.events.is_multiple_of(self.deadlock_check_every) {
                self.check_deadlock()?;
            }
        }
        Ok(())
    }

    // ---- events ----

    fn on_timer(&mut self, n: usize, p: usize, epoch: u32) {
        if self.nodes[n].pcpus[p].timer_epoch != epoch {
            return;
        }
        self.nodes[n].pcpus[p].timer_at = u64::MAX;
        let t = self.nodes[n].sched.tick(self.now, PcpuId(p as u32));
        self.nodes[n].tickles.extend(t);
        if self.costs.tick > 0 && self.nodes[n].pcpus[p].running.is_some() && self.ticking(n) {
            self.settle(n, p);
            let pc = &mut self.nodes[n].pcpus[p];
            pc.progress_from = pc.progress_from.max(self.now) + self.costs.tick;
            self.refresh_done(n, p);
        }
        self.refresh_timer(n, p);
        self.reschedule(n);
    }

    /// Whether kumo's credit driver runs at this tick: it sleeps tickless while no
    /// tick can change who runs (`hv::credit`): no pCPU has a vCPU waiting for it, and
    /// domain 0 has had no work for [`hv::credit::QUIET_BEFORE_TICKLESS`].
    fn ticking(&self, n: usize) -> bool {
        let node = &self.nodes[n];
        let quiet = hv::credit::QUIET_BEFORE_TICKLESS.as_nanos() as u64;
        let dom0_busy = node
            .dom0_busy_at
            .is_some_and(|at| self.now.saturating_sub(at) < quiet);
        let waiting = (0..node.local.len())
            .any(|i| node.sched.vcpu_stats(VcpuId(i as u32)).state == sched::VcpuState::Runnable);
        dom0_busy || waiting
    }

    fn on_done(&mut self, n: usize, p: usize, epoch: u32) {
        if self.nodes[n].pcpus[p].done_epoch != epoch {
            return;
        }
        let Some(v) = self.nodes[n].pcpus[p].running else {
            return;
        };
        self.settle(n, p);
        let ticked = self.guest_tick(v);
        let complete = self.vcpus[v].guest.debt == 0
            && match self.vcpus[v].act {
                Act::Work(left) => left == 0,
                Act::Spin => self.ready(v),
                Act::Off => false,
            };
        if complete {
            match self.vcpus[v].role {
                Role::Dom0 => self.dom0_next(v),
                Role::Ranks => self.advance(self.current(v)),
            }
        }
        // A yielding poller whose poll ended hands the vCPU on.
        let vc = &self.vcpus[v];
        let polled = !complete && vc.act == Act::Spin && vc.guest.debt == 0;
        let mut yielded = false;
        if polled
            && vc.guest.poll_left == 0
            && let Some(k) = self.yield_target(v)
        {
            self.switch_task(v, k);
            yielded = true;
        }
        if (complete || ticked || yielded) && self.vcpus[v].pcpu == Some(p) {
            self.refresh_done(n, p);
        }
        self.reschedule(n);
    }

    fn on_wake(&mut self, v: usize) {
        self.in_flight -= 1;
        self.vcpus[v].wake_pending = false;
        let (n, id) = (self.vcpus[v].node, self.vcpus[v].id);
        let t = self.nodes[n].sched.wake(self.now, id);
        self.nodes[n].tickles.extend(t);
        self.reschedule(n);
    }

    fn on_wire(&mut self, msg: Msg) {
        self.in_flight -= 1;
        let n = self.vcpus[self.ranks[msg.to as usize].vcpu].node;
        let cost = self.costs.dom0_entering(msg.bytes);
        self.dom0_enqueue(n, Job::Receive(msg), cost);
        self.reschedule(n);
    }

    /// A lost message's resend: its sender's domain 0 sends it again.
    fn on_lost(&mut self, msg: Msg) {
        self.in_flight -= 1;
        let n = self.vcpus[self.ranks[msg.from as usize].vcpu].node;
        let cost = self.costs.dom0_entering(msg.bytes);
        self.dom0_enqueue(n, Job::Send(msg), cost);
        self.reschedule(n);
    }

    /// A sleeping rank's timer (on a vCPU of several ranks) expired.
    fn on_alarm(&mut self, r: usize) {
        self.in_flight -= 1;
        self.resume(r, false);
        self.reschedule(self.vcpus[self.ranks[r].vcpu].node);
    }

    // ---- pCPUs ----

    /// Counts the running vCPU's progress up to now: the guest's debt first, then
    /// its current task's activity.
    fn settle(&mut self, n: usize, p: usize) {
        let now = self.now;
        let pc = &mut self.nodes[n].pcpus[p];
        let Some(v) = pc.running else { return };
        if now <= pc.progress_from {
            return;
        }
        let d = now - pc.progress_from;
        pc.progress_from = now;
        let vc = &mut self.vcpus[v];
        let paid = d.min(vc.guest.debt);
        vc.guest.debt -= paid;
        let rest = d - paid;
        if vc.act == Act::Spin {
            vc.guest.poll_left = vc.guest.poll_left.saturating_sub(rest);
        }
        let (work, spin) = match &mut vc.act {
            Act::Work(left) => {
                let done = rest.min(*left);
                *left -= done;
                (done, 0)
            }
            Act::Spin => (0, rest),
            Act::Off => (0, 0),
        };
        vc.usage.work_ns += work;
        vc.usage.spin_ns += spin;
        if vc.guest.tasks.len() > 1 {
            let u = &mut self.ranks[vc.guest.tasks[vc.guest.current]].usage;
            u.cpu_ns += d;
            u.work_ns += work;
            u.spin_ns += spin;
        }
    }

    /// (Re)plans the `Done` event of what `p` runs: when its activity completes, or
    /// its next guest tick if that comes first.
    fn refresh_done(&mut self, n: usize, p: usize) {
        let pc = &mut self.nodes[n].pcpus[p];
        pc.done_epoch = pc.done_epoch.wrapping_add(1);
        let epoch = pc.done_epoch;
        let Some(v) = pc.running else { return };
        let from = pc.progress_from.max(self.now);
        let g = &self.vcpus[v].guest;
        let done = match self.vcpus[v].act {
            Act::Work(left) => Some(from + g.debt + left),
            Act::Spin if self.ready(v) => Some(from + g.debt),
            // Its poll ends and it yields.
            Act::Spin if self.yield_target(v).is_some() => Some(from + g.debt + g.poll_left),
            Act::Spin => None,
            Act::Off => return,
        };
        let tick = (g.period > 0).then(|| g.next_tick.max(from));
        let Some(at) = done.into_iter().chain(tick).min() else {
            return;
        };
        let (node, pcpu) = (n as u32, p as u32);
        self.push(at, Event::Done { node, pcpu, epoch });
    }
    fn refresh_timer(&mut self, n: usize, p: usize) {
        let at = self.nodes[n].sched.next_deadline(PcpuId(p as u32));
        let pc = &mut self.nodes[n].pcpus[p];
        if at == pc.timer_at {
            return;
        }
        pc.timer_at = at;
        pc.timer_epoch = pc.timer_epoch.wrapping_add(1);
        let epoch = pc.timer_epoch;
        if at != u64::MAX {
            let (node, pcpu) = (n as u32, p as u32);
            self.push(at.max(self.now), Event::Timer { node, pcpu, epoch });
        }
    }

    /// Runs `schedule` on every tickled pCPU of node `n` until none is left.
    fn reschedule(&mut self, n: usize) {
        while let Some(p) = self.nodes[n].tickles.pop_first() {
            let d = self.nodes[n].sched.schedule(self.now, p);
            self.nodes[n].tickles.extend(d.tickles);
            let run = d.run.map(|id| self.nodes[n].local[id.0 as usize]);
            self.dispatch(n, p.0 as usize, run);
            self.refresh_timer(n, p.0 as usize);
        }
    }

    /// Mirrors a decision: the previous vCPU stops (its progress and CPU time are
    /// counted), the new one makes progress after the switch cost.
    fn dispatch(&mut self, n: usize, p: usize, run: Option<usize>) {
        let prev = self.nodes[n].pcpus[p].running;
        if prev == run {
            return;
        }
        let now = self.now;
        if let Some(v) = prev {
            self.settle(n, p);
            let pc = &self.nodes[n].pcpus[p];
            let vc = &mut self.vcpus[v];
            vc.usage.cpu_ns += now - pc.dispatched;
            vc.pcpu = None;
        }
        let node = &mut self.nodes[n];
        let pc = &mut node.pcpus[p];
        pc.running = run;
        if let Some(v) = run {
            let cost = match pc.last {
                Some(last) if last != v => {
                    node.switches += 1;
                    self.costs.switch
                }
                _ => 0,
            };
            pc.last = Some(v);
            pc.dispatched = now;
            pc.progress_from = now + cost;
            self.vcpus[v].pcpu = Some(p);
            // The guest drains its receive ring as soon as it runs.
            self.vcpus[v].ring = 0.0;
        }
        self.refresh_done(n, p);
    }

    fn block(&mut self, v: usize) {
        let (n, id) = (self.vcpus[v].node, self.vcpus[v].id);
        let t = self.nodes[n].sched.block(self.now, id);
        self.nodes[n].tickles.extend(t);
    }

    /// An interrupt for halted `v`: it is woken `wake_us` from now.
    fn wake_later(&mut self, v: usize) {
        if !self.vcpus[v].wake_pending {
            self.vcpus[v].wake_pending = true;
            let at = self.now + self.costs.wake;
            self.push(at, Event::Wake { vcpu: v as u32 });
        }
    }

    // ---- domain 0 ----

    fn dom0_enqueue(&mut self, n: usize, job: Job, cost: u64) {
        self.nodes[n].jobs.push_back((job, cost));
        self.nodes[n].dom0_busy_at = Some(self.now);
        // A domain 0 vCPU awake and between jobs will take it; else wake one.
        let dom0 = &self.nodes[n].dom0;
        let free = dom0
            .iter()
            .any(|&v| self.vcpus[v].job.is_none() && self.vcpus[v].act != Act::Off);
        if free {
            return;
        }
        if let Some(&v) = dom0.iter().find(|&&v| self.vcpus[v].act == Act::Off) {
            self.vcpus[v].act = Act::Work(0);
            self.wake_later(v);
        }
    }

    /// Domain 0 vCPU `v` (running) finished its job, or was woken for one: it
    /// completes the job and takes the next, or halts.
    fn dom0_next(&mut self, v: usize) {
        if let Some((job, _)) = self.vcpus[v].job.take() {
            self.dom0_done(v, job);
        }
        let n = self.vcpus[v].node;
        match self.nodes[n].jobs.pop_front() {
            Some((job, cost)) => {
                self.vcpus[v].job = Some((job, cost));
                self.vcpus[v].act = Act::Work(cost);
            }
            None => {
                self.vcpus[v].act = Act::Off;
                self.block(v);
            }
        }
    }

    fn dom0_done(&mut self, v: usize, job: Job) {
        let n = self.vcpus[v].node;
        match job {
            Job::Send(msg) => {
                let to = self.vcpus[self.ranks[msg.to as usize].vcpu].node;
                if to == n {
                    // Domain to domain on one node: domain 0 copies it in as well.
                    self.dom0_enqueue(n, Job::Receive(msg), self.costs.dom0(msg.bytes));
                } else {
                    let node = &mut self.nodes[n];
                    let start = node.link_free.max(self.now);
                    node.link_free = start + self.costs.serialize(msg.bytes);
                    let at = node.link_free + self.costs.latency;
                    self.push(at, Event::Wire { msg });
                }
            }
            Job::Receive(msg) => {
                let r = msg.to as usize;
                if !self.fits_ring(r, msg) {
                    return;
                }
                self.ranks[r].mailbox[msg.from as usize] += 1;
                if self.costs.rto > 0 {
                    let q = self.ranks[r].unacked.entry(msg.from).or_default();
                    q.push_back(msg.sent_at);
                }
                self.notify(r, None);
            }
            Job::Io(r) => {
                self.ranks[r as usize].io_done = true;
                self.notify(r as usize, None);
            }
            Job::Resend => {}
        }
    }

    /// Whether domain 0 can put all of `msg` into its receiver's ring: always while
    /// the receiving vCPU runs (it drains what comes) or with an unlimited ring; else
    /// if its frames fit beside those waiting. Of one that does not fit, the frames
    /// that do are kept (the ring is then full) and the rest is lost: the sender's
    /// TCP resends that rest later (`Event::Lost`), and the message is there when
    /// all of it is.
    fn fits_ring(&mut self, r: usize, msg: Msg) -> bool {
        let v = self.ranks[r].vcpu;
        if self.costs.ring <= 0.0 || self.vcpus[v].pcpu.is_some() {
            return true;
        }
        let frames = self.costs.data_frames(msg.bytes);
        let vc = &mut self.vcpus[v];
        let free = (self.costs.ring - vc.ring).floor();
        if frames <= free {
            vc.ring += frames;
            return true;
        }
        vc.ring = self.costs.ring;
        self.lost += 1;
        let kept = (free * self.costs.frame_payload) as u64;
        let at = self.now + self.costs.resend_after(msg.losses);
        let rest = Msg {
            bytes: msg.bytes.saturating_sub(kept).max(1),
            losses: msg.losses + 1,
            ..msg
        };
        self.push(at, Event::Lost { msg: rest });
        false
    }

    // ---- ranks ----

    fn phase(&self, r: usize) -> Option<Phase> {
        let rank = &self.ranks[r];
        if rank.iteration == self.program.iterations || rank.body.is_empty() {
            None
        } else {
            Some(rank.body[rank.index])
        }
    }

    fn next_phase(&mut self, r: usize) {
        let rank = &mut self.ranks[r];
        rank.started = false;
        rank.index += 1;
        if rank.index == rank.body.len() {
            rank.index = 0;
            rank.iteration += 1;
        }
    }

    /// The rank rank vCPU `v` runs now.
    fn current(&self, v: usize) -> usize {
        let g = &self.vcpus[v].guest;
        g.tasks[g.current]
    }

    /// What rank `r` does, current on its vCPU or parked.
    fn task_act(&self, r: usize) -> Act {
        let v = self.ranks[r].vcpu;
        if self.current(v) == r {
            self.vcpus[v].act
        } else {
            self.ranks[r].parked
        }
    }

    /// Whether rank `r` can go on with its current phase (what it waits for is there).
    fn rank_ready(&self, r: usize) -> bool {
        let rank = &self.ranks[r];
        match self.phase(r) {
            Some(Phase::Recv { from }) => rank.mailbox[from as usize] > 0,
            Some(Phase::Io(_)) => rank.io_done,
            _ => false,
        }
    }

    /// Whether rank vCPU `v`'s current rank can go on.
    fn ready(&self, v: usize) -> bool {
        match self.vcpus[v].role {
            Role::Dom0 => false,
            Role::Ranks => self.rank_ready(self.current(v)),
        }
    }

    // ---- the guest scheduler ----

    /// The task the guest switches to from the current one: the next in round-robin
    /// order that can run. A task polling for a message counts when waits spin (it
    /// burns its slice), not when they yield (it would hand the vCPU straight on).
    fn pick(&self, v: usize) -> Option<usize> {
        let g = &self.vcpus[v].guest;
        let k = g.tasks.len();
        (1..k)
            .map(|i| (g.current + i) % k)
            .find(|&t| match self.ranks[g.tasks[t]].parked {
                Act::Work(_) => true,
                Act::Spin => self.wait == Wait::Spin || self.rank_ready(g.tasks[t]),
                Act::Off => false,
            })
    }

    /// With `yield_spin_us`, the task a polling task of vCPU `v` yields to when its
    /// poll ends: the next in round-robin order that is not blocked, a poller too
    /// (`sched_yield` runs any runnable task, so ranks that all wait take turns
    /// polling, each for `yield_spin_us` and a switch); none when it has no other.
    fn yield_target(&self, v: usize) -> Option<usize> {
        if self.wait != Wait::Yield || self.costs.yield_spin == 0 {
            return None;
        }
        let g = &self.vcpus[v].guest;
        let k = g.tasks.len();
        (1..k)
            .map(|i| (g.current + i) % k)
            .find(|&t| self.ranks[g.tasks[t]].parked != Act::Off)
    }

    /// The guest switches vCPU `v` to its task `k` (at `guest_switch_us`).
    fn switch_task(&mut self, v: usize, k: usize) {
        if let Some(p) = self.vcpus[v].pcpu {
            self.settle(self.vcpus[v].node, p);
        }
        let vc = &mut self.vcpus[v];
        let (old, new) = (vc.guest.tasks[vc.guest.current], vc.guest.tasks[k]);
        self.ranks[old].parked = vc.act;
        vc.act = self.ranks[new].parked;
        vc.guest.current = k;
        vc.guest.slice_left = vc.guest.slice_ticks;
        vc.guest.debt += self.costs.guest_switch;
        vc.guest.poll_left = self.costs.yield_spin;
        self.guest_switches += 1;
    }

    /// Delivers running vCPU `v`'s guest tick if one is due (one that came while it
    /// did not run comes now: coalesced, at most one): the tick's cost, and, if the
    /// current task's slice is over, the next task round robin. True if it ticked.
    /// The slice counts the ticks the vCPU received, as Linux's `scheduler_tick`
    /// does: a vCPU kept off its pCPU for many tick periods gets one, so its tasks'
    /// slices last longer in host time.
    fn guest_tick(&mut self, v: usize) -> bool {
        let vc = &mut self.vcpus[v];
        let g = &mut vc.guest;
        if g.period == 0 || self.now < g.next_tick || vc.act == Act::Off {
            return false;
        }
        g.next_tick = (self.now / g.period + 1) * g.period;
        g.debt += self.costs.guest_tick;
        self.guest_ticks += 1;
        g.slice_left = g.slice_left.saturating_sub(1);
        if g.slice_left > 0 {
            return true;
        }
        g.slice_left = g.slice_ticks;
        if let Some(k) = self.pick(v) {
            self.switch_task(v, k);
        }
        true
    }

    /// Vcpu `v`'s current task stopped (blocked, asleep, finished): the guest runs
    /// another, or the vCPU halts.
    fn leave(&mut self, v: usize) {
        match self.pick(v) {
            Some(k) => self.switch_task(v, k),
            None => self.block(v),
        }
    }

    /// Rank `r`, off (blocked or asleep), can run again. The current task of a
    /// halted vCPU: the vCPU is woken. Parked: see `hand_over`.
    fn resume(&mut self, r: usize, interrupt: bool) {
        let v = self.ranks[r].vcpu;
        if self.current(v) == r {
            self.vcpus[v].act = Act::Work(0);
            self.wake_later(v);
            return;
        }
        self.ranks[r].parked = Act::Work(0);
        self.hand_over(v, r, interrupt);
    }

    /// Parked rank `r` of vCPU `v` can go on. The guest switches to it now if the
    /// vCPU is halted (and wakes it), if `interrupt` (an interrupt from outside the
    /// vCPU: the guest's wake-up switch), or if the current task only polls with
    /// `wait = "yield"` (its next idle poll yields); else the next tick, yield or
    /// block picks it (as a shared-memory bell rung on the same vCPU).
    fn hand_over(&mut self, v: usize, r: usize, interrupt: bool) {
        let halted = self.vcpus[v].act == Act::Off;
        // A yielding poller with a poll of its own hands over when that poll ends.
        let polling = self.wait == Wait::Yield
            && self.costs.yield_spin == 0
            && self.vcpus[v].act == Act::Spin
            && !self.ready(v);
        if !(halted || interrupt || polling) {
            return;
        }
        let k = r - self.vcpus[v].guest.tasks[0];
        self.switch_task(v, k);
        if halted {
            self.wake_later(v);
        } else if let Some(p) = self.vcpus[v].pcpu {
            self.refresh_done(self.vcpus[v].node, p);
        }
    }

    /// Something rank `r` may wait for has happened, brought by vCPU `from` (a
    /// shared-memory message) or from outside the guest (`None`: domain 0).
    fn notify(&mut self, r: usize, from: Option<usize>) {
        if !self.rank_ready(r) {
            return;
        }
        let v = self.ranks[r].vcpu;
        let current = self.current(v) == r;
        match self.task_act(r) {
            // On its pCPU it sees it as soon as it makes progress; off it, when
            // next dispatched (`dispatch` plans its `Done`).
            Act::Spin if current => {
                if let Some(p) = self.vcpus[v].pcpu {
                    self.refresh_done(self.vcpus[v].node, p);
                }
            }
            Act::Spin => self.hand_over(v, r, false),
            Act::Off => self.resume(r, from != Some(v)),
            Act::Work(_) => {}
        }
    }

    /// Rank `r` (current) waits for its phase's message or I/O, as the program says.
    fn wait(&mut self, r: usize) {
        let v = self.ranks[r].vcpu;
        match self.wait {
            Wait::Spin => self.vcpus[v].act = Act::Spin,
            Wait::Block => {
                self.vcpus[v].act = Act::Off;
                self.leave(v);
            }
            Wait::Yield => {
                self.vcpus[v].act = Act::Spin;
                if self.costs.yield_spin > 0 {
                    // It polls first; `on_done` yields when the poll ends.
                    self.vcpus[v].guest.poll_left = self.costs.yield_spin;
                } else if let Some(k) = self.pick(v) {
                    self.switch_task(v, k);
                }
            }
        }
        self.hint_sender(r);
    }

    /// Directed yield's hint (the scheduler ignores it unless
    /// `sched::Params::directed_yield`): a rank that starts waiting for a message
    /// names the sender's vCPU if it still works towards the message, which the
    /// scheduler hurries when it is a queued sibling of the same domain (a guest's
    /// "waiting for vCPU k").
    fn hint_sender(&mut self, r: usize) {
        let Some(Phase::Recv { from }) = self.phase(r) else {
            return;
        };
        let v = self.ranks[r].vcpu;
        let sender = self.ranks[from as usize].vcpu;
        let n = self.vcpus[v].node;
        // Only a sender still working is a laggard: one that waits itself (for its
        // own message, or for domain 0 to carry what it sent) would only spin sooner.
        // One on the same vCPU is the guest's business.
        if sender == v
            || self.vcpus[sender].node != n
            || !matches!(self.task_act(from as usize), Act::Work(_))
        {
            return;
        }
        let (waiter, target) = (self.vcpus[v].id, self.vcpus[sender].id);
        let t = self.nodes[n].sched.yield_to(self.now, waiter, &[target]);
        self.nodes[n].tickles.extend(t);
    }

    /// Moves rank `r` (current, its activity complete) through its phases until it
    /// needs CPU, waits, sleeps or ends.
    fn advance(&mut self, r: usize) {
        let v = self.ranks[r].vcpu;
        let n = self.vcpus[v].node;
        // It goes on, so it no longer polls: a shared-memory send below must not
        // take it for a yielding poller and hand its vCPU over mid-phase (`hand_over`).
        self.vcpus[v].act = Act::Work(0);
        loop {
            let Some(phase) = self.phase(r) else {
                self.ranks[r].finish = Some(self.now);
                self.unfinished -= 1;
                self.vcpus[v].act = Act::Off;
                self.leave(v);
                return;
            };
            let started = self.ranks[r].started;
            match phase {
                Phase::Compute(ns) => {
                    if !started && ns > 0 {
                        self.ranks[r].started = true;
                        self.vcpus[v].act = Act::Work(ns);
                        return;
                    }
                }
                Phase::Send { to, bytes } => {
                    let peer = self.ranks[to as usize].vcpu;
                    // Ranks of one domain with a guest scheduler share memory.
                    let shm = self.vcpus[v].guest.tasks.len() > 1
                        && self.vcpus[peer].node == n
                        && self.vcpus[peer].domain == self.vcpus[v].domain;
                    let cost = if shm { self.costs.shm } else { self.costs.send };
                    if !started && cost > 0 {
                        self.ranks[r].started = true;
                        self.vcpus[v].act = Act::Work(cost);
                        return;
                    }
                    self.messages += 1;
                    if shm {
                        self.ranks[to as usize].mailbox[r] += 1;
                        self.notify(to as usize, Some(v));
                    } else {
                        let msg = Msg {
                            from: r as u32,
                            to,
                            bytes,
                            sent_at: self.now,
                            losses: 0,
                        };
                        let cost = self.costs.dom0_entering(bytes);
                        self.dom0_enqueue(n, Job::Send(msg), cost);
                    }
                }
                Phase::Recv { from } => {
                    let mailbox = &mut self.ranks[r].mailbox[from as usize];
                    if *mailbox == 0 {
                        self.wait(r);
                        return;
                    }
                    *mailbox -= 1;
                    self.acknowledge(r, from);
                }
                Phase::Io(ns) => {
                    if !started {
                        self.ranks[r].started = true;
                        self.ranks[r].io_done = false;
                        self.dom0_enqueue(n, Job::Io(r as u32), ns);
                    }
                    if !self.ranks[r].io_done {
                        self.wait(r);
                        return;
                    }
                }
                Phase::Sleep(ns) => {
                    if !started {
                        self.ranks[r].started = true;
                        if self.vcpus[v].guest.tasks.len() > 1 {
                            // The other ranks run meanwhile.
                            self.vcpus[v].act = Act::Off;
                            self.push(self.now + ns, Event::Alarm { rank: r as u32 });
                            self.leave(v);
                            return;
                        }
                        // Continues as soon as it runs again, after the timer.
                        self.vcpus[v].act = Act::Work(0);
                        self.block(v);
                        self.vcpus[v].wake_pending = true;
                        let at = self.now + ns + self.costs.wake;
                        self.push(at, Event::Wake { vcpu: v as u32 });
                        return;
                    }
                }
            }
            self.next_phase(r);
        }
    }

    /// Rank `r` consumed a message from `from`: if it came through domain 0 later
    /// than the sender's retransmission timeout, domain 0 forwards what the timer
    /// added (`Costs::dom0_resend`). Messages of one sender all take one path, so
    /// the oldest time is this message's.
    fn acknowledge(&mut self, r: usize, from: u32) {
        let Some(sent_at) = self.ranks[r]
            .unacked
            .get_mut(&from)
            .and_then(VecDeque::pop_front)
        else {
            return;
        };
        let last = self.ranks[r].acked_at.insert(from, self.now).unwrap_or(0);
        let cost = self.costs.dom0_resend(self.now - sent_at.max(last));
        if cost > 0 {
            let n = self.vcpus[self.ranks[r].vcpu].node;
            self.dom0_enqueue(n, Job::Resend, cost);
        }
    }

    /// Fails if every unfinished rank waits and nothing can change that.
    fn check_deadlock(&self) -> Result<()> {
        if self.unfinished == 0 {
            return Ok(()); // the event just handled ended the last rank
        }
        let moving = self.vcpus.iter().any(|vc| match vc.role {
            Role::Dom0 => vc.job.is_some() || vc.act != Act::Off,
            Role::Ranks => vc.wake_pending,
        }) || (0..self.ranks.len())
            .any(|r| self.ranks[r].finish.is_none() && matches!(self.task_act(r), Act::Work(_)))
            || self.nodes.iter().any(|n| !n.jobs.is_empty());
        let ready =
            (0..self.ranks.len()).any(|r| self.ranks[r].finish.is_none() && self.rank_ready(r));
        if moving || ready {
            return Ok(());
        }
        let waits: Vec<String> = (0..self.ranks.len())
            .filter_map(|r| match self.phase(r) {
                Some(Phase::Recv { from }) => Some(format!("rank {r} waits for rank {from}")),
                Some(Phase::Io(_)) => Some(format!("rank {r} waits for its io")),
                _ => None,
            })
            .take(4)
            .collect();
        bail!(
            "deadlock at {:.6} s: {} (check that every recv has a matching send)",
            self.now as f64 / 1e9,
            waits.join(", ")
        )
    }

    fn outcome(mut self) -> Outcome {
        let end = self.now;
        // Count what is running up to the end.
        for n in 0..self.nodes.len() {
            for p in 0..self.nodes[n].pcpus.len() {
                if let Some(v) = self.nodes[n].pcpus[p].running {
                    self.settle(n, p);
                    self.vcpus[v].usage.cpu_ns += end - self.nodes[n].pcpus[p].dispatched;
                }
            }
        }
        for vc in &mut self.vcpus {
            let u = &mut vc.usage;
            u.overhead_ns = u.cpu_ns.saturating_sub(u.work_ns + u.spin_ns);
        }
        let mut domains: Vec<Vec<Usage>> = Vec::new();
        for vc in &self.vcpus {
            if domains.len() <= vc.node {
                domains.push(Vec::new());
            }
            let node = &mut domains[vc.node];
            if node.len() <= vc.domain {
                node.resize(vc.domain + 1, Usage::default());
            }
            node[vc.domain].add(&vc.usage);
        }
        let finished = self.unfinished == 0;
        let end_ns = if finished {
            self.ranks
                .iter()
                .filter_map(|r| r.finish)
                .max()
                .unwrap_or(0)
        } else {
            end
        };
        Outcome {
            finished,
            end_ns,
            domains,
            ranks: self
                .ranks
                .iter()
                .map(|r| RankOutcome {
                    finish_ns: r.finish,
                    // Alone on its vCPU a rank has all of it, the switches included.
                    usage: if self.vcpus[r.vcpu].guest.tasks.len() > 1 {
                        Usage {
                            overhead_ns: r.usage.cpu_ns - r.usage.work_ns - r.usage.spin_ns,
                            ..r.usage
                        }
                    } else {
                        self.vcpus[r.vcpu].usage
                    },
                })
                .collect(),
            switches: self.nodes.iter().map(|n| n.switches).collect(),
            messages: self.messages,
            events: self.events,
            directed_boosts: self
                .vcpus
                .iter()
                .map(|vc| self.nodes[vc.node].sched.vcpu_stats(vc.id).directed_boosts)
                .sum(),
            guest_ticks: self.guest_ticks,
            guest_switches: self.guest_switches,
            lost: self.lost,
            auto_slice: self.nodes[0].sched.auto().is_some().then(|| {
                self.nodes
                    .iter()
                    .filter_map(|n| n.sched.auto())
                    .map(|a| (a.epochs().0, a.epochs().1, a.changes().len()))
                    .collect()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check that runs every so many events must not take the event that ended
    /// the last rank for a deadlock (it did: a run of S1's CG.W in 1 of 4096 shapes
    /// failed at its very end).
    #[test]
    fn a_run_whose_last_event_is_checked_is_no_deadlock() {
        let sim = super::super::config::parse(
            "[costs]\nswitch_us = 0\nwake_us = 0\n[[node]]\nname = \"n\"\npcpus = 1\n\
             [[node.domain]]\nname = \"d\"\n[[program]]\nname = \"p\"\n\
             phases = [\"compute:1\"]\n",
        )
        .unwrap();
        let mut model = Model::build(&sim, &sim.programs[0], &sim.scenarios[0]).unwrap();
        model.deadlock_check_every = 1;
        model.run().unwrap();
        assert_eq!(model.unfinished, 0);
    }
}
