//! LU on NPB3.3-MPI's 2-D process grid (`proc_grid`, `neighbors`, `subdomain`): the
//! `s` ranks (a power of two) form `xdim` x `ydim` (`ydim` the largest power of two
//! not above `sqrt(s)`, so `xdim = ydim` or `2 ydim`); rank `r` sits at row `r % xdim`
//! along x and column `r / xdim` along y, and holds a block of the x-y plane (`n /
//! xdim` by `n / ydim` points, the first ranks one more where it does not divide)
//! through every plane `k`, with ghost layers two deep on each side. Its neighbours
//! are north (x - 1), south (x + 1), west (y - 1) and east (y + 1); the grid's faces
//! have none.
//!
//! Each `rhs` first fills the ghosts of `u` (`exchange_3`: two layers with each
//! neighbour, every plane), then computes `rho_i` and `qs` on every stored point and
//! the flux terms on the owned interior. The sweeps are pipelined wavefronts
//! (`exchange_1`): for each plane `k` up the grid a rank receives the lower sweep's
//! finished edge of its north and west neighbours, sweeps its block (`jacld` +
//! `blts`), and sends its own south and east edges on; the upper sweep (`jacu` +
//! `buts`) runs down the planes from the south-east the same way. The norms and the
//! error are local sums allreduced; the surface integral (`pintgr`) is summed over
//! owned points, each weighted by the cells it is a corner of, so it needs no ghosts
//! (NPB-MPI's `exchange_4`..`6` trade the neighbours' face values instead).
//!
//! Every point's arithmetic is the shared-memory LU's own (`Flow::point`, `lower`,
//! `upper`, `initial`, `derived`), so the fields match the serial reference's bit for
//! bit and only the reductions' summation order differs. Unlike `subdomain`, which
//! wants four points a side, a block needs only two (its ghosts then come from the
//! adjacent rank alone): class S runs on up to 16 ranks, the others on 64.

// Statements are written as the shared-memory LU's (`a = a - b * c`, indexed loops over
// the five components), which keeps the reference's operation order visible.
#![allow(clippy::assign_op_pattern, clippy::needless_range_loop)]

use core::ops::Range;

use super::{Comm, Error, Op, bytes, bytes_mut, max_seconds, take};
use crate::cfd;
use crate::lu::{self, Constants, Flow, OMEGA, State};
use crate::team::Arena;
use crate::{Class, Outcome};

/// Ghost layers on each side of a block along x and y: `rhs`'s fourth-order
/// dissipation reads two points either way.
const GHOST: usize = 2;

/// Tag bases; a message's tag adds the side it travels toward ([`Side::index`]).
const TAG_GHOSTS: u32 = 500;
const TAG_LOWER: u32 = 510;
const TAG_UPPER: u32 = 520;

/// `proc_grid` for a power of two `ranks`: `(xdim, ydim)`.
fn proc_grid(ranks: usize) -> (usize, usize) {
    let ydim = 1 << (ranks.trailing_zeros() / 2);
    (ranks / ydim, ydim)
}

/// `subdomain`'s share of `n` points for part `p` of `parts`: the first `n % parts`
/// parts get one more.
fn split(n: usize, parts: usize, p: usize) -> Range<usize> {
    let (base, extra) = (n / parts, n % parts);
    let first = p * base + p.min(extra);
    first..first + base + usize::from(p < extra)
}

/// Whether LU runs on `ranks` ranks: a power of two whose process grid leaves every
/// block at least `GHOST` (2) points a side.
pub fn fits(class: Class, ranks: usize) -> bool {
    if !ranks.is_power_of_two() {
        return false;
    }
    let (xdim, ydim) = proc_grid(ranks);
    lu::params(class).0 / xdim.max(ydim) >= GHOST
}

/// A side of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    /// Toward x - 1.
    North,
    /// Toward x + 1.
    South,
    /// Toward y - 1.
    West,
    /// Toward y + 1.
    East,
}

impl Side {
    fn index(self) -> u32 {
        self as u32
    }

