//! FT on NPB-MPI's 1-D slab layout (`ft.f` with `layout_1D`): rank `r` of `s` (a power
//! of two dividing `ny` and `nz`) holds the z planes `r*nz/s ..` (layout A, the grid's
//! own order and row padding) for the initial conditions, the x and y passes and the
//! checksum, and after a transpose (alltoall) the y rows `r*ny/s ..` of every plane
//! (layout B) for the z pass and `evolve`. The 1-D transforms are the shared-memory
//! FT's own (`cfftz` on blocks of lines), run on each rank's slab; the checksum's
//! points are summed by the rank holding them, then allreduced. Same verification.

use super::{Comm, Error, Op, bytes, bytes_mut, max_seconds};
use crate::ft::{
    self, Complex, Grid, MAX_ITERATIONS, SEED, Work, decay_factors, fft_init, fft_xy, fft_z,
};
use crate::random::{self, A};
use crate::team::{Arena, Runtime, Shared, Team};
use crate::{Class, Outcome};

/// Whether FT runs on `ranks` ranks: a power of two dividing `ny` and `nz`.
pub fn fits(class: Class, ranks: usize) -> bool {
    let [_, ny, nz] = ft::dims(class);
    ranks.is_power_of_two() && ny % ranks == 0 && nz % ranks == 0
}

/// The two layouts of this rank's part.
fn layouts(class: Class, ranks: usize) -> (Grid, Grid) {
    let [nx, ny, nz] = ft::dims(class);
    (
        Grid::new([nx, ny, nz / ranks]),
        Grid::new([nx, ny / ranks, nz]),
    )
}

/// Arena bytes of one rank: one array in layout A, two in layout B, the transpose's
/// send and receive buffers, the FFT work area, and alignment.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let (a, b) = layouts(class, ranks);
    let g = Grid::new(ft::dims(class));
    let c = core::mem::size_of::<Complex>();
    let points = a.total();
    (a.len() + 2 * b.len() + 2 * points) * c + g.work_len() * 8 + 6 * 64
}

/// The team of one: each rank runs the shared-memory passes on its own slab.
struct Solo;

impl Runtime for Solo {
    fn barrier(&self) {}
    fn seconds(&self) -> f64 {
        0.0
    }
}

struct Arrays {
    /// Layout A: this rank's z planes.
    a: Shared<Complex>,
    /// Layout B: the evolving spectrum, and the field being transformed back.
    u0: Shared<Complex>,
    u1: Shared<Complex>,
    send: Shared<Complex>,
    recv: Shared<Complex>,
}

/// Layout A to layout B (`forward`) or back, through the alltoall buffers. Block `s` of
/// the send buffer holds this rank's planes × rank `s`'s rows, ordered (k, j, i).
fn transpose<C: Comm + ?Sized>(
    comm: &mut C,
    ga: &Grid,
    gb: &Grid,
    arr: &Arrays,
    from_b: Shared<Complex>,
    forward: bool,
) -> Result<(), Error> {
    let size = comm.size();
    let (nx, nzl, nyl) = (ga.nx, ga.nz, gb.ny);
    let block = nzl * nyl * nx;
    // SAFETY: for each slice: one thread per rank; the arrays are distinct, and
    // none of these slices outlives this function.
    let (send, recv, a, b) = unsafe {
        (
            arr.send.all_mut(),
            arr.recv.all_mut(),
            arr.a.all_mut(),
            from_b.all_mut(),
        )
    };
    for s in 0..size {
        let out = &mut send[s * block..(s + 1) * block];
        let mut at = 0;
        if forward {
            // My planes k, rank s's rows.
            for k in 0..nzl {
                for j in s * nyl..(s + 1) * nyl {
                    let from = ga.index(0, j, k);
                    out[at..at + nx].copy_from_slice(&a[from..from + nx]);
                    at += nx;
                }
            }
        } else {
            // Rank s's planes, my rows (layout B holds every plane of my rows).
            for k in s * nzl..(s + 1) * nzl {
                for j in 0..nyl {
                    let from = gb.index(0, j, k);
                    out[at..at + nx].copy_from_slice(&b[from..from + nx]);
                    at += nx;
                }
            }
        }
    }
    comm.alltoall(bytes(send), bytes_mut(recv))?;
    for s in 0..size {
        let inp = &recv[s * block..(s + 1) * block];
        let mut at = 0;
        if forward {
            // Rank s's planes, my rows.
            for k in s * nzl..(s + 1) * nzl {
                for j in 0..nyl {
                    let to = gb.index(0, j, k);
                    b[to..to + nx].copy_from_slice(&inp[at..at + nx]);
                    at += nx;
                }
            }
        } else {
            // My planes, rank s's rows.
            for k in 0..nzl {
                for j in s * nyl..(s + 1) * nyl {
                    let to = ga.index(0, j, k);
                    a[to..to + nx].copy_from_slice(&inp[at..at + nx]);
                    at += nx;
                }
            }
        }
    }
    Ok(())
}

