//! FT, the 3-D FFT PDE kernel: a random complex field is transformed forward once, then
//! each iteration multiplies its spectrum by the heat equation's decay factors
//! `exp(-4 alpha pi^2 (ii^2 + jj^2 + kk^2))` (cumulatively, as NPB 3.x), transforms it
//! back and sums 1024 fixed points of the result (the checksum).
//!
//! Storage is plane by plane (`z`, then `y` rows, `x` fastest); each row is padded by one
//! complex, as the reference (`d1 + 1`), so power-of-two strides do not alias in cache.
//! Two complex arrays: `u0` holds the evolving spectrum, `u1` the field being
//! transformed. The decay factor is separable, so instead of the reference's third
//! array (`twiddle`, one real per point, an `exp` each) each thread keeps three 1-D
//! factor tables and multiplies them per point: the same value to a few ulps, 20 % less
//! memory, and a timed set-up without `nx*ny*nz` exponentials.
//!
//! The 1-D FFTs are the reference's: Swarztrauber's Stockham variant (`cfftz`, with the
//! `fftz2` butterflies and the `fft_init` roots-of-unity table), applied to [`LANES`]
//! lines at once. A thread gathers a block of lines from the grid into its scratch
//! (real parts of the lanes, then imaginary parts, point by point), transforms it there,
//! and scatters it back; the lanes make the butterfly loops vector code.
//!
//! Parallel split: the x and y passes split the `z` planes among the threads and run
//! plane by plane (a plane's x and y lines lie in it, and it is still in cache for the
//! second pass); the z pass splits its blocks of lines ([`Team::share`] of the block
//! index). Lines belong to one thread per pass, so the passes work in place; a barrier
//! separates the z pass from the others. Initial conditions and `evolve` split the rows;
//! the checksum splits its 1024 points and sums in rank order.

use core::f64::consts::PI;
use core::ops::Range;

use crate::random::{self, A};
use crate::team::{Arena, Plain, Reduction, Shared, Team};
use crate::{Class, Outcome, Values};

/// FT's seed for the initial conditions.
pub const SEED: u64 = 314_159_265;
/// The diffusion constant of the PDE.
pub const ALPHA: f64 = 1.0e-6;
/// Relative error allowed on each checksum (complex modulus, as the reference).
pub const EPSILON: f64 = 1.0e-12;
/// Points summed by each checksum.
pub const CHECKSUM_POINTS: usize = 1024;
/// Lines transformed together (`fftblock` in the reference).
pub const LANES: usize = 16;
/// Most iterations of any class here (sizes the checksum list).
pub const MAX_ITERATIONS: usize = 20;

/// `f64`s per point of a block in scratch: the lanes' real parts, then imaginary parts.
const POINT: usize = 2 * LANES;
/// Points per tile of the x pass's transposition: a tile of the block stays in L1
/// while its lanes are filled one by one (lane by lane over the whole block is ~40 %
/// slower at class A).
const TILE: usize = 8;
/// Arena slack per allocation for its 64-byte alignment.
const ALIGN_SLACK: usize = 64;

/// A double-precision complex number, laid out as Fortran's `double complex`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Complex {
    pub re: f64,
    pub im: f64,
}

// SAFETY: repr(C) of two f64s, no padding; every bit pattern is a value.
unsafe impl Plain for Complex {}

impl Complex {
    pub const ZERO: Complex = Complex { re: 0.0, im: 0.0 };

    pub const fn new(re: f64, im: f64) -> Complex {
        Complex { re, im }
    }

    /// `|self|`, as Fortran's `abs` of a complex.
    pub fn abs(self) -> f64 {
        libm::hypot(self.re, self.im)
    }
}

/// Grid points along x, y and z.
pub fn dims(class: Class) -> [usize; 3] {
    match class {
        Class::S => [64, 64, 64],
        Class::W => [128, 128, 32],
        Class::A => [256, 256, 128],
        Class::B => [512, 256, 256],
        Class::C => [512, 512, 512],
    }
}

/// Time steps (`niter`): one inverse FFT and one checksum each.
pub fn iterations(class: Class) -> usize {
    match class {
        Class::S | Class::W | Class::A => 6,
        Class::B | Class::C => 20,
    }
}