    fn opposite(self) -> Side {
        match self {
            Side::North => Side::South,
            Side::South => Side::North,
            Side::West => Side::East,
            Side::East => Side::West,
        }
    }
}

/// This rank's block of the grid and its neighbours.
#[derive(Clone, Debug)]
struct Block {
    /// Points a side of the whole grid.
    n: usize,
    /// The grid points owned along x (`i`) and y (`j`), in every plane `k`.
    xs: Range<usize>,
    ys: Range<usize>,
    /// The neighbours on each side ([`Side`] order), if any.
    neighbours: [Option<usize>; 4],
}

impl Block {
    fn new(n: usize, rank: usize, ranks: usize) -> Block {
        let (xdim, ydim) = proc_grid(ranks);
        let (row, col) = (rank % xdim, rank / xdim);
        Block {
            n,
            xs: split(n, xdim, row),
            ys: split(n, ydim, col),
            neighbours: [
                (row > 0).then(|| rank - 1),
                (row + 1 < xdim).then(|| rank + 1),
                (col > 0).then(|| rank - xdim),
                (col + 1 < ydim).then(|| rank + xdim),
            ],
        }
    }

    fn neighbour(&self, side: Side) -> Option<usize> {
        self.neighbours[side as usize]
    }

    /// Points per stored row: the owned ones and the ghosts on both sides.
    #[inline(always)]
    fn row(&self) -> usize {
        self.xs.len() + 2 * GHOST
    }

    /// Points per stored plane.
    #[inline(always)]
    fn plane(&self) -> usize {
        self.row() * (self.ys.len() + 2 * GHOST)
    }

    /// Points stored.
    fn points(&self) -> usize {
        self.plane() * self.n
    }

    /// Storage index of grid point `(i, j, k)`, which must be owned or a ghost.
    #[inline(always)]
    fn at(&self, i: usize, j: usize, k: usize) -> usize {
        (k * (self.ys.len() + 2 * GHOST) + j + GHOST - self.ys.start) * self.row() + i + GHOST
            - self.xs.start
    }

    /// Storage strides along x, y and z.
    #[inline(always)]
    fn strides(&self) -> [usize; 3] {
        [1, self.row(), self.plane()]
    }

    /// The stored points along x that exist in the grid (owned and ghosts).
    fn stored_x(&self) -> Range<usize> {
        self.xs.start.saturating_sub(GHOST)..(self.xs.end + GHOST).min(self.n)
    }

    fn stored_y(&self) -> Range<usize> {
        self.ys.start.saturating_sub(GHOST)..(self.ys.end + GHOST).min(self.n)
    }

    /// The owned interior points along x.
    fn inner_x(&self) -> Range<usize> {
        self.xs.start.max(1)..self.xs.end.min(self.n - 1)
    }

    fn inner_y(&self) -> Range<usize> {
        self.ys.start.max(1)..self.ys.end.min(self.n - 1)
    }

    /// The grid points (x range, y range) of the `depth` owned layers on `side`.
    fn edge(&self, side: Side, depth: usize) -> (Range<usize>, Range<usize>) {
        let (xs, ys) = (self.xs.clone(), self.ys.clone());
        match side {
            Side::North => (xs.start..xs.start + depth, ys),
            Side::South => (xs.end - depth..xs.end, ys),
            Side::West => (xs, ys.start..ys.start + depth),
            Side::East => (xs, ys.end - depth..ys.end),
        }
    }

    /// The grid points of the `depth` ghost layers on `side` (there must be a
    /// neighbour there).
    fn ghosts(&self, side: Side, depth: usize) -> (Range<usize>, Range<usize>) {
        let (xs, ys) = (self.xs.clone(), self.ys.clone());
        match side {
            Side::North => (xs.start - depth..xs.start, ys),
            Side::South => (xs.end..xs.end + depth, ys),
            Side::West => (xs, ys.start - depth..ys.start),
            Side::East => (xs, ys.end..ys.end + depth),
        }
    }

