//! MG on `mg.f`'s 3-D process grid.
//!
//! The ranks (a power of two) form a `px × py × pz` grid as `mg.f`'s `setup` builds
//! it: of `log2(ranks)` doublings, `x` gets a third (rounded down), `y` half of the
//! rest (rounded down), `z` the remainder; rank `r` sits at `(r mod px, r / px mod py,
//! r / (px py))`. On every level of `n` points a side, the rank at coordinate `i` of
//! an axis of `p` ranks holds grid points `i n / p .. (i + 1) n / p` (integer division)
//! of that axis: a 3-D block, stored with one ghost layer on each face.
//!
//! After each operator (`resid`, `psinv`, `rprj3`, and `zran3`) the ghosts are filled
//! as `comm3` does: along `x`, then `y`, then `z`, each rank sends its first and last
//! layer to its two neighbours of that axis (periodic) and takes theirs into its ghost
//! layers; an axis's exchange includes the ghosts the earlier axes filled, which
//! carries edges and corners. A rank alone along an axis copies its own layers.
//!
//! Levels with fewer points along an axis than ranks (level 1 when an axis has 4
//! ranks, from 16 ranks on) are handled as `mg.f` does: a rank holding no point of
//! such a level is "dead" there (computes nothing, its arrays zero); the live ranks
//! exchange with the nearest live ones (`mg.f`'s doubled `next`). A live rank's one
//! coarse point then lies on the fine point after its block's first, so `rprj3` and
//! `interp` address the fine level one place shifted along that axis (`mg.f`'s
//! `d = 2` branches); `interp` fills the live rank's fine point and both ghosts, and
//! `comm3_ex` hands them on (`give3_ex`/`take3_ex`): along each axis, a rank with no
//! coarse point takes its lower neighbour's last layer and ghost as its ghost and
//! point, and its upper neighbour's first layer as its upper ghost. The per-point
//! arithmetic stays the shared-memory MG's (`resid_plane`, `psinv_plane`,
//! `rprj3_plane`, `interp_plane`: `mg.f`'s special interpolation branch orders its
//! sums differently; here every point is summed as in the serial code), so every
//! rank count computes the same bits at every point.
//!
//! Norms are local sums and maxima allreduced; `zran3`'s charges are the ten largest
//! and smallest of every rank's candidates (found in its block, then allgathered and
//! merged alike everywhere). Same verification (`rnm2`). `mg.f` takes any power of two;
//! this MPI has at most 64 ranks ([`MAX_RANKS`]), which is at most 4 along an axis:
//! one level of dead ranks, below a level where every rank holds a point (all the
//! give/take exchange here covers; more ranks a side would leave dead ranks on two
//! levels, untested here).

use core::ops::Range;

use super::{Comm, Error, MAX_RANKS, Op, bytes, bytes_mut, max_seconds, take};
use crate::mg::{self, Block, CHARGES, Candidate, Plane, RESIDUAL};
use crate::team::Arena;
use crate::{Class, Outcome, Values};

/// Most ranks along one axis: level 1 (2 points) then has dead ranks, level 2 none.
const MAX_SIDE: usize = 4;

/// The process grid `mg.f`'s `setup` makes of `ranks` (a power of two): ranks along
/// `x`, `y`, `z`.
pub(crate) fn process_grid(ranks: usize) -> [usize; 3] {
    let log_p = ranks.trailing_zeros() as usize;
    let dx = log_p / 3;
    let dy = (log_p - dx) / 2;
    let (px, py) = (1 << dx, 1 << dy);
    [px, py, ranks / (px * py)]
}

/// Whether MG runs on `ranks` ranks: a power of two (as `mg.f`) whose process grid has
/// at most [`MAX_SIDE`] ranks a side (every count up to 64, [`MAX_RANKS`]).
pub fn fits(class: Class, ranks: usize) -> bool {
    ranks.is_power_of_two()
        && ranks <= MAX_RANKS
        && process_grid(ranks)
            .iter()
            .all(|&p| p <= MAX_SIDE && p <= mg::size(class))
}

/// Tags: a rank's last layer going up, its first going down (`comm3`); its last layer
/// and ghost going up, its first layer going down (`comm3_ex`).
const TAG_UP: u32 = 401;
const TAG_DOWN: u32 = 402;
const TAG_EX_UP: u32 = 403;
const TAG_EX_DOWN: u32 = 404;

