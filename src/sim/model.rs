//! The cluster model: per node, one `sched::Scheduler` (the same code that places real
//! vCPUs) deciding which modelled vCPU each pCPU runs; the vCPUs run phases of work.
//!
//! - A **rank** (one DomU vCPU) repeats its program: compute, hand each outgoing
//!   message to its driver (`send_us` of its own CPU), then wait for each incoming one:
//!   spinning (runnable, burning its pCPU, as MPI does) or blocked.
//! - A message costs **domain 0** CPU on the sending node (netback: per message and
//!   per KiB), then crosses the wire (latency + size / bandwidth), then costs domain 0
//!   CPU on the receiving node, then is delivered. Between ranks of one node, only the
//!   sending side's domain 0 works. Domain 0's vCPUs block when they have no work and
//!   are woken (Xen's BOOST applies) `notify_us` after work arrives.
//! - Handing a pCPU to another vCPU costs `switch_us` before the new one makes
//!   progress; a blocked receiver notices its message `notify_us` after delivery.
//!
//! Event-driven: time jumps to the next scheduler deadline, end of a compute phase,
//! wire arrival or wake-up. Ties are resolved in a fixed order (completions by node
//! and pCPU, then timed events by time and sequence, then ticks, then scheduling by
//! node and pCPU), so a run is deterministic.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use anyhow::{Result, anyhow};
use sched::{PcpuId, Scheduler, Tickles, VcpuId};

use super::config::{Pattern, Scenario, Sim, Wait};

const NS_PER_US: f64 = 1e3;

/// One scenario's results.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Whether every rank finished within the simulated duration.
    pub finished: bool,
    /// Time the last rank finished (or the duration).
    pub makespan_ns: u64,
    pub domains: Vec<DomainOutcome>,
    pub dom0: Vec<Dom0Outcome>,
    /// pCPU hand-overs between different vCPUs (idle to a vCPU included).
    pub switches: u64,
    pub messages: u64,
    /// Events processed (how much work the simulation did).
    pub steps: u64,
}

#[derive(Debug, Clone)]
pub struct DomainOutcome {
    pub node: String,
    pub name: String,
    pub weight: u32,
    pub cpu_ns: u64,
    /// CPU time spent busy-waiting for messages.
    pub spin_ns: u64,
}

#[derive(Debug, Clone)]
pub struct Dom0Outcome {
    pub node: String,
    pub weight: u32,
    pub cpu_ns: u64,
}

#[derive(Debug, Clone, Copy)]
struct Msg {
    from: usize,
    to: usize,
    bytes: u64,
}

/// What happens when a compute phase ends.
#[derive(Debug, Clone, Copy)]
enum Then {
    /// The rank's next step.
    Next,
    /// The rank handed `Msg` to its driver: domain 0 takes over.
    Post(Msg),
    /// Domain 0 finished its side of a message.
    Dom0(Msg, Side),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Sending,
    Receiving,
}

#[derive(Debug, Clone, Copy)]
enum Act {
    Compute {
        left: u64,
        then: Then,
    },
    /// Waiting for the `need`-th message from rank `from`.
    Wait {
        from: usize,
        need: u64,
    },
    /// Nothing to do: blocked (an idle domain 0 vCPU, a finished rank).
    Idle,
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Compute(u64),
    Send(usize),
    Recv(usize),
}

struct Vcpu {
    node: usize,
    id: VcpuId,
    /// Rank number, or `None` for domain 0.
    rank: Option<usize>,
    /// Index into the outcome's domain list (ranks) or node list (domain 0).
    owner: usize,
    act: Act,
    running_since: Option<u64>,
    /// When the current dispatch starts making progress (after the switch cost).
    progress_from: u64,
    cpu_ns: u64,
    spin_ns: u64,
    /// Busy-waiting on its pCPU since (while dispatched and waiting).
    spin_from: Option<u64>,
}

