//! MG, the multigrid kernel: V-cycles of a 27-point Poisson-like operator on a periodic
//! cubic grid, from a right-hand side of ten +1 and ten -1 charges at random points.
//!
//! Every grid level holds `(n + 2)^3` values: the `n^3` interior points and one layer of
//! periodic ghost points on each face (index 0 mirrors `n`, index `n + 1` mirrors 1).
//! Storage is plane by plane (`z`, then `y` rows, `x` fastest).
//!
//! Parallel split: at each level each thread owns a contiguous block of interior `z`
//! planes ([`Team::share`]). An operator writes only its output field and only the
//! planes it owns, fills the `x`/`y` ghosts of those planes itself, and the owner of
//! plane `n` (plane 1) also copies it into ghost plane 0 (plane `n + 1`). Inputs are
//! other fields (or other levels), never written during the operator; the one operator
//! that reads its output (the in-place residual, the smoother) reads it only at the
//! point it writes. A barrier follows every operator.

use core::ops::Range;

use crate::random::{self, A};
use crate::team::{Arena, Plain, Reduction, Shared, Team};
use crate::{Class, Outcome, Values};

/// MG's seed for the right-hand side.
pub const SEED: u64 = 314_159_265;
/// Relative error allowed on the final residual norm.
pub const EPSILON: f64 = 1.0e-8;
/// Charges of each sign placed in the right-hand side.
pub const CHARGES: usize = 10;
/// Longest row (`n + 2`) the per-thread row buffers hold: grids up to 512^3.
pub const MAX_ROW: usize = 514;

/// Coefficients of the residual operator `A` (by distance: centre, face, edge, corner).
pub const RESIDUAL: [f64; 4] = [-8.0 / 3.0, 0.0, 1.0 / 6.0, 1.0 / 12.0];
/// Smoother `S(a)` of classes S, W and A.
pub const SMOOTHER_A: [f64; 4] = [-3.0 / 8.0, 1.0 / 32.0, -1.0 / 64.0, 0.0];
/// Smoother `S(b)` of classes B and C.
pub const SMOOTHER_B: [f64; 4] = [-3.0 / 17.0, 1.0 / 33.0, -1.0 / 61.0, 0.0];

/// Points along each side of the finest grid.
pub fn size(class: Class) -> usize {
    match class {
        Class::S => 32,
        Class::W => 128,
        Class::A | Class::B => 256,
        Class::C => 512,
    }
}

/// V-cycles timed (`nit`).
pub fn iterations(class: Class) -> usize {
    match class {
        Class::S | Class::W | Class::A => 4,
        Class::B | Class::C => 20,
    }
}

/// Number of grid levels (`lt`): level `k` has `2^k` points a side, level 1 is 2^3.
pub fn levels(class: Class) -> usize {
    size(class).trailing_zeros() as usize
}

/// The smoother's coefficients (`c` in the reference).
pub fn smoother(class: Class) -> [f64; 4] {
    match class {
        Class::S | Class::W | Class::A => SMOOTHER_A,
        Class::B | Class::C => SMOOTHER_B,
    }
}

/// The official L2 norm of the final residual.
#[allow(clippy::excessive_precision)] // digits as published by NASA
pub fn reference_norm(class: Class) -> f64 {
    match class {
        Class::S => 0.530_770_700_573_4e-4,
        Class::W => 0.646_732_937_533_9e-5,
        Class::A => 0.243_336_530_906_9e-5,
        Class::B => 0.180_056_440_135_5e-5,
        Class::C => 0.570_673_228_574_0e-6,
    }
}

/// Relative error of `rnm2` against the official value.
pub fn error(class: Class, rnm2: f64) -> f64 {
    let reference = reference_norm(class);
    libm::fabs(rnm2 - reference) / reference
}

/// Whether `rnm2` matches the official value within [`EPSILON`] (NaN fails).
pub fn verify(class: Class, rnm2: f64) -> bool {
    error(class, rnm2) <= EPSILON
}

/// Mop/s as the reference reports it: `58 * nit * nx*ny*nz / t / 1e6`.
pub fn mops(class: Class, seconds: f64) -> f64 {
    let n = size(class) as f64;
    58.0 * iterations(class) as f64 * n * n * n / seconds / 1.0e6
}

/// Values (interior and ghosts) of a level with `n` interior points a side.
pub(crate) const fn points(n: usize) -> usize {
    (n + 2) * (n + 2) * (n + 2)
}

/// Values of levels 1..=`lt` together (one array holds every level of `u`, of `r`).
const fn all_levels(lt: usize) -> usize {
    let mut total = 0;
    let mut k = 1;
    while k <= lt {
        total += points(1 << k);
        k += 1;
    }
    total
}

/// Stride between threads' slots of the `max` reduction: one cache line.
const MAX_SLOT: usize = 8;
/// Arena slack per allocation for its 64-byte alignment.
const ALIGN_SLACK: usize = 64;

/// Arena bytes [`run`] needs: `u` and `r` on every level, `v` on the finest, and a few
/// per-thread slots.
pub fn heap_bytes(class: Class, threads: usize) -> usize {
    let lt = levels(class);
    let f64s = |n: usize| n * core::mem::size_of::<f64>() + ALIGN_SLACK;
    2 * f64s(all_levels(lt))
        + f64s(points(size(class)))
        + threads * 2 * CHARGES * core::mem::size_of::<Candidate>()
        + ALIGN_SLACK
        + f64s(threads * MAX_SLOT)
        + Reduction::bytes(threads)
}

/// One level of a field in the arena.
#[derive(Clone, Copy)]
struct Field {
    data: Shared<f64>,
    offset: usize,
    /// Interior points a side.
    n: usize,
}

impl Field {
    fn m(&self) -> usize {
        self.n + 2
    }

    fn plane(&self) -> usize {
        self.m() * self.m()
    }

    /// Indices in `data` of planes `planes` (0..=n+1).
    fn planes(&self, planes: Range<usize>) -> Range<usize> {
        self.offset + planes.start * self.plane()..self.offset + planes.end * self.plane()
    }