/// Initial conditions in layout A: point `(i, j, k)` takes numbers `2m + 1`, `2m + 2`
/// of the stream, `m = i + nx (j + ny k)`, `k` global.
fn initial_conditions(ga: &Grid, first_plane: usize, a: Shared<Complex>) {
    let mut x = random::skip(SEED, A, (2 * ga.nx * ga.ny * first_plane) as u64);
    // SAFETY: one thread per rank; no other slice of `a` is alive.
    let a = unsafe { a.all_mut() };
    for k in 0..ga.nz {
        for j in 0..ga.ny {
            let at = ga.index(0, j, k);
            for c in &mut a[at..at + ga.nx] {
                let re = random::randlc(&mut x, A);
                let im = random::randlc(&mut x, A);
                *c = Complex::new(re, im);
            }
        }
    }
}

pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let (me, size) = (comm.rank(), comm.size());
    let g = Grid::new(ft::dims(class));
    let (ga, gb) = layouts(class, size);
    let niter = ft::iterations(class);
    let arr = Arrays {
        a: arena.alloc(ga.len()),
        u0: arena.alloc(gb.len()),
        u1: arena.alloc(gb.len()),
        send: arena.alloc(ga.total()),
        recv: arena.alloc(ga.total()),
    };
    let work = arena.alloc::<f64>(g.work_len());
    // SAFETY: one thread per rank; the work area is used only through `w`.
    let mut w = Work::carve(&g, unsafe { work.all_mut() });
    let solo = Solo;
    let team = Team::new(0, 1, &solo);
    let (first_plane, first_row) = (me * ga.nz, me * gb.ny);

    // Set-up and forward transform into u0 (layout B).
    let forward = |comm: &mut C, w: &mut Work| -> Result<(), Error> {
        decay_factors(w.tx);
        decay_factors(w.ty);
        decay_factors(w.tz);
        initial_conditions(&ga, first_plane, arr.a);
        fft_init(w.roots, g.nx.max(g.ny).max(g.nz));
        fft_xy(&team, &ga, true, arr.a, arr.a, w);
        transpose(comm, &ga, &gb, &arr, arr.u0, true)?;
        fft_z(&team, &gb, true, arr.u0, arr.u0, w);
        Ok(())
    };
    // Untimed once (touches all the data), then timed as the reference.
    forward(comm, &mut w)?;
    comm.barrier()?;
    let start = comm.seconds();
    forward(comm, &mut w)?;
    let mut checks = [Complex::ZERO; MAX_ITERATIONS];
    for (step, check) in checks[..niter].iter_mut().enumerate() {
        // evolve: u0 *= decay, u1 = u0 (layout B: my rows of every plane).
        {
            // SAFETY: one thread per rank; u0 and u1 are distinct arrays.
            let (u0, u1) = unsafe { (arr.u0.all_mut(), arr.u1.all_mut()) };
            for k in 0..gb.nz {
                for j in 0..gb.ny {
                    let f = w.ty[first_row + j] * w.tz[k];
                    let at = gb.index(0, j, k);
                    for ((a, b), &t) in u0[at..at + gb.nx]
                        .iter_mut()
                        .zip(&mut u1[at..at + gb.nx])
                        .zip(&*w.tx)
                    {
                        let t = t * f;
                        a.re *= t;
                        a.im *= t;
                        *b = *a;
                    }
                }
            }
        }
        fft_z(&team, &gb, false, arr.u1, arr.u1, &mut w);
        transpose(comm, &ga, &gb, &arr, arr.u1, false)?;
        fft_xy(&team, &ga, false, arr.a, arr.a, &mut w);
        // The checksum's points in my planes, then everyone's.
        let mut sum = [0.0, 0.0];
        for j in 1..=ft::CHECKSUM_POINTS {
            let (q, r, s) = (j % g.nx, 3 * j % g.ny, 5 * j % g.nz);
            if (first_plane..first_plane + ga.nz).contains(&s) {
                // SAFETY: one thread per rank; nothing writes `a` here.
                let c = unsafe { arr.a.get(ga.index(q, r, s - first_plane)) };
                sum[0] += c.re;
                sum[1] += c.im;
            }
        }
        comm.allreduce_f64(&mut sum, Op::Sum)?;
        let n = g.total() as f64;
        *check = Complex::new(sum[0] / n, sum[1] / n);
        comm.progress(step + 1, niter);
    }
    let verified = ft::verify(class, &checks[..niter]);
    let seconds = max_seconds(comm, comm.seconds() - start)?;

    let values = ft::checksum_values(class, &checks[..niter]);
    Ok(Outcome {
        seconds,
        mops: ft::mops(class, seconds),
        verified,
        values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_counts_must_divide_the_planes() {
        assert!(fits(Class::S, 4) && fits(Class::W, 32));
        assert!(!fits(Class::W, 64) && !fits(Class::S, 3));
    }
}