struct Rank {
    vcpu: usize,
    ops: Vec<Op>,
    pc: usize,
    iteration: u32,
    /// Messages received so far from each rank.
    received: Vec<u64>,
    done_at: Option<u64>,
}

struct NodeState {
    sched: Scheduler,
    running: Vec<Option<VcpuId>>,
    /// Local vCPU id -> index into `Model::vcpus`.
    local: Vec<usize>,
    dom0_vcpus: Vec<usize>,
    dom0_queue: VecDeque<(u64, Then)>,
    tickles: Tickles,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timed {
    /// A message reaches the receiving node's domain 0 (rank indices).
    Wire { from: usize, to: usize, bytes: u64 },
    /// A blocked vCPU is woken (global vCPU index).
    Wake(usize),
}

struct Model<'a> {
    sim: &'a Sim,
    now: u64,
    nodes: Vec<NodeState>,
    vcpus: Vec<Vcpu>,
    ranks: Vec<Rank>,
    /// `arrived[from][to]`: messages delivered.
    arrived: Vec<Vec<u64>>,
    timed: BinaryHeap<Reverse<(u64, u64, Timed)>>,
    seq: u64,
    switches: u64,
    messages: u64,
    steps: u64,
    switch_ns: u64,
    notify_ns: u64,
}

fn ns(us: f64) -> u64 {
    (us * NS_PER_US).round() as u64
}

/// Runs `scenario` of `sim` to completion (or its duration).
pub fn simulate(sim: &Sim, scenario: &Scenario) -> Result<Outcome> {
    let mut model = Model::build(sim, scenario)?;
    model.run();
    Ok(model.outcome())
}

