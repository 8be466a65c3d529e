//! CG, the conjugate gradient kernel: the inverse power method estimates the smallest
//! eigenvalue of a random sparse symmetric matrix, each step solving `A z = x` with 25
//! unpreconditioned CG iterations.
//!
//! The matrix is generated exactly as the reference's `makea` does (the same random
//! stream, used in the same order, the same duplicate sums), serially by the master in
//! the untimed set-up, and stored in CSR form (`rowstr`, `colidx`, `a`) in the arena.
//!
//! Parallel split: each thread owns a contiguous block of rows ([`Team::share`]) and the
//! same block of every vector. A thread writes only its own block; the sparse
//! matrix-vector product reads the whole of `p` (or `z`), so every write to those is
//! followed by a barrier before the next product. Dot products are summed per thread
//! and then across threads in rank order ([`Sums`]), so a given thread count always
//! gives the same bits.

use core::ops::Range;

use crate::random::{self, A};
use crate::team::{Arena, Shared, Team};
use crate::{Class, Outcome, Values};

/// CG's seed for the matrix.
pub const SEED: u64 = 314_159_265;
/// Absolute error allowed on the final zeta.
pub const EPSILON: f64 = 1.0e-10;
/// The smallest eigenvalue of the generated matrix before the shift is bounded by this.
pub const RCOND: f64 = 0.1;
/// CG iterations per solve (`cgitmax` in the reference).
pub const CG_ITERATIONS: usize = 25;

/// A class's problem: order of the matrix, nonzeros per generating vector, inverse
/// power iterations, and the diagonal shift.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    /// Rows and columns (`na`).
    pub na: usize,
    /// Random nonzeros per generating vector (`nonzer`); `vecset` may add one.
    pub nonzer: usize,
    /// Timed inverse power iterations (`niter`).
    pub niter: usize,
    /// Subtracted from the diagonal (`shift`).
    pub shift: f64,
}

/// The class's sizes.
pub fn params(class: Class) -> Params {
    let (na, nonzer, niter, shift) = match class {
        Class::S => (1400, 7, 15, 10.0),
        Class::W => (7000, 8, 15, 12.0),
        Class::A => (14000, 11, 15, 20.0),
        Class::B => (75000, 13, 75, 60.0),
        Class::C => (150000, 15, 75, 110.0),
    };
    Params {
        na,
        nonzer,
        niter,
        shift,
    }
}

/// The official final zeta.
#[allow(clippy::excessive_precision)] // digits as published by NASA
pub fn reference_zeta(class: Class) -> f64 {
    match class {
        Class::S => 8.597_177_507_864_8,
        Class::W => 10.362_595_087_124,
        Class::A => 17.130_235_054_029,
        Class::B => 22.712_745_482_631,
        Class::C => 28.973_605_592_845,
    }
}

/// Absolute error of `zeta` against the official value.
pub fn error(class: Class, zeta: f64) -> f64 {
    libm::fabs(zeta - reference_zeta(class))
}

/// Whether `zeta` matches the official value within [`EPSILON`] (NaN fails).
pub fn verify(class: Class, zeta: f64) -> bool {
    error(class, zeta) <= EPSILON
}

/// Mop/s as the reference reports it:
/// `2*niter*na*(3 + nonzer*(nonzer+1) + 25*(5 + nonzer*(nonzer+1)) + 3) / t / 1e6`.
pub fn mops(class: Class, seconds: f64) -> f64 {
    let p = params(class);
    let nn = (p.nonzer * (p.nonzer + 1)) as f64;
    2.0 * (p.niter * p.na) as f64 * (3.0 + nn + 25.0 * (5.0 + nn) + 3.0) / seconds / 1.0e6
}

/// Matrix entries before duplicates are summed (`nz` in the reference): each of the
/// `na` generating vectors has at most `nonzer + 1` entries and contributes their
/// outer product.
pub fn max_nonzeros(p: &Params) -> usize {
    p.na * (p.nonzer + 1) * (p.nonzer + 1)
}

/// Arena slack per allocation for its 64-byte alignment.
const ALIGN_SLACK: usize = 64;
/// `f64`s between two threads' slots of a [`Sums`] site: one cache line.
const SLOT: usize = 8;
/// Reduction sites of [`Sums`].
const SITES: usize = 4;