/// The official checksum after each iteration.
#[allow(clippy::excessive_precision)] // digits as published by NASA
pub fn reference_checksums(class: Class) -> &'static [Complex] {
    match class {
        Class::S => {
            const {
                &[
                    Complex::new(5.546087004964e2, 4.845363331978e2),
                    Complex::new(5.546385409189e2, 4.865304269511e2),
                    Complex::new(5.546148406171e2, 4.883910722336e2),
                    Complex::new(5.545423607415e2, 4.901273169046e2),
                    Complex::new(5.544255039624e2, 4.917475857993e2),
                    Complex::new(5.542683411902e2, 4.932597244941e2),
                ]
            }
        }
        Class::W => {
            const {
                &[
                    Complex::new(5.673612178944e2, 5.293246849175e2),
                    Complex::new(5.631436885271e2, 5.282149986629e2),
                    Complex::new(5.594024089970e2, 5.270996558037e2),
                    Complex::new(5.560698047020e2, 5.260027904925e2),
                    Complex::new(5.530898991250e2, 5.249400845633e2),
                    Complex::new(5.504159734538e2, 5.239212247086e2),
                ]
            }
        }
        Class::A => {
            const {
                &[
                    Complex::new(5.046735008193e2, 5.114047905510e2),
                    Complex::new(5.059412319734e2, 5.098809666433e2),
                    Complex::new(5.069376896287e2, 5.098144042213e2),
                    Complex::new(5.077892868474e2, 5.101336130759e2),
                    Complex::new(5.085233095391e2, 5.104914655194e2),
                    Complex::new(5.091487099959e2, 5.107917842803e2),
                ]
            }
        }
        Class::B => {
            const {
                &[
                    Complex::new(5.177643571579e2, 5.077803458597e2),
                    Complex::new(5.154521291263e2, 5.088249431599e2),
                    Complex::new(5.146409228649e2, 5.096208912659e2),
                    Complex::new(5.142378756213e2, 5.101023387619e2),
                    Complex::new(5.139626667737e2, 5.103976610617e2),
                    Complex::new(5.137423460082e2, 5.105948019802e2),
                    Complex::new(5.135547056878e2, 5.107404165783e2),
                    Complex::new(5.133910925466e2, 5.108576573661e2),
                    Complex::new(5.132470705390e2, 5.109577278523e2),
                    Complex::new(5.131197729984e2, 5.110460304483e2),
                    Complex::new(5.130070319283e2, 5.111252433800e2),
                    Complex::new(5.129070537032e2, 5.111968077718e2),
                    Complex::new(5.128182883502e2, 5.112616233064e2),
                    Complex::new(5.127393733383e2, 5.113203605551e2),
                    Complex::new(5.126691062020e2, 5.113735928093e2),
                    Complex::new(5.126064276004e2, 5.114218460548e2),
                    Complex::new(5.125504076570e2, 5.114656139760e2),
                    Complex::new(5.125002331720e2, 5.115053595966e2),
                    Complex::new(5.124551951846e2, 5.115415130407e2),
                    Complex::new(5.124146770029e2, 5.115744692211e2),
                ]
            }
        }
        Class::C => {
            const {
                &[
                    Complex::new(5.195078707457e2, 5.149019699238e2),
                    Complex::new(5.155422171134e2, 5.127578201997e2),
                    Complex::new(5.144678022222e2, 5.122251847514e2),
                    Complex::new(5.140150594328e2, 5.121090289018e2),
                    Complex::new(5.137550426810e2, 5.121143685824e2),
                    Complex::new(5.135811056728e2, 5.121496764568e2),
                    Complex::new(5.134569343165e2, 5.121870921893e2),
                    Complex::new(5.133651975661e2, 5.122193250322e2),
                    Complex::new(5.132955192805e2, 5.122454735794e2),
                    Complex::new(5.132410471738e2, 5.122663649603e2),
                    Complex::new(5.131971141679e2, 5.122830879827e2),
                    Complex::new(5.131605205716e2, 5.122965869718e2),
                    Complex::new(5.131290734194e2, 5.123075927445e2),
                    Complex::new(5.131012720314e2, 5.123166486553e2),
                    Complex::new(5.130760908195e2, 5.123241541685e2),
                    Complex::new(5.130528295923e2, 5.123304037599e2),
                    Complex::new(5.130310107773e2, 5.123356167976e2),
                    Complex::new(5.130103090133e2, 5.123399592211e2),
                    Complex::new(5.129905029333e2, 5.123435588985e2),
                    Complex::new(5.129714421109e2, 5.123465164008e2),
                ]
            }
        }
    }
}

/// Relative error of checksum `it` (0-based) against the official one, as the
/// reference measures it: `|sum - ref| / |ref|`.
pub fn error(class: Class, it: usize, sum: Complex) -> f64 {
    let reference = reference_checksums(class)[it];
    let diff = Complex::new(sum.re - reference.re, sum.im - reference.im);
    diff.abs() / reference.abs()
}

/// Whether every iteration's checksum matches within [`EPSILON`] (NaN fails, and so
/// does a missing iteration).
pub fn verify(class: Class, sums: &[Complex]) -> bool {
    sums.len() == iterations(class)
        && sums
            .iter()
            .enumerate()
            .all(|(it, &sum)| error(class, it, sum) <= EPSILON)
}

/// Mop/s as the reference reports it:
/// `ntotal * (14.8157 + 7.19641 ln ntotal + (5.23518 + 7.21113 ln ntotal) niter) / t / 1e6`.
pub fn mops(class: Class, seconds: f64) -> f64 {
    let [nx, ny, nz] = dims(class);
    let n = (nx * ny * nz) as f64;
    let ln = libm::log(n);
    n * (14.8157 + 7.19641 * ln + (5.23518 + 7.21113 * ln) * iterations(class) as f64)
        / seconds
        / 1.0e6
}

/// The shape of the grid and where each point lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grid {
    pub(crate) nx: usize,
    pub(crate) ny: usize,
    pub(crate) nz: usize,
}

impl Grid {
    pub(crate) fn new([nx, ny, nz]: [usize; 3]) -> Grid {
        assert!(
            [nx, ny, nz].iter().all(|n| n.is_power_of_two()),
            "FT needs power-of-two sides"
        );
        Grid { nx, ny, nz }
    }

    /// Distance between rows: one complex of padding.
    pub(crate) fn row(&self) -> usize {
        self.nx + 1
    }

    pub(crate) fn plane(&self) -> usize {
        self.row() * self.ny
    }

    /// Complex values in one array, padding included.
    pub(crate) fn len(&self) -> usize {
        self.plane() * self.nz
    }

    pub(crate) fn index(&self, i: usize, j: usize, k: usize) -> usize {
        i + self.row() * (j + self.ny * k)
    }

    /// Points of the grid (`ntotal`).
    pub(crate) fn total(&self) -> usize {
        self.nx * self.ny * self.nz
    }

