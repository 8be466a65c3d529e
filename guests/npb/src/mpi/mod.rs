//! NPB-MPI forms of the kernels: one rank per process (kumo: per VM), each with its own
//! memory, talking only through a [`Comm`]. The guest's MPI over raw Ethernet
//! implements [`Comm`] (`guests/user`), and so do host threads over channels
//! ([`host`], for the tests and the native twin), so the same kernel code runs on both.
//!
//! Decompositions (see each module): EP splits the batches and reduces the sums and
//! counts (as `ep.f`); IS ranks its block of keys, allreduces the bucket counts and
//! redistributes the keys by bucket with alltoall/alltoallv (as `is.c`); CG splits the
//! matrix over `cg.f`'s 2-D process grid (partial products summed across process rows,
//! pieces traded with transpose partners). FT uses `ft.f`'s 1-D slab layout with
//! alltoall transposes. MG splits every level into 3-D blocks on `mg.f`'s process grid,
//! exchanging ghost faces along x, y and z in turn after every operator, with ranks
//! that hold no point of a coarse level idle there as in `mg.f`.
//! LU splits the x-y plane over `lu.f`'s 2-D process grid, every rank holding all
//! of z, with ghosts two deep traded for `rhs` and its SSOR sweeps pipelined as
//! wavefronts across the grid.
//! SP and BT use NPB3.3-MPI's multi-partition on square rank counts ([`cfd`]): `q`
//! diagonal cells per rank, ghost faces exchanged before the right-hand side, each
//! line solve pipelined cell by cell across the ranks.

pub mod bt;
pub mod cfd;
pub mod cg;
pub mod ep;
pub mod ft;
#[cfg(any(test, feature = "host"))]
pub mod host;
pub mod is;
pub mod lu;
pub mod mg;
pub mod sp;

use core::fmt;

use crate::team::{Arena, Plain};
use crate::{Kernel, Outcome, Spec};

/// Most ranks a job may have (the guest's MPI has the same limit).
pub const MAX_RANKS: usize = 64;

/// Reduction operators of [`Comm::allreduce_f64`] and [`Comm::allreduce_i64`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Max,
    Min,
}

/// Why a communication (or a kernel's check of what it received) failed: a short
/// machine-readable name, printed as `@kumo error what=mpi item=NAME`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error(pub &'static str);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// What the MPI kernels need of an MPI: ranks, a clock, point-to-point and the
/// collectives. Every rank calls the collectives in the same order with matching
/// sizes. Reductions must give every rank the same bits.
pub trait Comm {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Wall-clock seconds since some fixed point of this rank.
    fn seconds(&self) -> f64;
    fn barrier(&mut self) -> Result<(), Error>;
    /// The timed loop finished step `done` of `of` (every rank, in step): an MPI that
    /// shows progress (the guest's, to a balancer) reports it; others need not.
    fn progress(&mut self, _done: usize, _of: usize) {}
    fn send(&mut self, dst: usize, tag: u32, data: &[u8]) -> Result<(), Error>;
    /// Receives the next message from `src`, which must carry `tag`; returns its length.
    fn recv(&mut self, src: usize, tag: u32, buf: &mut [u8]) -> Result<usize, Error>;
    /// `buf` of `root` to every rank.
    /// Sends `data` to `dst` and receives the next message from `src` (which must
    /// carry `recv_tag`) at once, as `MPI_Sendrecv`: partners exchanging messages larger
    /// than any buffering cannot deadlock. Returns the received length.
    fn sendrecv(
        &mut self,
        dst: usize,
        send_tag: u32,
        data: &[u8],
        src: usize,
        recv_tag: u32,
        buf: &mut [u8],
    ) -> Result<usize, Error>;
    fn bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<(), Error>;
    fn allreduce_f64(&mut self, values: &mut [f64], op: Op) -> Result<(), Error>;
    fn allreduce_i64(&mut self, values: &mut [i64], op: Op) -> Result<(), Error>;
    /// Block `j` of `send` (`send.len() / size` bytes) to rank `j`, rank `j`'s block
    /// into block `j` of `recv`.
    fn alltoall(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), Error>;
    /// As [`Comm::alltoall`] with per-rank byte counts and offsets (slices of `size`).
    fn alltoallv(
        &mut self,
        send: &[u8],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<(), Error>;
}

/// Plain values as bytes (for sends).
pub fn bytes<T: Plain>(values: &[T]) -> &[u8] {
    // SAFETY: `Plain` types are integers, floats and repr(C) aggregates of them without
    // padding, so their memory is initialised bytes.
    unsafe { core::slice::from_raw_parts(values.as_ptr().cast(), core::mem::size_of_val(values)) }
}

/// Plain values as bytes (for receives).
pub fn bytes_mut<T: Plain>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as [`bytes`]; and every bit pattern is a valid `Plain` value, so any
    // bytes written through the slice leave valid values.
    unsafe {
        core::slice::from_raw_parts_mut(values.as_mut_ptr().cast(), core::mem::size_of_val(values))
    }
}

