//! What the MPI forms of SP and BT share: NPB3.3-MPI's multi-partition layout
//! (`make_set`), the ghost-face exchange (`copy_faces`), the explicit right-hand side
//! over a rank's cells, the norms, and the main program around the solver.
//!
//! Layout: `p = q * q` ranks cut the grid into `q^3` cells (`q` a side, the first
//! `n % q` of each axis one point longer); rank `r` owns the `q` cells `c = 0..q` at
//! `((r % q + c) % q, (r / q - c) mod q, c)`, a diagonal through the cube. So every
//! rank owns exactly one cell of each slab across any axis, and in a line solve all
//! ranks work at every stage, each on a different slab; and all of a rank's cells have
//! their neighbour along one axis on one rank, so each ghost-face exchange is one
//! message per direction.
//!
//! Storage: each rank keeps the fields in the whole grid's shape (the shared-memory
//! [`Grid`]'s indices, so the per-point kernels are the shared-memory ones) but only its
//! cells, two ghost layers across each cell face (for `u`) and one (for the derived
//! scalars) hold values it uses; memory per rank therefore does not shrink with the
//! ranks as the reference's does (its arrays hold only its cells).

// Statements are written as the reference's (indexed loops over the five components).
#![allow(clippy::needless_range_loop)]

use core::ops::Range;

use super::{Comm, Error, Op, bytes, bytes_mut, max_seconds, take};
use crate::cfd::{self, ALIGN_SLACK, Constants, Fields, Grid};
use crate::team::{Arena, Shared};
use crate::{Class, Outcome};

/// The cells of one rank of a `q * q` job on a grid of `n` points a side.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub q: usize,
    pub rank: usize,
    pub n: usize,
}

/// One cell: its point ranges along x, y and z.
#[derive(Clone, Debug)]
pub struct Cell {
    pub ranges: [Range<usize>; 3],
}

impl Cell {
    /// The ranges clipped to the grid's interior along the axes other than `axis` (the
    /// lines a solve along `axis` works on).
    pub fn lines_across(&self, axis: usize, n: usize) -> [Range<usize>; 3] {
        core::array::from_fn(|a| {
            let r = self.ranges[a].clone();
            if a == axis {
                r
            } else {
                r.start.max(1)..r.end.min(n - 1)
            }
        })
    }

    /// Lines of a solve along `axis` through the cell.
    pub fn lines(&self, axis: usize, n: usize) -> usize {
        let r = self.lines_across(axis, n);
        (0..3).filter(|&a| a != axis).map(|a| r[a].len()).product()
    }

    /// The ranges clipped to the grid's interior (where `rhs` changes).
    pub fn interior(&self, n: usize) -> [Range<usize>; 3] {
        self.ranges
            .clone()
            .map(|r| r.start.max(1)..r.end.min(n - 1))
    }
}

/// `q` when `ranks` is a square `q * q` whose cells have at least two points a side
/// on a grid of `n` (the ghost faces and the solves' carried rows are two deep).
pub fn cells_a_side(n: usize, ranks: usize) -> Option<usize> {
    let q = (1..=ranks).find(|q| q * q >= ranks)?;
    (q * q == ranks && n / q >= 2).then_some(q)
}

impl Layout {
    /// Rank `rank` of `q * q`.
    pub fn new(n: usize, rank: usize, q: usize) -> Layout {
        Layout { q, rank, n }
    }

    /// The x, y, z cell coordinates of cell `c` of this rank (`make_set`).
    pub fn coords(&self, c: usize) -> [usize; 3] {
        let q = self.q;
        [(self.rank % q + c) % q, (self.rank / q + q - c % q) % q, c]
    }

    /// The rank owning the cell at `coords`.
    pub fn owner(&self, [x, y, z]: [usize; 3]) -> usize {
        let q = self.q;
        ((y + z) % q) * q + (x + q - z % q) % q
    }

