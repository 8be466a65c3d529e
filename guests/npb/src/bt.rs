//! BT, the block-tridiagonal pseudo-application (NPB 3.3 `BT`): time steps of the
//! Beam-Warming approximate factorisation of the 3-D compressible Navier-Stokes
//! equations, each direction's implicit factor a block-tridiagonal system of 5x5 blocks
//! per grid line, solved by block Gaussian elimination.
//!
//! One step (`adi`): the explicit right-hand side ([`crate::cfd`]), the x, y and z
//! solves, then `add`. The parallel split is SP's (see [`crate::sp`]): the scalars by
//! `k` plane; the right-hand side and the x and y solves by `k` plane; the z solves and
//! `add` by `j` row; three barriers a step. A thread gathers each line (its `u`, the
//! scalars and its right-hand side) into its work arrays, solves it there as the
//! reference does, and writes the right-hand side back.

// Statements are written as the reference's (`a = a - b * c`, indexed loops over the
// block entries) so that each one's operation order can be checked against it.
#![allow(clippy::assign_op_pattern, clippy::needless_range_loop)]

use core::ops::Range;

use crate::cfd::{self, App, Constants, Fields, Grid};
use crate::team::{Arena, Team};
use crate::{Class, Outcome};

/// Relative error allowed on each norm, as the reference's `verify`.
pub const EPSILON: f64 = 1.0e-8;

/// Grid points a side, time steps and time step length of `class`.
pub fn params(class: Class) -> (usize, usize, f64) {
    match class {
        Class::S => (12, 60, 0.010),
        Class::W => (24, 200, 0.0008),
        Class::A => (64, 200, 0.0008),
        Class::B => (102, 200, 0.0003),
        Class::C => (162, 200, 0.0001),
    }
}

/// The official residual norms (`xcrref`) and error norms (`xceref`) of `class`.
#[allow(clippy::excessive_precision)] // digits as published by NASA
pub fn reference(class: Class) -> ([f64; 5], [f64; 5]) {
    match class {
        Class::S => (
            [
                1.7034283709541311e-01,
                1.2975252070034097e-02,
                3.2527926989486055e-02,
                2.6436421275166801e-02,
                1.9211784131744430e-01,
            ],
            [
                4.9976913345811579e-04,
                4.5195666782961927e-05,
                7.3973765172921357e-05,
                7.3821238632439731e-05,
                8.9269630987491446e-04,
            ],
        ),
        Class::W => (
            [
                0.1125590409344e+03,
                0.1180007595731e+02,
                0.2710329767846e+02,
                0.2469174937669e+02,
                0.2638427874317e+03,
            ],
            [
                0.4419655736008e+01,
                0.4638531260002e+00,
                0.1011551749967e+01,
                0.9235878729944e+00,
                0.1018045837718e+02,
            ],
        ),
        Class::A => (
            [
                1.0806346714637264e+02,
                1.1319730901220813e+01,
                2.5974354511582465e+01,
                2.3665622544678910e+01,
                2.5278963211748344e+02,
            ],
            [
                4.2348416040525025e+00,
                4.4390282496995698e-01,
                9.6692480136345650e-01,
                8.8302063039765474e-01,
                9.7379901770829278e+00,
            ],
        ),
        Class::B => (
            [
                1.4233597229287254e+03,
                9.9330522590150238e+01,
                3.5646025644535285e+02,
                3.2485447959084092e+02,
                3.2707541254659363e+03,
            ],
            [
                5.2969847140936856e+01,
                4.4632896115670668e+00,
                1.3122573342210174e+01,
                1.2006925323559144e+01,
                1.2459576151035986e+02,
            ],
        ),
        Class::C => (
            [
                0.62398116551764615e+04,
                0.50793239190423964e+03,
                0.15423530093013596e+04,
                0.13302387929291190e+04,
                0.11604087428436455e+05,
            ],
            [
                0.16462008369091265e+03,
                0.11497107903824313e+02,
                0.41207446207461508e+02,
                0.37087651059694167e+02,
                0.36211053051841265e+03,
            ],
        ),
    }
}

/// Whether every norm matches the official value within [`EPSILON`] (NaN fails).
pub fn verify(class: Class, xcr: &[f64; 5], xce: &[f64; 5]) -> bool {
    let (xcrref, xceref) = reference(class);
    cfd::close(xcr, &xcrref, EPSILON) && cfd::close(xce, &xceref, EPSILON)
}

