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
//! the cell's span of positions), and the elimination makes the shared-memory Thomas
//! algorithm's passes (finish a row, then eliminate it from the two below, over all
//! the lines of a set), the rows carried in applied first, so every row gets the
//! reference's operations in its order; the per-point products (`txinvr`, `ninvr`,
//! `pinvr`, `tzetar`) are the shared-memory ones on the cell's box.

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
/// The factor solving each right-hand side component (`lhs` for 0-2, `lhsp`, `lhsm`).
const COMPONENT_FACTOR: [usize; 5] = [0, 0, 0, 1, 2];

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

/// A finished row of a line: each factor's two upper coefficients, then the
/// right-hand side (what the rows below it read, and what a cell carries forward).
#[derive(Clone, Copy)]
struct Finished([f64; ROW]);

impl Finished {
    fn of(x: [&[f64; 5]; 3], r: &[f64; 5]) -> Finished {
        let [a, ap, am] = x;
        Finished([
            a[3], a[4], ap[3], ap[4], am[3], am[4], r[0], r[1], r[2], r[3], r[4],
        ])
    }

    fn read(values: &[f64]) -> Finished {
        Finished(values[..ROW].try_into().expect("a row"))
    }
}

/// The three factors' rows of one point and its right-hand side.
type Point<'x> = ([&'x mut [f64; 5]; 3], &'x mut [f64; 5]);

/// The Thomas algorithm's elimination of row `p - 1` (finished, `above`) from row `p`:
/// `x[2] -= x[1] * above[3]`, `x[3] -= x[1] * above[4]`, `r -= x[1] * above_r`, per
/// factor and the components it solves.
#[inline(always)]
fn eliminate_from_next(above: &Finished, ([a, ap, am], r): Point) {
    next_factor::<0, 0, 3>(&above.0, a, r);
    next_factor::<1, 3, 4>(&above.0, ap, r);
    next_factor::<2, 4, 5>(&above.0, am, r);
}

#[inline(always)]
fn next_factor<const F: usize, const LO: usize, const HI: usize>(
    above: &[f64; ROW],
    x: &mut [f64; 5],
    r: &mut [f64; 5],
) {
    x[2] = x[2] - x[1] * above[2 * F];
    x[3] = x[3] - x[1] * above[2 * F + 1];
    for m in LO..HI {
        r[m] = r[m] - x[1] * above[6 + m];
    }
}

/// The elimination of row `p - 2` (finished, `above`) from row `p`: `x[1] -= x[0] *
/// above[3]`, `x[2] -= x[0] * above[4]`, `r -= x[0] * above_r`.
#[inline(always)]
fn eliminate_from_second(above: &Finished, ([a, ap, am], r): Point) {
    second_factor::<0, 0, 3>(&above.0, a, r);
    second_factor::<1, 3, 4>(&above.0, ap, r);
    second_factor::<2, 4, 5>(&above.0, am, r);
}

#[inline(always)]
fn second_factor<const F: usize, const LO: usize, const HI: usize>(
    above: &[f64; ROW],
    x: &mut [f64; 5],
    r: &mut [f64; 5],
) {
    x[1] = x[1] - x[0] * above[2 * F];
    x[2] = x[2] - x[0] * above[2 * F + 1];
    for m in LO..HI {
        r[m] = r[m] - x[0] * above[6 + m];
    }
}

/// The scaling that finishes row `p` of `n` (its eliminations done): by `1 / x[2]`;
/// the last row's right-hand side alone, as the reference.
#[inline(always)]
fn finish_row(p: usize, n: usize, ([a, ap, am], r): Point) {
    finish_factor::<0, 0, 3>(p, n, a, r);
    finish_factor::<1, 3, 4>(p, n, ap, r);
    finish_factor::<2, 4, 5>(p, n, am, r);
}

#[inline(always)]
fn finish_factor<const F: usize, const LO: usize, const HI: usize>(
    p: usize,
    n: usize,
    x: &mut [f64; 5],
    r: &mut [f64; 5],
) {
    if p + 1 < n {
        let fac1 = 1.0 / x[2];
        x[3] = fac1 * x[3];
        x[4] = fac1 * x[4];
        for m in LO..HI {
            r[m] = fac1 * r[m];
        }
    } else if F == 0 {
        let fac2 = 1.0 / x[2];
        for m in LO..HI {
            r[m] = fac2 * r[m];
        }
    } else {
        for m in LO..HI {
            r[m] /= x[2];
        }
    }
}

