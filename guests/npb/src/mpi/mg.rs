//! MG on a z-slab decomposition: rank `r` of `s` (a power of two no larger than the
//! finest grid's side) holds, on every level with at least `s` planes, the `n / s`
//! contiguous interior z planes from `r * n / s + 1` with one ghost plane below and
//! above (periodic, as the shared-memory MG's planes), and after each operator sends
//! its edge planes to its two z neighbours. The levels with fewer planes than ranks
//! are held whole by every rank and computed alike everywhere: the restriction into
//! the finest of them allgathers the level above, and the prolongation out of them
//! interpolates the whole level above and keeps this rank's planes.
//!
//! The operators are the shared-memory MG's own per-plane kernels (`resid`, `psinv`,
//! `rprj3`, `interp`), so every point gets the same arithmetic as the reference;
//! the norms are local sums and maxima allreduced, and `zran3`'s charges are the ten
//! largest and smallest of every rank's candidates (found on its own planes, then
//! allgathered). Same verification (`rnm2`). This is not `mg.f`'s 3-D process grid
//! (which exchanges faces along all three axes): slabs exchange whole planes along z
//! only.

use super::{Comm, Error, MAX_RANKS, Op, bytes, bytes_mut, max_seconds, take};
use crate::mg::{self, CHARGES, Candidate, RESIDUAL};
use crate::team::Arena;
use crate::{Class, Outcome, Values};

/// Whether MG runs on `ranks` ranks: a power of two no larger than the finest grid's
/// side (every rank owns at least one plane of the finest level).
pub fn fits(class: Class, ranks: usize) -> bool {
    ranks.is_power_of_two() && ranks <= mg::size(class)
}

/// Tags of the ghost-plane exchanges: a rank's top plane going up, its bottom down.
const TAG_UP: u32 = 401;
const TAG_DOWN: u32 = 402;

/// What one rank holds of one level.
#[derive(Clone, Copy, Debug, Default)]
struct Shape {
    /// Interior points a side.
    n: usize,
    /// Interior planes held (`n / ranks`, or all `n` when whole).
    planes: usize,
    /// The level's plane that is local plane 0 (the ghost below the first held).
    first: usize,
    /// Every rank holds every plane (a level with fewer planes than ranks).
    whole: bool,
}

impl Shape {
    fn of_level(n: usize, rank: usize, ranks: usize) -> Shape {
        if n >= ranks {
            let planes = n / ranks;
            Shape {
                n,
                planes,
                first: rank * planes,
                whole: false,
            }
        } else {
            Shape::whole(n)
        }
    }

    fn whole(n: usize) -> Shape {
        Shape {
            n,
            planes: n,
            first: 0,
            whole: true,
        }
    }

    fn m(&self) -> usize {
        self.n + 2
    }

    fn plane(&self) -> usize {
        self.m() * self.m()
    }

    /// Values held, ghost planes included.
    fn len(&self) -> usize {
        (self.planes + 2) * self.plane()
    }
}

/// Every level's shape on this rank (entry `k` is level `k`, entry 0 unused), and the
/// whole shape of the finest level split among ranks when coarser levels are whole
/// (the allgather/interpolation buffer between the two kinds).
fn plan(class: Class, rank: usize, ranks: usize) -> ([Shape; 16], Option<Shape>) {
    let lt = mg::levels(class);
    let shapes = core::array::from_fn(|k| {
        if (1..=lt).contains(&k) {
            Shape::of_level(1 << k, rank, ranks)
        } else {
            Shape::default()
        }
    });
    let lowest_split = (1..=lt).find(|&k| !shapes[k].whole).unwrap_or(lt);
    let boundary = (lowest_split > 1).then(|| Shape::whole(1 << lowest_split));
    (shapes, boundary)
}

/// Arena bytes of one rank: `u` and `r` on every level, `v` on the finest, the
/// boundary level whole (when there is one), the candidate charges, and alignment.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let (shapes, boundary) = plan(class, 0, ranks);
    let lt = mg::levels(class);
    let f64s = |len: usize| len * 8 + 64;
    let levels: usize = shapes[1..=lt].iter().map(|s| f64s(s.len())).sum();
    let candidates = (ranks + 1) * 2 * CHARGES * core::mem::size_of::<Candidate>() + 2 * 64;
    2 * levels + f64s(shapes[lt].len()) + boundary.map_or(0, |b| f64s(b.len())) + candidates
}

