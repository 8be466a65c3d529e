//! SP, the scalar-pentadiagonal pseudo-application (NPB 3.3 `SP`): time steps of the
//! Beam-Warming approximate factorisation of the 3-D compressible Navier-Stokes
//! equations, diagonalised so that each direction's implicit factor is three
//! independent scalar pentadiagonal systems per grid line (the `u`, `u + c` and `u - c`
//! eigenvalues), solved by the Thomas algorithm.
//!
//! One step (`adi`): the explicit right-hand side ([`crate::cfd`]), `txinvr`, the x
//! solves and `ninvr`, the y solves and `pinvr`, the z solves and `tzetar`, then `add`.
//!
//! Parallel split, with three barriers a step: (1) the derived scalars, by `k` plane;
//! (2) the right-hand side, `txinvr` and the x and y solves, by `k` plane (a plane's x
//! and y lines lie in it, and each reads only its own plane of the right-hand side and
//! the scalars); (3) the z solves, `tzetar` and `add`, by `j` row (a z line stays in
//! its row `j` of every plane). Each line is solved exactly as the reference, so the
//! result does not depend on the split except through the norms' rank-ordered sums.

// Statements are written as the reference's (`a = a - b * c`, indexed loops over the
// five components) so that each one's operation order can be checked against it.
#![allow(clippy::assign_op_pattern, clippy::needless_range_loop)]

use core::ops::Range;

use crate::cfd::{self, App, Constants, Fields, Grid};
use crate::team::{Arena, Shared, Team};
use crate::{Class, Outcome};

/// Relative error allowed on each norm, as the reference's `verify`.
pub const EPSILON: f64 = 1.0e-8;

/// Grid points a side, time steps and time step length of `class`.
pub fn params(class: Class) -> (usize, usize, f64) {
    match class {
        Class::S => (12, 100, 0.015),
        Class::W => (36, 400, 0.0015),
        Class::A => (64, 400, 0.0015),
        Class::B => (102, 400, 0.001),
        Class::C => (162, 400, 0.00067),
    }
}

