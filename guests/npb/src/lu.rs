//! LU, the lower-upper symmetric Gauss-Seidel pseudo-application (NPB 3.3 `LU`): the
//! same 3-D compressible Navier-Stokes equations and manufactured solution as SP and BT,
//! solved by SSOR (symmetric successive over-relaxation) iterations. Each iteration
//! (`ssor`) scales the residual by the time step, sweeps the lower triangular factor
//! up the grid (`jacld` + `blts`, point by point) and the upper one back down
//! (`jacu` + `buts`), adds the correction to `u`, and recomputes the residual (`rhs`).
//!
//! Storage is SP/BT's ([`cfd::Grid`]): point `(i, j, k)` (0-based here, 1-based in the
//! reference) at `(k * jp + j) * ip + i`, five values per point kept together.
//!
//! Parallel split. `rhs`, `erhs`, `setbv`/`setiv`, the norms and the final error work
//! plane by plane (`k`); the scaling and the update of `u` row by row (`j`). The sweeps
//! are a wavefront: point `(i, j, k)` of the lower sweep needs `(i - 1, j, k)`,
//! `(i, j - 1, k)` and `(i, j, k - 1)` finished. Each thread owns a block of rows `j`
//! in every plane and the team runs a pipeline over the planes, as NPB3.3-OMP's LU:
//! in stage `s` thread `t` sweeps its rows of plane `s - t`, so it starts a plane when
//! it has finished its own rows of the plane below and thread `t - 1` has finished the
//! rows just south of its own in the same plane (in the stage before). NPB-OMP waits
//! on per-thread flags; the team here has only barriers, so every stage ends with one
//! (a sweep costs `planes + threads - 1` of them). The upper sweep runs the pipeline
//! the other way (top plane first, thread `size - 1` first). Every point is computed
//! with the same operations in the same order as the serial reference, so the result
//! does not depend on the thread count except through the norms' rank-ordered sums.
//!
//! Every expression keeps the reference's operation order: verification is at 1e-8.
//! The MPI form (`mpi::lu`) calls the same per-point functions (`Flow::point`, `lower`,
//! `upper`, `initial`, `derived`, `pressure`) on its blocks, which have their own
//! layout (hence the strides in `State` and `Flow::point`).

// Statements are written as the reference's (`a = a - b * c`, indexed loops over the
// five components) so that each one's operation order can be checked against it.
#![allow(clippy::assign_op_pattern, clippy::needless_range_loop)]

use core::ops::Range;

use crate::cfd::{self, ALIGN_SLACK, Grid};
use crate::team::{Arena, Reduction, Shared, Team};
use crate::{Class, Outcome};

/// Relative error allowed on each norm and the surface integral, as the reference's
/// `verify`.
pub const EPSILON: f64 = 1.0e-8;

/// The over-relaxation factor (`omega_default`).
pub(crate) const OMEGA: f64 = 1.2;

const C1: f64 = 1.40;
const C2: f64 = 0.40;
const C3: f64 = 1.00e-01;
const C4: f64 = 1.00;
const C5: f64 = 1.40;
const R43: f64 = 4.0 / 3.0;
const C1345: f64 = C1 * C3 * C4 * C5;
const C34: f64 = C3 * C4;

/// Grid points a side, SSOR iterations and time step of `class` (`setparams`).
pub fn params(class: Class) -> (usize, usize, f64) {
    match class {
        Class::S => (12, 50, 0.5),
        Class::W => (33, 300, 1.5e-3),
        Class::A => (64, 250, 2.0),
        Class::B => (102, 250, 2.0),
        Class::C => (162, 250, 2.0),
    }
}

/// The official residual norms (`xcrref`), error norms (`xceref`) and surface
/// integral (`xciref`) of `class`.
#[allow(clippy::excessive_precision)] // digits as published by NASA
pub fn reference(class: Class) -> ([f64; 5], [f64; 5], f64) {
    match class {
        Class::S => (
            [
                1.6196343210976702e-02,
                2.1976745164821318e-03,
                1.5179927653399185e-03,
                1.5029584435994323e-03,
                3.4264073155896461e-02,
            ],
            [
                6.4223319957960924e-04,
                8.4144342047347926e-05,
                5.8588269616485186e-05,
                5.8474222595157350e-05,
                1.3103347914111294e-03,
            ],
            7.8418928865937083e+00,
        ),
        Class::W => (
            [
                0.1236511638192e+02,
                0.1317228477799e+01,
                0.2550120713095e+01,
                0.2326187750252e+01,
                0.2826799444189e+02,
            ],
            [
                0.4867877144216e+00,
                0.5064652880982e-01,
                0.9281818101960e-01,
                0.8570126542733e-01,
                0.1084277417792e+01,
            ],
            0.1161399311023e+02,
        ),
        Class::A => (
            [
                7.7902107606689367e+02,
                6.3402765259692870e+01,
                1.9499249727292479e+02,
                1.7845301160418537e+02,
                1.8384760349464247e+03,
            ],
            [
                2.9964085685471943e+01,
                2.8194576365003349e+00,
                7.3473412698774742e+00,
                6.7139225687777051e+00,
                7.0715315688392578e+01,
            ],
            2.6030925604886277e+01,
        ),
        Class::B => (
            [
                3.5532672969982736e+03,
                2.6214750795310692e+02,
                8.8333721850952190e+02,
                7.7812774739425265e+02,
                7.3087969592545314e+03,
            ],
            [
                1.1401176380212709e+02,
                8.1098963655421574e+00,
                2.8480597317698308e+01,
                2.5905394567832939e+01,
                2.6054907504857413e+02,
            ],
            4.7887162703308227e+01,
        ),
        Class::C => (
            [
                1.03766980323537846e+04,
                8.92212458801008552e+02,
                2.56238814582660871e+03,
                2.19194343857831427e+03,
                1.78078057261061185e+04,
            ],
            [
                2.15986399716949279e+02,
                1.55789559239863600e+01,
                5.41318863077207766e+01,
                4.82262643154045421e+01,
                4.55902910043250358e+02,
            ],
            6.66404553572181300e+01,
        ),
    }
}

/// Whether every norm and the surface integral match the official values within
/// [`EPSILON`] (NaN fails).
pub fn verify(class: Class, xcr: &[f64; 5], xce: &[f64; 5], xci: f64) -> bool {
    let (xcrref, xceref, xciref) = reference(class);
    cfd::close(xcr, &xcrref, EPSILON)
        && cfd::close(xce, &xceref, EPSILON)
        && libm::fabs((xci - xciref) / xciref) <= EPSILON
}

/// Mop/s by the reference's operation count.
pub fn mops(class: Class, seconds: f64) -> f64 {
    let (n, itmax, _) = params(class);
    let n = n as f64;
    let mean = (3.0 * n) / 3.0;
    itmax as f64
        * (1984.77 * n * n * n - 10923.3 * mean * mean + 27770.9 * (3.0 * n) / 3.0 - 144010.0)
        / (seconds * 1.0e6)
}

/// Arena bytes [`run`] needs.
pub fn heap_bytes(class: Class, threads: usize) -> usize {
    let points = Grid::new(params(class).0).points();
    (3 * 5 + 2) * points * core::mem::size_of::<f64>() + 5 * ALIGN_SLACK + Reduction::bytes(threads)
}

/// The reference's `setcoeff` values LU reads (its dissipation coefficients `dx1..dx5`
/// are all `dx`, and likewise `dy`, `dz`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Constants {
    pub(crate) n: usize,
    pub(crate) dt: f64,
    pub(crate) dxi: f64,
    pub(crate) deta: f64,
    pub(crate) dzeta: f64,
    tx1: f64,
    tx2: f64,
    tx3: f64,
    ty1: f64,
    ty2: f64,
    ty3: f64,
    tz1: f64,
    tz2: f64,
    tz3: f64,
    dx: f64,
    dy: f64,
    dz: f64,
    dssp: f64,
}