    /// [`Block::ghosts`], or nothing where there is no neighbour.
    fn ghosts_or_empty(&self, side: Side, depth: usize) -> (Range<usize>, Range<usize>) {
        match self.neighbour(side) {
            Some(_) => self.ghosts(side, depth),
            None => (0..0, 0..0),
        }
    }

    /// Values in a message of `depth` layers on any side, over `planes` planes: the
    /// largest.
    fn message_len(&self, depth: usize, planes: usize) -> usize {
        5 * depth * self.xs.len().max(self.ys.len()) * planes
    }
}

/// Arena bytes of one rank: the fields of its block (rank 0's is the largest) and two
/// message buffers of the largest exchange, with alignment.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let n = lu::params(class).0;
    let b = Block::new(n, 0, ranks.max(1));
    let f64s = |len: usize| len * 8 + 64;
    3 * f64s(5 * b.points()) + 2 * f64s(b.points()) + 2 * f64s(b.message_len(GHOST, n))
}

/// This rank's fields (its block, ghosts included) and message buffers.
struct Fields<'a> {
    /// The conserved variables.
    u: &'a mut [[f64; 5]],
    /// The residual, then (during the sweeps) the correction.
    rsd: &'a mut [[f64; 5]],
    /// The forcing term.
    frct: &'a mut [[f64; 5]],
    rho_i: &'a mut [f64],
    qs: &'a mut [f64],
    /// A message going out, and one coming in.
    out: &'a mut [f64],
    inbox: &'a mut [f64],
}

impl Fields<'_> {
    fn carve<'a>(arena: &mut Arena, b: &Block) -> Fields<'a> {
        let mut carve = |len: usize| -> &'a mut [f64] {
            // SAFETY: the arena is this rank's alone and outlives this run.
            unsafe { take(arena, len) }
        };
        let points = b.points();
        let message = b.message_len(GHOST, b.n);
        Fields {
            u: carve(5 * points).as_chunks_mut().0,
            rsd: carve(5 * points).as_chunks_mut().0,
            frct: carve(5 * points).as_chunks_mut().0,
            rho_i: carve(points),
            qs: carve(points),
            out: carve(message),
            inbox: carve(message),
        }
    }
}

/// Calls `f` on every stored grid point `(i, j, k)` of the block that exists in the
/// grid, ghosts included.
#[inline(always)]
fn stored(b: &Block, f: impl FnMut(usize, usize, usize)) {
    each(b.stored_x(), b.stored_y(), 0..b.n, f);
}

/// Calls `f` on every owned interior grid point.
#[inline(always)]
fn interior(b: &Block, f: impl FnMut(usize, usize, usize)) {
    each(b.inner_x(), b.inner_y(), 1..b.n - 1, f);
}

/// Calls `f` on the points `xs` x `ys` x `ks`, `i` fastest.
#[inline(always)]
fn each(
    xs: Range<usize>,
    ys: Range<usize>,
    ks: Range<usize>,
    mut f: impl FnMut(usize, usize, usize),
) {
    for k in ks {
        for j in ys.clone() {
            for i in xs.clone() {
                f(i, j, k);
            }
        }
    }
}

/// Copies `f` at the grid points `xs` x `ys` of planes `ks` into `buf` (`i` fastest);
/// returns the values copied.
fn pack(
    b: &Block,
    f: &[[f64; 5]],
    (xs, ys): (Range<usize>, Range<usize>),
    ks: Range<usize>,
    buf: &mut [f64],
) -> usize {
    let mut at = 0;
    each(xs, ys, ks, |i, j, k| {
        buf[at..at + 5].copy_from_slice(&f[b.at(i, j, k)]);
        at += 5;
    });
    at
}

/// The inverse of [`pack`]: `buf` into `f` at those points.
fn unpack(
    b: &Block,
    f: &mut [[f64; 5]],
    (xs, ys): (Range<usize>, Range<usize>),
    ks: Range<usize>,
    buf: &[f64],
) {
    let mut at = 0;
    each(xs, ys, ks, |i, j, k| {
        f[b.at(i, j, k)].copy_from_slice(&buf[at..at + 5]);
        at += 5;
    });
}

