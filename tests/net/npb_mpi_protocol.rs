//! The NPB-MPI kernels over the guest's own MPI (`guests/user/src/mpi.rs`) and its
//! `Comm` adapter (`guests/user/src/comm.rs`), the same source files, on the host:
//! ranks are threads, the wire is in memory (as `tests/mpi_protocol.rs`) and may drop
//! frames. EP, IS, CG, FT and LU must verify at class S on 1, 2 and 4 ranks, and IS,
//! CG and LU on a lossy wire, with every rank agreeing.

// `comm.rs` names the MPI `crate::mpi`, as the guest runtime does: the binary root
// (main.rs) imports it under that name.

use crate::comm;

use npb::mpi::Comm;
use npb::team::Arena;
use npb::{Class, Kernel, Outcome, Spec};

use kumo_lab::loopback as wire;

/// Runs `spec` on `ranks` threads, each an `Mpi` over one wire behind the guest's
/// adapter with its own arena; returns each rank's outcome and the frames its link
/// dropped.
fn run(spec: Spec, ranks: usize, drop_one_in: u64) -> Vec<(Outcome, u64)> {
    let heap = npb::mpi::heap_bytes(spec, ranks);
    wire::run_ranks(ranks, drop_one_in, 256 << 10, |rank, mpi| {
        let mut heap_memory = vec![0u64; heap / 8 + 8];
        // SAFETY: the vector outlives the arena and is this thread's alone.
        let mut arena =
            unsafe { Arena::new(heap_memory.as_mut_ptr().cast(), heap_memory.len() * 8) };
        let mut comm = comm::MpiComm {
            mpi,
            tsc_khz: 1_000_000,
            progress: comm::Progress::new(|_, _| {}),
        };
        assert_eq!((comm.rank(), comm.size()), (rank, ranks));
        npb::mpi::run(spec, &mut comm, &mut arena)
            .unwrap_or_else(|e| panic!("rank {rank}: {spec}: {e}"))
    })
}

/// Every rank verified and agrees; returns the frames the wire dropped.
fn assert_verified(spec: Spec, ranks: usize, drop_one_in: u64) -> u64 {
    let results = run(spec, ranks, drop_one_in);
    let dropped = results.iter().map(|(_, d)| d).sum();
    let outcomes: Vec<Outcome> = results.into_iter().map(|(o, _)| o).collect();
    assert_eq!(outcomes.len(), ranks);
    for (rank, o) in outcomes.iter().enumerate() {
        assert!(o.verified, "{spec} rank {rank} of {ranks}: {o:?}");
        // Reductions give every rank the same bits.
        assert_eq!(
            o.values, outcomes[0].values,
            "{spec} rank {rank} of {ranks}"
        );
    }
    dropped
}

fn spec(kernel: Kernel) -> Spec {
    Spec {
        kernel,
        class: Class::S,
    }
}

#[test]
fn ep_class_s_verifies_on_1_2_4_ranks() {
    for ranks in [1, 2, 4] {
        assert_eq!(assert_verified(spec(Kernel::Ep), ranks, 0), 0);
    }
}

#[test]
fn is_class_s_verifies_on_1_2_4_ranks() {
    for ranks in [1, 2, 4] {
        assert_eq!(assert_verified(spec(Kernel::Is), ranks, 0), 0);
    }
}

#[test]
fn cg_class_s_verifies_on_1_2_4_ranks() {
    for ranks in [1, 2, 4] {
        assert_eq!(assert_verified(spec(Kernel::Cg), ranks, 0), 0);
    }
}

#[test]
fn ft_class_s_verifies_on_1_2_4_ranks() {
    for ranks in [1, 2, 4] {
        assert_eq!(assert_verified(spec(Kernel::Ft), ranks, 0), 0);
    }
}

/// LU's sweeps send a plane's edge to each downstream neighbour per plane: many
/// small messages between fixed pairs, in pipeline order.
#[test]
fn lu_class_s_verifies_on_1_2_4_ranks_and_on_a_lossy_wire() {
    for ranks in [1, 2, 4] {
        assert_eq!(assert_verified(spec(Kernel::Lu), ranks, 0), 0);
    }
    // One frame in 40 lost: the pipeline's edges resent underneath.
    assert!(assert_verified(spec(Kernel::Lu), 4, 40) > 0);
}

#[test]
fn is_and_cg_verify_on_a_lossy_wire() {
    // One frame in 40 lost: go-back-N resends underneath the kernels' collectives.
    assert!(assert_verified(spec(Kernel::Is), 2, 40) > 0);
    assert!(assert_verified(spec(Kernel::Cg), 2, 40) > 0);
}

/// Each rank shows a kernel's timed loop in at most `PROGRESS_STEPS` steps, the last
/// one its end: what a node reads of an MPI job while it runs (`kumo experiment s5`).
#[test]
fn a_kernel_shows_its_progress_to_the_end_in_at_most_twenty_steps() {
    use std::sync::Mutex;
    static SHOWN: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let spec = Spec {
        kernel: Kernel::Cg,
        class: Class::S,
    };
    let heap = npb::mpi::heap_bytes(spec, 1);
    wire::run_ranks(1, 0, 256 << 10, |_, mpi| {
        let mut heap_memory = vec![0u64; heap / 8 + 8];
        // SAFETY: the vector outlives the arena and is this thread's alone.
        let mut arena =
            unsafe { Arena::new(heap_memory.as_mut_ptr().cast(), heap_memory.len() * 8) };
        let mut comm = comm::MpiComm {
            mpi,
            tsc_khz: 1_000_000,
            progress: comm::Progress::new(|done, of| SHOWN.lock().unwrap().push((done, of))),
        };
        npb::mpi::run(spec, &mut comm, &mut arena).unwrap()
    });
    let shown = SHOWN.lock().unwrap().clone();
    // CG.S: 15 iterations, each past a twentieth of the loop: all 15 shown.
    assert_eq!(shown.len(), 15, "{shown:?}");
    assert!(shown.len() <= comm::PROGRESS_STEPS);
    assert!(shown.windows(2).all(|w| w[0].0 < w[1].0), "{shown:?}");
    assert_eq!(shown.last(), Some(&(15, 15)));
}