/// Mop/s by the reference's operation count.
pub fn mops(class: Class, seconds: f64) -> f64 {
    let (n, niter, _) = params(class);
    let n3 = (n * n * n) as f64;
    let navg = (3 * n) as f64 / 3.0;
    1.0e-6 * niter as f64 * (3478.8 * n3 - 17655.7 * navg * navg + 28023.7 * navg) / seconds
}

/// A 5x5 block, `[row][column]` (the reference's `(row, column)`).
pub(crate) type Block = [[f64; 5]; 5];

/// `f64`s of one thread's work arrays: per point of a line, `fjac` and `njac` (with a
/// point beyond each end), the three blocks `aa`, `bb`, `cc`, and the gathered
/// right-hand side (the MPI form's [`Work::carve`]). The shared-memory form carves
/// [`LINES`] smaller ones from the same space ([`Work::carve_line`]).
pub(crate) fn work_len(n: usize) -> usize {
    n * (5 * 25 + 5) + 2 * 2 * 25
}

/// Arena bytes [`run`] needs.
pub fn heap_bytes(class: Class, threads: usize) -> usize {
    let n = params(class).0;
    cfd::heap_bytes(n, false, work_len(n), threads)
}

/// One thread's work arrays for one line (the reference's `fjac`, `njac` and `lhs`).
pub(crate) struct Work<'a> {
    fjac: &'a mut [Block],
    njac: &'a mut [Block],
    pub(crate) aa: &'a mut [Block],
    pub(crate) bb: &'a mut [Block],
    pub(crate) cc: &'a mut [Block],
    pub(crate) rhs: &'a mut [[f64; 5]],
}

impl<'a> Work<'a> {
    /// The work arrays of a line split in parts (the MPI form's): Jacobians for every
    /// position and one beyond each end, blocks for every position.
    pub(crate) fn carve(n: usize, all: &'a mut [f64]) -> Work<'a> {
        Work::carve_with(n, n + 2, n, all).0
    }

    /// The work arrays of a whole line solved by [`solve_lines`] (three Jacobian slots,
    /// one `aa` and `bb`), and what is left of `all`.
    fn carve_line(n: usize, all: &'a mut [f64]) -> (Work<'a>, &'a mut [f64]) {
        Work::carve_with(n, 3, 1, all)
    }

    /// `jacobians` Jacobian slots of each kind, `scratch` blocks `aa` and `bb`, `n`
    /// blocks `cc` and right-hand sides.
    fn carve_with(
        n: usize,
        jacobians: usize,
        scratch: usize,
        all: &'a mut [f64],
    ) -> (Work<'a>, &'a mut [f64]) {
        let (blocks, rest) = all.split_at_mut(25 * (2 * jacobians + 2 * scratch + n));
        let (rhs, left) = rest.split_at_mut(5 * n);
        let (blocks, _) = blocks.as_chunks_mut::<5>();
        let (blocks, _) = blocks.as_chunks_mut::<5>();
        let (fjac, rest) = blocks.split_at_mut(jacobians);
        let (njac, rest) = rest.split_at_mut(jacobians);
        let (aa, rest) = rest.split_at_mut(scratch);
        let (bb, cc) = rest.split_at_mut(scratch);
        let work = Work {
            fjac,
            njac,
            aa,
            bb,
            cc,
            rhs: rhs.as_chunks_mut().0,
        };
        (work, left)
    }
}

/// The direction of a line, which picks its flux Jacobian and constants.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Axis {
    X,
    Y,
    Z,
}

impl Axis {
    /// The axis of index 0, 1 or 2.
    pub(crate) fn of(index: usize) -> Axis {
        [Axis::X, Axis::Y, Axis::Z][index]
    }
}

/// What the Jacobians read at one point.
pub(crate) struct Point {
    u: [f64; 5],
    qs: f64,
    square: f64,
    rho_i: f64,
}

impl Point {
    /// What the Jacobians read at storage index `a`.
    ///
    /// # Safety
    /// Nobody writes `u` or the scalars at `a` meanwhile.
    #[inline(always)]
    pub(crate) unsafe fn at(f: &Fields, a: usize) -> Point {
        // SAFETY: the caller's contract.
        unsafe {
            let mut u = [0.0; 5];
            u.copy_from_slice(f.u.slice(5 * a..5 * a + 5));
            Point {
                u,
                qs: f.qs.get(a),
                square: f.square.get(a),
                rho_i: f.rho_i.get(a),
            }
        }
    }
}

