//! CG on `cg.f`'s 2-D process grid. The `s` ranks (a power of two) form `nprows` x
//! `npcols` (square, or `npcols = 2 nprows`); rank `me` is at row `me / npcols`, column
//! `me % npcols`, and owns the submatrix of its row block of rows (`na / nprows`) and
//! its column block of columns (`na / npcols`). Vectors live in column blocks, so each
//! process row holds a whole copy, spread over its ranks.
//!
//! Each product `q = A p`: the local submatrix times the local `p`, then the partial
//! sums are added across the process row (log2 `npcols` pairwise exchanges, of the
//! whole row block on a square grid, of halves otherwise), then each rank trades its
//! summed piece with its transpose partner, which owns those rows as columns. Dot
//! products: local sums added across the process row the same pairwise way. These
//! are `cg.f`'s messages, partners and sizes (every class's `na` divides by `npcols`
//! up to 64 ranks, so blocks are even). The arithmetic is the reference's, except the
//! product's own summation order (as the shared-memory CG's).
//!
//! Every rank generates the whole matrix with `makea` in the untimed set-up (as
//! `cg.f`'s ranks each step the whole random stream), then keeps its submatrix.

use core::ops::Range;

use super::{Comm, Error, bytes, bytes_mut, max_seconds, take};
use crate::cg::{self, CG_ITERATIONS, Csr, Generators, SEED};
use crate::random::{self, A};
use crate::team::Arena;
use crate::{Class, Outcome, Values};

/// Tags: the product's row sums (plus the step), the transpose, the dot products' sums.
const TAG_ROW_SUM: u32 = 10;
const TAG_TRANSPOSE: u32 = 20;
const TAG_DOT: u32 = 30;
/// Most reduction steps: log2 of the most process columns (8 columns at 64 ranks).
const MAX_STEPS: usize = 6;

/// Arena bytes of one rank: the whole matrix while it is generated (the submatrix is
/// kept in its place), the generating vectors, five vectors of a column block and two
/// of a row block.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let p = cg::params(class);
    let (n, nz, naz) = (p.na, cg::max_nonzeros(&p), p.na * (p.nonzer + 1));
    let grid = Grid::new(n, 0, ranks.max(1));
    let (rows, cols) = (grid.rows.len(), grid.cols.len());
    let bytes = |count: usize, size: usize| count * size + 64;
    bytes(n + 1, 4)
        + bytes(nz, 4)
        + bytes(nz, 8)
        + bytes(n, 4)
        + bytes(naz, 4)
        + bytes(naz, 8)
        + 5 * bytes(cols, 8)
        + 2 * bytes(rows, 8)
}

/// This rank's place in the process grid and its partners (`cg.f`'s
/// `setup_submatrix_info`).
struct Grid {
    me: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    /// The part of the row block this rank sums and sends to its transpose partner:
    /// all of it on a square grid, else the first half (even ranks) or second (odd).
    kept: Range<usize>,
    /// Whether the process grid is square.
    square: bool,
    /// The transpose partner.
    exch: usize,
    /// Partners of the row reductions, step by step.
    reduce: [usize; MAX_STEPS],
    steps: usize,
}

impl Grid {
    fn new(n: usize, me: usize, ranks: usize) -> Grid {
        let steps = ranks.trailing_zeros() as usize;
        // npcols = nprows, or 2 nprows when `ranks` is an odd power of two.
        let nprows = 1 << (steps / 2);
        let npcols = ranks / nprows;
        let (proc_row, proc_col) = (me / npcols, me % npcols);
        let (row_size, col_size) = (n / nprows, n / npcols);
        let square = nprows == npcols;
        let kept = if square {
            0..row_size
        } else if me.is_multiple_of(2) {
            0..row_size.div_ceil(2)
        } else {
            row_size.div_ceil(2)..row_size
        };
        let exch = if square {
            (me % nprows) * nprows + me / nprows
        } else {
            2 * ((me / 2 % nprows) * nprows + me / 2 / nprows) + me % 2
        };
        let mut reduce = [0; MAX_STEPS];
        let mut div = npcols;
        let col_steps = npcols.trailing_zeros() as usize;
        for partner in reduce.iter_mut().take(col_steps) {
            let j = (proc_col + div / 2) % div + proc_col / div * div;
            *partner = proc_row * npcols + j;
            div /= 2;
        }
        Grid {
            me,
            rows: proc_row * row_size..(proc_row + 1) * row_size,
            cols: proc_col * col_size..(proc_col + 1) * col_size,
            kept,
            square,
            exch,
            reduce,
            steps: col_steps,
        }
    }

