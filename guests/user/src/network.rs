//! Network workloads (`mpi=FIRST:SIZE[:LOCAL] net=...`): this VM runs ranks FIRST to
//! FIRST+LOCAL-1 of the job, rank FIRST+c on CPU c over the c-th NIC (the master forks
//! them, [`run_rank`] is one). Each rank brings up its NIC and joins the job, then runs
//! each item: `check` (a checksummed stress of random message sizes
//! and patterns, then the collectives, every byte verified) and `pingpong:SIZES`
//! (OSU-style half round-trip latency between ranks 0 and 1). Prints `@kumo mpi`,
//! `@kumo netcheck`, `@kumo pingpong` and `@kumo mpistats` lines.

use core::fmt::Write;

use kumo_abi::BootInfo;
// `net=`'s limits: kumo checks node files against the same ones.
use kumo_abi::net::{MAX_ITEMS, MAX_MESSAGE as MAX_PINGPONG, MAX_SIZES};

use npb::Spec;
use npb::team::Arena;

use crate::comm::{MpiComm, Progress};
use crate::mpi::{self, Mpi, Op, Request, Shared, Wait};
use crate::net::{MAX_NICS, Nic};
use crate::virtio::Bump;
use crate::{Line, sys};

/// Largest random message of `check`.
const CHECK_MAX_MESSAGE: usize = 4 << 20;
/// `check` also exchanges one message this large (streamed through the window).
const CHECK_BIG_MESSAGE: usize = 16 << 20;
const DEFAULT_CHECK_ROUNDS: u32 = 300;
const WINDOW: u64 = 1 << 20;
const TIMEOUT_MS: u64 = 20_000;

#[derive(Clone, Copy)]
pub enum Item {
    Check,
    PingPong {
        sizes: [u64; MAX_SIZES],
        count: usize,
    },
    Bandwidth {
        sizes: [u64; MAX_SIZES],
        count: usize,
    },
}

/// What `mpi=`, `wait=`, `net=`, `net_rounds=` and `net_seed=` asked for.
#[derive(Clone, Copy)]
pub struct Plan {
    /// The rank of this VM's first rank.
    pub rank: usize,
    pub size: usize,
    /// Ranks this VM runs, `per_cpu` per CPU from CPU 0 (rank FIRST + k on CPU
    /// k / per_cpu).
    pub local: usize,
    /// `ranks_per_vcpu=R`: ranks multiplexed on one CPU by the supervisor's scheduler.
    pub per_cpu: usize,
    /// `guest_hz=H`: the scheduler's tick (None: [`DEFAULT_HZ`] if `per_cpu` > 1, else
    /// no scheduler); `guest_slice=N`: ticks per slice.
    pub hz: Option<u64>,
    pub slice: u64,
    /// `shm=0|1`: the VM's ranks talk through shared memory (default: when `per_cpu`
    /// > 1), not their NICs.
    pub shm: Option<bool>,
    pub wait: Wait,
    pub items: [Option<Item>; MAX_ITEMS],
    pub rounds: Option<u32>,
    pub seed: u64,
    /// `net_drop=N`: drop every Nth data frame received (tests retransmission).
    pub drop_every: u64,
}

impl Plan {
    pub const fn new() -> Plan {
        Plan {
            rank: 0,
            size: 1,
            local: 1,
            per_cpu: 1,
            hz: None,
            slice: 1,
            shm: None,
            wait: Wait::Spin,
            items: [None; MAX_ITEMS],
            rounds: None,
            seed: 1,
            drop_every: 0,
        }
    }

    pub fn any(&self) -> bool {
        self.items[0].is_some()
    }

    /// `mpi=FIRST:SIZE[:LOCAL]` (LOCAL 1 if absent, at most [`MAX_NICS`]).
    pub fn parse_mpi(&mut self, text: &str) -> bool {
        let mut parts = text.split(':');
        let mut number = || parts.next().map(str::parse::<usize>);
        let (Some(Ok(rank)), Some(Ok(size))) = (number(), number()) else {
            return false;
        };
        let local = match number() {
            None => 1,
            Some(Ok(local)) => local,
            Some(Err(_)) => return false,
        };
        if parts.next().is_some()
            || !(1..=MAX_NICS).contains(&local)
            || rank + local > size
            || size > mpi::MAX_RANKS
        {
            return false;
        }
        self.rank = rank;
        self.size = size;
        self.local = local;
        true
    }

