//! SP on NPB3.3-MPI's multi-partition decomposition ([`super::cfd`]): `q * q` ranks,
//! `q` cells each. A step is `copy_faces` and the right-hand side of every cell, then
//! `txinvr`, the x solves and `ninvr`, the y solves and `pinvr`, the z solves and
//! `tzetar` with `add`, each pointwise part cell by cell.
//!
//! A solve along an axis runs in `q` stages forward then `q` back: at stage `s` each
//! rank eliminates the lines of its cell at coordinate `s` along the axis, having
//! received from the rank below the last two finished rows of every line (the three
//! factors' two upper coefficients and the right-hand side, as `x_solve`'s
//! `lhs`/`rhs` pieces); back substitution returns each line's first two solved rows
//! down. Each cell's coefficients come from the shared-memory SP ([`sp::factors`], on
//! the cell's span of positions), and the elimination visits the rows of a line in
//! order, applying to each exactly the shared-memory Thomas algorithm's operations
//! (the two eliminations by the rows above, then its scaling), so every point gets the
//! reference's arithmetic; the per-point products (`txinvr`, `ninvr`, `pinvr`,
//! `tzetar`) are the shared-memory ones on the cell's box.

// Statements are written as the reference's (`a = a - b * c`, indexed loops over the
// five components) so that each one's operation order can be checked against it.
#![allow(clippy::assign_op_pattern, clippy::needless_range_loop)]

use core::ops::Range;

use super::cfd::{self as mpicfd, Problem, Run, Shape, Solver};
use super::{Comm, Error};
use crate::sp::{self, Direction, Lines, Scalars, Work};
use crate::team::{Arena, Shared};
use crate::{Class, Outcome};

/// Whether SP `class` runs on `ranks`: a square with cells of two points or more.
pub fn fits(class: Class, ranks: usize) -> bool {
    mpicfd::cells_a_side(sp::params(class).0, ranks).is_some()
}

/// `f64`s of one finished row carried forward: each factor's two upper coefficients,
/// then the right-hand side.
const ROW: usize = 11;
/// Carried forward per line: the two last finished rows.
const FORWARD: usize = 2 * ROW;
/// Carried back per line: the two first solved right-hand sides.
const BACK: usize = 10;
/// Kept per point for the back substitution: each factor's two upper coefficients.
const KEPT: usize = 6;
/// The right-hand side components each factor solves (`lhs`, `lhsp`, `lhsm`).
const COMPONENTS: [Range<usize>; 3] = [0..3, 3..4, 4..5];

/// SP `class` as an MPI problem.
pub(crate) fn problem(class: Class) -> Problem {
    let (n, niter, dt) = sp::params(class);
    Problem {
        class,
        mops: sp::mops,
        verify: sp::verify,
        n,
        niter,
        dt,
        with_speed: true,
        shape: Shape {
            work: sp::work_len(n),
            kept: KEPT,
            forward: FORWARD,
            back: BACK,
        },
    }
}

/// Arena bytes of one rank of SP `class` on `ranks`.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    mpicfd::heap_bytes(&problem(class), ranks)
}

/// Calls `each(lines, line)` for the sets of lines a solve along `axis` works on in
/// this rank's cell `cell` (interior across the axis; the shared-memory SP's sets, cut
/// to the cell), `line` the index of the set's first line among the cell's.
fn each_set(run: &Run, cell: usize, axis: usize, mut each: impl FnMut(Lines, usize)) {
    let g = &run.g;
    let r = run.l.cell(cell).lines_across(axis, g.n);
    let mut line = 0;
    let mut set = |first: usize, stride: usize, count: usize| {
        each(
            Lines {
                first,
                stride,
                count,
            },
            line,
        );
        line += count;
    };
    match axis {
        0 => {
            for k in r[2].clone() {
                for j in r[1].clone() {
                    set(g.at(0, j, k), 1, 1);
                }
            }
        }
        1 => {
            for k in r[2].clone() {
                set(g.at(r[0].start, 0, k), g.ip, r[0].len());
            }
        }
        _ => {
            for j in r[1].clone() {
                set(g.at(r[0].start, j, 0), g.plane(), r[0].len());
            }
        }
    }
}

