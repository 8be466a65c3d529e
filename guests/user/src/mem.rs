//! The memory functions the compiler calls. Built for a libc target, the runtime does
//! not get compiler_builtins' versions, and there is no libc. `memcpy` and `memset` are
//! `mem.S` (16-byte moves up to 1 KiB, `rep movsb`/`rep stosb` above: see there why);
//! `memmove` copies backwards with `rep movsb` when it must.

core::arch::global_asm!(include_str!("mem.S"));
core::arch::global_asm!(
    ".globl memcpy",
    ".set memcpy, kumo_memcpy",
    ".globl memset",
    ".set memset, kumo_memset",
);

use core::arch::asm;

unsafe extern "C" {
    /// As C `memcpy` (mem.S); also a correct forward `memmove` when `dest < src`.
    fn kumo_memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8;
}

/// # Safety
/// As C `memmove`: valid regions of `n` bytes, possibly overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // dest before src, or no overlap: copying forwards is safe (mem.S reads all it
        // copies before any store that could overlap it).
        // SAFETY: the caller guarantees both regions of n bytes.
        return unsafe { kumo_memcpy(dest, src, n) };
    }
    // SAFETY: overlapping with dest after src: copy backwards (DF set, then cleared).
    unsafe {
        asm!("std", "rep movsb", "cld",
             inout("rdi") dest.add(n).wrapping_sub(1) => _,
             inout("rsi") src.add(n).wrapping_sub(1) => _,
             inout("rcx") n => _,
             options(nostack))
    };
    dest
}

/// # Safety
/// As C `memcmp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    let mut i = 0;
    while i < n {
        // SAFETY: the caller guarantees both regions of n bytes.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
        i += 1;
    }
    0
}

/// # Safety
/// As C `bcmp`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract.
    unsafe { memcmp(a, b, n) }
}
