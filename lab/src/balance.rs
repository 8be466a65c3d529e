//! A progress balancer for VMs spread over hosts of unequal speed (S5's "profiled"
//! balancing, with live migration as the means): from what the hosts report of each
//! VM (its results so far and its CPU time) it measures how much work an item of a
//! VM's list costs and how fast each host delivers CPU to its VMs, predicts when each
//! host finishes, and proposes the migration that brings the later finish furthest
//! forward, if it gains more than the migration costs.
//!
//! It is pure: observations in, a proposal out. `kumo experiment s5` polls the nodes'
//! `GET /api/v1/domains` (`progress` and `cpu_s`) and carries the proposals out with
//! `PUT /api/v1/vm.migrate`.
//!
//! The model:
//! - A VM's **work per item** is its CPU time at its latest result over its results
//!   (CPU time runs only while its vCPU runs, so a slower host does not inflate it);
//!   before its first result, the mean of the VMs that have one.
//! - Its **remaining work** is its items left times that, less the CPU it spent on the
//!   item under way.
//! - A host's **rate** is the CPU per second its running VMs received over the last
//!   window: a capped (slower) host shows its cap here, whatever its VMs do.
//! - A host **finishes** when its VMs' remaining work is done at its rate (the VMs of
//!   one host share it fairly: equal weights).
//!
//! The VMs of one MPI job whose ranks spin at their waits ([`Balancer::lockstep`])
//! progress together, and a spinning rank's CPU time is not its work: the job's
//! remaining time is its progress left (the guest's steps, `@kumo progress`, of the
//! slowest VM) at its present pace, and its pace follows its slowest host's CPU per
//! VM (each host's rate divided among the job's VMs there). A move's prediction is
//! the remaining time scaled by the pace before over the pace after, plus its cost.

/// What a host reports of one of its VMs at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub vm: String,
    /// Results the VM's guest printed so far (wherever it ran).
    pub results: u32,
    /// Its CPU time on this host so far, in seconds.
    pub cpu_s: f64,
    /// Its vCPUs still run here (not ended, not moving or moved away).
    pub running: bool,
    /// Its list's length or its steps in all (an MPI kernel's timed loop), if the
    /// host reports it; `results` then counts the same units.
    pub of: Option<u32>,
}

/// How the VMs' work relates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Model {
    /// Independent jobs: each VM's remaining work is its own.
    Independent,
    /// One job whose VMs progress together (MPI ranks that spin at their waits).
    Lockstep,
}

/// A migration the balancer proposes.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    pub vm: String,
    pub from: usize,
    pub to: usize,
    /// Predicted finish of the later host without and with the move, in seconds from
    /// the observation.
    pub finish_before_s: f64,
    pub finish_after_s: f64,
}

/// Tunables; [`Config::default`] is what the experiment runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// The window over which a host's rate is measured, in seconds.
    pub window_s: f64,
    /// After a migration, measure this long before proposing the next one (the
    /// hosts' rates change with their VMs).
    pub settle_s: f64,
    /// A move must bring the later finish forward by this fraction...
    pub min_gain: f64,
    /// ...and by this many times the migration's expected cost.
    pub cost_factor: f64,
    /// The least a migration is expected to cost, in seconds: what is expected before
    /// one was measured, and a floor after (a first migration from an idle domain 0
    /// took 10-17 ms in S5's runs, later ones up to 1.4 s while the hosts were busy).
    pub min_cost_s: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            window_s: 1.0,
            settle_s: 1.0,
            min_gain: 0.05,
            cost_factor: 2.0,
            min_cost_s: 0.3,
        }
    }
}

/// One VM as the balancer tracks it.
#[derive(Debug, Clone)]
struct Vm {
    name: String,
    /// Items in its list.
    items: u32,
    /// The host it runs on now.
    host: usize,
    /// Hosts it may still move to (each host can take each VM once).
    may_go: Vec<usize>,
    results: u32,
    /// Its CPU time on earlier hosts, and on the present one, in seconds.
    cpu_before_s: f64,
    cpu_here_s: f64,
    /// Its total CPU time at its latest result.
    cpu_at_result_s: f64,
    running: bool,
}

impl Vm {
    fn cpu_s(&self) -> f64 {
        self.cpu_before_s + self.cpu_here_s
    }

    fn work_per_item(&self) -> Option<f64> {
        (self.results > 0).then(|| self.cpu_at_result_s / f64::from(self.results))
    }
}

