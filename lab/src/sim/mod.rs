//! `kumo sim --config sim.toml [--json]`: the credit scheduler (`sched`, the very
//! code that places real vCPUs in `kumo node`) driving a modelled cluster, to explore
//! settings in seconds instead of hours of real runs: S1's question of how the slice,
//! the tick and domain 0's weight change an MPI code whose ranks busy-wait
//! (`../shared/research/SEEDS.md`). [`config`] is the file, [`program`] the phase
//! lists, [`model`] the cluster, [`report`] the output.
//!
//! # The model
//! - A **node** has pCPUs and its own `sched::Scheduler`, with domain 0 (its
//!   `dom0_vcpus`, its weight) and the file's domains. Every domain vCPU runs
//!   `ranks_per_vcpu` (R, default 1) MPI **ranks**, numbered node by node, domain by
//!   domain in file order and, inside a domain, as kumo's guest numbers them
//!   (`guests/user/src/main.rs`, `MpiJob::run`, for `mpi=FIRST:SIZE:LOCAL` and
//!   `ranks_per_vcpu=R`): vCPU v runs ranks FIRST + v*R + k, k = 0..R, as its guest
//!   scheduler's task k; task 0 runs first. All ranks start at time 0.
//! - A rank repeats its phase list `iterations` times: `compute` needs that much
//!   CPU progress; `send` costs the rank `send_us` of CPU (netfront) and hands the
//!   message to its node's domain 0; `recv` waits for a message; `io` asks domain 0
//!   for work and waits for it; `sleep` halts; collectives expand into sends and
//!   receives ([`program`]). Sends are eager: the sender goes on at once.
//! - **Waiting** is spinning by default, as MPI's `MPI_Wait`: the rank stays
//!   runnable and burns its pCPU (counted as busy-waiting) until what it waits for
//!   is there and it is running to see it. With `wait = "block"` it halts instead
//!   and is woken like any halted vCPU; `wait = "yield"` is spinning for a rank
//!   alone on its vCPU.
//! - **Several ranks per vCPU** (docs/guests-multirank.md): the vCPU's ranks are
//!   tasks of the guest's scheduler; only the current one progresses while the vCPU
//!   runs. The guest tick (`guest_hz`; 250 by default when R > 1, none with R = 1
//!   unless given; a scenario's `guest_hz` sets every domain's) comes at multiples
//!   of 1/guest_hz of host time, as the LAPIC timer runs; one that comes while the
//!   vCPU does not run is delivered when it next runs (at most one pending). Each
//!   tick costs the vCPU `guest_tick_us`, and if another task can run the guest
//!   switches to the next one round robin for `guest_switch_us` more, once the
//!   current one has had its slice: `guest_slice_ticks` ticks (1, kumo's guest, by
//!   default; Linux 2.6's O(1) scheduler gave a CPU-bound task 100 ms, 25 ticks at
//!   250 Hz). The slice counts ticks received, so it lasts longer in host time on a
//!   vCPU often kept off its pCPU. Waits: `spin` polls until the tick preempts it (the vCPU stays runnable);
//!   `yield` hands the vCPU to the next task that can go on at once (a
//!   `guest_switch_us`), or polls if there is none and yields as soon as one can;
//!   with `yield_spin_us` (the guest MPI's 50 µs `spin_us`) it polls that long
//!   first, then yields to the next task that is not blocked, a poller too, as
//!   `sched_yield` does: tasks that all wait take turns polling, and a message for
//!   one off the vCPU waits for its turn;
//!   `block` puts the task to sleep and switches to another (`guest_switch_us`), and
//!   when all sleep the vCPU halts. A message for a sleeping task from outside its
//!   vCPU (domain 0's delivery, or a rank of another vCPU) switches to it at once,
//!   waking the vCPU first if halted (`wake_us`); one from its own vCPU waits for the
//!   next tick, yield or block (as the guest's shared-memory bell). `sleep:MS` on a
//!   vCPU of several ranks lets the others run. Ranks of one domain with R > 1 talk
//!   through **shared memory** (kumo's guest's default then): a message costs the
//!   sender `shm_us` instead of `send_us`, no domain 0, no wire, and is there at once.
//!   With one rank per vCPU they go through domain 0, as before. Per rank, the
//!   report's CPU is then the vCPU time it was current (its work, busy-waiting and
//!   the guest's costs charged meanwhile); the host's switch costs stay with the vCPU.
//!   What this leaves out of the guest: the 50 µs of polling before a block (and
//!   before a yield, unless `yield_spin_us` says it),
//!   the tick waking a halted vCPU (only messages and timers do here), and a
//!   yielding task picked by a tick while it only polls (it would hand straight on).
//! - **Directed yield** (`directed_yield = true` in `[scheduler]` or a scenario): a
//!   rank that starts waiting for a message from a rank of its own domain and node
//!   that is still computing names that rank's vCPU to `Scheduler::yield_to`, which
//!   BOOSTs it if it is queued UNDER (the guest's "waiting for vCPU k" hint). The
//!   scheduler reacts to every event at once here; the real driver only samples the
//!   vCPU threads at its ticks, and that difference is where its gain comes from
//!   (README, "More vCPUs than host CPUs").
//! - A **message** costs domain 0 `dom0_per_message_us` + `dom0_per_kib_us` per KiB
//!   of CPU on the sending node (netback), then occupies the sending node's link
//!   for size / `network_mb_s` and travels `network_latency_us`, then costs the
//!   receiving node's domain 0 the same again, then is in the receiver's mailbox.
//!   Between two domains of one node there is no wire, but domain 0 does both
//!   sides (it copies out of one domain and into the other).
//!   Per frame, as kumo's switch charges (`[dom0] frame_cost_us`, `kib_cost_us`),
//!   domain 0 also pays `dom0_per_frame_us` per frame and `dom0_per_frame_kib_us`
//!   per KiB once where a frame enters a node's switch (the sending node, and the
//!   receiving one after a wire): a message is ceil((bytes + 16) /
//!   `frame_payload_bytes`) data frames (the guest MPI's 8968-byte jumbo payload)
//!   plus `extra_frames_per_message` minimum frames (acknowledgements). With
//!   `retransmit_after_ms` (the guest MPI's 10 ms timer; 0, off, by default) a
//!   message its receiver consumes later than that after it was sent (or after its
//!   last acknowledgement to that sender) costs domain 0 a probe and its answer per
//!   timeout (doubling); the guest sends no data again for a probe that comes after
//!   it (docs/results/2026-11-28-sim-loaded-dom0.md, 2026-11-29-spurious-timeouts.md).
//!   With `rx_ring_frames` (0, unlimited, by default: kumo's switch queues for a slow
//!   reader) each DomU has a receive ring: what domain 0 delivers while the DomU's
//!   vCPU is off its pCPU waits in it until the vCPU is next dispatched; of a message
//!   that does not fit, the rest is lost and its sender's domain 0 sends it again
//!   `lost_resend_ms` later (TCP's 200 ms minimum, doubling per loss; no window, no
//!   fast retransmit) (docs/results/2026-11-29-sim-s1-tcp.md).
//! - **Domain 0** works through its node's job queue in order (message sides, `io`
//!   requests). A domain 0 vCPU with nothing to do halts; new work wakes one (unless
//!   one is awake between jobs), and the credit scheduler BOOSTs it on that wake-up
//!   as Xen does. So it preempts a busy-waiting rank at once, unless the ratelimit
//!   protects a rank dispatched less than `ratelimit_us` ago, or domain 0 has lost
//!   BOOST (a tick found it running) or is OVER: then it waits for the spinning
//!   vCPU's ratelimit or slice to end. That wait is what S1 measured.
//! - **Costs**: every wake-up of a halted vCPU (domain 0's work, a blocked receive, a
//!   sleep's timer) reaches the scheduler `wake_us` after its cause; a pCPU that
//!   starts running another vCPU than the one it ran last loses `switch_us` before
//!   that vCPU progresses (resuming the same one, or the first vCPU of the run, is
//!   free); `tick_us` is taken from the running vCPU at each scheduler timer
//!   interrupt of a busy pCPU while kumo's driver ticks (it sleeps tickless while no
//!   vCPU waits for a pCPU and domain 0 had no work for 10 ms); `guest_tick_us`, `guest_switch_us` and `shm_us`
//!   (default 0) are the guest scheduler's (above): kumo measured a tick that does not
//!   switch at ~56 µs and a rank switch at ~94 µs (docs/guests-multirank.md, ring 0
//!   emulated on its hosts). Calibration, as in `examples/sim-s1.toml`:
//!   `switch_us = 29` is `kumo bench switch --mechanism fifo` (median host-CPU
//!   hand-over between two vCPU threads, p99 44); `wake_us = 46` is `kumo bench wake`
//!   (75 µs median from a halted vCPU's interrupt to its running beside a busy one,
//!   slice 30 ms) minus that switch, which the model adds itself; it agrees with
//!   `kumo bench irq`'s fast path (43–55 µs to a halted vCPU). `tick_us = 0`
//!   in this example: kumo's credit driver ticks on a spare host CPU (0.8 % of it at
//!   10 ms, ~5 % at 1 ms), not on the guests' pCPUs. Where the host has no spare CPU
//!   `kumo experiment s1` measures it (the driver's CPU a run and two switches, over
//!   the pCPUs' ticks). Domain 0's and the network's costs cannot be
//!   measured here (kumo has no netback nor NIC yet); the example takes them from
//!   the hardware of S1's time (see the file).
//!
//! What it leaves out: the guests' own interrupt and TCP work on receive, MPI's
//! rendezvous protocol for large messages, flow control, and caches. The scheduler is
//! `sched` as configured: by default it debits credit exactly (Xen after "Accurate
//! accounting for credit scheduler") and has Xen 4.2's ratelimit; `accounting =
//! "tick"` debits a whole tick from the vCPU a tick finds running and drops the
//! ratelimit, as S1's Xen 3.4 did (the example's `xen3.4-*` scenarios). On the
//! example, with exact accounting it is the ratelimit, not the slice, that makes 1/1
//! ms faster than Xen's defaults (README, "Simulating S1"). Times are simulated
//! nanoseconds; the host's speed does not matter.
//!
//! # Determinism
//! No randomness, no hash maps, no host clock: events are ordered by (time,
//! insertion number), and the output has no host-dependent field, so the same file
//! gives the same bytes.