    /// The rank owning the neighbours along `axis` (one step up when `up`) of all this
    /// rank's cells.
    pub fn neighbour(&self, axis: usize, up: bool) -> usize {
        let mut at = self.coords(0);
        at[axis] = if up {
            (at[axis] + 1) % self.q
        } else {
            (at[axis] + self.q - 1) % self.q
        };
        self.owner(at)
    }

    /// Points `start..end` of cell coordinate `coord` along an axis.
    pub fn span(&self, coord: usize) -> Range<usize> {
        let (size, excess) = (self.n / self.q, self.n % self.q);
        let start = coord * size + coord.min(excess);
        start..start + size + usize::from(coord < excess)
    }

    /// The longest span.
    pub fn max_span(&self) -> usize {
        self.n.div_ceil(self.q)
    }

    pub fn cell(&self, c: usize) -> Cell {
        Cell {
            ranges: self.coords(c).map(|coord| self.span(coord)),
        }
    }

    /// This rank's cell whose coordinate along `axis` is `coord`.
    pub fn cell_at(&self, axis: usize, coord: usize) -> usize {
        (0..self.q)
            .find(|&c| self.coords(c)[axis] == coord)
            .expect("a rank owns one cell of every slab")
    }
}

/// Calls `row(first, len)` for every x row of the box `ranges`, k outermost: the
/// storage index of its first point and its length.
pub fn each_row(g: &Grid, ranges: &[Range<usize>; 3], mut row: impl FnMut(usize, usize)) {
    for k in ranges[2].clone() {
        for j in ranges[1].clone() {
            row(g.at(ranges[0].start, j, k), ranges[0].len());
        }
    }
}

/// Tags of the ghost-face exchanges (plus `2 * axis + up`).
const TAG_FACES: u32 = 501;

/// The two buffers of the ghost-face exchange.
pub struct Faces<'a> {
    send: &'a mut [f64],
    recv: &'a mut [f64],
}

impl<'a> Faces<'a> {
    /// `f64`s of each buffer: two layers of every cell's face.
    fn len(l: &Layout) -> usize {
        l.q * 2 * l.max_span() * l.max_span() * 5
    }

    fn bytes(l: &Layout) -> usize {
        2 * (Faces::len(l) * 8 + ALIGN_SLACK)
    }

    fn carve(arena: &mut Arena, l: &Layout) -> Faces<'a> {
        // SAFETY: the arena is this rank's alone and outlives the run.
        unsafe {
            Faces {
                send: take(arena, Faces::len(l)),
                recv: take(arena, Faces::len(l)),
            }
        }
    }
}

