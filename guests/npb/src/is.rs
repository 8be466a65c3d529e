//! IS, the integer sort kernel: ranks `2^n` integer keys (sums of four uniform random
//! numbers, so bell-shaped) ten times with a bucket sort, checks five test keys' ranks
//! after every ranking and the whole sorted order at the end.
//!
//! Parallel split (the shared-memory form of the reference's all-to-all exchange):
//! each thread counts the buckets of its own block of keys, then scatters its keys to
//! positions computed from everyone's counts (thread order within a bucket, so the
//! result does not depend on timing), then ranks a contiguous run of whole buckets
//! chosen so every thread gets about the same number of keys. Every phase writes only
//! what its thread owns; a barrier separates the phases.

use core::ops::Range;

use crate::random::{self, A};
use crate::team::{Arena, Shared, Team};
use crate::{Class, Outcome, Values};

/// IS's seed for the keys.
pub const SEED: u64 = 314_159_265;
/// Rankings timed (`MAX_ITERATIONS`).
pub const ITERATIONS: usize = 10;
/// Test keys checked after each ranking.
pub const TEST_KEYS: usize = 5;
/// Checks a correct run passes: five per ranking and the full sort.
pub const CHECKS: u32 = (TEST_KEYS * ITERATIONS) as u32 + 1;

/// `(log2 keys, log2 max key, log2 buckets)` per class.
fn logs(class: Class) -> (u32, u32, u32) {
    match class {
        Class::S => (16, 11, 9),
        Class::W => (20, 16, 10),
        Class::A => (23, 19, 10),
        Class::B => (25, 21, 10),
        Class::C => (27, 23, 10),
    }
}

/// Keys sorted (`TOTAL_KEYS`).
pub fn keys(class: Class) -> usize {
    1 << logs(class).0
}

/// Keys lie in `0..max_key` (`MAX_KEY`).
pub fn max_key(class: Class) -> usize {
    1 << logs(class).1
}

/// Buckets of the bucket sort (`NUM_BUCKETS`).
pub fn buckets(class: Class) -> usize {
    1 << logs(class).2
}

/// Positions of the test keys in the key array (`test_index_array`).
pub fn test_index(class: Class) -> [usize; TEST_KEYS] {
    match class {
        Class::S => [48427, 17148, 23627, 62548, 4431],
        Class::W => [357773, 934767, 875723, 898999, 404505],
        Class::A => [2112377, 662041, 5336171, 3642833, 4250760],
        Class::B => [41869, 812306, 5102857, 18232239, 26860214],
        Class::C => [44172927, 72999161, 74326391, 129606274, 21736814],
    }
}

/// The official rank of each test key after ranking `iteration` (1-based): the published
/// `test_rank_array` shifted as the reference's per-class rule says (the keys altered
/// each iteration move the test keys' ranks).
pub fn expected_rank(class: Class, test: usize, iteration: usize) -> i64 {
    let (base, it) = match class {
        Class::S => ([0, 18, 346, 64917, 65463], iteration as i64),
        Class::W => ([1249, 11698, 1039987, 1043896, 1048018], iteration as i64),
        Class::A => ([104, 17523, 123928, 8288932, 8388264], iteration as i64 - 1),
        Class::B => ([33422937, 10244, 59149, 33135281, 99], iteration as i64),
        Class::C => (
            [61147, 882988, 266290, 133997595, 133525895],
            iteration as i64,
        ),
    };
    let up = match class {
        Class::S | Class::A | Class::C => test <= 2,
        Class::W => test < 2,
        Class::B => matches!(test, 1 | 2 | 4),
    };
    match (class, up) {
        (Class::W, true) => base[test] + (it - 2),
        (_, true) => base[test] + it,
        (_, false) => base[test] - it,
    }
}

/// Mop/s as the reference reports it: keys ranked per second, in millions.
pub fn mops(class: Class, seconds: f64) -> f64 {
    (ITERATIONS * keys(class)) as f64 / seconds / 1.0e6
}

