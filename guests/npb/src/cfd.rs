//! What the pseudo-applications SP and BT share (NPB 3.3's `set_constants`,
//! `exact_solution`, `initialize`, `exact_rhs`, `compute_rhs`, `error_norm`,
//! `rhs_norm`): a cubic grid of `n^3` points carrying the five conserved variables of
//! the 3-D compressible Navier-Stokes equations, the manufactured exact solution, its
//! forcing term, and the explicit right-hand side the implicit solvers invert.
//!
//! Storage is the reference's: point `(i, j, k)` at `(k * jp + j) * ip + i`, `i`
//! fastest, each row padded to an odd length (`ip = n / 2 * 2 + 1`) so power-of-two
//! strides do not alias in cache; five-component fields keep a point's components
//! together (`u(m, i, j, k)`).
//!
//! Parallel split: everything here works plane by plane (`k`), except the forcing's
//! zeta pass, which works row by row (`j`). A plane's right-hand side reads `u` and the
//! derived scalars of its neighbour planes, which nobody writes while it runs.
//!
//! Every expression keeps the reference's operation order: verification is at 1e-8.

// Statements are written as the reference's (`a = a - b * c`, indexed loops over the
// five components) so that each one's operation order can be checked against it.
#![allow(clippy::assign_op_pattern, clippy::needless_range_loop)]

use core::ops::Range;

use crate::Values;
use crate::team::{Arena, Reduction, Shared, Team};

/// The largest grid (points a side) the per-line buffers hold: class C (162).
pub const MAX_N: usize = 162;
/// Arena slack per allocation for its 64-byte alignment.
pub(crate) const ALIGN_SLACK: usize = 64;

/// The grid's shape and storage strides.
#[derive(Clone, Copy, Debug)]
pub struct Grid {
    /// Points a side (`grid_points`).
    pub n: usize,
    /// Points per stored row (`IMAXP + 1`).
    pub ip: usize,
    /// Rows per stored plane (`JMAXP + 1`).
    pub jp: usize,
}

impl Grid {
    pub fn new(n: usize) -> Grid {
        assert!((5..=MAX_N).contains(&n), "grid of {n} points a side");
        let padded = n / 2 * 2 + 1;
        Grid {
            n,
            ip: padded,
            jp: padded,
        }
    }

    /// Points per stored plane.
    pub fn plane(&self) -> usize {
        self.ip * self.jp
    }

    /// Points stored (padding included).
    pub fn points(&self) -> usize {
        self.plane() * self.n
    }

    /// Storage index of point `(i, j, k)`.
    pub fn at(&self, i: usize, j: usize, k: usize) -> usize {
        (k * self.jp + j) * self.ip + i
    }

    /// Storage indices of plane `k`, times `width` values per point.
    pub fn plane_range(&self, k: usize, width: usize) -> Range<usize> {
        k * self.plane() * width..(k + 1) * self.plane() * width
    }

    /// Interior indices along one axis (`1..=n-2`).
    pub fn interior(&self) -> Range<usize> {
        1..self.n - 1
    }
}

/// The reference's `/constants/` common block (those SP and BT read).
#[derive(Clone, Copy, Debug)]
#[allow(missing_docs)]
pub struct Constants {
    pub ce: [[f64; 13]; 5],
    pub dt: f64,
    pub c1: f64,
    pub c2: f64,
    pub c3: f64,
    pub c4: f64,
    pub c1c2: f64,
    pub c1c5: f64,
    pub c3c4: f64,
    pub c1345: f64,
    pub con43: f64,
    pub bt: f64,
    pub c2iv: f64,
    pub dnxm1: f64,
    pub dnym1: f64,
    pub dnzm1: f64,
    pub tx1: f64,
    pub tx2: f64,
    pub tx3: f64,
    pub ty1: f64,
    pub ty2: f64,
    pub ty3: f64,
    pub tz1: f64,
    pub tz2: f64,
    pub tz3: f64,
    pub dx: [f64; 5],
    pub dy: [f64; 5],
    pub dz: [f64; 5],
    pub dxmax: f64,
    pub dymax: f64,
    pub dzmax: f64,
    pub dssp: f64,
    pub dttx1: f64,
    pub dttx2: f64,
    pub dtty1: f64,
    pub dtty2: f64,
    pub dttz1: f64,
    pub dttz2: f64,
    pub c2dttx1: f64,
    pub c2dtty1: f64,
    pub c2dttz1: f64,
    pub comz1: f64,
    pub comz4: f64,
    pub comz5: f64,
    pub comz6: f64,
    pub dxtx1: [f64; 5],
    pub dyty1: [f64; 5],
    pub dztz1: [f64; 5],
    pub xxcon: [f64; 5],
    pub yycon: [f64; 5],
    pub zzcon: [f64; 5],
}

/// Coefficients of the exact solution: five polynomials in `xi`, `eta`, `zeta` (LU's
/// too).
pub(crate) const CE: [[f64; 13]; 5] = [
    [
        2.0, 0.0, 0.0, 4.0, 5.0, 3.0, 0.5, 0.02, 0.01, 0.03, 0.5, 0.4, 0.3,
    ],
    [
        1.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 0.01, 0.03, 0.02, 0.4, 0.3, 0.5,
    ],
    [
        2.0, 2.0, 0.0, 0.0, 0.0, 2.0, 3.0, 0.04, 0.03, 0.05, 0.3, 0.5, 0.4,
    ],
    [
        2.0, 2.0, 0.0, 0.0, 0.0, 2.0, 3.0, 0.03, 0.05, 0.04, 0.2, 0.1, 0.3,
    ],
    [
        5.0, 4.0, 3.0, 2.0, 0.1, 0.4, 0.3, 0.05, 0.04, 0.03, 0.1, 0.3, 0.2,
    ],
];

