//! Taking KVM's VM destruction off a short-lived process's exit path.
//!
//! Closing the last file descriptor of a KVM VM destroys it, and with the in-kernel
//! irqchip that takes ~14 ms on this project's kvm_pvm hosts (a C probe: 0.2-4 ms
//! without `KVM_CREATE_IRQCHIP`, 13-19 ms with it, whatever the memory size or vCPU
//! count; the irqchip's devices leave the VM's I/O buses one SRCU grace period at a
//! time). For `kumo --kernel` that is most of the whole process's life: a trivial kernel
//! runs for ~1 ms.
//!
//! A process that runs one VM and then exits can ask for the destruction to happen
//! elsewhere ([`defer_vm_destruction`]): every VM created from then on keeps a
//! duplicate of its file descriptor here, so the VM's own close is not the last one.
//! At the end, [`hand_off`] forks a reaper process that inherits the duplicates,
//! closes its standard streams (so nobody reading kumo's output waits for it), waits
//! until kumo has exited (a pipe's end of file) and then exits itself, and with it the
//! last references go: the VM is destroyed in the reaper, after kumo's exit status is
//! already known. Nothing changes for the guest or its results; the host does the same
//! work, ~15 ms later, in a process nobody waits for.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

static DEFER: AtomicBool = AtomicBool::new(false);
static KEPT: Mutex<Vec<OwnedFd>> = Mutex::new(Vec::new());

/// From now on, VMs this process creates are destroyed by [`hand_off`]'s reaper, not
/// when the VM is dropped. For processes that exit after their run (the VM's memory
/// and KVM state live until then).
pub fn defer_vm_destruction() {
    DEFER.store(true, Ordering::SeqCst);
}

/// Called for every new VM: keeps a duplicate of its descriptor when destruction is
/// deferred. A failed `dup` only means the VM is destroyed the ordinary way.
pub(crate) fn keep(vm: RawFd) {
    if !DEFER.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: `vm` is an open descriptor owned by a live VmFd; F_DUPFD_CLOEXEC makes a
    // new descriptor (or fails) without touching the original.
    let fd = unsafe { libc::fcntl(vm, libc::F_DUPFD_CLOEXEC, 3) };
    if fd < 0 {
        tracing::debug!(
            "keeping the VM for the reaper: {}",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: `fd` is the new descriptor just returned, owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(owned);
}

/// Forks the reaper that destroys the kept VMs once this process has exited (see the
/// module documentation). Call once, right before exiting, after every VM has ended;
/// does nothing if no VM was kept. If the fork fails, the VMs are destroyed at this
/// process's exit as usual.
pub fn hand_off() {
    let kept = std::mem::take(&mut *KEPT.lock().unwrap_or_else(|e| e.into_inner()));
    if kept.is_empty() {
        return;
    }
    let mut ends = [0 as RawFd; 2];
    // SAFETY: `ends` is a valid array of two descriptors for pipe2 to fill.
    if unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    // SAFETY: the read end was just created by pipe2 and is owned by nothing else.
    let read_end = unsafe { OwnedFd::from_raw_fd(ends[0]) };
    // SAFETY: as for the read end.
    let write_end = unsafe { OwnedFd::from_raw_fd(ends[1]) };
    // SAFETY: the child calls only async-signal-safe functions (close, read, _exit)
    // before it exits: no allocation, no locks, no Rust runtime.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain descriptor operations on descriptors this process owns, then
        // _exit, which runs no destructors or atexit handlers of the parent's.
        unsafe {
            for fd in [0, 1, 2, write_end.as_raw_fd()] {
                libc::close(fd);
            }
            let mut byte = 0u8;
            // Returns 0 (end of file) once the parent, the last writer, has exited.
            while libc::read(read_end.as_raw_fd(), (&mut byte as *mut u8).cast(), 1) < 0 {}
            libc::_exit(0);
        }
    }
    if pid < 0 {
        tracing::debug!(
            "no reaper: fork failed: {}",
            std::io::Error::last_os_error()
        );
    }
    // The parent keeps the write end open until it exits; its copies of the kept VM
    // descriptors close now (the reaper's are the last).
    std::mem::forget(write_end);
    drop(read_end);
    drop(kept);
}