impl<'a> Model<'a> {
    fn build(sim: &'a Sim, scenario: &Scenario) -> Result<Model<'a>> {
        let total_ranks: usize = sim
            .nodes
            .iter()
            .flat_map(|n| &n.domains)
            .map(|d| d.vcpus as usize)
            .sum();
        let mut model = Model {
            sim,
            now: 0,
            nodes: Vec::new(),
            vcpus: Vec::new(),
            ranks: Vec::new(),
            arrived: vec![vec![0; total_ranks]; total_ranks],
            timed: BinaryHeap::new(),
            seq: 0,
            switches: 0,
            messages: 0,
            steps: 0,
            switch_ns: ns(sim.costs.switch_us),
            notify_ns: ns(sim.costs.notify_us),
        };
        let mut domain_index = 0;
        for (n, node) in sim.nodes.iter().enumerate() {
            let mut sched = Scheduler::new(scenario.params, node.pcpus, 0)
                .map_err(|e| anyhow!("node '{}': {e}", node.name))?;
            let dom0_weight = scenario.dom0_weight.unwrap_or(node.dom0_weight);
            let dom0 = sched
                .add_domain(dom0_weight as u16, 0)
                .map_err(|e| anyhow!("node '{}' dom0: {e}", node.name))?;
            let mut state = NodeState {
                sched,
                running: vec![None; node.pcpus as usize],
                local: Vec::new(),
                dom0_vcpus: Vec::new(),
                dom0_queue: VecDeque::new(),
                tickles: Tickles::new(),
            };
            for _ in 0..node.dom0_vcpus {
                let index = model.add_vcpu(&mut state, n, dom0, None, n)?;
                state.dom0_vcpus.push(index);
            }
            for domain in &node.domains {
                let dom = state
                    .sched
                    .add_domain(domain.weight as u16, domain.cap)
                    .map_err(|e| anyhow!("domain '{}': {e}", domain.name))?;
                for _ in 0..domain.vcpus {
                    let rank = model.ranks.len();
                    let index = model.add_vcpu(&mut state, n, dom, Some(rank), domain_index)?;
                    model.ranks.push(Rank {
                        vcpu: index,
                        ops: program(sim, rank, total_ranks),
                        pc: 0,
                        iteration: 0,
                        received: vec![0; total_ranks],
                        done_at: None,
                    });
                }
                domain_index += 1;
            }
            model.nodes.push(state);
        }
        // Every rank starts at once.
        for rank in 0..model.ranks.len() {
            let v = model.ranks[rank].vcpu;
            model.advance(v);
            let (node, id) = (model.vcpus[v].node, model.vcpus[v].id);
            let t = model.nodes[node].sched.wake(0, id);
            model.nodes[node].tickles.extend(t);
        }
        Ok(model)
    }

    fn add_vcpu(
        &mut self,
        state: &mut NodeState,
        node: usize,
        dom: sched::DomainId,
        rank: Option<usize>,
        owner: usize,
    ) -> Result<usize> {
        let id = state
            .sched
            .add_vcpu(0, dom)
            .map_err(|e| anyhow!("adding a vCPU: {e}"))?;
        let index = self.vcpus.len();
        debug_assert_eq!(id.0 as usize, state.local.len());
        state.local.push(index);
        self.vcpus.push(Vcpu {
            node,
            id,
            rank,
            owner,
            act: Act::Idle,
            running_since: None,
            progress_from: 0,
            cpu_ns: 0,
            spin_ns: 0,
            spin_from: None,
        });
        Ok(index)
    }

    fn all_done(&self) -> bool {
        self.ranks.iter().all(|r| r.done_at.is_some())
    }

    fn run(&mut self) {
        while !self.all_done() {
            let t = self.next_event();
            if t > self.sim.duration_ns {
                self.now = self.sim.duration_ns;
                return;
            }
            self.step(t);
        }
    }

    fn completion(&self, v: usize) -> Option<u64> {
        let vcpu = &self.vcpus[v];
        match (vcpu.running_since, vcpu.act) {
            (Some(_), Act::Compute { left, .. }) => Some(vcpu.progress_from + left),
            _ => None,
        }
    }

    fn next_event(&self) -> u64 {
        let mut t = u64::MAX;
        for node in &self.nodes {
            if !node.tickles.is_empty() {
                return self.now;
            }
            for p in 0..node.running.len() {
                t = t.min(node.sched.next_deadline(PcpuId(p as u32)));
                if let Some(id) = node.running[p]
                    && let Some(done) = self.completion(node.local[id.0 as usize])
                {
                    t = t.min(done);
                }
            }
        }
        if let Some(Reverse((at, _, _))) = self.timed.peek() {
            t = t.min(*at);
        }
        t.max(self.now)
    }

    fn step(&mut self, t: u64) {
        self.now = t;
        self.steps += 1;
        // Compute phases ending now.
        for n in 0..self.nodes.len() {
            for p in 0..self.nodes[n].running.len() {
                let Some(id) = self.nodes[n].running[p] else {
                    continue;
                };
                let v = self.nodes[n].local[id.0 as usize];
                if self.completion(v).is_some_and(|done| done <= t) {
                    self.finish_compute(v);
                }
            }
        }
        // Wire arrivals and wake-ups due now.
        while let Some(Reverse((at, _, event))) = self.timed.peek().copied() {
            if at > t {
                break;
            }
            self.timed.pop();
            match event {
                Timed::Wire { from, to, bytes } => {
                    let msg = Msg { from, to, bytes };
                    let node = self.vcpus[self.ranks[to].vcpu].node;
                    self.dom0_job(
                        node,
                        self.dom0_cost(bytes),
                        Then::Dom0(msg, Side::Receiving),
                    );
                }
                // No effect unless it is still blocked (the scheduler checks).
                Timed::Wake(v) => {
                    let (node, id) = (self.vcpus[v].node, self.vcpus[v].id);
                    let tickles = self.nodes[node].sched.wake(t, id);
                    self.nodes[node].tickles.extend(tickles);
                }
            }
        }
        // Scheduler timers.
        for node in &mut self.nodes {
            for p in 0..node.running.len() {
                let p = PcpuId(p as u32);
                if node.sched.next_deadline(p) <= t {
                    let tickles = node.sched.tick(t, p);
                    node.tickles.extend(tickles);
                }
            }
        }
        // Decisions.
        for n in 0..self.nodes.len() {
            while let Some(p) = self.nodes[n].tickles.pop_first() {
                let decision = self.nodes[n].sched.schedule(t, p);
                self.nodes[n].tickles.extend(decision.tickles);
                self.dispatch(n, p, decision.run);
            }
        }
    }

    /// Mirrors a decision: the previous vCPU stops (its progress and CPU time are
    /// counted), the new one starts after the switch cost.
    fn dispatch(&mut self, n: usize, p: PcpuId, run: Option<VcpuId>) {
        let t = self.now;
        let prev = self.nodes[n].running[p.0 as usize];
        if prev == run {
            return;
        }
        if let Some(id) = prev {
            let v = self.nodes[n].local[id.0 as usize];
            self.stop(v, t);
        }
        self.nodes[n].running[p.0 as usize] = run;
        if let Some(id) = run {
            self.switches += 1;
            let v = self.nodes[n].local[id.0 as usize];
            let vcpu = &mut self.vcpus[v];
            vcpu.running_since = Some(t);
            vcpu.progress_from = t + self.switch_ns;
            // A spinning rank whose message came while it was off the CPU sees it now;
            // one still waiting spins from here.
            if self.wait_satisfied(v) {
                self.receive_and_advance(v);
            } else if matches!(self.vcpus[v].act, Act::Wait { .. }) {
                self.vcpus[v].spin_from = Some(t);
            }
        }
    }

    fn stop(&mut self, v: usize, t: u64) {
        self.end_spin(v, t);
        let vcpu = &mut self.vcpus[v];
        let Some(since) = vcpu.running_since.take() else {
            return;
        };
        vcpu.cpu_ns += t - since;
        if let Act::Compute { left, .. } = &mut vcpu.act {
            *left -= t.saturating_sub(vcpu.progress_from).min(*left);
        }
    }

    /// Counts busy-waiting up to `t` (CPU time spent waiting on the pCPU).
    fn end_spin(&mut self, v: usize, t: u64) {
        let vcpu = &mut self.vcpus[v];
        if let (Some(from), Some(since)) = (vcpu.spin_from.take(), vcpu.running_since) {
            vcpu.spin_ns += t.saturating_sub(from.max(since));
        }
    }

    fn finish_compute(&mut self, v: usize) {
        let Act::Compute { then, .. } = self.vcpus[v].act else {
            return;
        };
        // Progress restarts from now for whatever comes next on this dispatch.
        let t = self.now;
        let vcpu = &mut self.vcpus[v];
        vcpu.progress_from = t;
        vcpu.act = Act::Idle;
        match then {
            Then::Next => self.advance(v),
            Then::Post(msg) => {
                self.messages += 1;
                let node = self.vcpus[v].node;
                self.dom0_job(
                    node,
                    self.dom0_cost(msg.bytes),
                    Then::Dom0(msg, Side::Sending),
                );
                self.advance(v);
            }
            Then::Dom0(msg, side) => {
                self.dom0_done(msg, side);
                self.next_dom0_job(v);
            }
        }
    }

    fn dom0_cost(&self, bytes: u64) -> u64 {
        let c = &self.sim.costs;
        ns(c.dom0_per_message_us + c.dom0_per_kib_us * bytes as f64 / 1024.0)
    }

    fn dom0_done(&mut self, msg: Msg, side: Side) {
        let same_node =
            self.vcpus[self.ranks[msg.from].vcpu].node == self.vcpus[self.ranks[msg.to].vcpu].node;
        if side == Side::Sending && !same_node {
            // Latency plus size / bandwidth (bytes * 1e3 / (MB/s) is nanoseconds).
            let c = &self.sim.costs;
            let wire =
                ns(c.network_latency_us) + (msg.bytes as f64 * 1e3 / c.network_mb_s).round() as u64;
            self.schedule_timed(
                self.now + wire,
                Timed::Wire {
                    from: msg.from,
                    to: msg.to,
                    bytes: msg.bytes,
                },
            );
        } else {
            self.deliver(msg);
        }
    }

    fn deliver(&mut self, msg: Msg) {
        self.arrived[msg.from][msg.to] += 1;
        let v = self.ranks[msg.to].vcpu;
        if !self.wait_satisfied(v) {
            return;
        }
        if self.vcpus[v].running_since.is_some() {
            // Still on its pCPU (spinning, or just blocked at this instant): it sees
            // the message at once.
            self.vcpus[v].progress_from = self.now.max(self.vcpus[v].progress_from);
            self.wake_now(v);
            self.receive_and_advance(v);
        } else if self.sim.program.wait == Wait::Block {
            self.schedule_timed(self.now + self.notify_ns, Timed::Wake(v));
        }
        // A spinning rank off its pCPU sees it when next dispatched.
    }

    fn wait_satisfied(&self, v: usize) -> bool {
        let Some(rank) = self.vcpus[v].rank else {
            return false;
        };
        match self.vcpus[v].act {
            Act::Wait { from, need } => self.arrived[from][rank] >= need,
            _ => false,
        }
    }

    fn receive_and_advance(&mut self, v: usize) {
        let Some(rank) = self.vcpus[v].rank else {
            return;
        };
        if let Act::Wait { from, .. } = self.vcpus[v].act {
            self.end_spin(v, self.now);
            self.ranks[rank].received[from] += 1;
            self.ranks[rank].pc += 1;
            self.vcpus[v].act = Act::Idle;
            self.advance(v);
        }
    }

    /// Moves a rank through its program until it needs CPU or a message, or ends.
    fn advance(&mut self, v: usize) {
        let Some(r) = self.vcpus[v].rank else {
            return;
        };
        let iterations = self.sim.program.iterations;
        loop {
            let rank = &mut self.ranks[r];
            if rank.pc == rank.ops.len() {
                rank.pc = 0;
                rank.iteration += 1;
                if rank.iteration == iterations {
                    rank.done_at = Some(self.now);
                    self.vcpus[v].act = Act::Idle;
                    self.block(v);
                    return;
                }
            }
            match rank.ops[rank.pc] {
                Op::Compute(0) => rank.pc += 1,
                Op::Compute(ns) => {
                    rank.pc += 1;
                    self.vcpus[v].act = Act::Compute {
                        left: ns,
                        then: Then::Next,
                    };
                    return;
                }
                Op::Send(to) => {
                    rank.pc += 1;
                    let msg = Msg {
                        from: r,
                        to,
                        bytes: self.sim.program.message_bytes,
                    };
                    self.vcpus[v].act = Act::Compute {
                        left: ns(self.sim.costs.send_us),
                        then: Then::Post(msg),
                    };
                    return;
                }
                Op::Recv(from) => {
                    let need = rank.received[from] + 1;
                    if self.arrived[from][r] >= need {
                        rank.received[from] += 1;
                        rank.pc += 1;
                        continue;
                    }
                    self.vcpus[v].act = Act::Wait { from, need };
                    if self.sim.program.wait == Wait::Block {
                        self.block(v);
                    } else if self.vcpus[v].running_since.is_some() {
                        self.vcpus[v].spin_from = Some(self.now);
                    }
                    return;
                }
            }
        }
    }

    /// Undoes a block at this same instant (no effect on a runnable vCPU).
    fn wake_now(&mut self, v: usize) {
        let (node, id) = (self.vcpus[v].node, self.vcpus[v].id);
        let tickles = self.nodes[node].sched.wake(self.now, id);
        self.nodes[node].tickles.extend(tickles);
    }

    fn block(&mut self, v: usize) {
        let (node, id) = (self.vcpus[v].node, self.vcpus[v].id);
        let tickles = self.nodes[node].sched.block(self.now, id);
        self.nodes[node].tickles.extend(tickles);
    }

    /// Queues work for domain 0 of `node`, waking an idle domain 0 vCPU for it.
    fn dom0_job(&mut self, node: usize, cost: u64, then: Then) {
        let idle = self.nodes[node]
            .dom0_vcpus
            .iter()
            .copied()
            .find(|&v| matches!(self.vcpus[v].act, Act::Idle));
        match idle {
            Some(v) => {
                self.vcpus[v].act = Act::Compute { left: cost, then };
                if self.vcpus[v].running_since.is_some() {
                    // Blocked at this very instant, still on its pCPU: keeps running.
                    self.vcpus[v].progress_from = self.now.max(self.vcpus[v].progress_from);
                    self.wake_now(v);
                } else {
                    self.schedule_timed(self.now + self.notify_ns, Timed::Wake(v));
                }
            }
            None => self.nodes[node].dom0_queue.push_back((cost, then)),
        }
    }

    fn next_dom0_job(&mut self, v: usize) {
        let node = self.vcpus[v].node;
        match self.nodes[node].dom0_queue.pop_front() {
            Some((cost, then)) => self.vcpus[v].act = Act::Compute { left: cost, then },
            None => {
                self.vcpus[v].act = Act::Idle;
                self.block(v);
            }
        }
    }

    fn schedule_timed(&mut self, at: u64, event: Timed) {
        self.seq += 1;
        self.timed.push(Reverse((at, self.seq, event)));
    }

    fn outcome(mut self) -> Outcome {
        let t = self.now;
        for v in 0..self.vcpus.len() {
            self.stop(v, t);
        }
        let finished = self.all_done();
        let makespan_ns = if finished {
            self.ranks
                .iter()
                .filter_map(|r| r.done_at)
                .max()
                .unwrap_or(0)
        } else {
            self.sim.duration_ns
        };
        let mut domains: Vec<DomainOutcome> = self
            .sim
            .nodes
            .iter()
            .flat_map(|n| {
                n.domains.iter().map(|d| DomainOutcome {
                    node: n.name.clone(),
                    name: d.name.clone(),
                    weight: d.weight,
                    cpu_ns: 0,
                    spin_ns: 0,
                })
            })
            .collect();
        let mut dom0: Vec<Dom0Outcome> = self
            .sim
            .nodes
            .iter()
            .map(|n| Dom0Outcome {
                node: n.name.clone(),
                weight: n.dom0_weight,
                cpu_ns: 0,
            })
            .collect();
        for vcpu in &self.vcpus {
            match vcpu.rank {
                Some(_) => {
                    domains[vcpu.owner].cpu_ns += vcpu.cpu_ns;
                    domains[vcpu.owner].spin_ns += vcpu.spin_ns;
                }
                None => dom0[vcpu.owner].cpu_ns += vcpu.cpu_ns,
            }
        }
        Outcome {
            finished,
            makespan_ns,
            domains,
            dom0,
            switches: self.switches,
            messages: self.messages,
            steps: self.steps,
        }
    }
}

/// One iteration of `rank`'s program.
fn program(sim: &Sim, rank: usize, ranks: usize) -> Vec<Op> {
    let p = &sim.program;
    let mut ops = vec![Op::Compute((p.compute_ms * 1e6).round() as u64)];
    match p.pattern {
        Pattern::None => {}
        Pattern::Ring => {
            ops.push(Op::Send((rank + 1) % ranks));
            ops.push(Op::Recv((rank + ranks - 1) % ranks));
        }
        Pattern::Alltoall => {
            for k in 1..ranks {
                ops.push(Op::Send((rank + k) % ranks));
            }
            for k in 1..ranks {
                ops.push(Op::Recv((rank + ranks - k) % ranks));
            }
        }
    }
    ops
}