pub mod config;
pub mod forkjoin;
pub mod model;
pub mod program;
pub mod report;
pub mod topology;

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

pub fn run_sim(args: &SimArgs) -> Result<u8> {
    let text = kumo_vmm::input::read_config("simulation file", &args.config)?;
    if forkjoin::is_forkjoin(&text) {
        let sim = forkjoin::parse(&text)
            .with_context(|| format!("in simulation file {}", args.config.display()))?;
        let report = forkjoin::run(&sim)?;
        if args.json {
            kumo_vmm::outln!("{}", serde_json::to_string(&report)?);
        } else {
            kumo_vmm::out!("{}", report.text());
        }
        return Ok(0);
    }
    let sim = config::parse(&text)
        .with_context(|| format!("in simulation file {}", args.config.display()))?;
    let report = run(&sim)?;
    if args.json {
        kumo_vmm::outln!("{}", report.json());
    } else {
        kumo_vmm::out!("{}", report.text());
    }
    Ok(0)
}

/// Every program under every scenario, programs outermost.
pub fn run(sim: &config::Sim) -> Result<report::Report> {
    let mut runs = Vec::new();
    for program in &sim.programs {
        for scenario in &sim.scenarios {
            let outcome = model::simulate(sim, program, scenario).with_context(|| {
                format!("program '{}', scenario '{}'", program.name, scenario.name)
            })?;
            runs.push(report::Run::new(sim, program, scenario, &outcome));
        }
    }
    Ok(report::Report::new(runs))
}