/// The official residual norms (`xcrref`) and error norms (`xceref`) of `class`.
#[allow(clippy::excessive_precision)] // digits as published by NASA
pub fn reference(class: Class) -> ([f64; 5], [f64; 5]) {
    match class {
        Class::S => (
            [
                2.7470315451339479e-02,
                1.0360746705285417e-02,
                1.6235745065095532e-02,
                1.5840557224455615e-02,
                3.4849040609362460e-02,
            ],
            [
                2.7289258557377227e-05,
                1.0364446640837285e-05,
                1.6154798287166471e-05,
                1.5750704994480102e-05,
                3.4177666183390531e-05,
            ],
        ),
        Class::W => (
            [
                0.1893253733584e-02,
                0.1717075447775e-03,
                0.2778153350936e-03,
                0.2887475409984e-03,
                0.3143611161242e-02,
            ],
            [
                0.7542088599534e-04,
                0.6512852253086e-05,
                0.1049092285688e-04,
                0.1128838671535e-04,
                0.1212845639773e-03,
            ],
        ),
        Class::A => (
            [
                2.4799822399300195e0,
                1.1276337964368832e0,
                1.5028977888770491e0,
                1.4217816211695179e0,
                2.1292113035138280e0,
            ],
            [
                1.0900140297820550e-04,
                3.7343951769282091e-05,
                5.0092785406541633e-05,
                4.7671093939528255e-05,
                1.3621613399213001e-04,
            ],
        ),
        Class::B => (
            [
                0.6903293579998e+02,
                0.3095134488084e+02,
                0.4103336647017e+02,
                0.3864769009604e+02,
                0.5643482272596e+02,
            ],
            [
                0.9810006190188e-02,
                0.1022827905670e-02,
                0.1720597911692e-02,
                0.1694479428231e-02,
                0.1847456263981e-01,
            ],
        ),
        Class::C => (
            [
                0.5881691581829e+03,
                0.2454417603569e+03,
                0.3293829191851e+03,
                0.3081924971891e+03,
                0.4597223799176e+03,
            ],
            [
                0.2598120500183e+00,
                0.2590888922315e-01,
                0.5132886416320e-01,
                0.4806073419454e-01,
                0.5483377491301e+00,
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
    let t = (3 * n) as f64 / 3.0;
    (881.174 * n3 - 4683.91 * t * t + 11484.5 * t - 19272.4) * niter as f64 / (seconds * 1.0e6)
}

/// `f64`s of one thread's solver work arrays: three factors (five per point) and two
/// coefficient arrays (with a point beyond each end), for up to `n - 2` lines of `n`
/// points.
pub(crate) fn work_len(n: usize) -> usize {
    (3 * 5 * n + 2 * (n + 2)) * (n - 2)
}

/// Arena bytes [`run`] needs.
pub fn heap_bytes(class: Class, threads: usize) -> usize {
    let n = params(class).0;
    cfd::heap_bytes(n, true, work_len(n), threads)
}

/// One thread's solver work arrays (the reference's `lhs`, `lhsp`, `lhsm`, `cv` and
/// `rho?`), each laid out position by position, line by line.
pub(crate) struct Work<'a> {
    lhs: &'a mut [[f64; 5]],
    lhsp: &'a mut [[f64; 5]],
    lhsm: &'a mut [[f64; 5]],
    cv: &'a mut [f64],
    rho: &'a mut [f64],
}

impl<'a> Work<'a> {
    pub(crate) fn carve(n: usize, all: &'a mut [f64]) -> Work<'a> {
        let rows = n * (n - 2);
        let coefficients = (n + 2) * (n - 2);
        let (lhs, rest) = all.split_at_mut(5 * rows);
        let (lhsp, rest) = rest.split_at_mut(5 * rows);
        let (lhsm, rest) = rest.split_at_mut(5 * rows);
        let (cv, rho) = rest.split_at_mut(coefficients);
        Work {
            lhs: lhs.as_chunks_mut().0,
            lhsp: lhsp.as_chunks_mut().0,
            lhsm: lhsm.as_chunks_mut().0,
            cv,
            rho: &mut rho[..coefficients],
        }
    }
}

/// A set of grid lines solved together: `count` lines side by side (one point apart),
/// position `p` of line 0 at point `first + p * stride`.
#[derive(Clone, Copy)]
pub(crate) struct Lines {
    pub(crate) first: usize,
    pub(crate) stride: usize,
    pub(crate) count: usize,
}

impl Lines {
    /// The points at position `p` of every line.
    pub(crate) fn at(&self, p: usize) -> Range<usize> {
        let start = self.first + p * self.stride;
        start..start + self.count
    }

    /// The same, five values per point.
    pub(crate) fn at5(&self, p: usize) -> Range<usize> {
        let r = self.at(p);
        5 * r.start..5 * r.end
    }
}

/// One direction's implicit factor coefficients.
#[derive(Clone, Copy)]
pub(crate) struct Direction {
    dtt1: f64,
    dtt2: f64,
    c2dtt1: f64,
    /// The viscous eigenvalue bounds: `d? + con43 ru1`, `d5 + c1c5 ru1`, `dmax + ru1`,
    /// `d1` (`rhon`, `rhoq`, `rhos` in the reference).
    d: [f64; 4],
}

impl Direction {
    pub(crate) fn x(c: &Constants) -> Direction {
        Direction {
            dtt1: c.dttx1,
            dtt2: c.dttx2,
            c2dtt1: c.c2dttx1,
            d: [c.dx[1], c.dx[4], c.dxmax, c.dx[0]],
        }
    }

    pub(crate) fn y(c: &Constants) -> Direction {
        Direction {
            dtt1: c.dtty1,
            dtt2: c.dtty2,
            c2dtt1: c.c2dtty1,
            d: [c.dy[2], c.dy[4], c.dymax, c.dy[0]],
        }
    }

    pub(crate) fn z(c: &Constants) -> Direction {
        Direction {
            dtt1: c.dttz1,
            dtt2: c.dttz2,
            c2dtt1: c.c2dttz1,
            d: [c.dz[3], c.dz[4], c.dzmax, c.dz[0]],
        }
    }
}

/// Rows `p`, `p + 1` and `p + 2` of a work array of `nb` lines.
#[inline(always)]
fn three_rows<T>(x: &mut [T], p: usize, nb: usize) -> (&mut [T], &mut [T], &mut [T]) {
    let (a, rest) = x[p * nb..].split_at_mut(nb);
    let (b, rest) = rest.split_at_mut(nb);
    (a, b, &mut rest[..nb])
}

/// One step of forward elimination on components `LO..HI` of the right-hand side:
/// scales row 0 and eliminates its entries from rows 1 and 2.
#[inline(always)]
fn forward<const LO: usize, const HI: usize>(
    x0: &mut [f64; 5],
    x1: &mut [f64; 5],
    x2: &mut [f64; 5],
    r0: &mut [f64; 5],
    r1: &mut [f64; 5],
    r2: &mut [f64; 5],
) {
    let fac1 = 1.0 / x0[2];
    x0[3] = fac1 * x0[3];
    x0[4] = fac1 * x0[4];
    for m in LO..HI {
        r0[m] = fac1 * r0[m];
    }
    x1[2] = x1[2] - x1[1] * x0[3];
    x1[3] = x1[3] - x1[1] * x0[4];
    for m in LO..HI {
        r1[m] = r1[m] - x1[1] * r0[m];
    }
    x2[1] = x2[1] - x2[0] * x0[3];
    x2[2] = x2[2] - x2[0] * x0[4];
    for m in LO..HI {
        r2[m] = r2[m] - x2[0] * r0[m];
    }
}

/// The last two rows' elimination (no row 2 below them).
#[inline(always)]
fn forward_last<const LO: usize, const HI: usize>(
    x0: &mut [f64; 5],
    x1: &mut [f64; 5],
    r0: &mut [f64; 5],
    r1: &mut [f64; 5],
) {
    let fac1 = 1.0 / x0[2];
    x0[3] = fac1 * x0[3];
    x0[4] = fac1 * x0[4];
    for m in LO..HI {
        r0[m] = fac1 * r0[m];
    }
    x1[2] = x1[2] - x1[1] * x0[3];
    x1[3] = x1[3] - x1[1] * x0[4];
    for m in LO..HI {
        r1[m] = r1[m] - x1[1] * r0[m];
    }
}

/// `range` of `data` as five-value points.
///
/// # Safety
/// As [`Shared::slice_mut`].
#[allow(clippy::mut_from_ref)] // the caller's contract makes it exclusive
pub(crate) unsafe fn rows5(data: &Shared<f64>, range: Range<usize>) -> &mut [[f64; 5]] {
    // SAFETY: the caller's contract.
    unsafe { data.slice_mut(range) }.as_chunks_mut().0
}

/// `x_solve`, `y_solve` or `z_solve` (without the block-diagonal product that follows)
/// for `lines`: builds the three factors' pentadiagonal matrices and solves them in
/// place in `rhs`. `vel` is the velocity along the lines.
///
/// # Safety
/// This thread owns the right-hand side at every point of `lines`, and nobody writes
/// `rho_i`, `vel` or `speed` at those points meanwhile.
unsafe fn solve(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    dir: &Direction,
    vel: Shared<f64>,
    lines: Lines,
    w: &mut Work,
) {
    let (n, nb) = (g.n, lines.count);
    // SAFETY: the caller's contract.
    let factors = unsafe { factors(g, c, f, dir, vel, lines, 0..n, w) };
    if lines.stride == nb {
        // Consecutive positions (x lines): the lines' right-hand side is one slice.
        let first = lines.first;
        // SAFETY: points of lines this thread owns (the caller's contract).
        let all = unsafe { rows5(&f.rhs, 5 * first..5 * (first + n * nb)) };
        eliminate(n, nb, factors, &mut Consecutive { all, nb });
    } else {
        eliminate(n, nb, factors, &mut Strided { rhs: f.rhs, lines });
    }
}

/// The fourth-order dissipation added to the u factor's row at interior position `p`
/// of `n`.
fn damping(c: &Constants, p: usize, n: usize) -> [f64; 5] {
    let (z1, z4, z5, z6) = (c.comz1, c.comz4, c.comz5, c.comz6);
    if p == 1 {
        [0.0, 0.0, z5, -z4, z1]
    } else if p == 2 {
        [0.0, -z4, z6, -z4, z1]
    } else if p == n - 3 {
        [z1, -z4, z6, -z4, 0.0]
    } else if p == n - 2 {
        [z1, -z4, z5, 0.0, 0.0]
    } else {
        [z1, -z4, z6, -z4, z1]
    }
}

/// The three factors' pentadiagonal matrices of `lines` at positions `span` (of
/// `0..n`; row `p - span.start` of each), in `w`. `vel` is the velocity along the
/// lines; the coefficients reach one position beyond each end of `span`.
///
/// # Safety
/// Nobody writes `rho_i`, `vel` or `speed` at the lines' points meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn factors<'w>(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    dir: &Direction,
    vel: Shared<f64>,
    lines: Lines,
    span: Range<usize>,
    w: &'w mut Work,
) -> Factors<'w> {
    let n = g.n;
    let nb = lines.count;
    let rows = span.len() * nb;
    let (lhs, lhsp, lhsm) = (&mut w.lhs[..rows], &mut w.lhsp[..rows], &mut w.lhsm[..rows]);
    let speed = f.speed.expect("SP carves the speed of sound");
    // Positions `reach` have coefficients, position `p`'s at `(p - reach.start) * nb`.
    let reach = span.start.saturating_sub(1)..(span.end + 1).min(n);
    let (cv, rho) = (
        &mut w.cv[..reach.len() * nb],
        &mut w.rho[..reach.len() * nb],
    );

    // The eigenvalue coefficients along the lines.
    for p in reach.clone() {
        // SAFETY: nobody writes these (the caller's contract).
        let (rho_i, vel) = unsafe { (f.rho_i.slice(lines.at(p)), vel.slice(lines.at(p))) };
        let at = (p - reach.start) * nb;
        let (cv, rho) = (&mut cv[at..at + nb], &mut rho[at..at + nb]);
        for b in 0..nb {
            let ru1 = c.c3c4 * rho_i[b];
            cv[b] = vel[b];
            rho[b] = (dir.d[0] + c.con43 * ru1)
                .max(dir.d[1] + c.c1c5 * ru1)
                .max(dir.d[2] + ru1)
                .max(dir.d[3]);
        }
    }
    let coefficients = |p: usize| {
        let at = (p - reach.start) * nb;
        (&cv[at..at + nb], &rho[at..at + nb])
    };

    for p in span.clone() {
        let range = (p - span.start) * nb..(p - span.start + 1) * nb;
        let (l, lp, lm) = (
            &mut lhs[range.clone()],
            &mut lhsp[range.clone()],
            &mut lhsm[range],
        );
        if p == 0 || p == n - 1 {
            // `lhsinit`: the end rows are the identity.
            for x in [l, lp, lm] {
                x.fill([0.0, 0.0, 1.0, 0.0, 0.0]);
            }
            continue;
        }
        // The u factor, its dissipation, then the u + c and u - c factors.
        let ((cm, rm), (_, r0), (cp, rp)) =
            (coefficients(p - 1), coefficients(p), coefficients(p + 1));
        let d = damping(c, p, n);
        // SAFETY: nobody writes the speed of sound (the caller's contract).
        let (sm, sp) = unsafe { (speed.slice(lines.at(p - 1)), speed.slice(lines.at(p + 1))) };
        for b in 0..nb {
            let mut row = [
                0.0,
                -dir.dtt2 * cm[b] - dir.dtt1 * rm[b],
                1.0 + dir.c2dtt1 * r0[b],
                dir.dtt2 * cp[b] - dir.dtt1 * rp[b],
                0.0,
            ];
            for m in 0..5 {
                row[m] += d[m];
            }
            l[b] = row;
            lp[b] = [
                row[0],
                row[1] - dir.dtt2 * sm[b],
                row[2],
                row[3] + dir.dtt2 * sp[b],
                row[4],
            ];
            lm[b] = [
                row[0],
                row[1] + dir.dtt2 * sm[b],
                row[2],
                row[3] - dir.dtt2 * sp[b],
                row[4],
            ];
        }
    }
    Factors { lhs, lhsp, lhsm }
}

/// The three factors' matrices of a set of lines, position by position.
pub(crate) struct Factors<'a> {
    pub(crate) lhs: &'a mut [[f64; 5]],
    pub(crate) lhsp: &'a mut [[f64; 5]],
    pub(crate) lhsm: &'a mut [[f64; 5]],
}

