//! BT on NPB3.3-MPI's multi-partition decomposition ([`super::cfd`]): `q * q` ranks,
//! `q` cells each. A step is `copy_faces` and the right-hand side of every cell, the
//! x, y and z solves, then `add`.
//!
//! A solve along an axis is pipelined over the cells as SP's ([`super::cfd::solve`]):
//! at each forward stage a rank eliminates the lines of one cell, having received from
//! the rank below each line's last finished row (its `cc` block and right-hand side,
//! as `x_solve`'s `out_buffer`); back substitution returns each line's first solved
//! right-hand side down. The blocks are the shared-memory BT's ([`bt::blocks`], on the
//! cell's span of the line, with the Jacobians one point beyond it from the ghost
//! faces) and each row gets the shared-memory elimination's operations in the same
//! order ([`bt::eliminate_row`], [`bt::substitute_row`]), so every point computes what
//! the reference computes.

use super::cfd::{self as mpicfd, Cell, Problem, Run, Shape, Solver};
use super::{Comm, Error};
use crate::bt::{self, Axis, Block, Point, Work};
use crate::cfd::Grid;
use crate::sp;
use crate::team::Arena;
use crate::{Class, Outcome};

/// Whether BT `class` runs on `ranks`: a square with cells of two points or more.
pub fn fits(class: Class, ranks: usize) -> bool {
    mpicfd::cells_a_side(bt::params(class).0, ranks).is_some()
}

/// Carried forward per line: the last finished row's `cc` block and right-hand side.
const FORWARD: usize = 25 + 5;
/// Carried back per line: the first solved right-hand side.
const BACK: usize = 5;
/// Kept per point for the back substitution: its `cc` block.
const KEPT: usize = 25;

/// BT `class` as an MPI problem.
pub(crate) fn problem(class: Class) -> Problem {
    let (n, niter, dt) = bt::params(class);
    Problem {
        class,
        mops: bt::mops,
        verify: bt::verify,
        n,
        niter,
        dt,
        with_speed: false,
        shape: Shape {
            work: bt::work_len(n),
            kept: KEPT,
            forward: FORWARD,
            back: BACK,
        },
    }
}

/// Arena bytes of one rank of BT `class` on `ranks`.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    mpicfd::heap_bytes(&problem(class), ranks)
}

/// Calls `each(first, stride)` for the lines a solve along `axis` works on in `cell`
/// (interior across the axis): the storage index of the line's position 0 and the
/// distance between positions.
fn each_line(g: &Grid, cell: &Cell, axis: usize, mut each: impl FnMut(usize, usize)) {
    let r = cell.lines_across(axis, g.n);
    let (outer, inner, stride) = match axis {
        0 => (&r[2], &r[1], 1),
        1 => (&r[2], &r[0], g.ip),
        _ => (&r[1], &r[0], g.plane()),
    };
    for o in outer.clone() {
        for i in inner.clone() {
            let first = match axis {
                0 => g.at(0, i, o),
                1 => g.at(i, 0, o),
                _ => g.at(i, o, 0),
            };
            each(first, stride);
        }
    }
}

/// A block stored as 25 values.
fn block(values: &[f64]) -> &Block {
    values[..KEPT]
        .as_chunks::<5>()
        .0
        .try_into()
        .expect("25 values are a block")
}

