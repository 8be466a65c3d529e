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

use super::cfd::{self as mpicfd, Carried, Cell, Layout, Run};
use super::{Comm, Error, take};
use crate::cfd::{self, ALIGN_SLACK, Grid};
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

/// One rank's solver memory.
struct Solver<'a> {
    /// The shared-memory SP's per-line-set work arrays (factors of one set of lines).
    work: &'a mut [f64],
    /// Each cell's factors' upper coefficients, line by line, position by position
    /// (written forward, read back).
    kept: Shared<f64>,
    /// Rows carried between cells.
    carried: Carried<'a>,
    /// `f64`s of `kept` per cell.
    per_cell: usize,
}

impl<'a> Solver<'a> {
    fn lens(l: &Layout) -> [usize; 2] {
        let side = l.max_span();
        [sp::work_len(l.n), l.q * side * side * side * KEPT]
    }

    fn bytes(l: &Layout) -> usize {
        let [work, kept] = Solver::lens(l);
        (work + kept) * 8 + 2 * ALIGN_SLACK + Carried::bytes(l, (FORWARD, BACK))
    }

    fn carve(arena: &mut Arena, l: &Layout) -> Solver<'a> {
        let [work, kept] = Solver::lens(l);
        Solver {
            // SAFETY: the arena is this rank's alone and outlives the run.
            work: unsafe { take(arena, work) },
            kept: arena.alloc(kept),
            carried: Carried::carve(arena, l, (FORWARD, BACK)),
            per_cell: kept / l.q,
        }
    }
}

/// Arena bytes of one rank of SP `class` on `ranks`.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let n = sp::params(class).0;
    let q = mpicfd::cells_a_side(n, ranks).unwrap_or(1);
    mpicfd::run_bytes(n, true, ranks) + Solver::bytes(&Layout::new(n, 0, q))
}

/// Calls `each(lines)` for the sets of lines a solve along `axis` works on in `cell`
/// (interior across the axis; the shared-memory SP's sets, cut to the cell).
fn each_set(g: &Grid, cell: &Cell, axis: usize, mut each: impl FnMut(Lines)) {
    let r = cell.lines_across(axis, g.n);
    match axis {
        0 => {
            for k in r[2].clone() {
                for j in r[1].clone() {
                    each(Lines {
                        first: g.at(0, j, k),
                        stride: 1,
                        count: 1,
                    });
                }
            }
        }
        1 => {
            for k in r[2].clone() {
                each(Lines {
                    first: g.at(r[0].start, 0, k),
                    stride: g.ip,
                    count: r[0].len(),
                });
            }
        }
        _ => {
            for j in r[1].clone() {
                each(Lines {
                    first: g.at(r[0].start, j, 0),
                    stride: g.plane(),
                    count: r[0].len(),
                });
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
    let the_cell = run.l.cell(cell);
    let span = the_cell.ranges[axis].clone();
    let mut line = 0;
    each_set(g, &the_cell, axis, |lines| {
        let nb = lines.count;
        let mut w = Work::carve(n, work);
        // SAFETY: the caller's contract.
        let x = unsafe { sp::factors(g, &run.c, &run.f, dir, vel, lines, span.clone(), &mut w) };
        let carry = &mut out[line * FORWARD..(line + nb) * FORWARD];
        match carried {
            Some(rows) => carry.copy_from_slice(&rows[line * FORWARD..(line + nb) * FORWARD]),
            None => carry.fill(0.0),
        }
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
        line += nb;
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
    let (g, n) = (&run.g, run.g.n);
    let the_cell = run.l.cell(cell);
    let span = the_cell.ranges[axis].clone();
    let mut line = 0;
    each_set(g, &the_cell, axis, |lines| {
        let nb = lines.count;
        let carry = &mut out[line * BACK..(line + nb) * BACK];
        match carried {
            Some(rows) => carry.copy_from_slice(&rows[line * BACK..(line + nb) * BACK]),
            None => carry.fill(0.0),
        }
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
        line += nb;
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
    let Solver {
        work,
        kept,
        carried,
        per_cell,
    } = s;
    let (per_cell, kept) = (*per_cell, *kept);
    mpicfd::pipeline(
        comm,
        &run.l,
        axis,
        carried,
        |cell, carried, out| {
            // SAFETY: this rank's arena, used by this thread alone.
            let kept = unsafe { kept.slice_mut(cell * per_cell..(cell + 1) * per_cell) };
            // SAFETY: as above.
            unsafe { forward_cell(run, (axis, dir, vel), cell, work, kept, carried, out) }
        },
        |cell, carried, out| {
            // SAFETY: as above.
            let kept = unsafe { kept.slice(cell * per_cell..(cell + 1) * per_cell) };
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
fn adi<C: Comm + ?Sized>(comm: &mut C, run: &mut Run, s: &mut Solver) -> Result<(), Error> {
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
    let (_, seconds, xcr, xce) = simulate(class, comm, arena)?;
    Ok(Outcome {
        seconds,
        mops: sp::mops(class, seconds),
        verified: sp::verify(class, &xcr, &xce),
        values: cfd::values(&xcr, &xce),
    })
}

/// The run behind [`run`]: its final state, the slowest rank's seconds and the norms.
fn simulate<'a, C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<(Run<'a>, f64, [f64; 5], [f64; 5]), Error> {
    let (n, niter, dt) = sp::params(class);
    let q = mpicfd::cells_a_side(n, comm.size()).ok_or(Error("sp-ranks"))?;
    let mut run = Run::carve(arena, n, dt, true, comm.rank(), q);
    let mut solver = Solver::carve(arena, &run.l);
    let (seconds, xcr, xce) = mpicfd::drive(comm, &mut run, niter, |comm, run| {
        adi(comm, run, &mut solver)
    })?;
    Ok((run, seconds, xcr, xce))
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::super::host;
    use super::*;

    fn run_on(class: Class, ranks: usize) -> Vec<Outcome> {
        let bytes = heap_bytes(class, ranks);
        host::run_ranks(ranks, bytes, |comm, arena| {
            let outcome = run(class, comm, arena).unwrap();
            assert!(arena.used() <= bytes, "{} of {bytes}", arena.used());
            outcome
        })
    }

    #[test]
    fn class_s_verifies_on_1_4_and_9_ranks_every_rank_alike() {
        for ranks in [1, 4, 9] {
            let outcomes = run_on(Class::S, ranks);
            for outcome in &outcomes {
                assert!(outcome.verified, "S on {ranks}: {outcome:?}");
                assert_eq!(outcome.values, outcomes[0].values);
            }
        }
    }

    #[test]
    fn every_point_gets_the_same_bits_on_4_and_9_ranks_as_on_one() {
        let field = |ranks| {
            let bytes = heap_bytes(Class::S, ranks);
            mpicfd::tests::final_field(ranks, bytes, |comm, arena| {
                simulate(Class::S, comm, arena).unwrap().0
            })
        };
        let one = field(1);
        assert_eq!(one.len(), 12 * 12 * 12);
        assert_eq!(field(4), one);
        assert_eq!(field(9), one);
    }

    #[test]
    fn class_w_verifies_on_4_ranks() {
        let outcomes = run_on(Class::W, 4);
        assert!(outcomes[0].verified, "{:?}", outcomes[0]);
    }

    #[test]
    fn only_squares_with_cells_of_two_points_fit() {
        assert!(fits(Class::S, 1) && fits(Class::S, 4) && fits(Class::S, 36));
        assert!(!fits(Class::S, 2) && !fits(Class::S, 8) && !fits(Class::S, 49));
    }
}
