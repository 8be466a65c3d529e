//! IS decomposed as NPB-MPI's `is.c`: rank `r` of `s` (a power of two) generates and
//! owns keys `r*N/s .. (r+1)*N/s` of the sequence. Each ranking:
//!
//! 1. rank 0 alters keys `iteration` and `iteration + 10` (they are its own);
//! 2. each rank counts its keys per bucket; the counts are allreduced;
//! 3. whole buckets are assigned to ranks in order, a rank taking the buckets whose
//!    keys start in its `N/s` share of the sorted order (about `N/s` keys each);
//! 4. each rank groups its keys by bucket, exchanges the per-rank counts with alltoall
//!    and the keys with alltoallv;
//! 5. each rank ranks the keys it received (counts per key value, prefix sum starting
//!    at the number of keys in lower buckets) and checks the test keys whose values
//!    fall in its range (partial verification).
//!
//! After the ten timed rankings, full verification: each rank places its keys at their
//! ranks and checks their order, then every rank's count, first and last key are
//! allreduced and checked in rank order (`is.c` passes each rank's last key to the
//! next instead), and the counts must add up to all the keys.
//!
//! Differences from `is.c`, none of which changes a rank or a count: the test keys'
//! values are read once before the timed loop and allreduced (they are never among the
//! altered keys), and the bucket-to-rank assignment rule is "where the bucket's keys
//! start" rather than `is.c`'s running threshold.

use super::{Comm, Error, MAX_RANKS, Op, bytes, bytes_mut, max_seconds, take};
use crate::is::{self, ITERATIONS, SEED, TEST_KEYS};
use crate::random::{self, A};
use crate::team::Arena;
use crate::{Class, Outcome, Values};

/// Keys a rank may receive in one ranking: its share and the largest bucket's excess,
/// bounded by twice its share (checked at run time: overflow is an error).
fn receive_capacity(class: Class, ranks: usize) -> usize {
    let n = is::keys(class);
    (2 * n / ranks).min(n)
}

/// Arena bytes of one rank: its keys, the keys grouped by bucket, the received keys and
/// their sorted copy, the per-value counts, two bucket tables, and alignment.
pub fn heap_bytes(class: Class, ranks: usize) -> usize {
    let share = is::keys(class) / ranks;
    let cap = receive_capacity(class, ranks);
    let slack = 64;
    2 * (share * 4 + slack)
        + 2 * (cap * 4 + slack)
        + is::max_key(class) * 4
        + slack
        + 2 * (is::buckets(class) * 8 + slack)
}

/// This rank's arrays.
struct Arrays<'a> {
    keys: &'a mut [i32],
    grouped: &'a mut [i32],
    received: &'a mut [i32],
    sorted: &'a mut [i32],
    /// Per key value of this rank's buckets: count, then how many keys are `<=` it.
    counts: &'a mut [i32],
    /// This rank's keys per bucket, then the allreduced totals.
    local: &'a mut [i64],
    totals: &'a mut [i64],
}

/// What one ranking leaves for the full verification.
struct Ranked {
    /// Keys received.
    len: usize,
    /// Key values this rank ranked: `values.0 .. values.1`.
    values: (usize, usize),
    /// Keys in lower buckets (this rank's first rank).
    lesser: usize,
}