    fn whole(&self) -> Range<usize> {
        self.planes(0..self.m())
    }
}

/// The levels of a field: entry `k` is level `k` (entry 0 unused).
type Levels = [Field; 16];

fn carve_levels(data: Shared<f64>, lt: usize) -> Levels {
    let mut offset = 0;
    core::array::from_fn(|k| {
        let n = if (1..=lt).contains(&k) { 1 << k } else { 0 };
        let field = Field { data, offset, n };
        if n > 0 {
            offset += points(n);
        }
        field
    })
}

/// The interior planes (1..=n) this thread owns.
fn own_planes(team: &Team, n: usize) -> Range<usize> {
    let share = team.share(n);
    share.start + 1..share.end + 1
}

/// The shape of one plane of a grid level, or of an MPI rank's block of one: `m1`
/// values a row (`x`), `m2` rows (`y`), ghosts included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Plane {
    pub(crate) m1: usize,
    pub(crate) m2: usize,
}

impl Plane {
    /// A whole level's plane: `m` values a side.
    pub(crate) const fn square(m: usize) -> Plane {
        Plane { m1: m, m2: m }
    }

    /// Values in the plane.
    pub(crate) const fn len(&self) -> usize {
        self.m1 * self.m2
    }
}

/// Where a block of interior points lies in a grid `n` a side: along each axis
/// (`x`, `y`, `z`), the grid index of its first point (1-based, as the ghost-padded
/// arrays count) and how many it holds. A thread's block is whole planes; an MPI
/// rank's is a 3-D box.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) n: usize,
    pub(crate) first: [usize; 3],
    pub(crate) count: [usize; 3],
}

impl Block {
    /// The shape of the block's planes, ghosts included.
    pub(crate) fn plane(&self) -> Plane {
        Plane {
            m1: self.count[0] + 2,
            m2: self.count[1] + 2,
        }
    }
}

/// Periodic `x` and `y` ghosts of one plane: interior rows first, then whole rows.
pub(crate) fn fill_xy_ghosts(plane: &mut [f64], p: Plane) {
    let (m1, n1, n2) = (p.m1, p.m1 - 2, p.m2 - 2);
    for row in plane[m1..(n2 + 1) * m1].chunks_exact_mut(m1) {
        row[0] = row[n1];
        row[n1 + 1] = row[1];
    }
    plane.copy_within(n2 * m1..(n2 + 1) * m1, 0);
    plane.copy_within(m1..2 * m1, (n2 + 1) * m1);
}

/// Periodic `z` ghosts: the owner of plane `n` fills plane 0, the owner of plane 1
/// fills plane `n + 1`. Call after the owned planes (with their `x`/`y` ghosts) are done.
fn fill_z_ghosts(own: &Range<usize>, f: Field) {
    let n = f.n;
    if own.contains(&n) {
        // SAFETY: plane n is this thread's and no longer written; ghost plane 0 is
        // written only by the owner of plane n and read by nobody until the barrier.
        let (src, dst) = unsafe {
            (
                f.data.slice(f.planes(n..n + 1)),
                f.data.slice_mut(f.planes(0..1)),
            )
        };
        dst.copy_from_slice(src);
    }
    if own.contains(&1) {
        // SAFETY: as above, for plane 1 and ghost plane n + 1.
        let (src, dst) = unsafe {
            (
                f.data.slice(f.planes(1..2)),
                f.data.slice_mut(f.planes(n + 1..n + 2)),
            )
        };
        dst.copy_from_slice(src);
    }
}

/// Zeroes this thread's planes of `f` (and the ghost plane it would fill).
fn zero(team: &Team, f: Field) {
    let n = f.n;
    let own = own_planes(team, n);
    // SAFETY: owned planes are written only by this thread until the next barrier.
    unsafe { f.data.slice_mut(f.planes(own.clone())) }.fill(0.0);
    if own.contains(&n) {
        // SAFETY: ghost plane 0 belongs to the owner of plane n (module docs).
        unsafe { f.data.slice_mut(f.planes(0..1)) }.fill(0.0);
    }
    if own.contains(&1) {
        // SAFETY: ghost plane n + 1 belongs to the owner of plane 1.
        unsafe { f.data.slice_mut(f.planes(n + 1..n + 2)) }.fill(0.0);
    }
}

/// `s1[i] = f0[i] + f1[i] + f2[i] + f3[i]`, `s2[i]` likewise from `e`, in that order.
#[inline(always)]
fn four_sums(s1: &mut [f64], s2: &mut [f64], f: [&[f64]; 4], e: [&[f64]; 4]) {
    let m = s1.len();
    let s2 = &mut s2[..m];
    let (f0, f1, f2, f3) = (&f[0][..m], &f[1][..m], &f[2][..m], &f[3][..m]);
    let (e0, e1, e2, e3) = (&e[0][..m], &e[1][..m], &e[2][..m], &e[3][..m]);
    for i in 0..m {
        s1[i] = f0[i] + f1[i] + f2[i] + f3[i];
        s2[i] = e0[i] + e1[i] + e2[i] + e3[i];
    }
}

/// The neighbour sums of `resid` and `psinv` along row `i2` of plane `i3` of `g`
/// (planes of shape `p`): `s1` of the four rows sharing a face with it, `s2` of the
/// four sharing an edge.
#[inline(always)]
fn cross_sums(s1: &mut [f64], s2: &mut [f64], g: &[f64], p: Plane, i2: usize, i3: usize) {
    let row = |j2: usize, j3: usize| &g[(j3 * p.m2 + j2) * p.m1..][..p.m1];
    four_sums(
        s1,
        s2,
        [
            row(i2 - 1, i3),
            row(i2 + 1, i3),
            row(i2, i3 - 1),
            row(i2, i3 + 1),
        ],
        [
            row(i2 - 1, i3 - 1),
            row(i2 + 1, i3 - 1),
            row(i2 - 1, i3 + 1),
            row(i2 + 1, i3 + 1),
        ],
    );
}

