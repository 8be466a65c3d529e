//! The allow list of each thread kind: what its steady state was traced making
//! (`strace -f`, per thread name; docs/security.md), plus what std, the allocator,
//! tracing and the SIGSYS report need. Argument checks where they are cheap and
//! say something: ioctls only of KVM's and VFIO's types, opens read-only where the
//! thread only reads, prctl only to name a thread.

use super::ThreadKind;
use super::bpf::{Check, Rules};

/// Every thread: memory (allocator, std), locks and parking, its own signals (kicks,
/// SIGSYS), clocks and sleeps, logging to stderr, ending.
const BASE: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_fcntl,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_futex,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_mprotect,
    libc::SYS_brk,
    libc::SYS_rt_sigreturn,
    libc::SYS_rt_sigprocmask,
    libc::SYS_sigaltstack,
    libc::SYS_restart_syscall,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_tgkill,
    libc::SYS_getrandom,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_rseq,
    libc::SYS_set_robust_list,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// Reading and writing files and eventfds the thread already holds at an offset
/// (disks, VFIO regions, KVM's statistics fds).
const POSITIONED_IO: &[i64] = &[
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_readv,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
];

/// Messages on sockets the thread already holds (vfio-user, the wire, the switch).
const SOCKET_IO: &[i64] = &[
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
    libc::SYS_shutdown,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
];

/// Event loops (the backend worker's epoll, a tokio runtime's).
const EVENTS: &[i64] = &[
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_epoll_ctl,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
];

/// Placement: pinning, SCHED_FIFO ranks, parking (its own or, for the credit driver
/// and the coordinator, other threads').
const PLACEMENT: &[i64] = &[
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_getscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_getparam,
];

/// Serving and dialling sockets, making runtimes' fds, writing files (snapshots),
/// starting helper threads: the control/API thread and the migration threads.
const SERVE: &[i64] = &[
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_socket,
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_epoll_create1,
    libc::SYS_eventfd2,
    libc::SYS_timerfd_create,
    libc::SYS_pipe2,
    libc::SYS_ftruncate,
    libc::SYS_unlinkat,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_getcwd,
    libc::SYS_uname,
    libc::SYS_sched_getaffinity,
];

/// Starting threads (std's spawn: clone3, falling back to clone).
const SPAWN: &[i64] = &[libc::SYS_clone3, libc::SYS_clone];

/// ioctl magic numbers (bits 8..16 of the request) a filter lets through.
const KVM_TYPE: u32 = 0xAE;
const VFIO_TYPE: u32 = 0x3B; // VFIO and iommufd both use ';'
/// FIONBIO and FIOCLEX-style requests on sockets ('T' type, 0x54).
const TTY_SOCKET_TYPE: u32 = 0x54;

pub(super) fn rules(kind: ThreadKind) -> Rules {
    let mut r = Rules::new();
    allow(&mut r, BASE);
    prctl_names(&mut r);
    match kind {
        ThreadKind::Vcpu => {
            // MMIO and port exits reach devices (vfio-user messages, disk I/O with
            // io=vcpu, VFIO regions), placement parks and unpins the vCPU, and at
            // its end it reads its own schedstat.
            allow(&mut r, POSITIONED_IO);
            allow(&mut r, SOCKET_IO);
            allow(&mut r, PLACEMENT);
            ioctls(&mut r, &[KVM_TYPE, VFIO_TYPE]);
            open_read_only(&mut r);
        }
        ThreadKind::Backend => {
            allow(&mut r, POSITIONED_IO);
            allow(&mut r, SOCKET_IO);
            allow(&mut r, EVENTS);
            allow(&mut r, PLACEMENT);
            ioctls(&mut r, &[KVM_TYPE, VFIO_TYPE]);
            open_read_only(&mut r);
        }
        ThreadKind::Coordinator => {
            // Waits for the vCPUs' ends, stops them (kicks), reads their counters.
            allow(&mut r, POSITIONED_IO);
            allow(&mut r, PLACEMENT);
            ioctls(&mut r, &[KVM_TYPE, VFIO_TYPE]);
            open_read_only(&mut r);
        }
        ThreadKind::Credit => {
            allow(&mut r, PLACEMENT);
            allow(&mut r, &[libc::SYS_pread64]);
            open_read_only(&mut r);
        }
        ThreadKind::Migration => migration(&mut r),
        ThreadKind::Api => {
            // Snapshots and migrations are sent from the API thread: its list holds
            // the migration threads'.
            migration(&mut r);
            allow(&mut r, EVENTS);
            allow(&mut r, SERVE);
            allow(&mut r, SPAWN);
            ioctls(&mut r, &[KVM_TYPE, VFIO_TYPE, TTY_SOCKET_TYPE]);
            open_any(&mut r);
        }
        ThreadKind::NicServer => {
            // vfio-user: messages with fds, DMA maps of the client's memfds,
            // eventfds for doorbells and interrupts; one thread per client.
            allow(&mut r, POSITIONED_IO);
            allow(&mut r, SOCKET_IO);
            allow(&mut r, EVENTS);
            allow(&mut r, SERVE);
            allow(&mut r, SPAWN);
            ioctls(&mut r, &[TTY_SOCKET_TYPE]);
            open_read_only(&mut r);
        }
    }
    r
}

/// A migration stream: the socket or file it goes to, guest memory read through the
/// memfd, KVM's dirty log and the vCPUs' state.
fn migration(r: &mut Rules) {
    allow(r, POSITIONED_IO);
    allow(r, SOCKET_IO);
    allow(r, PLACEMENT);
    // fstatfs: whether guest RAM is on huge pages decides how its pages are written.
    allow(
        r,
        &[
            libc::SYS_ftruncate,
            libc::SYS_connect,
            libc::SYS_socket,
            libc::SYS_fstatfs,
        ],
    );
    ioctls(r, &[KVM_TYPE, VFIO_TYPE, TTY_SOCKET_TYPE]);
    open_read_only(r);
}

fn allow(r: &mut Rules, calls: &[i64]) {
    for &call in calls {
        r.insert(call, Vec::new());
    }
}

/// ioctl only with requests of these types.
fn ioctls(r: &mut Rules, types: &[u32]) {
    let rules = r.entry(libc::SYS_ioctl).or_default();
    for &t in types {
        rules.push(vec![Check {
            arg: 1,
            mask: 0xff00,
            value: t << 8,
        }]);
    }
}

/// openat only without write access, creation or truncation (/proc reads).
fn open_read_only(r: &mut Rules) {
    if r.get(&libc::SYS_openat).is_some_and(Vec::is_empty) {
        return; // already unconditional
    }
    let mask = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC) as u32;
    r.insert(
        libc::SYS_openat,
        vec![vec![Check {
            arg: 2,
            mask,
            value: 0,
        }]],
    );
}

fn open_any(r: &mut Rules) {
    r.insert(libc::SYS_openat, Vec::new());
}

/// prctl only to set or read the thread's name (std names every thread it starts).
fn prctl_names(r: &mut Rules) {
    let rules = [libc::PR_SET_NAME, libc::PR_GET_NAME]
        .into_iter()
        .map(|op| {
            vec![Check {
                arg: 0,
                mask: u32::MAX,
                value: op as u32,
            }]
        })
        .collect();
    r.insert(libc::SYS_prctl, rules);
}