/// The exact solution's five polynomials with coefficients `ce` at `(xi, eta, zeta)`.
pub(crate) fn polynomial(ce: &[[f64; 13]; 5], xi: f64, eta: f64, zeta: f64) -> [f64; 5] {
    core::array::from_fn(|m| {
        let ce = &ce[m];
        ce[0]
            + xi * (ce[1] + xi * (ce[4] + xi * (ce[7] + xi * ce[10])))
            + eta * (ce[2] + eta * (ce[5] + eta * (ce[8] + eta * ce[11])))
            + zeta * (ce[3] + zeta * (ce[6] + zeta * (ce[9] + zeta * ce[12])))
    })
}

impl Constants {
    /// `set_constants` for a cubic grid of `n` points and time step `dt`.
    pub fn new(n: usize, dt: f64) -> Constants {
        let (c1, c2, c3, c4, c5) = (1.4, 0.4, 0.1, 1.0, 1.4);
        let dnxm1 = 1.0 / (n - 1) as f64;
        let (dnym1, dnzm1) = (dnxm1, dnxm1);
        let c1c2 = c1 * c2;
        let c1c5 = c1 * c5;
        let c3c4 = c3 * c4;
        let c1345 = c1c5 * c3c4;
        let conz1 = 1.0 - c1c5;
        let t = |d: f64| (1.0 / (d * d), 1.0 / (2.0 * d), 1.0 / d);
        let (tx1, tx2, tx3) = t(dnxm1);
        let (ty1, ty2, ty3) = t(dnym1);
        let (tz1, tz2, tz3) = t(dnzm1);
        let dx: [f64; 5] = [0.75; 5];
        let dy: [f64; 5] = [0.75; 5];
        let dz: [f64; 5] = [1.0; 5];
        let dssp = 0.25 * dx[0].max(dy[0].max(dz[0]));
        let dttx1 = dt * tx1;
        let dtty1 = dt * ty1;
        let dttz1 = dt * tz1;
        let dtdssp = dt * dssp;
        let con43 = 4.0 / 3.0;
        let con16 = 1.0 / 6.0;
        let cons = |c3c4t3: f64, t3: f64| {
            [
                c3c4t3 * con43 * t3,
                c3c4t3 * t3,
                c3c4t3 * conz1 * t3,
                c3c4t3 * con16 * t3,
                c3c4t3 * c1c5 * t3,
            ]
        };
        Constants {
            ce: CE,
            dt,
            c1,
            c2,
            c3,
            c4,
            c1c2,
            c1c5,
            c3c4,
            c1345,
            con43,
            bt: libm::sqrt(0.5),
            c2iv: 2.5,
            dnxm1,
            dnym1,
            dnzm1,
            tx1,
            tx2,
            tx3,
            ty1,
            ty2,
            ty3,
            tz1,
            tz2,
            tz3,
            dx,
            dy,
            dz,
            dxmax: dx[2].max(dx[3]),
            dymax: dy[1].max(dy[3]),
            dzmax: dz[1].max(dz[2]),
            dssp,
            dttx1,
            dttx2: dt * tx2,
            dtty1,
            dtty2: dt * ty2,
            dttz1,
            dttz2: dt * tz2,
            c2dttx1: 2.0 * dttx1,
            c2dtty1: 2.0 * dtty1,
            c2dttz1: 2.0 * dttz1,
            comz1: dtdssp,
            comz4: 4.0 * dtdssp,
            comz5: 5.0 * dtdssp,
            comz6: 6.0 * dtdssp,
            dxtx1: dx.map(|d| d * tx1),
            dyty1: dy.map(|d| d * ty1),
            dztz1: dz.map(|d| d * tz1),
            xxcon: cons(c3c4 * tx3, tx3),
            yycon: cons(c3c4 * ty3, ty3),
            zzcon: cons(c3c4 * tz3, tz3),
        }
    }

    /// `exact_solution`: the five variables at `(xi, eta, zeta)`.
    pub fn exact(&self, xi: f64, eta: f64, zeta: f64) -> [f64; 5] {
        polynomial(&self.ce, xi, eta, zeta)
    }
}

/// The fields of a run, shared by the team.
#[derive(Clone, Copy)]
pub struct Fields {
    /// The conserved variables, five per point.
    pub u: Shared<f64>,
    /// The right-hand side, then (in place) the update, five per point.
    pub rhs: Shared<f64>,
    /// The exact solution's forcing term, five per point.
    pub forcing: Shared<f64>,
    pub us: Shared<f64>,
    pub vs: Shared<f64>,
    pub ws: Shared<f64>,
    pub qs: Shared<f64>,
    pub rho_i: Shared<f64>,
    pub square: Shared<f64>,
    /// The speed of sound (SP only).
    pub speed: Option<Shared<f64>>,
}

impl Fields {
    /// Arena bytes [`Fields::carve`] takes.
    pub fn bytes(g: &Grid, with_speed: bool) -> usize {
        let arrays = 3 * 5 + 6 + usize::from(with_speed);
        let slack = 3 + 6 + usize::from(with_speed);
        arrays * g.points() * core::mem::size_of::<f64>() + slack * ALIGN_SLACK
    }

    pub fn carve(arena: &mut Arena, g: &Grid, with_speed: bool) -> Fields {
        let points = g.points();
        Fields {
            u: arena.alloc(5 * points),
            rhs: arena.alloc(5 * points),
            forcing: arena.alloc(5 * points),
            us: arena.alloc(points),
            vs: arena.alloc(points),
            ws: arena.alloc(points),
            qs: arena.alloc(points),
            rho_i: arena.alloc(points),
            square: arena.alloc(points),
            speed: with_speed.then(|| arena.alloc(points)),
        }
    }
}