/// The flux Jacobian `fjac` and viscous Jacobian `njac` at a point, transcribed per
/// direction from the reference's `x_solve`, `y_solve` and `z_solve` (their
/// expressions differ in association, which the rounding follows). Written in place:
/// returned by value, the two blocks were copied with `memcpy` at every point.
#[inline(always)]
fn jacobians(c: &Constants, axis: Axis, p: &Point, fjac: &mut Block, njac: &mut Block) {
    let u = &p.u;
    let (c1, c2, c3c4, c1345, con43) = (c.c1, c.c2, c.c3c4, c.c1345, c.con43);
    let tmp1 = match axis {
        Axis::Z => 1.0 / u[0],
        Axis::X | Axis::Y => p.rho_i,
    };
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let (qs, square) = (p.qs, p.square);
    let z = 0.0;
    match axis {
        Axis::X => {
            *fjac = [
                [z, 1.0, z, z, z],
                [
                    -(u[1] * tmp2 * u[1]) + c2 * qs,
                    (2.0 - c2) * (u[1] / u[0]),
                    -c2 * (u[2] * tmp1),
                    -c2 * (u[3] * tmp1),
                    c2,
                ],
                [-(u[1] * u[2]) * tmp2, u[2] * tmp1, u[1] * tmp1, z, z],
                [-(u[1] * u[3]) * tmp2, u[3] * tmp1, z, u[1] * tmp1, z],
                [
                    (c2 * 2.0 * square - c1 * u[4]) * (u[1] * tmp2),
                    c1 * u[4] * tmp1 - c2 * (u[1] * u[1] * tmp2 + qs),
                    -c2 * (u[2] * u[1]) * tmp2,
                    -c2 * (u[3] * u[1]) * tmp2,
                    c1 * (u[1] * tmp1),
                ],
            ];
            *njac = [
                [z; 5],
                [-con43 * c3c4 * tmp2 * u[1], con43 * c3c4 * tmp1, z, z, z],
                [-c3c4 * tmp2 * u[2], z, c3c4 * tmp1, z, z],
                [-c3c4 * tmp2 * u[3], z, z, c3c4 * tmp1, z],
                [
                    -(con43 * c3c4 - c1345) * tmp3 * (u[1] * u[1])
                        - (c3c4 - c1345) * tmp3 * (u[2] * u[2])
                        - (c3c4 - c1345) * tmp3 * (u[3] * u[3])
                        - c1345 * tmp2 * u[4],
                    (con43 * c3c4 - c1345) * tmp2 * u[1],
                    (c3c4 - c1345) * tmp2 * u[2],
                    (c3c4 - c1345) * tmp2 * u[3],
                    c1345 * tmp1,
                ],
            ];
        }
        Axis::Y => {
            *fjac = [
                [z, z, 1.0, z, z],
                [-(u[1] * u[2]) * tmp2, u[2] * tmp1, u[1] * tmp1, z, z],
                [
                    -(u[2] * u[2] * tmp2) + c2 * qs,
                    -c2 * u[1] * tmp1,
                    (2.0 - c2) * u[2] * tmp1,
                    -c2 * u[3] * tmp1,
                    c2,
                ],
                [-(u[2] * u[3]) * tmp2, z, u[3] * tmp1, u[2] * tmp1, z],
                [
                    (c2 * 2.0 * square - c1 * u[4]) * u[2] * tmp2,
                    -c2 * u[1] * u[2] * tmp2,
                    c1 * u[4] * tmp1 - c2 * (qs + u[2] * u[2] * tmp2),
                    -c2 * (u[2] * u[3]) * tmp2,
                    c1 * u[2] * tmp1,
                ],
            ];
            *njac = [
                [z; 5],
                [-c3c4 * tmp2 * u[1], c3c4 * tmp1, z, z, z],
                [-con43 * c3c4 * tmp2 * u[2], z, con43 * c3c4 * tmp1, z, z],
                [-c3c4 * tmp2 * u[3], z, z, c3c4 * tmp1, z],
                [
                    -(c3c4 - c1345) * tmp3 * (u[1] * u[1])
                        - (con43 * c3c4 - c1345) * tmp3 * (u[2] * u[2])
                        - (c3c4 - c1345) * tmp3 * (u[3] * u[3])
                        - c1345 * tmp2 * u[4],
                    (c3c4 - c1345) * tmp2 * u[1],
                    (con43 * c3c4 - c1345) * tmp2 * u[2],
                    (c3c4 - c1345) * tmp2 * u[3],
                    c1345 * tmp1,
                ],
            ];
        }
        Axis::Z => {
            *fjac = [
                [z, z, z, 1.0, z],
                [-(u[1] * u[3]) * tmp2, u[3] * tmp1, z, u[1] * tmp1, z],
                [-(u[2] * u[3]) * tmp2, z, u[3] * tmp1, u[2] * tmp1, z],
                [
                    -(u[3] * u[3] * tmp2) + c2 * qs,
                    -c2 * u[1] * tmp1,
                    -c2 * u[2] * tmp1,
                    (2.0 - c2) * u[3] * tmp1,
                    c2,
                ],
                [
                    (c2 * 2.0 * square - c1 * u[4]) * u[3] * tmp2,
                    -c2 * (u[1] * u[3]) * tmp2,
                    -c2 * (u[2] * u[3]) * tmp2,
                    c1 * (u[4] * tmp1) - c2 * (qs + u[3] * u[3] * tmp2),
                    c1 * u[3] * tmp1,
                ],
            ];
            *njac = [
                [z; 5],
                [-c3c4 * tmp2 * u[1], c3c4 * tmp1, z, z, z],
                [-c3c4 * tmp2 * u[2], z, c3c4 * tmp1, z, z],
                [
                    -con43 * c3c4 * tmp2 * u[3],
                    z,
                    z,
                    con43 * c.c3 * c.c4 * tmp1,
                    z,
                ],
                [
                    -(c3c4 - c1345) * tmp3 * (u[1] * u[1])
                        - (c3c4 - c1345) * tmp3 * (u[2] * u[2])
                        - (con43 * c3c4 - c1345) * tmp3 * (u[3] * u[3])
                        - c1345 * tmp2 * u[4],
                    (c3c4 - c1345) * tmp2 * u[1],
                    (c3c4 - c1345) * tmp2 * u[2],
                    (con43 * c3c4 - c1345) * tmp2 * u[3],
                    c1345 * tmp1,
                ],
            ];
        }
    }
}