/// Whether `spec` has an MPI form that runs on `ranks` ranks; if not, why.
pub fn supports(spec: Spec, ranks: usize) -> Result<(), &'static str> {
    if ranks == 0 || ranks > MAX_RANKS {
        return Err("an MPI job has 1 to 64 ranks");
    }
    if !spec.kernel.has(spec.class) {
        return Err("lacks that class");
    }
    match spec.kernel {
        Kernel::Ep => Ok(()),
        // As NPB-MPI's is.c and cg.f.
        Kernel::Is | Kernel::Cg if ranks.is_power_of_two() => Ok(()),
        Kernel::Is | Kernel::Cg => Err("needs a power-of-two number of ranks"),
        Kernel::Ft if ft::fits(spec.class, ranks) => Ok(()),
        Kernel::Ft => Err("needs a power-of-two number of ranks dividing the grid's planes"),
        Kernel::Mg if mg::fits(spec.class, ranks) => Ok(()),
        Kernel::Mg => Err("needs a power-of-two number of ranks (mg.f's process grid)"),
        Kernel::Lu if lu::fits(spec.class, ranks) => Ok(()),
        Kernel::Lu => Err(
            "needs a power-of-two number of ranks, each left at least 2 x 2 points of the x-y plane",
        ),
        Kernel::Sp if sp::fits(spec.class, ranks) => Ok(()),
        Kernel::Bt if bt::fits(spec.class, ranks) => Ok(()),
        Kernel::Sp | Kernel::Bt => {
            Err("needs a square number of ranks (4, 9, 16...) with cells of 2 points or more")
        }
    }
}

/// Arena bytes one rank of `spec` needs on `ranks` ranks.
pub fn heap_bytes(spec: Spec, ranks: usize) -> usize {
    let ranks = ranks.max(1);
    match spec.kernel {
        Kernel::Ep => ep::heap_bytes(),
        Kernel::Is => is::heap_bytes(spec.class, ranks),
        Kernel::Cg => cg::heap_bytes(spec.class, ranks),
        Kernel::Ft => ft::heap_bytes(spec.class, ranks),
        Kernel::Mg => mg::heap_bytes(spec.class, ranks),
        Kernel::Lu => lu::heap_bytes(spec.class, ranks),
        Kernel::Sp => sp::heap_bytes(spec.class, ranks),
        Kernel::Bt => bt::heap_bytes(spec.class, ranks),
    }
}

/// Runs this rank's part of `spec` (which [`supports`] must accept for `comm.size()`)
/// in `arena` (at least [`heap_bytes`], this rank's alone). Every rank returns the
/// same outcome.
pub fn run<C: Comm + ?Sized>(
    spec: Spec,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    if supports(spec, comm.size()).is_err() {
        return Err(Error("unsupported-ranks"));
    }
    match spec.kernel {
        Kernel::Ep => ep::run(spec.class, comm, arena),
        Kernel::Is => is::run(spec.class, comm, arena),
        Kernel::Cg => cg::run(spec.class, comm, arena),
        Kernel::Ft => ft::run(spec.class, comm, arena),
        Kernel::Mg => mg::run(spec.class, comm, arena),
        Kernel::Lu => lu::run(spec.class, comm, arena),
        Kernel::Sp => sp::run(spec.class, comm, arena),
        Kernel::Bt => bt::run(spec.class, comm, arena),
    }
}

/// The slowest rank's time (NPB-MPI reports the maximum over processes).
fn max_seconds<C: Comm + ?Sized>(comm: &mut C, seconds: f64) -> Result<f64, Error> {
    let mut t = [seconds];
    comm.allreduce_f64(&mut t, Op::Max)?;
    Ok(t[0])
}