/// What this rank holds of one level along one axis, and whom it talks to there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Span {
    /// First point held (0-based grid index) and how many (0: dead on this level).
    first: usize,
    count: usize,
    /// Ranks of the nearest live neighbours below and above (periodic).
    down: usize,
    up: usize,
    /// After interpolating into this level: hands its layers to neighbours holding no
    /// point of the level below (`give_ex`), or is such a rank (`take_ex`).
    give: bool,
    take: bool,
}

/// What this rank holds of one level.
#[derive(Clone, Copy, Debug, Default)]
struct Level {
    /// Points a side of the whole level.
    n: usize,
    axes: [Span; 3],
}

impl Level {
    /// Holds no point (`mg.f`'s `dead`).
    fn dead(&self) -> bool {
        self.axes.iter().any(|a| a.count == 0)
    }

    /// Values a row, rows, planes (ghosts included).
    fn dims(&self) -> [usize; 3] {
        self.axes.map(|a| a.count + 2)
    }

    fn plane(&self) -> Plane {
        let [m1, m2, _] = self.dims();
        Plane { m1, m2 }
    }

    /// Values held, ghosts included.
    fn len(&self) -> usize {
        self.dims().iter().product()
    }

    /// The block in the grid (1-based, as the ghost-padded arrays count).
    fn block(&self) -> Block {
        Block {
            n: self.n,
            first: self.axes.map(|a| a.first + 1),
            count: self.axes.map(|a| a.count),
        }
    }

    /// Along each axis, how far from `2j` the fine point under this level's point `j`
    /// lies in `fine`'s array (0, or 1 where `fine` has one point and this level's
    /// lies on the one after its block's start).
    fn shift_in(&self, fine: &Level) -> [usize; 3] {
        core::array::from_fn(|a| fine.axes[a].first - 2 * self.axes[a].first)
    }

    /// Interpolating into this level ends with `comm3_ex`.
    fn expands(&self) -> bool {
        self.axes.iter().any(|a| a.give || a.take)
    }
}

/// Where `rank` sits in the process grid `grid` (`x` fastest).
fn coordinates(rank: usize, grid: [usize; 3]) -> [usize; 3] {
    [
        rank % grid[0],
        rank / grid[0] % grid[1],
        rank / (grid[0] * grid[1]),
    ]
}

/// This rank's share of every level (entry `k` is level `k`, entry 0 unused), as
/// `mg.f`'s `setup`.
fn plan(class: Class, rank: usize, ranks: usize) -> [Level; 16] {
    let lt = mg::levels(class);
    let grid = process_grid(ranks);
    let coords = coordinates(rank, grid);
    let rank_at = |axis: usize, c: usize| {
        let mut at = coords;
        at[axis] = c;
        at[0] + grid[0] * (at[1] + grid[1] * at[2])
    };
    let mut levels = [Level::default(); 16];
    for (axis, (&p, &i)) in grid.iter().zip(&coords).enumerate() {
        // Points of an `n`-point level held by coordinate `j` (beyond `p` too, as
        // `mg.f`'s `mip`).
        let count = |j: usize, n: usize| (j + 1) * n / p - j * n / p;
        // Distance to the nearest live neighbour: doubles whenever this rank or the
        // one `next` above holds nothing, and stays doubled on coarser levels.
        let mut next = 1;
        for k in (1..=lt).rev() {
            let n = 1 << k;
            let (mine, beyond) = (count(i, n), count(i + next, n));
            if mine == 0 || beyond == 0 {
                next *= 2;
            }
            if k < lt {
                let finer = &mut levels[k + 1].axes[axis];
                finer.give = beyond == 0 && mine == 1;
                finer.take = beyond == 1 && mine == 0;
            }
            levels[k].n = n;
            levels[k].axes[axis] = Span {
                first: i * n / p,
                count: mine,
                down: rank_at(axis, (i + p - next % p) % p),
                up: rank_at(axis, (i + next) % p),
                give: false,
                take: false,
            };
        }
    }
    levels
}