/// The right-hand side of a set of lines, position by position (`nb` points each).
trait Positions {
    /// Positions `p`, `p + 1` and `p + 2`.
    fn three(&mut self, p: usize) -> [&mut [[f64; 5]]; 3];
}

/// Positions that follow each other in memory.
struct Consecutive<'a> {
    all: &'a mut [[f64; 5]],
    nb: usize,
}

impl Positions for Consecutive<'_> {
    #[inline(always)]
    fn three(&mut self, p: usize) -> [&mut [[f64; 5]]; 3] {
        let (a, b, c) = three_rows(self.all, p, self.nb);
        [a, b, c]
    }
}

/// Positions a stride apart, carved from the shared array one by one.
struct Strided {
    rhs: Shared<f64>,
    lines: Lines,
}

impl Positions for Strided {
    #[inline(always)]
    fn three(&mut self, p: usize) -> [&mut [[f64; 5]]; 3] {
        let nb = self.lines.count;
        // SAFETY: `solve`'s contract gives this thread the lines' points; the three
        // positions are distinct points (stride > count).
        core::array::from_fn(|d| &mut unsafe { rows5(&self.rhs, self.lines.at5(p + d)) }[..nb])
    }
}

/// The Thomas algorithm on the three factors at once: forward elimination, then
/// back-substitution, in place in the right-hand side (`n` positions, `nb` lines).
#[inline(always)]
fn eliminate(n: usize, nb: usize, x: Factors, rhs: &mut impl Positions) {
    let Factors { lhs, lhsp, lhsm } = x;
    for p in 0..n - 2 {
        let [r0, r1, r2] = rhs.three(p);
        let (r0, r1, r2) = (&mut r0[..nb], &mut r1[..nb], &mut r2[..nb]);
        let (a0, a1, a2) = three_rows(lhs, p, nb);
        let (p0, p1, p2) = three_rows(lhsp, p, nb);
        let (m0, m1, m2) = three_rows(lhsm, p, nb);
        for b in 0..nb {
            forward::<0, 3>(
                &mut a0[b], &mut a1[b], &mut a2[b], &mut r0[b], &mut r1[b], &mut r2[b],
            );
            forward::<3, 4>(
                &mut p0[b], &mut p1[b], &mut p2[b], &mut r0[b], &mut r1[b], &mut r2[b],
            );
            forward::<4, 5>(
                &mut m0[b], &mut m1[b], &mut m2[b], &mut r0[b], &mut r1[b], &mut r2[b],
            );
        }
    }
    // The last two rows (`three` at n - 3 reaches them).
    {
        let p = n - 2;
        let [_, r0, r1] = rhs.three(p - 1);
        let (r0, r1) = (&mut r0[..nb], &mut r1[..nb]);
        let (a0, a1) = lhs[p * nb..].split_at_mut(nb);
        let (p0, p1) = lhsp[p * nb..].split_at_mut(nb);
        let (m0, m1) = lhsm[p * nb..].split_at_mut(nb);
        for b in 0..nb {
            forward_last::<0, 3>(&mut a0[b], &mut a1[b], &mut r0[b], &mut r1[b]);
            let fac2 = 1.0 / a1[b][2];
            for m in 0..3 {
                r1[b][m] = fac2 * r1[b][m];
            }
            forward_last::<3, 4>(&mut p0[b], &mut p1[b], &mut r0[b], &mut r1[b]);
            forward_last::<4, 5>(&mut m0[b], &mut m1[b], &mut r0[b], &mut r1[b]);
            r1[b][3] /= p1[b][2];
            r1[b][4] /= m1[b][2];
        }
        let range = p * nb..(p + 1) * nb;
        let (a, ap, am) = (&lhs[range.clone()], &lhsp[range.clone()], &lhsm[range]);
        for b in 0..nb {
            for m in 0..3 {
                r0[b][m] -= a[b][3] * r1[b][m];
            }
            r0[b][3] -= ap[b][3] * r1[b][3];
            r0[b][4] -= am[b][3] * r1[b][4];
        }
    }
    for p in (0..n - 2).rev() {
        let [r0, r1, r2] = rhs.three(p);
        let (r0, r1, r2) = (&mut r0[..nb], &r1[..nb], &r2[..nb]);
        let range = p * nb..(p + 1) * nb;
        let (a, ap, am) = (&lhs[range.clone()], &lhsp[range.clone()], &lhsm[range]);
        for b in 0..nb {
            let (r0, r1, r2) = (&mut r0[b], &r1[b], &r2[b]);
            for m in 0..3 {
                r0[m] = r0[m] - a[b][3] * r1[m] - a[b][4] * r2[m];
            }
            r0[3] = r0[3] - ap[b][3] * r1[3] - ap[b][4] * r2[3];
            r0[4] = r0[4] - am[b][3] * r1[4] - am[b][4] * r2[4];
        }
    }
}