/// Arena slack per allocation for its 64-byte alignment.
const ALIGN_SLACK: usize = 64;

/// Arena bytes [`run`] needs: the keys, the keys in bucket order, the rank of every key
/// value, and a bucket count per thread.
pub fn heap_bytes(class: Class, threads: usize) -> usize {
    let i32s = |n: usize| n * core::mem::size_of::<i32>() + ALIGN_SLACK;
    2 * i32s(keys(class)) + i32s(max_key(class)) + i32s(threads * buckets(class))
}

/// The arrays of a run, shared by the team.
#[derive(Clone, Copy)]
struct Arrays {
    /// The keys in generation order (`key_array`).
    keys: Shared<i32>,
    /// The keys grouped by bucket (`key_buff2`).
    by_bucket: Shared<i32>,
    /// For each key value, how many keys are `<=` it, once ranked (`key_buff1`).
    rank: Shared<i32>,
    /// Thread `t`'s count (then its next free slot) for bucket `b` at `t * buckets + b`.
    counts: Shared<i32>,
}

/// Fills this thread's block of the keys: key `i` is `max_key / 4` times the sum of the
/// stream's values `4i + 1 ..= 4i + 4`, as the reference's `create_seq` makes them.
fn create_keys(team: &Team, class: Class, keys: Shared<i32>) {
    let mine = team.share(keys.len());
    let scale = (max_key(class) / 4) as f64;
    let mut seed = random::skip(SEED, A, 4 * mine.start as u64);
    // SAFETY: each thread writes only its own block.
    let out = unsafe { keys.slice_mut(mine) };
    for key in out {
        let mut x = random::randlc(&mut seed, A);
        x += random::randlc(&mut seed, A);
        x += random::randlc(&mut seed, A);
        x += random::randlc(&mut seed, A);
        *key = (scale * x) as i32;
    }
}

/// Buckets `[first, end)` this thread ranks: those whose keys start in its block of the
/// bucket-ordered array, so every thread ranks about `keys / threads` keys.
fn my_buckets(team: &Team, starts: &[usize], total: usize) -> Range<usize> {
    let owner = |b: usize| (starts[b] * team.size() / total.max(1)).min(team.size() - 1);
    let first = (0..starts.len())
        .find(|&b| owner(b) >= team.rank())
        .unwrap_or(starts.len());
    let end = (first..starts.len())
        .find(|&b| owner(b) > team.rank())
        .unwrap_or(starts.len());
    first..end
}