#[derive(Args, Debug)]
pub struct SimArgs {
    /// The simulation file (TOML; see examples/sim-s1.toml).
    #[arg(long, value_name = "PATH")]
    pub config: PathBuf,

    /// Print one JSON object (every run) instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::config::parse;
    use super::*;
    use kumo_vmm::spec::job::Wait;

    /// One node of `pcpus`, one single-vCPU domain per weight, free switches and wakes.
    fn cluster(pcpus: u32, weights: &[u32], program: &str, duration_s: f64) -> String {
        let mut text = format!(
            "duration_s = {duration_s}\n[costs]\nswitch_us = 0\nwake_us = 0\n\
             [[node]]\nname = \"n\"\npcpus = {pcpus}\n"
        );
        for (i, w) in weights.iter().enumerate() {
            text.push_str(&format!("[[node.domain]]\nname = \"d{i}\"\nweight = {w}\n"));
        }
        text.push_str(&format!("[[program]]\nname = \"p\"\n{program}\n"));
        text
    }

    fn run_text(text: &str) -> report::Report {
        run(&parse(text).unwrap()).unwrap()
    }

    #[test]
    fn compute_alone_takes_exactly_its_work() {
        // Switch costs do not matter: each rank has a pCPU of its own.
        let text = cluster(
            2,
            &[256, 256],
            "iterations = 7\nphases = [\"compute:1.25\", \"compute:0.5\"]",
            10.0,
        )
        .replace("switch_us = 0", "switch_us = 29");
        let r = run_text(&text);
        assert_eq!(r.runs[0].time_s, Some(7.0 * 1.75e-3));
        assert_eq!(r.runs[0].busy_wait_s, 0.0);
        assert_eq!(r.runs[0].dom0_cpu_s, 0.0);
    }

    #[test]
    fn weights_share_one_pcpu() {
        let r = run_text(&cluster(
            1,
            &[256, 512],
            "phases = [\"compute:100000\"]",
            9.0,
        ));
        let run = &r.runs[0];
        assert!(!run.finished);
        let (a, b) = (run.domains[1].cpu_s, run.domains[2].cpu_s);
        assert!((b / a - 2.0).abs() < 0.1, "{a} {b}");
        assert!((a + b - 9.0).abs() < 1e-6, "work conserving: {a} {b}");
    }

    #[test]
    fn a_message_costs_domain_0_on_both_nodes_and_the_wire() {
        let text = "[costs]\nswitch_us = 0\nwake_us = 10\nsend_us = 2\ndom0_per_message_us = 20\n\
             dom0_per_kib_us = 1\nnetwork_latency_us = 30\nnetwork_mb_s = 1000\n\
             [[node]]\nname = \"a\"\npcpus = 2\n[[node.domain]]\nname = \"x\"\n\
             [[node]]\nname = \"b\"\npcpus = 2\n[[node.domain]]\nname = \"y\"\n\
             [[program]]\nname = \"p\"\n[[program.rank]]\nranks = [0]\nphases = [\"send:1:2048\"]\n\
             [[program.rank]]\nranks = [1]\nphases = [\"recv:0\"]\n";
        let r = run_text(text);
        // send 2 + wake 10 + dom0 22 + wire 2.048 + 30 + wake 10 + dom0 22 = 98.048 us.
        let t = r.runs[0].time_s.unwrap();
        assert!((t - 98.048e-6).abs() < 1e-12, "{t}");
        assert_eq!(r.runs[0].messages, 1);
        assert!((r.runs[0].dom0_cpu_s - 44e-6).abs() < 1e-12);
        // The receiver spun all along (it had its own pCPU).
        assert!((r.runs[0].ranks[1].busy_wait_s - t).abs() < 1e-12);
    }

