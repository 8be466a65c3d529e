//! The guest MPI's shared-memory channels (`guests/user/src/mpi.rs`, `Mpi::init_shared`)
//! on the host: ranks are threads, groups of them share a block of memory (as the
//! ranks of one VM do), the others meet on the in-memory wire of `kumo_lab::loopback`. The
//! NPB-MPI kernels must give every placement the same bits as the wire alone, and
//! messages larger than a ring must stream through it.

use kumo_lab::guest_mpi as mpi;
use kumo_lab::loopback::{MemoryLink, Wire};
use mpi::{Config, Mpi, Shared, Wait};

use crate::comm;

use npb::team::Arena;
use npb::{Class, Kernel, Outcome, Spec};

/// The rings' size: small, so that NPB's larger messages wrap and stream.
const WINDOW: u64 = 64 << 10;

/// Runs `job` on `ranks` threads; ranks `g * group .. (g + 1) * group` share memory
/// (`group` 1: none do), all of them are on one wire.
fn run_grouped<T: Send>(
    ranks: usize,
    group: usize,
    wait: Wait,
    job: impl Fn(usize, &mut Mpi<MemoryLink>) -> T + Sync,
) -> Vec<T> {
    let wire = Wire::new(ranks, 0);
    // One zeroed block per group, as the guest's master zeroes its VM's.
    let blocks: Vec<Vec<u64>> = (0..ranks / group)
        .map(|_| vec![0u64; (Shared::bytes(group, WINDOW) / 8) as usize])
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (wire, job, blocks) = (&wire, &job, &blocks);
                scope.spawn(move || {
                    let shared = (group > 1).then(|| Shared {
                        first: rank / group * group,
                        count: group,
                        base: blocks[rank / group].as_ptr() as u64,
                        cpu: rank as u32,
                    });
                    let cfg = Config {
                        rank,
                        size: ranks,
                        wait,
                        tsc_khz: 1_000_000,
                        spin_ticks: 20_000,
                        timeout_ms: 20_000,
                        window: WINDOW,
                        drop_every: 0,
                    };
                    let mut memory: Vec<Vec<u8>> = Vec::new();
                    let mut mpi =
                        Mpi::init_shared(MemoryLink::new(rank, wire), cfg, shared, |bytes| {
                            let mut block = vec![0u8; bytes as usize];
                            let at = block.as_mut_ptr() as u64;
                            memory.push(block);
                            Some(at)
                        })
                        .unwrap_or_else(|e| panic!("rank {rank}: init: {e:?}"));
                    let result = job(rank, &mut mpi);
                    mpi.finish()
                        .unwrap_or_else(|e| panic!("rank {rank}: finish: {e:?}"));
                    drop(mpi);
                    drop(memory);
                    result
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn npb(spec: Spec, ranks: usize, group: usize, wait: Wait) -> Vec<Outcome> {
    let heap = npb::mpi::heap_bytes(spec, ranks);
    run_grouped(ranks, group, wait, |rank, mpi| {
        let mut heap_memory = vec![0u64; heap / 8 + 8];
        // SAFETY: the vector outlives the arena and is this thread's alone.
        let mut arena =
            unsafe { Arena::new(heap_memory.as_mut_ptr().cast(), heap_memory.len() * 8) };
        let mut comm = comm::MpiComm {
            mpi,
            tsc_khz: 1_000_000,
            progress: comm::Progress::new(|_, _| {}),
        };
        npb::mpi::run(spec, &mut comm, &mut arena)
            .unwrap_or_else(|e| panic!("rank {rank}: {spec}: {e}"))
    })
}

#[test]
#[ignore = "10 s; multirank's four ranks on one vCPU stay in the default run: .ci/run runs it with --include-ignored"]
fn npb_kernels_give_the_same_bits_over_shared_memory_as_over_the_wire() {
    for kernel in [Kernel::Cg, Kernel::Is, Kernel::Ft, Kernel::Mg] {
        let spec = Spec {
            kernel,
            class: Class::S,
        };
        let wire = npb(spec, 4, 1, Wait::Block);
        assert!(wire[0].verified, "{spec}: {:?}", wire[0]);
        // Two "VMs" of two ranks, and one of four; spinning and yielding waits.
        for (group, wait) in [(2, Wait::Spin), (4, Wait::Yield)] {
            let shared = npb(spec, 4, group, wait);
            for (rank, outcome) in shared.iter().enumerate() {
                assert!(outcome.verified, "{spec} group {group} rank {rank}");
                assert_eq!(outcome.values, wire[0].values, "{spec} group {group}");
            }
        }
    }
}

#[test]
fn messages_larger_than_a_ring_stream_through_it_in_order() {
    let big = 5 * WINDOW as usize + 123;
    let got = run_grouped(2, 2, Wait::Block, |rank, mpi| {
        let out: Vec<u8> = (0..big).map(|i| (i * 7 + rank) as u8).collect();
        let mut inn = vec![0u8; big];
        let other = 1 - rank;
        // Both ways at once, then a few small ones behind it from each side.
        let n = mpi.sendrecv(other, 5, &out, other, 5, &mut inn).unwrap();
        let mut small = [0u8; 3];
        for tag in 0..3u32 {
            mpi.send(other, 10 + tag, &[tag as u8; 3]).unwrap();
        }
        let mut tags = Vec::new();
        for tag in 0..3u32 {
            assert_eq!(mpi.recv(other, 10 + tag, &mut small).unwrap(), 3);
            tags.push(small[0]);
        }
        (
            n,
            inn == (0..big).map(|i| (i * 7 + other) as u8).collect::<Vec<u8>>(),
            tags,
        )
    });
    for (rank, (n, same, tags)) in got.into_iter().enumerate() {
        assert_eq!(n, big, "rank {rank}");
        assert!(same, "rank {rank}: the bytes differ");
        assert_eq!(tags, [0, 1, 2], "rank {rank}");
    }
}
