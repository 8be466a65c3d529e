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
//!
//! `Timer` and `Done` events carry an epoch per pCPU; a newer one
//! makes older ones stale (skipped), so deadlines can move without searching
//! the heap. After every event the pCPUs the scheduler tickled are rescheduled
//! (lowest first) until none is left, as `sched::drive::Sim` does.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use anyhow::{Result, anyhow, bail};
use sched::{PcpuId, Scheduler, Tickles, VcpuId};

use super::config::{Program, Scenario, Sim, Wait};
use super::program::Phase;

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
    dom0_message: u64,
    dom0_kib_us: f64,
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
            dom0_message: ns(c.dom0_per_message_us),
            dom0_kib_us: c.dom0_per_kib_us,
            latency: ns(c.network_latency_us),
            mb_s: c.network_mb_s,
        }
    }

    /// Domain 0's CPU for one side of a message.
    fn dom0(&self, bytes: u64) -> u64 {
        self.dom0_message + ns(self.dom0_kib_us * bytes as f64 / 1024.0)
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
    /// The rest: switch and tick costs.
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Timer { node: u32, pcpu: u32, epoch: u32 },
    Done { node: u32, pcpu: u32, epoch: u32 },
    Wake { vcpu: u32 },
    Wire { msg: Msg },
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Dom0,
    Rank(u32),
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
}

