//! Whole vfio-user messages over a UNIX stream socket, with their file descriptors
//! (`SCM_RIGHTS`). A received message is bounded by [`MAX_MESSAGE`] before its body is
//! read, and at most [`MAX_FDS`] descriptors are accepted with it (any more are closed
//! by the kernel: the control buffer has no room for them).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Instant;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use super::proto::{HEADER_SIZE, Header, MAX_FDS, MAX_MESSAGE, ProtoError};

/// Why a message could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("the peer closed the connection")]
    Closed,
    #[error("socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed message: {0}")]
    Proto(#[from] ProtoError),
    /// The deadline passed: `got` of the message's `wanted` bytes had come (`wanted`
    /// is the header's until the header is whole).
    #[error("{}", late(*got, *wanted))]
    Late { got: usize, wanted: usize },
}

fn late(got: usize, wanted: usize) -> String {
    if got == 0 {
        "no reply in time".into()
    } else {
        format!("a truncated reply ({got} of {wanted} bytes, then silence)")
    }
}

/// A received message: its header, body (exactly `header.body_len()` bytes) and the
/// descriptors that came with it (closed when dropped).
#[derive(Debug)]
pub struct Message {
    pub header: Header,
    pub body: Vec<u8>,
    pub fds: Vec<File>,
}

/// Sends `bytes` (one whole message) with `fds` beside its first byte.
pub fn send(stream: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> Result<(), SocketError> {
    if fds.is_empty() {
        let mut s = stream;
        s.write_all(bytes)?;
        return Ok(());
    }
    let sent = retry_interrupted(|| stream.send_with_fds(&[bytes], fds))?;
    if sent < bytes.len() {
        let mut s = stream;
        s.write_all(&bytes[sent..])?;
    }
    Ok(())
}

/// Receives one message (blocking).
pub fn receive(stream: &UnixStream) -> Result<Message, SocketError> {
    receive_until(stream, None)
}

/// Receives one message, or fails with [`SocketError::Late`] once `deadline` passes.
/// The deadline is absolute: a signal that interrupts a wait (a vCPU thread's kick)
/// does not start a new timeout, as `SO_RCVTIMEO` alone would on every restart.
/// Sets the stream's read timeout.
pub fn receive_by(stream: &UnixStream, deadline: Instant) -> Result<Message, SocketError> {
    receive_until(stream, Some(deadline))
}

/// Before each wait: the time left until `deadline` becomes the socket's timeout.
/// False if none is left.
fn arm(stream: &UnixStream, deadline: Option<Instant>) -> std::io::Result<bool> {
    let Some(deadline) = deadline else {
        return Ok(true);
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Ok(false);
    }
    stream.set_read_timeout(Some(left))?;
    Ok(true)
}

fn timed_out(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Reads `buf` whole (its first `done` bytes are already there) by `deadline`;
/// `before` bytes of the message came before `buf`, `wanted` is its whole size.
fn read_by(
    stream: &UnixStream,
    buf: &mut [u8],
    mut done: usize,
    deadline: Option<Instant>,
    before: usize,
    wanted: usize,
) -> Result<(), SocketError> {
    let mut s = stream;
    while done < buf.len() {
        let late = SocketError::Late {
            got: before + done,
            wanted,
        };
        if !arm(stream, deadline)? {
            return Err(late);
        }
        match s.read(&mut buf[done..]) {
            Ok(0) => return Err(SocketError::Closed),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if timed_out(&e) && deadline.is_some() => return Err(late),
            Err(e) => return Err(SocketError::Io(e)),
        }
    }
    Ok(())
}

fn receive_until(stream: &UnixStream, deadline: Option<Instant>) -> Result<Message, SocketError> {
    let mut head = [0u8; HEADER_SIZE];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: head.as_mut_ptr().cast(),
        iov_len: head.len(),
    }];
    let nothing = SocketError::Late {
        got: 0,
        wanted: HEADER_SIZE,
    };
    let (got, nfds) = loop {
        if !arm(stream, deadline)? {
            return Err(nothing);
        }
        // SAFETY: the iovec covers `head`, a live local buffer of exactly that length,
        // into which any bytes may be written.
        match unsafe { stream.recv_with_fds(&mut iov, &mut raw) } {
            Ok(received) => break received,
            // A signal before any byte moved (vCPU threads are kicked): wait again,
            // for the time left.
            Err(e) if e.errno() == libc::EINTR => continue,
            Err(e) if deadline.is_some() && (e.errno() == libc::EAGAIN) => return Err(nothing),
            Err(e) => return Err(std::io::Error::from_raw_os_error(e.errno()).into()),
        }
    };
    let fds: Vec<File> = raw[..nfds.min(MAX_FDS)]
        .iter()
        // SAFETY: the kernel just installed these descriptors for this process; nothing
        // else owns them, so each File becomes their only owner.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    if got == 0 {
        return Err(SocketError::Closed);
    }
    read_by(stream, &mut head, got, deadline, 0, HEADER_SIZE)?;
    let header = Header::parse(&head)?;
    debug_assert!(header.size as usize <= MAX_MESSAGE);
    let mut body = vec![0; header.body_len()];
    read_by(
        stream,
        &mut body,
        0,
        deadline,
        HEADER_SIZE,
        HEADER_SIZE + header.body_len(),
    )?;
    Ok(Message { header, body, fds })
}