/// `recv` must have come whole.
fn whole(got: usize, recv: &[f64]) -> Result<(), Error> {
    if got == core::mem::size_of_val(recv) {
        Ok(())
    } else {
        Err(Error("lu-ghosts"))
    }
}

/// Sends the `depth` owned layers of `f`'s planes `ks` on side `to` to the neighbour
/// there, and fills the ghosts on the opposite side from the neighbour there, at once
/// (either neighbour may be missing).
#[allow(clippy::too_many_arguments)]
fn trade<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    f: &mut [[f64; 5]],
    (out, inbox): (&mut [f64], &mut [f64]),
    to: Side,
    depth: usize,
    ks: Range<usize>,
    base: u32,
) -> Result<(), Error> {
    let from = to.opposite();
    let tag = base + to.index();
    let sent = match b.neighbour(to) {
        Some(_) => pack(b, f, b.edge(to, depth), ks.clone(), out),
        None => 0,
    };
    let (xs, ys) = b.ghosts_or_empty(from, depth);
    let recv = &mut inbox[..5 * xs.len() * ys.len() * ks.len()];
    match (b.neighbour(to), b.neighbour(from)) {
        (Some(dst), Some(src)) => {
            let got = comm.sendrecv(dst, tag, bytes(&out[..sent]), src, tag, bytes_mut(recv))?;
            whole(got, recv)?;
        }
        (Some(dst), None) => return comm.send(dst, tag, bytes(&out[..sent])),
        (None, Some(src)) => whole(comm.recv(src, tag, bytes_mut(recv))?, recv)?,
        (None, None) => return Ok(()),
    }
    unpack(b, f, (xs, ys), ks, recv);
    Ok(())
}

/// Sends the owned edge of plane `k` of `f` on `side` to the neighbour there (if any),
/// a sweep's finished values.
fn send_edge<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    f: &[[f64; 5]],
    out: &mut [f64],
    side: Side,
    k: usize,
    base: u32,
) -> Result<(), Error> {
    let Some(dst) = b.neighbour(side) else {
        return Ok(());
    };
    let len = pack(b, f, b.edge(side, 1), k..k + 1, out);
    comm.send(dst, base + side.index(), bytes(&out[..len]))
}

/// Fills the ghosts of plane `k` of `f` on `side` from the neighbour there (if any).
fn recv_ghosts<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    f: &mut [[f64; 5]],
    inbox: &mut [f64],
    side: Side,
    k: usize,
    base: u32,
) -> Result<(), Error> {
    let Some(src) = b.neighbour(side) else {
        return Ok(());
    };
    let (xs, ys) = b.ghosts(side, 1);
    let recv = &mut inbox[..5 * xs.len() * ys.len()];
    whole(
        comm.recv(src, base + side.opposite().index(), bytes_mut(recv))?,
        recv,
    )?;
    unpack(b, f, (xs, ys), k..k + 1, recv);
    Ok(())
}

/// `setbv` and `setiv` on every stored point.
fn initialize(b: &Block, c: &Constants, f: &mut Fields) {
    stored(b, |i, j, k| {
        f.u[b.at(i, j, k)] = lu::initial(c, i, j, k);
    });
}

/// `erhs`: the forcing term on the owned interior, from the exact solution put in
/// `rsd` on every stored point (so no ghosts need trading).
fn erhs(b: &Block, c: &Constants, f: &mut Fields) {
    stored(b, |i, j, k| {
        let at = b.at(i, j, k);
        f.frct[at] = [0.0; 5];
        f.rsd[at] = c.exact(i, j, k);
    });
    let flow = Flow::<true> {
        v: f.rsd,
        rho_i: &[],
        qs: &[],
    };
    interior(b, |i, j, k| {
        let at = b.at(i, j, k);
        flow.point(c, &mut f.frct[at], at, [i, j, k], b.strides());
    });
}