/// One ranking (the reference's `rank(iteration)`): afterwards `rank[v]` is the number
/// of keys `<= v`. Returns, on the master, the number of test keys whose rank is right.
fn rank(team: &Team, class: Class, arrays: Arrays, iteration: usize) -> u32 {
    let n = arrays.keys.len();
    let nb = buckets(class);
    let shift = logs(class).1 - logs(class).2;
    let bucket_width = max_key(class) / nb;

    // Each ranking alters two keys, so the test keys' ranks move (the official ranks
    // account for it).
    let mut test_values = [0i32; TEST_KEYS];
    if team.is_master() {
        // SAFETY: only the master touches the keys until the barrier.
        unsafe {
            arrays.keys.set(iteration, iteration as i32);
            arrays
                .keys
                .set(iteration + ITERATIONS, (max_key(class) - iteration) as i32);
            for (value, &at) in test_values.iter_mut().zip(&test_index(class)) {
                *value = arrays.keys.get(at);
            }
        }
    }
    team.barrier();

    // Count this thread's keys per bucket.
    let mine = team.share(n);
    let my_row = team.rank() * nb..(team.rank() + 1) * nb;
    {
        // SAFETY: keys are read-only in this phase; the row is this thread's.
        let (keys, counts) = unsafe {
            (
                arrays.keys.slice(mine.clone()),
                arrays.counts.slice_mut(my_row.clone()),
            )
        };
        counts.fill(0);
        for &key in keys {
            counts[(key >> shift) as usize] += 1;
        }
    }
    team.barrier();

    // Scatter: bucket b starts after every key of lower buckets; within it, thread t's
    // keys follow those of threads before t.
    let mut starts = [0usize; MAX_BUCKETS];
    let starts = &mut starts[..nb];
    {
        // SAFETY: the counts are read-only until the next ranking's count phase.
        let all = unsafe { arrays.counts.slice(0..team.size() * nb) };
        let mut total = 0usize;
        for (b, start) in starts.iter_mut().enumerate() {
            *start = total;
            total += (0..team.size())
                .map(|t| all[t * nb + b] as usize)
                .sum::<usize>();
        }
    }
    let mut next = [0usize; MAX_BUCKETS];
    let next = &mut next[..nb];
    {
        // SAFETY: as above; the rows are only read here.
        let all = unsafe { arrays.counts.slice(0..team.size() * nb) };
        for (b, slot) in next.iter_mut().enumerate() {
            *slot = starts[b]
                + (0..team.rank())
                    .map(|t| all[t * nb + b] as usize)
                    .sum::<usize>();
        }
    }
    {
        // SAFETY: keys are read-only in this phase.
        let keys = unsafe { arrays.keys.slice(mine) };
        for &key in keys {
            let slot = &mut next[(key >> shift) as usize];
            // SAFETY: threads' positions are disjoint (each owns its part of every
            // bucket), so element writes do not race; no thread holds a slice of it.
            unsafe { arrays.by_bucket.set(*slot, key) };
            *slot += 1;
        }
    }
    team.barrier();

    // Rank whole buckets: count each key value, then prefix-sum across the bucket's
    // value range, starting from the number of keys in lower buckets.
    let ranked = my_buckets(team, starts, n);
    {
        let values = ranked.start * bucket_width..ranked.end * bucket_width;
        // SAFETY: this thread owns the rank entries of its buckets' values and reads
        // only its buckets' part of `by_bucket`, which nobody writes in this phase.
        let rank = unsafe { arrays.rank.slice_mut(values.clone()) };
        // SAFETY: nobody writes `by_bucket` in this phase, so every thread may read it.
        let by_bucket = unsafe { arrays.by_bucket.all() };
        rank.fill(0);
        for b in ranked.clone() {
            let end = if b + 1 < nb { starts[b + 1] } else { n };
            let base = values.start;
            for &key in &by_bucket[starts[b]..end] {
                rank[key as usize - base] += 1;
            }
            let local = (b - ranked.start) * bucket_width..(b + 1 - ranked.start) * bucket_width;
            let mut running = starts[b] as i32;
            for count in &mut rank[local] {
                running += *count;
                *count = running;
            }
        }
    }
    team.barrier();

    if !team.is_master() {
        return 0;
    }
    // SAFETY: `rank` is read-only until the next ranking's barriers.
    let rank = unsafe { arrays.rank.all() };
    let mut passed = 0;
    for (test, &value) in test_values.iter().enumerate() {
        let value = value as usize;
        // The reference checks only keys in this range (all official test keys are).
        if 0 < value && value < n {
            let got = i64::from(rank[value - 1]);
            if got == expected_rank(class, test, iteration) {
                passed += 1;
            }
        }
    }
    passed
}

/// Largest bucket count of any class (per-thread tables on the stack use it).
const MAX_BUCKETS: usize = 1 << 10;

/// The reference's `full_verify`: places every key at its rank and counts keys out of
/// order. Run by the master after the timed region; consumes `rank`.
fn sorted_correctly(arrays: Arrays) -> bool {
    // SAFETY: called by the master alone between barriers.
    let (by_bucket, rank, sorted) = unsafe {
        (
            arrays.by_bucket.all(),
            arrays.rank.all_mut(),
            arrays.keys.all_mut(),
        )
    };
    for &key in by_bucket {
        let slot = &mut rank[key as usize];
        *slot -= 1;
        sorted[*slot as usize] = key;
    }
    sorted.windows(2).all(|pair| pair[0] <= pair[1])
}