/// `copy_faces`: fills the two ghost layers of `u` across every face of this rank's
/// cells that has a neighbour cell, one message to and from each neighbour rank per
/// direction (every cell's face in cell order).
pub fn copy_faces<C: Comm + ?Sized>(
    comm: &mut C,
    l: &Layout,
    g: &Grid,
    u: Shared<f64>,
    faces: &mut Faces,
) -> Result<(), Error> {
    if l.q == 1 {
        return Ok(());
    }
    for axis in 0..3 {
        for up in [true, false] {
            // The layers next to the face this direction leaves through, and the ghost
            // layers the opposite neighbour fills.
            let layers = |c: usize, sending: bool| -> Option<[Range<usize>; 3]> {
                let coord = l.coords(c)[axis];
                let mut ranges = l.cell(c).ranges;
                let r = ranges[axis].clone();
                ranges[axis] = match (up, sending) {
                    (true, true) if coord + 1 < l.q => r.end - 2..r.end,
                    (false, true) if coord > 0 => r.start..r.start + 2,
                    (true, false) if coord > 0 => r.start - 2..r.start,
                    (false, false) if coord + 1 < l.q => r.end..r.end + 2,
                    _ => return None,
                };
                Some(ranges)
            };
            let mut sent = 0;
            for c in 0..l.q {
                if let Some(ranges) = layers(c, true) {
                    each_row(g, &ranges, |first, len| {
                        // SAFETY: this rank's arena, used by this thread alone.
                        let from = unsafe { u.slice(5 * first..5 * (first + len)) };
                        faces.send[sent..sent + 5 * len].copy_from_slice(from);
                        sent += 5 * len;
                    });
                }
            }
            let mut want = 0;
            for c in 0..l.q {
                if let Some(ranges) = layers(c, false) {
                    each_row(g, &ranges, |_, len| want += 5 * len);
                }
            }
            let tag = TAG_FACES + 2 * axis as u32 + u32::from(up);
            let got = comm.sendrecv(
                l.neighbour(axis, up),
                tag,
                bytes(&faces.send[..sent]),
                l.neighbour(axis, !up),
                tag,
                bytes_mut(&mut faces.recv[..want]),
            )?;
            if got != 8 * want {
                return Err(Error("cfd-ghost-faces"));
            }
            let mut at = 0;
            for c in 0..l.q {
                if let Some(ranges) = layers(c, false) {
                    each_row(g, &ranges, |first, len| {
                        // SAFETY: as above.
                        let to = unsafe { u.slice_mut(5 * first..5 * (first + len)) };
                        to.copy_from_slice(&faces.recv[at..at + 5 * len]);
                        at += 5 * len;
                    });
                }
            }
        }
    }
    Ok(())
}

/// `compute_rhs` over this rank's cells: the derived scalars on each cell and one
/// point beyond it, then the right-hand side of the cell's points (the shared-memory
/// per-plane kernels, on the cell's box). `u`'s ghost faces must be current.
pub fn compute_rhs(l: &Layout, g: &Grid, c: &Constants, f: &Fields) {
    for cell in 0..l.q {
        let ranges = l.cell(cell).ranges;
        let wide = ranges
            .clone()
            .map(|r| r.start.saturating_sub(1)..(r.end + 1).min(g.n));
        for k in wide[2].clone() {
            // SAFETY: this rank's arena, used by this thread alone.
            unsafe { cfd::derived_box(g, c, f, k, wide[1].clone(), wide[0].clone()) };
        }
    }
    for cell in 0..l.q {
        let ranges = l.cell(cell).ranges;
        for k in ranges[2].clone() {
            // SAFETY: as above.
            unsafe { cfd::rhs_box(g, c, f, k, ranges[1].clone(), ranges[0].clone()) };
        }
    }
}

/// Tags of the solves' carried rows (plus the axis).
const TAG_FORWARD: u32 = 511;
const TAG_BACK: u32 = 521;

/// The rows a pipelined line solve carries between cells: in and out, forward and
/// back, `forward` and `back` `f64`s per line.
struct Carried<'a> {
    forward: [&'a mut [f64]; 2],
    back: [&'a mut [f64]; 2],
    per_line: (usize, usize),
}

impl<'a> Carried<'a> {
    fn lens(l: &Layout, (forward, back): (usize, usize)) -> (usize, usize) {
        let lines = l.max_span() * l.max_span();
        (lines * forward, lines * back)
    }

    fn bytes(l: &Layout, per_line: (usize, usize)) -> usize {
        let (forward, back) = Carried::lens(l, per_line);
        2 * (forward + back) * 8 + 4 * ALIGN_SLACK
    }

    fn carve(arena: &mut Arena, l: &Layout, per_line: (usize, usize)) -> Carried<'a> {
        let (forward, back) = Carried::lens(l, per_line);
        // SAFETY: the arena is this rank's alone and outlives the run.
        unsafe {
            Carried {
                forward: [take(arena, forward), take(arena, forward)],
                back: [take(arena, back), take(arena, back)],
                per_line,
            }
        }
    }
}