/// Forward elimination of row `p` (of `n`) of one line: `x` its three factors' rows,
/// `r` its right-hand side, `carry` the line's two previous finished rows (replaced by
/// the last two). The Thomas algorithm's operations on this row, in its order: the
/// elimination by row `p - 2`, by row `p - 1`, then the scaling (the last row's
/// right-hand side alone).
#[inline(always)]
fn eliminate_row(p: usize, n: usize, x: [&mut [f64; 5]; 3], r: &mut [f64; 5], carry: &mut [f64]) {
    let (two_up, one_up) = carry.split_at(ROW);
    let mut finished = [0.0; ROW];
    for (factor, x) in x.into_iter().enumerate() {
        let (c3, c4) = (2 * factor, 2 * factor + 1);
        if p >= 2 {
            x[1] = x[1] - x[0] * two_up[c3];
            x[2] = x[2] - x[0] * two_up[c4];
            for m in COMPONENTS[factor].clone() {
                r[m] = r[m] - x[0] * two_up[6 + m];
            }
        }
        if p >= 1 {
            x[2] = x[2] - x[1] * one_up[c3];
            x[3] = x[3] - x[1] * one_up[c4];
            for m in COMPONENTS[factor].clone() {
                r[m] = r[m] - x[1] * one_up[6 + m];
            }
        }
        if p + 1 < n {
            let fac1 = 1.0 / x[2];
            x[3] = fac1 * x[3];
            x[4] = fac1 * x[4];
            for m in COMPONENTS[factor].clone() {
                r[m] = fac1 * r[m];
            }
        } else if factor == 0 {
            let fac2 = 1.0 / x[2];
            for m in COMPONENTS[factor].clone() {
                r[m] = fac2 * r[m];
            }
        } else {
            for m in COMPONENTS[factor].clone() {
                r[m] /= x[2];
            }
        }
        finished[c3] = x[3];
        finished[c4] = x[4];
    }
    finished[6..].copy_from_slice(r);
    carry.copy_within(ROW.., 0);
    carry[ROW..].copy_from_slice(&finished);
}

/// Back substitution of row `p` (of `n`) of one line: `kept` its factors' upper
/// coefficients, `carry` the line's next two solved right-hand sides (replaced by
/// this one and the next).
#[inline(always)]
fn substitute_row(p: usize, n: usize, kept: &[f64], r: &mut [f64; 5], carry: &mut [f64]) {
    if p + 2 == n {
        for (factor, ms) in COMPONENTS.into_iter().enumerate() {
            for m in ms {
                r[m] -= kept[2 * factor] * carry[m];
            }
        }
    } else if p + 2 < n {
        for (factor, ms) in COMPONENTS.into_iter().enumerate() {
            for m in ms {
                r[m] = r[m] - kept[2 * factor] * carry[m] - kept[2 * factor + 1] * carry[5 + m];
            }
        }
    }
    carry.copy_within(..5, 5);
    carry[..5].copy_from_slice(r);
}

/// The stage of a solve along `axis` on this rank's cell `cell`: its factors, then
/// forward elimination of its lines from the rows carried in (none for the first
/// cell), leaving each line's last two rows in `out`.
///
/// # Safety
/// The run's arena is this rank's alone (one thread).
unsafe fn forward_cell(
    run: &Run,
    (axis, dir, vel): (usize, &Direction, Shared<f64>),
    cell: usize,
    work: &mut [f64],
    kept: &mut [f64],
    carried: Option<&[f64]>,
    out: &mut [f64],
) {
    let (g, n) = (&run.g, run.g.n);
    let span = run.l.cell(cell).ranges[axis].clone();
    each_set(run, cell, axis, |lines, line| {
        let nb = lines.count;
        let mut w = Work::carve(n, work);
        // SAFETY: the caller's contract.
        let x = unsafe { sp::factors(g, &run.c, &run.f, dir, vel, lines, span.clone(), &mut w) };
        let carry = &mut out[line * FORWARD..(line + nb) * FORWARD];
        mpicfd::carry_in(carry, carried, line..line + nb, FORWARD);
        for p in span.clone() {
            let local = p - span.start;
            // SAFETY: the caller's contract.
            let r = unsafe { sp::rows5(&run.f.rhs, lines.at5(p)) };
            for b in 0..nb {
                let row = local * nb + b;
                let (a, ap, am) = (&mut x.lhs[row], &mut x.lhsp[row], &mut x.lhsm[row]);
                let carry = &mut carry[b * FORWARD..(b + 1) * FORWARD];
                eliminate_row(p, n, [&mut *a, &mut *ap, &mut *am], &mut r[b], carry);
                let at = ((line + b) * span.len() + local) * KEPT;
                kept[at..at + KEPT].copy_from_slice(&[a[3], a[4], ap[3], ap[4], am[3], am[4]]);
            }
        }
    });
}