/// Values of the largest message: two layers of the finest level across all of it.
fn buffer_len(level: &Level) -> usize {
    let [m1, m2, m3] = level.dims();
    2 * (m2 * m3).max(m1 * m3).max(m1 * m2)
}

/// Arena bytes of one rank: `u` and `r` on every level, `v` on the finest, two message
/// buffers, the candidate charges, and alignment. The most any rank needs (ranks dead
/// on a level hold less of it).
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let lt = mg::levels(class);
    let f64s = |len: usize| len * 8 + 64;
    let candidates = (ranks + 1) * 2 * CHARGES * core::mem::size_of::<Candidate>() + 2 * 64;
    (0..ranks)
        .map(|rank| {
            let levels = plan(class, rank, ranks);
            let all: usize = levels[1..=lt].iter().map(|l| f64s(l.len())).sum();
            let finest = &levels[lt];
            2 * all + f64s(finest.len()) + 2 * f64s(buffer_len(finest))
        })
        .max()
        .unwrap_or(0)
        + candidates
}

/// Calls `f` with each run of consecutive indices of a level's array that make layers
/// `layers` along `axis`. Across the other axes: with `full`, everything (`give3_ex`);
/// otherwise as `give3`: for `x`, interior `y` and `z`; for `y`, all `x` and interior
/// `z`; for `z`, all of the plane.
fn for_each_run(
    level: &Level,
    axis: usize,
    layers: Range<usize>,
    full: bool,
    mut f: impl FnMut(Range<usize>),
) {
    let [m1, m2, m3] = level.dims();
    let across = |m: usize, whole: bool| if full || whole { 0..m } else { 1..m - 1 };
    let (xs, ys, zs) = match axis {
        0 => (layers, across(m2, false), across(m3, false)),
        1 => (0..m1, layers, across(m3, false)),
        _ => (0..m1, 0..m2, layers),
    };
    for z in zs {
        for y in ys.clone() {
            let row = (z * m2 + y) * m1;
            f(row + xs.start..row + xs.end);
        }
    }
}

/// The two message buffers.
struct Buffers<'a> {
    send: &'a mut [f64],
    recv: &'a mut [f64],
}

/// Copies layers `layers` (along `axis`, see [`for_each_run`]) of `f` into `buf`;
/// returns how many values.
fn gather(
    f: &[f64],
    level: &Level,
    axis: usize,
    layers: Range<usize>,
    full: bool,
    buf: &mut [f64],
) -> usize {
    let mut len = 0;
    for_each_run(level, axis, layers, full, |run| {
        // Single values (an x face) without a call per value.
        if run.len() == 1 {
            buf[len] = f[run.start];
        } else {
            buf[len..len + run.len()].copy_from_slice(&f[run.clone()]);
        }
        len += run.len();
    });
    len
}

/// The inverse of [`gather`]: `buf` into layers `layers` of `f`.
fn scatter(
    buf: &[f64],
    level: &Level,
    axis: usize,
    layers: Range<usize>,
    full: bool,
    f: &mut [f64],
) {
    let mut at = 0;
    for_each_run(level, axis, layers, full, |run| {
        if run.len() == 1 {
            f[run.start] = buf[at];
        } else {
            f[run.clone()].copy_from_slice(&buf[at..at + run.len()]);
        }
        at += run.len();
    });
}

/// Sends `send` to `to` and receives exactly `recv.len()` values from `from`, at once
/// (`sendrecv`: around a ring no rank waits for another's receive to be posted).
fn shift<C: Comm + ?Sized>(
    comm: &mut C,
    (to, send): (usize, &[f64]),
    (from, recv): (usize, &mut [f64]),
    tag: u32,
) -> Result<(), Error> {
    let got = comm.sendrecv(to, tag, bytes(send), from, tag, bytes_mut(recv))?;
    filled(got, recv)
}

/// Receives exactly `buf.len()` values from `from`.
fn receive<C: Comm + ?Sized>(
    comm: &mut C,
    from: usize,
    tag: u32,
    buf: &mut [f64],
) -> Result<(), Error> {
    let got = comm.recv(from, tag, bytes_mut(buf))?;
    filled(got, buf)
}