    /// One pCPU: rank 0 sends 100 frames of 1000 bytes to rank 1, which computes
    /// 50 ms first. Domain 0 delivers on the one pCPU, so rank 1's vCPU never runs
    /// as the frames come: they wait in its receive ring of `ring` frames.
    fn one_message_through_a_ring(ring: u32) -> report::Run {
        let text = format!(
            "duration_s = 60\n[costs]\nswitch_us = 0\nwake_us = 0\nsend_us = 0\n\
             dom0_per_message_us = 10\nframe_payload_bytes = 1000\n\
             rx_ring_frames = {ring}\nlost_resend_ms = 100\n\
             [[node]]\nname = \"n\"\npcpus = 1\n\
             [[node.domain]]\nname = \"x\"\n[[node.domain]]\nname = \"y\"\n\
             [[program]]\nname = \"p\"\n\
             [[program.rank]]\nranks = [0]\nphases = [\"send:1:99984\"]\n\
             [[program.rank]]\nranks = [1]\nphases = [\"compute:50\", \"recv:0\"]\n"
        );
        run_text(&text).runs.remove(0)
    }

    #[test]
    fn a_message_larger_than_a_descheduled_receivers_ring_waits_for_its_resend() {
        // Unlimited (kumo's switch queues for a slow reader): no loss, done when
        // rank 1's compute is.
        let unlimited = one_message_through_a_ring(0);
        assert_eq!(unlimited.lost_messages, None);
        let t = unlimited.time_s.unwrap();
        assert!(t < 0.06, "{t}");
        // A ring of 200 frames holds it all.
        let roomy = one_message_through_a_ring(200);
        assert_eq!(roomy.lost_messages, Some(0));
        assert_eq!(roomy.time_s, unlimited.time_s);
        // A ring of 60: 60 frames wait in it, the other 40 are lost and resent
        // 100 ms later, when rank 1 has drained the ring (it ran meanwhile). The
        // loss came about 31 ms in (rank 1 ran first, domain 0 after its slice).
        let small = one_message_through_a_ring(60);
        assert_eq!(small.lost_messages, Some(1));
        let t = small.time_s.unwrap();
        assert!((0.13..0.14).contains(&t), "{t}");
        // Domain 0 carries the lost 40 % of the bytes a second time.
        let extra = small.dom0_cpu_s / unlimited.dom0_cpu_s;
        assert!((1.35..1.45).contains(&extra), "{extra} {small:?}");
        // A ring of 10: 10 frames a trip, the timer doubling each time: nine losses,
        // 100 ms x (2^9 - 1) of waiting.
        let tiny = one_message_through_a_ring(10);
        assert_eq!(tiny.lost_messages, Some(9), "{tiny:?}");
        assert!(tiny.time_s.unwrap() > 51.1, "{tiny:?}");
    }

    #[test]
    fn blocking_receivers_never_spin_and_sleep_and_io_finish() {
        let text = cluster(
            1,
            &[256, 256],
            "iterations = 20\nwait = \"block\"\n\
             phases = [\"compute:1\", \"io:50\", \"sleep:0.5\", \"exchange:ring:100\", \"barrier\"]",
            10.0,
        );
        let sim = parse(&text).unwrap();
        assert_eq!(sim.programs[0].wait, Wait::Block);
        let r = run(&sim).unwrap();
        assert!(r.runs[0].finished);
        assert_eq!(r.runs[0].busy_wait_s, 0.0);
        // Two ranks' compute on one pCPU, at least.
        assert!(r.runs[0].time_s.unwrap() > 0.04);
    }

    #[test]
    fn mismatched_receives_are_a_deadlock_not_a_hang() {
        let text = cluster(2, &[256, 256], "phases = [\"recv:+1\"]", 100.0);
        let e = format!("{:#}", run(&parse(&text).unwrap()).unwrap_err());
        assert!(e.contains("deadlock at"), "{e}");
        assert!(e.contains("rank 0 waits for rank 1"), "{e}");
    }

