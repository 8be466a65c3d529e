//! The guest runtime's `memcpy` and `memset` (guests/user/src/mem.S), assembled into
//! this host test and checked against the standard library at every size class they
//! branch on (0-3, 4-7, 8-15, 16-32, 33-1024, above 1024), at several alignments, for
//! the bytes around the destination too, and for the forward-overlapping copy that the
//! guest's `memmove` relies on.

#![cfg(target_arch = "x86_64")]

core::arch::global_asm!(include_str!("../../guests/user/src/mem.S"));

unsafe extern "C" {
    fn kumo_memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8;
    fn kumo_memset(dest: *mut u8, c: i32, n: usize) -> *mut u8;
}

const LEN: usize = 4096;
const GUARD: usize = 64;
const SIZES: std::ops::RangeInclusive<usize> = 0..=1100;
const LARGE: [usize; 4] = [1025, 1500, 2048, 3000];

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sizes() -> impl Iterator<Item = usize> {
    SIZES.chain(LARGE)
}

#[test]
fn memcpy_copies_exactly_n_bytes_at_every_size_and_alignment() {
    let src = pattern(7);
    for n in sizes() {
        for (s, d) in [(0, 0), (1, 0), (0, 3), (5, 9), (15, 1), (8, 8)] {
            let mut got = pattern(200);
            let mut want = got.clone();
            let dest = GUARD + d;
            // SAFETY: both ranges lie inside their vectors (GUARD + 15 + 3000 < LEN).
            let ret = unsafe { kumo_memcpy(got.as_mut_ptr().add(dest), src.as_ptr().add(s), n) };
            want[dest..dest + n].copy_from_slice(&src[s..s + n]);
            assert_eq!(ret, got[dest..].as_mut_ptr(), "n {n}: return value");
            assert!(got == want, "n {n}, src +{s}, dest +{d}");
        }
    }
}

#[test]
fn memcpy_forwards_over_an_overlap_with_dest_below_src_is_a_memmove() {
    for n in sizes() {
        for gap in [1, 2, 7, 16, 17, 33, 100] {
            let mut got = pattern(3);
            let mut want = got.clone();
            let base = got.as_mut_ptr();
            // SAFETY: GUARD + gap + n stays inside the vector; dest < src as memmove's
            // forward case allows.
            unsafe { kumo_memcpy(base.add(GUARD), base.add(GUARD + gap), n) };
            want.copy_within(GUARD + gap..GUARD + gap + n, GUARD);
            assert!(got == want, "n {n}, gap {gap}");
        }
    }
}

#[test]
fn memset_fills_exactly_n_bytes_with_the_low_byte_of_c() {
    for n in sizes() {
        for (d, c) in [(0, 0), (1, 0xab), (3, 0x80), (9, -1), (15, 0x1_7f)] {
            let mut got = pattern(11);
            let mut want = got.clone();
            let dest = GUARD + d;
            // SAFETY: the range lies inside the vector.
            let ret = unsafe { kumo_memset(got.as_mut_ptr().add(dest), c, n) };
            want[dest..dest + n].fill(c as u8);
            assert_eq!(ret, got[dest..].as_mut_ptr(), "n {n}: return value");
            assert!(got == want, "n {n}, dest +{d}, c {c:#x}");
        }
    }
}