impl Constants {
    /// `setcoeff` for a cubic grid of `n` points and time step `dt`.
    pub(crate) fn new(n: usize, dt: f64) -> Constants {
        let d = 1.0 / (n - 1) as f64;
        let (dx, dy, dz) = (0.75, 0.75, 1.0);
        Constants {
            n,
            dt,
            dxi: d,
            deta: d,
            dzeta: d,
            tx1: 1.0 / (d * d),
            tx2: 1.0 / (2.0 * d),
            tx3: 1.0 / d,
            ty1: 1.0 / (d * d),
            ty2: 1.0 / (2.0 * d),
            ty3: 1.0 / d,
            tz1: 1.0 / (d * d),
            tz2: 1.0 / (2.0 * d),
            tz3: 1.0 / d,
            dx,
            dy,
            dz,
            dssp: f64::max(dx, f64::max(dy, dz)) / 4.0,
        }
    }

    /// `exact`: the exact solution at grid point `(i, j, k)` (coordinates by division,
    /// as the reference).
    pub(crate) fn exact(&self, i: usize, j: usize, k: usize) -> [f64; 5] {
        let m = (self.n - 1) as f64;
        cfd::polynomial(&cfd::CE, i as f64 / m, j as f64 / m, k as f64 / m)
    }
}

/// The fields of a run, shared by the team.
#[derive(Clone, Copy)]
struct Fields {
    /// The conserved variables, five per point.
    u: Shared<f64>,
    /// The residual, then (in place, during a sweep) the correction, five per point.
    rsd: Shared<f64>,
    /// The exact solution's forcing term, five per point.
    frct: Shared<f64>,
    /// `0.5 |momentum|^2 / density` per point.
    qs: Shared<f64>,
    /// `1 / density` per point.
    rho_i: Shared<f64>,
}

impl Fields {
    fn carve(arena: &mut Arena, g: &Grid) -> Fields {
        let points = g.points();
        Fields {
            u: arena.alloc(5 * points),
            rsd: arena.alloc(5 * points),
            frct: arena.alloc(5 * points),
            qs: arena.alloc(points),
            rho_i: arena.alloc(points),
        }
    }
}

/// Storage indices of the `n` points of row `j` of plane `k`.
fn row(g: &Grid, j: usize, k: usize) -> Range<usize> {
    let at = g.at(0, j, k);
    at..at + g.n
}

/// Row `j` of plane `k` of a five-value field, for reading.
///
/// # Safety
/// As [`Shared::slice`].
unsafe fn row5<'a>(data: &'a Shared<f64>, g: &Grid, j: usize, k: usize) -> &'a [[f64; 5]] {
    let r = row(g, j, k);
    // SAFETY: the caller's contract.
    unsafe { data.slice(5 * r.start..5 * r.end) }.as_chunks().0
}

/// Row `j` of plane `k` of a five-value field, for writing.
///
/// # Safety
/// As [`Shared::slice_mut`].
#[allow(clippy::mut_from_ref)] // the caller's contract makes it exclusive
unsafe fn row5_mut<'a>(data: &'a Shared<f64>, g: &Grid, j: usize, k: usize) -> &'a mut [[f64; 5]] {
    let r = row(g, j, k);
    // SAFETY: the caller's contract.
    unsafe { data.slice_mut(5 * r.start..5 * r.end) }
        .as_chunks_mut()
        .0
}

/// What the flux terms of `rhs` and `erhs` read: the five variables `v` of every point
/// (`u`, or in `erhs` the exact solution) and, for `rhs`, their stored `rho_i` and
/// `qs`. `EXACT` selects `erhs`'s forms, which divide where `rhs` multiplies by the
/// stored inverse (different roundings, kept as the reference).
pub(crate) struct Flow<'a, const EXACT: bool> {
    pub(crate) v: &'a [[f64; 5]],
    pub(crate) rho_i: &'a [f64],
    pub(crate) qs: &'a [f64],
}

impl<const EXACT: bool> Flow<'_, EXACT> {
    /// The inviscid flux along velocity component `a` (1, 2 or 3) at point `at`.
    #[inline(always)]
    fn inviscid(&self, at: usize, a: usize) -> [f64; 5] {
        let v = &self.v[at];
        let (ua, q) = if EXACT {
            (
                v[a] / v[0],
                0.50 * (v[1] * v[1] + v[2] * v[2] + v[3] * v[3]) / v[0],
            )
        } else {
            (v[a] * self.rho_i[at], self.qs[at])
        };
        let mut f = [
            v[a],
            v[1] * ua,
            v[2] * ua,
            v[3] * ua,
            (C1 * v[4] - C2 * q) * ua,
        ];
        f[a] = v[a] * ua + C2 * (v[4] - q);
        f
    }

    /// The viscous flux along component `a` between points `before` and `at`, scaled
    /// by `t3` (slot 0 unused).
    #[inline(always)]
    fn viscous(&self, at: usize, before: usize, a: usize, t3: f64) -> [f64; 5] {
        let (p, m) = (&self.v[at], &self.v[before]);
        let (tp, tm) = if EXACT {
            (1.0 / p[0], 1.0 / m[0])
        } else {
            (self.rho_i[at], self.rho_i[before])
        };
        let up = [0.0, tp * p[1], tp * p[2], tp * p[3], tp * p[4]];
        let um = [0.0, tm * m[1], tm * m[2], tm * m[3], tm * m[4]];
        let mut g = [
            0.0,
            t3 * (up[1] - um[1]),
            t3 * (up[2] - um[2]),
            t3 * (up[3] - um[3]),
            0.0,
        ];
        g[a] = R43 * t3 * (up[a] - um[a]);
        g[4] = 0.50
            * (1.0 - C1 * C5)
            * t3
            * ((up[1] * up[1] + up[2] * up[2] + up[3] * up[3])
                - (um[1] * um[1] + um[2] * um[2] + um[3] * um[3]))
            + (1.0 / 6.0) * t3 * (up[a] * up[a] - um[a] * um[a])
            + C1 * C5 * t3 * (up[4] - um[4]);
        g
    }

    /// Adds one direction's flux differences, second differences and fourth-order
    /// dissipation at point `at` (position `p` of `n` along the direction, neighbours
    /// `stride` apart, velocity component `a`) to `out`. `t` is `(t?1, t?2, t?3)`,
    /// `d` the direction's dissipation coefficient.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn direction(
        &self,
        out: &mut [f64; 5],
        at: usize,
        p: usize,
        n: usize,
        stride: usize,
        a: usize,
        t: (f64, f64, f64),
        d: f64,
        dssp: f64,
    ) {
        let (t1, t2, t3) = t;
        let (before, after) = (at - stride, at + stride);
        let (fp, fm) = (self.inviscid(after, a), self.inviscid(before, a));
        for m in 0..5 {
            out[m] = out[m] - t2 * (fp[m] - fm[m]);
        }
        let (gp, g0) = (
            self.viscous(after, at, a, t3),
            self.viscous(at, before, a, t3),
        );
        let (vm, v0, vp) = (&self.v[before], &self.v[at], &self.v[after]);
        // erhs writes the zeta second difference from the far side.
        let second = |m: usize| {
            if EXACT && a == 3 {
                vp[m] - 2.0 * v0[m] + vm[m]
            } else {
                vm[m] - 2.0 * v0[m] + vp[m]
            }
        };
        out[0] = out[0] + d * t1 * second(0);
        for m in 1..5 {
            out[m] = out[m] + t3 * C3 * C4 * (gp[m] - g0[m]) + d * t1 * second(m);
        }
        // Position q of the line is `q - p` strides from `at` (asked only within two).
        for m in 0..5 {
            out[m] =
                out[m] - dssp * cfd::dissipation(p, n, |q| self.v[at + q * stride - p * stride][m]);
        }
    }

    /// The xi, eta and zeta terms of interior plane `k`, added to `out` (that plane of
    /// `rsd` or `frct`, five values per point).
    fn plane(&self, g: &Grid, c: &Constants, out: &mut [[f64; 5]], k: usize) {
        let base = g.at(0, 0, k);
        for j in g.interior() {
            for i in g.interior() {
                let at = g.at(i, j, k);
                self.point(c, &mut out[at - base], at, [i, j, k], [1, g.ip, g.plane()]);
            }
        }
    }

    /// The xi, eta and zeta terms of the interior grid point `(i, j, k)` = `pos`,
    /// stored at `at` with its neighbours along the three axes `strides` apart (at
    /// least two on each side stored), added to `out` (its value of `rsd` or `frct`).
    #[inline(always)]
    pub(crate) fn point(
        &self,
        c: &Constants,
        out: &mut [f64; 5],
        at: usize,
        pos: [usize; 3],
        strides: [usize; 3],
    ) {
        let n = c.n;
        let tx = (c.tx1, c.tx2, c.tx3);
        let ty = (c.ty1, c.ty2, c.ty3);
        let tz = (c.tz1, c.tz2, c.tz3);
        self.direction(out, at, pos[0], n, strides[0], 1, tx, c.dx, c.dssp);
        self.direction(out, at, pos[1], n, strides[1], 2, ty, c.dy, c.dssp);
        self.direction(out, at, pos[2], n, strides[2], 3, tz, c.dz, c.dssp);
    }
}