    /// `wait=spin|block|yield`.
    pub fn parse_wait(&mut self, text: &str) -> bool {
        self.wait = match text {
            "spin" => Wait::Spin,
            "block" => Wait::Block,
            "yield" => Wait::Yield,
            _ => return false,
        };
        true
    }

    /// The tick of this VM's scheduler, if it runs one.
    pub fn tick_hz(&self) -> Option<u64> {
        match self.hz {
            Some(hz) => Some(hz),
            None if self.per_cpu > 1 => Some(DEFAULT_HZ),
            None => None,
        }
    }

    /// Whether the VM's ranks talk through shared memory.
    pub fn shared(&self) -> bool {
        self.local > 1 && self.shm.unwrap_or(self.per_cpu > 1)
    }

    /// CPUs that run ranks.
    pub fn cpus_used(&self) -> usize {
        self.local.div_ceil(self.per_cpu)
    }

    /// Where the heap goes: the shared-memory channels, the scheduler's tasks, then
    /// one equal share per rank.
    pub fn layout(&self, info: &BootInfo) -> Layout {
        let mut at = (info.heap_start + 4095) & !4095;
        let shm = if self.shared() {
            let base = at;
            at += Shared::bytes(self.local, WINDOW);
            base
        } else {
            0
        };
        let tasks = if self.tick_hz().is_some() {
            let base = at;
            at += self.cpus_used() as u64 * crate::sched::Tasks::bytes(self.per_cpu);
            base
        } else {
            0
        };
        let share = (info.heap_end.saturating_sub(at) / self.local as u64) & !4095;
        Layout {
            shm,
            tasks,
            start: at,
            share,
        }
    }

    /// `net=ITEM+ITEM...`, items `check` and `pingpong:SIZE,SIZE,...`.
    pub fn parse_net(&mut self, text: &str) -> bool {
        for (i, item) in text.split('+').enumerate() {
            if i == MAX_ITEMS {
                return false;
            }
            let parsed = if item == "check" {
                Item::Check
            } else if let Some(list) = item.strip_prefix("pingpong:") {
                let Some((sizes, count)) = parse_sizes(list) else {
                    return false;
                };
                Item::PingPong { sizes, count }
            } else if let Some(list) = item.strip_prefix("bw:") {
                let Some((sizes, count)) = parse_sizes(list) else {
                    return false;
                };
                Item::Bandwidth { sizes, count }
            } else {
                return false;
            };
            self.items[i] = Some(parsed);
        }
        true
    }
}

/// The tick of a scheduler nobody chose the rate of: a 2009 Linux guest's HZ.
pub const DEFAULT_HZ: u64 = 250;
/// Most ranks on one CPU, and the highest tick (the LAPIC timer's period is at least
/// 200 µs on some hosts).
pub const MAX_PER_CPU: usize = 16;
pub const MAX_HZ: u64 = 5000;

/// How a VM's heap is cut ([`Plan::layout`]): the shared-memory channels (0: none),
/// each CPU's task memory (0: no scheduler), and the ranks' shares from `start`.
#[derive(Clone, Copy)]
pub struct Layout {
    pub shm: u64,
    pub tasks: u64,
    pub start: u64,
    pub share: u64,
}

/// `SIZE,SIZE,...`: at most MAX_SIZES sizes of at most MAX_PINGPONG bytes.
fn parse_sizes(list: &str) -> Option<([u64; MAX_SIZES], usize)> {
    let mut sizes = [0u64; MAX_SIZES];
    let mut count = 0;
    for size in list.split(',') {
        match size.parse::<u64>() {
            Ok(s) if s <= MAX_PINGPONG && count < MAX_SIZES => {
                sizes[count] = s;
                count += 1;
            }
            _ => return None,
        }
    }
    Some((sizes, count))
}

fn error(what: &str, item: &str) {
    let mut line = Line::new();
    let _ = write!(line, "@kumo error what={what} item={item}");
    line.emit();
}