/// `bvec = bvec - ablock * avec` (`matvec_sub`).
#[inline(always)]
fn matvec_sub(a: &Block, v: &[f64; 5], b: &mut [f64; 5]) {
    for m in 0..5 {
        b[m] = b[m]
            - a[m][0] * v[0]
            - a[m][1] * v[1]
            - a[m][2] * v[2]
            - a[m][3] * v[3]
            - a[m][4] * v[4];
    }
}

/// `cblock = cblock - ablock * bblock` (`matmul_sub`). Row by row, unlike the
/// reference's column loop: our blocks are stored by row, so a row's entries lie side
/// by side and are computed two at a time; each entry's operations are the same.
#[inline(always)]
fn matmul_sub(a: &Block, b: &Block, c: &mut Block) {
    for i in 0..5 {
        for j in 0..5 {
            c[i][j] = c[i][j]
                - a[i][0] * b[0][j]
                - a[i][1] * b[1][j]
                - a[i][2] * b[2][j]
                - a[i][3] * b[3][j]
                - a[i][4] * b[4][j];
        }
    }
}

/// Gauss-Jordan elimination without pivoting of `L` independent systems, each `lhs`
/// applied to its `c` (if `WITH_C`) and `r`: `binvcrhs` (`c = lhs^-1 c`,
/// `r = lhs^-1 r`) and, without `c`, `binvrhs`. Each system's operations are the
/// reference's, in its order.
///
/// The systems advance together, pivot by pivot, so that the processor overlaps their
/// chains of dependent operations (each pivot's inverse waits for the step before). A
/// step is straight-line code, as the reference's hand-unrolled one, and a function of
/// its own: with all five inlined together the compiler kept too many values live and
/// spilled them.
#[inline(always)]
fn gauss_jordan<const L: usize, const WITH_C: bool>(s: &mut [System; L]) {
    eliminate_column::<0, L, WITH_C>(s);
    eliminate_column::<1, L, WITH_C>(s);
    eliminate_column::<2, L, WITH_C>(s);
    eliminate_column::<3, L, WITH_C>(s);
    eliminate_column::<4, L, WITH_C>(s);
}