/// `r = v - A u` on this thread's planes of `r`; `v` is `r` itself when `None`.
fn resid(team: &Team, u: Field, v: Option<Field>, r: Field, a: &[f64; 4]) {
    let m = r.m();
    let pl = m * m;
    let own = own_planes(team, r.n);
    {
        // SAFETY: nobody writes u during resid (only r is written).
        let u_all = unsafe { u.data.slice(u.whole()) };
        // SAFETY: r's owned planes are written only by this thread in this phase.
        let out = unsafe { r.data.slice_mut(r.planes(own.clone())) };
        // SAFETY: v (a different field from r when given) is only read in this phase.
        let v_own = v
            .as_ref()
            .map(|v| unsafe { v.data.slice(v.planes(own.clone())) });
        for (p, i3) in own.clone().enumerate() {
            let v_plane = v_own.map(|v| &v[p * pl..(p + 1) * pl]);
            let out = &mut out[p * pl..(p + 1) * pl];
            resid_plane(u_all, i3, v_plane, out, Plane::square(m), a);
        }
    }
    fill_z_ghosts(&own, r);
}

/// `r = v - A u` on one plane of `r` (`out`, its `x`/`y` ghosts filled too). `u` holds
/// planes of shape `p` and `i3` is the one under `out` (planes `i3 ± 1` are read);
/// `v` is that plane of `v`, or `out` itself when `None`. The MPI form runs it on its
/// blocks' planes.
pub(crate) fn resid_plane(
    u: &[f64],
    i3: usize,
    v: Option<&[f64]>,
    out: &mut [f64],
    p: Plane,
    a: &[f64; 4],
) {
    let m = p.m1;
    let mut u1 = [0.0; MAX_ROW];
    let mut u2 = [0.0; MAX_ROW];
    let (u1, u2) = (&mut u1[..m], &mut u2[..m]);
    for i2 in 1..=p.m2 - 2 {
        cross_sums(u1, u2, u, p, i2, i3);
        let u0 = &u[(i3 * p.m2 + i2) * m..][..m];
        let o = &mut out[i2 * m..(i2 + 1) * m];
        match v {
            Some(v) => {
                let v = &v[i2 * m..][..m];
                for i in 1..m - 1 {
                    o[i] = v[i]
                        - a[0] * u0[i]
                        - a[2] * (u2[i] + u1[i - 1] + u1[i + 1])
                        - a[3] * (u2[i - 1] + u2[i + 1]);
                }
            }
            None => {
                for i in 1..m - 1 {
                    o[i] = o[i]
                        - a[0] * u0[i]
                        - a[2] * (u2[i] + u1[i - 1] + u1[i + 1])
                        - a[3] * (u2[i - 1] + u2[i + 1]);
                }
            }
        }
    }
    fill_xy_ghosts(out, p);
}

/// The smoother `u = u + C r` on this thread's planes of `u`.
fn psinv(team: &Team, r: Field, u: Field, c: &[f64; 4]) {
    let m = u.m();
    let pl = m * m;
    let own = own_planes(team, u.n);
    {
        // SAFETY: nobody writes r during psinv (only u is written).
        let r_all = unsafe { r.data.slice(r.whole()) };
        // SAFETY: u's owned planes are written (and read) only by this thread here.
        let out = unsafe { u.data.slice_mut(u.planes(own.clone())) };
        for (p, i3) in own.clone().enumerate() {
            psinv_plane(
                r_all,
                i3,
                &mut out[p * pl..(p + 1) * pl],
                Plane::square(m),
                c,
            );
        }
    }
    fill_z_ghosts(&own, u);
}

/// `u = u + C r` on one plane of `u` (`out`, `x`/`y` ghosts filled too); `r` holds
/// planes of shape `p` and `i3` is the one under `out`.
pub(crate) fn psinv_plane(r: &[f64], i3: usize, out: &mut [f64], p: Plane, c: &[f64; 4]) {
    let m = p.m1;
    let mut r1 = [0.0; MAX_ROW];
    let mut r2 = [0.0; MAX_ROW];
    let (r1, r2) = (&mut r1[..m], &mut r2[..m]);
    for i2 in 1..=p.m2 - 2 {
        cross_sums(r1, r2, r, p, i2, i3);
        let r0 = &r[(i3 * p.m2 + i2) * m..][..m];
        let o = &mut out[i2 * m..(i2 + 1) * m];
        for i in 1..m - 1 {
            o[i] = o[i]
                + c[0] * r0[i]
                + c[1] * (r0[i - 1] + r0[i + 1] + r1[i])
                + c[2] * (r2[i] + r1[i - 1] + r1[i + 1]);
        }
    }
    fill_xy_ghosts(out, p);
}

/// Restriction `s = P r` from `fine` to `coarse` (trilinear full weighting) on this
/// thread's planes of `coarse`. Coarse point `j` sits on fine point `2j`.
fn rprj3(team: &Team, fine: Field, coarse: Field) {
    let mc = coarse.m();
    let plc = mc * mc;
    let own = own_planes(team, coarse.n);
    {
        // SAFETY: nobody writes the fine level during rprj3.
        let r_all = unsafe { fine.data.slice(fine.whole()) };
        // SAFETY: owned coarse planes are written only by this thread (another level
        // of the array, disjoint from the fine one).
        let out = unsafe { coarse.data.slice_mut(coarse.planes(own.clone())) };
        for (p, j3) in own.clone().enumerate() {
            rprj3_plane(
                r_all,
                Plane::square(fine.m()),
                2 * j3,
                &mut out[p * plc..(p + 1) * plc],
                Plane::square(mc),
                [0, 0],
            );
        }
    }
    fill_z_ghosts(&own, coarse);
}