/// `initialize` for plane `k` (`u` is that plane, five values per point): transfinite
/// interpolation of the boundary values, then the exact values on the faces, in the
/// reference's order (a point on two faces keeps the later face's value).
pub fn initialize_plane(g: &Grid, c: &Constants, u: &mut [f64], k: usize) {
    let n = g.n;
    let zeta = k as f64 * c.dnzm1;
    let mut set = |i: usize, j: usize, value: [f64; 5]| {
        let at = (j * g.ip + i) * 5;
        u[at..at + 5].copy_from_slice(&value);
    };
    for j in 0..n {
        let eta = j as f64 * c.dnym1;
        for i in 0..n {
            let xi = i as f64 * c.dnxm1;
            let face = |f: &dyn Fn(f64) -> [f64; 5]| [f(0.0), f(1.0)];
            let px = face(&|p| c.exact(p, eta, zeta));
            let py = face(&|p| c.exact(xi, p, zeta));
            let pz = face(&|p| c.exact(xi, eta, p));
            set(
                i,
                j,
                core::array::from_fn(|m| {
                    let pxi = xi * px[1][m] + (1.0 - xi) * px[0][m];
                    let peta = eta * py[1][m] + (1.0 - eta) * py[0][m];
                    let pzeta = zeta * pz[1][m] + (1.0 - zeta) * pz[0][m];
                    pxi + peta + pzeta - pxi * peta - pxi * pzeta - peta * pzeta
                        + pxi * peta * pzeta
                }),
            );
        }
    }
    // West and east faces.
    for (i, xi) in [(0, 0.0), (n - 1, 1.0)] {
        for j in 0..n {
            let eta = j as f64 * c.dnym1;
            set(i, j, c.exact(xi, eta, zeta));
        }
    }
    // South and north faces.
    for (j, eta) in [(0, 0.0), (n - 1, 1.0)] {
        for i in 0..n {
            let xi = i as f64 * c.dnxm1;
            set(i, j, c.exact(xi, eta, zeta));
        }
    }
    // Bottom and top faces.
    if k == 0 || k == n - 1 {
        let zeta = if k == 0 { 0.0 } else { 1.0 };
        for j in 0..n {
            let eta = j as f64 * c.dnym1;
            for i in 0..n {
                let xi = i as f64 * c.dnxm1;
                set(i, j, c.exact(xi, eta, zeta));
            }
        }
    }
}

/// The exact solution along one line and the quantities `exact_rhs` derives from it:
/// `ue`, `buf` (velocities, and in slot 0 the squared speed), `cuf` (the line's velocity
/// squared) and `q` (the kinetic energy).
struct LineSolution {
    ue: [[f64; 5]; MAX_N],
    buf: [[f64; 5]; MAX_N],
    cuf: [f64; MAX_N],
    q: [f64; MAX_N],
}

impl LineSolution {
    /// Fills the line from `point(p)` = `(xi, eta, zeta)` for `p < n`; `axis` is the
    /// velocity component along the line (1, 2 or 3).
    fn fill(
        &mut self,
        c: &Constants,
        n: usize,
        axis: usize,
        point: impl Fn(usize) -> (f64, f64, f64),
    ) {
        let others = match axis {
            1 => [2, 3],
            2 => [1, 3],
            _ => [1, 2],
        };
        for p in 0..n {
            let (xi, eta, zeta) = point(p);
            let dtemp = c.exact(xi, eta, zeta);
            self.ue[p] = dtemp;
            let dtpp = 1.0 / dtemp[0];
            let buf = &mut self.buf[p];
            for m in 1..5 {
                buf[m] = dtpp * dtemp[m];
            }
            self.cuf[p] = buf[axis] * buf[axis];
            buf[0] =
                self.cuf[p] + buf[others[0]] * buf[others[0]] + buf[others[1]] * buf[others[1]];
            self.q[p] = 0.5 * (buf[1] * dtemp[1] + buf[2] * dtemp[2] + buf[3] * dtemp[3]);
        }
    }

    /// Adds the flux differences at interior point `p` along `axis` to `f` (that
    /// point's forcing), with `t2` the centred-difference factor, `d` the `d?t?1` and
    /// `con` the `??con` constants.
    #[allow(clippy::too_many_arguments)]
    fn add_flux(
        &self,
        c: &Constants,
        p: usize,
        axis: usize,
        t2: f64,
        d: &[f64; 5],
        con: &[f64; 5],
        f: &mut [f64],
    ) {
        let (ue, buf, cuf, q) = (&self.ue, &self.buf, &self.cuf, &self.q);
        let (a, b, o) = (p + 1, p - 1, p);
        f[0] =
            f[0] - t2 * (ue[a][axis] - ue[b][axis]) + d[0] * (ue[a][0] - 2.0 * ue[o][0] + ue[b][0]);
        for m in 1..4 {
            let flux = if m == axis {
                (ue[a][m] * buf[a][axis] + c.c2 * (ue[a][4] - q[a]))
                    - (ue[b][m] * buf[b][axis] + c.c2 * (ue[b][4] - q[b]))
            } else {
                ue[a][m] * buf[a][axis] - ue[b][m] * buf[b][axis]
            };
            let visc = if m == axis { con[0] } else { con[1] };
            f[m] = f[m] - t2 * flux
                + visc * (buf[a][m] - 2.0 * buf[o][m] + buf[b][m])
                + d[m] * (ue[a][m] - 2.0 * ue[o][m] + ue[b][m]);
        }
        f[4] = f[4]
            - t2 * (buf[a][axis] * (c.c1 * ue[a][4] - c.c2 * q[a])
                - buf[b][axis] * (c.c1 * ue[b][4] - c.c2 * q[b]))
            + 0.5 * con[2] * (buf[a][0] - 2.0 * buf[o][0] + buf[b][0])
            + con[3] * (cuf[a] - 2.0 * cuf[o] + cuf[b])
            + con[4] * (buf[a][4] - 2.0 * buf[o][4] + buf[b][4])
            + d[4] * (ue[a][4] - 2.0 * ue[o][4] + ue[b][4]);
    }

    /// The fourth-order dissipation at interior point `p` of a line of `n` points.
    fn dissipation(&self, p: usize, n: usize, m: usize) -> f64 {
        let ue = &self.ue;
        dissipation(p, n, |q| ue[q][m])
    }
}

