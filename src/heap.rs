//! glibc malloc's set-up for the whole process, and what it holds at a moment.
//!
//! glibc serves a request of at least its *mmap threshold* (128 KiB at start) with a
//! mapping of its own, returned to the kernel on free. But when such a mapping is
//! freed, glibc raises the threshold to its size (up to 32 MiB), so later buffers of
//! that size come from an arena instead, and stay there, free, after the VM that used
//! them is gone. Every VM's vCPU and device threads come and go and are spread over up
//! to 8 arenas per CPU, so a process that runs many VMs kept more and more free memory:
//! +13.6 MiB RSS over 300 boots and 30 migrations with 15.6 MiB free in 11 arenas
//! (docs/results/2026-11-28-soak.md). [`fix_mmap_threshold`] pins the threshold at
//! glibc's own starting value, which turns the raising off: large buffers go back to
//! the kernel when freed, and RSS stays flat.
//!
//! kumo does **not** cap the arenas (`M_ARENA_MAX`), which also flattens RSS: with one
//! arena every thread shares one lock, and a SCHED_FIFO thread of kumo's own scheduler
//! (the credit driver, domain 0's switch) that blocks on it behind a vCPU thread
//! preempted by a spinning vCPU waits as long as that vCPU spins. With the cap on, an
//! S1 quick run's FT.W timed out in CI; that inversion would explain it.

/// glibc's starting mmap threshold (`DEFAULT_MMAP_THRESHOLD_MIN`), kept fixed.
pub const MMAP_THRESHOLD_BYTES: i32 = 128 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (turning off its dynamic
/// raising), unless the operator chose one through `MALLOC_MMAP_THRESHOLD_` or
/// `GLIBC_TUNABLES` (glibc has applied theirs already). Call it first in `main`.
pub fn fix_mmap_threshold() {
    let chosen = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("mmap_threshold"));
    if chosen {
        return;
    }
    // SAFETY: mallopt sets one of malloc's parameters under its own lock; it touches no
    // memory of ours. A refusal (0) leaves glibc's default, which only costs RSS.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) };
}

/// What glibc malloc holds at one moment, over all its arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Heap {
    /// Bytes in allocated chunks (`mallinfo2().uordblks` plus `hblkhd`, the mmapped ones).
    pub heap_in_use_bytes: u64,
    /// Bytes free but kept in the arenas (`mallinfo2().fordblks`).
    pub heap_free_bytes: u64,
    /// Arenas glibc has created (`<heap nr=...>` elements of `malloc_info`).
    pub arenas: u64,
}

impl Heap {
    pub fn now() -> Self {
        // SAFETY: mallinfo2 walks malloc's arenas under their locks and returns a
        // plain struct by value.
        let info = unsafe { libc::mallinfo2() };
        Self {
            heap_in_use_bytes: (info.uordblks + info.hblkhd) as u64,
            heap_free_bytes: info.fordblks as u64,
            arenas: arenas(),
        }
    }
}

/// The arenas `malloc_info` reports (0 if it could not be read).
fn arenas() -> u64 {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: open_memstream writes the buffer's address and length into our two
    // locals, which outlive the stream (closed below).
    let stream = unsafe { libc::open_memstream(&mut buf, &mut len) };
    if stream.is_null() {
        return 0;
    }
    // SAFETY: the stream is open; malloc_info writes its XML to it. fclose flushes it,
    // after which buf/len describe a malloc'ed buffer of len bytes that we own.
    let xml = unsafe {
        libc::malloc_info(0, stream);
        libc::fclose(stream);
        if buf.is_null() {
            return 0;
        }
        let bytes = std::slice::from_raw_parts(buf.cast::<u8>(), len).to_vec();
        libc::free(buf.cast());
        bytes
    };
    count_arenas(&String::from_utf8_lossy(&xml))
}

/// `<heap nr="N">` elements in `malloc_info`'s XML: one per arena.
fn count_arenas(xml: &str) -> u64 {
    xml.matches("<heap nr=").count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arenas_are_counted_from_malloc_info() {
        let xml = "<malloc version=\"1\">\n<heap nr=\"0\">\n<sizes>\n</sizes>\n</heap>\n\
                   <heap nr=\"1\">\n</heap>\n<total type=\"fast\" count=\"0\" size=\"0\"/>\n</malloc>\n";
        assert_eq!(count_arenas(xml), 2);
        assert_eq!(count_arenas("<malloc version=\"1\">\n</malloc>\n"), 0);
    }

    #[test]
    fn this_process_has_a_heap_in_use_and_an_arena() {
        let held = vec![7u8; 1 << 16];
        let heap = Heap::now();
        assert!(heap.arenas >= 1, "{heap:?}");
        assert!(heap.heap_in_use_bytes >= held.len() as u64, "{heap:?}");
    }
}
