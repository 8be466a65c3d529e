//! The vCPU kick: a real-time signal whose handler sets `immediate_exit` in the
//! receiving thread's `kvm_run`, so KVM_RUN returns EINTR whether the signal lands
//! inside the ioctl (running, halted, waiting for SIPI) or just before it. Used to stop
//! a VM, by the watchdog's samples and by schedulers that park vCPUs; a module of its
//! own so that `vcpu` (which runs the loop) and `placement` (which parks) both depend on
//! it instead of on each other.

use std::cell::Cell;
use std::sync::Once;

use kvm_bindings::kvm_run;

use crate::Error;

pub(crate) fn kick_signal() -> libc::c_int {
    vmm_sys_util::signal::SIGRTMIN()
}

thread_local! {
    /// This thread's `kvm_run`, for the kick handler.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only a const-initialised, destructor-free thread-local and a volatile byte store:
    // async-signal-safe.
    let run = KVM_RUN.with(Cell::get);
    if !run.is_null() {
        // SAFETY: `run` points at this thread's kvm_run mapping, set by `thread_main`
        // for the lifetime of the VcpuFd that owns it and cleared before the fd is
        // dropped; `immediate_exit` is a plain byte that KVM reads on entry.
        unsafe { std::ptr::addr_of_mut!((*run).immediate_exit).write_volatile(1) };
    }
}

static HANDLER: Once = Once::new();

pub(crate) fn install_kick_handler() -> Result<(), Error> {
    let mut result = Ok(());
    HANDLER.call_once(|| {
        result = vmm_sys_util::signal::register_signal_handler(kick_signal(), kick_handler)
            .map_err(|e| Error::Os {
                what: "installing the vCPU kick signal handler",
                source: std::io::Error::from_raw_os_error(e.errno()),
            });
    });
    result
}

/// Tells this thread's kick handler where its `kvm_run` is (null: none, before the
/// VcpuFd that owns the mapping is dropped).
pub(crate) fn set_kvm_run(run: *mut kvm_run) {
    KVM_RUN.with(|c| c.set(run));
}