    /// The part of a row block of `len` sums that reduction `step` sends: off a square
    /// grid the first exchange (between the two halves' keepers) sends the half this
    /// rank does not keep; later ones the kept half.
    fn row_sum_sent(&self, step: usize, len: usize) -> Range<usize> {
        if !self.square && step == self.steps - 1 {
            if self.kept.start == 0 {
                self.kept.end..len
            } else {
                0..self.kept.start
            }
        } else {
            self.kept.clone()
        }
    }

    /// Adds `values` across the process row: every rank of it ends with the same sums.
    fn sum<C: Comm + ?Sized>(&self, comm: &mut C, values: &mut [f64]) -> Result<(), Error> {
        let mut theirs = [0.0; 2];
        let theirs = &mut theirs[..values.len()];
        for &partner in &self.reduce[..self.steps] {
            comm.sendrecv(
                partner,
                TAG_DOT,
                bytes(values),
                partner,
                TAG_DOT,
                bytes_mut(theirs),
            )?;
            for (v, t) in values.iter_mut().zip(theirs.iter()) {
                *v += t;
            }
        }
        Ok(())
    }

    /// The product's last steps: `w` holds this rank's partial sums for its row block;
    /// adds them across the process row (using `scratch` to receive), then trades the
    /// kept piece with the transpose partner. `out` ends with the product on this
    /// rank's columns.
    fn finish_product<C: Comm + ?Sized>(
        &self,
        comm: &mut C,
        w: &mut [f64],
        scratch: &mut [f64],
        out: &mut [f64],
    ) -> Result<(), Error> {
        for step in (0..self.steps).rev() {
            let partner = self.reduce[step];
            let send = self.row_sum_sent(step, w.len());
            let kept = self.kept.clone();
            comm.sendrecv(
                partner,
                TAG_ROW_SUM + step as u32,
                bytes(&w[send]),
                partner,
                TAG_ROW_SUM + step as u32,
                bytes_mut(&mut scratch[kept.clone()]),
            )?;
            for (w, s) in w[kept.clone()].iter_mut().zip(&scratch[kept]) {
                *w += s;
            }
        }
        let piece = &w[self.kept.clone()];
        if self.exch == self.me {
            out.copy_from_slice(&piece[..out.len()]);
            Ok(())
        } else {
            let exch = self.exch;
            comm.sendrecv(
                exch,
                TAG_TRANSPOSE,
                bytes(piece),
                exch,
                TAG_TRANSPOSE,
                bytes_mut(out),
            )
            .map(|_| ())
        }
    }
}

/// A `sendrecv` of CG's: `bytes` to `partner` and as many back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exchange {
    pub partner: usize,
    pub bytes: usize,
}

/// One rank's messages in an iteration, in order, for models of CG's traffic (`kumo
/// sim`): the product's row reductions and its transpose (none on a square grid's
/// diagonal), and the partners each dot product's 8-byte sum goes to.
#[derive(Clone, Copy, Debug, Default)]
pub struct Traffic {
    product: [Exchange; MAX_STEPS + 1],
    product_len: usize,
    dots: [usize; MAX_STEPS],
    dots_len: usize,
}