/// Whether a message of `got` bytes filled `buf` (a peer's layer has this rank's shape).
fn filled(got: usize, buf: &[f64]) -> Result<(), Error> {
    if got == core::mem::size_of_val(buf) {
        Ok(())
    } else {
        Err(Error("mg-ghost-layer"))
    }
}

/// `comm3`: fills the ghosts of `f` from the neighbours' faces, axis by axis; a dead
/// rank zeroes its array instead.
fn exchange<C: Comm + ?Sized>(
    comm: &mut C,
    level: &Level,
    f: &mut [f64],
    b: &mut Buffers,
) -> Result<(), Error> {
    if level.dead() {
        f.fill(0.0);
        return Ok(());
    }
    for (axis, span) in level.axes.iter().enumerate() {
        let n = span.count;
        // My last layer is the upper neighbour's lower ghost; the lower one's is mine.
        let (up, down) = (span.up, span.down);
        pass_layer(comm, (level, axis), f, b, (n, up), (0, down), TAG_UP)?;
        // My first layer is the lower neighbour's upper ghost; the upper one's is mine.
        pass_layer(comm, (level, axis), f, b, (1, down), (n + 1, up), TAG_DOWN)?;
    }
    Ok(())
}

/// Half of one axis's `comm3`: layer `layer` of `f` (across the interior, see
/// [`for_each_run`]) to rank `to`, and the layer rank `from` sends into layer `ghost`
/// (a copy in place when this rank is alone along the axis, so `to` is itself).
fn pass_layer<C: Comm + ?Sized>(
    comm: &mut C,
    (level, axis): (&Level, usize),
    f: &mut [f64],
    b: &mut Buffers,
    (layer, to): (usize, usize),
    (ghost, from): (usize, usize),
    tag: u32,
) -> Result<(), Error> {
    if to == comm.rank() {
        // Alone along the axis: the ghost layer is a copy of this rank's own layer.
        let [m1, m2, _] = level.dims();
        let step = [1, m1, m1 * m2][axis];
        for_each_run(level, axis, layer..layer + 1, false, |run| {
            let to = run.start - layer * step + ghost * step;
            if run.len() == 1 {
                f[to] = f[run.start];
            } else {
                f.copy_within(run, to);
            }
        });
        return Ok(());
    }
    let len = gather(f, level, axis, layer..layer + 1, false, b.send);
    shift(comm, (to, &b.send[..len]), (from, &mut b.recv[..len]), tag)?;
    scatter(&b.recv[..len], level, axis, ghost..ghost + 1, false, f);
    Ok(())
}

/// `comm3_ex`, after interpolating into `level`: along each axis, a rank that had no
/// coarse point takes its point and ghosts from the neighbours that computed them
/// (their last layer and upper ghost from below, their first layer from above).
/// Receives go in the order the lower and upper neighbours send them.
fn expand<C: Comm + ?Sized>(
    comm: &mut C,
    level: &Level,
    f: &mut [f64],
    b: &mut Buffers,
) -> Result<(), Error> {
    for (axis, span) in level.axes.iter().enumerate() {
        let n = span.count;
        if span.take {
            let mut len = 0;
            for_each_run(level, axis, 0..2, true, |run| len += run.len());
            receive(comm, span.down, TAG_EX_UP, &mut b.recv[..len])?;
            scatter(&b.recv[..len], level, axis, 0..2, true, f);
            receive(comm, span.up, TAG_EX_DOWN, &mut b.recv[..len / 2])?;
            scatter(&b.recv[..len / 2], level, axis, n + 1..n + 2, true, f);
        }
        if span.give {
            let len = gather(f, level, axis, n..n + 2, true, b.send);
            comm.send(span.up, TAG_EX_UP, bytes(&b.send[..len]))?;
            let len = gather(f, level, axis, 1..2, true, b.send);
            comm.send(span.down, TAG_EX_DOWN, bytes(&b.send[..len]))?;
        }
    }
    Ok(())
}

/// `r = v - A u` on this rank's block of `r` (`v` is `r` itself when `None`).
fn resid<C: Comm + ?Sized>(
    comm: &mut C,
    level: &Level,
    u: &[f64],
    v: Option<&[f64]>,
    r: &mut [f64],
    b: &mut Buffers,
) -> Result<(), Error> {
    let p = level.plane();
    let pl = p.len();
    if !level.dead() {
        for i3 in 1..=level.axes[2].count {
            let v_plane = v.map(|v| &v[i3 * pl..(i3 + 1) * pl]);
            let out = &mut r[i3 * pl..(i3 + 1) * pl];
            mg::resid_plane(u, i3, v_plane, out, p, &RESIDUAL);
        }
    }
    exchange(comm, level, r, b)
}