/// Fourth-order dissipation of `v` at interior point `p` of `n`, one-sided near the
/// ends as the reference.
#[inline(always)]
pub(crate) fn dissipation(p: usize, n: usize, v: impl Fn(usize) -> f64) -> f64 {
    if p == 1 {
        5.0 * v(p) - 4.0 * v(p + 1) + v(p + 2)
    } else if p == 2 {
        -4.0 * v(p - 1) + 6.0 * v(p) - 4.0 * v(p + 1) + v(p + 2)
    } else if p == n - 3 {
        v(p - 2) - 4.0 * v(p - 1) + 6.0 * v(p) - 4.0 * v(p + 1)
    } else if p == n - 2 {
        v(p - 2) - 4.0 * v(p - 1) + 5.0 * v(p)
    } else {
        v(p - 2) - 4.0 * v(p - 1) + 6.0 * v(p) - 4.0 * v(p + 1) + v(p + 2)
    }
}

/// `exact_rhs`, first part, for plane `k` (`forcing` is that plane): zeroes it, and
/// for an interior plane adds the xi- and eta-direction terms.
pub fn exact_rhs_plane(g: &Grid, c: &Constants, forcing: &mut [f64], k: usize) {
    forcing.fill(0.0);
    let n = g.n;
    if !g.interior().contains(&k) {
        return;
    }
    let zeta = k as f64 * c.dnzm1;
    let mut line = LineSolution::new();
    for j in g.interior() {
        let eta = j as f64 * c.dnym1;
        line.fill(c, n, 1, |i| (i as f64 * c.dnxm1, eta, zeta));
        for i in g.interior() {
            let at = (j * g.ip + i) * 5;
            line.add_flux(c, i, 1, c.tx2, &c.dxtx1, &c.xxcon, &mut forcing[at..at + 5]);
        }
        for m in 0..5 {
            for i in g.interior() {
                let at = (j * g.ip + i) * 5 + m;
                forcing[at] -= c.dssp * line.dissipation(i, n, m);
            }
        }
    }
    for i in g.interior() {
        let xi = i as f64 * c.dnxm1;
        line.fill(c, n, 2, |j| (xi, j as f64 * c.dnym1, zeta));
        for j in g.interior() {
            let at = (j * g.ip + i) * 5;
            line.add_flux(c, j, 2, c.ty2, &c.dyty1, &c.yycon, &mut forcing[at..at + 5]);
        }
        for m in 0..5 {
            for j in g.interior() {
                let at = (j * g.ip + i) * 5 + m;
                forcing[at] -= c.dssp * line.dissipation(j, n, m);
            }
        }
    }
}

/// `exact_rhs`, second part, for the interior row `j` of every plane: adds the
/// zeta-direction terms and changes the sign, as the reference's last loop.
///
/// # Safety
/// No other thread accesses row `j` of any plane of `forcing` meanwhile.
pub unsafe fn exact_rhs_rows(g: &Grid, c: &Constants, forcing: Shared<f64>, j: usize) {
    let n = g.n;
    let eta = j as f64 * c.dnym1;
    let mut line = LineSolution::new();
    let mut rows: [&mut [f64]; MAX_N] = core::array::from_fn(|_| &mut [][..]);
    for (k, row) in rows[..n].iter_mut().enumerate() {
        let at = g.at(0, j, k) * 5;
        // SAFETY: row j of each plane is this thread's (the caller's contract); the
        // rows are disjoint.
        *row = unsafe { forcing.slice_mut(at..at + g.ip * 5) };
    }
    for i in g.interior() {
        let xi = i as f64 * c.dnxm1;
        line.fill(c, n, 3, |k| (xi, eta, k as f64 * c.dnzm1));
        for k in g.interior() {
            let v = &mut rows[k][i * 5..i * 5 + 5];
            line.add_flux(c, k, 3, c.tz2, &c.dztz1, &c.zzcon, v);
        }
        for m in 0..5 {
            for k in g.interior() {
                rows[k][i * 5 + m] -= c.dssp * line.dissipation(k, n, m);
            }
        }
        for k in g.interior() {
            for v in &mut rows[k][i * 5..i * 5 + 5] {
                *v = -1.0 * *v;
            }
        }
    }
}

impl LineSolution {
    fn new() -> LineSolution {
        LineSolution {
            ue: [[0.0; 5]; MAX_N],
            buf: [[0.0; 5]; MAX_N],
            cuf: [0.0; MAX_N],
            q: [0.0; MAX_N],
        }
    }
}

/// `compute_rhs`, first loop, for plane `k`: the reciprocal density, velocities,
/// kinetic energy and (SP) speed of sound of every point.
///
/// # Safety
/// This thread owns plane `k` of the derived scalars, and nobody writes plane `k` of `u`.
pub unsafe fn derived_plane(g: &Grid, c: &Constants, f: &Fields, k: usize) {
    // SAFETY: the caller's contract, for every point of the plane.
    unsafe { derived_box(g, c, f, k, 0..g.n, 0..g.n) }
}