/// The balancer's state across observations.
#[derive(Debug, Clone)]
pub struct Balancer {
    config: Config,
    model: Model,
    hosts: usize,
    vms: Vec<Vm>,
    /// Per host, its running VMs' total CPU at recent observations: (time, cpu).
    history: Vec<Vec<(f64, f64)>>,
    /// The rate each host showed last while it had running VMs.
    last_rate: Vec<Option<f64>>,
    /// A lockstep job's progress (0 to 1) when first seen and at each change since,
    /// since the last move.
    progress: Vec<(f64, f64)>,
    /// No proposal before this time.
    quiet_until_s: f64,
    /// Measured migration costs, in seconds.
    costs: Vec<f64>,
}

impl Balancer {
    /// `vms`: each VM's name, its list's length, the host it starts on, and the hosts
    /// it may move to.
    pub fn new(config: Config, hosts: usize, vms: &[(&str, u32, usize, Vec<usize>)]) -> Balancer {
        Balancer::with_model(config, Model::Independent, hosts, vms)
    }

    /// The VMs of one job whose ranks spin at their waits (see the module's text);
    /// their step counts come with their first observation ([`Seen::of`]).
    pub fn lockstep(config: Config, hosts: usize, vms: &[(&str, usize, Vec<usize>)]) -> Balancer {
        let vms: Vec<(&str, u32, usize, Vec<usize>)> = vms
            .iter()
            .map(|(name, host, may_go)| (*name, 0, *host, may_go.clone()))
            .collect();
        Balancer::with_model(config, Model::Lockstep, hosts, &vms)
    }

    fn with_model(
        config: Config,
        model: Model,
        hosts: usize,
        vms: &[(&str, u32, usize, Vec<usize>)],
    ) -> Balancer {
        Balancer {
            config,
            model,
            hosts,
            vms: vms
                .iter()
                .map(|(name, items, host, may_go)| Vm {
                    name: name.to_string(),
                    items: *items,
                    host: *host,
                    may_go: may_go.clone(),
                    results: 0,
                    cpu_before_s: 0.0,
                    cpu_here_s: 0.0,
                    cpu_at_result_s: 0.0,
                    running: true,
                })
                .collect(),
            history: vec![Vec::new(); hosts],
            last_rate: vec![None; hosts],
            progress: Vec::new(),
            quiet_until_s: 0.0,
            costs: Vec::new(),
        }
    }

    /// Takes what `host` reported at time `at_s` (seconds since the start). VMs the
    /// balancer does not know, and those not on `host` now, are ignored.
    pub fn observe(&mut self, host: usize, at_s: f64, seen: &[Seen]) {
        for s in seen {
            let Some(vm) = self.vms.iter_mut().find(|v| v.name == s.vm) else {
                continue;
            };
            if vm.host != host {
                continue;
            }
            vm.cpu_here_s = s.cpu_s.max(0.0);
            if let Some(of) = s.of.filter(|&of| of > 0) {
                vm.items = of;
            }
            if s.results > vm.results {
                vm.results = s.results.min(vm.items);
                vm.cpu_at_result_s = vm.cpu_s();
            }
            vm.running = s.running;
        }
        // The CPU of every VM here, ended ones too (theirs stays put): a VM that ends
        // inside the window must not make the sum fall.
        let here = self.vms.iter().filter(|v| v.host == host);
        let total: f64 = here.clone().map(|v| v.cpu_here_s).sum();
        let running = here.clone().any(|v| v.running);
        let horizon = at_s - self.config.window_s;
        keep_window(&mut self.history[host], (at_s, total), horizon);
        if let Some(done) = self.job_done() {
            // Every change since the last move: the guest shows its steps in
            // twentieths, seconds apart, too coarse for one window.
            if self.progress.last().is_none_or(|&(_, last)| done > last) {
                self.progress.push((at_s, done));
            }
        }
        // A host with nothing running keeps the rate it showed last.
        if let Some(rate) = self.measured_rate(host).filter(|&r| running && r > 0.0) {
            self.last_rate[host] = Some(rate);
        }
    }