pub fn run<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    arena: &mut Arena,
) -> Result<Outcome, Error> {
    let (me, size) = (comm.rank(), comm.size());
    let n = is::keys(class);
    let share = n / size;
    let cap = receive_capacity(class, size);
    let nb = is::buckets(class);
    // SAFETY: for each take: one thread per rank and arena; these arrays are
    // distinct and nothing else refers to them.
    let mut a = unsafe {
        Arrays {
            keys: take::<i32>(arena, share),
            grouped: take::<i32>(arena, share),
            received: take::<i32>(arena, cap),
            sorted: take::<i32>(arena, cap),
            counts: take::<i32>(arena, is::max_key(class)),
            local: take::<i64>(arena, nb),
            totals: take::<i64>(arena, nb),
        }
    };

    // Keys `me*share..`: the stream skipped past four numbers per earlier key.
    let scale = (is::max_key(class) / 4) as f64;
    let mut seed = random::skip(SEED, A, 4 * (me * share) as u64);
    for key in a.keys.iter_mut() {
        let mut x = random::randlc(&mut seed, A);
        x += random::randlc(&mut seed, A);
        x += random::randlc(&mut seed, A);
        x += random::randlc(&mut seed, A);
        *key = (scale * x) as i32;
    }
    // The test keys' values, from their owners.
    let mut test_values = [-1i64; TEST_KEYS];
    for (value, &at) in test_values.iter_mut().zip(&is::test_index(class)) {
        if at / share == me {
            *value = i64::from(a.keys[at - me * share]);
        }
    }
    comm.allreduce_i64(&mut test_values, Op::Max)?;

    // One free ranking, as the reference.
    rank(class, comm, &mut a, &test_values, 1)?;
    comm.barrier()?;
    let start = comm.seconds();
    let mut passed = 0i64;
    let mut last = None;
    for iteration in 1..=ITERATIONS {
        let (ok, ranked) = rank(class, comm, &mut a, &test_values, iteration)?;
        passed += ok;
        last = Some(ranked);
        comm.progress(iteration, ITERATIONS);
    }
    let seconds = max_seconds(comm, comm.seconds() - start)?;
    let ranked = last.ok_or(Error("no-ranking"))?;
    let sorted = full_verify(comm, &mut a, &ranked, n)?;
    let mut checks = [passed + i64::from(sorted)];
    comm.allreduce_i64(&mut checks, Op::Sum)?;
    // Full verification counts once (every rank agrees on it), not once per rank.
    let passed = checks[0] - (size as i64 - 1) * i64::from(sorted);

    let mut values = Values::new();
    values.push("passed", passed as f64);
    values.push("checks", f64::from(is::CHECKS));
    Ok(Outcome {
        seconds,
        mops: is::mops(class, seconds),
        verified: passed == i64::from(is::CHECKS),
        values,
    })
}

/// One ranking; returns how many test keys this rank found at their official rank.
fn rank<C: Comm + ?Sized>(
    class: Class,
    comm: &mut C,
    a: &mut Arrays,
    test_values: &[i64; TEST_KEYS],
    iteration: usize,
) -> Result<(i64, Ranked), Error> {
    let (me, size) = (comm.rank(), comm.size());
    let n = is::keys(class);
    let nb = is::buckets(class);
    let width = is::max_key(class) / nb;
    let shift = width.trailing_zeros();
    if me == 0 {
        a.keys[iteration] = iteration as i32;
        a.keys[iteration + ITERATIONS] = (is::max_key(class) - iteration) as i32;
    }

    // Bucket counts, local and global.
    a.local.fill(0);
    for &key in a.keys.iter() {
        a.local[(key >> shift) as usize] += 1;
    }
    a.totals.copy_from_slice(a.local);
    comm.allreduce_i64(a.totals, Op::Sum)?;

    // Buckets to ranks: bucket b goes to the rank whose share of the sorted order
    // holds its first key. `first[j]` is rank j's first bucket.
    let mut first = [nb; MAX_RANKS + 1];
    let mut lesser = [0usize; MAX_RANKS + 1];
    let mut start = 0usize;
    let mut next_owner = 0;
    for b in 0..nb {
        let owner = (start * size / n).min(size - 1);
        while next_owner <= owner {
            first[next_owner] = b;
            lesser[next_owner] = start;
            next_owner += 1;
        }
        start += a.totals[b] as usize;
    }
    while next_owner <= size {
        first[next_owner] = nb;
        lesser[next_owner] = n;
        next_owner += 1;
    }

    // Group this rank's keys by bucket.
    let mut next = [0usize; 1024];
    let next = &mut next[..nb];
    let mut at = 0;
    for (b, slot) in next.iter_mut().enumerate() {
        *slot = at;
        at += a.local[b] as usize;
    }
    let bucket_start: [usize; MAX_RANKS + 1] = {
        let mut s = [0usize; MAX_RANKS + 1];
        for j in 0..=size {
            s[j] = if first[j] < nb {
                next[first[j]]
            } else {
                a.keys.len()
            };
        }
        s
    };
    for &key in a.keys.iter() {
        let slot = &mut next[(key >> shift) as usize];
        a.grouped[*slot] = key;
        *slot += 1;
    }

    // Counts to every rank, then the keys.
    let mut send_counts = [0i64; MAX_RANKS];
    for j in 0..size {
        send_counts[j] = (bucket_start[j + 1] - bucket_start[j]) as i64;
    }
    let mut recv_counts = [0i64; MAX_RANKS];
    comm.alltoall(
        bytes(&send_counts[..size]),
        bytes_mut(&mut recv_counts[..size]),
    )?;
    let mut sc = [0usize; MAX_RANKS];
    let mut sd = [0usize; MAX_RANKS];
    let mut rc = [0usize; MAX_RANKS];
    let mut rd = [0usize; MAX_RANKS];
    let mut total = 0usize;
    for j in 0..size {
        sc[j] = send_counts[j] as usize * 4;
        sd[j] = bucket_start[j] * 4;
        rc[j] = recv_counts[j] as usize * 4;
        rd[j] = total * 4;
        total += recv_counts[j] as usize;
    }
    if total > a.received.len() {
        return Err(Error("is-receive-overflow"));
    }
    comm.alltoallv(
        bytes(a.grouped),
        &sc[..size],
        &sd[..size],
        bytes_mut(a.received),
        &rc[..size],
        &rd[..size],
    )?;

    // Rank the received keys: counts per value, prefix sums from `lesser`.
    let values = (first[me] * width, first[me + 1] * width);
    let counts = &mut a.counts[..values.1 - values.0];
    counts.fill(0);
    for &key in &a.received[..total] {
        let v = key as usize;
        if !(values.0..values.1).contains(&v) {
            return Err(Error("is-key-out-of-range"));
        }
        counts[v - values.0] += 1;
    }
    let mut running = lesser[me] as i32;
    for c in counts.iter_mut() {
        running += *c;
        *c = running;
    }

    // Partial verification: the test keys whose values this rank ranked.
    let mut passed = 0;
    for (test, &value) in test_values.iter().enumerate() {
        let k = value as usize;
        if value > 0 && k < n && (values.0..values.1).contains(&k) {
            // Keys < k: up to value k - 1, or all lower buckets if k opens the range.
            let got = if k > values.0 {
                i64::from(counts[k - 1 - values.0])
            } else {
                lesser[me] as i64
            };
            if got == is::expected_rank(class, test, iteration) {
                passed += 1;
            }
        }
    }
    Ok((
        passed,
        Ranked {
            len: total,
            values,
            lesser: lesser[me],
        },
    ))
}