/// What the master checks and sets up, on CPU 0, before it forks the ranks: that every
/// rank has a CPU, and every NIC its BARs. False (reported) if not.
pub fn prepare(info: &BootInfo, plan: &Plan) -> bool {
    if plan.cpus_used() > info.cpus as usize {
        let mut line = Line::new();
        let _ = write!(
            line,
            "@kumo error what=mpi item=ranks-without-cpu local={} cpus={} ranks_per_vcpu={}",
            plan.local, info.cpus, plan.per_cpu
        );
        line.emit();
        return false;
    }
    let layout = plan.layout(info);
    if layout.share < 4096 {
        error("mpi", "out-of-memory");
        return false;
    }
    if layout.shm != 0 {
        // The bells and every channel's counters start at zero (the rings need not).
        let bytes = Shared::bytes(plan.local, WINDOW);
        let channel = 4096 + WINDOW;
        let bells = bytes - (plan.local * plan.local) as u64 * channel;
        // SAFETY: the layout's shared-memory area, ours alone until the ranks start.
        unsafe {
            core::ptr::write_bytes(layout.shm as *mut u8, 0, bells as usize);
            for pair in 0..(plan.local * plan.local) as u64 {
                core::ptr::write_bytes((layout.shm + bells + pair * channel) as *mut u8, 0, 4096);
            }
        }
    }
    if let Err(e) = crate::virtio::place_bars(info) {
        error("net", e.name());
        return false;
    }
    true
}

/// Runs this VM's `index`-th rank (below `plan.local`) on CPU `cpu`: its share of the
/// heap, the NPB-MPI kernels `specs` (`npb=` with `mpi=`), then the `net=` items; true
/// if everything verified. `scheduled`: the CPU's scheduler runs it among others.
pub fn run_rank(
    info: &BootInfo,
    plan: &Plan,
    spin_us: u64,
    specs: &[Spec],
    index: usize,
    cpu: u32,
    scheduled: bool,
) -> bool {
    let layout = plan.layout(info);
    let start = layout.start + index as u64 * layout.share;
    let mut memory = Bump::new(start, start + layout.share);
    let mut nic = match Nic::open(info, &mut memory, index, cpu) {
        Ok(nic) => nic,
        Err(e) => {
            error("net", e.name());
            return false;
        }
    };
    nic.scheduled = scheduled.then_some(cpu);
    let shared = (layout.shm != 0).then_some(Shared {
        first: plan.rank,
        count: plan.local,
        base: layout.shm,
        cpu,
    });
    let cfg = mpi::Config {
        rank: plan.rank + index,
        size: plan.size,
        wait: plan.wait,
        tsc_khz: info.tsc_khz,
        spin_ticks: spin_us * info.tsc_khz / 1000,
        timeout_ms: TIMEOUT_MS,
        window: WINDOW,
        drop_every: plan.drop_every,
    };
    let start = sys::rdtsc();
    let mut mpi = match Mpi::init_shared(nic, cfg, shared, |bytes| memory.alloc(bytes, 4096).ok()) {
        Ok(mpi) => mpi,
        Err(e) => {
            report_error(e);
            return false;
        }
    };
    let mac = mpi.mac();
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo mpi rank={} size={} mac={:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x} wait={} \
         handshake_ms={:.1}",
        mpi.rank(),
        plan.size,
        mac[0],
        mac[1],
        mac[2],
        mac[3],
        mac[4],
        mac[5],
        plan.wait.name(),
        (sys::rdtsc() - start) as f64 / info.tsc_khz as f64,
    );
    line.emit();
    let mut ok = true;
    // One heap for every kernel, sized for the largest (the allocator does not free):
    // this rank's share of the RAM above 4 GiB if every rank's fits there, else from
    // its part of the low heap.
    let heap_len = specs
        .iter()
        .map(|&spec| npb::mpi::heap_bytes(spec, plan.size))
        .max()
        .unwrap_or(0);
    let stride = (heap_len as u64).next_multiple_of(4096);
    let heap = crate::highmem::room(info, stride * plan.local as u64)
        .map(|(start, _)| start + index as u64 * stride)
        .or_else(|| memory.alloc(heap_len as u64, 4096).ok())
        .map(|base| (base, heap_len));
    for &spec in specs {
        match run_npb(info, &mut mpi, heap, spec) {
            Ok(verified) => ok &= verified,
            Err(e) => {
                let mut line = Line::new();
                let _ = write!(line, "@kumo error what=mpi item={e} benchmark={spec}");
                line.emit();
                report(&mpi);
                return false;
            }
        }
    }
    for item in plan.items.iter().flatten() {
        let outcome = match *item {
            Item::Check => check(info, &mut mpi, &mut memory, plan),
            Item::PingPong { sizes, count } => {
                pingpong(info, &mut mpi, &mut memory, plan, &sizes[..count])
            }
            Item::Bandwidth { sizes, count } => {
                bandwidth(info, &mut mpi, &mut memory, plan, &sizes[..count])
            }
        };
        match outcome {
            Ok(verified) => ok &= verified,
            Err(e) => {
                report_error(e);
                report(&mpi);
                return false;
            }
        }
    }
    if let Err(e) = mpi.finish() {
        report_error(e);
        ok = false;
    }
    report(&mpi);
    ok
}