/// The smoother `u = u + C r` on this rank's block of `u`.
fn psinv<C: Comm + ?Sized>(
    comm: &mut C,
    level: &Level,
    r: &[f64],
    u: &mut [f64],
    c: &[f64; 4],
    b: &mut Buffers,
) -> Result<(), Error> {
    let p = level.plane();
    let pl = p.len();
    if !level.dead() {
        for i3 in 1..=level.axes[2].count {
            mg::psinv_plane(r, i3, &mut u[i3 * pl..(i3 + 1) * pl], p, c);
        }
    }
    exchange(comm, level, u, b)
}

/// This rank's arrays and their levels.
struct Grids<'a> {
    lt: usize,
    levels: [Level; 16],
    u: [&'a mut [f64]; 16],
    r: [&'a mut [f64]; 16],
    v: &'a mut [f64],
    buffers: Buffers<'a>,
}

/// Levels `k - 1` and `k` of `levels`, both writable.
fn pair<'s>(levels: &'s mut [&mut [f64]; 16], k: usize) -> (&'s mut [f64], &'s mut [f64]) {
    let (lower, upper) = levels.split_at_mut(k);
    (&mut *lower[k - 1], &mut *upper[0])
}

impl Grids<'_> {
    /// `r[k - 1] = P r[k]` (`rprj3`).
    fn restrict<C: Comm + ?Sized>(&mut self, comm: &mut C, k: usize) -> Result<(), Error> {
        let (fl, cl) = (self.levels[k], self.levels[k - 1]);
        let (coarse, fine) = pair(&mut self.r, k);
        if !cl.dead() {
            let s = cl.shift_in(&fl);
            let pc = cl.plane();
            let plc = pc.len();
            for j3 in 1..=cl.axes[2].count {
                let out = &mut coarse[j3 * plc..(j3 + 1) * plc];
                mg::rprj3_plane(fine, fl.plane(), 2 * j3 - s[2], out, pc, [s[0], s[1]]);
            }
        }
        exchange(comm, &cl, coarse, &mut self.buffers)
    }

    /// `u[k] = Q u[k - 1]`, or `u[k] += Q u[k - 1]` (`ADD`) (`interp`, then `comm3_ex`).
    fn prolong<const ADD: bool, C: Comm + ?Sized>(
        &mut self,
        comm: &mut C,
        k: usize,
    ) -> Result<(), Error> {
        let (cl, fl) = (self.levels[k - 1], self.levels[k]);
        let (coarse, fine) = pair(&mut self.u, k);
        if cl.dead() {
            // Nothing to interpolate from: the points come from neighbours below.
            if !ADD {
                fine.fill(0.0);
            }
        } else {
            let s = cl.shift_in(&fl);
            let plf = fl.plane().len();
            // Coarse plane c3 makes the fine planes 2 c3 - s and 2 c3 + 1 - s.
            for c3 in 0..=cl.axes[2].count {
                let between = 2 * c3 + 1 - s[2];
                let (below, rest) = fine.split_at_mut(between * plf);
                let on = (between > 0).then(|| &mut below[(between - 1) * plf..]);
                let (pc, pf) = (cl.plane(), fl.plane());
                let next = &mut rest[..plf];
                mg::interp_plane::<ADD>(coarse, pc, c3, on, next, pf, [s[0], s[1]]);
            }
        }
        if fl.expands() {
            expand(comm, &fl, fine, &mut self.buffers)?;
        }
        Ok(())
    }

    /// `r = v - A u` on the finest level.
    fn residual<C: Comm + ?Sized>(&mut self, comm: &mut C) -> Result<(), Error> {
        let lt = self.lt;
        let (level, b) = (&self.levels[lt], &mut self.buffers);
        resid(comm, level, self.u[lt], Some(self.v), self.r[lt], b)
    }

    /// `u[k] = u[k] + C r[k]`.
    fn smooth<C: Comm + ?Sized>(
        &mut self,
        comm: &mut C,
        k: usize,
        c: &[f64; 4],
    ) -> Result<(), Error> {
        let (level, b) = (&self.levels[k], &mut self.buffers);
        psinv(comm, level, self.r[k], self.u[k], c, b)
    }

    /// One V-cycle (`mg3P`), as the shared-memory MG's.
    fn mg3p<C: Comm + ?Sized>(&mut self, comm: &mut C, c: &[f64; 4]) -> Result<(), Error> {
        let lt = self.lt;
        for k in (2..=lt).rev() {
            self.restrict(comm, k)?;
        }
        self.u[1].fill(0.0);
        self.smooth(comm, 1, c)?;
        for k in 2..lt {
            self.prolong::<false, C>(comm, k)?;
            // r[k] = r[k] - A u[k], then u[k] += C r[k].
            let (level, b) = (&self.levels[k], &mut self.buffers);
            resid(comm, level, self.u[k], None, self.r[k], b)?;
            self.smooth(comm, k, c)?;
        }
        self.prolong::<true, C>(comm, lt)?;
        self.residual(comm)?;
        self.smooth(comm, lt, c)
    }

    /// `(sqrt(sum r^2 / n^3), max |r|)` over the finest level's interior.
    fn norm<C: Comm + ?Sized>(&self, comm: &mut C) -> Result<(f64, f64), Error> {
        let level = &self.levels[self.lt];
        let p = level.plane();
        let interior = &self.r[self.lt][p.len()..(level.axes[2].count + 1) * p.len()];
        let (sum, max) = mg::squares_and_max(interior, p);
        let (mut sum, mut max) = ([sum], [max]);
        comm.allreduce_f64(&mut sum, Op::Sum)?;
        comm.allreduce_f64(&mut max, Op::Max)?;
        let n = level.n as f64;
        Ok((libm::sqrt(sum[0] / (n * n * n)), max[0]))
    }

    /// Zeroes `u` on the finest level and makes the right-hand side `v` (`zran3`):
    /// every rank's best candidates in its block, allgathered and merged alike.
    fn reset<C: Comm + ?Sized>(
        &mut self,
        comm: &mut C,
        candidates: &mut [Candidate],
    ) -> Result<(), Error> {
        let level = self.levels[self.lt];
        self.u[self.lt].fill(0.0);
        let block = level.block();
        let pl = level.plane().len();
        let held = &mut self.v[pl..(level.axes[2].count + 1) * pl];
        let (largest, smallest) = mg::zran3_scan(held, &block);
        let (mine, all) = candidates.split_at_mut(2 * CHARGES);
        mine[..CHARGES].copy_from_slice(&largest.list);
        mine[CHARGES..].copy_from_slice(&smallest.list);
        allgather(comm, bytes(mine), bytes_mut(all))?;
        let (largest, smallest) = mg::merge_extremes(all);
        mg::place_charges(held, &block, &largest, &smallest);
        exchange(comm, &level, self.v, &mut self.buffers)
    }
}