    /// `vm` moved to `to` at `at_s`, which cost `cost_s` (its migration's time).
    pub fn moved(&mut self, vm: &str, to: usize, at_s: f64, cost_s: f64) {
        if let Some(v) = self.vms.iter_mut().find(|v| v.name == vm) {
            v.cpu_before_s += v.cpu_here_s;
            v.cpu_here_s = 0.0;
            v.host = to;
            v.may_go.retain(|&h| h != to);
            v.running = true;
        }
        // A VM that left or came changes both hosts' sums, and the job's pace: start
        // their windows anew.
        for history in &mut self.history {
            history.clear();
        }
        self.progress.clear();
        self.costs.push(cost_s.max(0.0));
        self.quiet_until_s = at_s + self.config.settle_s;
    }

    /// The CPU per second `host`'s running VMs received over the window, once the
    /// window is covered.
    fn measured_rate(&self, host: usize) -> Option<f64> {
        self.slope(&self.history[host])
    }

    /// How fast `series` rose over the window, once the window is covered.
    fn slope(&self, series: &[(f64, f64)]) -> Option<f64> {
        let (first, last) = (series.first()?, series.last()?);
        let span = last.0 - first.0;
        (span >= self.config.window_s * 0.9 && last.1 >= first.1).then(|| (last.1 - first.1) / span)
    }

    /// A lockstep job's progress (0 to 1): its slowest running VM's steps, once every
    /// running VM has shown some.
    fn job_done(&self) -> Option<f64> {
        if self.model != Model::Lockstep {
            return None;
        }
        let running = self.vms.iter().filter(|v| v.running);
        running
            .map(|v| (v.items > 0).then(|| f64::from(v.results) / f64::from(v.items)))
            .try_fold(1.0f64, |lo, f| f.map(|f| lo.min(f)))
            .filter(|_| self.vms.iter().any(|v| v.running))
    }

    /// A lockstep job's pace (progress a second) between the first and the latest
    /// step it was seen to take since the last move; None before two.
    fn job_rate(&self) -> Option<f64> {
        let steps = self.progress.get(1..)?;
        let (first, last) = (steps.first()?, steps.last()?);
        let span = last.0 - first.0;
        (span > 0.0 && last.1 > first.1).then(|| (last.1 - first.1) / span)
    }

    /// A lockstep job's remaining time with `moving` placed (None: as it is): its
    /// progress left at its pace, scaled by its slowest host's CPU per VM.
    fn job_finish(&self, moving: Option<(usize, usize)>) -> Option<f64> {
        let rate = self.job_rate()?;
        let left = (1.0 - self.job_done()?) / rate;
        let pace = |moving: Option<(usize, usize)>| -> Option<f64> {
            let mut count = vec![0u32; self.hosts];
            for (i, vm) in self.vms.iter().enumerate().filter(|(_, v)| v.running) {
                match moving {
                    Some((m, to)) if m == i => count[to] += 1,
                    _ => count[vm.host] += 1,
                }
            }
            (0..self.hosts)
                .filter(|&h| count[h] > 0)
                .map(|h| self.last_rate[h].map(|r| r / f64::from(count[h])))
                .try_fold(f64::INFINITY, |lo, p| p.map(|p| lo.min(p)))
        };
        let (now, then) = (pace(None)?, pace(moving)?);
        let cost = if moving.is_some() {
            self.expected_cost_s()
        } else {
            0.0
        };
        (then > 0.0).then(|| left * now / then + cost)
    }

    fn work_per_item(&self, vm: &Vm) -> Option<f64> {
        vm.work_per_item().or_else(|| {
            let known: Vec<f64> = self.vms.iter().filter_map(Vm::work_per_item).collect();
            (!known.is_empty()).then(|| known.iter().sum::<f64>() / known.len() as f64)
        })
    }

    /// A running VM's remaining work in CPU seconds, if it can be told yet.
    fn remaining(&self, vm: &Vm) -> Option<f64> {
        let per_item = self.work_per_item(vm)?;
        let left = f64::from(vm.items.saturating_sub(vm.results)) * per_item;
        let under_way = (vm.cpu_s() - vm.cpu_at_result_s).clamp(0.0, per_item);
        Some((left - under_way).max(0.0))
    }

    /// The expected cost of the next migration: the median of those measured, at
    /// least [`Config::min_cost_s`].
    pub fn expected_cost_s(&self) -> f64 {
        let mut costs = self.costs.clone();
        costs.sort_by(f64::total_cmp);
        costs
            .get(costs.len() / 2)
            .copied()
            .unwrap_or(0.0)
            .max(self.config.min_cost_s)
    }