/// Applies `op` to the points of rows `rows` and columns `cols` of plane `k`:
/// `op(rhs, point)` with the point's storage index.
///
/// # Safety
/// This thread owns the right-hand side of those points.
#[inline(always)]
unsafe fn each_point(
    g: &Grid,
    f: &Fields,
    k: usize,
    (rows, cols): (Range<usize>, Range<usize>),
    mut op: impl FnMut(&mut [f64; 5], usize),
) {
    for j in rows {
        let first = g.at(cols.start, j, k);
        let points = first..first + cols.len();
        // SAFETY: the caller's contract.
        let rhs = unsafe { f.rhs.slice_mut(5 * points.start..5 * points.end) };
        for (r, at) in rhs.as_chunks_mut().0.iter_mut().zip(points) {
            op(r, at);
        }
    }
}

/// `txinvr` on the points of interior plane `k` in interior rows `rows` and columns
/// `cols`: the block-diagonal product by the inverse of the x eigenvector matrix.
///
/// # Safety
/// This thread owns those points of the right-hand side; nobody writes the scalars.
pub(crate) unsafe fn txinvr(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    s: &Scalars,
    k: usize,
    (rows, cols): (Range<usize>, Range<usize>),
) {
    // SAFETY: the caller's contract.
    unsafe {
        each_point(g, f, k, (rows, cols), |r, at| {
            let ru1 = s.rho_i[at];
            let (uu, vv, ww) = (s.us[at], s.vs[at], s.ws[at]);
            let ac = s.speed[at];
            let ac2inv = ac * ac;
            let [r1, r2, r3, r4, r5] = *r;
            let t1 = c.c2 / ac2inv * (s.qs[at] * r1 - uu * r2 - vv * r3 - ww * r4 + r5);
            let t2 = c.bt * ru1 * (uu * r1 - r2);
            let t3 = (c.bt * ru1 * ac) * t1;
            *r = [
                r1 - t1,
                -ru1 * (ww * r1 - r4),
                ru1 * (vv * r1 - r3),
                -t2 + t3,
                t2 + t3,
            ];
        })
    }
}