/// One coarse plane (`out`, of shape `pc`, `x`/`y` ghosts filled too) restricted from
/// `fine` (planes of shape `pf`), whose plane `i3` lies under it (planes `i3 ± 1` are
/// read). Coarse point `j` of a row or column lies on fine point `2j - shift` (`x`,
/// `y`): 0 for whole levels; an MPI rank holding one fine point of a level whose
/// coarser one it shares with a rank holding none has it at 1.
pub(crate) fn rprj3_plane(
    fine: &[f64],
    pf: Plane,
    i3: usize,
    out: &mut [f64],
    pc: Plane,
    shift: [usize; 2],
) {
    let (mf, mc) = (pf.m1, pc.m1);
    let mut x = [0.0; MAX_ROW];
    let mut y = [0.0; MAX_ROW];
    let (x, y) = (&mut x[..mf], &mut y[..mf]);
    for j2 in 1..=pc.m2 - 2 {
        let i2 = 2 * j2 - shift[1];
        let row = |k2: usize, k3: usize| &fine[(k3 * pf.m2 + k2) * mf..][..mf];
        four_sums(
            x,
            y,
            [
                row(i2 - 1, i3),
                row(i2 + 1, i3),
                row(i2, i3 - 1),
                row(i2, i3 + 1),
            ],
            [
                row(i2 - 1, i3 - 1),
                row(i2 - 1, i3 + 1),
                row(i2 + 1, i3 - 1),
                row(i2 + 1, i3 + 1),
            ],
        );
        let r0 = row(i2, i3);
        let s = &mut out[j2 * mc..(j2 + 1) * mc];
        for (j1, s) in s[1..mc - 1].iter_mut().enumerate() {
            let q = 2 * j1 + 2 - shift[0];
            *s = 0.5 * r0[q]
                + 0.25 * (r0[q - 1] + r0[q + 1] + x[q])
                + 0.125 * (x[q - 1] + x[q + 1] + y[q])
                + 0.0625 * (y[q - 1] + y[q + 1]);
        }
    }
    fill_xy_ghosts(out, pc);
}

/// One fine row from one coarse row: even points get `even * src[c]`, odd points
/// `odd * (src[c] + src[c + 1])`; added to the row or stored in it.
#[inline(always)]
fn spread<const ADD: bool>(row: &mut [f64], src: &[f64], even: f64, odd: f64) {
    for (pair, w) in row.chunks_exact_mut(2).zip(src.windows(2)) {
        let e = even * w[0];
        let o = odd * (w[0] + w[1]);
        if ADD {
            pair[0] += e;
            pair[1] += o;
        } else {
            pair[0] = e;
            pair[1] = o;
        }
    }
}

/// [`spread`] into a row whose points lie `shift` (0 or 1) places earlier: with 1,
/// point 0 lies between coarse points 0 and 1, and coarse point 0 makes no other.
#[inline(always)]
fn spread_shifted<const ADD: bool>(
    row: &mut [f64],
    src: &[f64],
    even: f64,
    odd: f64,
    shift: usize,
) {
    if shift == 0 {
        spread::<ADD>(row, src, even, odd);
    } else {
        let o = odd * (src[0] + src[1]);
        if ADD {
            row[0] += o;
        } else {
            row[0] = o;
        }
        spread::<ADD>(&mut row[1..], &src[1..], even, odd);
    }
}

/// Prolongation `u = u + Q z` (`ADD`) or `u = Q z` from `coarse` to `fine`, on every
/// fine point, ghosts included (as the reference, no exchange afterwards). Coarse
/// planes `0..=nc` are split among threads; coarse plane `c` makes fine planes `2c`
/// and `2c + 1`.
fn interp<const ADD: bool>(team: &Team, coarse: Field, fine: Field) {
    let plf = fine.plane();
    let own = team.share(coarse.n + 1);
    // SAFETY: nobody writes the coarse level during interp.
    let z_all = unsafe { coarse.data.slice(coarse.whole()) };
    // SAFETY: fine planes 2c, 2c+1 of owned coarse planes c are this thread's alone.
    let out = unsafe { fine.data.slice_mut(fine.planes(2 * own.start..2 * own.end)) };
    let (pc, pf) = (Plane::square(coarse.m()), Plane::square(fine.m()));
    for (pair, c3) in out.chunks_exact_mut(2 * plf).zip(own) {
        let (on, between) = pair.split_at_mut(plf);
        interp_plane::<ADD>(z_all, pc, c3, Some(on), between, pf, [0, 0]);
    }
}

/// The two fine planes (of shape `pf`) that coarse plane `c3` of `z` (planes of shape
/// `pc`; planes `c3` and `c3 + 1` are read) makes: `on` the plane lying on it (none
/// when that is outside the fine array) and `between` the one between it and the next;
/// set to, or (`ADD`) added to, their trilinear interpolation, ghosts included. Coarse
/// point `c` of a row or column makes fine points `2c - shift` and `2c + 1 - shift`
/// (see [`rprj3_plane`]).
pub(crate) fn interp_plane<const ADD: bool>(
    z: &[f64],
    pc: Plane,
    c3: usize,
    mut on: Option<&mut [f64]>,
    between: &mut [f64],
    pf: Plane,
    shift: [usize; 2],
) {
    let (mc, mf) = (pc.m1, pf.m1);
    let mut z1 = [0.0; MAX_ROW];
    let mut z2 = [0.0; MAX_ROW];
    let mut z3 = [0.0; MAX_ROW];
    let (z1, z2, z3) = (&mut z1[..mc], &mut z2[..mc], &mut z3[..mc]);
    for c2 in 0..pc.m2 - 1 {
        let zr = |a2: usize, a3: usize| &z[(a3 * pc.m2 + a2) * mc..][..mc];
        let (z00, z10, z01, z11) = (
            zr(c2, c3),
            zr(c2 + 1, c3),
            zr(c2, c3 + 1),
            zr(c2 + 1, c3 + 1),
        );
        for i in 0..mc {
            z1[i] = z10[i] + z00[i];
            z2[i] = z01[i] + z00[i];
            z3[i] = z11[i] + z01[i] + z1[i];
        }
        // Fine rows on coarse row c2 (if inside) and between it and the next.
        let on_row = (2 * c2).checked_sub(shift[1]).map(|r| r * mf..(r + 1) * mf);
        let next_row = (2 * c2 + 1 - shift[1]) * mf..(2 * c2 + 2 - shift[1]) * mf;
        let sx = shift[0];
        if let Some(plane) = on.as_deref_mut() {
            if let Some(row) = on_row.clone() {
                spread_shifted::<ADD>(&mut plane[row], z00, 1.0, 0.5, sx);
            }
            spread_shifted::<ADD>(&mut plane[next_row.clone()], z1, 0.5, 0.25, sx);
        }
        if let Some(row) = on_row {
            spread_shifted::<ADD>(&mut between[row], z2, 0.5, 0.25, sx);
        }
        spread_shifted::<ADD>(&mut between[next_row], z3, 0.25, 0.125, sx);
    }
}