/// Step `P` of [`gauss_jordan`] on every system: scales row `P` by its pivot's inverse
/// and subtracts it from the other rows.
#[inline(never)]
fn eliminate_column<const P: usize, const L: usize, const WITH_C: bool>(s: &mut [System; L]) {
    for (lhs, c, r) in s.iter_mut() {
        let pivot = 1.0 / lhs[P][P];
        for q in P + 1..5 {
            lhs[P][q] = lhs[P][q] * pivot;
        }
        if WITH_C {
            for q in 0..5 {
                c[P][q] = c[P][q] * pivot;
            }
        }
        r[P] = r[P] * pivot;
    }
    for i in 0..5 {
        if i == P {
            continue;
        }
        for (lhs, c, r) in s.iter_mut() {
            let coeff = lhs[i][P];
            for q in P + 1..5 {
                lhs[i][q] = lhs[i][q] - coeff * lhs[P][q];
            }
            if WITH_C {
                for q in 0..5 {
                    c[i][q] = c[i][q] - coeff * c[P][q];
                }
            }
            r[i] = r[i] - coeff * r[P];
        }
    }
}

/// A system for [`gauss_jordan`]: `lhs`, `c` and `r`.
type System<'a> = (&'a mut Block, &'a mut Block, &'a mut [f64; 5]);

/// `binvcrhs` of `L` systems.
fn binvcrhs<const L: usize>(mut systems: [System; L]) {
    gauss_jordan::<L, true>(&mut systems);
}

/// `binvrhs`.
fn binvrhs(lhs: &mut Block, r: &mut [f64; 5]) {
    gauss_jordan::<1, false>(&mut [(lhs, &mut [[0.0; 5]; 5], r)]);
}

/// Lines [`adi`] solves side by side.
const LINES: usize = 2;

/// Solves `L` lines (the reference's loop body of `x_solve`, `y_solve`, `z_solve`),
/// line `l` in `ws[l]`, its right-hand side gathered there: `point(l, p)` is what the
/// Jacobians read at position `p` of line `l`. Positions 0 and `n - 1` of the
/// right-hand side are left as they are.
///
/// The reference's operations on the interior rows of each line, in its order, but
/// fused: each row's blocks are made just before the row is eliminated, from the
/// Jacobians of its position and its two neighbours (kept in three rotating slots), so
/// a line's working set is its `cc` and right-hand side instead of all five arrays of
/// blocks. The end rows (`lhsinit`'s identity, zero `aa` and `cc`) are not computed:
/// eliminating them multiplies by 1 and subtracts products with 0, which leaves every
/// value as it is, and so does the `matmul_sub` of row 1 (its `cc` above is zero).
///
/// A line's rows form one chain (each row's elimination needs the row above), so the
/// lines are interleaved row by row, their rows' eliminations done together
/// ([`gauss_jordan`]): the processor overlaps one line's chain with the other's.
#[inline(always)]
fn solve_lines<const L: usize>(
    c: &Constants,
    axis: Axis,
    n: usize,
    point: impl Fn(usize, usize) -> Point,
    ws: &mut [Work],
) {
    let ws: &mut [Work; L] = (&mut ws[..L]).try_into().expect("L lines' work");
    let k = Coefficients::of(c, axis);
    for (l, w) in ws.iter_mut().enumerate() {
        for p in 0..2 {
            jacobians(c, axis, &point(l, p), &mut w.fjac[p], &mut w.njac[p]);
        }
    }
    // Slots of the Jacobians at positions p - 1, p and p + 1.
    let mut slots = [0, 1, 2];
    for p in 1..n - 1 {
        let [before, at, after] = slots;
        for (l, w) in ws.iter_mut().enumerate() {
            jacobians(
                c,
                axis,
                &point(l, p + 1),
                &mut w.fjac[after],
                &mut w.njac[after],
            );
            let (aa, bb) = (&mut w.aa[0], &mut w.bb[0]);
            let (cc_before, cc_at) = w.cc.split_at_mut(p);
            row_blocks(
                &k,
                (&w.fjac[before], &w.njac[before]),
                &w.njac[at],
                (&w.fjac[after], &w.njac[after]),
                (aa, bb, &mut cc_at[0]),
            );
            let (r_before, r_at) = w.rhs.split_at_mut(p);
            matvec_sub(aa, &r_before[p - 1], &mut r_at[0]);
            if p > 1 {
                matmul_sub(aa, &cc_before[p - 1], bb);
            }
        }
        binvcrhs(
            ws.each_mut()
                .map(|w| (&mut w.bb[0], &mut w.cc[p], &mut w.rhs[p])),
        );
        slots = [at, after, before];
    }
    for p in (1..n - 1).rev() {
        for w in ws.iter_mut() {
            let (at, after) = w.rhs[..n].split_at_mut(p + 1);
            substitute_row(&w.cc[p], &mut at[p], &after[0]);
        }
    }
}

