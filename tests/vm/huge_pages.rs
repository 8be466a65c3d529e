//! Guest RAM and the native arena on the host's 2 MiB huge pages (`--huge-pages`): they
//! run from the host's hugetlbfs pool, and a pool too small or a size that is not whole
//! huge pages is refused in one line before anything runs.

use crate::common;

use common::*;

/// `HugePages_Free` of /proc/meminfo.
fn free_huge_pages() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("HugePages_Free:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("HugePages_Free in /proc/meminfo")
}

/// The pages the positive checks take at most: a 64-MiB guest, then the native arena.
const NEEDED: u64 = 32;

#[test]
fn guest_ram_and_the_native_arena_run_on_huge_pages_or_are_refused_clearly() {
    if !kvm_available() {
        return;
    }
    let free = free_huge_pages();
    if free < NEEDED {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "{free} free huge pages but CI=true: .ci/run must reserve {NEEDED}"
        );
        eprintln!("SKIPPED: {free} free 2 MiB huge pages; reserve {NEEDED} to run the guests");
        refusals();
        return;
    }
    let out = kumo(&["--npb", "ep.S", "--huge-pages", "--memory", "64", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json_lines(&out)[0]["verified"], true);
    let out = kumo(&["native", "--npb", "ep.S", "--huge-pages", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json_lines(&out)[0]["verified"], true);
    // Both gave their pages back.
    assert_eq!(free_huge_pages(), free);
    a_snapshot_keeps_its_huge_pages();
    refusals();
}

/// A snapshot of a VM on huge pages is restored on huge pages: refused while the pool
/// is held, run once it is back.
fn a_snapshot_keeps_its_huge_pages() {
    let socket = scratch("huge.sock");
    let file = scratch("huge.snap");
    let source = ep_a_source(&socket, &["--huge-pages"]);
    let ctl = snapshot(&socket, &file, true);
    assert!(ctl.status.success(), "snapshot: {}", text(&ctl.stderr));
    let source_out = source.finish();
    assert!(source_out.status.success(), "{}", text(&source_out.stderr));
    {
        let _hold = HeldPages::all_free();
        let out = kumo(&["--restore", file.to_str().unwrap()]);
        assert!(!out.status.success());
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("on 2 MiB huge pages needs 32 of them and the host has 0 free"),
            "{stderr}"
        );
    }
    let out = kumo(&["--restore", file.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json_lines(&out)[0]["verified"], true);
}

/// Every free huge page, mapped and touched by this process until dropped.
struct HeldPages {
    ptr: *mut libc::c_void,
    len: usize,
}

impl HeldPages {
    fn all_free() -> HeldPages {
        let len = free_huge_pages() as usize * (2 << 20);
        // SAFETY: a new private anonymous mapping, populated (its pages taken) now.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        assert_eq!(free_huge_pages(), 0);
        HeldPages { ptr, len }
    }
}

impl Drop for HeldPages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `all_free`.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// In the same test as the runs: a refused VM holds the whole pool for a moment.
fn refusals() {
    // More than the pool holds, by far: refused up front, not a SIGBUS mid-run.
    let mib = (free_huge_pages() + 1024) * 2;
    let memory = mib.to_string();
    assert_refused(
        &["--npb", "ep.S", "--huge-pages", "--memory", &memory],
        &format!(
            "guest memory of {mib} MiB on 2 MiB huge pages needs {} of them",
            mib / 2
        ),
    );
    assert_refused(
        &["--npb", "ep.S", "--huge-pages", "--memory", "65"],
        "guest memory of 65 MiB is not a whole number of 2 MiB huge pages",
    );
}