/// Runs `call` (a sendmsg or recvmsg) again while a signal interrupts it before it
/// moved any byte: vCPU threads, which call the device from their exits, are kicked
/// with signals by the scheduler and the watchdog. Taking the interruption for an
/// error once left the reply in the socket for the next request to misread.
fn retry_interrupted<T>(
    mut call: impl FnMut() -> Result<T, vmm_sys_util::errno::Error>,
) -> std::io::Result<T> {
    loop {
        match call() {
            Err(e) if e.errno() == libc::EINTR => continue,
            other => return other.map_err(|e| std::io::Error::from_raw_os_error(e.errno())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfio_user::proto::encode_reply;

    extern "C" fn ignore(_: libc::c_int) {}

    /// A signal that lands while a thread waits for a reply (as the scheduler's kicks
    /// land on vCPU threads) must not lose the reply.
    #[test]
    fn a_signal_during_a_receive_does_not_lose_the_message() {
        install_ignore();
        let (ours, theirs) = UnixStream::pair().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            receive(&ours)
        });
        let thread = rx.recv().unwrap();
        // Kick it several times while it waits in recvmsg, then answer.
        for _ in 0..5 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            // SAFETY: the thread is alive until it has received the message below.
            unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
        }
        send(&theirs, &encode_reply(7, 2, b"reply"), &[]).unwrap();
        let message = waiter.join().unwrap().expect("the message, not EINTR");
        assert_eq!(message.header.id, 7);
        assert_eq!(message.body, b"reply");
    }

    /// Waits for a reply from `theirs` (which sends `partial` first, then nothing)
    /// while being kicked every 20 ms for as long as it waits, as a vCPU thread is.
    fn kicked_wait(partial: &[u8]) -> Result<Message, SocketError> {
        install_ignore();
        let (ours, theirs) = UnixStream::pair().unwrap();
        theirs.set_nonblocking(true).unwrap();
        let mut t = &theirs;
        t.write_all(partial).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done_waiter = done.clone();
        let waiter = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let deadline = Instant::now() + std::time::Duration::from_millis(300);
            let got = receive_by(&ours, deadline);
            done_waiter.store(true, std::sync::atomic::Ordering::SeqCst);
            got
        });
        let thread = rx.recv().unwrap();
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            if !done.load(std::sync::atomic::Ordering::SeqCst) {
                // SAFETY: the thread is alive until it stored `done`; a kick that
                // lands after that hits the no-op handler.
                unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
            }
        }
        let got = waiter.join().unwrap();
        drop(theirs);
        got
    }

    /// SIGUSR1 (the tests' kick) gets a handler that does nothing, without
    /// SA_RESTART, so a blocked recvmsg returns EINTR as a kicked vCPU thread's does.
    fn install_ignore() {
        // SAFETY: installs a no-op handler; the struct is zeroed then filled.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
                0
            );
        }
    }

    /// A silent peer fails the wait at its deadline, however often the waiting thread
    /// is kicked (each kick used to restart the whole timeout).
    #[test]
    fn a_silent_peer_fails_a_kicked_wait_at_its_deadline() {
        match kicked_wait(&[]) {
            Err(SocketError::Late { got: 0, .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_truncated_reply_fails_a_kicked_wait_and_says_how_much_came() {
        let whole = encode_reply(7, 2, b"a reply of some length");
        match kicked_wait(&whole[..HEADER_SIZE + 3]) {
            Err(SocketError::Late { got, wanted }) => {
                assert_eq!(got, HEADER_SIZE + 3);
                assert_eq!(wanted, whole.len());
            }
            other => panic!("{other:?}"),
        }
    }
}