/// What a line's blocks along one axis take besides the Jacobians: `dt` times the
/// axis's `t1` and `t2`, and its dissipation constants.
struct Coefficients {
    tmp1: f64,
    tmp2: f64,
    d: [f64; 5],
}

impl Coefficients {
    fn of(c: &Constants, axis: Axis) -> Coefficients {
        let (t1, t2, d) = match axis {
            Axis::X => (c.tx1, c.tx2, c.dx),
            Axis::Y => (c.ty1, c.ty2, c.dy),
            Axis::Z => (c.tz1, c.tz2, c.dz),
        };
        Coefficients {
            tmp1: c.dt * t1,
            tmp2: c.dt * t2,
            d,
        }
    }
}

/// The blocks `aa`, `bb`, `cc` of an interior row from the flux and viscous Jacobians
/// of the position before it (`fm`, `nm`), its own viscous one (`n0`) and the one after
/// (`fp`, `np`).
#[inline(always)]
fn row_blocks(
    k: &Coefficients,
    (fm, nm): (&Block, &Block),
    n0: &Block,
    (fp, np): (&Block, &Block),
    (aa, bb, cc): (&mut Block, &mut Block, &mut Block),
) {
    fn entries(b: &Block) -> &[f64; 25] {
        b.as_flattened().try_into().expect("a block is 25 values")
    }
    let (tmp1, tmp2, d) = (k.tmp1, k.tmp2, &k.d);
    // The 25 entries as one run (vectorised), then the diagonal's own formula.
    let (fm, nm, n0f, fp, np) = (
        entries(fm),
        entries(nm),
        entries(n0),
        entries(fp),
        entries(np),
    );
    let (aaf, bbf, ccf) = (
        aa.as_flattened_mut(),
        bb.as_flattened_mut(),
        cc.as_flattened_mut(),
    );
    for e in 0..25 {
        aaf[e] = -tmp2 * fm[e] - tmp1 * nm[e];
        bbf[e] = tmp1 * 2.0 * n0f[e];
        ccf[e] = tmp2 * fp[e] - tmp1 * np[e];
    }
    for m in 0..5 {
        let e = 5 * m + m;
        let (fm, nm, n0, fp, np) = (fm[e], nm[e], n0f[e], fp[e], np[e]);
        aa[m][m] = -tmp2 * fm - tmp1 * nm - tmp1 * d[m];
        bb[m][m] = 1.0 + tmp1 * 2.0 * n0 + tmp1 * 2.0 * d[m];
        cc[m][m] = tmp2 * fp - tmp1 * np - tmp1 * d[m];
    }
}

/// The blocks `aa`, `bb`, `cc` of one line at positions `span` (of `0..n`; entry
/// `p - span.start` of each) in `w`: `point(p)` is what the Jacobians read at position
/// `p`, asked one position beyond each end of `span`.
pub(crate) fn blocks(
    c: &Constants,
    axis: Axis,
    n: usize,
    span: Range<usize>,
    point: impl Fn(usize) -> Point,
    w: &mut Work,
) {
    let k = Coefficients::of(c, axis);
    // Jacobians at positions `reach`, position `p`'s at `p - reach.start`.
    let reach = span.start.saturating_sub(1)..(span.end + 1).min(n);
    for p in reach.clone() {
        let at = p - reach.start;
        jacobians(c, axis, &point(p), &mut w.fjac[at], &mut w.njac[at]);
    }
    for p in span.clone() {
        let (aa, bb, cc) = (
            &mut w.aa[p - span.start],
            &mut w.bb[p - span.start],
            &mut w.cc[p - span.start],
        );
        if p == 0 || p == n - 1 {
            // `lhsinit`: the end rows are zero blocks with the identity on the diagonal.
            *aa = [[0.0; 5]; 5];
            *bb = [[0.0; 5]; 5];
            *cc = [[0.0; 5]; 5];
            for m in 0..5 {
                bb[m][m] = 1.0;
            }
            continue;
        }
        let at = p - reach.start;
        row_blocks(
            &k,
            (&w.fjac[at - 1], &w.njac[at - 1]),
            &w.njac[at],
            (&w.fjac[at + 1], &w.njac[at + 1]),
            (aa, bb, cc),
        );
    }
}