/// One NPB-MPI kernel on this rank; rank 0 prints its `@kumo result` line. Ok(verified),
/// or the communication error that ended it. Every rank refuses a rank count the
/// kernel cannot use, without communicating, so the job stays in step.
fn run_npb(
    info: &BootInfo,
    mpi: &mut Mpi<Nic>,
    heap: Option<(u64, usize)>,
    spec: Spec,
) -> Result<bool, npb::mpi::Error> {
    let ranks = mpi.size();
    if npb::mpi::supports(spec, ranks).is_err() {
        if mpi.rank() == 0 {
            let mut line = Line::new();
            let _ = write!(
                line,
                "@kumo error what=unsupported-ranks item={spec} ranks={ranks}"
            );
            line.emit();
        }
        return Ok(false);
    }
    let bytes = npb::mpi::heap_bytes(spec, ranks);
    let Some((base, len)) = heap.filter(|&(_, len)| len >= bytes) else {
        let mut line = Line::new();
        let _ = write!(line, "@kumo error what=out-of-memory item={spec}");
        line.emit();
        return Ok(false);
    };
    // SAFETY: memory from the allocator, identity-mapped, used by this CPU alone and
    // only by this arena while the kernel runs.
    let mut arena = unsafe { Arena::new(base as *mut u8, len) };
    let mut comm = MpiComm {
        mpi,
        tsc_khz: info.tsc_khz,
        progress: Progress::new(show_progress),
    };
    let outcome = npb::mpi::run(spec, &mut comm, &mut arena)?;
    if comm.mpi.rank() == 0 {
        let mut line = Line::new();
        let _ = write!(
            line,
            "@kumo result benchmark={} class={} threads=1 ranks={ranks} time_s={:.6} \
             mops={:.2} verified={}",
            spec.kernel.name(),
            spec.class.letter(),
            outcome.seconds,
            outcome.mops,
            outcome.verified,
        );
        for (key, value) in outcome.values.iter() {
            let _ = write!(line, " {key}={value}");
        }
        line.emit();
    }
    Ok(outcome.verified)
}

/// `@kumo progress done=K of=N`: a kernel's timed loop so far.
fn show_progress(done: usize, of: usize) {
    let mut line = Line::new();
    let _ = write!(line, "@kumo progress done={done} of={of}");
    line.emit();
}

/// `@kumo error what=mpi item=NAME [details]`.
fn report_error(e: mpi::Error) {
    let mut line = Line::new();
    let _ = write!(line, "@kumo error what=mpi item={}", e.name());
    match e {
        mpi::Error::TagMismatch { expected, got } => {
            let _ = write!(line, " expected_tag={expected} got_tag={got}");
        }
        mpi::Error::Truncated { len, room } => {
            let _ = write!(line, " len={len} room={room}");
        }
        _ => {}
    }
    line.emit();
}

/// `@kumo mpistats ...`: what the NIC and the protocol did.
fn report(mpi: &Mpi<Nic>) {
    let nic = mpi.link();
    let (rx_kicks, tx_kicks) = nic.kicks();
    let (n, p) = (nic.stats, mpi.stats);
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo mpistats rank={} tx_frames={} rx_frames={} rx_bad={} tx_kicks={tx_kicks} \
         rx_kicks={rx_kicks} interrupts={} sleeps={} reminders={} hellos={} acks={} out_of_order={} \
         duplicates={} resent={} timeouts={} dropped={} foreign={} wait_us={}",
        mpi.rank(),
        n.tx_frames,
        n.rx_frames,
        n.rx_bad,
        nic.interrupts(),
        n.sleeps,
        n.reminders,
        p.hellos_sent,
        p.acks_sent,
        p.out_of_order,
        p.duplicates,
        p.resent,
        p.timeouts,
        p.dropped,
        p.foreign,
        mpi.wait_us(),
    );
    line.emit();
}