/// [`derived_plane`] for the points of plane `k` in rows `rows` and columns `cols`
/// (an MPI rank's cell and its ghost points).
///
/// # Safety
/// This thread owns plane `k` of the derived scalars, and nobody writes plane `k` of `u`.
pub unsafe fn derived_box(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    k: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let range = g.plane_range(k, 1);
    // SAFETY: the caller's contract.
    let (u, rho_i, us, vs, ws, square, qs) = unsafe {
        (
            f.u.slice(g.plane_range(k, 5)),
            f.rho_i.slice_mut(range.clone()),
            f.us.slice_mut(range.clone()),
            f.vs.slice_mut(range.clone()),
            f.ws.slice_mut(range.clone()),
            f.square.slice_mut(range.clone()),
            f.qs.slice_mut(range.clone()),
        )
    };
    let mut speed = f.speed.as_ref().map(|s| {
        // SAFETY: as above.
        unsafe { s.slice_mut(range.clone()) }
    });
    for j in rows {
        let row = j * g.ip..j * g.ip + g.n;
        let (u, _) = u[row.start * 5..].as_chunks::<5>();
        let u = &u[..g.n];
        let rho_i = &mut rho_i[row.clone()];
        let us = &mut us[row.clone()];
        let vs = &mut vs[row.clone()];
        let ws = &mut ws[row.clone()];
        let square = &mut square[row.clone()];
        let qs = &mut qs[row.clone()];
        for i in cols.clone() {
            let u = &u[i];
            let rho_inv = 1.0 / u[0];
            rho_i[i] = rho_inv;
            us[i] = u[1] * rho_inv;
            vs[i] = u[2] * rho_inv;
            ws[i] = u[3] * rho_inv;
            square[i] = 0.5 * (u[1] * u[1] + u[2] * u[2] + u[3] * u[3]) * rho_inv;
            qs[i] = square[i] * rho_inv;
        }
        if let Some(speed) = speed.as_deref_mut() {
            let speed = &mut speed[row.clone()];
            for i in cols.clone() {
                let aux = c.c1c2 * rho_i[i] * (u[i][4] - square[i]);
                speed[i] = libm::sqrt(aux);
            }
        }
    }
}

/// Read-only views of the whole fields `compute_rhs` reads.
struct Inputs<'a> {
    u: &'a [[f64; 5]],
    us: &'a [f64],
    vs: &'a [f64],
    ws: &'a [f64],
    qs: &'a [f64],
    rho_i: &'a [f64],
    square: &'a [f64],
}

/// `compute_rhs`, the rest, for plane `k`: the forcing, the flux differences and the
/// dissipation in all three directions, times `dt`. A boundary plane gets the forcing.
///
/// # Safety
/// This thread owns plane `k` of `rhs`; nobody writes `u`, the derived scalars or the
/// forcing meanwhile.
pub unsafe fn rhs_plane(g: &Grid, c: &Constants, f: &Fields, k: usize) {
    // SAFETY: the caller's contract, for every point of the plane.
    unsafe { rhs_box(g, c, f, k, 0..g.n, 0..g.n) }
}

/// [`rhs_plane`] for the points of plane `k` in rows `rows` and columns `cols` (an MPI
/// rank's cell): boundary points get the forcing. Reads `u` up to two points and the
/// derived scalars one point beyond the box along each axis.
///
/// # Safety
/// This thread owns those points of `rhs`; nobody writes `u`, the derived scalars or
/// the forcing meanwhile.
pub unsafe fn rhs_box(
    g: &Grid,
    c: &Constants,
    f: &Fields,
    k: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) {
    // SAFETY: the caller's contract (rows of the plane outside the box are not touched
    // through this slice).
    let (rhs, forcing) = unsafe {
        (
            f.rhs.slice_mut(g.plane_range(k, 5)),
            f.forcing.slice(g.plane_range(k, 5)),
        )
    };
    for j in rows.clone() {
        let at = (j * g.ip + cols.start) * 5..(j * g.ip + cols.end) * 5;
        rhs[at.clone()].copy_from_slice(&forcing[at]);
    }
    if !g.interior().contains(&k) {
        return;
    }
    // SAFETY: the caller's contract: nobody writes these.
    let inputs = unsafe {
        Inputs {
            u: f.u.all().as_chunks::<5>().0,
            us: f.us.all(),
            vs: f.vs.all(),
            ws: f.ws.all(),
            qs: f.qs.all(),
            rho_i: f.rho_i.all(),
            square: f.square.all(),
        }
    };
    let (rhs, _) = rhs.as_chunks_mut::<5>();
    let base = g.at(0, 0, k);
    let n = g.n;
    let rows = rows.start.max(1)..rows.end.min(n - 1);
    let cols = cols.start.max(1)..cols.end.min(n - 1);
    let u_row = |at: usize| &inputs.u[at..at + n];
    for j in rows.clone() {
        let row = &mut rhs[j * g.ip..j * g.ip + n];
        let at = base + j * g.ip;
        flux_x(c, &inputs, row, at, n, cols.clone());
        dissipate_along(row, u_row(at), c.dssp, n, cols.clone());
    }
    for j in rows.clone() {
        let row = &mut rhs[j * g.ip..j * g.ip + n];
        flux_yz(
            c,
            &inputs,
            row,
            base + j * g.ip,
            g.ip,
            n,
            cols.clone(),
            Axis::Y,
        );
    }
    for j in rows.clone() {
        let row = &mut rhs[j * g.ip..j * g.ip + n];
        let at = base + j * g.ip;
        dissipate_across(row, c.dssp, j, n, cols.clone(), |d| {
            u_row(at.wrapping_add_signed(d * g.ip as isize))
        });
    }
    for j in rows {
        let row = &mut rhs[j * g.ip..j * g.ip + n];
        let at = base + j * g.ip;
        flux_yz(c, &inputs, row, at, g.plane(), n, cols.clone(), Axis::Z);
        dissipate_across(row, c.dssp, k, n, cols.clone(), |d| {
            u_row(at.wrapping_add_signed(d * g.plane() as isize))
        });
        for v in &mut row[cols.clone()] {
            for x in v.iter_mut() {
                *x *= c.dt;
            }
        }
    }
}