/// Sends `send` to `to` and receives exactly `recv.len()` values from `from`, at once
/// (`sendrecv`: around the ring no rank waits for another's receive to be posted).
fn shift<C: Comm + ?Sized>(
    comm: &mut C,
    (to, send): (usize, &[f64]),
    (from, recv): (usize, &mut [f64]),
    tag: u32,
) -> Result<(), Error> {
    let want = core::mem::size_of_val(recv);
    if comm.sendrecv(to, tag, bytes(send), from, tag, bytes_mut(recv))? != want {
        return Err(Error("mg-ghost-plane"));
    }
    Ok(())
}

/// Fills the ghost planes of `f`: from the z neighbours' edge planes, or, when this
/// rank holds every plane, from its own (periodic).
fn exchange<C: Comm + ?Sized>(comm: &mut C, s: &Shape, f: &mut [f64]) -> Result<(), Error> {
    let (pl, top) = (s.plane(), s.planes);
    let size = comm.size();
    if s.whole || size == 1 {
        f.copy_within(top * pl..(top + 1) * pl, 0);
        f.copy_within(pl..2 * pl, (top + 1) * pl);
        return Ok(());
    }
    let me = comm.rank();
    let (up, down) = ((me + 1) % size, (me + size - 1) % size);
    // My top plane is the upper neighbour's ghost below; the lower one's is mine.
    let (below, rest) = f.split_at_mut(pl);
    let top_plane = &rest[(top - 1) * pl..top * pl];
    shift(comm, (up, top_plane), (down, below), TAG_UP)?;
    // My bottom plane is the lower neighbour's ghost above; the upper one's is mine.
    let (held, above) = f.split_at_mut((top + 1) * pl);
    shift(comm, (down, &held[pl..2 * pl]), (up, above), TAG_DOWN)
}

/// Every rank's `mine` (the same length on each) into its place in `all`, in rank order.
fn allgather<C: Comm + ?Sized>(comm: &mut C, mine: &[u8], all: &mut [u8]) -> Result<(), Error> {
    let size = comm.size();
    let counts = [mine.len(); MAX_RANKS];
    let from_start = [0; MAX_RANKS];
    let places: [usize; MAX_RANKS] = core::array::from_fn(|j| j * mine.len());
    comm.alltoallv(
        mine,
        &counts[..size],
        &from_start[..size],
        all,
        &counts[..size],
        &places[..size],
    )
}

/// The held planes of `slab` (shape `s`) from every rank into `whole` (shape `w`, the
/// same level whole), ghosts filled.
fn gather_level<C: Comm + ?Sized>(
    comm: &mut C,
    s: &Shape,
    slab: &[f64],
    w: &Shape,
    whole: &mut [f64],
) -> Result<(), Error> {
    let pl = s.plane();
    allgather(
        comm,
        bytes(&slab[pl..(s.planes + 1) * pl]),
        bytes_mut(&mut whole[pl..(w.planes + 1) * pl]),
    )?;
    exchange(comm, w, whole)
}

/// `r = v - A u` on the held planes of `r` (`v` is `r` itself when `None`).
fn resid<C: Comm + ?Sized>(
    comm: &mut C,
    s: &Shape,
    u: &[f64],
    v: Option<&[f64]>,
    r: &mut [f64],
) -> Result<(), Error> {
    let pl = s.plane();
    for p in 1..=s.planes {
        let v_plane = v.map(|v| &v[p * pl..(p + 1) * pl]);
        mg::resid_plane(
            u,
            p,
            v_plane,
            &mut r[p * pl..(p + 1) * pl],
            s.m(),
            &RESIDUAL,
        );
    }
    exchange(comm, s, r)
}

/// The smoother `u = u + C r` on the held planes of `u`.
fn psinv<C: Comm + ?Sized>(
    comm: &mut C,
    s: &Shape,
    r: &[f64],
    u: &mut [f64],
    c: &[f64; 4],
) -> Result<(), Error> {
    let pl = s.plane();
    for p in 1..=s.planes {
        mg::psinv_plane(r, p, &mut u[p * pl..(p + 1) * pl], s.m(), c);
    }
    exchange(comm, s, u)
}