/// `erhs`: the forcing term `frct` that makes the exact solution steady, in parallel
/// by plane (`rsd` holds the exact solution meanwhile). Ends with a barrier.
fn erhs(team: &Team, g: &Grid, c: &Constants, f: &Fields) {
    for k in team.share(g.n) {
        // SAFETY: plane k of frct and rsd is this thread's in this phase.
        let (frct, rsd) = unsafe {
            (
                f.frct.slice_mut(g.plane_range(k, 5)),
                f.rsd.slice_mut(g.plane_range(k, 5)),
            )
        };
        let (frct, rsd) = (frct.as_chunks_mut::<5>().0, rsd.as_chunks_mut::<5>().0);
        for j in 0..g.n {
            for i in 0..g.n {
                let at = j * g.ip + i;
                frct[at] = [0.0; 5];
                rsd[at] = c.exact(i, j, k);
            }
        }
    }
    team.barrier();
    // SAFETY: nobody writes rsd in this phase.
    let v = unsafe { f.rsd.all() }.as_chunks().0;
    let flow = Flow::<true> {
        v,
        rho_i: &[],
        qs: &[],
    };
    for k in team.share(g.n) {
        if g.interior().contains(&k) {
            // SAFETY: plane k of frct is this thread's in this phase.
            let out = unsafe { f.frct.slice_mut(g.plane_range(k, 5)) };
            flow.plane(g, c, out.as_chunks_mut().0, k);
        }
    }
    team.barrier();
}

/// `rhs`: the steady-state residual `rsd` of `u`, in parallel by plane (first
/// `rho_i` and `qs`, then the flux terms). Ends with a barrier.
fn rhs(team: &Team, g: &Grid, f: &Fields, c: &Constants) {
    for k in team.share(g.n) {
        // SAFETY: plane k of rsd, rho_i and qs is this thread's in this phase; nobody
        // writes u or frct.
        unsafe {
            let rsd = f.rsd.slice_mut(g.plane_range(k, 5));
            let frct = f.frct.slice(g.plane_range(k, 5));
            let u = f.u.slice(g.plane_range(k, 5));
            let rho_i = f.rho_i.slice_mut(g.plane_range(k, 1));
            let qs = f.qs.slice_mut(g.plane_range(k, 1));
            for j in 0..g.n {
                for i in 0..g.n {
                    let at = j * g.ip + i;
                    for m in 0..5 {
                        rsd[5 * at + m] = -frct[5 * at + m];
                    }
                    (rho_i[at], qs[at]) = derived(&u[5 * at..5 * at + 5]);
                }
            }
        }
    }
    team.barrier();
    // SAFETY: nobody writes u, rho_i or qs in this phase.
    let flow = unsafe {
        Flow::<false> {
            v: f.u.all().as_chunks().0,
            rho_i: f.rho_i.all(),
            qs: f.qs.all(),
        }
    };
    for k in team.share(g.n) {
        if g.interior().contains(&k) {
            // SAFETY: plane k of rsd is this thread's in this phase.
            let out = unsafe { f.rsd.slice_mut(g.plane_range(k, 5)) };
            flow.plane(g, c, out.as_chunks_mut().0, k);
        }
    }
    team.barrier();
}

/// `rhs`'s `rho_i` and `qs` of a point's five values `u`.
#[inline(always)]
pub(crate) fn derived(u: &[f64]) -> (f64, f64) {
    let tmp = 1.0 / u[0];
    (tmp, 0.50 * (u[1] * u[1] + u[2] * u[2] + u[3] * u[3]) * tmp)
}

/// `setbv` and `setiv` on plane `k` (`u` is that plane).
fn setbv_setiv(g: &Grid, c: &Constants, u: &mut [[f64; 5]], k: usize) {
    for j in 0..g.n {
        for i in 0..g.n {
            u[j * g.ip + i] = initial(c, i, j, k);
        }
    }
}

/// `setbv` and `setiv` at grid point `(i, j, k)`: the exact solution on the boundary,
/// transfinite interpolation of it inside.
pub(crate) fn initial(c: &Constants, i: usize, j: usize, k: usize) -> [f64; 5] {
    let last = c.n - 1;
    let boundary = k == 0 || k == last || j == 0 || j == last || i == 0 || i == last;
    if boundary {
        return c.exact(i, j, k);
    }
    let m = last as f64;
    let (xi, eta, zeta) = (i as f64 / m, j as f64 / m, k as f64 / m);
    let (ue_1jk, ue_nx0jk) = (c.exact(0, j, k), c.exact(last, j, k));
    let (ue_i1k, ue_iny0k) = (c.exact(i, 0, k), c.exact(i, last, k));
    let (ue_ij1, ue_ijnz) = (c.exact(i, j, 0), c.exact(i, j, last));
    core::array::from_fn(|m| {
        let pxi = (1.0 - xi) * ue_1jk[m] + xi * ue_nx0jk[m];
        let peta = (1.0 - eta) * ue_i1k[m] + eta * ue_iny0k[m];
        let pzeta = (1.0 - zeta) * ue_ij1[m] + zeta * ue_ijnz[m];
        pxi + peta + pzeta - pxi * peta - peta * pzeta - pzeta * pxi + pxi * peta * pzeta
    })
}

/// `setbv` then `setiv`, in parallel by plane. Ends with a barrier.
fn initialize(team: &Team, g: &Grid, c: &Constants, f: &Fields) {
    for k in team.share(g.n) {
        // SAFETY: plane k of u is this thread's.
        let u = unsafe { f.u.slice_mut(g.plane_range(k, 5)) };
        setbv_setiv(g, c, u.as_chunks_mut().0, k);
    }
    team.barrier();
}

/// A 5x5 block, `[row][column]` (the reference's `(m, n)`).
type Block = [[f64; 5]; 5];

/// What `jacld` and `jacu` read: `u`, `rho_i` and `qs` of every point, and the
/// storage's strides between rows (`j`) and planes (`k`).
pub(crate) struct State<'a> {
    pub(crate) u: &'a [[f64; 5]],
    pub(crate) rho_i: &'a [f64],
    pub(crate) qs: &'a [f64],
    pub(crate) row: usize,
    pub(crate) plane: usize,
}

/// The diagonal block's shared diffusion term `dt * 2 * (tx1 * dx + ty1 * dy + tz1 * dz)`.
fn diffusion(c: &Constants) -> f64 {
    c.dt * 2.0 * (c.tx1 * c.dx + c.ty1 * c.dy + c.tz1 * c.dz)
}