/// Arena bytes [`run`] needs: the CSR matrix at its largest (before duplicates are
/// merged), the generating vectors, five vectors and the reduction slots.
pub fn heap_bytes(class: Class, threads: usize) -> usize {
    let p = params(class);
    let (n, nz, naz) = (p.na, max_nonzeros(&p), p.na * (p.nonzer + 1));
    let bytes = |count: usize, size: usize| count * size + ALIGN_SLACK;
    bytes(n + 1, 4) // rowstr
        + bytes(nz, 4) // colidx
        + bytes(nz, 8) // a
        + bytes(n, 4) // arow
        + bytes(naz, 4) // acol
        + bytes(naz, 8) // aelt
        + 5 * bytes(n, 8) // x, z, p, q, r
        + bytes(SITES * threads * SLOT, 8)
}

/// The smallest power of two not below `n` (and at least 2): `nn1` in the reference.
fn power_of_two_above(n: usize) -> usize {
    let mut nn1 = 1;
    loop {
        nn1 *= 2;
        if nn1 >= n {
            return nn1;
        }
    }
}

/// The reference's `sprnvc`: `nz` distinct random positions in `0..n` with random
/// values, drawn as (value, position) pairs from the stream; positions are drawn in
/// `0..nn1` and those out of range or already taken are skipped (their numbers are
/// still consumed). Returns the count, `nz`.
fn sprnvc(n: usize, nz: usize, nn1: usize, v: &mut [f64], iv: &mut [u32], x: &mut u64) -> usize {
    let mut nzv = 0;
    while nzv < nz {
        let value = random::randlc(x, A);
        let location = random::randlc(x, A);
        // int(nn1 * x): nn1 is a power of two, so the product is exact.
        let i = (nn1 as f64 * location) as usize;
        if i >= n || iv[..nzv].contains(&(i as u32)) {
            continue;
        }
        v[nzv] = value;
        iv[nzv] = i as u32;
        nzv += 1;
    }
    nzv
}

/// The reference's `vecset`: element `i` of the sparse vector becomes `value`,
/// appended if absent. Returns the new count.
fn vecset(v: &mut [f64], iv: &mut [u32], nzv: usize, i: usize, value: f64) -> usize {
    let mut set = false;
    for (v, &at) in v[..nzv].iter_mut().zip(&iv[..nzv]) {
        if at as usize == i {
            *v = value;
            set = true;
        }
    }
    if set {
        nzv
    } else {
        v[nzv] = value;
        iv[nzv] = i as u32;
        nzv + 1
    }
}

/// Scratch of [`makea`]: the generating vectors, `nonzer + 1` slots each.
pub(crate) struct Generators<'a> {
    /// Entries of vector `i`.
    pub(crate) arow: &'a mut [u32],
    /// Positions, vector `i` at `i * (nonzer + 1)..`.
    pub(crate) acol: &'a mut [u32],
    /// Values, laid out as `acol`.
    pub(crate) aelt: &'a mut [f64],
}

/// The CSR matrix being built: `rowstr` has `n + 1` entries, `colidx` and `a` room for
/// [`max_nonzeros`].
pub(crate) struct Csr<'a> {
    pub(crate) rowstr: &'a mut [u32],
    pub(crate) colidx: &'a mut [u32],
    pub(crate) a: &'a mut [f64],
}

/// The reference's `makea`: `A = sum_i size_i v_i v_i^T + (rcond - shift) I`, where
/// `v_i` is a random sparse vector with element `i` set to 0.5 and `size_i = rcond^(i/n)`.
/// `x` is the stream's state (advanced past the numbers used). Returns the nonzeros.
pub(crate) fn makea(
    n: usize,
    nonzer: usize,
    shift: f64,
    x: &mut u64,
    g: Generators,
    m: Csr,
) -> usize {
    let stride = nonzer + 1;
    let nn1 = power_of_two_above(n);
    for i in 0..n {
        let v = &mut g.aelt[i * stride..(i + 1) * stride];
        let iv = &mut g.acol[i * stride..(i + 1) * stride];
        let nzv = sprnvc(n, nonzer, nn1, v, iv, x);
        g.arow[i] = vecset(v, iv, nzv, i, 0.5) as u32;
    }
    sparse(n, shift, &g, m)
}

