//! CG on a 1-D row decomposition: rank `r` of `s` (a power of two, as `cg.f` asks)
//! owns the rows [`crate::team::block`]`(na, r, s)` of the matrix and the same block of
//! `x`, `z`, `r` and `q`, and keeps the whole of `p`. Each CG iteration: the product
//! `q = A p` on its rows, the dot products as local sums allreduced, the vector updates
//! on its block, and an allgather of `p` (alltoallv) before the next product; the
//! residual gathers `z` the same way.
//!
//! The same arithmetic as the reference (only the order of the dot products' additions
//! differs, within the verification tolerance), but not `cg.f`'s 2-D process grid
//! (`cg.f` splits rows and columns and reduces partial products across each process
//! row; this splits rows only and exchanges all of `p`). Every rank generates the
//! whole matrix with `makea` in the untimed set-up (as `cg.f`'s ranks each step the
//! whole random stream) and keeps it.

use core::ops::Range;

use super::{Comm, Error, MAX_RANKS, Op, bytes, bytes_mut, max_seconds, take};
use crate::cg::{self, CG_ITERATIONS, Csr, Generators, SEED};
use crate::random::{self, A};
use crate::team::{Arena, block};
use crate::{Class, Outcome, Values};

/// Arena bytes of one rank: the whole matrix (as the shared-memory CG), the generating
/// vectors, the full `p` and its block copy, four blocks, and alignment.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let p = cg::params(class);
    let (n, nz, naz) = (p.na, cg::max_nonzeros(&p), p.na * (p.nonzer + 1));
    let rows = n.div_ceil(ranks);
    let bytes = |count: usize, size: usize| count * size + 64;
    bytes(n + 1, 4)
        + bytes(nz, 4)
        + bytes(nz, 8)
        + bytes(n, 4)
        + bytes(naz, 4)
        + bytes(naz, 8)
        + bytes(n, 8)
        + 5 * bytes(rows, 8)
}

/// This rank's matrix and vectors.
struct Local<'a> {
    rowstr: &'a [u32],
    colidx: &'a [u32],
    a: &'a [f64],
    rows: Range<usize>,
    /// Whole vector (the product reads all of it).
    p: &'a mut [f64],
    /// This rank's block of `p`, to send.
    p_block: &'a mut [f64],
    x: &'a mut [f64],
    z: &'a mut [f64],
    q: &'a mut [f64],
    r: &'a mut [f64],
}

/// Byte counts and offsets of an allgather of the row blocks.
struct Gather {
    send_counts: [usize; MAX_RANKS],
    send_displs: [usize; MAX_RANKS],
    recv_counts: [usize; MAX_RANKS],
    recv_displs: [usize; MAX_RANKS],
    size: usize,
}

impl Gather {
    fn new(n: usize, me: usize, size: usize) -> Gather {
        let mut g = Gather {
            send_counts: [0; MAX_RANKS],
            send_displs: [0; MAX_RANKS],
            recv_counts: [0; MAX_RANKS],
            recv_displs: [0; MAX_RANKS],
            size,
        };
        let mine = block(n, me, size).len() * 8;
        for j in 0..size {
            let theirs = block(n, j, size);
            g.send_counts[j] = mine;
            g.recv_counts[j] = theirs.len() * 8;
            g.recv_displs[j] = theirs.start * 8;
        }
        g
    }