/// Subtracts the fourth-order dissipation along a row of `n` points (`u` is that row
/// of `u`) from the row's points `cols` (interior ones).
fn dissipate_along(row: &mut [[f64; 5]], u: &[[f64; 5]], dssp: f64, n: usize, cols: Range<usize>) {
    let (row, u) = (&mut row[..n], &u[..n]);
    // The one-sided ends point by point, the five-point middle by windows.
    let middle = cols.start.max(3)..cols.end.min(n - 3).max(cols.start.max(3));
    for i in cols.start..middle.start.min(cols.end) {
        for m in 0..5 {
            row[i][m] -= dssp * dissipation(i, n, |q| u[q][m]);
        }
    }
    let windows = u[middle.start - 2..middle.end + 2].windows(5);
    for (r, w) in row[middle.clone()].iter_mut().zip(windows) {
        for m in 0..5 {
            r[m] -= dssp * (w[0][m] - 4.0 * w[1][m] + 6.0 * w[2][m] - 4.0 * w[3][m] + w[4][m]);
        }
    }
    for i in middle.end.max(cols.start)..cols.end {
        for m in 0..5 {
            row[i][m] -= dssp * dissipation(i, n, |q| u[q][m]);
        }
    }
}

/// `row[i][m] -= dssp * f(i, m)` for every point of `row`.
#[inline(always)]
fn subtract_scaled(row: &mut [[f64; 5]], dssp: f64, f: impl Fn(usize, usize) -> f64) {
    for (i, x) in row.iter_mut().enumerate() {
        for (m, x) in x.iter_mut().enumerate() {
            *x -= dssp * f(i, m);
        }
    }
}

/// Subtracts the fourth-order dissipation across rows from a row's points `cols`
/// (interior ones): the row is at position `p` of `n` along the axis, and `near(d)` is
/// the row of `u` `d` positions away (asked only for rows that exist).
fn dissipate_across<'a>(
    row: &mut [[f64; 5]],
    dssp: f64,
    p: usize,
    n: usize,
    cols: Range<usize>,
    near: impl Fn(isize) -> &'a [[f64; 5]],
) {
    let row = &mut row[cols.clone()];
    let r = |d: isize| &near(d)[cols.clone()];
    if p == 1 {
        let (c0, c1, c2) = (r(0), r(1), r(2));
        subtract_scaled(row, dssp, |i, m| 5.0 * c0[i][m] - 4.0 * c1[i][m] + c2[i][m]);
    } else if p == 2 {
        let (b1, c0, c1, c2) = (r(-1), r(0), r(1), r(2));
        subtract_scaled(row, dssp, |i, m| {
            -4.0 * b1[i][m] + 6.0 * c0[i][m] - 4.0 * c1[i][m] + c2[i][m]
        });
    } else if p == n - 3 {
        let (b2, b1, c0, c1) = (r(-2), r(-1), r(0), r(1));
        subtract_scaled(row, dssp, |i, m| {
            b2[i][m] - 4.0 * b1[i][m] + 6.0 * c0[i][m] - 4.0 * c1[i][m]
        });
    } else if p == n - 2 {
        let (b2, b1, c0) = (r(-2), r(-1), r(0));
        subtract_scaled(row, dssp, |i, m| b2[i][m] - 4.0 * b1[i][m] + 5.0 * c0[i][m]);
    } else {
        let (b2, b1, c0, c1, c2) = (r(-2), r(-1), r(0), r(1), r(2));
        subtract_scaled(row, dssp, |i, m| {
            b2[i][m] - 4.0 * b1[i][m] + 6.0 * c0[i][m] - 4.0 * c1[i][m] + c2[i][m]
        });
    }
}