    /// 2 pCPUs: a 4-vCPU domain whose ranks each compute 1 ms, send to the next and
    /// wait for the previous, 200 times, against a 2-vCPU domain of long
    /// computations; `wait` is how the ring's ranks wait. Returns the ring's
    /// completion time and how many directed yields BOOSTed a vCPU.
    fn ring_against_a_hog(directed_yield: bool, wait: &str) -> (f64, u64) {
        let mut text = format!(
            "duration_s = 20\n[scheduler]\ndirected_yield = {directed_yield}\n\
             [costs]\nswitch_us = 29\nwake_us = 46\n\
             [[node]]\nname = \"n\"\npcpus = 2\n\
             [[node.domain]]\nname = \"ring\"\nvcpus = 4\n\
             [[node.domain]]\nname = \"hog\"\nvcpus = 2\n\
             [[program]]\nname = \"p\"\niterations = 200\nwait = \"{wait}\"\n"
        );
        for r in 0..4 {
            let (next, prev) = ((r + 1) % 4, (r + 3) % 4);
            text.push_str(&format!(
                "[[program.rank]]\nranks = [{r}]\n\
                 phases = [\"compute:1\", \"send:{next}:8\", \"recv:{prev}\"]\n"
            ));
        }
        text.push_str("[[program.rank]]\nranks = [4, 5]\nphases = [\"compute:3000\"]\n");
        let r = run_text(&text);
        let run = &r.runs[0];
        assert_eq!(run.directed_yield, directed_yield);
        let ring = run.ranks[..4]
            .iter()
            .map(|r| r.finish_s.unwrap())
            .fold(0.0, f64::max);
        (ring, run.directed_boosts)
    }

    /// Pins what the model says of directed yield (README, "More vCPUs than host
    /// CPUs"): a rank waiting for a message hurries its sender, but the ring gains
    /// nothing. Blocking waiters are woken with BOOST, so the ring's vCPUs already run
    /// ahead of the hog (within 1 %); spinning ones are bound by the ring's credit,
    /// which the spinning burns, so hurrying the sender only moves when the ring runs
    /// (it ends up slower). What the real driver gains comes from what the model
    /// leaves out: between two of its runs the kernel ranks vCPU threads by the
    /// driver's last decisions, and the hint lifts laggards that rank left queued.
    #[test]
    fn directed_yield_hurries_senders_without_gain_in_the_model() {
        let (off, none) = ring_against_a_hog(false, "block");
        let (on, boosts) = ring_against_a_hog(true, "block");
        assert_eq!(none, 0);
        assert!(
            (on - off).abs() <= 0.01 * off,
            "block: {on} s with, {off} s without"
        );
        let (off, none) = ring_against_a_hog(false, "spin");
        let (on, boosts_spin) = ring_against_a_hog(true, "spin");
        assert_eq!(none, 0);
        // Rarely: a sender still computing is mostly running or BOOSTed already
        // (3 boosts blocking, 20 spinning, over 800 waits each).
        assert!(boosts_spin > 0, "hints answered: {boosts} + {boosts_spin}");
        assert!(on > off, "spin: {on} s with, {off} s without");
    }

    /// One node, one domain of `vcpus` vCPUs with `r` ranks each, a pCPU per vCPU (and
    /// one for domain 0), guest costs as kumo measured them; `program` is the
    /// `[[program]]` body, `extra` appended (scenarios).
    fn multirank(vcpus: u32, r: u32, program: &str, extra: &str) -> String {
        format!(
            "duration_s = 60\n[costs]\nswitch_us = 29\nwake_us = 46\nguest_tick_us = 56\n\
             guest_switch_us = 94\nshm_us = 2\n\
             [[node]]\nname = \"n\"\npcpus = {}\n\
             [[node.domain]]\nname = \"u\"\nvcpus = {vcpus}\nranks_per_vcpu = {r}\n\
             [[program]]\nname = \"p\"\n{program}\n{extra}",
            vcpus + 1
        )
    }

    /// Ranks 0 and 1 (one vCPU) bounce a message 100 times.
    const PING_PONG: &str = "iterations = 100\n\
         [[program.rank]]\nranks = [0]\nphases = [\"send:1:8\", \"recv:1\"]\n\
         [[program.rank]]\nranks = [1]\nphases = [\"recv:0\", \"send:0:8\"]\n";

    fn scenario(name: &str, keys: &str) -> String {
        format!("[[scenario]]\nname = \"{name}\"\n{keys}\n")
    }

    #[test]
    fn ranks_sharing_a_vcpu_wait_for_each_other_a_tick_when_spinning_a_switch_when_yielding() {
        let extra = [
            scenario("spin", "wait = \"spin\""),
            scenario("spin-1000", "wait = \"spin\"\nguest_hz = 1000"),
            scenario("yield", "wait = \"yield\""),
            scenario("block", "wait = \"block\""),
        ]
        .concat();
        let r = run_text(&multirank(1, 2, PING_PONG, &extra));
        let round_trip = |i: usize| {
            let run = &r.runs[i];
            assert!(run.finished, "{}", run.scenario);
            // Shared memory: domain 0 never works.
            assert_eq!(run.dom0_cpu_s, 0.0);
            assert_eq!(run.messages, 200);
            run.time_s.unwrap() / 100.0
        };
        // Spinning: each message waits for the tick that switches to its receiver, so
        // a round trip is two tick periods (250 Hz: 8 ms; 1000 Hz: 2 ms).
        let spin = round_trip(0);
        assert!((spin - 8e-3).abs() < 0.01 * 8e-3, "{spin}");
        let spin_1000 = round_trip(1);
        assert!((spin_1000 - 2e-3).abs() < 0.01 * 2e-3, "{spin_1000}");
        assert!(r.runs[0].busy_wait_s > 0.9 * r.runs[0].time_s.unwrap());
        // Yielding: each message costs a rank switch (94 us) and its shared-memory copy.
        let yielding = round_trip(2);
        assert!(
            (2.0 * 96e-6..2.0 * 96e-6 + 5e-6).contains(&yielding),
            "{yielding}"
        );
        assert_eq!(r.runs[2].busy_wait_s, 0.0);
        assert_eq!(r.runs[2].guest_switches, Some(200));
        // Blocking with the other rank runnable switches to it, as a yield does.
        let block = round_trip(3);
        assert!((block - yielding).abs() < 1e-9, "{block} {yielding}");
    }