/// Back substitution of this rank's cell `cell` along `axis` from the solved rows
/// carried in (none for the last cell), leaving each line's first two in `out`.
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
    let n = run.g.n;
    let span = run.l.cell(cell).ranges[axis].clone();
    each_set(run, cell, axis, |lines, line| {
        let nb = lines.count;
        let carry = &mut out[line * BACK..(line + nb) * BACK];
        mpicfd::carry_in(carry, carried, line..line + nb, BACK);
        for p in span.clone().rev() {
            let local = p - span.start;
            // SAFETY: the caller's contract.
            let r = unsafe { sp::rows5(&run.f.rhs, lines.at5(p)) };
            for b in 0..nb {
                let at = ((line + b) * span.len() + local) * KEPT;
                let carry = &mut carry[b * BACK..(b + 1) * BACK];
                substitute_row(p, n, &kept[at..at + KEPT], &mut r[b], carry);
            }
        }
    });
}

/// A solve along `axis` (`vel` the velocity along it), pipelined over the cells.
fn solve<C: Comm + ?Sized>(
    comm: &mut C,
    run: &Run,
    s: &mut Solver,
    axis: usize,
    (dir, vel): (&Direction, Shared<f64>),
) -> Result<(), Error> {
    mpicfd::solve(
        comm,
        &run.l,
        s,
        axis,
        |cell, work, kept, carried, out| {
            // SAFETY: this rank's arena, used by this thread alone.
            unsafe { forward_cell(run, (axis, dir, vel), cell, work, kept, carried, out) }
        },
        |cell, kept, carried, out| {
            // SAFETY: as above.
            unsafe { backward_cell(run, axis, cell, kept, carried, out) }
        },
    )
}

/// Applies `op` to every interior plane `k` of each of this rank's cells with the
/// cell's interior rows and columns.
fn each_cell_plane(run: &Run, mut op: impl FnMut(usize, (Range<usize>, Range<usize>))) {
    for cell in 0..run.l.q {
        let [cols, rows, planes] = run.l.cell(cell).interior(run.g.n);
        for k in planes {
            op(k, (rows.clone(), cols.clone()));
        }
    }
}

/// One time step (`adi`).
pub(crate) fn adi<C: Comm + ?Sized>(
    comm: &mut C,
    run: &mut Run,
    s: &mut Solver,
) -> Result<(), Error> {
    run.rhs(comm)?;
    let (g, c, f) = (&run.g, &run.c, &run.f);
    // SAFETY: this rank's arena, used by this thread alone; the scalars are not
    // written until the next step's right-hand side.
    let scalars = unsafe { Scalars::of(f) };
    each_cell_plane(run, |k, box_| {
        // SAFETY: this rank's arena, used by this thread alone.
        unsafe { sp::txinvr(g, c, f, &scalars, k, box_) }
    });
    solve(comm, run, s, 0, (&Direction::x(c), f.us))?;
    each_cell_plane(run, |k, box_| {
        // SAFETY: as above.
        unsafe { sp::ninvr(g, c, f, k, box_) }
    });
    solve(comm, run, s, 1, (&Direction::y(c), f.vs))?;
    each_cell_plane(run, |k, box_| {
        // SAFETY: as above.
        unsafe { sp::pinvr(g, c, f, k, box_) }
    });
    solve(comm, run, s, 2, (&Direction::z(c), f.ws))?;
    each_cell_plane(run, |k, (rows, cols)| {
        for j in rows {
            // SAFETY: as above.
            unsafe { sp::tzetar_add(g, c, f, &scalars, (j, k), cols.clone()) };
        }
    });
    Ok(())
}

/// Runs this rank's part of SP `class` (on a square number of ranks, see [`fits`]).
pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    mpicfd::run(comm, arena, &problem(class), adi)
}