/// A line solve along `axis` pipelined over the cells (`x_solve`'s stages): `q` stages
/// forward, at stage `s` every rank running `forward(cell, carried_in, out)` on its
/// cell at coordinate `s` with the rows the rank below left in `out` at stage `s - 1`
/// (none at stage 0); then `q` stages back, `backward` likewise with the rows the rank
/// above left. Each stage's rows go up (down) as the next stage's come in, in one
/// `sendrecv`, so no rank waits on a send.
fn pipeline<C: Comm + ?Sized>(
    comm: &mut C,
    l: &Layout,
    axis: usize,
    carried: &mut Carried,
    mut forward: impl FnMut(usize, Option<&[f64]>, &mut [f64]),
    mut backward: impl FnMut(usize, Option<&[f64]>, &mut [f64]),
) -> Result<(), Error> {
    let (up, down) = (l.neighbour(axis, true), l.neighbour(axis, false));
    let lines = |cell: usize| l.cell(cell).lines(axis, l.n);
    let tag = axis as u32;
    let (per_forward, per_back) = carried.per_line;
    let stages = [
        (true, TAG_FORWARD + tag, up, down, per_forward),
        (false, TAG_BACK + tag, down, up, per_back),
    ];
    for (ahead, tag, to, from_rank, per_line) in stages {
        let [into, out] = if ahead {
            &mut carried.forward
        } else {
            &mut carried.back
        };
        let mut sent = 0;
        for step in 0..l.q {
            let coord = if ahead { step } else { l.q - 1 - step };
            let cell = l.cell_at(axis, coord);
            let want = lines(cell) * per_line;
            if step > 0 {
                let got = comm.sendrecv(
                    to,
                    tag,
                    bytes(&out[..sent]),
                    from_rank,
                    tag,
                    bytes_mut(&mut into[..want]),
                )?;
                if got != 8 * want {
                    return Err(Error("cfd-carried-rows"));
                }
            }
            let carried_in = (step > 0).then_some(&into[..want]);
            if ahead {
                forward(cell, carried_in, &mut out[..want]);
            } else {
                backward(cell, carried_in, &mut out[..want]);
            }
            sent = want;
        }
    }
    Ok(())
}

/// What a pseudo-application's solver keeps: `f64`s of the shared-memory form's
/// per-thread work arrays, and per point kept from the forward stages for the back
/// substitution, and per line carried forward and back between cells.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub work: usize,
    pub kept: usize,
    pub forward: usize,
    pub back: usize,
}

/// One MPI pseudo-application at one class: grid points a side, steps, time step,
/// whether it needs the speed of sound, its solver's shape, and its Mop/s and
/// verification.
pub struct Problem {
    pub class: Class,
    pub mops: fn(Class, f64) -> f64,
    pub verify: fn(Class, &[f64; 5], &[f64; 5]) -> bool,
    pub n: usize,
    pub niter: usize,
    pub dt: f64,
    pub with_speed: bool,
    pub shape: Shape,
}

/// One rank's solver memory.
pub struct Solver<'a> {
    /// The shared-memory form's work arrays.
    work: &'a mut [f64],
    /// What each cell's forward stages keep for its back substitution (laid out as the
    /// kernel visits its points).
    kept: Shared<f64>,
    /// Rows carried between cells.
    carried: Carried<'a>,
    /// `f64`s of `kept` per cell.
    per_cell: usize,
}

impl<'a> Solver<'a> {
    fn lens(l: &Layout, shape: Shape) -> [usize; 2] {
        let side = l.max_span();
        [shape.work, l.q * side * side * side * shape.kept]
    }

    fn bytes(l: &Layout, shape: Shape) -> usize {
        let [work, kept] = Solver::lens(l, shape);
        (work + kept) * 8 + 2 * ALIGN_SLACK + Carried::bytes(l, (shape.forward, shape.back))
    }