    /// The guest MPI polls `spin_us` before it yields: with `yield_spin_us` each
    /// hand-over of the ping-pong costs that poll as well as the switch.
    #[test]
    fn a_yielding_rank_polls_its_spin_before_it_hands_over() {
        let extra = scenario("yield", "wait = \"yield\"");
        let file = multirank(1, 2, PING_PONG, &extra)
            .replace("shm_us = 2\n", "shm_us = 2\nyield_spin_us = 50\n");
        let r = run_text(&file);
        let run = &r.runs[0];
        assert!(run.finished);
        let round_trip = run.time_s.unwrap() / 100.0;
        // Two hand-overs of 50 + 94 us, and the two copies.
        assert!(
            (2.0 * 146e-6..2.0 * 146e-6 + 5e-6).contains(&round_trip),
            "{round_trip}"
        );
        assert_eq!(run.guest_switches, Some(200));
    }

    /// Ranks that all wait take turns polling, as `sched_yield` runs any runnable
    /// task: while ranks 0 and 1 wait for rank 2 (another vCPU, 1 ms of compute),
    /// their vCPU switches every poll and switch; without a poll it never switches.
    #[test]
    fn ranks_that_all_wait_take_turns_polling() {
        let program = "iterations = 20\nwait = \"yield\"\n\
             [[program.rank]]\nranks = [0, 1]\nphases = [\"recv:2\"]\n\
             [[program.rank]]\nranks = [2]\nphases = [\"compute:1\", \"send:0:8\", \"send:1:8\"]\n\
             [[program.rank]]\nranks = [3]\nphases = [\"compute:1\"]\n";
        let switches = |spin: &str| {
            let file = multirank(2, 2, program, "").replace(
                "shm_us = 2\n",
                &format!("shm_us = 2\nyield_spin_us = {spin}\n"),
            );
            let r = run_text(&file);
            assert!(r.runs[0].finished);
            r.runs[0].guest_switches.unwrap()
        };
        let (polling, at_once) = (switches("50"), switches("0"));
        // 1 ms of waiting is about 7 turns of 50 + 94 us, each iteration.
        assert!(polling >= 20 * 5, "{polling}");
        assert!(polling >= 4 * at_once, "{polling} against {at_once}");
    }

    /// Linux's O(1) scheduler let a CPU-bound task keep its CPU for 100 ms (25 ticks
    /// at 250 Hz): two ranks spinning on one vCPU then wait a whole slice for each
    /// other, where a yielding rank hands over at once, whatever the slice.
    #[test]
    fn a_guest_slice_of_several_ticks_stretches_spinning_waits_not_yielding_ones() {
        let extra = [
            scenario("spin-5", "wait = \"spin\"\nguest_slice_ticks = 5"),
            scenario("spin-25", "wait = \"spin\"\nguest_slice_ticks = 25"),
            scenario("yield-1", "wait = \"yield\""),
            scenario("yield-25", "wait = \"yield\"\nguest_slice_ticks = 25"),
        ]
        .concat();
        let r = run_text(&multirank(1, 2, PING_PONG, &extra));
        let round_trip = |i: usize| {
            assert!(r.runs[i].finished, "{}", r.runs[i].scenario);
            r.runs[i].time_s.unwrap() / 100.0
        };
        // Each message waits for its receiver's turn: a slice of 5 or 25 4-ms ticks.
        let spin_5 = round_trip(0);
        assert!((spin_5 - 40e-3).abs() < 0.01 * 40e-3, "{spin_5}");
        let spin_25 = round_trip(1);
        assert!((spin_25 - 200e-3).abs() < 0.01 * 200e-3, "{spin_25}");
        assert_eq!(r.runs[1].domains[1].guest_slice_ticks, Some(25));
        assert_eq!(r.runs[2].domains[1].guest_slice_ticks, None);
        let (yield_1, yield_25) = (round_trip(2), round_trip(3));
        assert!((yield_1 - yield_25).abs() < 1e-9, "{yield_1} {yield_25}");
    }