/// `rhs`: the ghosts of `u` from the neighbours, then the steady-state residual.
fn rhs<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    c: &Constants,
    f: &mut Fields,
) -> Result<(), Error> {
    for to in [Side::South, Side::North, Side::East, Side::West] {
        trade(
            comm,
            b,
            f.u,
            (&mut *f.out, &mut *f.inbox),
            to,
            GHOST,
            0..b.n,
            TAG_GHOSTS,
        )?;
    }
    stored(b, |i, j, k| {
        let at = b.at(i, j, k);
        f.rsd[at] = f.frct[at].map(|x| -x);
        (f.rho_i[at], f.qs[at]) = lu::derived(&f.u[at]);
    });
    let flow = Flow::<false> {
        v: f.u,
        rho_i: f.rho_i,
        qs: f.qs,
    };
    interior(b, |i, j, k| {
        let at = b.at(i, j, k);
        flow.point(c, &mut f.rsd[at], at, [i, j, k], b.strides());
    });
    Ok(())
}

/// The lower then the upper triangular sweep, pipelined over the planes across the
/// process grid (module docs).
fn sweeps<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    c: &Constants,
    f: &mut Fields,
) -> Result<(), Error> {
    let s = State {
        u: f.u,
        rho_i: f.rho_i,
        qs: f.qs,
        row: b.row(),
        plane: b.plane(),
    };
    let (row, plane) = (s.row, s.plane);
    let v = &mut *f.rsd;
    for k in 1..b.n - 1 {
        recv_ghosts(comm, b, v, f.inbox, Side::North, k, TAG_LOWER)?;
        recv_ghosts(comm, b, v, f.inbox, Side::West, k, TAG_LOWER)?;
        for j in b.inner_y() {
            for i in b.inner_x() {
                let at = b.at(i, j, k);
                v[at] = lu::lower(c, &s, at, v[at], &v[at - plane], &v[at - row], &v[at - 1]);
            }
        }
        send_edge(comm, b, v, f.out, Side::South, k, TAG_LOWER)?;
        send_edge(comm, b, v, f.out, Side::East, k, TAG_LOWER)?;
    }
    for k in (1..b.n - 1).rev() {
        recv_ghosts(comm, b, v, f.inbox, Side::South, k, TAG_UPPER)?;
        recv_ghosts(comm, b, v, f.inbox, Side::East, k, TAG_UPPER)?;
        for j in b.inner_y().rev() {
            for i in b.inner_x().rev() {
                let at = b.at(i, j, k);
                v[at] = lu::upper(c, &s, at, v[at], &v[at + plane], &v[at + row], &v[at + 1]);
            }
        }
        send_edge(comm, b, v, f.out, Side::North, k, TAG_UPPER)?;
        send_edge(comm, b, v, f.out, Side::West, k, TAG_UPPER)?;
    }
    Ok(())
}

/// One SSOR iteration, ending with the new residual.
fn iterate<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    c: &Constants,
    f: &mut Fields,
) -> Result<(), Error> {
    interior(b, |i, j, k| {
        let x = &mut f.rsd[b.at(i, j, k)];
        for m in 0..5 {
            x[m] = c.dt * x[m];
        }
    });
    sweeps(comm, b, c, f)?;
    let tmp = 1.0 / (OMEGA * (2.0 - OMEGA));
    interior(b, |i, j, k| {
        let at = b.at(i, j, k);
        for m in 0..5 {
            f.u[at][m] = f.u[at][m] + tmp * f.rsd[at][m];
        }
    });
    rhs(comm, b, c, f)
}

/// The root-mean-square norms of `sum(i, j, k)` (five squares) over the whole
/// interior: local sums, allreduced.
fn norms<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    squares: impl Fn(usize, usize, usize) -> [f64; 5],
) -> Result<[f64; 5], Error> {
    let mut sums = [0.0; 5];
    interior(b, |i, j, k| {
        let sq = squares(i, j, k);
        for m in 0..5 {
            sums[m] = sums[m] + sq[m];
        }
    });
    comm.allreduce_f64(&mut sums, Op::Sum)?;
    Ok(lu::rms(b.n, sums))
}