impl Traffic {
    /// Rank `me` of `ranks` (a power of two up to 64) on a matrix of order `n`: the
    /// messages [`run`] sends.
    pub fn of(n: usize, me: usize, ranks: usize) -> Traffic {
        let g = Grid::new(n, me, ranks);
        let mut t = Traffic {
            dots_len: g.steps,
            ..Traffic::default()
        };
        t.dots[..g.steps].copy_from_slice(&g.reduce[..g.steps]);
        for step in (0..g.steps).rev() {
            t.product[t.product_len] = Exchange {
                partner: g.reduce[step],
                bytes: g.row_sum_sent(step, g.rows.len()).len() * 8,
            };
            t.product_len += 1;
        }
        if g.exch != me {
            t.product[t.product_len] = Exchange {
                partner: g.exch,
                bytes: g.kept.len() * 8,
            };
            t.product_len += 1;
        }
        t
    }

    /// A product's exchanges, in order.
    pub fn product(&self) -> &[Exchange] {
        &self.product[..self.product_len]
    }

    /// The partners of a dot product's sums, in order.
    pub fn dot_partners(&self) -> &[usize] {
        &self.dots[..self.dots_len]
    }
}

/// This rank's submatrix (local row and column numbers) and vectors: `x`, `z`, `p`,
/// `q` and `r` on its columns, `w` and `scratch` on its rows.
struct Local<'a> {
    rowstr: &'a [u32],
    colidx: &'a [u32],
    a: &'a [f64],
    x: &'a mut [f64],
    z: &'a mut [f64],
    p: &'a mut [f64],
    q: &'a mut [f64],
    r: &'a mut [f64],
    w: &'a mut [f64],
    scratch: &'a mut [f64],
}

/// The two products of a solve.
#[derive(Clone, Copy)]
enum Product {
    /// `q = A p`, every iteration.
    Direction,
    /// `r = A z`, for the residual.
    Residual,
}