/// The reference's `sparse`: the outer products as CSR, rows sorted by column,
/// duplicates summed in generation order (so the same bits as the reference's
/// insertion), `rcond - shift` added to each diagonal term of its own vector.
fn sparse(n: usize, shift: f64, g: &Generators, m: Csr) -> usize {
    let stride = g.acol.len() / n;
    let vector = |i: usize| {
        let len = g.arow[i] as usize;
        let at = i * stride;
        (&g.acol[at..at + len], &g.aelt[at..at + len])
    };
    let rowstr = &mut m.rowstr[..n + 1];
    // Row j receives one entry per element of every vector that holds j.
    rowstr.fill(0);
    for i in 0..n {
        let (cols, _) = vector(i);
        for &j in cols {
            rowstr[j as usize + 1] += cols.len() as u32;
        }
    }
    for j in 0..n {
        rowstr[j + 1] += rowstr[j];
    }
    let total = rowstr[n] as usize;
    assert!(
        total <= m.colidx.len() && total <= m.a.len(),
        "CG: {total} matrix entries exceed the space reserved"
    );

    // Entries in generation order; rowstr[j] serves as row j's cursor and ends up at
    // the start of row j + 1.
    let ratio = libm::pow(RCOND, 1.0 / n as f64);
    let mut size = 1.0;
    for i in 0..n {
        let (cols, vals) = vector(i);
        for (&j, &vj) in cols.iter().zip(vals) {
            let j = j as usize;
            let scale = size * vj;
            for (&jcol, &vc) in cols.iter().zip(vals) {
                let mut va = vc * scale;
                if jcol as usize == j && j == i {
                    va = va + RCOND - shift;
                }
                let at = rowstr[j] as usize;
                m.colidx[at] = jcol;
                m.a[at] = va;
                rowstr[j] += 1;
            }
        }
        size *= ratio;
    }
    for j in (0..n).rev() {
        rowstr[j + 1] = rowstr[j];
    }
    rowstr[0] = 0;

    // Sort each row by column (stable: equal columns stay in generation order), sum
    // duplicates, and close the gaps left by earlier rows' duplicates.
    let mut out = 0;
    let mut lo = 0;
    for j in 0..n {
        let hi = rowstr[j + 1] as usize;
        sort_row(&mut m.colidx[lo..hi], &mut m.a[lo..hi]);
        let start = out;
        for k in lo..hi {
            let (c, v) = (m.colidx[k], m.a[k]);
            if out > start && m.colidx[out - 1] == c {
                m.a[out - 1] += v;
            } else {
                m.colidx[out] = c;
                m.a[out] = v;
                out += 1;
            }
        }
        rowstr[j] = start as u32;
        lo = hi;
    }
    rowstr[n] = out as u32;
    out
}

/// Stable insertion sort of a row's entries by column (rows are short).
fn sort_row(cols: &mut [u32], vals: &mut [f64]) {
    for k in 1..cols.len() {
        let (c, v) = (cols[k], vals[k]);
        let mut at = k;
        while at > 0 && cols[at - 1] > c {
            cols[at] = cols[at - 1];
            vals[at] = vals[at - 1];
            at -= 1;
        }
        cols[at] = c;
        vals[at] = v;
    }
}

/// Independent partial sums per row in [`spmv`]: they hide the latency of the adds
/// (the reference's single running sum makes the product latency-bound when the
/// matrix is in cache).
const LANES: usize = 4;

/// `out[j - rows.start] = (row j of A) . v` for `j` in `rows`: the hot loop, one
/// gather per nonzero.
#[inline(always)]
pub(crate) fn spmv(
    rowstr: &[u32],
    colidx: &[u32],
    a: &[f64],
    rows: Range<usize>,
    v: &[f64],
    out: &mut [f64],
) {
    let starts = &rowstr[rows.start..rows.end + 1];
    for (o, bounds) in out.iter_mut().zip(starts.windows(2)) {
        let (lo, hi) = (bounds[0] as usize, bounds[1] as usize);
        let (a, cols) = (&a[lo..hi], &colidx[lo..hi]);
        let (a_lanes, col_lanes) = (a.chunks_exact(LANES), cols.chunks_exact(LANES));
        let (a_rest, col_rest) = (a_lanes.remainder(), col_lanes.remainder());
        let mut sums = [0.0; LANES];
        for (a, cols) in a_lanes.zip(col_lanes) {
            for lane in 0..LANES {
                sums[lane] += a[lane] * v[cols[lane] as usize];
            }
        }
        let mut sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
        for (&a, &col) in a_rest.iter().zip(col_rest) {
            sum += a * v[col as usize];
        }
        *o = sum;
    }
}