/// `(sqrt(sum r^2 / n^3), max |r|)` over the interior: rank-ordered sum, so the same
/// bits for a given thread count. Contains barriers (ends with one).
fn norm2u3(team: &Team, r: Field, sums: &Reduction, maxes: Shared<f64>) -> (f64, f64) {
    let n = r.n;
    let m = n + 2;
    let own = own_planes(team, n);
    // SAFETY: nobody writes r while norms are taken.
    let (s, max) = squares_and_max(unsafe { r.data.slice(r.planes(own)) }, Plane::square(m));
    // SAFETY: slot `rank` is this thread's; read by others only after the barriers
    // inside the sum, and not rewritten before the final barrier below.
    unsafe { maxes.set(team.rank() * MAX_SLOT, max) };
    let total = sums.sum(team, s);
    let mut max = 0.0f64;
    for rank in 0..team.size() {
        // SAFETY: see above.
        max = max.max(unsafe { maxes.get(rank * MAX_SLOT) });
    }
    team.barrier();
    (libm::sqrt(total / (n * n * n) as f64), max)
}

/// `(sum x^2, max |x|)` over the interior points of `planes` (whole planes of shape
/// `p`, ghosts ignored).
pub(crate) fn squares_and_max(planes: &[f64], p: Plane) -> (f64, f64) {
    let (m1, n1, n2) = (p.m1, p.m1 - 2, p.m2 - 2);
    let mut s = 0.0;
    let mut max = 0.0f64;
    for plane in planes.chunks_exact(p.len()) {
        for row in plane[m1..(n2 + 1) * m1].chunks_exact(m1) {
            for &x in &row[1..=n1] {
                s += x * x;
                max = max.max(libm::fabs(x));
            }
        }
    }
    (s, max)
}

/// A candidate charge: a random value and its index in the field.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub(crate) struct Candidate {
    value: f64,
    index: u64,
}

// SAFETY: repr(C) of an f64 and a u64, no padding; every bit pattern is a value.
unsafe impl Plain for Candidate {}

/// No point: the placeholders the lists start with.
const NOWHERE: u64 = u64::MAX;

/// The `CHARGES` best points seen so far, worst first. "Best" is the largest (or
/// smallest) value, ties going to the point found first in the reference's scan order
/// (`z`, `y`, `x`), which is increasing index: what its strict comparisons select.
pub(crate) struct Extremes {
    largest: bool,
    pub(crate) list: [Candidate; CHARGES],
}

impl Extremes {
    fn new(largest: bool) -> Extremes {
        let value = if largest { 0.0 } else { 1.0 };
        Extremes {
            largest,
            list: [Candidate {
                value,
                index: NOWHERE,
            }; CHARGES],
        }
    }

    #[inline(always)]
    fn beats(&self, a: &Candidate, b: &Candidate) -> bool {
        let strictly = if self.largest {
            a.value > b.value
        } else {
            a.value < b.value
        };
        strictly || (a.value == b.value && a.index < b.index)
    }

    #[inline(always)]
    fn offer(&mut self, c: Candidate) {
        if self.beats(&c, &self.list[0]) {
            self.list[0] = c;
            for i in 0..CHARGES - 1 {
                if self.beats(&self.list[i], &self.list[i + 1]) {
                    self.list.swap(i, i + 1);
                } else {
                    break;
                }
            }
        }
    }
}

/// The right-hand side: the reference's random grid (value of interior point
/// `(i1, i2, i3)`, 0-based, is number `1 + i1 + n*i2 + n*n*i3` of the stream from
/// [`SEED`]), reduced to +1 at its ten largest and -1 at its ten smallest points, zero
/// elsewhere, ghosts filled. Contains one barrier (not at the end).
fn zran3(team: &Team, v: Field, candidates: Shared<Candidate>) {
    let own = own_planes(team, v.n);
    let block = Block {
        n: v.n,
        first: [1, 1, own.start],
        count: [v.n, v.n, own.len()],
    };
    // SAFETY: owned planes of v are this thread's alone until the barrier.
    let (largest, smallest) =
        zran3_scan(unsafe { v.data.slice_mut(v.planes(own.clone())) }, &block);
    let slot = team.rank() * 2 * CHARGES;
    {
        // SAFETY: this thread's candidate slot, read by others only after the barrier.
        let mine = unsafe { candidates.slice_mut(slot..slot + 2 * CHARGES) };
        mine[..CHARGES].copy_from_slice(&largest.list);
        mine[CHARGES..].copy_from_slice(&smallest.list);
    }
    team.barrier();
    // SAFETY: nobody writes candidates after the barrier (the next zran3 is many
    // barriers away).
    let all = unsafe { candidates.slice(0..team.size() * 2 * CHARGES) };
    let (largest, smallest) = merge_extremes(all);
    // SAFETY: owned planes of v, as above.
    let out = unsafe { v.data.slice_mut(v.planes(own.clone())) };
    place_charges(out, &block, &largest, &smallest);
    fill_z_ghosts(&own, v);
}

