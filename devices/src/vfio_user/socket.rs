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
    let sent = stream
        .send_with_fds(&[bytes], fds)
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
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
    let (got, nfds) = unsafe { stream.recv_with_fds(&mut iov, &mut raw) }
        .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
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

fn closed(e: std::io::Error) -> SocketError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        SocketError::Closed
    } else {
        SocketError::Io(e)
    }
}
