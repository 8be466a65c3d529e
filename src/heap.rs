//! glibc malloc's set-up for the whole process, and what it holds at a moment.
//!
//! glibc gives a thread that meets contention an arena of its own (up to 8 per CPU)
//! and keeps the memory freed in it. Every VM's vCPU and device threads come and go, so
//! a process that runs many VMs takes arena after arena and its RSS climbs in steps
//! that `malloc_trim` does not return (docs/results/2026-11-28-soak.md: +4.6 MiB over
//! 1,000 boots with glibc's default, flat with one arena). kumo caps the arenas at
//! [`ARENAS`] before its first thread starts; each thread's tcache still serves its
//! small allocations without the arena lock, and no exit path allocates.

/// Arenas glibc may create: the main one only. Measured flat in the soak; against
/// glibc's default no `kumo bench overhead` or `kumo bench record` figure moved
/// consistently on a loaded host (docs/results/2026-11-28-soak.md).
pub const ARENAS: i32 = 1;

/// Caps glibc's arenas at [`ARENAS`], unless the operator chose a bound through
/// `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` (glibc has applied theirs already). Call it
/// first in `main`, before any thread exists.
pub fn cap_arenas() {
    let chosen = std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"));
    if chosen {
        return;
    }
    // SAFETY: mallopt sets one of malloc's parameters under its own lock; it touches no
    // memory of ours. A refusal (0) leaves glibc's default, which only costs RSS.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS) };
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