/// `ninvr` on the points of interior plane `k` in interior rows `rows` and columns
/// `cols`.
///
/// # Safety
/// This thread owns those points of the right-hand side.
pub(crate) unsafe fn ninvr(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    k: usize,
    (rows, cols): (Range<usize>, Range<usize>),
) {
    // SAFETY: the caller's contract.
    unsafe {
        each_point(g, f, k, (rows, cols), |r, _| {
            let [r1, r2, r3, r4, r5] = *r;
            let t1 = c.bt * r3;
            let t2 = 0.5 * (r4 + r5);
            *r = [-r2, r1, c.bt * (r4 - r5), -t1 + t2, t1 + t2];
        })
    }
}

/// `pinvr` on the points of interior plane `k` in interior rows `rows` and columns
/// `cols`.
///
/// # Safety
/// This thread owns those points of the right-hand side.
pub(crate) unsafe fn pinvr(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    k: usize,
    (rows, cols): (Range<usize>, Range<usize>),
) {
    // SAFETY: the caller's contract.
    unsafe {
        each_point(g, f, k, (rows, cols), |r, _| {
            let [r1, r2, r3, r4, r5] = *r;
            let t1 = c.bt * r1;
            let t2 = 0.5 * (r4 + r5);
            *r = [c.bt * (r4 - r5), -r3, r2, -t1 + t2, t1 + t2];
        })
    }
}