/// The forward stage of a solve along `axis` on this rank's cell `cell`: each line's
/// blocks, then its elimination from the row carried in (none for the first cell),
/// leaving its last row in `out`.
///
/// # Safety
/// The run's arena is this rank's alone (one thread).
unsafe fn forward_cell(
    run: &Run,
    axis: usize,
    cell: usize,
    work: &mut [f64],
    kept: &mut [f64],
    carried: Option<&[f64]>,
    out: &mut [f64],
) {
    let (g, n, f) = (&run.g, run.g.n, &run.f);
    let the_cell = run.l.cell(cell);
    let span = the_cell.ranges[axis].clone();
    let mut line = 0;
    each_line(g, &the_cell, axis, |first, stride| {
        let at = |p: usize| first + p * stride;
        let mut w = Work::carve(n, work);
        for p in span.clone() {
            let a = at(p);
            // SAFETY: the caller's contract.
            w.rhs[p - span.start].copy_from_slice(unsafe { f.rhs.slice(5 * a..5 * a + 5) });
        }
        // SAFETY: the caller's contract.
        let point = |p: usize| unsafe { Point::at(f, at(p)) };
        bt::blocks(&run.c, Axis::of(axis), n, span.clone(), point, &mut w);
        let incoming = carried.map(|rows| {
            let row = &rows[line * FORWARD..(line + 1) * FORWARD];
            (*block(row), core::array::from_fn(|m| row[KEPT + m]))
        });
        for local in 0..span.len() {
            let (cc_before, cc_at) = w.cc.split_at_mut(local);
            let (r_before, r_at) = w.rhs.split_at_mut(local);
            let above = match local {
                0 => incoming.as_ref().map(|(cc, r)| (cc, r)),
                _ => Some((&cc_before[local - 1], &r_before[local - 1])),
            };
            let blocks = (&w.aa[local], &mut w.bb[local], &mut cc_at[0]);
            bt::eliminate_row(span.start + local, n, blocks, &mut r_at[0], above);
            let keep = ((line * span.len()) + local) * KEPT;
            kept[keep..keep + KEPT].copy_from_slice(cc_at[0].as_flattened());
        }
        for p in span.clone() {
            let a = at(p);
            // SAFETY: the caller's contract.
            unsafe { f.rhs.slice_mut(5 * a..5 * a + 5) }.copy_from_slice(&w.rhs[p - span.start]);
        }
        let last = span.len() - 1;
        let row = &mut out[line * FORWARD..(line + 1) * FORWARD];
        row[..KEPT].copy_from_slice(w.cc[last].as_flattened());
        row[KEPT..].copy_from_slice(&w.rhs[last]);
        line += 1;
    });
}

/// Back substitution of this rank's cell `cell` along `axis` from the solved rows
/// carried in (none for the last cell), leaving each line's first in `out`.
///
/// # Safety
/// As [`forward_cell`].
unsafe fn backward_cell(
    run: &Run,
    axis: usize,
    cell: usize,
    kept: &[f64],
    carried: Option<&[f64]>,
    out: &mut [f64],
) {
    let (g, n) = (&run.g, run.g.n);
    let the_cell = run.l.cell(cell);
    let span = the_cell.ranges[axis].clone();
    let mut line = 0;
    each_line(g, &the_cell, axis, |first, stride| {
        let next = &mut out[line * BACK..(line + 1) * BACK];
        mpicfd::carry_in(next, carried, line..line + 1, BACK);
        for p in span.clone().rev() {
            let a = first + p * stride;
            // SAFETY: the caller's contract.
            let x = &mut unsafe { sp::rows5(&run.f.rhs, 5 * a..5 * a + 5) }[0];
            if p + 1 < n {
                let keep = ((line * span.len()) + p - span.start) * KEPT;
                let below: [f64; 5] = core::array::from_fn(|m| next[m]);
                bt::substitute_row(block(&kept[keep..]), x, &below);
            }
            next.copy_from_slice(x);
        }
        line += 1;
    });
}

/// A solve along `axis`, pipelined over the cells.
fn solve<C: Comm + ?Sized>(
    comm: &mut C,
    run: &Run,
    s: &mut Solver,
    axis: usize,
) -> Result<(), Error> {
    mpicfd::solve(
        comm,
        &run.l,
        s,
        axis,
        |cell, work, kept, carried, out| {
            // SAFETY: this rank's arena, used by this thread alone.
            unsafe { forward_cell(run, axis, cell, work, kept, carried, out) }
        },
        |cell, kept, carried, out| {
            // SAFETY: as above.
            unsafe { backward_cell(run, axis, cell, kept, carried, out) }
        },
    )
}

/// One time step (`adi`).
pub(crate) fn adi<C: Comm + ?Sized>(
    comm: &mut C,
    run: &mut Run,
    s: &mut Solver,
) -> Result<(), Error> {
    run.rhs(comm)?;
    for axis in 0..3 {
        solve(comm, run, s, axis)?;
    }
    // `add` on the interior points of this rank's cells.
    let g = &run.g;
    for cell in 0..run.l.q {
        mpicfd::each_row(g, &run.l.cell(cell).interior(g.n), |first, len| {
            let range = 5 * first..5 * (first + len);
            // SAFETY: this rank's arena, used by this thread alone.
            let (u, rhs) = unsafe { (run.f.u.slice_mut(range.clone()), run.f.rhs.slice(range)) };
            for (u, r) in u.iter_mut().zip(rhs) {
                *u += r;
            }
        });
    }
    Ok(())
}

/// Runs this rank's part of BT `class` (on a square number of ranks, see [`fits`]).
pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    mpicfd::run(comm, arena, &problem(class), adi)
}