/// A slice of `len` bytes of fresh heap memory.
fn buffer(memory: &mut Bump, len: usize) -> Result<&'static mut [u8], mpi::Error> {
    let at = memory
        .alloc(len as u64, 4096)
        .map_err(|_| mpi::Error::OutOfMemory)?;
    // SAFETY: fresh memory from the allocator, never handed out again.
    Ok(unsafe { core::slice::from_raw_parts_mut(at as *mut u8, len) })
}

/// splitmix64: the deterministic stream both ranks derive sizes and contents from.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0.wrapping_mul(0x2545_F491_4F6C_DD1D))
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// The contents of message `key`: byte i is from word i / 8 of its stream.
fn fill(buf: &mut [u8], key: u64) {
    for (i, chunk) in buf.chunks_mut(8).enumerate() {
        let word = mix(key ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// Bytes of `buf` that differ from message `key`'s contents.
fn mismatches(buf: &[u8], key: u64) -> u64 {
    let mut bad = 0;
    for (i, chunk) in buf.chunks(8).enumerate() {
        let word = mix(key ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes();
        bad += chunk
            .iter()
            .zip(word.iter())
            .filter(|(a, b)| a != b)
            .count() as u64;
    }
    bad
}

/// FNV-1a of everything received, printed so ranks' runs can be compared.
fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash = (hash ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
    }
    hash
}

/// A random message length: mostly small, some up to CHECK_MAX_MESSAGE.
fn random_len(rng: &mut Rng) -> usize {
    let limit = match rng.below(16) {
        0..=5 => 64,
        6..=10 => 4096,
        11..=13 => 64 << 10,
        14 => 1 << 20,
        _ => CHECK_MAX_MESSAGE as u64,
    };
    rng.below(limit + 1) as usize
}

/// `check`: random pairs, sizes and patterns (one way, exchange, bursts of
/// nonblocking messages both ways), every message's bytes verified; then one
/// CHECK_BIG_MESSAGE exchange and the collectives. Both ranks of a pair draw the same
/// random numbers, so each knows what to expect.
fn check(
    info: &BootInfo,
    mpi: &mut Mpi<Nic>,
    memory: &mut Bump,
    plan: &Plan,
) -> Result<bool, mpi::Error> {
    let (rank, size) = (mpi.rank(), mpi.size());
    let out = buffer(memory, CHECK_BIG_MESSAGE)?;
    let inn = buffer(memory, CHECK_BIG_MESSAGE)?;
    let rounds = plan.rounds.unwrap_or(DEFAULT_CHECK_ROUNDS);
    let mut rng = Rng(plan.seed);
    let (mut messages, mut bytes, mut bad, mut hash) = (0u64, 0u64, 0u64, 0xCBF2_9CE4_8422_2325);
    let start = sys::rdtsc();
    for round in 0..u64::from(rounds) {
        if size < 2 {
            break;
        }
        let a = rng.below(size as u64) as usize;
        let b = (a + 1 + rng.below(size as u64 - 1) as usize) % size;
        let pattern = rng.below(3);
        let len = random_len(&mut rng);
        let tag = (round % 1000) as u32;
        let key = |from: usize, to: usize, i: u64| {
            mix(plan.seed ^ (round << 20) ^ ((from as u64) << 12) ^ ((to as u64) << 4) ^ i)
        };
        if rank != a && rank != b {
            continue;
        }
        let other = if rank == a { b } else { a };
        match pattern {
            // One way, a to b.
            0 => {
                if rank == a {
                    fill(&mut out[..len], key(a, b, 0));
                    mpi.send(b, tag, &out[..len])?;
                } else {
                    let got = mpi.recv(a, tag, &mut inn[..len])?;
                    bad += (got != len) as u64 + mismatches(&inn[..got], key(a, b, 0));
                    hash = fnv(hash, &inn[..got]);
                    messages += 1;
                    bytes += got as u64;
                }
            }
            // Both ways at once.
            1 => {
                fill(&mut out[..len], key(rank, other, 0));
                let got = mpi.sendrecv(other, tag, &out[..len], other, tag, &mut inn[..len])?;
                bad += (got != len) as u64 + mismatches(&inn[..got], key(other, rank, 0));
                hash = fnv(hash, &inn[..got]);
                messages += 1;
                bytes += got as u64;
            }
            // A burst of four nonblocking messages each way, waited for together.
            _ => {
                let part = len / 4;
                for k in 0..4 {
                    fill(
                        &mut out[k * part..(k + 1) * part],
                        key(rank, other, k as u64),
                    );
                }
                let o = &out[..4 * part];
                let lengths = {
                    let (i0, rest) = inn.split_at_mut(part);
                    let (i1, rest) = rest.split_at_mut(part);
                    let (i2, rest) = rest.split_at_mut(part);
                    let i3 = &mut rest[..part];
                    let mut requests = [
                        mpi.irecv(other, tag, i0)?,
                        mpi.isend(other, tag, &o[..part])?,
                        mpi.irecv(other, tag + 1, i1)?,
                        mpi.isend(other, tag + 1, &o[part..2 * part])?,
                        mpi.irecv(other, tag + 2, i2)?,
                        mpi.isend(other, tag + 2, &o[2 * part..3 * part])?,
                        mpi.irecv(other, tag + 3, i3)?,
                        mpi.isend(other, tag + 3, &o[3 * part..])?,
                    ];
                    mpi.waitall(&mut requests)?;
                    let mut lengths = [0usize; 4];
                    for (k, request) in requests.iter().step_by(2).enumerate() {
                        lengths[k] = match request {
                            Request::Done(n) => *n,
                            _ => usize::MAX,
                        };
                    }
                    lengths
                };
                for (k, &got_len) in lengths.iter().enumerate() {
                    bad += u64::from(got_len != part);
                    let got = &inn[k * part..(k + 1) * part];
                    bad += mismatches(got, key(other, rank, k as u64));
                    hash = fnv(hash, got);
                    messages += 1;
                    bytes += part as u64;
                }
            }
        }
    }
    let stress_s = (sys::rdtsc() - start) as f64 / (info.tsc_khz as f64 * 1000.0);

    // One message far larger than the window, both ways at once (ranks 0 and 1).
    if size >= 2 && rank < 2 {
        let other = 1 - rank;
        fill(out, mix(plan.seed ^ 0xB16 ^ rank as u64));
        let got = mpi.sendrecv(other, 7, out, other, 7, inn)?;
        bad += (got != CHECK_BIG_MESSAGE) as u64
            + mismatches(&inn[..got], mix(plan.seed ^ 0xB16 ^ other as u64));
        hash = fnv(hash, &inn[..got]);
        messages += 1;
        bytes += got as u64;
    }

    let collectives_bad = collectives(mpi, memory, plan.seed)?;
    let verified = bad == 0 && collectives_bad == 0;
    let mut line = Line::new();
    let _ = write!(
        line,
        "@kumo netcheck rank={rank} size={size} rounds={rounds} messages={messages} \
         bytes={bytes} mismatches={bad} collectives_failed={collectives_bad} \
         stress_s={stress_s:.3} fnv={hash:016x} verified={verified}"
    );
    line.emit();
    Ok(verified)
}

/// Barriers, bcast from every root, alltoall and alltoallv, allreduce sum/max/min over
/// f64 and i64 (small, and large enough to go in chunks). Returns how many checks
/// failed.
fn collectives(mpi: &mut Mpi<Nic>, memory: &mut Bump, seed: u64) -> Result<u64, mpi::Error> {
    let (rank, size) = (mpi.rank(), mpi.size());
    let mut failed = 0u64;
    for _ in 0..10 {
        mpi.barrier()?;
    }
    let buf = buffer(memory, 10_000)?;
    for root in 0..size {
        let key = mix(seed ^ 0xBCA5 ^ root as u64);
        if rank == root {
            fill(buf, key);
        } else {
            buf.fill(0);
        }
        mpi.bcast(root, buf)?;
        failed += u64::from(mismatches(buf, key) != 0);
    }
    // alltoall: block j of rank i is message (i, j); alltoallv: rank i sends
    // `v_count(i, j)` bytes to rank j, packed in rank order.
    let block = 3000;
    let out = buffer(memory, block * size)?;
    let inn = buffer(memory, block * size)?;
    let pair_key = |i: usize, j: usize| mix(seed ^ 0xA77A ^ ((i as u64) << 8) ^ j as u64);
    for j in 0..size {
        fill(&mut out[j * block..(j + 1) * block], pair_key(rank, j));
    }
    mpi.alltoall(out, inn)?;
    for i in 0..size {
        failed += u64::from(mismatches(&inn[i * block..(i + 1) * block], pair_key(i, rank)) != 0);
    }
    let v_count = |i: usize, j: usize| (i * 977 + j * 1409 + 5) % block;
    let mut send_layout = ([0usize; mpi::MAX_RANKS], [0usize; mpi::MAX_RANKS]);
    let mut recv_layout = ([0usize; mpi::MAX_RANKS], [0usize; mpi::MAX_RANKS]);
    let (mut send_at, mut recv_at) = (0, 0);
    for j in 0..size {
        send_layout.0[j] = v_count(rank, j);
        send_layout.1[j] = send_at;
        fill(
            &mut out[send_at..send_at + v_count(rank, j)],
            pair_key(rank, j) ^ 1,
        );
        send_at += v_count(rank, j);
        recv_layout.0[j] = v_count(j, rank);
        recv_layout.1[j] = recv_at;
        recv_at += v_count(j, rank);
    }
    inn.fill(0);
    mpi.alltoallv(out, &send_layout, inn, &recv_layout)?;
    for i in 0..size {
        let got = &inn[recv_layout.1[i]..recv_layout.1[i] + recv_layout.0[i]];
        failed += u64::from(mismatches(got, pair_key(i, rank) ^ 1) != 0);
    }

    // f64: values (r + 1) * (i + 1) / 2, sums exact in binary floating point.
    let n = 100_000usize;
    let at = memory
        .alloc((n * 8) as u64, 4096)
        .map_err(|_| mpi::Error::OutOfMemory)?;
    // SAFETY: fresh, 8-aligned memory from the allocator, never handed out again.
    let values = unsafe { core::slice::from_raw_parts_mut(at as *mut f64, n) };
    let s = size as f64;
    for (op, expect) in [
        (Op::Sum, s * (s + 1.0) / 4.0),
        (Op::Max, s / 2.0),
        (Op::Min, 0.5),
    ] {
        for len in [3usize, n] {
            for (i, v) in values[..len].iter_mut().enumerate() {
                *v = (rank as f64 + 1.0) * (i as f64 + 1.0) * 0.5;
            }
            mpi.allreduce_f64(&mut values[..len], op)?;
            let wrong = values[..len]
                .iter()
                .enumerate()
                .filter(|&(i, &v)| v != expect * (i as f64 + 1.0))
                .count();
            failed += u64::from(wrong != 0);
        }
    }
    // i64: (r - 3) * (i + 1) * 1_000_000_007, negative and positive.
    // SAFETY: the same memory, now used as i64 (every bit pattern is valid).
    let ints = unsafe { core::slice::from_raw_parts_mut(at as *mut i64, n) };
    let ranks = size as i64;
    let sum_r: i64 = (0..ranks).map(|r| r - 3).sum();
    for (op, factor) in [(Op::Sum, sum_r), (Op::Max, ranks - 4), (Op::Min, -3)] {
        for len in [5usize, n] {
            for (i, v) in ints[..len].iter_mut().enumerate() {
                *v = (rank as i64 - 3) * (i as i64 + 1) * 1_000_000_007;
            }
            mpi.allreduce_i64(&mut ints[..len], op)?;
            let wrong = ints[..len]
                .iter()
                .enumerate()
                .filter(|&(i, &v)| v != factor * (i as i64 + 1) * 1_000_000_007)
                .count();
            failed += u64::from(wrong != 0);
        }
    }
    Ok(failed)
}

/// `pingpong:SIZES`: rank 0 sends, rank 1 answers with the same size; half the round
/// trip is the latency. Other ranks only take part in the barriers.
fn pingpong(
    info: &BootInfo,
    mpi: &mut Mpi<Nic>,
    memory: &mut Bump,
    plan: &Plan,
    sizes: &[u64],
) -> Result<bool, mpi::Error> {
    let rank = mpi.rank();
    if mpi.size() < 2 {
        error("pingpong", "needs-two-ranks");
        return Ok(false);
    }
    let largest = sizes.iter().copied().max().unwrap_or(0) as usize;
    let out = buffer(memory, largest.max(1))?;
    let inn = buffer(memory, largest.max(1))?;
    fill(out, 0x9096);
    let mut ok = true;
    for &size in sizes {
        let len = size as usize;
        let rounds = plan
            .rounds
            .unwrap_or_else(|| (32 << 20) / (size as u32).max(16_384) + 10)
            .clamp(1, 100_000) as usize;
        let samples_at = memory
            .alloc(8 * rounds as u64, 4096)
            .map_err(|_| mpi::Error::OutOfMemory)?;
        // SAFETY: fresh, aligned memory from the allocator, never handed out again.
        let samples = unsafe { core::slice::from_raw_parts_mut(samples_at as *mut u64, rounds) };
        mpi.barrier()?;
        let warmup = 5;
        let start = sys::rdtsc();
        for i in 0..rounds + warmup {
            let t = sys::rdtsc();
            match rank {
                0 => {
                    mpi.send(1, 1, &out[..len])?;
                    mpi.recv(1, 2, &mut inn[..len])?;
                }
                1 => {
                    mpi.recv(0, 1, &mut inn[..len])?;
                    mpi.send(0, 2, &out[..len])?;
                }
                _ => {}
            }
            if i >= warmup {
                samples[i - warmup] = (sys::rdtsc() - t) / 2;
            }
        }
        let total = sys::rdtsc() - start;
        if rank == 0 {
            ok &= inn[..len] == out[..len];
            let at = crate::stats::quantiles(samples, info.tsc_khz);
            let median = at(0.5);
            let mut line = Line::new();
            let _ = write!(
                line,
                "@kumo pingpong size={size} rounds={rounds} wait={} median_us={median:.2} \
                 p99_us={:.2} min_us={:.2} max_us={:.2} mbps={:.1} total_ms={:.1}",
                plan.wait.name(),
                at(0.99),
                at(0.0),
                at(1.0),
                if median > 0.0 {
                    size as f64 / median
                } else {
                    0.0
                },
                total as f64 / info.tsc_khz as f64,
            );
            line.emit();
        }
    }
    Ok(ok)
}

/// Messages per burst of `bw:` (as OSU's bandwidth test: a window of sends, then one
/// small reply).
const BW_BURST: usize = 64;

/// `bw:SIZES`: rank 0 streams bursts of BW_BURST messages to rank 1, which answers
/// each burst with 4 bytes; bandwidth is bytes over the time of all bursts.
fn bandwidth(
    info: &BootInfo,
    mpi: &mut Mpi<Nic>,
    memory: &mut Bump,
    plan: &Plan,
    sizes: &[u64],
) -> Result<bool, mpi::Error> {
    let rank = mpi.rank();
    if mpi.size() < 2 {
        error("bw", "needs-two-ranks");
        return Ok(false);
    }
    let largest = sizes.iter().copied().max().unwrap_or(0) as usize;
    let out = buffer(memory, largest.max(4))?;
    let inn = buffer(memory, largest.max(4))?;
    fill(out, 0xB0B);
    let mut ok = true;
    for &size in sizes {
        let len = size as usize;
        // About 64 MiB per size by default (at least 2 bursts).
        let bursts = plan
            .rounds
            .unwrap_or_else(|| ((64 << 20) / (size.max(1024) * BW_BURST as u64)).max(2) as u32)
            as usize;
        mpi.barrier()?;
        let start = sys::rdtsc();
        for _ in 0..bursts {
            match rank {
                0 => {
                    for _ in 0..BW_BURST {
                        mpi.send(1, 3, &out[..len])?;
                    }
                    mpi.recv(1, 4, &mut inn[..4])?;
                }
                1 => {
                    for _ in 0..BW_BURST {
                        mpi.recv(0, 3, &mut inn[..len])?;
                    }
                    mpi.send(0, 4, &out[..4])?;
                }
                _ => {}
            }
        }
        let ticks = sys::rdtsc() - start;
        if rank == 1 {
            ok &= inn[..len] == out[..len];
        }
        if rank == 0 {
            let seconds = ticks as f64 / (info.tsc_khz as f64 * 1000.0);
            let bytes = (bursts * BW_BURST) as f64 * size as f64;
            let mut line = Line::new();
            let _ = write!(
                line,
                "@kumo bandwidth size={size} messages={} wait={} mbps={:.3} total_ms={:.1}",
                bursts * BW_BURST,
                plan.wait.name(),
                if seconds > 0.0 {
                    bytes / seconds / 1e6
                } else {
                    0.0
                },
                seconds * 1000.0,
            );
            line.emit();
        }
    }
    Ok(ok)
}