    fn carve(arena: &mut Arena, l: &Layout, shape: Shape) -> Solver<'a> {
        let [work, kept] = Solver::lens(l, shape);
        Solver {
            // SAFETY: the arena is this rank's alone and outlives the run.
            work: unsafe { take(arena, work) },
            kept: arena.alloc(kept),
            carried: Carried::carve(arena, l, (shape.forward, shape.back)),
            per_cell: kept / l.q,
        }
    }
}

/// A line solve along `axis` over this rank's cells, pipelined across the ranks:
/// `forward(cell, work, kept, carried_in, out)` eliminates a cell's lines (keeping
/// what the back substitution needs in `kept`, leaving the rows to carry in `out`),
/// `backward(cell, kept, carried_in, out)` substitutes back.
pub fn solve<C: Comm + ?Sized>(
    comm: &mut C,
    l: &Layout,
    s: &mut Solver,
    axis: usize,
    mut forward: impl FnMut(usize, &mut [f64], &mut [f64], Option<&[f64]>, &mut [f64]),
    mut backward: impl FnMut(usize, &[f64], Option<&[f64]>, &mut [f64]),
) -> Result<(), Error> {
    let Solver {
        work,
        kept,
        carried,
        per_cell,
    } = s;
    let (per_cell, kept) = (*per_cell, *kept);
    let cell_kept = |cell: usize| cell * per_cell..(cell + 1) * per_cell;
    pipeline(
        comm,
        l,
        axis,
        carried,
        |cell, carried, out| {
            // SAFETY: this rank's arena, used by this thread alone; the stages run one
            // at a time.
            let kept = unsafe { kept.slice_mut(cell_kept(cell)) };
            forward(cell, work, kept, carried, out)
        },
        |cell, carried, out| {
            // SAFETY: as above.
            let kept = unsafe { kept.slice(cell_kept(cell)) };
            backward(cell, kept, carried, out)
        },
    )
}

/// Copies the rows carried in for lines `lines` (`per_line` values each) into `carry`,
/// or zeroes it when nothing was carried (the first cell of a line).
pub fn carry_in(carry: &mut [f64], carried: Option<&[f64]>, lines: Range<usize>, per_line: usize) {
    match carried {
        Some(rows) => carry.copy_from_slice(&rows[lines.start * per_line..lines.end * per_line]),
        None => carry.fill(0.0),
    }
}

/// Arena bytes of one rank of `problem` on `ranks`.
pub fn heap_bytes(problem: &Problem, ranks: usize) -> usize {
    let q = cells_a_side(problem.n, ranks).unwrap_or(1);
    let l = Layout::new(problem.n, 0, q);
    run_bytes(problem.n, problem.with_speed, ranks) + Solver::bytes(&l, problem.shape)
}

/// Runs `problem` with the time step `adi`: the final state, the slowest rank's
/// seconds, and the residual and error norms.
pub fn simulate<'a, C: Comm + ?Sized>(
    comm: &mut C,
    arena: &mut Arena,
    problem: &Problem,
    mut adi: impl FnMut(&mut C, &mut Run, &mut Solver) -> Result<(), Error>,
) -> Result<(Run<'a>, f64, [f64; 5], [f64; 5]), Error> {
    let q = cells_a_side(problem.n, comm.size()).ok_or(Error("cfd-ranks"))?;
    let p = problem;
    let mut run = Run::carve(arena, p.n, p.dt, p.with_speed, comm.rank(), q);
    let mut solver = Solver::carve(arena, &run.l, p.shape);
    let (seconds, xcr, xce) = drive(comm, &mut run, p.niter, |comm, run| {
        adi(comm, run, &mut solver)
    })?;
    Ok((run, seconds, xcr, xce))
}