/// Zeroes `out` (the interior planes of `block`, whole planes of its shape) and returns
/// the [`CHARGES`] largest and smallest random values of the block's points (zran3's
/// first half, on one thread's planes or one rank's block). Each point's candidate
/// carries its index in the whole grid, ghosts counted (scan order, for ties).
pub(crate) fn zran3_scan(out: &mut [f64], block: &Block) -> (Extremes, Extremes) {
    let m = block.n + 2;
    let [f1, f2, f3] = block.first;
    let a1 = random::pow_mod(A, block.n as u64);
    let a2 = random::pow_mod(A, (block.n * block.n) as u64);
    // The stream's state before the block's first point of each row of its first plane.
    let row_start = random::mul_mod(
        random::pow_mod(a1, (f2 - 1) as u64),
        random::pow_mod(A, (f1 - 1) as u64),
    );
    let mut largest = Extremes::new(true);
    let mut smallest = Extremes::new(false);
    let mut row = [0.0; MAX_ROW];
    let row = &mut row[..block.count[0]];
    let planes = out.chunks_exact_mut(block.plane().len());
    for (plane, i3) in planes.zip(f3..f3 + block.count[2]) {
        plane.fill(0.0);
        let x3 = random::mul_mod(SEED, random::pow_mod(a2, (i3 - 1) as u64));
        let mut x1 = random::mul_mod(x3, row_start);
        for i2 in f2..f2 + block.count[1] {
            let mut x = x1;
            random::vranlc(row, &mut x, A);
            let base = ((i3 * m + i2) * m + f1) as u64;
            for (i1, &value) in row.iter().enumerate() {
                let c = Candidate {
                    value,
                    index: base + i1 as u64,
                };
                largest.offer(c);
                smallest.offer(c);
            }
            x1 = random::mul_mod(x1, a1);
        }
    }
    (largest, smallest)
}

/// Every part's candidates (`2 * CHARGES` each: its largest, then its smallest),
/// merged in order: the grid's largest and smallest.
pub(crate) fn merge_extremes(all: &[Candidate]) -> (Extremes, Extremes) {
    let mut largest = Extremes::new(true);
    let mut smallest = Extremes::new(false);
    for part in all.chunks_exact(2 * CHARGES) {
        part[..CHARGES].iter().for_each(|&c| largest.offer(c));
        part[CHARGES..].iter().for_each(|&c| smallest.offer(c));
    }
    (largest, smallest)
}

/// The charges that fall in `block` into `out` (its interior planes, zeroed by
/// [`zran3_scan`]), then the planes' `x`/`y` ghosts.
pub(crate) fn place_charges(
    out: &mut [f64],
    block: &Block,
    largest: &Extremes,
    smallest: &Extremes,
) {
    let m = (block.n + 2) as u64;
    let p = block.plane();
    // The grid index of a candidate along each axis, and its place in `out` if held.
    let local = |index: u64| -> Option<usize> {
        let at = [index % m, index / m % m, index / (m * m)];
        let mut offset = [0; 3];
        for axis in 0..3 {
            let held = block.first[axis]..block.first[axis] + block.count[axis];
            offset[axis] = at[axis].checked_sub(block.first[axis] as u64)? as usize;
            if !held.contains(&(at[axis] as usize)) {
                return None;
            }
        }
        Some((offset[2] * p.m2 + offset[1] + 1) * p.m1 + offset[0] + 1)
    };
    // -1 first, then +1, as the reference.
    for (list, charge) in [(&smallest.list, -1.0), (&largest.list, 1.0)] {
        for place in list.iter().filter_map(|c| local(c.index)) {
            out[place] = charge;
        }
    }
    for plane in out.chunks_exact_mut(p.len()) {
        fill_xy_ghosts(plane, p);
    }
}

/// One V-cycle (`mg3P`): restrict down to level 1, smooth there, then prolongate,
/// take the residual and smooth on every level up to the finest. Ends with a barrier.
fn mg3p(team: &Team, u: &Levels, r: &Levels, v: Field, lt: usize, c: &[f64; 4]) {
    let a = &RESIDUAL;
    for k in (2..=lt).rev() {
        rprj3(team, r[k], r[k - 1]);
        team.barrier();
    }
    // psinv reads u only where it writes it, so zeroing needs no barrier first.
    zero(team, u[1]);
    psinv(team, r[1], u[1], c);
    team.barrier();
    for k in 2..lt {
        interp::<false>(team, u[k - 1], u[k]);
        team.barrier();
        resid(team, u[k], None, r[k], a);
        team.barrier();
        psinv(team, r[k], u[k], c);
        team.barrier();
    }
    interp::<true>(team, u[lt - 1], u[lt]);
    team.barrier();
    resid(team, u[lt], Some(v), r[lt], a);
    team.barrier();
    psinv(team, r[lt], u[lt], c);
    team.barrier();
}