    fn max_dim(&self) -> usize {
        self.nx.max(self.ny).max(self.nz)
    }

    /// Rows `rows` (of `ny * nz`, row `r` is `(j, k) = (r % ny, r / ny)`) as one range of
    /// the array: rows are consecutive, so a run of them is contiguous.
    fn rows(&self, rows: Range<usize>) -> Range<usize> {
        if rows.is_empty() {
            return 0..0;
        }
        rows.start * self.row()..(rows.end - 1) * self.row() + self.nx
    }

    /// `f64`s of one thread's [`Work`], a whole number of cache lines.
    pub(crate) fn work_len(&self) -> usize {
        let m = self.max_dim();
        (2 * m * POINT + 2 * m + self.nx + self.ny + self.nz).next_multiple_of(8)
    }
}

/// Arena bytes [`run`] needs: `u0`, `u1`, each thread's [`Work`], the reduction slots.
pub fn heap_bytes(class: Class, threads: usize) -> usize {
    let g = Grid::new(dims(class));
    2 * (g.len() * core::mem::size_of::<Complex>() + ALIGN_SLACK)
        + threads * g.work_len() * core::mem::size_of::<f64>()
        + ALIGN_SLACK
        + Reduction::bytes(threads)
}

/// One thread's private arrays: two FFT block buffers, the roots of unity, the decay
/// factor tables.
pub(crate) struct Work<'a> {
    a: &'a mut [f64],
    b: &'a mut [f64],
    /// `fft_init`'s `u`: entry `ln + i` (re, im at `2(ln + i)`, `2(ln + i) + 1`) is
    /// `exp(i pi i / ln)` for `ln = 1, 2, 4, ..., n / 2`, `i < ln`.
    pub(crate) roots: &'a mut [f64],
    /// Decay factor per x index for one time step: `exp(-4 alpha pi^2 ii^2)`.
    pub(crate) tx: &'a mut [f64],
    pub(crate) ty: &'a mut [f64],
    pub(crate) tz: &'a mut [f64],
}

impl<'a> Work<'a> {
    pub(crate) fn carve(g: &Grid, all: &'a mut [f64]) -> Work<'a> {
        let line = g.max_dim() * POINT;
        let (a, rest) = all.split_at_mut(line);
        let (b, rest) = rest.split_at_mut(line);
        let (roots, rest) = rest.split_at_mut(2 * g.max_dim());
        let (tx, rest) = rest.split_at_mut(g.nx);
        let (ty, rest) = rest.split_at_mut(g.ny);
        let (tz, _) = rest.split_at_mut(g.nz);
        Work {
            a,
            b,
            roots,
            tx,
            ty,
            tz,
        }
    }
}

/// The roots-of-unity table for transforms of up to `n` points (`fft_init`).
pub(crate) fn fft_init(roots: &mut [f64], n: usize) {
    let mut ln = 1;
    while ln < n {
        let t = PI / ln as f64;
        for i in 0..ln {
            let ti = i as f64 * t;
            roots[2 * (ln + i)] = libm::cos(ti);
            roots[2 * (ln + i) + 1] = libm::sin(ti);
        }
        ln *= 2;
    }
}

/// One time step's decay factor along an axis of `n` points: index `i` stands for the
/// wave number `ii = (i + n/2) mod n - n/2` (0, 1, ..., n/2 - 1, -n/2, ..., -1).
pub(crate) fn decay_factors(out: &mut [f64]) {
    let n = out.len() as isize;
    let ap = -4.0 * ALPHA * PI * PI;
    for (i, t) in out.iter_mut().enumerate() {
        let ii = (i as isize + n / 2) % n - n / 2;
        *t = libm::exp(ap * (ii * ii) as f64);
    }
}

/// One radix-2 butterfly on all lanes of a point pair: `s = x + z`, `d = w (x - z)`.
#[inline(always)]
fn butterfly(
    x: &[f64; POINT],
    z: &[f64; POINT],
    s: &mut [f64; POINT],
    d: &mut [f64; POINT],
    wr: f64,
    wi: f64,
) {
    for j in 0..LANES {
        let (xr, xi, zr, zi) = (x[j], x[LANES + j], z[j], z[LANES + j]);
        s[j] = xr + zr;
        s[LANES + j] = xi + zi;
        let (dr, di) = (xr - zr, xi - zi);
        d[j] = wr * dr - wi * di;
        d[LANES + j] = wr * di + wi * dr;
    }
}

/// Stage `l` (1-based) of the Stockham FFT of `2^m` points, `x` to `y` (`fftz2`).
fn fftz2(forward: bool, l: u32, m: u32, roots: &[f64], x: &[f64], y: &mut [f64]) {
    let n = 1usize << m;
    let n1 = n / 2;
    let lk = 1usize << (l - 1);
    let li = 1usize << (m - l);
    let lj = 2 * lk;
    let (x, _) = x[..n * POINT].as_chunks::<POINT>();
    let (y, _) = y[..n * POINT].as_chunks_mut::<POINT>();
    let roots = &roots[2 * li..4 * li];
    for i in 0..li {
        let i11 = i * lk;
        let i12 = i11 + n1;
        let i21 = i * lj;
        let wr = roots[2 * i];
        let wi = if forward {
            roots[2 * i + 1]
        } else {
            -roots[2 * i + 1]
        };
        let xa = &x[i11..i11 + lk];
        let xb = &x[i12..i12 + lk];
        let (ya, yb) = y[i21..i21 + lj].split_at_mut(lk);
        for (((x, z), s), d) in xa.iter().zip(xb).zip(ya).zip(yb) {
            butterfly(x, z, s, d, wr, wi);
        }
    }
}

/// Transforms the `2^m`-point lines of a block (`cfftz`): forward is `exp(+2 pi i jk/n)`,
/// as NPB. Ping-pongs between `x` and `y`; returns the one holding the result.
fn cfftz<'b>(
    forward: bool,
    m: u32,
    roots: &[f64],
    x: &'b mut [f64],
    y: &'b mut [f64],
) -> &'b [f64] {
    let mut l = 1;
    while l <= m {
        fftz2(forward, l, m, roots, x, y);
        if l == m {
            return y;
        }
        fftz2(forward, l + 1, m, roots, y, x);
        l += 2;
    }
    x
}