/// `tzetar` then `add` on the points `cols` (interior ones) of interior row `j` of
/// interior plane `k`.
///
/// # Safety
/// This thread owns those points of `u` and the right-hand side; nobody writes the
/// scalars.
pub(crate) unsafe fn tzetar_add(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    s: &Scalars,
    (j, k): (usize, usize),
    cols: Range<usize>,
) {
    let first = g.at(cols.start, j, k);
    // SAFETY: the caller's contract.
    let u = unsafe { f.u.slice_mut(5 * first..5 * (first + cols.len())) };
    let u = u.as_chunks_mut::<5>().0;
    // SAFETY: the caller's contract.
    unsafe {
        each_point(g, f, k, (j..j + 1, cols), |r, at| {
            let (xvel, yvel, zvel) = (s.us[at], s.vs[at], s.ws[at]);
            let ac = s.speed[at];
            let ac2u = ac * ac;
            let [r1, r2, r3, r4, r5] = *r;
            let u = &mut u[at - first];
            let uzik1 = u[0];
            let btuz = c.bt * uzik1;
            let t1 = btuz / ac * (r4 + r5);
            let t2 = r3 + t1;
            let t3 = btuz * (r4 - r5);
            *r = [
                t2,
                -uzik1 * r2 + xvel * t2,
                uzik1 * r1 + yvel * t2,
                zvel * t2 + t3,
                uzik1 * (-xvel * r2 + yvel * r1) + s.qs[at] * t2 + c.c2iv * ac2u * t1 + zvel * t3,
            ];
            for m in 0..5 {
                u[m] += r[m];
            }
        })
    }
}