    /// Every rank's `block` into its place in `whole`.
    fn run<C: Comm + ?Sized>(
        &self,
        comm: &mut C,
        block: &[f64],
        whole: &mut [f64],
    ) -> Result<(), Error> {
        let s = self.size;
        comm.alltoallv(
            bytes(block),
            &self.send_counts[..s],
            &self.send_displs[..s],
            bytes_mut(whole),
            &self.recv_counts[..s],
            &self.recv_displs[..s],
        )
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

fn sum<C: Comm + ?Sized>(comm: &mut C, values: &mut [f64]) -> Result<(), Error> {
    comm.allreduce_f64(values, Op::Sum)
}

/// One solve of `A z = x` by [`CG_ITERATIONS`] iterations; returns `||x - A z||`.
fn conj_grad<C: Comm + ?Sized>(comm: &mut C, l: &mut Local, g: &Gather) -> Result<f64, Error> {
    l.q.fill(0.0);
    l.z.fill(0.0);
    l.r.copy_from_slice(l.x);
    l.p_block.copy_from_slice(l.x);
    let mut rho = [dot(l.r, l.r)];
    sum(comm, &mut rho)?;
    let mut rho = rho[0];
    g.run(comm, l.p_block, l.p)?;
    for _ in 0..CG_ITERATIONS {
        cg::spmv(l.rowstr, l.colidx, l.a, l.rows.clone(), l.p, l.q);
        let mut d = [dot(l.p_block, l.q)];
        sum(comm, &mut d)?;
        let alpha = rho / d[0];
        let rho0 = rho;
        let mut r2 = 0.0;
        for (((z, r), p), q) in
            l.z.iter_mut()
                .zip(l.r.iter_mut())
                .zip(l.p_block.iter())
                .zip(l.q.iter())
        {
            *z += alpha * p;
            *r -= alpha * q;
            r2 += *r * *r;
        }
        let mut r2 = [r2];
        sum(comm, &mut r2)?;
        rho = r2[0];
        let beta = rho / rho0;
        for (p, r) in l.p_block.iter_mut().zip(l.r.iter()) {
            *p = r + beta * *p;
        }
        g.run(comm, l.p_block, l.p)?;
    }
    // ||x - A z|| with the whole z (gathered into p, which is free now).
    g.run(comm, l.z, l.p)?;
    cg::spmv(l.rowstr, l.colidx, l.a, l.rows.clone(), l.p, l.r);
    let mut residual =
        [l.x.iter()
            .zip(l.r.iter())
            .map(|(x, r)| (x - r) * (x - r))
            .sum()];
    sum(comm, &mut residual)?;
    Ok(libm::sqrt(residual[0]))
}

/// `(x . z, 1 / ||z||)` over all ranks, and `x = z / ||z||` on this block.
fn normalise<C: Comm + ?Sized>(comm: &mut C, l: &mut Local) -> Result<f64, Error> {
    let mut norms = [dot(l.x, l.z), dot(l.z, l.z)];
    sum(comm, &mut norms)?;
    let scale = 1.0 / libm::sqrt(norms[1]);
    for (x, z) in l.x.iter_mut().zip(l.z.iter()) {
        *x = scale * z;
    }
    Ok(norms[0])
}

pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let params = cg::params(class);
    let (n, nonzer) = (params.na, params.nonzer);
    let (nz, naz) = (cg::max_nonzeros(&params), n * (nonzer + 1));
    let rows = block(n, comm.rank(), comm.size());
    let len = rows.len();
    // SAFETY: for each take: one thread per rank and arena; the arrays are
    // distinct and nothing else refers to them.
    let (rowstr, colidx, a, arow, acol, aelt) = unsafe {
        (
            take::<u32>(arena, n + 1),
            take::<u32>(arena, nz),
            take::<f64>(arena, nz),
            take::<u32>(arena, n),
            take::<u32>(arena, naz),
            take::<f64>(arena, naz),
        )
    };
    // The reference draws one number before makea.
    let mut seed = SEED;
    random::randlc(&mut seed, A);
    cg::makea(
        n,
        nonzer,
        params.shift,
        &mut seed,
        Generators { arow, acol, aelt },
        Csr {
            rowstr: &mut *rowstr,
            colidx: &mut *colidx,
            a: &mut *a,
        },
    );
    // SAFETY: as above.
    let mut l = unsafe {
        Local {
            rowstr,
            colidx,
            a,
            rows,
            p: take::<f64>(arena, n),
            p_block: take::<f64>(arena, len),
            x: take::<f64>(arena, len),
            z: take::<f64>(arena, len),
            q: take::<f64>(arena, len),
            r: take::<f64>(arena, len),
        }
    };
    let g = Gather::new(n, comm.rank(), comm.size());

    // One untimed step, then start again from x = 1.
    l.x.fill(1.0);
    conj_grad(comm, &mut l, &g)?;
    normalise(comm, &mut l)?;
    l.x.fill(1.0);
    comm.barrier()?;

    let start = comm.seconds();
    let mut zeta = 0.0;
    let mut rnorm = 0.0;
    for _ in 0..params.niter {
        rnorm = conj_grad(comm, &mut l, &g)?;
        let xz = normalise(comm, &mut l)?;
        zeta = params.shift + 1.0 / xz;
    }
    let seconds = max_seconds(comm, comm.seconds() - start)?;

    let mut values = Values::new();
    values.push("zeta", zeta);
    values.push("rnorm", rnorm);
    values.push("error", cg::error(class, zeta));
    Ok(Outcome {
        seconds,
        mops: cg::mops(class, seconds),
        verified: cg::verify(class, zeta),
        values,
    })
}