/// One thread's part of a team run, timed as the reference: after the untimed set-up,
/// warm-up cycle and re-initialisation, from the first residual to the final norm.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    let nx = size(class);
    let lt = levels(class);
    let nit = iterations(class);
    let c = smoother(class);
    assert!(nx + 2 <= MAX_ROW && (2..16).contains(&lt));
    let threads = team.size();
    let u_data = arena.alloc::<f64>(all_levels(lt));
    let r_data = arena.alloc::<f64>(all_levels(lt));
    let v_data = arena.alloc::<f64>(points(nx));
    let candidates = arena.alloc::<Candidate>(threads * 2 * CHARGES);
    let maxes = arena.alloc::<f64>(threads * MAX_SLOT);
    let sums = Reduction::new(arena, threads);
    let u = carve_levels(u_data, lt);
    let r = carve_levels(r_data, lt);
    let v = Field {
        data: v_data,
        offset: 0,
        n: nx,
    };
    let a = &RESIDUAL;

    // Set-up and one untimed cycle, then start again from the same state.
    zero(team, u[lt]);
    zran3(team, v, candidates);
    team.barrier();
    resid(team, u[lt], Some(v), r[lt], a);
    team.barrier();
    mg3p(team, &u, &r, v, lt, &c);
    resid(team, u[lt], Some(v), r[lt], a);
    team.barrier();
    zero(team, u[lt]);
    zran3(team, v, candidates);
    team.barrier();

    let start = team.seconds();
    resid(team, u[lt], Some(v), r[lt], a);
    team.barrier();
    let (initial, _) = norm2u3(team, r[lt], &sums, maxes);
    for _ in 0..nit {
        mg3p(team, &u, &r, v, lt, &c);
        resid(team, u[lt], Some(v), r[lt], a);
        team.barrier();
    }
    let (rnm2, rnmu) = norm2u3(team, r[lt], &sums, maxes);
    let seconds = team.seconds() - start;

    let mut values = Values::new();
    values.push("rnm2", rnm2);
    values.push("rnmu", rnmu);
    values.push("initial", initial);
    values.push("error", error(class, rnm2));
    Outcome {
        seconds,
        mops: mops(class, seconds),
        verified: verify(class, rnm2),
        values,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::testing::{noise, on_team};

    /// A full grid (ghosts included) from interior values `n^3` by periodic wrap.
    fn periodic(interior: &[f64], n: usize) -> Vec<f64> {
        let m = n + 2;
        let wrap = |g: usize| (g + n - 1) % n;
        let mut full = vec![0.0; m * m * m];
        for i3 in 0..m {
            for i2 in 0..m {
                for i1 in 0..m {
                    full[(i3 * m + i2) * m + i1] =
                        interior[(wrap(i3) * n + wrap(i2)) * n + wrap(i1)];
                }
            }
        }
        full
    }

    /// Interior value at `(i1, i2, i3) + d`, periodic.
    fn at(g: &[f64], n: usize, i: [usize; 3], d: [isize; 3]) -> f64 {
        let w = |k: usize| (i[k] as isize + d[k]).rem_euclid(n as isize) as usize;
        g[(w(2) * n + w(1)) * n + w(0)]
    }

    /// `sum over the 27 neighbours of w[|d|_1] * g(i + d)`, periodic.
    fn stencil(g: &[f64], n: usize, i: [usize; 3], w: &[f64; 4]) -> f64 {
        let mut total = 0.0;
        for d3 in -1..=1isize {
            for d2 in -1..=1isize {
                for d1 in -1..=1isize {
                    let dist = (d1.abs() + d2.abs() + d3.abs()) as usize;
                    total += w[dist] * at(g, n, i, [d1, d2, d3]);
                }
            }
        }
        total
    }

    fn interior_points(n: usize) -> impl Iterator<Item = [usize; 3]> {
        (0..n * n * n).map(move |k| [k % n, k / n % n, k / (n * n)])
    }

    fn assert_close(got: &[f64], want: &[f64], what: &str) {
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-12 * (1.0 + w.abs()),
                "{what}: point {k}: got {g}, want {w}"
            );
        }
    }

    /// A one-level field of `n` points a side in the arena, filled by rank 0.
    fn field(team: &Team, arena: &mut Arena, n: usize, init: &[f64]) -> Field {
        let f = Field {
            data: arena.alloc(points(n)),
            offset: 0,
            n,
        };
        if team.is_master() {
            // SAFETY: only rank 0 touches the field before the barrier the caller runs.
            unsafe { f.data.all_mut() }.copy_from_slice(init);
        }
        f
    }

    fn read(f: Field) -> Vec<f64> {
        // SAFETY: called after the barrier that ends the operator.
        unsafe { f.data.all() }.to_vec()
    }

    const N: usize = 6;

    #[test]
    fn resid_matches_a_naive_periodic_stencil() {
        let (u0, v0) = (noise(N * N * N, 1), noise(N * N * N, 2));
        let want: Vec<f64> = interior_points(N)
            .map(|i| {
                let k = (i[2] * N + i[1]) * N + i[0];
                v0[k] - stencil(&u0, N, i, &RESIDUAL)
            })
            .collect();
        let want = periodic(&want, N);
        let (u, v) = (periodic(&u0, N), periodic(&v0, N));
        for threads in [1, 3, 4] {
            let (out, in_place) = on_team(threads, 4 * 8 * points(N) + 4096, |team, arena| {
                let uf = field(team, arena, N, &u);
                let vf = field(team, arena, N, &v);
                let rf = field(team, arena, N, &noise(points(N), 3));
                let sf = field(team, arena, N, &v);
                team.barrier();
                resid(team, uf, Some(vf), rf, &RESIDUAL);
                resid(team, uf, None, sf, &RESIDUAL);
                team.barrier();
                (read(rf), read(sf))
            });
            assert_close(&out, &want, "resid");
            assert_close(&in_place, &want, "resid in place");
        }
    }

    #[test]
    fn psinv_matches_a_naive_periodic_stencil() {
        let (u0, r0) = (noise(N * N * N, 4), noise(N * N * N, 5));
        let c = SMOOTHER_A;
        let want: Vec<f64> = interior_points(N)
            .map(|i| u0[(i[2] * N + i[1]) * N + i[0]] + stencil(&r0, N, i, &c))
            .collect();
        let want = periodic(&want, N);
        let (u, r) = (periodic(&u0, N), periodic(&r0, N));
        for threads in [1, 3] {
            let out = on_team(threads, 2 * 8 * points(N) + 4096, |team, arena| {
                let uf = field(team, arena, N, &u);
                let rf = field(team, arena, N, &r);
                team.barrier();
                psinv(team, rf, uf, &c);
                team.barrier();
                read(uf)
            });
            assert_close(&out, &want, "psinv");
        }
    }

    #[test]
    fn rprj3_matches_naive_full_weighting() {
        let (nf, nc) = (8, 4);
        let fine0 = noise(nf * nf * nf, 6);
        let weights = [0.5, 0.25, 0.125, 0.0625];
        // Coarse point J sits on fine point 2J + 1 (0-based interiors).
        let want: Vec<f64> = interior_points(nc)
            .map(|j| stencil(&fine0, nf, j.map(|x| 2 * x + 1), &weights))
            .collect();
        let want = periodic(&want, nc);
        let fine = periodic(&fine0, nf);
        for threads in [1, 3, 5] {
            let out = on_team(
                threads,
                8 * (points(nf) + points(nc)) + 4096,
                |team, arena| {
                    let ff = field(team, arena, nf, &fine);
                    let cf = field(team, arena, nc, &noise(points(nc), 7));
                    team.barrier();
                    rprj3(team, ff, cf);
                    team.barrier();
                    read(cf)
                },
            );
            assert_close(&out, &want, "rprj3");
        }
    }

    #[test]
    fn interp_matches_naive_trilinear_interpolation() {
        let (nc, nf) = (4, 8);
        let coarse0 = noise(nc * nc * nc, 8);
        let base0 = noise(nf * nf * nf, 9);
        // Fine interior i: odd i sits on coarse (i-1)/2; even i halfway between
        // coarse i/2 - 1 and i/2 (periodic).
        let weights = |i: usize| -> Vec<(isize, f64)> {
            if i % 2 == 1 {
                vec![((i as isize - 1) / 2, 1.0)]
            } else {
                vec![(i as isize / 2 - 1, 0.5), (i as isize / 2, 0.5)]
            }
        };
        let correction: Vec<f64> = interior_points(nf)
            .map(|i| {
                let mut total = 0.0;
                for (c3, w3) in weights(i[2]) {
                    for (c2, w2) in weights(i[1]) {
                        for (c1, w1) in weights(i[0]) {
                            total += w1 * w2 * w3 * at(&coarse0, nc, [0, 0, 0], [c1, c2, c3]);
                        }
                    }
                }
                total
            })
            .collect();
        let added: Vec<f64> = base0.iter().zip(&correction).map(|(b, c)| b + c).collect();
        let (coarse, base) = (periodic(&coarse0, nc), periodic(&base0, nf));
        for threads in [1, 2, 3] {
            let (sum, set) = on_team(
                threads,
                8 * (points(nc) + 2 * points(nf)) + 4096,
                |team, arena| {
                    let cf = field(team, arena, nc, &coarse);
                    let ff = field(team, arena, nf, &base);
                    let gf = field(team, arena, nf, &noise(points(nf), 10));
                    team.barrier();
                    interp::<true>(team, cf, ff);
                    interp::<false>(team, cf, gf);
                    team.barrier();
                    (read(ff), read(gf))
                },
            );
            assert_close(&sum, &periodic(&added, nf), "interp add");
            assert_close(&set, &periodic(&correction, nf), "interp set");
        }
    }

    #[test]
    fn norm_matches_naive_sum() {
        let n = 8;
        let g0 = noise(n * n * n, 11);
        let want2 = (g0.iter().map(|x| x * x).sum::<f64>() / (n * n * n) as f64).sqrt();
        let wantu = g0.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        // Garbage in the ghosts must not count.
        let mut g = periodic(&g0, n);
        g[0] = 1e9;
        for threads in [1, 3] {
            let (rnm2, rnmu) = on_team(threads, 8 * points(n) + 8192, |team, arena| {
                let f = field(team, arena, n, &g);
                let maxes = arena.alloc(team.size() * MAX_SLOT);
                let sums = Reduction::new(arena, team.size());
                team.barrier();
                norm2u3(team, f, &sums, maxes)
            });
            assert!((rnm2 - want2).abs() <= 1e-14 * want2, "{rnm2} vs {want2}");
            assert_eq!(rnmu, wantu);
        }
    }

    #[test]
    fn zran3_places_charges_at_the_extremes_of_the_stream() {
        let n = 8;
        // The stream stepped one number at a time with u128 arithmetic.
        let mut x: u128 = SEED as u128;
        let values: Vec<f64> = (0..n * n * n)
            .map(|_| {
                x = x * 1_220_703_125 % (1u128 << 46);
                x as f64 / (1u64 << 46) as f64
            })
            .collect();
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        let mut want = vec![0.0; n * n * n];
        for &k in &order[..CHARGES] {
            want[k] = -1.0;
        }
        for &k in &order[order.len() - CHARGES..] {
            want[k] = 1.0;
        }
        let want = periodic(&want, n);
        for threads in [1, 2, 3, 5] {
            let got = on_team(threads, 8 * points(n) + 16384, |team, arena| {
                let f = field(team, arena, n, &noise(points(n), 12));
                let candidates = arena.alloc(team.size() * 2 * CHARGES);
                team.barrier();
                zran3(team, f, candidates);
                team.barrier();
                read(f)
            });
            assert_eq!(got, want, "{threads} threads");
        }
    }

    #[test]
    fn extremes_break_ties_by_first_found() {
        let mut big = Extremes::new(true);
        for index in 0..30u64 {
            big.offer(Candidate {
                value: if index % 3 == 0 { 0.5 } else { 0.25 },
                index,
            });
        }
        let mut kept: Vec<u64> = big.list.iter().map(|c| c.index).collect();
        kept.sort();
        assert_eq!(kept, [0, 3, 6, 9, 12, 15, 18, 21, 24, 27]);
        let mut small = Extremes::new(false);
        for index in (0..30u64).rev() {
            small.offer(Candidate { value: 0.5, index });
        }
        let mut kept: Vec<u64> = small.list.iter().map(|c| c.index).collect();
        kept.sort();
        assert_eq!(kept, (0..10).collect::<Vec<u64>>());
    }

    #[test]
    fn verify_rejects_wrong_norms() {
        for &class in crate::Kernel::Mg.classes() {
            let good = reference_norm(class);
            assert!(verify(class, good));
            assert!(verify(class, good * (1.0 + 0.5e-8)));
            assert!(!verify(class, good * (1.0 + 2e-8)));
            assert!(!verify(class, good * (1.0 - 2e-8)));
            assert!(!verify(class, f64::NAN));
        }
        assert!(!verify(Class::W, reference_norm(Class::S)));
    }

    #[test]
    fn mops_formula() {
        // Class S: 58 * 4 * 32^3 = 7_602_176 operations.
        assert!((mops(Class::S, 1.0) - 7.602_176).abs() < 1e-9);
        assert!((mops(Class::A, 2.0) - 58.0 * 4.0 * 256f64.powi(3) / 2e6).abs() < 1e-6);
    }

    #[test]
    fn heap_holds_every_level() {
        // u and r on every level, v on the finest, as f64s.
        let a: usize = (1..=8).map(|k| ((1usize << k) + 2).pow(3)).sum();
        assert!(heap_bytes(Class::A, 2) >= 8 * (2 * a + 258usize.pow(3)));
    }
}