/// Block point from `lanes` consecutive complex values (unused lanes zeroed).
#[inline(always)]
fn deinterleave(seg: &[Complex], point: &mut [f64; POINT]) {
    if let Ok(seg) = <&[Complex; LANES]>::try_from(seg) {
        for l in 0..LANES {
            point[l] = seg[l].re;
            point[LANES + l] = seg[l].im;
        }
    } else {
        point.fill(0.0);
        for (l, c) in seg.iter().enumerate().take(LANES) {
            point[l] = c.re;
            point[LANES + l] = c.im;
        }
    }
}

/// The first `seg.len()` lanes of a block point back into consecutive complex values.
#[inline(always)]
fn interleave(point: &[f64; POINT], seg: &mut [Complex]) {
    if let Ok(seg) = <&mut [Complex; LANES]>::try_from(&mut *seg) {
        for l in 0..LANES {
            seg[l] = Complex::new(point[l], point[LANES + l]);
        }
    } else {
        for (l, c) in seg.iter_mut().enumerate().take(LANES) {
            *c = Complex::new(point[l], point[LANES + l]);
        }
    }
}

/// One block of the x pass (`cffts1`): rows `j0..` (up to `LANES`) of plane `k`, each row
/// one line, from `src` to `dst`. Rows are contiguous, so the block is transposed into
/// scratch and back, [`TILE`] points at a time. The block's rows must be this thread's.
fn x_block(
    g: &Grid,
    forward: bool,
    k: usize,
    j0: usize,
    src: Shared<Complex>,
    dst: Shared<Complex>,
    w: &mut Work,
) {
    let (n, row) = (g.nx, g.row());
    let lanes = LANES.min(g.ny - j0);
    let range = g.index(0, j0, k)..g.index(n, j0 + lanes - 1, k);
    {
        let (points, _) = w.a[..n * POINT].as_chunks_mut::<POINT>();
        if lanes < LANES {
            points.iter_mut().for_each(|p| p.fill(0.0));
        }
        // SAFETY: the block's rows are this thread's (caller); nobody writes them while
        // the slice lives (the writes to dst come after it is dropped).
        let block = unsafe { src.slice(range.clone()) };
        for (t, tile) in points.chunks_mut(TILE).enumerate() {
            let len = tile.len();
            for l in 0..lanes {
                let at = l * row + t * TILE;
                for (p, c) in tile.iter_mut().zip(&block[at..at + len]) {
                    p[l % LANES] = c.re;
                    p[LANES + l % LANES] = c.im;
                }
            }
        }
    }
    let out = cfftz(forward, n.trailing_zeros(), w.roots, w.a, w.b);
    let (points, _) = out[..n * POINT].as_chunks::<POINT>();
    // SAFETY: as above; the block's rows are written by this thread alone.
    let block = unsafe { dst.slice_mut(range) };
    for (t, tile) in points.chunks(TILE).enumerate() {
        for l in 0..lanes {
            let at = l * row + t * TILE;
            for (p, c) in tile.iter().zip(&mut block[at..at + tile.len()]) {
                *c = Complex::new(p[l % LANES], p[LANES + l % LANES]);
            }
        }
    }
}

/// A block of the y or z pass: `lanes` neighbouring lines along x, point `p` of lane `l`
/// at `base + p * stride + l`.
#[derive(Clone, Copy)]
struct Lines {
    base: usize,
    stride: usize,
    n: usize,
    lanes: usize,
}

impl Lines {
    /// Point `p` of every lane.
    fn at(&self, p: usize) -> Range<usize> {
        let at = self.base + p * self.stride;
        at..at + self.lanes
    }
}

/// One block of the y or z pass (`cffts2`, `cffts3`), from `src` to `dst`: gathered
/// point by point into scratch, transformed, scattered back. The block's lines must be
/// this thread's.
fn strided_block(
    forward: bool,
    lines: Lines,
    src: Shared<Complex>,
    dst: Shared<Complex>,
    w: &mut Work,
) {
    let n = lines.n;
    {
        let (points, _) = w.a[..n * POINT].as_chunks_mut::<POINT>();
        for (p, point) in points.iter_mut().enumerate() {
            // SAFETY: the block's lines are this thread's (caller); nobody writes them
            // while the slice lives.
            deinterleave(unsafe { src.slice(lines.at(p)) }, point);
        }
    }
    let out = cfftz(forward, n.trailing_zeros(), w.roots, w.a, w.b);
    let (points, _) = out[..n * POINT].as_chunks::<POINT>();
    for (p, point) in points.iter().enumerate() {
        // SAFETY: as above; written by this thread alone.
        interleave(point, unsafe { dst.slice_mut(lines.at(p)) });
    }
}

