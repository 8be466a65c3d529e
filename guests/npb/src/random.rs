//! The NPB pseudo-random generator: `x_{k+1} = a * x_k mod 2^46`, returned as
//! `2^-46 * x_{k+1}`.
//!
//! The reference computes this in double precision by splitting into 23-bit halves;
//! that computation is exact, so this integer version yields the very same doubles.
//! `2^46` divides `2^64`, so a wrapping 64-bit multiply followed by a mask is already
//! the product modulo `2^46`.

/// The multiplier of every NPB kernel: `5^13`.
pub const A: u64 = 1_220_703_125;
/// The generator's modulus is `2^46`.
pub const MODULUS_BITS: u32 = 46;
const MASK: u64 = (1 << MODULUS_BITS) - 1;
/// `2^-46`: turns a state into a number in (0, 1).
const R46: f64 = 1.0 / (1u64 << MODULUS_BITS) as f64;

/// `a * b mod 2^46`.
#[inline(always)]
pub fn mul_mod(a: u64, b: u64) -> u64 {
    a.wrapping_mul(b) & MASK
}

/// `a^k mod 2^46` by repeated squaring (how a thread jumps to its slice of the stream).
pub fn pow_mod(a: u64, mut k: u64) -> u64 {
    let mut base = a & MASK;
    let mut result = 1;
    while k != 0 {
        if k & 1 == 1 {
            result = mul_mod(result, base);
        }
        base = mul_mod(base, base);
        k >>= 1;
    }
    result
}

/// The state after `k` steps from `seed`: `seed * a^k mod 2^46`.
pub fn skip(seed: u64, a: u64, k: u64) -> u64 {
    mul_mod(seed, pow_mod(a, k))
}

/// NPB `randlc`: advances `x` one step and returns the new value scaled into (0, 1).
#[inline(always)]
pub fn randlc(x: &mut u64, a: u64) -> f64 {
    *x = mul_mod(*x, a);
    *x as f64 * R46
}

/// NPB `vranlc`: fills `out` with the next `out.len()` values of the stream.
#[inline]
pub fn vranlc(out: &mut [f64], x: &mut u64, a: u64) {
    let mut state = *x;
    for value in out.iter_mut() {
        state = mul_mod(state, a);
        *value = state as f64 * R46;
    }
    *x = state;
}

#[cfg(test)]
mod tests {
    use super::*;

    const EP_SEED: u64 = 271_828_183;

    /// `pow(5**13, k, 2**46) * 271828183 % 2**46`, computed with Python big integers.
    const EP_STREAM: [(u64, u64); 8] = [
        (1, 32_883_653_486_115),
        (2, 55_063_727_434_591),
        (3, 39_106_144_873_291),
        (10, 28_136_419_293_951),
        (1000, 8_661_753_562_871),
        (131_072, 7_493_776_032_983),
        (1_048_583, 51_975_530_094_043),
        (123_456_789, 69_187_210_421_107),
    ];

    #[test]
    fn jump_ahead_matches_independent_values() {
        for (k, expected) in EP_STREAM {
            assert_eq!(skip(EP_SEED, A, k), expected, "x_{k}");
        }
    }

    #[test]
    fn stepping_matches_independent_values() {
        let mut x = EP_SEED;
        let mut step = 0;
        for (k, expected) in EP_STREAM.iter().take(6) {
            while step < *k {
                randlc(&mut x, A);
                step += 1;
            }
            assert_eq!(x, *expected, "x_{k}");
        }
    }

    #[test]
    fn randlc_returns_scaled_state() {
        let mut x = 314_159_265;
        let expected = [
            55_909_509_111_989u64,
            61_155_031_930_969,
            45_573_031_421_645,
        ];
        for e in expected {
            let r = randlc(&mut x, A);
            assert_eq!(x, e);
            assert_eq!(r, e as f64 / 70_368_744_177_664.0);
            assert!(r > 0.0 && r < 1.0);
        }
    }

    #[test]
    fn vranlc_equals_repeated_randlc() {
        let mut a = EP_SEED;
        let mut b = EP_SEED;
        let mut out = [0.0; 100];
        vranlc(&mut out, &mut a, A);
        for value in out {
            assert_eq!(value, randlc(&mut b, A));
        }
        assert_eq!(a, b);
        assert_eq!(a, skip(EP_SEED, A, 100));
    }

    #[test]
    fn pow_mod_small_cases() {
        assert_eq!(pow_mod(A, 0), 1);
        assert_eq!(pow_mod(A, 1), A);
        assert_eq!(
            pow_mod(A, 2),
            (A as u128 * A as u128 % (1u128 << 46)) as u64
        );
        // The generator's period is 2^44: a^(2^44) = 1 mod 2^46.
        assert_eq!(pow_mod(A, 1 << 44), 1);
        assert_ne!(pow_mod(A, 1 << 43), 1);
    }
}