/// A fresh array of `len` values carved from this rank's `arena`.
///
/// # Safety
/// The arena is this rank's alone (one thread uses it) and its memory outlives `'a`.
unsafe fn take<'a, T: Plain>(arena: &mut Arena, len: usize) -> &'a mut [T] {
    let shared = arena.alloc::<T>(len);
    // SAFETY: freshly carved, so nothing else refers to it; the caller vouches for the
    // memory's lifetime and that no other thread uses it.
    unsafe {
        let all = shared.all_mut();
        core::slice::from_raw_parts_mut(all.as_mut_ptr(), all.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Class;

    #[test]
    fn rank_counts_kernels_cannot_use_are_refused() {
        let s = |kernel, class| Spec { kernel, class };
        assert_eq!(supports(s(Kernel::Ep, Class::S), 3), Ok(()));
        assert!(supports(s(Kernel::Is, Class::S), 3).is_err());
        assert!(supports(s(Kernel::Cg, Class::S), 6).is_err());
        assert_eq!(supports(s(Kernel::Cg, Class::S), 4), Ok(()));
        assert_eq!(supports(s(Kernel::Mg, Class::S), 2), Ok(()));
        assert!(supports(s(Kernel::Mg, Class::S), 3).is_err());
        assert!(supports(s(Kernel::Mg, Class::S), 12).is_err());
        assert_eq!(supports(s(Kernel::Mg, Class::S), 64), Ok(()));
        assert!(supports(s(Kernel::Sp, Class::S), 2).is_err());
        assert_eq!(supports(s(Kernel::Lu, Class::S), 16), Ok(()));
        assert!(supports(s(Kernel::Lu, Class::S), 32).is_err());
        assert!(supports(s(Kernel::Lu, Class::W), 6).is_err());
        assert_eq!(supports(s(Kernel::Sp, Class::S), 4), Ok(()));
        assert!(supports(s(Kernel::Bt, Class::W), 8).is_err());
        assert_eq!(supports(s(Kernel::Bt, Class::W), 9), Ok(()));
        assert_eq!(supports(s(Kernel::Ft, Class::S), 64), Ok(()));
        assert!(supports(s(Kernel::Ft, Class::W), 64).is_err());
        assert!(supports(s(Kernel::Ep, Class::S), 0).is_err());
        assert!(supports(s(Kernel::Ep, Class::S), 65).is_err());
        // run() refuses them too, on every rank, without communicating.
        let spec = Spec {
            kernel: Kernel::Is,
            class: Class::S,
        };
        let errors = host::run_ranks(3, 64, |comm, arena| run(spec, comm, arena).err());
        assert!(
            errors
                .iter()
                .all(|e| *e == Some(Error("unsupported-ranks")))
        );
    }

    /// The kernels that have an MPI form.
    const MPI_KERNELS: [Kernel; 8] = [
        Kernel::Ep,
        Kernel::Is,
        Kernel::Cg,
        Kernel::Ft,
        Kernel::Mg,
        Kernel::Lu,
        Kernel::Sp,
        Kernel::Bt,
    ];

    #[test]
    fn every_mpi_kernel_verifies_at_s_on_1_2_4_ranks_alike_within_its_heap() {
        // The arena panics if a kernel takes more than heap_bytes. (SP, BT: 1 and 4.)
        for kernel in MPI_KERNELS {
            for ranks in [1, 2, 4] {
                let spec = Spec {
                    kernel,
                    class: Class::S,
                };
                if supports(spec, ranks).is_err() {
                    continue;
                }
                let bytes = heap_bytes(spec, ranks);
                let runs = host::run_ranks(ranks, bytes, |comm, arena| {
                    (run(spec, comm, arena).unwrap(), arena.used())
                });
                for (outcome, used) in &runs {
                    assert!(
                        outcome.verified && outcome.seconds > 0.0,
                        "{spec} on {ranks}: {outcome:?}"
                    );
                    assert_eq!(outcome.values, runs[0].0.values, "{spec}: ranks disagree");
                    assert!(*used <= bytes, "{spec} on {ranks}: {used} of {bytes}");
                }
            }
        }
    }

    #[test]
    fn every_mpi_kernel_but_ep_verifies_at_w_on_2_ranks() {
        for kernel in [Kernel::Is, Kernel::Cg, Kernel::Ft, Kernel::Mg] {
            let spec = Spec {
                kernel,
                class: Class::W,
            };
            let outcomes = host::run_ranks(2, heap_bytes(spec, 2), |comm, arena| {
                run(spec, comm, arena).unwrap()
            });
            assert!(outcomes[0].verified, "{spec}: {:?}", outcomes[0]);
        }
    }
}