    /// Each host's predicted finish, in seconds from now, with `moving` (a VM index)
    /// placed on `to` (None: as they are). None while a rate or a VM's work is not
    /// known yet.
    fn finishes(&self, moving: Option<(usize, usize)>) -> Option<Vec<f64>> {
        if self.model == Model::Lockstep {
            return self.job_finish(moving).map(|t| vec![t]);
        }
        let mut work = vec![0.0; self.hosts];
        for (i, vm) in self.vms.iter().enumerate().filter(|(_, v)| v.running) {
            let host = match moving {
                Some((m, to)) if m == i => to,
                _ => vm.host,
            };
            work[host] += self.remaining(vm)?;
        }
        let cost = self.expected_cost_s();
        work.iter()
            .enumerate()
            .map(|(host, &w)| {
                if w == 0.0 {
                    return Some(0.0);
                }
                let rate = self.last_rate[host]?;
                let arriving = moving.is_some_and(|(_, to)| to == host);
                (rate > 0.0).then(|| w / rate + if arriving { cost } else { 0.0 })
            })
            .collect()
    }

    /// The migration that brings the later host's finish furthest forward, if it
    /// gains enough (see [`Config`]), at `at_s`.
    pub fn propose(&self, at_s: f64) -> Option<Move> {
        if at_s < self.quiet_until_s {
            return None;
        }
        let now = self.finishes(None)?;
        let before = now.iter().copied().fold(0.0, f64::max);
        let mut best: Option<Move> = None;
        for (i, vm) in self.vms.iter().enumerate().filter(|(_, v)| v.running) {
            for &to in &vm.may_go {
                let Some(after) = self.finishes(Some((i, to))) else {
                    continue;
                };
                let after = after.iter().copied().fold(0.0, f64::max);
                if best.as_ref().is_none_or(|b| after < b.finish_after_s) {
                    best = Some(Move {
                        vm: vm.name.clone(),
                        from: vm.host,
                        to,
                        finish_before_s: before,
                        finish_after_s: after,
                    });
                }
            }
        }
        let gain_needed =
            (before * self.config.min_gain).max(self.config.cost_factor * self.expected_cost_s());
        best.filter(|m| before - m.finish_after_s > gain_needed)
    }
}