/// Runs IS: untimed key generation and one free ranking, then ten timed rankings, then
/// the full sort check.
pub fn run(class: Class, team: &Team, arena: &mut Arena) -> Outcome {
    assert!(buckets(class) <= MAX_BUCKETS);
    let n = keys(class);
    let arrays = Arrays {
        keys: arena.alloc(n),
        by_bucket: arena.alloc(n),
        rank: arena.alloc(max_key(class)),
        counts: arena.alloc(team.size() * buckets(class)),
    };

    create_keys(team, class, arrays.keys);
    team.barrier();
    rank(team, class, arrays, 1);
    team.barrier();

    let start = team.seconds();
    let mut passed = 0;
    for iteration in 1..=ITERATIONS {
        passed += rank(team, class, arrays, iteration);
    }
    let seconds = team.seconds() - start;

    if team.is_master() && sorted_correctly(arrays) {
        passed += 1;
    }
    team.barrier();

    let mut values = Values::new();
    values.push("passed", f64::from(passed));
    values.push("checks", f64::from(CHECKS));
    Outcome {
        seconds,
        mops: mops(class, seconds),
        verified: passed == CHECKS,
        values,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::testing::on_team;

    /// The reference's serial `create_seq`, one random number at a time.
    fn serial_keys(class: Class) -> Vec<i32> {
        let mut seed = SEED;
        let k = (max_key(class) / 4) as f64;
        (0..keys(class))
            .map(|_| {
                let x: f64 = (0..4).map(|_| random::randlc(&mut seed, A)).sum();
                (k * x) as i32
            })
            .collect()
    }

    #[test]
    fn threads_generate_the_serial_key_stream() {
        let class = Class::S;
        let expected = serial_keys(class);
        for threads in [1, 3, 4] {
            let got = on_team(threads, heap_bytes(class, threads), |team, arena| {
                let keys = arena.alloc::<i32>(keys(class));
                create_keys(team, class, keys);
                team.barrier();
                // SAFETY: read after the barrier; nobody writes.
                unsafe { keys.all() }.to_vec()
            });
            assert_eq!(got, expected, "{threads} threads");
        }
        assert!(
            expected
                .iter()
                .all(|&k| (0..max_key(class) as i32).contains(&k))
        );
    }

    #[test]
    fn ranking_counts_keys_at_or_below_each_value() {
        let class = Class::S;
        for threads in [1, 2, 3] {
            let (rank, keys) = on_team(threads, heap_bytes(class, threads), |team, arena| {
                let arrays = Arrays {
                    keys: arena.alloc(keys(class)),
                    by_bucket: arena.alloc(keys(class)),
                    rank: arena.alloc(max_key(class)),
                    counts: arena.alloc(team.size() * buckets(class)),
                };
                create_keys(team, class, arrays.keys);
                team.barrier();
                rank(team, class, arrays, 3);
                team.barrier();
                // SAFETY: read after the barrier; nobody writes.
                unsafe { (arrays.rank.all().to_vec(), arrays.keys.all().to_vec()) }
            });
            // Independent check: sort and count.
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            for value in (0..max_key(class)).step_by(7) {
                let at_or_below = sorted.partition_point(|&k| k <= value as i32);
                assert_eq!(
                    rank[value] as usize, at_or_below,
                    "value {value}, {threads} threads"
                );
            }
        }
    }

    #[test]
    fn expected_ranks_follow_the_per_class_rule() {
        assert_eq!(expected_rank(Class::S, 0, 1), 1);
        assert_eq!(expected_rank(Class::S, 3, 2), 64915);
        assert_eq!(expected_rank(Class::W, 1, 1), 11697);
        assert_eq!(expected_rank(Class::W, 2, 10), 1039977);
        assert_eq!(expected_rank(Class::A, 2, 1), 123928);
        assert_eq!(expected_rank(Class::A, 4, 10), 8388255);
    }

    #[test]
    fn heap_covers_every_class() {
        assert!(heap_bytes(Class::A, 1) >= 2 * 4 * (1 << 23) + 4 * (1 << 19));
        assert!(heap_bytes(Class::S, 4) > heap_bytes(Class::S, 1));
    }
}