struct Rank {
    vcpu: usize,
    body: Vec<Phase>,
    iteration: u64,
    index: usize,
    /// The current phase's CPU part is done (compute, send) or it was issued (io,
    /// sleep).
    started: bool,
    io_done: bool,
    /// Messages arrived and not yet received, by sender.
    mailbox: Vec<u32>,
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
        };
        for (n, node) in sim.nodes.iter().enumerate() {
            let mut sched = Scheduler::new(scenario.params, node.pcpus, 0)
                .map_err(|e| anyhow!("node '{}': {e}", node.name))?;
            let mut local = Vec::new();
            let mut dom0 = Vec::new();
            for (d, domain) in node.domains.iter().enumerate() {
                let (weight, cap) = scenario.shares[n][d];
                let dom = sched
                    .add_domain(weight as u16, cap)
                    .map_err(|e| anyhow!("node '{}' domain '{}': {e}", node.name, domain.name))?;
                for _ in 0..domain.vcpus {
                    let id = sched
                        .add_vcpu(0, dom)
                        .map_err(|e| anyhow!("node '{}': {e}", node.name))?;
                    let index = m.vcpus.len();
                    let role = if d == 0 {
                        dom0.push(index);
                        Role::Dom0
                    } else {
                        let r = m.ranks.len() as u32;
                        m.ranks.push(Rank {
                            vcpu: index,
                            body: program.bodies[r as usize].clone(),
                            iteration: 0,
                            index: 0,
                            started: false,
                            io_done: false,
                            mailbox: vec![0; n_ranks],
                            finish: None,
                        });
                        Role::Rank(r)
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
            });
        }
        if m.ranks.len() != n_ranks {
            bail!(
                "internal: {} ranks placed, {n_ranks} expected",
                m.ranks.len()
            );
        }
        // Every rank starts at once (no wake-up cost: the program is started, not
        // interrupted); domain 0 stays halted until it has work.
        m.unfinished = m.ranks.len();
        for r in 0..m.ranks.len() {
            let v = m.ranks[r].vcpu;
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
        if matches!(event, Event::Wake { .. } | Event::Wire { .. }) {
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
            }
            if self.in_flight == 0 && self.events.is_multiple_of(DEADLOCK_CHECK_EVERY) {
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
        if self.costs.tick > 0 && self.nodes[n].pcpus[p].running.is_some() {
            self.settle(n, p);
            let pc = &mut self.nodes[n].pcpus[p];
            pc.progress_from = pc.progress_from.max(self.now) + self.costs.tick;
            self.refresh_done(n, p);
        }
        self.refresh_timer(n, p);
        self.reschedule(n);
    }

    fn on_done(&mut self, n: usize, p: usize, epoch: u32) {
        if self.nodes[n].pcpus[p].done_epoch != epoch {
            return;
        }
        let Some(v) = self.nodes[n].pcpus[p].running else {
            return;
        };
        self.settle(n, p);
        let complete = match self.vcpus[v].act {
            Act::Work(left) => left == 0,
            Act::Spin => self.ready(v),
            Act::Off => false,
        };
        if complete {
            match self.vcpus[v].role {
                Role::Dom0 => self.dom0_next(v),
                Role::Rank(r) => self.advance(r as usize),
            }
            if self.vcpus[v].pcpu == Some(p) {
                self.refresh_done(n, p);
            }
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
        self.dom0_enqueue(n, Job::Receive(msg), self.costs.dom0(msg.bytes));
        self.reschedule(n);
    }

    // ---- pCPUs ----

    /// Counts the running vCPU's progress up to now.
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
        match &mut vc.act {
            Act::Work(left) => {
                let done = d.min(*left);
                *left -= done;
                vc.usage.work_ns += done;
            }
            Act::Spin => vc.usage.spin_ns += d,
            Act::Off => {}
        }
    }

    /// (Re)plans the `Done` event of what `p` runs.
    fn refresh_done(&mut self, n: usize, p: usize) {
        let pc = &mut self.nodes[n].pcpus[p];
        pc.done_epoch = pc.done_epoch.wrapping_add(1);
        let epoch = pc.done_epoch;
        let Some(v) = pc.running else { return };
        let from = pc.progress_from.max(self.now);
        let at = match self.vcpus[v].act {
            Act::Work(left) => from + left,
            Act::Spin if self.ready(v) => from,
            _ => return,
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
                self.ranks[r].mailbox[msg.from as usize] += 1;
                self.notify(r);
            }
            Job::Io(r) => {
                self.ranks[r as usize].io_done = true;
                self.notify(r as usize);
            }
        }
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

    /// Whether rank vCPU `v` can go on with its current phase (what it waits for
    /// is there).
    fn ready(&self, v: usize) -> bool {
        let Role::Rank(r) = self.vcpus[v].role else {
            return false;
        };
        let rank = &self.ranks[r as usize];
        match self.phase(r as usize) {
            Some(Phase::Recv { from }) => rank.mailbox[from as usize] > 0,
            Some(Phase::Io(_)) => rank.io_done,
            _ => false,
        }
    }

    /// Something rank `r` may wait for has happened.
    fn notify(&mut self, r: usize) {
        let v = self.ranks[r].vcpu;
        if !self.ready(v) {
            return;
        }
        match self.vcpus[v].act {
            // On its pCPU it sees it as soon as it makes progress; off it, when
            // next dispatched (`dispatch` plans its `Done`).
            Act::Spin => {
                if let Some(p) = self.vcpus[v].pcpu {
                    self.refresh_done(self.vcpus[v].node, p);
                }
            }
            Act::Off => {
                self.vcpus[v].act = Act::Work(0);
                self.wake_later(v);
            }
            Act::Work(_) => {}
        }
    }

    /// Waits for the current phase's message or I/O, as the program says.
    fn wait(&mut self, v: usize) {
        match self.wait {
            Wait::Spin => self.vcpus[v].act = Act::Spin,
            Wait::Block => {
                self.vcpus[v].act = Act::Off;
                self.block(v);
            }
        }
        self.hint_sender(v);
    }

    /// Directed yield's hint (the scheduler ignores it unless
    /// `sched::Params::directed_yield`): a rank that starts waiting for a message
    /// names the sender's vCPU if it still works towards the message, which the
    /// scheduler hurries when it is a queued sibling of the same domain (a guest's
    /// "waiting for vCPU k").
    fn hint_sender(&mut self, v: usize) {
        let Role::Rank(r) = self.vcpus[v].role else {
            return;
        };
        let Some(Phase::Recv { from }) = self.phase(r as usize) else {
            return;
        };
        let sender = self.ranks[from as usize].vcpu;
        let n = self.vcpus[v].node;
        // Only a sender still working is a laggard: one that waits itself (for its
        // own message, or for domain 0 to carry what it sent) would only spin sooner.
        if self.vcpus[sender].node != n || !matches!(self.vcpus[sender].act, Act::Work(_)) {
            return;
        }
        let (waiter, target) = (self.vcpus[v].id, self.vcpus[sender].id);
        let t = self.nodes[n].sched.yield_to(self.now, waiter, &[target]);
        self.nodes[n].tickles.extend(t);
    }

    /// Moves rank `r` (running, its activity complete) through its phases until it
    /// needs CPU, waits, sleeps or ends.
    fn advance(&mut self, r: usize) {
        let v = self.ranks[r].vcpu;
        let n = self.vcpus[v].node;
        loop {
            let Some(phase) = self.phase(r) else {
                self.ranks[r].finish = Some(self.now);
                self.unfinished -= 1;
                self.vcpus[v].act = Act::Off;
                self.block(v);
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
                    if !started && self.costs.send > 0 {
                        self.ranks[r].started = true;
                        self.vcpus[v].act = Act::Work(self.costs.send);
                        return;
                    }
                    self.messages += 1;
                    let msg = Msg {
                        from: r as u32,
                        to,
                        bytes,
                    };
                    self.dom0_enqueue(n, Job::Send(msg), self.costs.dom0(bytes));
                }
                Phase::Recv { from } => {
                    let mailbox = &mut self.ranks[r].mailbox[from as usize];
                    if *mailbox == 0 {
                        self.wait(v);
                        return;
                    }
                    *mailbox -= 1;
                }
                Phase::Io(ns) => {
                    if !started {
                        self.ranks[r].started = true;
                        self.ranks[r].io_done = false;
                        self.dom0_enqueue(n, Job::Io(r as u32), ns);
                    }
                    if !self.ranks[r].io_done {
                        self.wait(v);
                        return;
                    }
                }
                Phase::Sleep(ns) => {
                    if !started {
                        self.ranks[r].started = true;
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

    /// Fails if every unfinished rank waits and nothing can change that.
    fn check_deadlock(&self) -> Result<()> {
        let moving = self.vcpus.iter().any(|vc| match vc.role {
            Role::Dom0 => vc.job.is_some() || vc.act != Act::Off,
            Role::Rank(r) => {
                self.ranks[r as usize].finish.is_none()
                    && (matches!(vc.act, Act::Work(_)) || vc.wake_pending)
            }
        }) || self.nodes.iter().any(|n| !n.jobs.is_empty());
        let ready = self
            .ranks
            .iter()
            .any(|rank| rank.finish.is_none() && self.ready(rank.vcpu));
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
                    usage: self.vcpus[r.vcpu].usage,
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
        }
    }
}