/// Adds `point` to `series`, keeping the points since `horizon` and the one before.
fn keep_window(series: &mut Vec<(f64, f64)>, point: (f64, f64), horizon: f64) {
    series.push(point);
    while series.len() > 2 && series[1].0 <= horizon {
        series.remove(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two hosts, the second at half speed, three VMs of `items` items each on each.
    fn two_hosts(items: u32) -> Balancer {
        let vms: Vec<(String, u32, usize, Vec<usize>)> = (0..6)
            .map(|k| (format!("j{k}"), items, k / 3, vec![1 - k / 3]))
            .collect();
        let vms: Vec<(&str, u32, usize, Vec<usize>)> = vms
            .iter()
            .map(|(n, i, h, g)| (n.as_str(), *i, *h, g.clone()))
            .collect();
        Balancer::new(Config::default(), 2, &vms)
    }

    /// Host `host`'s VMs at time `t` when each received `cpu` seconds and printed
    /// `results`.
    fn seen(host: usize, cpu: f64, results: u32) -> Vec<Seen> {
        (0..3)
            .map(|k| Seen {
                vm: format!("j{}", host * 3 + k),
                results,
                cpu_s: cpu,
                running: true,
                of: None,
            })
            .collect()
    }

    #[test]
    fn nothing_is_proposed_before_work_and_rates_are_known() {
        let mut b = two_hosts(10);
        b.observe(0, 0.0, &seen(0, 0.0, 0));
        b.observe(1, 0.0, &seen(1, 0.0, 0));
        assert_eq!(b.propose(0.0), None, "no rate yet");
        b.observe(0, 1.0, &seen(0, 1.0 / 3.0, 0));
        b.observe(1, 1.0, &seen(1, 0.5 / 3.0, 0));
        assert_eq!(b.propose(1.0), None, "no result yet: the work is unknown");
    }

    #[test]
    fn a_vm_moves_from_the_slow_host_to_the_fast_one() {
        // Items of 1 s of CPU; the fast host gives each VM 1/3 s per s, the slow 1/6.
        let mut b = two_hosts(10);
        for t in 0..=4 {
            let t = f64::from(t);
            let fast = t / 3.0;
            let slow = t / 6.0;
            b.observe(0, t, &seen(0, fast, fast.floor() as u32));
            b.observe(1, t, &seen(1, slow, slow.floor() as u32));
        }
        let m = b.propose(4.0).expect("a move");
        assert_eq!((m.from, m.to), (1, 0));
        assert!(m.vm.starts_with('j') && ["j3", "j4", "j5"].contains(&m.vm.as_str()));
        // Slow: 3 x (10 - 2/3) s at 1/2 = 56 s; fast: 3 x (10 - 4/3) at 1 = 26 s.
        assert!((m.finish_before_s - 56.0).abs() < 0.5, "{m:?}");
        // With one VM moved: fast 26 + 9.33 (+ the cost), slow 2 x 9.33 / 0.5 = 37.3.
        assert!((m.finish_after_s - 37.3).abs() < 0.1, "{m:?}");
    }

    #[test]
    fn after_a_move_it_waits_and_each_host_takes_a_vm_once() {
        let mut b = two_hosts(10);
        for t in 0..=4 {
            let t = f64::from(t);
            b.observe(0, t, &seen(0, t / 3.0, (t / 3.0) as u32));
            b.observe(1, t, &seen(1, t / 6.0, (t / 6.0) as u32));
        }
        let m = b.propose(4.0).unwrap();
        b.moved(&m.vm, m.to, 4.0, 0.02);
        assert_eq!(b.propose(4.5), None, "settling");
        assert_eq!(
            b.expected_cost_s(),
            0.3,
            "a cheap first migration sets no precedent"
        );
        b.moved("j4", 0, 5.0, 1.2);
        b.moved("j5", 0, 6.0, 1.4);
        assert_eq!(b.expected_cost_s(), 1.2, "the median of those measured");
        let moved = b.vms.iter().find(|v| v.name == m.vm).unwrap();
        assert!(
            moved.may_go.is_empty(),
            "it cannot go back: its home has no slot"
        );
        assert_eq!(moved.host, 0);
    }

    #[test]
    fn a_move_gaining_less_than_twice_its_cost_is_not_made() {
        // Near the end: the fast host is done; the slow host's last VM has 0.5 s of
        // work left at 0.5 CPU/s (1 s). On the fast host it would take 0.5 s plus the
        // move: a gain of 0.2 s, less than twice the 0.3 s a move costs.
        let mut b = two_hosts(4);
        for t in 0..=2 {
            let t = f64::from(t);
            b.observe(0, t, &seen(0, t / 3.0, 0));
            b.observe(1, t, &seen(1, 2.0 + t / 6.0, 2));
        }
        let done = |vm: &str| Seen {
            vm: vm.into(),
            results: 4,
            cpu_s: 4.0,
            running: false,
            of: None,
        };
        b.observe(0, 20.0, &[done("j0"), done("j1"), done("j2")]);
        let last = |cpu: f64| {
            let j3 = Seen {
                vm: "j3".into(),
                results: 3,
                cpu_s: cpu,
                running: true,
                of: None,
            };
            vec![j3, done("j4"), done("j5")]
        };
        b.observe(1, 20.0, &last(3.0));
        b.observe(1, 20.5, &last(3.25));
        b.observe(1, 21.0, &last(3.5));
        let alone = b.finishes(None).unwrap();
        assert!((alone[1] - 1.0).abs() < 1e-9, "{alone:?}");
        assert_eq!(b.propose(21.0), None);
        // With moves for free it would go.
        b.config.min_cost_s = 0.0;
        assert!(b.propose(21.0).is_some());
    }

    #[test]
    fn a_balanced_pool_is_left_alone() {
        // Equal hosts, equal VMs: no move gains anything.
        let mut b = two_hosts(10);
        for t in 0..=4 {
            let t = f64::from(t);
            b.observe(0, t, &seen(0, t / 3.0, (t / 3.0) as u32));
            b.observe(1, t, &seen(1, t / 3.0, (t / 3.0) as u32));
        }
        assert_eq!(b.propose(4.0), None);
    }

    #[test]
    fn the_last_vms_of_a_slow_host_go_where_cpu_is_free() {
        // The fast host is done; the slow one has three VMs with 2 items left each.
        let mut b = two_hosts(4);
        let done = |host: usize| -> Vec<Seen> {
            (0..3)
                .map(|k| Seen {
                    vm: format!("j{}", host * 3 + k),
                    results: 4,
                    cpu_s: 4.0,
                    running: false,
                    of: None,
                })
                .collect()
        };
        for t in 0..=2 {
            let t = f64::from(t);
            b.observe(0, t, &seen(0, t / 3.0, 0));
            b.observe(1, t, &seen(1, 2.0 + t / 6.0, 2));
        }
        b.observe(0, 12.0, &done(0));
        b.observe(1, 12.0, &seen(1, 2.0 + 12.0 / 6.0, 2));
        b.observe(1, 13.0, &seen(1, 2.0 + 13.0 / 6.0, 2));
        let m = b.propose(13.0).expect("a move to the idle host");
        assert_eq!((m.from, m.to), (1, 0));
    }

    /// An MPI job of four spinning ranks, two on each host, the second host at half
    /// speed: each fast rank gets 0.5 CPU/s, each slow one 0.25, and the job shows
    /// 1 % of its 100 steps every 0.1 s.
    fn lockstep_at(b: &mut Balancer, t: f64, with_steps: bool) {
        let step = |t: f64| (t * 10.0).floor() as u32;
        for host in 0..2 {
            let per_rank = if host == 0 { 0.5 } else { 0.25 };
            let seen: Vec<Seen> = (0..2)
                .map(|k| Seen {
                    vm: format!("u{}", host * 2 + k),
                    results: if with_steps { step(t) } else { 0 },
                    cpu_s: t * per_rank,
                    running: true,
                    of: with_steps.then_some(100),
                })
                .collect();
            b.observe(host, t, &seen);
        }
    }

    fn mpi_job() -> Balancer {
        let vms: Vec<(String, usize, Vec<usize>)> = (0..4)
            .map(|k| (format!("u{k}"), k / 2, vec![1 - k / 2]))
            .collect();
        let vms: Vec<(&str, usize, Vec<usize>)> = vms
            .iter()
            .map(|(n, h, g)| (n.as_str(), *h, g.clone()))
            .collect();
        Balancer::lockstep(Config::default(), 2, &vms)
    }

    #[test]
    fn a_rank_of_a_lockstep_job_moves_to_where_its_pace_is_best() {
        let mut b = mpi_job();
        for k in 0..=20 {
            lockstep_at(&mut b, f64::from(k) * 0.1, true);
        }
        let m = b.propose(2.0).expect("a move");
        assert_eq!((m.from, m.to), (1, 0), "{m:?}");
        // 80 % left at 10 % a second: 8 s. With three ranks on the fast host the
        // slowest gets 1/3 instead of 1/4: 8 x 0.75 + 0.3 s for the move.
        assert!((m.finish_before_s - 8.0).abs() < 0.2, "{m:?}");
        assert!((m.finish_after_s - 6.3).abs() < 0.2, "{m:?}");
    }

    #[test]
    fn a_lockstep_jobs_pace_is_taken_between_the_steps_it_shows() {
        // SP.A shows 5 % every 2.5 s: a one-second window would see 0 or 5 % a second.
        let mut b = mpi_job();
        for k in 0..=100 {
            let t = f64::from(k) * 0.1;
            let done = 20 * (k / 25) as u32 + 20; // 1 of 20 shown at once, then +1 per 2.5 s
            for host in 0..2 {
                let seen: Vec<Seen> = (0..2)
                    .map(|r| Seen {
                        vm: format!("u{}", host * 2 + r),
                        results: done,
                        cpu_s: t * 0.5,
                        running: true,
                        of: Some(400),
                    })
                    .collect();
                b.observe(host, t, &seen);
            }
        }
        // From 5 % at 0 s... 10 % at 2.5 s to 25 % at 10 s: 2 % a second.
        assert!(
            (b.job_rate().unwrap() - 0.02).abs() < 1e-9,
            "{:?}",
            b.progress
        );
    }

    #[test]
    fn a_lockstep_job_waits_for_every_ranks_steps() {
        let mut b = mpi_job();
        for k in 0..=20 {
            lockstep_at(&mut b, f64::from(k) * 0.1, false);
        }
        assert_eq!(b.propose(2.0), None, "no steps shown: no prediction");
        assert_eq!(b.job_done(), None);
    }

    #[test]
    fn a_vm_of_a_stranger_is_ignored() {
        let mut b = two_hosts(4);
        b.observe(
            0,
            0.0,
            &[Seen {
                vm: "dom0".into(),
                results: 9,
                cpu_s: 9.0,
                running: true,
                of: None,
            }],
        );
        assert!(b.vms.iter().all(|v| v.results == 0));
    }
}