/// Rank-ordered sums across the team with one barrier each: every thread writes its
/// pair to its slot of a site, waits, and adds all slots of the site in rank order.
///
/// A site's slots are rewritten only at its next use. Each site is used at most once
/// between two other barriers (the sites alternate in [`conj_grad`] and [`run`]), and a
/// thread reads a site's slots before it reaches the next barrier; so nobody rewrites a
/// slot that another thread has yet to read, without the second barrier of
/// [`crate::team::Reduction`].
#[derive(Clone, Copy)]
struct Sums {
    slots: Shared<f64>,
}

/// The reduction sites of [`Sums`].
#[derive(Clone, Copy)]
enum Site {
    /// `p . q` in a CG iteration.
    Pq = 0,
    /// `r . r` (start of a solve and each CG iteration).
    Rho = 1,
    /// `||x - A z||^2` at the end of a solve.
    Residual = 2,
    /// `x . z` and `z . z` after a solve.
    Norms = 3,
}

impl Sums {
    fn new(arena: &mut Arena, threads: usize) -> Sums {
        Sums {
            slots: arena.alloc(SITES * threads * SLOT),
        }
    }

    fn sum2(&self, team: &Team, site: Site, a: f64, b: f64) -> (f64, f64) {
        let base = site as usize * team.size() * SLOT;
        let mine = base + team.rank() * SLOT;
        // SAFETY: this thread's slot of the site; others read it only after the
        // barrier, and (type docs) all have read its previous value already.
        unsafe { self.slots.slice_mut(mine..mine + 2) }.copy_from_slice(&[a, b]);
        team.barrier();
        // SAFETY: nobody writes this site's slots until every thread has passed
        // another barrier, which this thread reaches only after reading.
        let all = unsafe { self.slots.slice(base..base + team.size() * SLOT) };
        let mut total = (0.0, 0.0);
        for slot in all.chunks_exact(SLOT) {
            total.0 += slot[0];
            total.1 += slot[1];
        }
        total
    }

    fn sum(&self, team: &Team, site: Site, a: f64) -> f64 {
        self.sum2(team, site, a, 0.0).0
    }
}

/// The CSR matrix in the arena, read-only once built.
#[derive(Clone, Copy)]
struct Matrix {
    rowstr: Shared<u32>,
    colidx: Shared<u32>,
    a: Shared<f64>,
}

/// The solver's vectors in the arena (`n` values each).
#[derive(Clone, Copy)]
struct Vectors {
    x: Shared<f64>,
    z: Shared<f64>,
    p: Shared<f64>,
    q: Shared<f64>,
    r: Shared<f64>,
}

impl Vectors {
    /// Carves the five `n`-element vectors (the same on every thread).
    fn alloc(arena: &mut Arena, n: usize) -> Vectors {
        Vectors {
            x: arena.alloc(n),
            z: arena.alloc(n),
            p: arena.alloc(n),
            q: arena.alloc(n),
            r: arena.alloc(n),
        }
    }
}

