//! EP as NPB-MPI's `ep.f` runs it: rank `r` of `s` computes its contiguous, balanced
//! share of the batches (each batch starts its own jump-ahead of the stream, so the
//! split does not change the numbers), then `sx`, `sy` and the ten annulus counts are
//! summed over the ranks with allreduce. Verified as the shared-memory EP.

use super::{Comm, Error, Op, max_seconds};
use crate::ep::{self, Partial, SCRATCH_LEN};
use crate::team::Arena;
use crate::{Class, Outcome, Values};

/// Arena bytes of one rank: one batch's random numbers, and alignment.
pub fn heap_bytes() -> usize {
    SCRATCH_LEN * core::mem::size_of::<f64>() + 64
}

/// This rank's batches, then the reductions; timed from a barrier to the end of the
/// reductions, the slowest rank's time reported.
pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let scratch = arena.alloc::<f64>(SCRATCH_LEN);
    // SAFETY: one thread per rank and arena; nothing else holds this array.
    let scratch = unsafe { scratch.all_mut() };
    comm.barrier()?;
    let start = comm.seconds();
    let range = ep::batch_range(
        ep::batches(ep::m(class)),
        comm.rank() as u32,
        comm.size() as u32,
    );
    let part = ep::run_batches(range, scratch);
    let total = reduce(comm, &part)?;
    let seconds = max_seconds(comm, comm.seconds() - start)?;
    let mut values = Values::new();
    values.push("sx", total.sx);
    values.push("sy", total.sy);
    values.push("pairs", total.pairs() as f64);
    Ok(Outcome {
        seconds,
        mops: ep::mops(class, seconds),
        verified: ep::verify(class, &total),
        values,
    })
}

/// The sums and counts of every rank (`MPI_Allreduce` of `sx, sy` and `q`).
fn reduce<C: Comm + ?Sized>(comm: &mut C, part: &Partial) -> Result<Partial, Error> {
    let mut sums = [part.sx, part.sy];
    comm.allreduce_f64(&mut sums, Op::Sum)?;
    let mut counts = [0i64; ep::NQ];
    for (c, &q) in counts.iter_mut().zip(&part.q) {
        *c = q as i64;
    }
    comm.allreduce_i64(&mut counts, Op::Sum)?;
    let mut total = Partial {
        sx: sums[0],
        sy: sums[1],
        q: [0; ep::NQ],
    };
    for (q, &c) in total.q.iter_mut().zip(&counts) {
        *q = c as u64;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::super::host;
    use super::*;

    #[test]
    fn class_s_verifies_on_1_2_4_ranks_with_the_same_counts() {
        for ranks in [1, 2, 4] {
            let outcomes = host::run_ranks(ranks, heap_bytes(), |comm, arena| {
                run(Class::S, comm, arena).unwrap()
            });
            for o in &outcomes {
                assert!(o.verified && o.seconds > 0.0, "{ranks} ranks: {o:?}");
                assert_eq!(o, &outcomes[0], "ranks disagree");
            }
            let got = outcomes[0].values.iter().find(|(k, _)| *k == "pairs");
            // The reference's class S count of Gaussian pairs.
            assert_eq!(got, Some(("pairs", 13_176_389.0)));
        }
    }
}