/// Columns `i0..` (up to `LANES`) of plane `k`: a block of the y pass.
fn y_lines(g: &Grid, k: usize, i0: usize) -> Lines {
    Lines {
        base: g.index(i0, 0, k),
        stride: g.row(),
        n: g.ny,
        lanes: LANES.min(g.nx - i0),
    }
}

/// The x and y passes on this thread's planes, from `src` to `dst`: forward x then y,
/// inverse y then x. A plane's y lines need only its own x lines, so the two passes
/// run plane by plane without a barrier between them, and each plane is still in
/// cache for the second. No barrier.
pub(crate) fn fft_xy(
    team: &Team,
    g: &Grid,
    forward: bool,
    src: Shared<Complex>,
    dst: Shared<Complex>,
    w: &mut Work,
) {
    for k in team.share(g.nz) {
        if forward {
            for j0 in (0..g.ny).step_by(LANES) {
                x_block(g, true, k, j0, src, dst, w);
            }
            for i0 in (0..g.nx).step_by(LANES) {
                strided_block(true, y_lines(g, k, i0), dst, dst, w);
            }
        } else {
            for i0 in (0..g.nx).step_by(LANES) {
                strided_block(false, y_lines(g, k, i0), src, dst, w);
            }
            for j0 in (0..g.ny).step_by(LANES) {
                x_block(g, false, k, j0, dst, dst, w);
            }
        }
    }
}

/// The z pass (`cffts3`) from `src` to `dst`: blocks `(j, x block)` split among the
/// threads. No barrier.
pub(crate) fn fft_z(
    team: &Team,
    g: &Grid,
    forward: bool,
    src: Shared<Complex>,
    dst: Shared<Complex>,
    w: &mut Work,
) {
    let per_row = g.nx.div_ceil(LANES);
    for blk in team.share(g.ny * per_row) {
        let (j, i0) = (blk / per_row, blk % per_row * LANES);
        let lines = Lines {
            base: g.index(i0, j, 0),
            stride: g.plane(),
            n: g.nz,
            lanes: LANES.min(g.nx - i0),
        };
        strided_block(forward, lines, src, dst, w);
    }
}

/// The 3-D transform of `x1` into `x2` (`fft`): forward x, y, z; inverse z, y, x. `x1` is
/// used as workspace (both may be the same array). Ends with a barrier.
fn fft(
    team: &Team,
    g: &Grid,
    forward: bool,
    x1: Shared<Complex>,
    x2: Shared<Complex>,
    w: &mut Work,
) {
    if forward {
        fft_xy(team, g, true, x1, x1, w);
        team.barrier();
        fft_z(team, g, true, x1, x2, w);
    } else {
        fft_z(team, g, false, x1, x1, w);
        team.barrier();
        fft_xy(team, g, false, x1, x2, w);
    }
    team.barrier();
}

/// The random initial field (`compute_initial_conditions`): point `(i, j, k)` takes
/// numbers `2m + 1` and `2m + 2` of the stream from [`SEED`], `m = i + nx (j + ny k)`,
/// as real and imaginary part. Each thread jumps to its first row. No barrier.
fn initial_conditions(team: &Team, g: &Grid, u: Shared<Complex>) {
    let rows = team.share(g.ny * g.nz);
    let mut x = random::skip(SEED, A, (2 * g.nx * rows.start) as u64);
    // SAFETY: these rows are this thread's alone until the next barrier.
    let out = unsafe { u.slice_mut(g.rows(rows.clone())) };
    for r in 0..rows.len() {
        for c in &mut out[r * g.row()..r * g.row() + g.nx] {
            let re = random::randlc(&mut x, A);
            let im = random::randlc(&mut x, A);
            *c = Complex::new(re, im);
        }
    }
}

/// The timed set-up: decay factors (`compute_indexmap`), initial conditions in `u`,
/// roots of unity (`fft_init`). Ends with a barrier.
fn setup(team: &Team, g: &Grid, u: Shared<Complex>, w: &mut Work) {
    decay_factors(w.tx);
    decay_factors(w.ty);
    decay_factors(w.tz);
    initial_conditions(team, g, u);
    fft_init(w.roots, g.max_dim());
    team.barrier();
}

/// One time step in Fourier space (`evolve`): `u0 *= decay`, `u1 = u0`, on this
/// thread's rows. No barrier.
fn evolve(team: &Team, g: &Grid, u0: Shared<Complex>, u1: Shared<Complex>, w: &Work) {
    let rows = team.share(g.ny * g.nz);
    let range = g.rows(rows.clone());
    // SAFETY: these rows of u0 and u1 (different arrays) are this thread's alone until
    // the next barrier.
    let (a, b) = unsafe { (u0.slice_mut(range.clone()), u1.slice_mut(range)) };
    for (p, r) in rows.enumerate() {
        let f = w.ty[r % g.ny] * w.tz[r / g.ny];
        let line = p * g.row()..p * g.row() + g.nx;
        for ((a, b), &t) in a[line.clone()].iter_mut().zip(&mut b[line]).zip(&*w.tx) {
            let t = t * f;
            a.re *= t;
            a.im *= t;
            *b = *a;
        }
    }
}

/// The checksum: `sum_{j=1..1024} u(j mod nx, 3j mod ny, 5j mod nz) / ntotal`, each
/// thread summing a share of `j`, combined in rank order. Contains barriers.
fn checksum(team: &Team, g: &Grid, u: Shared<Complex>, sums: &Reduction) -> Complex {
    let (mut re, mut im) = (0.0, 0.0);
    for j in team.share(CHECKSUM_POINTS) {
        let j = j + 1;
        // SAFETY: nobody writes u between the FFT's final barrier and the sum's.
        let c = unsafe { u.get(g.index(j % g.nx, 3 * j % g.ny, 5 * j % g.nz)) };
        re += c.re;
        im += c.im;
    }
    let (re, im) = sums.sum2(team, re, im);
    let n = g.total() as f64;
    Complex::new(re / n, im / n)
}