/// Every rank's `mine` (the same length on each) into its place in `all`, in rank order.
fn allgather<C: Comm + ?Sized>(comm: &mut C, mine: &[u8], all: &mut [u8]) -> Result<(), Error> {
    let size = comm.size();
    let counts = [mine.len(); MAX_RANKS];
    let from_start = [0; MAX_RANKS];
    let places: [usize; MAX_RANKS] = core::array::from_fn(|j| j * mine.len());
    comm.alltoallv(
        mine,
        &counts[..size],
        &from_start[..size],
        all,
        &counts[..size],
        &places[..size],
    )
}

pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let (me, size) = (comm.rank(), comm.size());
    let lt = mg::levels(class);
    let nit = mg::iterations(class);
    let c = mg::smoother(class);
    let levels = plan(class, me, size);
    let mut carve = |len: usize| -> &mut [f64] {
        // SAFETY: the arena is this rank's alone and outlives this run.
        unsafe { take(arena, len) }
    };
    let mut level = |k: usize| -> &mut [f64] {
        if (1..=lt).contains(&k) {
            carve(levels[k].len())
        } else {
            &mut []
        }
    };
    let u = core::array::from_fn(&mut level);
    let r = core::array::from_fn(&mut level);
    let mut g = Grids {
        lt,
        levels,
        u,
        r,
        v: carve(levels[lt].len()),
        buffers: Buffers {
            send: carve(buffer_len(&levels[lt])),
            recv: carve(buffer_len(&levels[lt])),
        },
    };
    // SAFETY: as `carve`.
    let candidates = unsafe { take::<Candidate>(arena, (size + 1) * 2 * CHARGES) };

    // Set-up and one untimed cycle, then start again from the same state.
    g.reset(comm, candidates)?;
    g.residual(comm)?;
    g.mg3p(comm, &c)?;
    g.residual(comm)?;
    g.reset(comm, candidates)?;
    comm.barrier()?;

    let start = comm.seconds();
    g.residual(comm)?;
    let (initial, _) = g.norm(comm)?;
    for it in 0..nit {
        g.mg3p(comm, &c)?;
        g.residual(comm)?;
        comm.progress(it + 1, nit);
    }
    let (rnm2, rnmu) = g.norm(comm)?;
    let seconds = max_seconds(comm, comm.seconds() - start)?;

    let mut values = Values::new();
    values.push("rnm2", rnm2);
    values.push("rnmu", rnmu);
    values.push("initial", initial);
    values.push("error", mg::error(class, rnm2));
    Ok(Outcome {
        seconds,
        mops: mg::mops(class, seconds),
        verified: mg::verify(class, rnm2),
        values,
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::testing::value;

    #[test]
    fn rank_counts_must_be_powers_of_two_up_to_64() {
        for ranks in [1, 2, 4, 8, 16, 32, 64] {
            assert!(fits(Class::S, ranks) && fits(Class::A, ranks), "{ranks}");
        }
        assert!(!fits(Class::S, 128) && !fits(Class::S, 3) && !fits(Class::A, 6));
    }

    #[test]
    fn the_process_grid_is_mg_f_s() {
        // log2(ranks) split x: a third, y: half the rest, z: the remainder.
        let grids = [1, 2, 4, 8, 16, 32, 64].map(process_grid);
        assert_eq!(
            grids,
            [
                [1, 1, 1],
                [1, 1, 2],
                [1, 2, 2],
                [2, 2, 2],
                [2, 2, 4],
                [2, 4, 4],
                [4, 4, 4]
            ]
        );
    }

    /// `(first, count, down, up)` of one axis of one level.
    fn span(levels: &[Level; 16], k: usize, axis: usize) -> (usize, usize, usize, usize) {
        let s = levels[k].axes[axis];
        (s.first, s.count, s.down, s.up)
    }

    #[test]
    fn blocks_and_neighbours_are_mg_f_s() {
        // 8 ranks, 2 x 2 x 2: rank 5 is at (1, 0, 1); the finest level (32) in halves,
        // each axis's two neighbours the same rank.
        let p = plan(Class::S, 5, 8);
        assert_eq!(coordinates(5, process_grid(8)), [1, 0, 1]);
        assert_eq!(span(&p, 5, 0), (16, 16, 4, 4));
        assert_eq!(span(&p, 5, 1), (0, 16, 7, 7));
        assert_eq!(span(&p, 5, 2), (16, 16, 1, 1));
        assert_eq!(span(&p, 1, 2), (1, 1, 1, 1));
        // mg.f's finest-level bounds: is = 2 + n - ((p - i) n) / p, ie = 1 + n - ((p - 1
        // - i) n) / p (1-based, ghost first), for every rank of 2, 4 and 8.
        for ranks in [2, 4, 8] {
            for rank in 0..ranks {
                let p = plan(Class::W, rank, ranks);
                let (grid, coords) = (process_grid(ranks), coordinates(rank, process_grid(ranks)));
                for axis in 0..3 {
                    let (n, pi, i) = (128, grid[axis], coords[axis]);
                    let is = 2 + n - ((pi - i) * n) / pi;
                    let ie = 1 + n - ((pi - 1 - i) * n) / pi;
                    let (first, count, _, _) = span(&p, 7, axis);
                    assert_eq!((first + 2, first + count + 1), (is, ie));
                }
            }
        }
        // 4 ranks, 1 x 2 x 2: rank 3 at (0, 1, 1), alone along x.
        let p = plan(Class::S, 3, 4);
        assert_eq!(coordinates(3, process_grid(4)), [0, 1, 1]);
        assert_eq!(span(&p, 5, 0), (0, 32, 3, 3));
        assert_eq!(span(&p, 5, 1), (16, 16, 2, 2));
        assert_eq!(span(&p, 5, 2), (16, 16, 1, 1));
    }

    #[test]
    fn four_ranks_along_an_axis_leave_dead_ranks_on_level_1_as_mg_f() {
        // 16 ranks, 2 x 2 x 4: along z, level 2 (4 points) one point each; level 1
        // (2 points) only at z = 1 and 3 (points 0 and 1), neighbours 2 apart.
        let at = |z: usize| plan(Class::S, 4 * z, 16);
        for z in 0..4 {
            let p = at(z);
            assert_eq!(coordinates(4 * z, process_grid(16)), [0, 0, z]);
            assert_eq!(span(&p, 2, 2), (z, 1, 4 * ((z + 3) % 4), 4 * ((z + 1) % 4)));
            let live = z % 2 == 1;
            assert_eq!(p[1].dead(), !live);
            let coarse = p[1].axes[2];
            assert_eq!((coarse.first, coarse.count), (z * 2 / 4, live as usize));
            // mg.f: give_ex on level 2 where level 1 has a point and the next rank up
            // none, take_ex the other way round; nothing on other levels or axes.
            let fine = p[2].axes[2];
            assert_eq!((fine.give, fine.take), (live, !live));
            for (k, level) in p.iter().enumerate() {
                assert!(k == 2 || !level.expands(), "level {k}");
            }
            assert!(!p[2].axes[0].give && !p[2].axes[1].take);
            if live {
                let other = 4 * ((z + 2) % 4);
                assert_eq!((coarse.down, coarse.up), (other, other));
                // Its coarse point lies on its fine point, one after 2 j.
                assert_eq!(p[1].shift_in(&p[2]), [0, 0, 1]);
            }
        }
    }

    /// Runs MG on `ranks` host threads; every rank's outcome.
    fn run_on(class: Class, ranks: usize) -> Vec<Outcome> {
        let kernel = crate::Kernel::Mg;
        crate::testing::on_mpi_ranks(crate::Spec { kernel, class }, ranks)
    }

    /// Asserts that MG `class` verifies on each of `ranks`, every rank alike, with the
    /// shared-memory MG's residual norms (the maximum, one point's value, to the bit).
    fn matches_shared_memory(class: Class, ranks: &[usize]) {
        let team = crate::host::run(
            crate::Spec {
                kernel: crate::Kernel::Mg,
                class,
            },
            2,
        );
        assert!(team.verified);
        for &ranks in ranks {
            let outcomes = run_on(class, ranks);
            for outcome in &outcomes {
                assert!(outcome.verified, "{class:?} on {ranks} ranks: {outcome:?}");
                assert_eq!(outcome.values, outcomes[0].values);
            }
            for name in ["rnm2", "initial"] {
                let (a, b) = (value(&team, name), value(&outcomes[0], name));
                assert!((a - b).abs() <= 1e-12 * a.abs(), "{name}: {a} vs {b}");
            }
            assert_eq!(value(&team, "rnmu"), value(&outcomes[0], "rnmu"), "{ranks}");
        }
    }

    #[test]
    fn s_on_1_to_8_ranks_matches_the_shared_memory_mg() {
        matches_shared_memory(Class::S, &[1, 2, 4, 8]);
    }

    #[test]
    fn s_on_16_32_64_ranks_with_dead_ranks_on_level_1_matches_too() {
        matches_shared_memory(Class::S, &[16, 32, 64]);
    }

    #[test]
    fn w_on_1_to_8_ranks_matches_the_shared_memory_mg() {
        matches_shared_memory(Class::W, &[1, 2, 4, 8]);
    }

    #[test]
    #[ignore = "class A: seconds per run and up to ~450 MiB per rank; run with --release --include-ignored"]
    fn a_on_1_to_8_ranks_matches_the_shared_memory_mg() {
        matches_shared_memory(Class::A, &[1, 2, 4, 8]);
    }
}