/// `ssor`: the residual of the initial field, then `niter` iterations; the slowest
/// rank's seconds of the iterations and the final residual norms (`l2norm`).
fn ssor<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    c: &Constants,
    f: &mut Fields,
    niter: usize,
) -> Result<(f64, [f64; 5]), Error> {
    rhs(comm, b, c, f)?;
    comm.barrier()?;
    let start = comm.seconds();
    for step in 0..niter {
        iterate(comm, b, c, f)?;
        comm.progress(step + 1, niter);
    }
    let rsd = &*f.rsd;
    let rsdnm = norms(comm, b, |i, j, k| rsd[b.at(i, j, k)].map(|x| x * x))?;
    Ok((max_seconds(comm, comm.seconds() - start)?, rsdnm))
}

/// How many of `pintgr`'s cells along one axis have point `p` as a corner: cell `a`
/// of `first..last` spans points `a` and `a + 1`.
fn corners(p: usize, (first, last): (usize, usize)) -> f64 {
    let cells = first..last;
    let mut count = 0.0;
    if cells.contains(&p) {
        count += 1.0;
    }
    if p.checked_sub(1).is_some_and(|a| cells.contains(&a)) {
        count += 1.0;
    }
    count
}

/// `pintgr`: each face's sum over the cells of their eight corners' pressure is the
/// sum over its points of their pressure times the cells they are a corner of, so
/// every rank sums its owned points and the three sums are allreduced.
fn pintgr<C: Comm + ?Sized>(
    comm: &mut C,
    b: &Block,
    c: &Constants,
    u: &[[f64; 5]],
) -> Result<f64, Error> {
    let [bx, by, bz] = lu::integration_box(b.n);
    let phi = |i, j, k| lu::pressure(&u[b.at(i, j, k)]);
    let owned = |p: usize, range: &Range<usize>| range.contains(&p);
    let mut frc = [0.0; 3];
    for j in b.ys.clone() {
        for i in b.xs.clone() {
            let w = corners(i, bx) * corners(j, by);
            if w != 0.0 {
                frc[0] = frc[0] + w * (phi(i, j, bz.0) + phi(i, j, bz.1));
            }
        }
    }
    for k in 0..b.n {
        for i in b.xs.clone() {
            let w = corners(i, bx) * corners(k, bz);
            for face in [by.0, by.1] {
                if w != 0.0 && owned(face, &b.ys) {
                    frc[1] = frc[1] + w * phi(i, face, k);
                }
            }
        }
        for j in b.ys.clone() {
            let w = corners(j, by) * corners(k, bz);
            for face in [bx.0, bx.1] {
                if w != 0.0 && owned(face, &b.xs) {
                    frc[2] = frc[2] + w * phi(face, j, k);
                }
            }
        }
    }
    comm.allreduce_f64(&mut frc, Op::Sum)?;
    let frc1 = c.dxi * c.deta * frc[0];
    let frc2 = c.dxi * c.dzeta * frc[1];
    let frc3 = c.deta * c.dzeta * frc[2];
    Ok(0.25 * (frc1 + frc2 + frc3))
}