/// `full_verify`: every key at its rank in order, locally and across rank boundaries,
/// and every key accounted for. True on every rank if all is well.
fn full_verify<C: Comm + ?Sized>(
    comm: &mut C,
    a: &mut Arrays,
    r: &Ranked,
    n: usize,
) -> Result<bool, Error> {
    let (me, size) = (comm.rank(), comm.size());
    let counts = &mut a.counts[..r.values.1 - r.values.0];
    let mut ok = true;
    for &key in &a.received[..r.len] {
        let slot = &mut counts[key as usize - r.values.0];
        *slot -= 1;
        let at = *slot as usize;
        if at < r.lesser || at - r.lesser >= r.len {
            ok = false;
            break;
        }
        a.sorted[at - r.lesser] = key;
    }
    let sorted = &a.sorted[..r.len];
    ok &= sorted.windows(2).all(|p| p[0] <= p[1]);
    // Each rank's (count, first, last), everywhere.
    let mut bounds = [0i64; 3 * MAX_RANKS];
    bounds[3 * me] = r.len as i64;
    bounds[3 * me + 1] = sorted.first().map_or(0, |&k| i64::from(k));
    bounds[3 * me + 2] = sorted.last().map_or(0, |&k| i64::from(k));
    comm.allreduce_i64(&mut bounds[..3 * size], Op::Sum)?;
    let mut total = 0;
    let mut previous_last = i64::MIN;
    for j in 0..size {
        let (count, lo, hi) = (bounds[3 * j], bounds[3 * j + 1], bounds[3 * j + 2]);
        total += count;
        if count > 0 {
            ok &= lo >= previous_last;
            previous_last = hi;
        }
    }
    ok &= total as usize == n;
    let mut flag = [i64::from(ok)];
    comm.allreduce_i64(&mut flag, Op::Min)?;
    Ok(flag[0] == 1)
}