/// Read-only views of the derived scalars (valid between the phase that writes them
/// and the next).
pub(crate) struct Scalars<'a> {
    rho_i: &'a [f64],
    us: &'a [f64],
    vs: &'a [f64],
    ws: &'a [f64],
    qs: &'a [f64],
    speed: &'a [f64],
}

impl<'a> Scalars<'a> {
    /// # Safety
    /// Nobody writes the scalars while the views are alive.
    pub(crate) unsafe fn of(f: &'a Fields) -> Scalars<'a> {
        // SAFETY: the caller's contract.
        unsafe {
            Scalars {
                rho_i: f.rho_i.all(),
                us: f.us.all(),
                vs: f.vs.all(),
                ws: f.ws.all(),
                qs: f.qs.all(),
                speed: f
                    .speed
                    .as_ref()
                    .expect("SP carves the speed of sound")
                    .all(),
            }
        }
    }
}

/// One time step (`adi`). Ends with a barrier.
fn adi(team: &Team, g: &Grid, c: &Constants, f: &Fields, w: &mut Work) {
    let (x, y, z) = (Direction::x(c), Direction::y(c), Direction::z(c));
    cfd::compute_rhs(team, g, c, f, |k| {
        if !g.interior().contains(&k) {
            return;
        }
        // SAFETY: plane k of rhs is this thread's in this phase; nobody writes the
        // scalars.
        unsafe {
            let s = Scalars::of(f);
            let plane = (g.interior(), g.interior());
            txinvr(g, c, f, &s, k, plane.clone());
            for j in g.interior() {
                let lines = Lines {
                    first: g.at(0, j, k),
                    stride: 1,
                    count: 1,
                };
                solve(g, c, f, &x, f.us, lines, w);
            }
            ninvr(g, c, f, k, plane.clone());
            let lines = Lines {
                first: g.at(1, 0, k),
                stride: g.ip,
                count: g.n - 2,
            };
            solve(g, c, f, &y, f.vs, lines, w);
            pinvr(g, c, f, k, plane);
        }
    });
    team.barrier();
    let rows = team.share(g.n - 2);
    for j in rows.start + 1..rows.end + 1 {
        // SAFETY: row j of every plane of u and rhs is this thread's in this phase;
        // nobody writes the scalars.
        unsafe {
            let s = Scalars::of(f);
            let lines = Lines {
                first: g.at(1, j, 0),
                stride: g.plane(),
                count: g.n - 2,
            };
            solve(g, c, f, &z, f.ws, lines, w);
            for k in g.interior() {
                tzetar_add(g, c, f, &s, (j, k), g.interior());
            }
        }
    }
    team.barrier();
}

/// Runs this thread's part of SP at `class`.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    let (n, niter, dt) = params(class);
    let app = App {
        n,
        niter,
        dt,
        with_speed: true,
        work_len: work_len(n),
    };
    let (seconds, xcr, xce) = cfd::drive(team, arena, &app, |team, g, c, f, work| {
        adi(team, g, c, f, &mut Work::carve(g.n, work))
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
    use std::vec::Vec;

    use super::*;
    use crate::testing::noise;

    /// `eliminate` solves three pentadiagonal systems per line (components 0-2 share
    /// `lhs`, 3 has `lhsp`, 4 `lhsm`): the solution it returns satisfies each system.
    #[test]
    fn eliminate_solves_the_three_pentadiagonal_systems() {
        let (n, nb) = (9, 3);
        // Diagonally dominant rows; entries outside the matrix are zero.
        let factor = |seed: u64| -> Vec<[f64; 5]> {
            let r = noise(5 * n * nb, seed);
            (0..n * nb)
                .map(|at| {
                    let p = at / nb;
                    let mut row: [f64; 5] = core::array::from_fn(|m| r[5 * at + m]);
                    row[2] += 6.0;
                    if p < 2 {
                        row[0] = 0.0;
                    }
                    if p < 1 {
                        row[1] = 0.0;
                    }
                    if p + 1 >= n {
                        row[3] = 0.0;
                    }
                    if p + 2 >= n {
                        row[4] = 0.0;
                    }
                    row
                })
                .collect()
        };
        let (mut lhs, mut lhsp, mut lhsm) = (factor(1), factor(2), factor(3));
        let x: Vec<[f64; 5]> = noise(5 * n * nb, 4)
            .chunks(5)
            .map(|c| core::array::from_fn(|m| c[m]))
            .collect();
        // b = A x, per line b and component m, with the component's factor.
        let mut b = std::vec![[0.0; 5]; n * nb];
        for p in 0..n {
            for l in 0..nb {
                for m in 0..5 {
                    let a = [&lhs, &lhs, &lhs, &lhsp, &lhsm][m][p * nb + l];
                    for d in 0..5 {
                        let q = p as isize + d as isize - 2;
                        if (0..n as isize).contains(&q) {
                            b[p * nb + l][m] += a[d] * x[q as usize * nb + l][m];
                        }
                    }
                }
            }
        }
        let factors = Factors {
            lhs: &mut lhs,
            lhsp: &mut lhsp,
            lhsm: &mut lhsm,
        };
        eliminate(n, nb, factors, &mut Consecutive { all: &mut b, nb });
        for (got, want) in b.iter().zip(&x) {
            for m in 0..5 {
                assert!((got[m] - want[m]).abs() < 1e-12, "{got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn mops_is_the_reference_formula() {
        // Class S: (881.174 * 12^3 - 4683.91 * 144 + 11484.5 * 12 - 19272.4) * 100.
        let ops = (881.174 * 1728.0 - 4683.91 * 144.0 + 11484.5 * 12.0 - 19272.4) * 100.0;
        assert!((mops(Class::S, 2.0) - ops / 2e6).abs() < 1e-9);
    }

    #[test]
    fn verify_wants_every_norm_within_1e_8() {
        for &class in crate::Kernel::Sp.classes() {
            let (xcr, xce) = reference(class);
            assert!(verify(class, &xcr, &xce));
            for k in 0..10 {
                for factor in [1.0 + 2e-8, f64::NAN] {
                    let mut norms = [xcr, xce];
                    norms[k / 5][k % 5] *= factor;
                    assert!(!verify(class, &norms[0], &norms[1]), "{class:?} {k}");
                }
            }
        }
    }
}