/// Runs `problem` with the time step `adi` (see [`simulate`]); every rank returns
/// the same outcome.
pub fn run<C: Comm + ?Sized>(
    comm: &mut C,
    arena: &mut Arena,
    problem: &Problem,
    adi: impl FnMut(&mut C, &mut Run, &mut Solver) -> Result<(), Error>,
) -> Result<Outcome, Error> {
    let (_, seconds, xcr, xce) = simulate(comm, arena, problem, adi)?;
    Ok(Outcome {
        seconds,
        mops: (problem.mops)(problem.class, seconds),
        verified: (problem.verify)(problem.class, &xcr, &xce),
        values: cfd::values(&xcr, &xce),
    })
}

/// A pseudo-application's MPI run: its fields, layout and exchange buffers.
pub struct Run<'a> {
    pub l: Layout,
    pub g: Grid,
    pub c: Constants,
    pub f: Fields,
    pub faces: Faces<'a>,
}

/// Arena bytes of [`Run::carve`] for a grid of `n` on `ranks` (a square).
pub fn run_bytes(n: usize, with_speed: bool, ranks: usize) -> usize {
    let q = cells_a_side(n, ranks).unwrap_or(1);
    let l = Layout::new(n, 0, q);
    Fields::bytes(&Grid::new(n), with_speed) + Faces::bytes(&l)
}

impl<'a> Run<'a> {
    /// Carves the fields and buffers and sets up the forcing (whole, on every rank).
    pub fn carve(
        arena: &mut Arena,
        n: usize,
        dt: f64,
        with_speed: bool,
        rank: usize,
        q: usize,
    ) -> Run<'a> {
        let g = Grid::new(n);
        let c = Constants::new(n, dt);
        let f = Fields::carve(arena, &g, with_speed);
        let l = Layout::new(n, rank, q);
        let faces = Faces::carve(arena, &l);
        for k in 0..n {
            // SAFETY: this rank's arena, used by this thread alone.
            let plane = unsafe { f.forcing.slice_mut(g.plane_range(k, 5)) };
            cfd::exact_rhs_plane(&g, &c, plane, k);
        }
        for j in g.interior() {
            // SAFETY: as above.
            unsafe { cfd::exact_rhs_rows(&g, &c, f.forcing, j) };
        }
        Run { l, g, c, f, faces }
    }

    /// `initialize`, on the whole grid (ghosts included).
    pub fn initialize(&self) {
        for k in 0..self.g.n {
            // SAFETY: this rank's arena, used by this thread alone.
            let plane = unsafe { self.f.u.slice_mut(self.g.plane_range(k, 5)) };
            cfd::initialize_plane(&self.g, &self.c, plane, k);
        }
    }

    /// The ghost faces, then the right-hand side of this rank's cells.
    pub fn rhs<C: Comm + ?Sized>(&mut self, comm: &mut C) -> Result<(), Error> {
        copy_faces(comm, &self.l, &self.g, self.f.u, &mut self.faces)?;
        compute_rhs(&self.l, &self.g, &self.c, &self.f);
        Ok(())
    }

    /// The residual norms (`xcr`) and error norms (`xce`), as `verify`: sums over
    /// every rank's cells.
    pub fn norms<C: Comm + ?Sized>(&mut self, comm: &mut C) -> Result<([f64; 5], [f64; 5]), Error> {
        let (g, n) = (self.g, self.g.n);
        let g = &g;
        let mut sums = [0.0; 10];
        for cell in 0..self.l.q {
            let ranges = self.l.cell(cell).ranges;
            for k in ranges[2].clone() {
                // SAFETY: this rank's arena, used by this thread alone.
                let u = unsafe { self.f.u.slice(g.plane_range(k, 5)) };
                let part =
                    cfd::error_sums_box(g, &self.c, u, k, ranges[1].clone(), ranges[0].clone());
                for m in 0..5 {
                    sums[5 + m] += part[m];
                }
            }
        }
        self.rhs(comm)?;
        for cell in 0..self.l.q {
            let inner = self.l.cell(cell).interior(n);
            for k in inner[2].clone() {
                // SAFETY: as above.
                let rhs = unsafe { self.f.rhs.slice(g.plane_range(k, 5)) };
                let part = cfd::rhs_sums_box(g, rhs, inner[1].clone(), inner[0].clone());
                for m in 0..5 {
                    sums[m] += part[m];
                }
            }
        }
        comm.allreduce_f64(&mut sums, Op::Sum)?;
        let xcr = cfd::rms(g, core::array::from_fn(|m| sums[m])).map(|r| r / self.c.dt);
        let xce = cfd::rms(g, core::array::from_fn(|m| sums[5 + m]));
        Ok((xcr, xce))
    }
}

