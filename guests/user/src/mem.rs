//! The memory functions the compiler calls. Built for a libc target, the runtime does
//! not get compiler_builtins' versions, and there is no libc: these use `rep movsb` /
//! `rep stosb` (fast-string microcode, native speed in ring 3).

use core::arch::asm;

/// # Safety
/// As C `memcpy`: valid, non-overlapping regions of `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both regions; DF is clear (SysV ABI).
    unsafe {
        asm!("rep movsb", inout("rdi") dest => _, inout("rsi") src => _, inout("rcx") n => _,
             options(nostack, preserves_flags))
    };
    dest
}

/// # Safety
/// As C `memmove`: valid regions of `n` bytes, possibly overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // dest before src, or no overlap: copying forwards is safe.
        // SAFETY: as above.
        return unsafe { memcpy(dest, src, n) };
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
/// As C `memset`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees the region.
    unsafe {
        asm!("rep stosb", inout("rdi") dest => _, inout("rcx") n => _, in("al") c as u8,
             options(nostack, preserves_flags))
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
