//! Whole vfio-user messages over a UNIX stream socket, with their file descriptors
//! (`SCM_RIGHTS`). A received message is bounded by [`MAX_MESSAGE`] before its body is
//! read, and at most [`MAX_FDS`] descriptors are accepted with it (any more are closed
//! by the kernel: the control buffer has no room for them).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

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
    let mut head = [0u8; HEADER_SIZE];
    let mut raw = [-1 as RawFd; MAX_FDS];
    let mut iov = [libc::iovec {
        iov_base: head.as_mut_ptr().cast(),
        iov_len: head.len(),
    }];
    // SAFETY: the iovec covers `head`, a live local buffer of exactly that length, into
    // which any bytes may be written.
    let (got, nfds) = retry_interrupted(|| unsafe { stream.recv_with_fds(&mut iov, &mut raw) })?;
    let fds: Vec<File> = raw[..nfds.min(MAX_FDS)]
        .iter()
        // SAFETY: the kernel just installed these descriptors for this process; nothing
        // else owns them, so each File becomes their only owner.
        .map(|&fd| unsafe { File::from_raw_fd(fd) })
        .collect();
    if got == 0 {
        return Err(SocketError::Closed);
    }
    let mut s = stream;
    if got < HEADER_SIZE {
        s.read_exact(&mut head[got..]).map_err(closed)?;
    }
    let header = Header::parse(&head)?;
    debug_assert!(header.size as usize <= MAX_MESSAGE);
    let mut body = vec![0; header.body_len()];
    s.read_exact(&mut body).map_err(closed)?;
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

fn closed(e: std::io::Error) -> SocketError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        SocketError::Closed
    } else {
        SocketError::Io(e)
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
        // SAFETY: installs a handler that does nothing, without SA_RESTART, so a
        // blocked recvmsg returns EINTR; the struct is zeroed then filled.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
                0
            );
        }
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
}