/// One thread's part of a team run, timed as the reference: after an untimed pass of
/// the set-up and forward FFT (which touches all the data), from the set-up through
/// every iteration's evolve, inverse FFT and checksum to the verification.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    let g = Grid::new(dims(class));
    let niter = iterations(class);
    assert!(niter <= MAX_ITERATIONS);
    let threads = team.size();
    let u0 = arena.alloc::<Complex>(g.len());
    let u1 = arena.alloc::<Complex>(g.len());
    let work = arena.alloc::<f64>(threads * g.work_len());
    let sums = Reduction::new(arena, threads);
    let mine = team.rank() * g.work_len()..(team.rank() + 1) * g.work_len();
    // SAFETY: each thread's work slot is its own for the whole run.
    let mut w = Work::carve(&g, unsafe { work.slice_mut(mine) });

    setup(team, &g, u1, &mut w);
    fft(team, &g, true, u1, u0, &mut w);

    let start = team.seconds();
    setup(team, &g, u1, &mut w);
    fft(team, &g, true, u1, u0, &mut w);
    let mut checks = [Complex::ZERO; MAX_ITERATIONS];
    for check in &mut checks[..niter] {
        evolve(team, &g, u0, u1, &w);
        team.barrier();
        fft(team, &g, false, u1, u1, &mut w);
        *check = checksum(team, &g, u1, &sums);
    }
    let verified = verify(class, &checks[..niter]);
    let seconds = team.seconds() - start;

    let values = checksum_values(class, &checks[..niter]);
    Outcome {
        seconds,
        mops: mops(class, seconds),
        verified,
        values,
    }
}

