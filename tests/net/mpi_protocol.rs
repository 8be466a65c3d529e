//! The guest's MPI protocol (`guests/user/src/mpi.rs`, the same source file) on the
//! host: ranks are threads, the wire is in memory and can drop frames. Every message
//! must arrive whole, in order and once, collectives must agree, and a lossy wire
//! must cost only resends. (The guest runs the same code over virtio-net: see
//! `tests/qemu_net.rs`.)

use kumo_lab::guest_mpi as mpi;

use mpi::{Error, Mpi, Op, Request};

use std::time::Duration;

use kumo_lab::loopback as wire;
use wire::{MemoryLink, Wire};

/// Runs `job(mpi)` on `ranks` threads over one wire (64 KiB windows, so messages wrap
/// the rings many times); returns each rank's result.
fn run<T: Send>(
    ranks: usize,
    drop_one_in: u64,
    job: impl Fn(&mut Mpi<MemoryLink>) -> Result<T, Error> + Sync,
) -> Vec<T> {
    wire::run_ranks(ranks, drop_one_in, 64 << 10, |rank, mpi| {
        job(mpi).unwrap_or_else(|e| panic!("rank {rank}: {e:?}"))
    })
    .into_iter()
    .map(|(result, _)| result)
    .collect()
}

fn pattern(key: u64, len: usize) -> Vec<u8> {
    let mut x = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Message sizes both ranks derive from the round number: empty, small, a frame's
/// worth and around it, several windows.
fn size_of(round: u64) -> usize {
    match round % 7 {
        0 => 0,
        1 => (round * 37 % 64) as usize,
        2 => mpi::PAYLOAD - 16 + (round % 3) as usize,
        3 => (round * 1009 % 4096) as usize,
        4 => (round * 7919 % 70_000) as usize,
        5 => 300_000 + (round * 13 % 1000) as usize,
        _ => (round * 104_729 % 20_000) as usize,
    }
}

/// Rank 0 and 1 exchange `rounds` messages: one way each way, then both at once;
/// returns the number of wrong or missing bytes seen by this rank, and the stats.
fn exchange(mpi: &mut Mpi<MemoryLink>, rounds: u64) -> Result<(u64, mpi::Stats), Error> {
    let (me, other) = (mpi.rank(), 1 - mpi.rank());
    let mut bad = 0u64;
    for round in 0..rounds {
        let len = size_of(round);
        let mine = pattern(round * 2 + me as u64, len);
        let theirs = pattern(round * 2 + other as u64, len);
        let mut buf = vec![0u8; len];
        let tag = round as u32 % 100;
        if round % 3 == 2 {
            let got = mpi.sendrecv(other, tag, &mine, other, tag, &mut buf)?;
            bad += u64::from(got != len) + count_wrong(&buf, &theirs);
        } else if (round % 2 == 0) == (me == 0) {
            mpi.send(other, tag, &mine)?;
        } else {
            let got = mpi.recv(other, tag, &mut buf)?;
            bad += u64::from(got != len) + count_wrong(&buf, &theirs);
        }
    }
    Ok((bad, mpi.stats))
}

fn count_wrong(got: &[u8], want: &[u8]) -> u64 {
    got.iter().zip(want).filter(|(a, b)| a != b).count() as u64
}

#[test]
fn messages_of_every_size_arrive_whole_and_in_order_on_a_perfect_wire() {
    let results = run(2, 0, |mpi| exchange(mpi, 120));
    for (rank, (bad, stats)) in results.iter().enumerate() {
        assert_eq!(*bad, 0, "rank {rank}");
        assert_eq!(stats.out_of_order, 0, "rank {rank}");
    }
}

#[test]
fn a_wire_that_drops_one_frame_in_fifty_loses_nothing() {
    let results = run(2, 50, |mpi| exchange(mpi, 80));
    let mut resent = 0;
    for (rank, (bad, stats)) in results.iter().enumerate() {
        assert_eq!(*bad, 0, "rank {rank}");
        resent += stats.resent;
    }
    assert!(resent > 0, "nothing was resent: was anything dropped?");
}

/// Ranks 0 and 1 run 14 rounds of [`exchange`] over `wire`; per rank, its wrong bytes
/// and stats, and the frames its link dropped.
fn exchange_over(wire: Wire) -> Vec<((u64, mpi::Stats), u64)> {
    wire::run_ranks_with(wire, 64 << 10, mpi::Wait::Block, |rank, mpi| {
        exchange(mpi, 14).unwrap_or_else(|e| panic!("rank {rank}: {e:?}"))
    })
}

#[test]
fn a_slow_wire_costs_probes_not_resends() {
    // Every frame takes 30 ms to arrive, three retransmission timeouts, as frames do
    // queued behind a busy domain 0. Nothing is lost: a timeout may send its one probe,
    // but the probe's answer must not send again what is still on its way.
    let results = exchange_over(Wire::new(2, 0).delayed(Duration::from_millis(30)));
    let (mut timeouts, mut resent) = (0, 0);
    for (rank, ((bad, stats), _)) in results.iter().enumerate() {
        assert_eq!(*bad, 0, "rank {rank}");
        timeouts += stats.timeouts;
        resent += stats.resent;
    }
    assert!(
        timeouts > 0,
        "no timeout: the wire was not slow enough to test this"
    );
    assert!(
        resent <= timeouts,
        "{resent} frames resent for {timeouts} timeouts on a wire that lost nothing"
    );
}

#[test]
fn a_slow_wire_that_drops_one_frame_in_fifty_loses_nothing() {
    // Losses found by probes whose answers come late: the probe that fills a hole
    // still brings the rest back.
    let results = exchange_over(Wire::new(2, 50).delayed(Duration::from_millis(30)));
    for (rank, ((bad, _), dropped)) in results.iter().enumerate() {
        assert_eq!(*bad, 0, "rank {rank}");
        assert!(*dropped > 0, "rank {rank}: the wire dropped nothing");
    }
}

#[test]
fn nonblocking_requests_complete_in_any_order() {
    let results = run(2, 0, |mpi| {
        let (me, other) = (mpi.rank(), 1 - mpi.rank());
        let sizes = [10usize, 200_000, 0, 3000];
        let out: Vec<Vec<u8>> = (0..4)
            .map(|k| pattern(100 + k as u64 * 2 + me as u64, sizes[k]))
            .collect();
        let mut inn: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        {
            let mut slots = inn.iter_mut();
            let mut requests: Vec<Request> = Vec::new();
            for (k, data) in out.iter().enumerate() {
                requests.push(mpi.irecv(other, k as u32, slots.next().unwrap())?);
                requests.push(mpi.isend(other, k as u32, data)?);
            }
            // Waited for in reverse: later ones are served after earlier ones anyway.
            requests.reverse();
            mpi.waitall(&mut requests)?;
        }
        Ok((0..4)
            .map(|k| {
                count_wrong(
                    &inn[k],
                    &pattern(100 + k as u64 * 2 + other as u64, sizes[k]),
                )
            })
            .sum::<u64>())
    });
    assert_eq!(results, vec![0, 0]);
}

#[test]
fn four_ranks_agree_on_barrier_bcast_allreduce_and_alltoallv() {
    assert_eq!(run(4, 0, collectives), vec![0; 4]);
}

#[test]
fn four_ranks_agree_on_the_collectives_over_a_lossy_wire() {
    assert_eq!(run(4, 40, collectives), vec![0; 4]);
}

/// Every collective, checked; returns how many values were wrong on this rank.
fn collectives(mpi: &mut Mpi<MemoryLink>) -> Result<u64, Error> {
    let (rank, size) = (mpi.rank(), mpi.size());
    let mut failed = 0u64;
    for _ in 0..5 {
        mpi.barrier()?;
    }
    for root in 0..size {
        let want = pattern(500 + root as u64, 100_000);
        let mut buf = if rank == root {
            want.clone()
        } else {
            vec![0; want.len()]
        };
        mpi.bcast(root, &mut buf)?;
        failed += u64::from(buf != want);
    }
    // Sums of (r + 1) * (i + 1) / 2 are exact; larger than the reduce scratch.
    let n = 40_000;
    let s = size as f64;
    for (op, expect) in [
        (Op::Sum, s * (s + 1.0) / 4.0),
        (Op::Max, s / 2.0),
        (Op::Min, 0.5),
    ] {
        let mut values: Vec<f64> = (0..n)
            .map(|i| (rank as f64 + 1.0) * (i as f64 + 1.0) * 0.5)
            .collect();
        mpi.allreduce_f64(&mut values, op)?;
        failed += values
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != expect * (i as f64 + 1.0))
            .count() as u64;
    }
    for (op, expect) in [(Op::Sum, -6i64), (Op::Max, 0), (Op::Min, -3)] {
        let mut values: Vec<i64> = (0..5).map(|i| (rank as i64 - 3) * (i + 1)).collect();
        mpi.allreduce_i64(&mut values, op)?;
        failed += values
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != expect * (i as i64 + 1))
            .count() as u64;
    }
    // alltoallv: rank i sends count(i, j) bytes of pattern (i, j) to rank j.
    let count = |i: usize, j: usize| (i * 5003 + j * 7001) % 9000;
    let mut send = Vec::new();
    let mut send_layout = ([0usize; mpi::MAX_RANKS], [0usize; mpi::MAX_RANKS]);
    let mut recv_layout = ([0usize; mpi::MAX_RANKS], [0usize; mpi::MAX_RANKS]);
    let mut recv_len = 0;
    for j in 0..size {
        send_layout.0[j] = count(rank, j);
        send_layout.1[j] = send.len();
        send.extend(pattern(((rank as u64) << 8) | j as u64, count(rank, j)));
        recv_layout.0[j] = count(j, rank);
        recv_layout.1[j] = recv_len;
        recv_len += count(j, rank);
    }
    let mut recv = vec![0u8; recv_len];
    mpi.alltoallv(&send, &send_layout, &mut recv, &recv_layout)?;
    for i in 0..size {
        let got = &recv[recv_layout.1[i]..recv_layout.1[i] + recv_layout.0[i]];
        failed += u64::from(got != pattern(((i as u64) << 8) | rank as u64, count(i, rank)));
    }
    Ok(failed)
}

#[test]
fn a_receive_naming_another_tag_is_an_error_not_a_mixup() {
    let results = run(2, 0, |mpi| {
        if mpi.rank() == 0 {
            mpi.send(1, 7, b"seven")?;
            return Ok(None);
        }
        let mut buf = [0u8; 16];
        let wrong = mpi.recv(0, 8, &mut buf);
        let right = mpi.recv(0, 7, &mut buf);
        Ok(Some((format!("{wrong:?}"), right.ok(), buf)))
    });
    let (wrong, right, buf) = results[1].clone().unwrap();
    assert_eq!(wrong, "Err(TagMismatch { expected: 8, got: 7 })");
    assert_eq!(right, Some(5));
    assert_eq!(&buf[..5], b"seven");
}
