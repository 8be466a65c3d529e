//! SIGINT, SIGTERM and SIGHUP: stop the VMs, clean up, report what finished, exit with
//! 128 + the signal's number.
//!
//! The three signals are blocked in every thread (the mask is set before any thread
//! exists, and threads inherit it) and taken by one thread with `sigwait`, so no code
//! runs in a signal handler. On the first signal that thread asks every running VM to
//! stop (`hv::stop`): each VM's coordinator is woken and sees it at once, the run
//! returns, its verdict (what finished) is printed and its sockets are removed as the
//! program unwinds normally. With no VM running (native runs, the simulator) there is
//! nothing to wait for: the process exits at once. If the orderly way takes longer
//! than [`GRACE`], or a second signal comes, the thread removes the control sockets
//! itself and exits.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// How long an orderly stop may take before the process exits regardless.
pub const GRACE: Duration = Duration::from_secs(5);

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Control sockets this process has created and not yet removed.
static SOCKETS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Notes a socket to remove if a signal ends the process before its owner does.
pub fn track_socket(path: PathBuf) {
    SOCKETS.lock().unwrap_or_else(|e| e.into_inner()).push(path);
}

/// The owner removed `path` itself.
pub fn untrack_socket(path: &std::path::Path) {
    SOCKETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| p != path);
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given; sigaddset adds valid signal
    // numbers to an initialised set.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        for signal in SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// Blocks the signals in this thread (call it first in `main`, before any thread is
/// spawned) and starts the thread that takes them.
pub fn install() -> std::io::Result<()> {
    let set = signal_set();
    // SAFETY: `set` is an initialised signal set; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || take_signals(set))?;
    Ok(())
}

fn take_signals(set: libc::sigset_t) {
    let mut first = None;
    loop {
        let mut signal: libc::c_int = 0;
        // SAFETY: `set` is initialised and blocked in every thread; `signal` is a valid
        // place for the answer.
        if unsafe { libc::sigwait(&set, &mut signal) } != 0 {
            continue;
        }
        match first {
            None => {
                first = Some(signal);
                if hv::stop::running_vms() == 0 {
                    exit_now(signal);
                }
                hv::stop::request(signal);
                std::thread::spawn(move || {
                    std::thread::sleep(GRACE);
                    eprintln!(
                        "kumo: {} not stopped after {} s; exiting",
                        if hv::stop::running_vms() == 1 {
                            "a VM was"
                        } else {
                            "VMs were"
                        },
                        GRACE.as_secs()
                    );
                    exit_now(signal);
                });
            }
            Some(_) => exit_now(signal),
        }
    }
}

/// Removes the tracked sockets and exits with 128 + `signal`.
fn exit_now(signal: libc::c_int) -> ! {
    for path in SOCKETS.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        let _ = std::fs::remove_file(path);
    }
    std::process::exit(128 + signal);
}