/// Restriction from `fine` (shape `fs`) to the held planes of `coarse` (shape `cs`).
/// Coarse local plane `j` lies on fine local plane `2j` when both are split (rank `r`'s
/// coarse planes from `r * nc/s`, its fine ones from `2 r * nc/s`) or both whole.
fn rprj3<C: Comm + ?Sized>(
    comm: &mut C,
    fs: &Shape,
    fine: &[f64],
    cs: &Shape,
    coarse: &mut [f64],
) -> Result<(), Error> {
    let pl = cs.plane();
    for j in 1..=cs.planes {
        mg::rprj3_plane(
            fine,
            fs.m(),
            2 * j,
            &mut coarse[j * pl..(j + 1) * pl],
            cs.m(),
        );
    }
    exchange(comm, cs, coarse)
}

/// Prolongation from `coarse` (shape `cs`) to every plane of `fine` (shape `fs`, ghosts
/// included, no exchange): coarse local plane `c` makes fine local planes `2c` and
/// `2c + 1` (aligned as in [`rprj3`]).
fn interp<const ADD: bool>(cs: &Shape, coarse: &[f64], fs: &Shape, fine: &mut [f64]) {
    let plf = fs.plane();
    for (c, pair) in fine.chunks_exact_mut(2 * plf).enumerate() {
        mg::interp_plane::<ADD>(coarse, cs.m(), c, pair, fs.m());
    }
}