/// The xi-direction flux differences of one row's points `cols` (interior ones; `at`
/// is the row's first point).
fn flux_x(
    c: &Constants,
    f: &Inputs,
    row: &mut [[f64; 5]],
    at: usize,
    n: usize,
    cols: Range<usize>,
) {
    let u = &f.u[at..at + n];
    let us = &f.us[at..at + n];
    let vs = &f.vs[at..at + n];
    let ws = &f.ws[at..at + n];
    let qs = &f.qs[at..at + n];
    let rho_i = &f.rho_i[at..at + n];
    let square = &f.square[at..at + n];
    let row = &mut row[..n];
    let (d, con) = (&c.dxtx1, &c.xxcon);
    for i in cols {
        let (a, b) = (i + 1, i - 1);
        let uijk = us[i];
        let up1 = us[a];
        let um1 = us[b];
        let r = &mut row[i];
        r[0] = r[0] + d[0] * (u[a][0] - 2.0 * u[i][0] + u[b][0]) - c.tx2 * (u[a][1] - u[b][1]);
        r[1] = r[1]
            + d[1] * (u[a][1] - 2.0 * u[i][1] + u[b][1])
            + con[1] * c.con43 * (up1 - 2.0 * uijk + um1)
            - c.tx2
                * (u[a][1] * up1 - u[b][1] * um1
                    + (u[a][4] - square[a] - u[b][4] + square[b]) * c.c2);
        r[2] = r[2]
            + d[2] * (u[a][2] - 2.0 * u[i][2] + u[b][2])
            + con[1] * (vs[a] - 2.0 * vs[i] + vs[b])
            - c.tx2 * (u[a][2] * up1 - u[b][2] * um1);
        r[3] = r[3]
            + d[3] * (u[a][3] - 2.0 * u[i][3] + u[b][3])
            + con[1] * (ws[a] - 2.0 * ws[i] + ws[b])
            - c.tx2 * (u[a][3] * up1 - u[b][3] * um1);
        r[4] = r[4]
            + d[4] * (u[a][4] - 2.0 * u[i][4] + u[b][4])
            + con[2] * (qs[a] - 2.0 * qs[i] + qs[b])
            + con[3] * (up1 * up1 - 2.0 * uijk * uijk + um1 * um1)
            + con[4] * (u[a][4] * rho_i[a] - 2.0 * u[i][4] * rho_i[i] + u[b][4] * rho_i[b])
            - c.tx2
                * ((c.c1 * u[a][4] - c.c2 * square[a]) * up1
                    - (c.c1 * u[b][4] - c.c2 * square[b]) * um1);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Axis {
    Y,
    Z,
}

/// A row and its neighbours `stride` points before and after it.
fn window<T>(v: &[T], at: usize, stride: usize, n: usize) -> [&[T]; 3] {
    [
        &v[at - stride..][..n],
        &v[at..][..n],
        &v[at + stride..][..n],
    ]
}

/// The eta- or zeta-direction flux differences of one row's points `cols` (interior
/// ones; `at` is the row's first point; neighbours along the axis are `stride` points
/// away).
#[allow(clippy::too_many_arguments)]
fn flux_yz<'a>(
    c: &Constants,
    f: &Inputs<'a>,
    row: &mut [[f64; 5]],
    at: usize,
    stride: usize,
    n: usize,
    cols: Range<usize>,
    axis: Axis,
) {
    let scalars = |v: &'a [f64]| window(v, at, stride, n);
    let [um, uo, up] = window(f.u, at, stride, n);
    let [usm, uso, usp] = scalars(f.us);
    let [vsm, vso, vsp] = scalars(f.vs);
    let [wsm, wso, wsp] = scalars(f.ws);
    let [qsm, qso, qsp] = scalars(f.qs);
    let [rm, ro, rp] = scalars(f.rho_i);
    let [sqm, _, sqp] = scalars(f.square);
    let row = &mut row[..n];
    // The velocity along the axis (`vs` or `ws`), the axis's momentum slot, and the
    // two velocities across it with their momentum slots.
    let (vel, t2, d, con, mv) = match axis {
        Axis::Y => ((vsm, vso, vsp), c.ty2, &c.dyty1, &c.yycon, 2),
        Axis::Z => ((wsm, wso, wsp), c.tz2, &c.dztz1, &c.zzcon, 3),
    };
    for i in cols {
        let (vm1, vijk, vp1) = (vel.0[i], vel.1[i], vel.2[i]);
        let (a, o, b) = (&up[i], &uo[i], &um[i]);
        let r = &mut row[i];
        r[0] = r[0] + d[0] * (a[0] - 2.0 * o[0] + b[0]) - t2 * (a[mv] - b[mv]);
        // Momentum across the axis: x first, then the other.
        let across = |m: usize, sp: f64, so: f64, sm: f64, r: f64| {
            r + d[m] * (a[m] - 2.0 * o[m] + b[m]) + con[1] * (sp - 2.0 * so + sm)
                - t2 * (a[m] * vp1 - b[m] * vm1)
        };
        r[1] = across(1, usp[i], uso[i], usm[i], r[1]);
        let along = r[mv]
            + d[mv] * (a[mv] - 2.0 * o[mv] + b[mv])
            + con[1] * c.con43 * (vp1 - 2.0 * vijk + vm1)
            - t2 * (a[mv] * vp1 - b[mv] * vm1 + (a[4] - sqp[i] - b[4] + sqm[i]) * c.c2);
        match axis {
            Axis::Y => {
                r[2] = along;
                r[3] = across(3, wsp[i], wso[i], wsm[i], r[3]);
            }
            Axis::Z => {
                r[2] = across(2, vsp[i], vso[i], vsm[i], r[2]);
                r[3] = along;
            }
        }
        r[4] = r[4]
            + d[4] * (a[4] - 2.0 * o[4] + b[4])
            + con[2] * (qsp[i] - 2.0 * qso[i] + qsm[i])
            + con[3] * (vp1 * vp1 - 2.0 * vijk * vijk + vm1 * vm1)
            + con[4] * (a[4] * rp[i] - 2.0 * o[4] * ro[i] + b[4] * rm[i])
            - t2 * ((c.c1 * a[4] - c.c2 * sqp[i]) * vp1 - (c.c1 * b[4] - c.c2 * sqm[i]) * vm1);
    }
}

/// `error_norm`'s sums for plane `k` (`u` is that plane): the squared difference from
/// the exact solution over every point, per variable.
pub fn error_sums_plane(g: &Grid, c: &Constants, u: &[f64], k: usize) -> [f64; 5] {
    error_sums_box(g, c, u, k, 0..g.n, 0..g.n)
}

/// [`error_sums_plane`] over the points of plane `k` in rows `rows` and columns `cols`.
pub fn error_sums_box(
    g: &Grid,
    c: &Constants,
    u: &[f64],
    k: usize,
    rows: Range<usize>,
    cols: Range<usize>,
) -> [f64; 5] {
    let zeta = k as f64 * c.dnzm1;
    let mut rms = [0.0; 5];
    for j in rows {
        let eta = j as f64 * c.dnym1;
        for i in cols.clone() {
            let xi = i as f64 * c.dnxm1;
            let exact = c.exact(xi, eta, zeta);
            let at = (j * g.ip + i) * 5;
            for m in 0..5 {
                let add = u[at + m] - exact[m];
                rms[m] += add * add;
            }
        }
    }
    rms
}

/// `rhs_norm`'s sums for interior plane `k` (`rhs` is that plane).
pub fn rhs_sums_plane(g: &Grid, rhs: &[f64]) -> [f64; 5] {
    rhs_sums_box(g, rhs, g.interior(), g.interior())
}

/// [`rhs_sums_plane`] over the points in rows `rows` and columns `cols` (interior
/// ones).
pub fn rhs_sums_box(g: &Grid, rhs: &[f64], rows: Range<usize>, cols: Range<usize>) -> [f64; 5] {
    let mut rms = [0.0; 5];
    for j in rows {
        for i in cols.clone() {
            let at = (j * g.ip + i) * 5;
            for m in 0..5 {
                let add = rhs[at + m];
                rms[m] += add * add;
            }
        }
    }
    rms
}

/// The root-mean-square norms from the sums, as `error_norm` and `rhs_norm` finish.
pub fn rms(g: &Grid, mut sums: [f64; 5]) -> [f64; 5] {
    for s in &mut sums {
        for _ in 0..3 {
            *s /= (g.n - 2) as f64;
        }
        *s = libm::sqrt(*s);
    }
    sums
}

/// The whole explicit right-hand side (two phases): the scalars of this thread's
/// planes, a barrier, then its planes' right-hand side, followed by `more(k)` for
/// each of them.
pub fn compute_rhs(team: &Team, g: &Grid, c: &Constants, f: &Fields, mut more: impl FnMut(usize)) {
    let planes = team.share(g.n);
    for k in planes.clone() {
        // SAFETY: plane k is this thread's; nobody writes u in this phase.
        unsafe { derived_plane(g, c, f, k) };
    }
    team.barrier();
    for k in planes {
        // SAFETY: plane k of rhs is this thread's; u, the scalars and the forcing are
        // only read in this phase.
        unsafe { rhs_plane(g, c, f, k) };
        more(k);
    }
}

/// `initialize`, in parallel by plane. Ends with a barrier.
pub fn initialize(team: &Team, g: &Grid, c: &Constants, f: &Fields) {
    for k in team.share(g.n) {
        // SAFETY: plane k of u is this thread's.
        initialize_plane(g, c, unsafe { f.u.slice_mut(g.plane_range(k, 5)) }, k);
    }
    team.barrier();
}

/// The forcing term (`exact_rhs`), in parallel. Ends with a barrier.
pub fn exact_rhs(team: &Team, g: &Grid, c: &Constants, f: &Fields) {
    for k in team.share(g.n) {
        // SAFETY: plane k of the forcing is this thread's in this phase.
        exact_rhs_plane(g, c, unsafe { f.forcing.slice_mut(g.plane_range(k, 5)) }, k);
    }
    team.barrier();
    let rows = team.share(g.n - 2);
    for j in rows.start + 1..rows.end + 1 {
        // SAFETY: row j of every plane of the forcing is this thread's in this phase.
        unsafe { exact_rhs_rows(g, c, f.forcing, j) };
    }
    team.barrier();
}

/// The error norms (`xce`) and residual norms (`xcr`) after the run, as `verify`.
pub fn norms(
    team: &Team,
    g: &Grid,
    c: &Constants,
    f: &Fields,
    sums: &Reduction,
) -> ([f64; 5], [f64; 5]) {
    let mut error = [0.0; 5];
    for k in team.share(g.n) {
        // SAFETY: nobody writes u now.
        let part = error_sums_plane(g, c, unsafe { f.u.slice(g.plane_range(k, 5)) }, k);
        for (e, p) in error.iter_mut().zip(part) {
            *e += p;
        }
    }
    let xce = rms(g, sums.sums(team, error));
    compute_rhs(team, g, c, f, |_| {});
    let mut residual = [0.0; 5];
    for k in team.share(g.n) {
        if g.interior().contains(&k) {
            // SAFETY: plane k of rhs is this thread's and finished.
            let part = rhs_sums_plane(g, unsafe { f.rhs.slice(g.plane_range(k, 5)) });
            for (r, p) in residual.iter_mut().zip(part) {
                *r += p;
            }
        }
    }
    let xcr = rms(g, sums.sums(team, residual)).map(|r| r / c.dt);
    (xcr, xce)
}

/// Whether each norm is within `epsilon` of the official value, relatively, as the
/// reference's `verify` (NaN fails).
pub fn close(got: &[f64; 5], want: &[f64; 5], epsilon: f64) -> bool {
    got.iter()
        .zip(want)
        .all(|(g, w)| libm::fabs((g - w) / w) <= epsilon)
}

/// Names of the norms in [`crate::Outcome::values`].
const XCR: [&str; 5] = ["xcr1", "xcr2", "xcr3", "xcr4", "xcr5"];
const XCE: [&str; 5] = ["xce1", "xce2", "xce3", "xce4", "xce5"];

/// The norms as printed result values.
pub fn values(xcr: &[f64; 5], xce: &[f64; 5]) -> Values {
    let mut values = Values::new();
    for (key, &v) in XCR.iter().zip(xcr).chain(XCE.iter().zip(xce)) {
        values.push(key, v);
    }
    values
}

/// One pseudo-application's problem: grid, steps, time step, whether it needs the
/// speed of sound, and its per-thread solver work (`f64`s).
pub struct App {
    pub n: usize,
    pub niter: usize,
    pub dt: f64,
    pub with_speed: bool,
    pub work_len: usize,
}

/// Arena bytes [`drive`] needs for `threads`.
pub fn heap_bytes(n: usize, with_speed: bool, work_len: usize, threads: usize) -> usize {
    Fields::bytes(&Grid::new(n), with_speed)
        + threads * work_len * core::mem::size_of::<f64>()
        + ALIGN_SLACK
        + Reduction::bytes(threads)
}

/// Runs a pseudo-application as the reference's main program: the forcing, the
/// initial field, one untimed step (`adi`, which ends with a barrier), the initial
/// field again, then `niter` timed steps. Returns the timed seconds and the residual
/// and error norms.
pub fn drive(
    team: &Team,
    arena: &mut Arena,
    app: &App,
    mut adi: impl FnMut(&Team, &Grid, &Constants, &Fields, &mut [f64]),
) -> (f64, [f64; 5], [f64; 5]) {
    let g = Grid::new(app.n);
    let c = Constants::new(app.n, app.dt);
    let f = Fields::carve(arena, &g, app.with_speed);
    let work = arena.alloc::<f64>(team.size() * app.work_len);
    let sums = Reduction::new(arena, team.size());
    let mine = team.rank() * app.work_len..(team.rank() + 1) * app.work_len;
    // SAFETY: this thread's part of the work arrays, used by no other thread.
    let w = unsafe { work.slice_mut(mine) };

    exact_rhs(team, &g, &c, &f);
    initialize(team, &g, &c, &f);
    adi(team, &g, &c, &f, w);
    initialize(team, &g, &c, &f);

    let start = team.seconds();
    for _ in 0..app.niter {
        adi(team, &g, &c, &f, w);
    }
    let seconds = team.seconds() - start;

    let (xcr, xce) = norms(team, &g, &c, &f, &sums);
    (seconds, xcr, xce)
}