/// Forward elimination of row `p` (of `n`) of a line, whose blocks are `aa`, `bb`,
/// `cc` and right-hand side `r`, given the row above's finished `cc` and right-hand
/// side (none for the first row): the reference's operations on this row, in order.
#[inline(always)]
pub(crate) fn eliminate_row(
    p: usize,
    n: usize,
    (aa, bb, cc): (&Block, &mut Block, &mut Block),
    r: &mut [f64; 5],
    above: Option<(&Block, &[f64; 5])>,
) {
    if let Some((cc_above, r_above)) = above {
        matvec_sub(aa, r_above, r);
        matmul_sub(aa, cc_above, bb);
    }
    if p + 1 < n {
        binvcrhs([(bb, cc, r)]);
    } else {
        binvrhs(bb, r);
    }
}

/// Back substitution of a row: `x = x - cc * next`.
#[inline(always)]
pub(crate) fn substitute_row(cc: &Block, x: &mut [f64; 5], next: &[f64; 5]) {
    for m in 0..5 {
        for q in 0..5 {
            x[m] = x[m] - cc[m][q] * next[q];
        }
    }
}

/// Solves `count` lines of `n` points, `stride` points apart, the first starting at
/// point `first` and each next one `across` points further, [`LINES`] at a time.
///
/// # Safety
/// This thread owns the right-hand side at the lines' points; nobody writes `u` or
/// the scalars there meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn solve(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    axis: Axis,
    (first, across, count): (usize, usize, usize),
    stride: usize,
    ws: &mut [Work; LINES],
) {
    let batches = count / LINES;
    for b in 0..batches {
        let firsts = core::array::from_fn(|l| first + (b * LINES + l) * across);
        // SAFETY: the caller's contract.
        unsafe { solve_batch::<LINES>(g, c, f, axis, &firsts, stride, ws) };
    }
    for line in batches * LINES..count {
        // SAFETY: the caller's contract.
        unsafe { solve_batch::<1>(g, c, f, axis, &[first + line * across], stride, ws) };
    }
}

/// Gathers the right-hand sides of `L` lines (as [`solve`]), solves them and writes
/// their interior back.
///
/// # Safety
/// As [`solve`].
unsafe fn solve_batch<const L: usize>(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    axis: Axis,
    firsts: &[usize; L],
    stride: usize,
    ws: &mut [Work],
) {
    let at = |l: usize, p: usize| firsts[l] + p * stride;
    for (l, w) in ws[..L].iter_mut().enumerate() {
        for p in 0..g.n {
            let a = at(l, p);
            // SAFETY: this thread's point (the caller's contract).
            w.rhs[p].copy_from_slice(unsafe { f.rhs.slice(5 * a..5 * a + 5) });
        }
    }
    // SAFETY: line l's points are this thread's, and nobody writes u or the scalars
    // while it solves them (the caller's contract).
    let point = |l: usize, p: usize| unsafe { Point::at(f, at(l, p)) };
    solve_lines::<L>(c, axis, g.n, point, ws);
    for (l, w) in ws[..L].iter_mut().enumerate() {
        for p in 1..g.n - 1 {
            let a = at(l, p);
            // SAFETY: this thread's point (the caller's contract).
            unsafe { f.rhs.slice_mut(5 * a..5 * a + 5) }.copy_from_slice(&w.rhs[p]);
        }
    }
}

/// One time step (`adi`). Ends with a barrier.
fn adi(team: &Team, g: &Grid, c: &Constants, f: &Fields, ws: &mut [Work; LINES]) {
    cfd::compute_rhs(team, g, c, f, |k| {
        if !g.interior().contains(&k) {
            return;
        }
        let lines = g.n - 2;
        // SAFETY: plane k of rhs is this thread's in this phase; nobody writes u or the
        // scalars.
        unsafe { solve(g, c, f, Axis::X, (g.at(0, 1, k), g.ip, lines), 1, ws) };
        // SAFETY: as above.
        unsafe { solve(g, c, f, Axis::Y, (g.at(1, 0, k), 1, lines), g.ip, ws) };
    });
    team.barrier();
    let rows = team.share(g.n - 2);
    for j in rows.start + 1..rows.end + 1 {
        let z_lines = (g.at(1, j, 0), 1, g.n - 2);
        // SAFETY: row j of every plane of rhs and u is this thread's in this phase;
        // nobody writes the scalars, and u only after this row's solves.
        unsafe { solve(g, c, f, Axis::Z, z_lines, g.plane(), ws) };
        for k in g.interior() {
            let first = g.at(1, j, k);
            let range = 5 * first..5 * (first + g.n - 2);
            // SAFETY: row j of plane k is this thread's (as above).
            let (u, rhs) = unsafe { (f.u.slice_mut(range.clone()), f.rhs.slice(range)) };
            for (u, r) in u.iter_mut().zip(rhs) {
                *u += r;
            }
        }
    }
    team.barrier();
}