/// This rank's arrays and their shapes.
struct Grids<'a> {
    lt: usize,
    shapes: [Shape; 16],
    u: [&'a mut [f64]; 16],
    r: [&'a mut [f64]; 16],
    v: &'a mut [f64],
    /// The finest level split among ranks, whole, when coarser levels are whole.
    boundary: Option<(Shape, &'a mut [f64])>,
}

/// Levels `k - 1` and `k` of `levels`, both writable.
fn pair<'s>(levels: &'s mut [&mut [f64]; 16], k: usize) -> (&'s mut [f64], &'s mut [f64]) {
    let (lower, upper) = levels.split_at_mut(k);
    (&mut *lower[k - 1], &mut *upper[0])
}

impl Grids<'_> {
    /// `r[k - 1] = P r[k]`.
    fn restrict<C: Comm + ?Sized>(&mut self, comm: &mut C, k: usize) -> Result<(), Error> {
        let (fs, cs) = (self.shapes[k], self.shapes[k - 1]);
        let (coarse, fine) = pair(&mut self.r, k);
        match &mut self.boundary {
            // The finest whole level: from the split level above, gathered whole.
            Some((w, whole)) if cs.whole && !fs.whole => {
                gather_level(comm, &fs, fine, w, whole)?;
                rprj3(comm, w, whole, &cs, coarse)
            }
            _ => rprj3(comm, &fs, fine, &cs, coarse),
        }
    }

    /// `u[k] = Q u[k - 1]`, or `u[k] += Q u[k - 1]` (`ADD`).
    fn prolong<const ADD: bool>(&mut self, k: usize) {
        let (cs, fs) = (self.shapes[k - 1], self.shapes[k]);
        let (coarse, fine) = pair(&mut self.u, k);
        match &mut self.boundary {
            // Out of the whole levels: interpolate the level whole, keep my planes.
            Some((w, whole)) if cs.whole && !fs.whole => {
                interp::<false>(&cs, coarse, w, whole);
                let pl = fs.plane();
                let mine = &whole[fs.first * pl..][..fine.len()];
                if ADD {
                    fine.iter_mut().zip(mine).for_each(|(f, q)| *f += q);
                } else {
                    fine.copy_from_slice(mine);
                }
            }
            _ => interp::<ADD>(&cs, coarse, &fs, fine),
        }
    }

    /// `r = v - A u` on the finest level.
    fn residual<C: Comm + ?Sized>(&mut self, comm: &mut C) -> Result<(), Error> {
        let lt = self.lt;
        resid(comm, &self.shapes[lt], self.u[lt], Some(self.v), self.r[lt])
    }

    /// `r[k] = r[k] - A u[k]`, then `u[k] += C r[k]`.
    fn resid_and_smooth<C: Comm + ?Sized>(
        &mut self,
        comm: &mut C,
        k: usize,
        c: &[f64; 4],
    ) -> Result<(), Error> {
        let s = self.shapes[k];
        resid(comm, &s, self.u[k], None, self.r[k])?;
        psinv(comm, &s, self.r[k], self.u[k], c)
    }

    /// One V-cycle (`mg3P`), as the shared-memory MG's.
    fn mg3p<C: Comm + ?Sized>(&mut self, comm: &mut C, c: &[f64; 4]) -> Result<(), Error> {
        let lt = self.lt;
        for k in (2..=lt).rev() {
            self.restrict(comm, k)?;
        }
        self.u[1].fill(0.0);
        psinv(comm, &self.shapes[1], self.r[1], self.u[1], c)?;
        for k in 2..lt {
            self.prolong::<false>(k);
            self.resid_and_smooth(comm, k, c)?;
        }
        self.prolong::<true>(lt);
        self.residual(comm)?;
        psinv(comm, &self.shapes[lt], self.r[lt], self.u[lt], c)
    }

    /// `(sqrt(sum r^2 / n^3), max |r|)` over the finest level's interior.
    fn norm<C: Comm + ?Sized>(&self, comm: &mut C) -> Result<(f64, f64), Error> {
        let s = &self.shapes[self.lt];
        let pl = s.plane();
        let (sum, max) = mg::squares_and_max(&self.r[self.lt][pl..(s.planes + 1) * pl], s.m());
        let (mut sum, mut max) = ([sum], [max]);
        comm.allreduce_f64(&mut sum, Op::Sum)?;
        comm.allreduce_f64(&mut max, Op::Max)?;
        Ok((libm::sqrt(sum[0] / (s.n * s.n * s.n) as f64), max[0]))
    }

    /// Zeroes `u` on the finest level and makes the right-hand side `v` (`zran3`):
    /// every rank's best candidates on its planes, allgathered and merged alike.
    fn reset<C: Comm + ?Sized>(
        &mut self,
        comm: &mut C,
        candidates: &mut [Candidate],
    ) -> Result<(), Error> {
        let s = self.shapes[self.lt];
        self.u[self.lt].fill(0.0);
        let pl = s.plane();
        let held = &mut self.v[pl..(s.planes + 1) * pl];
        let (largest, smallest) = mg::zran3_scan(held, s.first + 1..s.first + 1 + s.planes, s.n);
        let (mine, all) = candidates.split_at_mut(2 * CHARGES);
        mine[..CHARGES].copy_from_slice(&largest.list);
        mine[CHARGES..].copy_from_slice(&smallest.list);
        allgather(comm, bytes(mine), bytes_mut(all))?;
        let (largest, smallest) = mg::merge_extremes(all);
        mg::place_charges(held, s.first + 1, s.m(), &largest, &smallest);
        exchange(comm, &s, self.v)
    }
}

pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let (me, size) = (comm.rank(), comm.size());
    let lt = mg::levels(class);
    let nit = mg::iterations(class);
    let c = mg::smoother(class);
    let (shapes, boundary) = plan(class, me, size);
    let mut carve = |len: usize| -> &mut [f64] {
        // SAFETY: the arena is this rank's alone and outlives this run.
        unsafe { take(arena, len) }
    };
    let mut level = |k: usize| -> &mut [f64] {
        if (1..=lt).contains(&k) {
            carve(shapes[k].len())
        } else {
            &mut []
        }
    };
    let u = core::array::from_fn(&mut level);
    let r = core::array::from_fn(&mut level);
    let mut g = Grids {
        lt,
        shapes,
        u,
        r,
        v: carve(shapes[lt].len()),
        boundary: boundary.map(|w| (w, carve(w.len()))),
    };
    // SAFETY: as `carve`.
    let candidates = unsafe { take::<Candidate>(arena, (size + 1) * 2 * CHARGES) };

    // Set-up and one untimed cycle, then start again from the same state.
    g.reset(comm, candidates)?;
    g.residual(comm)?;
    g.mg3p(comm, &c)?;
    g.residual(comm)?;
    g.reset(comm, candidates)?;
    comm.barrier()?;

    let start = comm.seconds();
    g.residual(comm)?;
    let (initial, _) = g.norm(comm)?;
    for _ in 0..nit {
        g.mg3p(comm, &c)?;
        g.residual(comm)?;
    }
    let (rnm2, rnmu) = g.norm(comm)?;
    let seconds = max_seconds(comm, comm.seconds() - start)?;

    let mut values = Values::new();
    values.push("rnm2", rnm2);
    values.push("rnmu", rnmu);
    values.push("initial", initial);
    values.push("error", mg::error(class, rnm2));
    Ok(Outcome {
        seconds,
        mops: mg::mops(class, seconds),
        verified: mg::verify(class, rnm2),
        values,
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::testing::value;

    #[test]
    fn rank_counts_must_be_powers_of_two_within_the_finest_side() {
        assert!(fits(Class::S, 32) && fits(Class::W, 64) && fits(Class::S, 1));
        assert!(!fits(Class::S, 64) && !fits(Class::S, 3) && !fits(Class::A, 6));
    }

    #[test]
    fn split_levels_align_with_the_levels_below_and_whole_ones_start_at_the_boundary() {
        let (shapes, boundary) = plan(Class::S, 3, 8);
        // Level 3 (8 planes) and up are split: rank 3 holds planes 3·n/8 + 1 ..
        for s in &shapes[3..=5] {
            assert!(!s.whole && s.planes == s.n / 8 && s.first == 3 * s.planes);
        }
        // A coarse local plane j lies on fine local plane 2j.
        assert_eq!(2 * shapes[4].first, shapes[5].first);
        assert!(shapes[1].whole && shapes[2].whole && shapes[2].planes == 4);
        assert_eq!(boundary.map(|b| (b.n, b.whole)), Some((8, true)));
        // Two ranks split every level, down to level 1's two planes.
        let (shapes, boundary) = plan(Class::S, 1, 2);
        assert!(boundary.is_none() && !shapes[1].whole && shapes[1].first == 1);
    }

    /// Runs MG on `ranks` host threads; every rank's outcome.
    fn run_on(class: Class, ranks: usize) -> Vec<Outcome> {
        let kernel = crate::Kernel::Mg;
        crate::testing::on_mpi_ranks(crate::Spec { kernel, class }, ranks)
    }

    /// Asserts that MG `class` verifies on each of `ranks`, every rank alike.
    fn verifies_on(class: Class, ranks: &[usize]) {
        for &ranks in ranks {
            let outcomes = run_on(class, ranks);
            for outcome in &outcomes {
                assert!(outcome.verified, "{class:?} on {ranks} ranks: {outcome:?}");
                assert_eq!(outcome.values, outcomes[0].values);
            }
        }
    }

    #[test]
    fn verifies_at_s_with_whole_coarse_levels_and_one_finest_plane_per_rank() {
        // 8 and 16 ranks: levels below 8 (16) planes are whole on every rank; 32
        // ranks: one plane of the finest level each, prolonged into from whole levels.
        verifies_on(Class::S, &[8, 16, 32]);
    }

    #[test]
    fn verifies_at_w_on_1_2_4_ranks() {
        verifies_on(Class::W, &[1, 2, 4]);
    }

    #[test]
    #[ignore = "class A: seconds per run and up to ~450 MiB per rank; run with --release --include-ignored"]
    fn verifies_at_a_on_1_2_4_ranks() {
        verifies_on(Class::A, &[1, 2, 4]);
    }

    #[test]
    fn finds_the_same_residual_norms_as_the_shared_memory_mg() {
        let team = crate::host::run(
            crate::Spec {
                kernel: crate::Kernel::Mg,
                class: Class::S,
            },
            2,
        );
        let split = &run_on(Class::S, 4)[0];
        for name in ["rnm2", "initial"] {
            let (a, b) = (value(&team, name), value(split, name));
            assert!((a - b).abs() <= 1e-12 * a.abs(), "{name}: {a} vs {b}");
        }
        // The maximum is a single point's value: the same bits.
        assert_eq!(value(&team, "rnmu"), value(split, "rnmu"));
    }
}