/// One solve of `A z = x` by [`CG_ITERATIONS`] CG iterations on this thread's rows;
/// returns `||x - A z||`. All threads call it together; `z` is complete (and the
/// matrix and `x` untouched) on return.
fn conj_grad(team: &Team, m: &Matrix, v: &Vectors, sums: &Sums) -> f64 {
    let n = v.x.len();
    let rows = team.share(n);
    // SAFETY: the matrix is only read after the set-up's barrier.
    let (rowstr, colidx, a) = unsafe { (m.rowstr.all(), m.colidx.all(), m.a.all()) };

    let mut rho = {
        // SAFETY: this thread's rows of every vector are its own in this phase; the
        // others' rows are not touched.
        let (x, z, p, q, r) = unsafe {
            (
                v.x.slice(rows.clone()),
                v.z.slice_mut(rows.clone()),
                v.p.slice_mut(rows.clone()),
                v.q.slice_mut(rows.clone()),
                v.r.slice_mut(rows.clone()),
            )
        };
        q.fill(0.0);
        z.fill(0.0);
        r.copy_from_slice(x);
        p.copy_from_slice(x);
        let rho: f64 = r.iter().map(|r| r * r).sum();
        // The barrier inside also publishes p for the first product.
        sums.sum(team, Site::Rho, rho)
    };

    for _ in 0..CG_ITERATIONS {
        let d = {
            // SAFETY: p is read by everyone and written by nobody in this phase;
            // q's rows are this thread's.
            let (p, q) = unsafe { (v.p.all(), v.q.slice_mut(rows.clone())) };
            spmv(rowstr, colidx, a, rows.clone(), p, q);
            let d: f64 = p[rows.clone()]
                .iter()
                .zip(q.iter())
                .map(|(p, q)| p * q)
                .sum();
            sums.sum(team, Site::Pq, d)
        };
        let alpha = rho / d;
        let rho0 = rho;
        rho = {
            // SAFETY: own rows only; the product that read all of p has ended for
            // every thread (barrier in the sum above).
            let (z, r, p, q) = unsafe {
                (
                    v.z.slice_mut(rows.clone()),
                    v.r.slice_mut(rows.clone()),
                    v.p.slice(rows.clone()),
                    v.q.slice(rows.clone()),
                )
            };
            let mut rho = 0.0;
            for (((z, r), p), q) in z.iter_mut().zip(r.iter_mut()).zip(p).zip(q) {
                *z += alpha * p;
                *r -= alpha * q;
                rho += *r * *r;
            }
            sums.sum(team, Site::Rho, rho)
        };
        let beta = rho / rho0;
        {
            // SAFETY: own rows only.
            let (p, r) = unsafe { (v.p.slice_mut(rows.clone()), v.r.slice(rows.clone())) };
            for (p, r) in p.iter_mut().zip(r) {
                *p = r + beta * *p;
            }
        }
        // Everyone's p before the next product.
        team.barrier();
    }

    // ||x - A z||: z is complete (its last update preceded the last barrier).
    // SAFETY: z is only read in this phase; r and x rows are this thread's.
    let (z, r, x) = unsafe {
        (
            v.z.all(),
            v.r.slice_mut(rows.clone()),
            v.x.slice(rows.clone()),
        )
    };
    spmv(rowstr, colidx, a, rows.clone(), z, r);
    let residual: f64 = x.iter().zip(r.iter()).map(|(x, r)| (x - r) * (x - r)).sum();
    libm::sqrt(sums.sum(team, Site::Residual, residual))
}

/// One inverse power step after a solve: `(x . z, 1 / ||z||)`, and `x = z / ||z||` on
/// this thread's rows.
fn normalise(team: &Team, v: &Vectors, sums: &Sums) -> (f64, f64) {
    let rows = team.share(v.x.len());
    let (xz, zz) = {
        // SAFETY: own rows, only read here.
        let (x, z) = unsafe { (v.x.slice(rows.clone()), v.z.slice(rows.clone())) };
        let mut xz = 0.0;
        let mut zz = 0.0;
        for (x, z) in x.iter().zip(z) {
            xz += x * z;
            zz += z * z;
        }
        sums.sum2(team, Site::Norms, xz, zz)
    };
    let scale = 1.0 / libm::sqrt(zz);
    // SAFETY: own rows: x written, z read.
    let (x, z) = unsafe { (v.x.slice_mut(rows.clone()), v.z.slice(rows.clone())) };
    for (x, z) in x.iter_mut().zip(z) {
        *x = scale * z;
    }
    (xz, scale)
}

/// Sets this thread's rows of `x` to 1.
fn ones(team: &Team, x: Shared<f64>) {
    // SAFETY: own rows only.
    unsafe { x.slice_mut(team.share(x.len())) }.fill(1.0);
}