impl Local<'_> {
    /// `product` on this rank's columns.
    fn product<C: Comm + ?Sized>(
        &mut self,
        comm: &mut C,
        grid: &Grid,
        product: Product,
    ) -> Result<(), Error> {
        let (v, out): (&[f64], &mut [f64]) = match product {
            Product::Direction => (self.p, self.q),
            Product::Residual => (self.z, self.r),
        };
        let rows = 0..self.w.len();
        cg::spmv(self.rowstr, self.colidx, self.a, rows, v, self.w);
        grid.finish_product(comm, self.w, self.scratch, out)
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

/// One solve of `A z = x` by [`CG_ITERATIONS`] iterations; returns `||x - A z||`.
fn conj_grad<C: Comm + ?Sized>(comm: &mut C, g: &Grid, l: &mut Local) -> Result<f64, Error> {
    l.q.fill(0.0);
    l.z.fill(0.0);
    l.r.copy_from_slice(l.x);
    l.p.copy_from_slice(l.x);
    let mut rho = [dot(l.r, l.r)];
    g.sum(comm, &mut rho)?;
    let mut rho = rho[0];
    for _ in 0..CG_ITERATIONS {
        l.product(comm, g, Product::Direction)?;
        let mut d = [dot(l.p, l.q)];
        g.sum(comm, &mut d)?;
        let alpha = rho / d[0];
        let rho0 = rho;
        for (((z, r), p), q) in
            l.z.iter_mut()
                .zip(l.r.iter_mut())
                .zip(l.p.iter())
                .zip(l.q.iter())
        {
            *z += alpha * p;
            *r -= alpha * q;
        }
        let mut r2 = [dot(l.r, l.r)];
        g.sum(comm, &mut r2)?;
        rho = r2[0];
        let beta = rho / rho0;
        for (p, r) in l.p.iter_mut().zip(l.r.iter()) {
            *p = r + beta * *p;
        }
    }
    // ||x - A z||, A z into r.
    l.product(comm, g, Product::Residual)?;
    let mut residual =
        [l.x.iter()
            .zip(l.r.iter())
            .map(|(x, r)| (x - r) * (x - r))
            .sum()];
    g.sum(comm, &mut residual)?;
    Ok(libm::sqrt(residual[0]))
}

/// `x . z` over all columns, and `x = z / ||z||` on this rank's.
fn normalise<C: Comm + ?Sized>(comm: &mut C, g: &Grid, l: &mut Local) -> Result<f64, Error> {
    let mut norms = [dot(l.x, l.z), dot(l.z, l.z)];
    g.sum(comm, &mut norms)?;
    let scale = 1.0 / libm::sqrt(norms[1]);
    for (x, z) in l.x.iter_mut().zip(l.z.iter()) {
        *x = scale * z;
    }
    Ok(norms[0])
}

/// Keeps, in place, the part of the whole CSR matrix in `rows` x `cols`, with local
/// row and column numbers (the entries of each row in their order).
fn keep_submatrix(
    rowstr: &mut [u32],
    colidx: &mut [u32],
    a: &mut [f64],
    rows: Range<usize>,
    cols: Range<usize>,
) {
    let mut kept = 0;
    // Entries are moved forward only (`kept` never passes the entry read), and row
    // starts are rewritten behind the one read next.
    let mut start = rowstr[rows.start] as usize;
    for (local, row) in rows.enumerate() {
        let end = rowstr[row + 1] as usize;
        rowstr[local] = kept as u32;
        for k in start..end {
            let col = colidx[k] as usize;
            if cols.contains(&col) {
                colidx[kept] = (col - cols.start) as u32;
                a[kept] = a[k];
                kept += 1;
            }
        }
        start = end;
        rowstr[local + 1] = kept as u32;
    }
}

pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let params = cg::params(class);
    let (n, nonzer) = (params.na, params.nonzer);
    let (nz, naz) = (cg::max_nonzeros(&params), n * (nonzer + 1));
    let grid = Grid::new(n, comm.rank(), comm.size());
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
    keep_submatrix(rowstr, colidx, a, grid.rows.clone(), grid.cols.clone());
    let (rows, cols) = (grid.rows.len(), grid.cols.len());
    // SAFETY: as above.
    let mut l = unsafe {
        Local {
            rowstr: &rowstr[..=rows],
            colidx,
            a,
            x: take::<f64>(arena, cols),
            z: take::<f64>(arena, cols),
            p: take::<f64>(arena, cols),
            q: take::<f64>(arena, cols),
            r: take::<f64>(arena, cols),
            w: take::<f64>(arena, rows),
            scratch: take::<f64>(arena, rows),
        }
    };

    // One untimed step, then start again from x = 1.
    l.x.fill(1.0);
    conj_grad(comm, &grid, &mut l)?;
    normalise(comm, &grid, &mut l)?;
    l.x.fill(1.0);
    comm.barrier()?;

    let start = comm.seconds();
    let mut zeta = 0.0;
    let mut rnorm = 0.0;
    for it in 0..params.niter {
        rnorm = conj_grad(comm, &grid, &mut l)?;
        let xz = normalise(comm, &grid, &mut l)?;
        zeta = params.shift + 1.0 / xz;
        comm.progress(it + 1, params.niter);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_is_cg_fs() {
        // 8 ranks: 2 x 4. Rank 6 is at row 1, column 2.
        let g = Grid::new(7000, 6, 8);
        assert_eq!((g.rows.clone(), g.cols.clone()), (3500..7000, 3500..5250));
        assert!(!g.square);
        assert_eq!(g.kept, 0..1750, "even ranks keep the first half");
        // Column partners at distance 2, then 1, in its process row (ranks 4-7).
        assert_eq!(&g.reduce[..g.steps], &[4, 7]);
        // Its summed half, rows 3500..5250, are its own columns.
        assert_eq!(g.exch, 6);
        // Rank 5 (row 1, column 1) keeps the second half, rows 5250..7000: the
        // columns of rank 3 (row 0, column 3), whose piece comes back to rank 5.
        let g = Grid::new(7000, 5, 8);
        assert_eq!((g.kept.clone(), g.exch), (1750..3500, 3));
        assert_eq!(Grid::new(7000, 3, 8).cols, 5250..7000);
        assert_eq!(
            Grid::new(7000, 3, 8).exch,
            5,
            "the transpose is an involution"
        );
        // 4 ranks: 2 x 2, transposes swap 1 and 2.
        let s = Grid::new(1400, 1, 4);
        assert!(s.square);
        assert_eq!((s.exch, Grid::new(1400, 2, 4).exch), (2, 1));
        assert_eq!(Grid::new(1400, 0, 4).exch, 0);
        // 1 rank: no partners, everything local.
        let one = Grid::new(1400, 0, 1);
        assert_eq!((one.steps, one.exch, one.rows.len()), (0, 0, 1400));
    }

    #[test]
    fn the_traffic_is_the_grids_messages_and_every_one_has_its_partners() {
        let e = |partner, bytes| Exchange { partner, bytes };
        // 4 ranks (CG.W's order 7000): rows 0-1 and 2-3 sum row blocks of 3500 values;
        // only 1 and 2 trade transposes.
        let t = Traffic::of(7000, 0, 4);
        assert_eq!(
            (t.product(), t.dot_partners()),
            (&[e(1, 28000)][..], &[1][..])
        );
        let t = Traffic::of(7000, 1, 4);
        assert_eq!(t.product(), &[e(0, 28000), e(2, 28000)]);
        // 8 ranks (2 x 4): rank 6 first trades the half it does not keep with 7.
        let t = Traffic::of(7000, 6, 8);
        assert_eq!(t.product(), &[e(7, 14000), e(4, 14000)]);
        assert_eq!(t.dot_partners(), &[4, 7]);
        for ranks in [1, 2, 4, 8, 16, 32, 64] {
            for me in 0..ranks {
                let mine = Traffic::of(14000, me, ranks);
                for (i, x) in mine.product().iter().enumerate() {
                    let theirs = Traffic::of(14000, x.partner, ranks);
                    assert!(
                        theirs.product().iter().any(|y| y.partner == me),
                        "{me} of {ranks}: exchange {i} with {} is not returned",
                        x.partner
                    );
                }
            }
        }
        assert!(Traffic::of(1400, 0, 1).product().is_empty());
    }

    #[test]
    fn every_kept_piece_lands_on_the_rank_owning_those_columns() {
        for ranks in [1, 2, 4, 8, 16, 32, 64] {
            let n = 14000;
            for me in 0..ranks {
                let g = Grid::new(n, me, ranks);
                let kept = g.rows.start + g.kept.start..g.rows.start + g.kept.end;
                assert_eq!(Grid::new(n, g.exch, ranks).cols, kept, "{me} of {ranks}");
            }
        }
    }

    #[test]
    fn class_s_verifies_on_grids_of_8_and_16_ranks() {
        // 2 x 4 (halves traded) and 4 x 4 (two reduction steps, off-diagonal transposes).
        for ranks in [8, 16] {
            let bytes = heap_bytes(Class::S, ranks);
            let outcomes = crate::mpi::host::run_ranks(ranks, bytes, |comm, arena| {
                run(Class::S, comm, arena).unwrap()
            });
            for outcome in &outcomes {
                assert!(outcome.verified, "{ranks} ranks: {outcome:?}");
                assert_eq!(
                    outcome.values, outcomes[0].values,
                    "{ranks}: ranks disagree"
                );
            }
        }
    }

    #[test]
    fn a_submatrix_keeps_its_block_in_order_with_local_numbers() {
        // 3 x 3: [[1 2 0] [0 3 4] [5 0 6]]; keep rows 1..3, columns 1..3.
        let mut rowstr = [0, 2, 4, 6];
        let mut colidx = [0, 1, 1, 2, 0, 2];
        let mut a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        keep_submatrix(&mut rowstr, &mut colidx, &mut a, 1..3, 1..3);
        assert_eq!(rowstr[..3], [0, 2, 3]);
        assert_eq!(colidx[..3], [0, 1, 1]);
        assert_eq!(a[..3], [3.0, 4.0, 6.0]);
    }
}