/// `jacld` at point `at`: the diagonal block `d` and the lower blocks `a` (from
/// `k - 1`), `b` (`j - 1`) and `c` (`i - 1`) of the implicit operator.
#[inline(always)]
fn jacld(c: &Constants, s: &State, at: usize) -> (Block, Block, Block, Block) {
    let (dt, tx1, tx2, ty1, ty2, tz1, tz2) = (c.dt, c.tx1, c.tx2, c.ty1, c.ty2, c.tz1, c.tz2);
    let (dx, dy, dz) = (c.dx, c.dy, c.dz);
    let diff = diffusion(c);

    let tmp1 = s.rho_i[at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[at];
    let d = [
        [1.0 + diff, 0.0, 0.0, 0.0, 0.0],
        [
            -dt * 2.0 * (tx1 * R43 + ty1 + tz1) * C34 * tmp2 * u2,
            1.0 + dt * 2.0 * C34 * tmp1 * (tx1 * R43 + ty1 + tz1) + diff,
            0.0,
            0.0,
            0.0,
        ],
        [
            -dt * 2.0 * (tx1 + ty1 * R43 + tz1) * C34 * tmp2 * u3,
            0.0,
            1.0 + dt * 2.0 * C34 * tmp1 * (tx1 + ty1 * R43 + tz1) + diff,
            0.0,
            0.0,
        ],
        [
            -dt * 2.0 * (tx1 + ty1 + tz1 * R43) * C34 * tmp2 * u4,
            0.0,
            0.0,
            1.0 + dt * 2.0 * C34 * tmp1 * (tx1 + ty1 + tz1 * R43) + diff,
            0.0,
        ],
        [
            d51(c, tmp2, tmp3, u2, u3, u4, u5),
            dt * 2.0
                * tmp2
                * u2
                * (tx1 * (R43 * C34 - C1345) + ty1 * (C34 - C1345) + tz1 * (C34 - C1345)),
            dt * 2.0
                * tmp2
                * u3
                * (tx1 * (C34 - C1345) + ty1 * (R43 * C34 - C1345) + tz1 * (C34 - C1345)),
            dt * 2.0
                * tmp2
                * u4
                * (tx1 * (C34 - C1345) + ty1 * (C34 - C1345) + tz1 * (R43 * C34 - C1345)),
            d55(c, tmp1),
        ],
    ];

    let b_at = at - s.plane;
    let tmp1 = s.rho_i[b_at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[b_at];
    let qs = s.qs[b_at];
    let a = [
        [-dt * tz1 * dz, 0.0, 0.0, -dt * tz2, 0.0],
        [
            -dt * tz2 * (-(u2 * u4) * tmp2) - dt * tz1 * (-C34 * tmp2 * u2),
            -dt * tz2 * (u4 * tmp1) - dt * tz1 * C34 * tmp1 - dt * tz1 * dz,
            0.0,
            -dt * tz2 * (u2 * tmp1),
            0.0,
        ],
        [
            -dt * tz2 * (-(u3 * u4) * tmp2) - dt * tz1 * (-C34 * tmp2 * u3),
            0.0,
            -dt * tz2 * (u4 * tmp1) - dt * tz1 * (C34 * tmp1) - dt * tz1 * dz,
            -dt * tz2 * (u3 * tmp1),
            0.0,
        ],
        [
            -dt * tz2 * (-(u4 * tmp1) * (u4 * tmp1) + C2 * qs * tmp1)
                - dt * tz1 * (-R43 * C34 * tmp2 * u4),
            -dt * tz2 * (-C2 * (u2 * tmp1)),
            -dt * tz2 * (-C2 * (u3 * tmp1)),
            -dt * tz2 * (2.0 - C2) * (u4 * tmp1) - dt * tz1 * (R43 * C34 * tmp1) - dt * tz1 * dz,
            -dt * tz2 * C2,
        ],
        [
            -dt * tz2 * ((C2 * 2.0 * qs - C1 * u5) * u4 * tmp2)
                - dt * tz1
                    * (-(C34 - C1345) * tmp3 * (u2 * u2)
                        - (C34 - C1345) * tmp3 * (u3 * u3)
                        - (R43 * C34 - C1345) * tmp3 * (u4 * u4)
                        - C1345 * tmp2 * u5),
            -dt * tz2 * (-C2 * (u2 * u4) * tmp2) - dt * tz1 * (C34 - C1345) * tmp2 * u2,
            -dt * tz2 * (-C2 * (u3 * u4) * tmp2) - dt * tz1 * (C34 - C1345) * tmp2 * u3,
            -dt * tz2 * (C1 * (u5 * tmp1) - C2 * (qs * tmp1 + u4 * u4 * tmp2))
                - dt * tz1 * (R43 * C34 - C1345) * tmp2 * u4,
            -dt * tz2 * (C1 * (u4 * tmp1)) - dt * tz1 * C1345 * tmp1 - dt * tz1 * dz,
        ],
    ];

    let s_at = at - s.row;
    let tmp1 = s.rho_i[s_at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[s_at];
    let qs = s.qs[s_at];
    let b = [
        [-dt * ty1 * dy, 0.0, -dt * ty2, 0.0, 0.0],
        [
            -dt * ty2 * (-(u2 * u3) * tmp2) - dt * ty1 * (-C34 * tmp2 * u2),
            -dt * ty2 * (u3 * tmp1) - dt * ty1 * (C34 * tmp1) - dt * ty1 * dy,
            -dt * ty2 * (u2 * tmp1),
            0.0,
            0.0,
        ],
        [
            -dt * ty2 * (-(u3 * tmp1) * (u3 * tmp1) + C2 * (qs * tmp1))
                - dt * ty1 * (-R43 * C34 * tmp2 * u3),
            -dt * ty2 * (-C2 * (u2 * tmp1)),
            -dt * ty2 * ((2.0 - C2) * (u3 * tmp1)) - dt * ty1 * (R43 * C34 * tmp1) - dt * ty1 * dy,
            -dt * ty2 * (-C2 * (u4 * tmp1)),
            -dt * ty2 * C2,
        ],
        [
            -dt * ty2 * (-(u3 * u4) * tmp2) - dt * ty1 * (-C34 * tmp2 * u4),
            0.0,
            -dt * ty2 * (u4 * tmp1),
            -dt * ty2 * (u3 * tmp1) - dt * ty1 * (C34 * tmp1) - dt * ty1 * dy,
            0.0,
        ],
        [
            -dt * ty2 * ((C2 * 2.0 * qs - C1 * u5) * (u3 * tmp2))
                - dt * ty1
                    * (-(C34 - C1345) * tmp3 * (u2 * u2)
                        - (R43 * C34 - C1345) * tmp3 * (u3 * u3)
                        - (C34 - C1345) * tmp3 * (u4 * u4)
                        - C1345 * tmp2 * u5),
            -dt * ty2 * (-C2 * (u2 * u3) * tmp2) - dt * ty1 * (C34 - C1345) * tmp2 * u2,
            -dt * ty2 * (C1 * (u5 * tmp1) - C2 * (qs * tmp1 + u3 * u3 * tmp2))
                - dt * ty1 * (R43 * C34 - C1345) * tmp2 * u3,
            -dt * ty2 * (-C2 * (u3 * u4) * tmp2) - dt * ty1 * (C34 - C1345) * tmp2 * u4,
            -dt * ty2 * (C1 * (u3 * tmp1)) - dt * ty1 * C1345 * tmp1 - dt * ty1 * dy,
        ],
    ];

    let w_at = at - 1;
    let tmp1 = s.rho_i[w_at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[w_at];
    let qs = s.qs[w_at];
    let cx = [
        [-dt * tx1 * dx, -dt * tx2, 0.0, 0.0, 0.0],
        [
            -dt * tx2 * (-(u2 * tmp1) * (u2 * tmp1) + C2 * qs * tmp1)
                - dt * tx1 * (-R43 * C34 * tmp2 * u2),
            -dt * tx2 * ((2.0 - C2) * (u2 * tmp1)) - dt * tx1 * (R43 * C34 * tmp1) - dt * tx1 * dx,
            -dt * tx2 * (-C2 * (u3 * tmp1)),
            -dt * tx2 * (-C2 * (u4 * tmp1)),
            -dt * tx2 * C2,
        ],
        [
            -dt * tx2 * (-(u2 * u3) * tmp2) - dt * tx1 * (-C34 * tmp2 * u3),
            -dt * tx2 * (u3 * tmp1),
            -dt * tx2 * (u2 * tmp1) - dt * tx1 * (C34 * tmp1) - dt * tx1 * dx,
            0.0,
            0.0,
        ],
        [
            -dt * tx2 * (-(u2 * u4) * tmp2) - dt * tx1 * (-C34 * tmp2 * u4),
            -dt * tx2 * (u4 * tmp1),
            0.0,
            -dt * tx2 * (u2 * tmp1) - dt * tx1 * (C34 * tmp1) - dt * tx1 * dx,
            0.0,
        ],
        [
            -dt * tx2 * ((C2 * 2.0 * qs - C1 * u5) * u2 * tmp2)
                - dt * tx1
                    * (-(R43 * C34 - C1345) * tmp3 * (u2 * u2)
                        - (C34 - C1345) * tmp3 * (u3 * u3)
                        - (C34 - C1345) * tmp3 * (u4 * u4)
                        - C1345 * tmp2 * u5),
            -dt * tx2 * (C1 * (u5 * tmp1) - C2 * (u2 * u2 * tmp2 + qs * tmp1))
                - dt * tx1 * (R43 * C34 - C1345) * tmp2 * u2,
            -dt * tx2 * (-C2 * (u3 * u2) * tmp2) - dt * tx1 * (C34 - C1345) * tmp2 * u3,
            -dt * tx2 * (-C2 * (u4 * u2) * tmp2) - dt * tx1 * (C34 - C1345) * tmp2 * u4,
            -dt * tx2 * (C1 * (u2 * tmp1)) - dt * tx1 * C1345 * tmp1 - dt * tx1 * dx,
        ],
    ];
    (d, a, b, cx)
}

/// The diagonal block's `d(5, 1)`, the same in `jacld` and `jacu`.
#[inline(always)]
fn d51(c: &Constants, tmp2: f64, tmp3: f64, u2: f64, u3: f64, u4: f64, u5: f64) -> f64 {
    let (dt, tx1, ty1, tz1) = (c.dt, c.tx1, c.ty1, c.tz1);
    -dt * 2.0
        * (((tx1 * (R43 * C34 - C1345) + ty1 * (C34 - C1345) + tz1 * (C34 - C1345)) * (u2 * u2)
            + (tx1 * (C34 - C1345) + ty1 * (R43 * C34 - C1345) + tz1 * (C34 - C1345)) * (u3 * u3)
            + (tx1 * (C34 - C1345) + ty1 * (C34 - C1345) + tz1 * (R43 * C34 - C1345)) * (u4 * u4))
            * tmp3
            + (tx1 + ty1 + tz1) * C1345 * tmp2 * u5)
}

/// The diagonal block's `d(5, 5)`, the same in `jacld` and `jacu`.
#[inline(always)]
fn d55(c: &Constants, tmp1: f64) -> f64 {
    1.0 + c.dt * 2.0 * (c.tx1 + c.ty1 + c.tz1) * C1345 * tmp1 + diffusion(c)
}

/// `jacu` at point `at`: the diagonal block `d` and the upper blocks `a` (from
/// `i + 1`), `b` (`j + 1`) and `c` (`k + 1`) of the implicit operator.
#[inline(always)]
fn jacu(c: &Constants, s: &State, at: usize) -> (Block, Block, Block, Block) {
    let (dt, tx1, tx2, ty1, ty2, tz1, tz2) = (c.dt, c.tx1, c.tx2, c.ty1, c.ty2, c.tz1, c.tz2);
    let (dx, dy, dz) = (c.dx, c.dy, c.dz);
    let diff = diffusion(c);

    let tmp1 = s.rho_i[at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[at];
    let d = [
        [1.0 + diff, 0.0, 0.0, 0.0, 0.0],
        [
            dt * 2.0 * (-tx1 * R43 - ty1 - tz1) * (C34 * tmp2 * u2),
            1.0 + dt * 2.0 * C34 * tmp1 * (tx1 * R43 + ty1 + tz1) + diff,
            0.0,
            0.0,
            0.0,
        ],
        [
            dt * 2.0 * (-tx1 - ty1 * R43 - tz1) * (C34 * tmp2 * u3),
            0.0,
            1.0 + dt * 2.0 * C34 * tmp1 * (tx1 + ty1 * R43 + tz1) + diff,
            0.0,
            0.0,
        ],
        [
            dt * 2.0 * (-tx1 - ty1 - tz1 * R43) * (C34 * tmp2 * u4),
            0.0,
            0.0,
            1.0 + dt * 2.0 * C34 * tmp1 * (tx1 + ty1 + tz1 * R43) + diff,
            0.0,
        ],
        [
            d51(c, tmp2, tmp3, u2, u3, u4, u5),
            dt * 2.0
                * (tx1 * (R43 * C34 - C1345) + ty1 * (C34 - C1345) + tz1 * (C34 - C1345))
                * tmp2
                * u2,
            dt * 2.0
                * (tx1 * (C34 - C1345) + ty1 * (R43 * C34 - C1345) + tz1 * (C34 - C1345))
                * tmp2
                * u3,
            dt * 2.0
                * (tx1 * (C34 - C1345) + ty1 * (C34 - C1345) + tz1 * (R43 * C34 - C1345))
                * tmp2
                * u4,
            d55(c, tmp1),
        ],
    ];

    let e_at = at + 1;
    let tmp1 = s.rho_i[e_at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[e_at];
    let qs = s.qs[e_at];
    let a = [
        [-dt * tx1 * dx, dt * tx2, 0.0, 0.0, 0.0],
        [
            dt * tx2 * (-(u2 * tmp1) * (u2 * tmp1) + C2 * qs * tmp1)
                - dt * tx1 * (-R43 * C34 * tmp2 * u2),
            dt * tx2 * ((2.0 - C2) * (u2 * tmp1)) - dt * tx1 * (R43 * C34 * tmp1) - dt * tx1 * dx,
            dt * tx2 * (-C2 * (u3 * tmp1)),
            dt * tx2 * (-C2 * (u4 * tmp1)),
            dt * tx2 * C2,
        ],
        [
            dt * tx2 * (-(u2 * u3) * tmp2) - dt * tx1 * (-C34 * tmp2 * u3),
            dt * tx2 * (u3 * tmp1),
            dt * tx2 * (u2 * tmp1) - dt * tx1 * (C34 * tmp1) - dt * tx1 * dx,
            0.0,
            0.0,
        ],
        [
            dt * tx2 * (-(u2 * u4) * tmp2) - dt * tx1 * (-C34 * tmp2 * u4),
            dt * tx2 * (u4 * tmp1),
            0.0,
            dt * tx2 * (u2 * tmp1) - dt * tx1 * (C34 * tmp1) - dt * tx1 * dx,
            0.0,
        ],
        [
            dt * tx2 * ((C2 * 2.0 * qs - C1 * u5) * (u2 * tmp2))
                - dt * tx1
                    * (-(R43 * C34 - C1345) * tmp3 * (u2 * u2)
                        - (C34 - C1345) * tmp3 * (u3 * u3)
                        - (C34 - C1345) * tmp3 * (u4 * u4)
                        - C1345 * tmp2 * u5),
            dt * tx2 * (C1 * (u5 * tmp1) - C2 * (u2 * u2 * tmp2 + qs * tmp1))
                - dt * tx1 * (R43 * C34 - C1345) * tmp2 * u2,
            dt * tx2 * (-C2 * (u3 * u2) * tmp2) - dt * tx1 * (C34 - C1345) * tmp2 * u3,
            dt * tx2 * (-C2 * (u4 * u2) * tmp2) - dt * tx1 * (C34 - C1345) * tmp2 * u4,
            dt * tx2 * (C1 * (u2 * tmp1)) - dt * tx1 * C1345 * tmp1 - dt * tx1 * dx,
        ],
    ];

    let n_at = at + s.row;
    let tmp1 = s.rho_i[n_at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[n_at];
    let qs = s.qs[n_at];
    let b = [
        [-dt * ty1 * dy, 0.0, dt * ty2, 0.0, 0.0],
        [
            dt * ty2 * (-(u2 * u3) * tmp2) - dt * ty1 * (-C34 * tmp2 * u2),
            dt * ty2 * (u3 * tmp1) - dt * ty1 * (C34 * tmp1) - dt * ty1 * dy,
            dt * ty2 * (u2 * tmp1),
            0.0,
            0.0,
        ],
        [
            dt * ty2 * (-(u3 * tmp1) * (u3 * tmp1) + C2 * (qs * tmp1))
                - dt * ty1 * (-R43 * C34 * tmp2 * u3),
            dt * ty2 * (-C2 * (u2 * tmp1)),
            dt * ty2 * ((2.0 - C2) * (u3 * tmp1)) - dt * ty1 * (R43 * C34 * tmp1) - dt * ty1 * dy,
            dt * ty2 * (-C2 * (u4 * tmp1)),
            dt * ty2 * C2,
        ],
        [
            dt * ty2 * (-(u3 * u4) * tmp2) - dt * ty1 * (-C34 * tmp2 * u4),
            0.0,
            dt * ty2 * (u4 * tmp1),
            dt * ty2 * (u3 * tmp1) - dt * ty1 * (C34 * tmp1) - dt * ty1 * dy,
            0.0,
        ],
        [
            dt * ty2 * ((C2 * 2.0 * qs - C1 * u5) * (u3 * tmp2))
                - dt * ty1
                    * (-(C34 - C1345) * tmp3 * (u2 * u2)
                        - (R43 * C34 - C1345) * tmp3 * (u3 * u3)
                        - (C34 - C1345) * tmp3 * (u4 * u4)
                        - C1345 * tmp2 * u5),
            dt * ty2 * (-C2 * (u2 * u3) * tmp2) - dt * ty1 * (C34 - C1345) * tmp2 * u2,
            dt * ty2 * (C1 * (u5 * tmp1) - C2 * (qs * tmp1 + u3 * u3 * tmp2))
                - dt * ty1 * (R43 * C34 - C1345) * tmp2 * u3,
            dt * ty2 * (-C2 * (u3 * u4) * tmp2) - dt * ty1 * (C34 - C1345) * tmp2 * u4,
            dt * ty2 * (C1 * (u3 * tmp1)) - dt * ty1 * C1345 * tmp1 - dt * ty1 * dy,
        ],
    ];

    let t_at = at + s.plane;
    let tmp1 = s.rho_i[t_at];
    let tmp2 = tmp1 * tmp1;
    let tmp3 = tmp1 * tmp2;
    let [_, u2, u3, u4, u5] = s.u[t_at];
    let qs = s.qs[t_at];
    let cz = [
        [-dt * tz1 * dz, 0.0, 0.0, dt * tz2, 0.0],
        [
            dt * tz2 * (-(u2 * u4) * tmp2) - dt * tz1 * (-C34 * tmp2 * u2),
            dt * tz2 * (u4 * tmp1) - dt * tz1 * C34 * tmp1 - dt * tz1 * dz,
            0.0,
            dt * tz2 * (u2 * tmp1),
            0.0,
        ],
        [
            dt * tz2 * (-(u3 * u4) * tmp2) - dt * tz1 * (-C34 * tmp2 * u3),
            0.0,
            dt * tz2 * (u4 * tmp1) - dt * tz1 * (C34 * tmp1) - dt * tz1 * dz,
            dt * tz2 * (u3 * tmp1),
            0.0,
        ],
        [
            dt * tz2 * (-(u4 * tmp1) * (u4 * tmp1) + C2 * (qs * tmp1))
                - dt * tz1 * (-R43 * C34 * tmp2 * u4),
            dt * tz2 * (-C2 * (u2 * tmp1)),
            dt * tz2 * (-C2 * (u3 * tmp1)),
            dt * tz2 * (2.0 - C2) * (u4 * tmp1) - dt * tz1 * (R43 * C34 * tmp1) - dt * tz1 * dz,
            dt * tz2 * C2,
        ],
        [
            dt * tz2 * ((C2 * 2.0 * qs - C1 * u5) * (u4 * tmp2))
                - dt * tz1
                    * (-(C34 - C1345) * tmp3 * (u2 * u2)
                        - (C34 - C1345) * tmp3 * (u3 * u3)
                        - (R43 * C34 - C1345) * tmp3 * (u4 * u4)
                        - C1345 * tmp2 * u5),
            dt * tz2 * (-C2 * (u2 * u4) * tmp2) - dt * tz1 * (C34 - C1345) * tmp2 * u2,
            dt * tz2 * (-C2 * (u3 * u4) * tmp2) - dt * tz1 * (C34 - C1345) * tmp2 * u3,
            dt * tz2 * (C1 * (u5 * tmp1) - C2 * (qs * tmp1 + u4 * u4 * tmp2))
                - dt * tz1 * (R43 * C34 - C1345) * tmp2 * u4,
            dt * tz2 * (C1 * (u4 * tmp1)) - dt * tz1 * C1345 * tmp1 - dt * tz1 * dz,
        ],
    ];
    (d, a, b, cz)
}

/// `a · x`, summed left to right.
#[inline(always)]
fn dot5(a: &[f64; 5], x: &[f64; 5]) -> f64 {
    a[0] * x[0] + a[1] * x[1] + a[2] * x[2] + a[3] * x[3] + a[4] * x[4]
}

/// `a · x + b · y` interleaved term by term (`a0 x0 + b0 y0 + a1 x1 + ...`), as the
/// sweeps sum their two in-plane neighbours.
#[inline(always)]
fn dot10(a: &[f64; 5], x: &[f64; 5], b: &[f64; 5], y: &[f64; 5]) -> f64 {
    a[0] * x[0]
        + b[0] * y[0]
        + a[1] * x[1]
        + b[1] * y[1]
        + a[2] * x[2]
        + b[2] * y[2]
        + a[3] * x[3]
        + b[3] * y[3]
        + a[4] * x[4]
        + b[4] * y[4]
}

/// Solves `d x = tv` by Gaussian elimination without pivoting and back-substitution,
/// as `blts` and `buts` do for each point's diagonal block.
#[inline(always)]
fn solve5(mut tmat: Block, mut tv: [f64; 5]) -> [f64; 5] {
    for p in 0..4 {
        let tmp1 = 1.0 / tmat[p][p];
        for r in p + 1..5 {
            let tmp = tmp1 * tmat[r][p];
            for col in p + 1..5 {
                tmat[r][col] = tmat[r][col] - tmp * tmat[p][col];
            }
            tv[r] = tv[r] - tv[p] * tmp;
        }
    }
    let mut x = [0.0; 5];
    for r in (0..5).rev() {
        let mut t = tv[r];
        for col in r + 1..5 {
            t = t - tmat[r][col] * x[col];
        }
        x[r] = t / tmat[r][r];
    }
    x
}

/// `blts`, with `jacld` computed per point, on the interior points of row `j` of
/// plane `k`: the lower triangular solve, in place in `rsd`.
///
/// # Safety
/// This thread owns row `j` of plane `k` of `rsd`; nobody writes rows `j - 1` of plane
/// `k` and `j` of plane `k - 1`, nor `u`, `rho_i` or `qs`.
unsafe fn blts(g: &Grid, c: &Constants, f: &Fields, s: &State, j: usize, k: usize) {
    // SAFETY: the caller's contract.
    let (v, south, below) = unsafe {
        (
            row5_mut(&f.rsd, g, j, k),
            row5(&f.rsd, g, j - 1, k),
            row5(&f.rsd, g, j, k - 1),
        )
    };
    for i in g.interior() {
        v[i] = lower(c, s, g.at(i, j, k), v[i], &below[i], &south[i], &v[i - 1]);
    }
}

/// `blts` at the interior point stored at `at`, with `jacld` computed there: the
/// point's new value of the correction from its old one (`here`) and the finished
/// values of its neighbours at `k - 1`, `j - 1` and `i - 1`.
#[inline(always)]
pub(crate) fn lower(
    c: &Constants,
    s: &State,
    at: usize,
    here: [f64; 5],
    below: &[f64; 5],
    south: &[f64; 5],
    west: &[f64; 5],
) -> [f64; 5] {
    let (d, ldz, ldy, ldx) = jacld(c, s, at);
    let mut vk = here;
    for m in 0..5 {
        vk[m] = vk[m] - OMEGA * dot5(&ldz[m], below);
    }
    let tv: [f64; 5] =
        core::array::from_fn(|m| vk[m] - OMEGA * dot10(&ldy[m], south, &ldx[m], west));
    solve5(d, tv)
}

/// `buts`, with `jacu` computed per point, on the interior points of row `j` of plane
/// `k`, from the last: the upper triangular solve, in place in `rsd`.
///
/// # Safety
/// This thread owns row `j` of plane `k` of `rsd`; nobody writes rows `j + 1` of plane
/// `k` and `j` of plane `k + 1`, nor `u`, `rho_i` or `qs`.
unsafe fn buts(g: &Grid, c: &Constants, f: &Fields, s: &State, j: usize, k: usize) {
    // SAFETY: the caller's contract.
    let (v, north, above) = unsafe {
        (
            row5_mut(&f.rsd, g, j, k),
            row5(&f.rsd, g, j + 1, k),
            row5(&f.rsd, g, j, k + 1),
        )
    };
    for i in g.interior().rev() {
        v[i] = upper(c, s, g.at(i, j, k), v[i], &above[i], &north[i], &v[i + 1]);
    }
}

/// `buts` at the interior point stored at `at`, with `jacu` computed there: the
/// point's new value of the correction from its old one (`here`) and the finished
/// values of its neighbours at `k + 1`, `j + 1` and `i + 1`.
#[inline(always)]
pub(crate) fn upper(
    c: &Constants,
    s: &State,
    at: usize,
    here: [f64; 5],
    above: &[f64; 5],
    north: &[f64; 5],
    east: &[f64; 5],
) -> [f64; 5] {
    let (d, udx, udy, udz) = jacu(c, s, at);
    let mut tv: [f64; 5] = core::array::from_fn(|m| OMEGA * dot5(&udz[m], above));
    for m in 0..5 {
        tv[m] = tv[m] + OMEGA * dot10(&udy[m], north, &udx[m], east);
    }
    let tv = solve5(d, tv);
    core::array::from_fn(|m| here[m] - tv[m])
}

/// The lower then the upper triangular sweep over the interior, pipelined over the
/// planes (module docs). `rows` are this thread's rows; every stage ends with a
/// barrier.
fn sweeps(team: &Team, g: &Grid, c: &Constants, f: &Fields, rows: Range<usize>) {
    let planes = g.interior();
    // SAFETY: nobody writes u, rho_i or qs during the sweeps.
    let s = unsafe {
        State {
            u: f.u.all().as_chunks().0,
            rho_i: f.rho_i.all(),
            qs: f.qs.all(),
            row: g.ip,
            plane: g.plane(),
        }
    };
    let (rank, size) = (team.rank(), team.size());
    let stages = planes.len() + size - 1;
    // The lower sweep: in stage `st` this thread does plane `1 + st - rank`.
    for st in 0..stages {
        if let Some(k) = (st + 1).checked_sub(rank).filter(|k| planes.contains(k)) {
            for j in rows.clone() {
                // SAFETY: row j of plane k is this thread's; plane k - 1's row j was
                // finished by this thread in an earlier stage, row j - 1 of plane k by
                // this thread just now or by thread rank - 1 in the previous stage.
                unsafe { blts(g, c, f, &s, j, k) };
            }
        }
        team.barrier();
    }
    // The upper sweep: in stage `st` thread `rank` does plane `n - 2 - (st - (size -
    // 1 - rank))`, top down, rows last first.
    for st in 0..stages {
        let k = (st + rank + 1)
            .checked_sub(size)
            .and_then(|back| (g.n - 2).checked_sub(back));
        if let Some(k) = k.filter(|k| planes.contains(k)) {
            for j in rows.clone().rev() {
                // SAFETY: as the lower sweep's, mirrored.
                unsafe { buts(g, c, f, &s, j, k) };
            }
        }
        team.barrier();
    }
}

/// One SSOR iteration (`ssor`'s loop body), ending with the new residual in `rsd`
/// (`rhs`, which ends with a barrier). `rows` are this thread's rows.
fn iterate(team: &Team, g: &Grid, c: &Constants, f: &Fields, rows: Range<usize>) {
    let planes = g.interior();
    // rsd = dt * rsd on this thread's rows (the sweeps read only rows whose owner
    // scaled them before the pipeline's first barrier that orders the read).
    for k in planes.clone() {
        for j in rows.clone() {
            // SAFETY: row j of every plane of rsd is this thread's until the sweeps.
            let v = unsafe { row5_mut(&f.rsd, g, j, k) };
            for x in &mut v[1..g.n - 1] {
                for m in 0..5 {
                    x[m] = c.dt * x[m];
                }
            }
        }
    }
    sweeps(team, g, c, f, rows.clone());
    // u = u + rsd / (omega (2 - omega)) on this thread's rows.
    let tmp = 1.0 / (OMEGA * (2.0 - OMEGA));
    for k in planes {
        for j in rows.clone() {
            // SAFETY: row j of every plane of u and rsd is this thread's in this phase.
            let (u, v) = unsafe { (row5_mut(&f.u, g, j, k), row5(&f.rsd, g, j, k)) };
            for i in g.interior() {
                for m in 0..5 {
                    u[i][m] = u[i][m] + tmp * v[i][m];
                }
            }
        }
    }
    team.barrier();
    rhs(team, g, f, c);
}

/// `l2norm`'s sums of squares over this thread's interior planes of a five-value field.
///
/// # Safety
/// Nobody writes `v` meanwhile.
unsafe fn l2norm_sums(team: &Team, g: &Grid, v: &Shared<f64>) -> [f64; 5] {
    let mut sum = [0.0; 5];
    for k in team.share(g.n) {
        if !g.interior().contains(&k) {
            continue;
        }
        for j in g.interior() {
            // SAFETY: the caller's contract.
            let r = unsafe { row5(v, g, j, k) };
            for x in &r[1..g.n - 1] {
                for m in 0..5 {
                    sum[m] = sum[m] + x[m] * x[m];
                }
            }
        }
    }
    sum
}

/// `error`'s sums of squared differences from the exact solution over this thread's
/// interior planes.
///
/// # Safety
/// Nobody writes `u` meanwhile.
unsafe fn error_sums(team: &Team, g: &Grid, c: &Constants, f: &Fields) -> [f64; 5] {
    let mut sum = [0.0; 5];
    for k in team.share(g.n) {
        if !g.interior().contains(&k) {
            continue;
        }
        for j in g.interior() {
            // SAFETY: the caller's contract.
            let u = unsafe { row5(&f.u, g, j, k) };
            for i in g.interior() {
                let exact = c.exact(i, j, k);
                for m in 0..5 {
                    let tmp = exact[m] - u[i][m];
                    sum[m] = sum[m] + tmp * tmp;
                }
            }
        }
    }
    sum
}

/// The root-mean-square norms from the sums over the `(n - 2)^3` interior points of a
/// grid of `n` a side, as `l2norm` and `error` finish.
pub(crate) fn rms(n: usize, sums: [f64; 5]) -> [f64; 5] {
    let count = ((n - 2) * (n - 2) * (n - 2)) as f64;
    sums.map(|s| libm::sqrt(s / count))
}

/// `pintgr`'s integrand at a point of `u` values: the pressure, `C2` times the
/// internal energy.
#[inline(always)]
pub(crate) fn pressure(u: &[f64; 5]) -> f64 {
    let [u1, u2, u3, u4, u5] = *u;
    C2 * (u5 - 0.50 * (u2 * u2 + u3 * u3 + u4 * u4) / u1)
}

/// `pintgr`'s box on a grid of `n` a side: its first and last point along each axis
/// (the reference's `ii1, ii2`, `ji1, ji2`, `ki1, ki2`, 0-based).
pub(crate) fn integration_box(n: usize) -> [(usize, usize); 3] {
    [(1, n - 2), (1, n - 3), (2, n - 2)]
}

/// `pintgr`: the surface integral of the pressure over three faces of the box inside
/// the boundary (`xci`), serially.
///
/// # Safety
/// Nobody writes `u` meanwhile.
unsafe fn pintgr(g: &Grid, c: &Constants, f: &Fields) -> f64 {
    // SAFETY: the caller's contract.
    let u = unsafe { f.u.all() }.as_chunks::<5>().0;
    let phi = |i: usize, j: usize, k: usize| pressure(&u[g.at(i, j, k)]);
    let n = g.n;
    let [(ibeg, ifin), (jbeg, jfin), (kbeg, kfin)] = integration_box(n);
    // Eight corners of each cell of a face, summed in the reference's order.
    let cell = |p: &dyn Fn(usize, usize) -> f64, q: &dyn Fn(usize, usize) -> f64, a, b| {
        p(a, b)
            + p(a + 1, b)
            + p(a, b + 1)
            + p(a + 1, b + 1)
            + q(a, b)
            + q(a + 1, b)
            + q(a, b + 1)
            + q(a + 1, b + 1)
    };
    let mut frc1 = 0.0;
    for j in jbeg..jfin {
        for i in ibeg..ifin {
            frc1 = frc1 + cell(&|i, j| phi(i, j, kbeg), &|i, j| phi(i, j, kfin), i, j);
        }
    }
    let frc1 = c.dxi * c.deta * frc1;
    let mut frc2 = 0.0;
    for k in kbeg..kfin {
        for i in ibeg..ifin {
            frc2 = frc2 + cell(&|i, k| phi(i, jbeg, k), &|i, k| phi(i, jfin, k), i, k);
        }
    }
    let frc2 = c.dxi * c.dzeta * frc2;
    let mut frc3 = 0.0;
    for k in kbeg..kfin {
        for j in jbeg..jfin {
            frc3 = frc3 + cell(&|j, k| phi(ibeg, j, k), &|j, k| phi(ifin, j, k), j, k);
        }
    }
    let frc3 = c.deta * c.dzeta * frc3;
    0.25 * (frc1 + frc2 + frc3)
}

/// `ssor`: the residual of the initial field, then `niter` iterations. Returns the
/// seconds of the iterations and the final residual norms.
fn ssor(
    team: &Team,
    g: &Grid,
    c: &Constants,
    f: &Fields,
    sums: &Reduction,
    niter: usize,
) -> (f64, [f64; 5]) {
    let rows = team.share(g.n - 2);
    let rows = rows.start + 1..rows.end + 1;
    rhs(team, g, f, c);
    let start = team.seconds();
    for _ in 0..niter {
        iterate(team, g, c, f, rows.clone());
    }
    // The reference's last iteration ends with the norm (and its convergence test,
    // which no class meets before its last iteration).
    // SAFETY: nobody writes rsd now.
    let part = unsafe { l2norm_sums(team, g, &f.rsd) };
    let rsdnm = rms(g.n, sums.sums(team, part));
    (team.seconds() - start, rsdnm)
}

/// Runs this thread's part of LU at `class`, as the reference's main program: the
/// boundary and initial values, the forcing, one untimed iteration to touch the
/// memory, the values again, `itmax` timed iterations, then the error and surface
/// integral.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    let (n, itmax, dt) = params(class);
    let g = Grid::new(n);
    let c = Constants::new(n, dt);
    let f = Fields::carve(arena, &g);
    let sums = Reduction::new(arena, team.size());

    initialize(team, &g, &c, &f);
    erhs(team, &g, &c, &f);
    ssor(team, &g, &c, &f, &sums, 1);
    initialize(team, &g, &c, &f);
    let (seconds, xcr) = ssor(team, &g, &c, &f, &sums, itmax);

    // SAFETY: nobody writes u now (ssor ends with the norm's barriers).
    let part = unsafe { error_sums(team, &g, &c, &f) };
    let xce = rms(g.n, sums.sums(team, part));
    // Only the master's outcome counts, so only it integrates.
    let xci = if team.is_master() {
        // SAFETY: as above: nobody writes u now.
        unsafe { pintgr(&g, &c, &f) }
    } else {
        0.0
    };
    let mut values = cfd::values(&xcr, &xce);
    values.push("xci", xci);
    Outcome {
        seconds,
        mops: mops(class, seconds),
        verified: verify(class, &xcr, &xce, xci),
        values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::noise;

    #[test]
    fn solve5_solves_a_diagonally_dominant_block() {
        let r = noise(30, 7);
        let mut d: Block = core::array::from_fn(|m| core::array::from_fn(|n| r[5 * m + n]));
        for m in 0..5 {
            d[m][m] += 5.0;
        }
        let x: [f64; 5] = core::array::from_fn(|m| r[25 + m]);
        let b: [f64; 5] = core::array::from_fn(|m| dot5(&d[m], &x));
        let got = solve5(d, b);
        for m in 0..5 {
            assert!((got[m] - x[m]).abs() < 1e-13, "{got:?} vs {x:?}");
        }
    }

    #[test]
    fn setbv_setiv_puts_the_exact_solution_on_the_boundary_only() {
        // Boundary points get the exact solution; interior ones its transfinite
        // interpolation, which differs (the solution is not trilinear).
        let (n, _, dt) = params(Class::S);
        let g = Grid::new(n);
        let c = Constants::new(n, dt);
        let mut plane = [[0.0; 5]; 13 * 13];
        setbv_setiv(&g, &c, &mut plane, 0);
        assert_eq!(plane[g.at(3, 4, 0)], c.exact(3, 4, 0));
        setbv_setiv(&g, &c, &mut plane, 5);
        assert_eq!(plane[g.at(0, 4, 0)], c.exact(0, 4, 5));
        assert_ne!(plane[g.at(3, 4, 0)], c.exact(3, 4, 5));
        // At (0,0,0) the exact solution is the polynomials' constant terms.
        assert_eq!(c.exact(0, 0, 0), core::array::from_fn(|m| cfd::CE[m][0]));
    }

    /// The pipelined sweeps compute every point as the serial reference does, whatever
    /// the team: the surface integral, summed serially from `u`, has the same bits on
    /// every thread count (the norms differ only by their per-thread grouping).
    #[test]
    fn the_pipelined_sweeps_give_the_same_field_on_any_team() {
        let xci = |threads| {
            let spec = crate::Spec {
                kernel: crate::Kernel::Lu,
                class: Class::S,
            };
            let outcome = crate::host::run(spec, threads);
            assert!(outcome.verified, "{threads} threads: {outcome:?}");
            let (_, value) = outcome.values.iter().find(|(k, _)| *k == "xci").unwrap();
            value.to_bits()
        };
        let one = xci(1);
        for threads in 2..=5 {
            assert_eq!(xci(threads), one, "{threads} threads");
        }
    }

    #[test]
    fn mops_is_the_reference_formula() {
        // Class S: 50 * (1984.77 * 12^3 - 10923.3 * 12^2 + 27770.9 * 12 - 144010).
        let ops = 50.0 * (1984.77 * 1728.0 - 10923.3 * 144.0 + 27770.9 * 12.0 - 144010.0);
        assert!((mops(Class::S, 2.0) - ops / 2e6).abs() < 1e-9);
    }

    #[test]
    fn verify_wants_every_value_within_1e_8() {
        for &class in crate::Kernel::Lu.classes() {
            let (xcr, xce, xci) = reference(class);
            assert!(verify(class, &xcr, &xce, xci));
            assert!(!verify(class, &xcr, &xce, xci * (1.0 + 2e-8)));
            assert!(!verify(class, &xcr, &xce, f64::NAN));
            for k in 0..10 {
                for factor in [1.0 + 2e-8, f64::NAN] {
                    let mut norms = [xcr, xce];
                    norms[k / 5][k % 5] *= factor;
                    assert!(!verify(class, &norms[0], &norms[1], xci), "{class:?} {k}");
                }
            }
        }
    }
}