/// Runs this thread's part of BT at `class`.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    let (n, niter, dt) = params(class);
    let app = App {
        n,
        niter,
        dt,
        with_speed: false,
        work_len: work_len(n),
    };
    let (seconds, xcr, xce) = cfd::drive(team, arena, &app, |team, g, c, f, work| {
        let (first, rest) = Work::carve_line(g.n, work);
        adi(team, g, c, f, &mut [first, Work::carve_line(g.n, rest).0])
    });
    Outcome {
        seconds,
        mops: mops(class, seconds),
        verified: verify(class, &xcr, &xce),
        values: cfd::values(&xcr, &xce),
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    #[test]
    fn mops_is_the_reference_formula() {
        // Class S: 1e-6 * 60 * (3478.8 * 12^3 - 17655.7 * 144 + 28023.7 * 12).
        let mops_1s = 1.0e-6 * 60.0 * (3478.8 * 1728.0 - 17655.7 * 144.0 + 28023.7 * 12.0);
        assert!((mops(Class::S, 1.0) - mops_1s).abs() < 1e-9);
    }

    #[test]
    fn verify_wants_every_norm_within_1e_8() {
        for &class in crate::Kernel::Bt.classes() {
            let (xcr, xce) = reference(class);
            assert!(verify(class, &xcr, &xce));
            let mut off = xce;
            off[4] *= 1.0 - 2e-8;
            assert!(!verify(class, &xcr, &off), "{class:?}");
        }
    }

    #[test]
    fn a_threads_work_holds_its_lines_side_by_side() {
        for &class in crate::Kernel::Bt.classes() {
            let n = params(class).0;
            let mut all = vec![0.0; work_len(n)];
            let (first, rest) = Work::carve_line(n, &mut all);
            let (second, _) = Work::carve_line(n, rest);
            for w in [first, second] {
                assert_eq!((w.fjac.len(), w.njac.len()), (3, 3));
                assert_eq!((w.aa.len(), w.bb.len()), (1, 1));
                assert_eq!((w.cc.len(), w.rhs.len()), (n, n));
            }
        }
    }

    #[test]
    fn two_systems_eliminated_together_give_each_ones_bits() {
        let system = |seed: f64| -> (Block, Block, [f64; 5]) {
            let entry = |m: usize, q: usize| (seed + (3 * m + 7 * q) as f64).sin();
            let mut lhs: Block = core::array::from_fn(|m| core::array::from_fn(|q| entry(m, q)));
            for m in 0..5 {
                lhs[m][m] += 4.0;
            }
            let c = core::array::from_fn(|m| core::array::from_fn(|q| entry(q, m) / 3.0));
            (lhs, c, core::array::from_fn(|m| entry(m, m) * 2.0))
        };
        let (mut a, mut b) = (system(0.25), system(1.5));
        binvcrhs([
            (&mut a.0, &mut a.1, &mut a.2),
            (&mut b.0, &mut b.1, &mut b.2),
        ]);
        for (seed, together) in [(0.25, a), (1.5, b)] {
            let mut alone = system(seed);
            binvcrhs([(&mut alone.0, &mut alone.1, &mut alone.2)]);
            assert_eq!(alone, together);
            assert_ne!(alone, system(seed));
        }
    }

    #[test]
    fn gauss_jordan_inverts_a_block() {
        let a: Block = [
            [4.0, 1.0, 0.5, 0.0, 0.2],
            [1.0, 5.0, 0.3, 0.1, 0.0],
            [0.2, 0.1, 3.0, 0.4, 0.3],
            [0.0, 0.6, 0.2, 6.0, 0.1],
            [0.3, 0.0, 0.1, 0.2, 2.0],
        ];
        let x = [1.0, -2.0, 0.5, 3.0, -1.0];
        let mut b = [0.0; 5];
        for m in 0..5 {
            for q in 0..5 {
                b[m] += a[m][q] * x[q];
            }
        }
        let mut lhs = a;
        binvrhs(&mut lhs, &mut b);
        for m in 0..5 {
            assert!((b[m] - x[m]).abs() < 1e-12, "{b:?}");
        }
    }
}