/// The values a run prints: the first six checksums (a result line holds few values)
/// and the worst relative error of all of them.
pub(crate) fn checksum_values(class: Class, checks: &[Complex]) -> Values {
    const RE: [&str; 6] = ["re1", "re2", "re3", "re4", "re5", "re6"];
    const IM: [&str; 6] = ["im1", "im2", "im3", "im4", "im5", "im6"];
    let mut values = Values::new();
    let mut worst = 0.0f64;
    for (it, check) in checks.iter().enumerate() {
        if let (Some(re), Some(im)) = (RE.get(it), IM.get(it)) {
            values.push(re, check.re);
            values.push(im, check.im);
        }
        let e = error(class, it, *check);
        worst = if e.is_nan() || worst.is_nan() {
            f64::NAN
        } else {
            worst.max(e)
        };
    }
    values.push("error", worst);
    values
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::testing::{noise, on_team};

    fn noise_complex(len: usize, seed: u64) -> Vec<Complex> {
        noise(2 * len, seed)
            .chunks_exact(2)
            .map(|c| Complex::new(c[0], c[1]))
            .collect()
    }

    /// `X[k] = sum_j x[j] exp(sign 2 pi i jk / n)`, term by term.
    fn naive_dft(x: &[Complex], sign: f64) -> Vec<Complex> {
        let n = x.len();
        (0..n)
            .map(|k| {
                let mut total = Complex::ZERO;
                for (j, v) in x.iter().enumerate() {
                    let angle = sign * 2.0 * PI * ((j * k) % n) as f64 / n as f64;
                    let (s, c) = angle.sin_cos();
                    total.re += v.re * c - v.im * s;
                    total.im += v.re * s + v.im * c;
                }
                total
            })
            .collect()
    }

    /// Naive 3-D DFT of an unpadded `nx * ny * nz` grid (x fastest), axis by axis.
    fn naive_dft_3d(x: &[Complex], [nx, ny, nz]: [usize; 3], sign: f64) -> Vec<Complex> {
        let mut a = x.to_vec();
        let at = |i: usize, j: usize, k: usize| i + nx * (j + ny * k);
        for (n, step, others) in [(nx, 1, ny * nz), (ny, nx, nx * nz), (nz, nx * ny, nx * ny)] {
            for o in 0..others {
                let first = match step {
                    1 => at(0, o % ny, o / ny),
                    s if s == nx => at(o % nx, 0, o / nx),
                    _ => at(o % nx, o / nx, 0),
                };
                let line: Vec<Complex> = (0..n).map(|p| a[first + p * step]).collect();
                for (p, v) in naive_dft(&line, sign).into_iter().enumerate() {
                    a[first + p * step] = v;
                }
            }
        }
        a
    }

    fn assert_close(got: &[Complex], want: &[Complex], scale: f64, what: &str) {
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            let err = (g.re - w.re).abs().max((g.im - w.im).abs());
            assert!(
                err <= 1e-13 * scale,
                "{what}: point {k}: got {g:?}, want {w:?}"
            );
        }
    }

    /// The roots table for `n` points, as a fresh vector.
    fn roots(n: usize) -> Vec<f64> {
        let mut r = vec![f64::NAN; 2 * n];
        fft_init(&mut r, n);
        r
    }

    #[test]
    fn roots_are_the_reference_table() {
        let r = roots(16);
        for ln in [1usize, 2, 4, 8] {
            for i in 0..ln {
                let angle = PI * i as f64 / ln as f64;
                assert!((r[2 * (ln + i)] - angle.cos()).abs() < 1e-16);
                assert!((r[2 * (ln + i) + 1] - angle.sin()).abs() < 1e-16);
            }
        }
    }

    #[test]
    fn cfftz_matches_a_naive_dft_on_every_lane() {
        for m in 0..=7u32 {
            let n = 1usize << m;
            let table = roots(n.max(2));
            let lines: Vec<Vec<Complex>> = (0..LANES)
                .map(|l| noise_complex(n, 100 + l as u64))
                .collect();
            for forward in [true, false] {
                let mut x = vec![0.0; n * POINT];
                let mut y = vec![f64::NAN; n * POINT];
                for (l, line) in lines.iter().enumerate() {
                    for (p, c) in line.iter().enumerate() {
                        x[p * POINT + l] = c.re;
                        x[p * POINT + LANES + l] = c.im;
                    }
                }
                let out = cfftz(forward, m, &table, &mut x, &mut y).to_vec();
                let sign = if forward { 1.0 } else { -1.0 };
                for (l, line) in lines.iter().enumerate() {
                    let got: Vec<Complex> = (0..n)
                        .map(|p| Complex::new(out[p * POINT + l], out[p * POINT + LANES + l]))
                        .collect();
                    assert_close(&got, &naive_dft(line, sign), n as f64, "cfftz");
                }
            }
        }
    }

    /// Copies an unpadded grid into a padded array (padding gets NaN: never read).
    fn pad(g: &Grid, x: &[Complex]) -> Vec<Complex> {
        let mut out = vec![Complex::new(f64::NAN, f64::NAN); g.len()];
        for k in 0..g.nz {
            for j in 0..g.ny {
                for i in 0..g.nx {
                    out[g.index(i, j, k)] = x[i + g.nx * (j + g.ny * k)];
                }
            }
        }
        out
    }

    fn unpad(g: &Grid, x: &[Complex]) -> Vec<Complex> {
        let mut out = Vec::with_capacity(g.total());
        for k in 0..g.nz {
            for j in 0..g.ny {
                out.extend_from_slice(&x[g.index(0, j, k)..g.index(g.nx, j, k)]);
            }
        }
        out
    }

    /// An array of the grid in the arena, filled by rank 0 (the caller's barrier
    /// publishes it).
    fn array(team: &Team, arena: &mut Arena, init: &[Complex]) -> Shared<Complex> {
        let a = arena.alloc::<Complex>(init.len());
        if team.is_master() {
            // SAFETY: only rank 0 touches the array before the caller's barrier.
            unsafe { a.all_mut() }.copy_from_slice(init);
        }
        a
    }

    /// Arena bytes for the passes' tests: two arrays and the team's work.
    fn test_bytes(g: &Grid, threads: usize) -> usize {
        2 * (16 * g.len() + 64) + 8 * threads * g.work_len() + 64 + Reduction::bytes(threads)
    }

    fn with_work<R>(
        team: &Team,
        arena: &mut Arena,
        g: &Grid,
        body: impl FnOnce(&mut Work) -> R,
    ) -> R {
        let all = arena.alloc::<f64>(team.size() * g.work_len());
        let mine = team.rank() * g.work_len()..(team.rank() + 1) * g.work_len();
        // SAFETY: each thread's slot is its own.
        let mut w = Work::carve(g, unsafe { all.slice_mut(mine) });
        fft_init(w.roots, g.max_dim());
        body(&mut w)
    }

    #[test]
    fn fft_3d_matches_a_naive_dft_on_any_team() {
        // Partial blocks (4 rows, 8 columns), full blocks, z longer than x, and rows
        // shorter than a transposition tile.
        for dims in [[8, 4, 2], [32, 16, 4], [16, 2, 32], [4, 32, 2]] {
            let g = Grid::new(dims);
            let x = noise_complex(g.total(), 7);
            let forward = naive_dft_3d(&x, dims, 1.0);
            let inverse = naive_dft_3d(&x, dims, -1.0);
            let scale = g.total() as f64;
            for threads in [1, 2, 3, 5] {
                let (f, i) = on_team(threads, test_bytes(&g, threads), |team, arena| {
                    let a = array(team, arena, &pad(&g, &x));
                    let b = array(team, arena, &pad(&g, &x));
                    with_work(team, arena, &g, |w| {
                        team.barrier();
                        fft(team, &g, true, a, a, w);
                        fft(team, &g, false, b, b, w);
                        // SAFETY: after fft's final barrier nobody writes.
                        unsafe { (unpad(&g, a.all()), unpad(&g, b.all())) }
                    })
                });
                assert_close(&f, &forward, scale, "forward");
                assert_close(&i, &inverse, scale, "inverse");
            }
        }
    }

    #[test]
    fn fft_to_another_array_leaves_the_result_there() {
        let g = Grid::new([16, 8, 4]);
        let x = noise_complex(g.total(), 8);
        let want = naive_dft_3d(&x, [16, 8, 4], 1.0);
        let back = naive_dft_3d(&x, [16, 8, 4], -1.0);
        let (f, i) = on_team(3, test_bytes(&g, 3) + 16 * g.len() + 64, |team, arena| {
            let a = array(team, arena, &pad(&g, &x));
            let b = array(team, arena, &pad(&g, &x));
            let out = array(team, arena, &vec![Complex::ZERO; g.len()]);
            with_work(team, arena, &g, |w| {
                team.barrier();
                fft(team, &g, true, a, out, w);
                // SAFETY: after fft's final barrier nobody writes `out`.
                let f = unpad(&g, unsafe { out.all() });
                team.barrier();
                fft(team, &g, false, b, out, w);
                // SAFETY: as above.
                (f, unpad(&g, unsafe { out.all() }))
            })
        });
        assert_close(&f, &want, g.total() as f64, "forward to u0");
        assert_close(&i, &back, g.total() as f64, "inverse to another array");
    }

    #[test]
    fn initial_conditions_follow_the_stream() {
        let g = Grid::new([8, 4, 2]);
        // The stream stepped one number at a time with u128 arithmetic.
        let mut x: u128 = SEED as u128;
        let mut next = || {
            x = x * 1_220_703_125 % (1u128 << 46);
            x as f64 / (1u64 << 46) as f64
        };
        let want: Vec<Complex> = (0..g.total())
            .map(|_| {
                let re = next();
                Complex::new(re, next())
            })
            .collect();
        for threads in [1, 2, 3, 5] {
            let got = on_team(threads, test_bytes(&g, threads), |team, arena| {
                let u = array(team, arena, &vec![Complex::ZERO; g.len()]);
                team.barrier();
                initial_conditions(team, &g, u);
                team.barrier();
                // SAFETY: after the barrier nobody writes.
                unpad(&g, unsafe { u.all() })
            });
            assert_eq!(got, want, "{threads} threads");
        }
    }

    #[test]
    fn evolve_applies_the_decay_factor_of_each_wave_number() {
        let dims = [8, 4, 2];
        let g = Grid::new(dims);
        let x = noise_complex(g.total(), 9);
        let ap = -4.0 * ALPHA * PI * PI;
        // Wave numbers 0 1 2 3 -4 -3 -2 -1 along x, 0 1 -2 -1 along y, 0 -1 along z.
        let wave = |i: usize, n: usize| -> i64 {
            if i < n / 2 {
                i as i64
            } else {
                i as i64 - n as i64
            }
        };
        let want: Vec<Complex> = x
            .iter()
            .enumerate()
            .map(|(p, c)| {
                let (i, j, k) = (p % 8, p / 8 % 4, p / 32);
                let (ii, jj, kk) = (wave(i, 8), wave(j, 4), wave(k, 2));
                let t = (ap * (ii * ii + jj * jj + kk * kk) as f64).exp();
                // Twice: evolve is cumulative.
                Complex::new(c.re * t * t, c.im * t * t)
            })
            .collect();
        for threads in [1, 3] {
            let (a, b) = on_team(threads, test_bytes(&g, threads), |team, arena| {
                let u0 = array(team, arena, &pad(&g, &x));
                let u1 = array(team, arena, &vec![Complex::ZERO; g.len()]);
                with_work(team, arena, &g, |w| {
                    decay_factors(w.tx);
                    decay_factors(w.ty);
                    decay_factors(w.tz);
                    team.barrier();
                    evolve(team, &g, u0, u1, w);
                    team.barrier();
                    evolve(team, &g, u0, u1, w);
                    team.barrier();
                    // SAFETY: after the barrier nobody writes.
                    unsafe { (unpad(&g, u0.all()), unpad(&g, u1.all())) }
                })
            });
            assert_close(&a, &want, 10.0, "u0");
            assert_eq!(a, b);
        }
    }

    #[test]
    fn checksum_sums_the_fixed_points() {
        let dims = [16, 8, 4];
        let g = Grid::new(dims);
        let x = noise_complex(g.total(), 10);
        let mut want = Complex::ZERO;
        for j in 1..=1024 {
            let c = x[j % 16 + 16 * (3 * j % 8 + 8 * (5 * j % 4))];
            want.re += c.re;
            want.im += c.im;
        }
        let want = Complex::new(want.re / 512.0, want.im / 512.0);
        for threads in [1, 2, 3] {
            let got = on_team(threads, test_bytes(&g, threads), |team, arena| {
                let u = array(team, arena, &pad(&g, &x));
                let sums = Reduction::new(arena, team.size());
                team.barrier();
                checksum(team, &g, u, &sums)
            });
            assert!((got.re - want.re).abs() < 1e-14 && (got.im - want.im).abs() < 1e-14);
        }
    }

    #[test]
    fn verify_rejects_wrong_checksums() {
        for &class in crate::Kernel::Ft.classes() {
            let good = reference_checksums(class);
            assert!(verify(class, good));
            assert!(!verify(class, &good[..5]), "an iteration missing");
            for it in 0..good.len() {
                for (dre, dim) in [(2e-12, 0.0), (0.0, 2e-12), (0.0, -2e-12)] {
                    let mut sums = good.to_vec();
                    let r = good[it].abs();
                    sums[it].re += dre * r;
                    sums[it].im += dim * r;
                    assert!(!verify(class, &sums), "{class:?} {it}");
                }
                let mut close = good.to_vec();
                close[it].im += 0.5e-12 * good[it].abs();
                assert!(verify(class, &close));
                let mut nan = good.to_vec();
                nan[it].re = f64::NAN;
                assert!(!verify(class, &nan));
            }
        }
        assert!(!verify(Class::W, reference_checksums(Class::S)));
    }

    #[test]
    fn heap_holds_two_padded_arrays_and_little_more() {
        // Two padded complex arrays and nothing else of that size.
        let a = 257 * 256 * 128 * 16;
        assert!(heap_bytes(Class::A, 2) >= 2 * a);
        assert!(heap_bytes(Class::A, 2) < 2 * a + (1 << 20));
    }

    #[test]
    fn mops_formula() {
        let n = 64.0f64 * 64.0 * 64.0;
        let ops = n * (14.8157 + 7.19641 * n.ln() + (5.23518 + 7.21113 * n.ln()) * 6.0);
        assert!((mops(Class::S, 2.0) - ops / 2e6).abs() < 1e-9);
    }
}