    /// kumo's driver sleeps tickless while each pCPU has one vCPU and domain 0 is
    /// idle: computing ranks then pay no `tick_us`. With a vCPU more than pCPUs it
    /// ticks, and every tick takes `tick_us` from the vCPU it preempts.
    #[test]
    fn the_tick_costs_only_while_the_driver_ticks() {
        let node = |pcpus: u32, domains: u32, tick_us: u32| {
            let mut text = format!(
                "duration_s = 60\n[costs]\ntick_us = {tick_us}\n\
                 [[node]]\nname = \"n\"\npcpus = {pcpus}\n"
            );
            for d in 0..domains {
                text.push_str(&format!("[[node.domain]]\nname = \"d{d}\"\n"));
            }
            text.push_str(
                "[[program]]\nname = \"p\"\niterations = 1\nphases = [\"compute:100\"]\n\
                 [[scenario]]\nname = \"1/1\"\ntslice_ms = 1\ntick_ms = 1\n",
            );
            run_text(&text).runs[0].time_s.unwrap()
        };
        // A vCPU a pCPU, domain 0 idle: tickless, the tick costs nothing.
        assert_eq!(node(2, 2, 0), node(2, 2, 100));
        // Three vCPUs on two pCPUs: the ticks cost (here +3.4 %: the last vCPU to
        // finish runs alone, tickless, and a tick that switches vCPUs is not charged
        // twice).
        let (free, costly) = (node(2, 3, 0), node(2, 3, 100));
        assert!(costly > 1.02 * free, "{free} {costly}");
    }

    #[test]
    fn blocked_ranks_halt_their_vcpu_and_a_message_wakes_it() {
        // Two domains of 2 ranks on one vCPU each, a pCPU each and one for domain 0:
        // rank r sends to r+2 (the other domain, through domain 0) and waits for r-2.
        // Blocking, nothing spins and each vCPU halts while domain 0 carries the
        // messages; spinning, each vCPU runs all along.
        let text = "duration_s = 60\n[costs]\nguest_tick_us = 56\nguest_switch_us = 94\n\
             [[node]]\nname = \"n\"\npcpus = 3\n\
             [[node.domain]]\nname = \"a\"\nranks_per_vcpu = 2\n\
             [[node.domain]]\nname = \"b\"\nranks_per_vcpu = 2\n\
             [[program]]\nname = \"p\"\niterations = 50\n\
             phases = [\"compute:0.05\", \"send:+2:1000\", \"recv:-2\"]\n\
             [[scenario]]\nname = \"block\"\nwait = \"block\"\n\
             [[scenario]]\nname = \"spin\"\nwait = \"spin\"\n";
        let r = run_text(text);
        let (block, spin) = (&r.runs[0], &r.runs[1]);
        assert!(block.finished && spin.finished);
        assert_eq!(block.busy_wait_s, 0.0);
        assert!(spin.busy_wait_s > 0.0);
        assert_eq!(block.messages, 200);
        let t = block.time_s.unwrap();
        // At least two ranks' compute on each vCPU.
        assert!(t > 2.0 * 50.0 * 0.05e-3, "{t}");
        for d in &block.domains[1..] {
            assert!(d.cpu_s < 0.9 * t, "{} halts: {} of {t}", d.domain, d.cpu_s);
        }
        let ts = spin.time_s.unwrap();
        for d in &spin.domains[1..] {
            assert!(
                d.cpu_s > 0.99 * ts,
                "{} spins: {} of {ts}",
                d.domain,
                d.cpu_s
            );
        }
        // Each rank's CPU is its own: compute, send costs, its share of the guest.
        for rank in &block.ranks {
            assert!(rank.cpu_s >= 50.0 * 0.05e-3, "{rank:?}");
        }
    }

    #[test]
    fn the_guest_tick_slows_compute_by_its_cost_times_its_rate() {
        // One rank alone on its pCPU, 1 s of compute: 250 ticks of 56 us take 1.4 %.
        let alone = |r: u32, hz: &str, ms: u32| {
            let program = format!("phases = [\"compute:{ms}\"]");
            let text = multirank(1, r, &program, "")
                .replace("ranks_per_vcpu", &format!("{hz}ranks_per_vcpu"));
            let r = run_text(&text);
            r.runs[0].time_s.unwrap()
        };
        let t = alone(1, "guest_hz = 250\n", 1000);
        let expect = 1.0 / (1.0 - 56e-6 * 250.0);
        assert!((t - expect).abs() < 1e-4, "{t} against {expect}");
        // Without guest_hz one rank per vCPU has no guest tick: exact.
        assert_eq!(alone(1, "", 1000), 1.0);
        // Two ranks of 0.5 s: every tick also switches (56 + 94 us per 4 ms).
        let t = alone(2, "", 500);
        let expect = 1.0 / (1.0 - 150e-6 * 250.0);
        assert!((t - expect).abs() < 1e-3, "{t} against {expect}");
    }