/// One thread's part of a team run, timed as the reference: after the untimed set-up
/// (matrix, one solve, `x` reset to ones), the `niter` inverse power steps.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    let params = params(class);
    let (n, nonzer) = (params.na, params.nonzer);
    let nz = max_nonzeros(&params);
    let naz = n * (nonzer + 1);
    let m = Matrix {
        rowstr: arena.alloc(n + 1),
        colidx: arena.alloc(nz),
        a: arena.alloc(nz),
    };
    let arow = arena.alloc::<u32>(n);
    let acol = arena.alloc::<u32>(naz);
    let aelt = arena.alloc::<f64>(naz);
    let v = Vectors::alloc(arena, n);
    let sums = Sums::new(arena, team.size());

    if team.is_master() {
        // The reference draws one number before makea.
        let mut x = SEED;
        random::randlc(&mut x, A);
        // SAFETY: only the master touches these before the barrier below.
        let (g, csr) = unsafe {
            (
                Generators {
                    arow: arow.all_mut(),
                    acol: acol.all_mut(),
                    aelt: aelt.all_mut(),
                },
                Csr {
                    rowstr: m.rowstr.all_mut(),
                    colidx: m.colidx.all_mut(),
                    a: m.a.all_mut(),
                },
            )
        };
        makea(n, nonzer, params.shift, &mut x, g, csr);
    }
    team.barrier();

    // One untimed step, then start again from x = 1.
    ones(team, v.x);
    conj_grad(team, &m, &v, &sums);
    normalise(team, &v, &sums);
    ones(team, v.x);
    team.barrier();

    let start = team.seconds();
    let mut zeta = 0.0;
    let mut rnorm = 0.0;
    for _ in 0..params.niter {
        rnorm = conj_grad(team, &m, &v, &sums);
        let (xz, _) = normalise(team, &v, &sums);
        zeta = params.shift + 1.0 / xz;
    }
    team.barrier();
    let seconds = team.seconds() - start;

    let mut values = Values::new();
    values.push("zeta", zeta);
    values.push("rnorm", rnorm);
    values.push("error", error(class, zeta));
    Outcome {
        seconds,
        mops: mops(class, seconds),
        verified: verify(class, zeta),
        values,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec;
    use std::vec::Vec;

    use super::*;
    use crate::testing::on_team;

    /// The CG stream stepped one number at a time with u128 arithmetic.
    struct Stream(u128);

    impl Stream {
        fn next(&mut self) -> f64 {
            self.0 = self.0 * 1_220_703_125 % (1u128 << 46);
            self.0 as f64 / (1u64 << 46) as f64
        }
    }

    /// A dense matrix written straight from the reference's description of `makea`
    /// (Vec-based, no CSR): row-major `n * n` values and which entries were generated.
    fn dense_makea(n: usize, nonzer: usize, shift: f64, seed: u64) -> (Vec<f64>, Vec<bool>) {
        let mut stream = Stream(seed as u128);
        let nn1 = n.next_power_of_two().max(2);
        let vectors: Vec<Vec<(usize, f64)>> = (0..n)
            .map(|i| {
                let mut vector: Vec<(usize, f64)> = Vec::new();
                while vector.len() < nonzer {
                    let value = stream.next();
                    let at = (stream.next() * nn1 as f64).floor() as usize;
                    if at < n && vector.iter().all(|&(k, _)| k != at) {
                        vector.push((at, value));
                    }
                }
                match vector.iter_mut().find(|(k, _)| *k == i) {
                    Some(entry) => entry.1 = 0.5,
                    None => vector.push((i, 0.5)),
                }
                vector
            })
            .collect();
        let mut values = vec![0.0; n * n];
        let mut generated = vec![false; n * n];
        let ratio = libm::pow(RCOND, 1.0 / n as f64);
        let mut size = 1.0;
        for (i, vector) in vectors.iter().enumerate() {
            for &(j, vj) in vector {
                for &(col, vc) in vector {
                    let mut va = vc * (size * vj);
                    if col == j && j == i {
                        va = va + RCOND - shift;
                    }
                    values[j * n + col] += va;
                    generated[j * n + col] = true;
                }
            }
            size *= ratio;
        }
        (values, generated)
    }

    /// `makea` on host vectors: `(rowstr, colidx, a)` trimmed to the nonzeros.
    fn host_makea(
        n: usize,
        nonzer: usize,
        shift: f64,
        seed: u64,
    ) -> (Vec<u32>, Vec<u32>, Vec<f64>) {
        let p = Params {
            na: n,
            nonzer,
            niter: 1,
            shift,
        };
        let (nz, naz) = (max_nonzeros(&p), n * (nonzer + 1));
        let (mut rowstr, mut colidx, mut a) = (vec![7u32; n + 1], vec![9u32; nz], vec![3.0; nz]);
        let (mut arow, mut acol, mut aelt) = (vec![0u32; n], vec![0u32; naz], vec![0.0; naz]);
        let mut x = seed;
        let nnz = makea(
            n,
            nonzer,
            shift,
            &mut x,
            Generators {
                arow: &mut arow,
                acol: &mut acol,
                aelt: &mut aelt,
            },
            Csr {
                rowstr: &mut rowstr,
                colidx: &mut colidx,
                a: &mut a,
            },
        );
        assert_eq!(rowstr[n] as usize, nnz);
        colidx.truncate(nnz);
        a.truncate(nnz);
        (rowstr, colidx, a)
    }

    #[test]
    fn makea_equals_dense_accumulation_bit_for_bit() {
        for (n, nonzer, shift) in [(60, 4, 3.0), (100, 7, 10.0), (33, 2, 0.0)] {
            let (values, generated) = dense_makea(n, nonzer, shift, 12_345);
            let (rowstr, colidx, a) = host_makea(n, nonzer, shift, 12_345);
            let mut count = 0;
            for j in 0..n {
                let row = rowstr[j] as usize..rowstr[j + 1] as usize;
                let want: Vec<u32> = (0..n as u32)
                    .filter(|&c| generated[j * n + c as usize])
                    .collect();
                assert_eq!(colidx[row.clone()], want[..], "row {j} columns");
                for k in row {
                    let c = colidx[k] as usize;
                    assert_eq!(a[k].to_bits(), values[j * n + c].to_bits(), "({j}, {c})");
                }
                count += want.len();
            }
            assert_eq!(count, a.len());
            // Every vector holds its own index, so every diagonal entry exists.
            assert!((0..n).all(|j| generated[j * n + j]));
        }
    }

    #[test]
    fn class_s_matrix_fits_and_has_the_expected_shape() {
        let p = params(Class::S);
        let mut x = SEED;
        random::randlc(&mut x, A);
        let (rowstr, colidx, _) = host_makea(p.na, p.nonzer, p.shift, x);
        assert!(colidx.len() <= max_nonzeros(&p));
        assert!(colidx.len() > p.na * (p.nonzer + 1));
        for j in 0..p.na {
            let row = &colidx[rowstr[j] as usize..rowstr[j + 1] as usize];
            assert!(
                row.windows(2).all(|w| w[0] < w[1]),
                "row {j} sorted, no duplicates"
            );
            assert!(row.contains(&(j as u32)));
        }
    }

    /// The solver written plainly on host vectors: serial, dense loops over the CSR.
    fn naive_conj_grad(rowstr: &[u32], colidx: &[u32], a: &[f64], x: &[f64]) -> (Vec<f64>, f64) {
        let n = x.len();
        let times = |v: &[f64]| -> Vec<f64> {
            (0..n)
                .map(|j| {
                    (rowstr[j] as usize..rowstr[j + 1] as usize)
                        .map(|k| a[k] * v[colidx[k] as usize])
                        .sum()
                })
                .collect()
        };
        let dot = |u: &[f64], v: &[f64]| -> f64 { u.iter().zip(v).map(|(a, b)| a * b).sum() };
        let mut z = vec![0.0; n];
        let mut r = x.to_vec();
        let mut p = r.clone();
        let mut rho = dot(&r, &r);
        for _ in 0..CG_ITERATIONS {
            let q = times(&p);
            let alpha = rho / dot(&p, &q);
            for j in 0..n {
                z[j] += alpha * p[j];
                r[j] -= alpha * q[j];
            }
            let rho0 = rho;
            rho = dot(&r, &r);
            for j in 0..n {
                p[j] = r[j] + rho / rho0 * p[j];
            }
        }
        let az = times(&z);
        let residual: Vec<f64> = x.iter().zip(&az).map(|(x, y)| x - y).collect();
        (z, dot(&residual, &residual).sqrt())
    }

    /// Runs one `conj_grad` (and `normalise`) of the team over a host-built matrix;
    /// returns z (before normalising), rnorm, x . z and the normalised x.
    fn team_conj_grad(
        threads: usize,
        (rowstr, colidx, a): &(Vec<u32>, Vec<u32>, Vec<f64>),
        x0: &[f64],
    ) -> (Vec<f64>, f64, f64, Vec<f64>) {
        let n = x0.len();
        let bytes =
            8 * (rowstr.len() + colidx.len() + a.len() + 5 * n + SITES * threads * SLOT) + 4096;
        on_team(threads, bytes, |team, arena| {
            let m = Matrix {
                rowstr: arena.alloc(rowstr.len()),
                colidx: arena.alloc(colidx.len()),
                a: arena.alloc(a.len()),
            };
            let v = Vectors::alloc(arena, n);
            let sums = Sums::new(arena, team.size());
            if team.is_master() {
                // SAFETY: only rank 0 touches the arena before the barrier.
                unsafe {
                    m.rowstr.all_mut().copy_from_slice(rowstr);
                    m.colidx.all_mut().copy_from_slice(colidx);
                    m.a.all_mut().copy_from_slice(a);
                    v.x.all_mut().copy_from_slice(x0);
                    // Garbage, which conj_grad must not read.
                    for w in [v.z, v.p, v.q, v.r] {
                        w.all_mut().fill(f64::NAN);
                    }
                }
            }
            team.barrier();
            let rnorm = conj_grad(team, &m, &v, &sums);
            team.barrier();
            // SAFETY: read after the barrier, before anybody writes again.
            let z = unsafe { v.z.all() }.to_vec();
            team.barrier();
            let (xz, _) = normalise(team, &v, &sums);
            team.barrier();
            // SAFETY: as above.
            let x = unsafe { v.x.all() }.to_vec();
            (z, rnorm, xz, x)
        })
    }

    fn assert_close(got: &[f64], want: &[f64], tolerance: f64, what: &str) {
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tolerance * (1.0 + w.abs()),
                "{what}: element {k}: got {g}, want {w}"
            );
        }
    }

    #[test]
    fn conj_grad_matches_a_naive_solver_on_any_team() {
        // A negative shift makes it well-conditioned positive definite, so 25
        // iterations solve it.
        let matrix = host_makea(80, 5, -5.0, 4_242);
        let x0: Vec<f64> = (0..80).map(|i| 1.0 + (i % 7) as f64 / 10.0).collect();
        let (want_z, want_rnorm) = naive_conj_grad(&matrix.0, &matrix.1, &matrix.2, &x0);
        // CG has really solved the system.
        assert!(want_rnorm < 1e-8, "{want_rnorm}");
        let want_xz: f64 = x0.iter().zip(&want_z).map(|(x, z)| x * z).sum();
        let norm = want_z.iter().map(|z| z * z).sum::<f64>().sqrt();
        let want_x: Vec<f64> = want_z.iter().map(|z| z / norm).collect();
        for threads in [1, 2, 3, 7] {
            let (z, rnorm, xz, x) = team_conj_grad(threads, &matrix, &x0);
            assert_close(&z, &want_z, 1e-12, "z");
            assert!(
                (rnorm - want_rnorm).abs() < 1e-10,
                "{rnorm} vs {want_rnorm}"
            );
            assert!(
                (xz - want_xz).abs() <= 1e-12 * want_xz.abs(),
                "{xz} vs {want_xz}"
            );
            assert_close(&x, &want_x, 1e-12, "x");
        }
    }

    #[test]
    fn verify_rejects_wrong_zetas() {
        for &class in crate::Kernel::Cg.classes() {
            let good = reference_zeta(class);
            assert!(verify(class, good));
            assert!(verify(class, good + 0.9e-10));
            assert!(verify(class, good - 0.9e-10));
            assert!(!verify(class, good + 1.1e-10));
            assert!(!verify(class, good - 1.1e-10));
            assert!(!verify(class, f64::NAN));
        }
        assert!(!verify(Class::W, reference_zeta(Class::S)));
    }

    #[test]
    fn mops_formula() {
        // Class S: 2*15*1400 * (3 + 56 + 25*61 + 3) = 66_654_000 operations.
        assert!((mops(Class::S, 1.0) - 66.654).abs() < 1e-9);
        let a = 2.0 * 15.0 * 14_000.0 * (3.0 + 132.0 + 25.0 * 137.0 + 3.0);
        assert!((mops(Class::A, 2.0) - a / 2e6).abs() < 1e-6);
    }

    #[test]
    fn heap_holds_the_reference_arrays() {
        // At least the reference's nz entries of a and colidx.
        assert!(heap_bytes(Class::A, 1) >= 14_000 * 144 * 12);
    }
}