/// Runs a pseudo-application as the reference's main program: one untimed step
/// (`adi`), the initial field again, then `niter` timed steps. Returns the slowest
/// rank's seconds and the residual and error norms.
pub fn drive<C: Comm + ?Sized>(
    comm: &mut C,
    run: &mut Run,
    niter: usize,
    mut adi: impl FnMut(&mut C, &mut Run) -> Result<(), Error>,
) -> Result<(f64, [f64; 5], [f64; 5]), Error> {
    run.initialize();
    adi(comm, run)?;
    run.initialize();
    comm.barrier()?;
    let start = comm.seconds();
    for step in 0..niter {
        adi(comm, run)?;
        comm.progress(step + 1, niter);
    }
    let seconds = max_seconds(comm, comm.seconds() - start)?;
    let (xcr, xce) = run.norms(comm)?;
    Ok((seconds, xcr, xce))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::super::host::{self, ThreadComm};
    use super::*;
    use crate::{Kernel, Spec};

    /// Asserts that `spec`'s MPI form verifies on each of `ranks` within its heap,
    /// every rank alike.
    fn verifies_alike(spec: Spec, ranks: &[usize]) {
        for &ranks in ranks {
            let bytes = super::super::heap_bytes(spec, ranks);
            let outcomes = host::run_ranks(ranks, bytes, |comm, arena| {
                let outcome = super::super::run(spec, comm, arena).unwrap();
                assert!(arena.used() <= bytes, "{} of {bytes}", arena.used());
                outcome
            });
            for outcome in &outcomes {
                assert!(outcome.verified, "{spec} on {ranks}: {outcome:?}");
                assert_eq!(outcome.values, outcomes[0].values);
            }
        }
    }

    /// Asserts that every point of `u` at the end of `simulate` (class S) on each of
    /// `ranks` has the same bits as on one rank; `bytes(ranks)` is a rank's heap.
    fn same_bits_as_one_rank<'a>(
        ranks: &[usize],
        bytes: impl Fn(usize) -> usize,
        simulate: impl Fn(&mut ThreadComm, &mut Arena) -> Run<'a> + Sync,
    ) {
        let one = final_field(1, bytes(1), &simulate);
        assert_eq!(one.len(), 12 * 12 * 12);
        for &ranks in ranks {
            assert!(
                final_field(ranks, bytes(ranks), &simulate) == one,
                "{ranks} ranks"
            );
        }
    }

    /// Every point of `u` at the end of `simulate` on `ranks` (each with `bytes`), from
    /// the rank owning it: (storage index, the five values' bits), sorted.
    fn final_field<'a>(
        ranks: usize,
        bytes: usize,
        simulate: &(impl Fn(&mut ThreadComm, &mut Arena) -> Run<'a> + Sync),
    ) -> Vec<(usize, [u64; 5])> {
        let mut points: Vec<(usize, [u64; 5])> = host::run_ranks(ranks, bytes, |comm, arena| {
            let run = simulate(comm, arena);
            let mut mine = Vec::new();
            for cell in 0..run.l.q {
                each_row(&run.g, &run.l.cell(cell).ranges, |first, len| {
                    for at in first..first + len {
                        // SAFETY: the run is over; this thread's arena.
                        let u = unsafe { run.f.u.slice(5 * at..5 * at + 5) };
                        mine.push((at, core::array::from_fn(|m| u[m].to_bits())));
                    }
                });
            }
            mine
        })
        .concat();
        points.sort_unstable_by_key(|p| p.0);
        points
    }

    const SP_BT: [Kernel; 2] = [Kernel::Sp, Kernel::Bt];

    #[test]
    fn sp_and_bt_verify_at_s_on_1_4_and_9_ranks_every_rank_alike() {
        for kernel in SP_BT {
            verifies_alike(
                Spec {
                    kernel,
                    class: Class::S,
                },
                &[1, 4, 9],
            );
        }
    }

    #[test]
    fn sp_and_bt_verify_at_w_on_4_ranks() {
        for kernel in SP_BT {
            verifies_alike(
                Spec {
                    kernel,
                    class: Class::W,
                },
                &[4],
            );
        }
    }

    #[test]
    fn sp_and_bt_on_one_rank_give_the_shared_memory_forms_norms_bit_for_bit() {
        for kernel in SP_BT {
            let spec = Spec {
                kernel,
                class: Class::S,
            };
            let bytes = super::super::heap_bytes(spec, 1);
            let mpi = host::run_ranks(1, bytes, |comm, arena| {
                super::super::run(spec, comm, arena).unwrap()
            });
            assert_eq!(mpi[0].values, crate::host::run(spec, 1).values, "{spec}");
        }
    }

    #[test]
    fn sp_and_bt_give_every_point_the_same_bits_on_4_and_9_ranks_as_on_one() {
        use super::super::{bt, sp};
        same_bits_as_one_rank(
            &[4, 9],
            |ranks| sp::heap_bytes(Class::S, ranks),
            |comm, arena| {
                simulate(comm, arena, &sp::problem(Class::S), sp::adi)
                    .unwrap()
                    .0
            },
        );
        same_bits_as_one_rank(
            &[4, 9],
            |ranks| bt::heap_bytes(Class::S, ranks),
            |comm, arena| {
                simulate(comm, arena, &bt::problem(Class::S), bt::adi)
                    .unwrap()
                    .0
            },
        );
    }

    #[test]
    fn every_rank_owns_one_cell_of_every_slab_and_the_cells_tile_the_cube() {
        for q in 1..=4 {
            let mut owners = [[[usize::MAX; 4]; 4]; 4];
            for rank in 0..q * q {
                let l = Layout::new(12, rank, q);
                for c in 0..q {
                    let [x, y, z] = l.coords(c);
                    assert_eq!(owners[x][y][z], usize::MAX, "cell owned twice");
                    owners[x][y][z] = rank;
                    assert_eq!(l.owner([x, y, z]), rank);
                }
                for axis in 0..3 {
                    let mut seen = [false; 4];
                    for c in 0..q {
                        seen[l.coords(c)[axis]] = true;
                    }
                    assert!(
                        seen[..q].iter().all(|&s| s),
                        "q={q} rank {rank} axis {axis}"
                    );
                    // The neighbour of every cell along the axis is on one rank.
                    for c in 0..q {
                        let mut at = l.coords(c);
                        if at[axis] + 1 < q {
                            at[axis] += 1;
                            assert_eq!(l.owner(at), l.neighbour(axis, true));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn spans_cover_the_axis_with_the_longer_cells_first() {
        let l = Layout::new(36, 0, 5);
        let spans: [Range<usize>; 5] = core::array::from_fn(|x| l.span(x));
        assert_eq!(spans[0], 0..8);
        assert_eq!(spans[1], 8..15);
        assert_eq!(spans[4], 29..36);
        assert_eq!(l.max_span(), 8);
        assert_eq!(cells_a_side(12, 4), Some(2));
        assert_eq!(cells_a_side(12, 36), Some(6));
        assert_eq!(cells_a_side(12, 49), None);
        assert_eq!(cells_a_side(12, 8), None);
    }
}