    #[test]
    fn shared_memory_joins_the_ranks_of_one_domain_only() {
        // 2 vCPUs x 2 ranks in u, 1 rank in v: 0 -> 1 (same vCPU), 0 -> 2 (other vCPU
        // of u) through shared memory; 0 -> 4 (domain v) through domain 0.
        let text = "[costs]\nshm_us = 3\ndom0_per_message_us = 20\ndom0_per_kib_us = 0\n\
             [[node]]\nname = \"n\"\npcpus = 4\n\
             [[node.domain]]\nname = \"u\"\nvcpus = 2\nranks_per_vcpu = 2\n\
             [[node.domain]]\nname = \"v\"\n\
             [[program]]\nname = \"p\"\nwait = \"block\"\n\
             [[program.rank]]\nranks = [0]\nphases = [\"send:1:8\", \"send:2:8\", \"send:4:8\"]\n\
             [[program.rank]]\nranks = [1]\nphases = [\"recv:0\"]\n\
             [[program.rank]]\nranks = [2]\nphases = [\"recv:0\"]\n\
             [[program.rank]]\nranks = [4]\nphases = [\"recv:0\"]\n";
        let sim = parse(text).unwrap();
        assert_eq!(sim.ranks.len(), 5);
        let r = run(&sim).unwrap();
        let run = &r.runs[0];
        assert!(run.finished);
        assert_eq!(run.messages, 3);
        // One message's two sides in domain 0, not three.
        assert!((run.dom0_cpu_s - 40e-6).abs() < 1e-12, "{}", run.dom0_cpu_s);
        // Rank 2 (another vCPU, halted): woken at once, wake_us after the 2 x 3 us
        // (its pCPU ran nothing else meanwhile: no switch cost).
        let finish = |i: usize| run.ranks[i].finish_s.unwrap();
        assert!((finish(2) - (6e-6 + 46e-6)).abs() < 1e-12, "{}", finish(2));
        // Rank 1 (same vCPU: its bell does not preempt) runs once rank 0 is done
        // with its three sends (3 + 3 + 5 us).
        assert!((finish(0) - 11e-6).abs() < 1e-12, "{}", finish(0));
        assert!((finish(1) - 11e-6).abs() < 1e-12, "{}", finish(1));
    }

    #[test]
    fn one_rank_per_vcpu_is_unchanged_by_the_new_keys_at_their_defaults() {
        let base = cluster(
            1,
            &[256, 128],
            "iterations = 30\nphases = [\"compute:2\", \"exchange:ring:4000\", \"sleep:0.3\", \"io:20\"]",
            10.0,
        );
        let explicit = base
            .replace(
                "wake_us = 0\n",
                "wake_us = 0\nguest_tick_us = 0\nguest_switch_us = 0\nshm_us = 0\n",
            )
            .replace("weight = 128\n", "weight = 128\nranks_per_vcpu = 1\n");
        for wait in ["spin", "block"] {
            let scenario = format!("[[scenario]]\nname = \"s\"\nwait = \"{wait}\"\n");
            let a = run_text(&format!("{base}{scenario}")).json();
            assert_eq!(a, run_text(&format!("{explicit}{scenario}")).json());
            assert!(!a.contains("guest"), "{a}");
            // Guest costs without a guest tick change nothing either.
            let costly = base.replace("wake_us = 0\n", "wake_us = 0\nguest_tick_us = 50\n");
            assert_eq!(a, run_text(&format!("{costly}{scenario}")).json());
        }
    }

    #[test]
    fn several_ranks_per_vcpu_run_deterministically_and_deadlocks_are_found() {
        let program = "iterations = 40\nphases = [\"compute:1\", \"exchange:alltoall:3000\", \"sleep:0.2\", \"allreduce:8\"]";
        let extra = [
            scenario("spin", ""),
            scenario("yield", "wait = \"yield\"\ntslice_ms = 1\ntick_ms = 1"),
            scenario("block", "wait = \"block\"\nguest_hz = 100"),
        ]
        .concat();
        // Four ranks per vCPU, fewer pCPUs than vCPUs.
        let text = multirank(3, 4, program, &extra).replace("pcpus = 4", "pcpus = 2");
        let a = run_text(&text);
        assert!(a.runs.iter().all(|r| r.finished), "{}", a.json());
        assert_eq!(a.json(), run_text(&text).json());
        assert!(a.json().contains("\"ranks_per_vcpu\":4"));
        for wait in ["spin", "yield", "block"] {
            let dead = multirank(1, 3, "phases = [\"recv:+1\"]", "")
                .replace("\"p\"\n", &format!("\"p\"\nwait = \"{wait}\"\n"));
            let e = format!("{:#}", run(&parse(&dead).unwrap()).unwrap_err());
            assert!(e.contains("deadlock at"), "{wait}: {e}");
            assert!(e.contains("rank 2 waits for rank 0"), "{wait}: {e}");
        }
    }

    #[test]
    fn runs_are_deterministic() {
        let text = cluster(
            1,
            &[256, 128, 64],
            "iterations = 50\nphases = [\"compute:3\", \"exchange:alltoall:5000\", \"allreduce:8\"]",
            100.0,
        );
        let a = run_text(&text).json();
        assert_eq!(a, run_text(&text).json());
        assert!(a.contains("\"finished\":true"));
    }
}