/// Runs this rank's part of LU at `class`, as `lu.f`: the boundary and initial
/// values, the forcing, one untimed iteration, the values again, `itmax` timed
/// iterations, then the error and the surface integral.
pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let (n, itmax, dt) = lu::params(class);
    let b = Block::new(n, comm.rank(), comm.size());
    let c = Constants::new(n, dt);
    let mut f = Fields::carve(arena, &b);

    initialize(&b, &c, &mut f);
    erhs(&b, &c, &mut f);
    ssor(comm, &b, &c, &mut f, 1)?;
    initialize(&b, &c, &mut f);
    let (seconds, xcr) = ssor(comm, &b, &c, &mut f, itmax)?;

    let u = &*f.u;
    let xce = norms(comm, &b, |i, j, k| {
        let (exact, got) = (c.exact(i, j, k), u[b.at(i, j, k)]);
        core::array::from_fn(|m| {
            let tmp = exact[m] - got[m];
            tmp * tmp
        })
    })?;
    let xci = pintgr(comm, &b, &c, u)?;
    let mut values = cfd::values(&xcr, &xce);
    values.push("xci", xci);
    Ok(Outcome {
        seconds,
        mops: lu::mops(class, seconds),
        verified: lu::verify(class, &xcr, &xce, xci),
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
    fn the_process_grid_is_proc_grids_and_blocks_need_two_points_a_side() {
        assert_eq!(
            [1, 2, 4, 8, 16, 32, 64].map(proc_grid),
            [(1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (8, 4), (8, 8)]
        );
        // Class S (12 a side): 16 ranks leave 3 a side, 32 ranks 1 along x.
        assert!(fits(Class::S, 1) && fits(Class::S, 16) && fits(Class::W, 64));
        assert!(!fits(Class::S, 32) && !fits(Class::S, 3) && !fits(Class::W, 6));
        // W's 33 points over 4: the first part one more.
        let parts: Vec<_> = (0..4).map(|p| split(33, 4, p)).collect();
        assert_eq!(parts, [0..9, 9..17, 17..25, 25..33]);
    }

    #[test]
    fn neighbours_are_along_the_grid_and_none_beyond_its_faces() {
        // 8 ranks: 4 along x by 2 along y; rank 5 is at row 1, column 1.
        let b = Block::new(12, 5, 8);
        assert_eq!((b.xs.clone(), b.ys.clone()), (3..6, 6..12));
        assert_eq!(b.neighbours, [Some(4), Some(6), Some(1), None]);
        let corner = Block::new(12, 0, 8);
        assert_eq!(corner.neighbours, [None, Some(1), None, Some(4)]);
        // Ghosts two deep: x from 1, y from 4; none beyond the grid's last point.
        assert_eq!((b.stored_x(), b.stored_y()), (1..8, 4..12));
        assert_eq!(b.at(1, 4, 0), 0);
        assert_eq!(b.at(3, 6, 1), b.plane() + 2 * b.row() + 2);
    }

    #[test]
    fn pintgr_weights_count_the_cells_at_a_point() {
        let cells = (1, 4); // cells 1, 2, 3 over points 1..=4
        let w: Vec<f64> = (0..6).map(|p| corners(p, cells)).collect();
        assert_eq!(w, [0.0, 1.0, 2.0, 2.0, 1.0, 0.0]);
    }

    /// Runs LU on `ranks` host threads; every rank's outcome.
    fn run_on(class: Class, ranks: usize) -> Vec<Outcome> {
        let kernel = crate::Kernel::Lu;
        crate::testing::on_mpi_ranks(crate::Spec { kernel, class }, ranks)
    }

    /// LU `class` verifies on each of `ranks`, every rank alike, with the norms and
    /// integral of the shared-memory LU but for the sums' order.
    fn verifies_on(class: Class, ranks: &[usize]) {
        let spec = crate::Spec {
            kernel: crate::Kernel::Lu,
            class,
        };
        let team = crate::host::run(spec, 1);
        for &ranks in ranks {
            let outcomes = run_on(class, ranks);
            for outcome in &outcomes {
                assert!(outcome.verified, "{class:?} on {ranks} ranks: {outcome:?}");
                assert_eq!(outcome.values, outcomes[0].values);
            }
            for (name, want) in team.values.iter() {
                let got = value(&outcomes[0], name);
                assert!(
                    (got - want).abs() <= 1e-12 * want.abs(),
                    "{class:?} on {ranks} ranks: {name} {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn verifies_at_s_on_1_2_4_8_16_ranks() {
        // 8 and 16 ranks: blocks of 3 points a side, so the ghosts of a block next to
        // the grid's face hold points of the one-sided dissipation there.
        verifies_on(Class::S, &[1, 2, 4, 8, 16]);
    }

    #[test]
    fn verifies_at_w_on_2_4_8_ranks() {
        verifies_on(Class::W, &[2, 4, 8]);
    }
}