/// Back substitution of row `p` (of `n`) of one line: `kept` its factors' upper
/// coefficients, `carry` the line's next two solved right-hand sides (replaced by
/// this one and the next).
#[inline(always)]
fn substitute_row(
    p: usize,
    n: usize,
    kept: &[f64; KEPT],
    r: &mut [f64; 5],
    carry: &mut [f64; BACK],
) {
    if p + 2 == n {
        for m in 0..5 {
            let factor = COMPONENT_FACTOR[m];
            r[m] -= kept[2 * factor] * carry[m];
        }
    } else if p + 2 < n {
        for m in 0..5 {
            let factor = COMPONENT_FACTOR[m];
            r[m] = r[m] - kept[2 * factor] * carry[m] - kept[2 * factor + 1] * carry[5 + m];
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
    // `kept` holds position by position, line by line (as the lines are visited).
    let lines_in_cell = run.l.cell(cell).lines(axis, n);
    each_set(run, cell, axis, |lines, line| {
        let nb = lines.count;
        let mut w = Work::carve(n, work);
        // SAFETY: the caller's contract.
        let x = unsafe { sp::factors(g, &run.c, &run.f, dir, vel, lines, span.clone(), &mut w) };
        // SAFETY: the caller's contract; distinct positions are distinct points.
        let rhs = |p: usize| unsafe { sp::rows5(&run.f.rhs, lines.at5(p)) };
        let len = span.len();
        // As the shared-memory elimination, a pass per row: finish it, then eliminate
        // it from the two rows below, so that each pass over the lines reads only what
        // the pass before finished. The rows carried in start it.
        if let Some(rows) = carried {
            let (r0, r1) = (rhs(span.start), rhs(span.start + 1));
            for b in 0..nb {
                let at = (line + b) * FORWARD;
                let (two_up, one_up) = (
                    Finished::read(&rows[at..]),
                    Finished::read(&rows[at + ROW..]),
                );
                let (row0, row1) = (b, nb + b);
                let (l0, l1) = x.lhs.split_at_mut(row1);
                let (p0, p1) = x.lhsp.split_at_mut(row1);
                let (m0, m1) = x.lhsm.split_at_mut(row1);
                eliminate_from_second(
                    &two_up,
                    ([&mut l0[row0], &mut p0[row0], &mut m0[row0]], &mut r0[b]),
                );
                eliminate_from_next(
                    &one_up,
                    ([&mut l0[row0], &mut p0[row0], &mut m0[row0]], &mut r0[b]),
                );
                eliminate_from_second(&one_up, ([&mut l1[0], &mut p1[0], &mut m1[0]], &mut r1[b]));
            }
        }
        for local in 0..len {
            let p = span.start + local;
            let r0 = rhs(p);
            let (mut r1, mut r2) = (
                (local + 1 < len).then(|| rhs(p + 1)),
                (local + 2 < len).then(|| rhs(p + 2)),
            );
            let (l0, lr) = x.lhs[local * nb..].split_at_mut(nb);
            let (p0, pr) = x.lhsp[local * nb..].split_at_mut(nb);
            let (m0, mr) = x.lhsm[local * nb..].split_at_mut(nb);
            for b in 0..nb {
                let (a, ap, am) = (&mut l0[b], &mut p0[b], &mut m0[b]);
                finish_row(p, n, ([&mut *a, &mut *ap, &mut *am], &mut r0[b]));
                let done = Finished::of([&*a, &*ap, &*am], &r0[b]);
                let at = (local * lines_in_cell + line + b) * KEPT;
                kept[at..at + KEPT].copy_from_slice(&done.0[..KEPT]);
                if let Some(r1) = r1.as_deref_mut() {
                    let row1 = ([&mut lr[b], &mut pr[b], &mut mr[b]], &mut r1[b]);
                    eliminate_from_next(&done, row1);
                }
                if let Some(r2) = r2.as_deref_mut() {
                    let row2 = (
                        [&mut lr[nb + b], &mut pr[nb + b], &mut mr[nb + b]],
                        &mut r2[b],
                    );
                    eliminate_from_second(&done, row2);
                }
            }
        }
        // Each line's last two rows go on to the next cell.
        for back in [2, 1] {
            let p = span.end - back;
            // SAFETY: the caller's contract.
            let rhs = unsafe { sp::rows5(&run.f.rhs, lines.at5(p)) };
            for b in 0..nb {
                let row = (p - span.start) * nb + b;
                let done = Finished::of([&x.lhs[row], &x.lhsp[row], &x.lhsm[row]], &rhs[b]);
                let at = (line + b) * FORWARD + (2 - back) * ROW;
                out[at..at + ROW].copy_from_slice(&done.0);
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
    // `kept` holds position by position, line by line (as the lines are visited).
    let lines_in_cell = run.l.cell(cell).lines(axis, n);
    each_set(run, cell, axis, |lines, line| {
        let nb = lines.count;
        let carry = &mut out[line * BACK..(line + nb) * BACK];
        mpicfd::carry_in(carry, carried, line..line + nb, BACK);
        for p in span.clone().rev() {
            let local = p - span.start;
            // SAFETY: the caller's contract.
            let r = unsafe { sp::rows5(&run.f.rhs, lines.at5(p)) };
            for b in 0..nb {
                let at = (local * lines_in_cell + line + b) * KEPT;
                let carry = (&mut carry[b * BACK..(b + 1) * BACK]).try_into();
                let kept = kept[at..at + KEPT]
                    .try_into()
                    .expect("a point's coefficients");
                substitute_row(p, n, kept, &mut r[b], carry.expect("a line's rows"));
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
