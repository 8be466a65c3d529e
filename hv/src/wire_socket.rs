//! The stream sockets a wire runs over: a UNIX socket (one host) or TCP (QEMU's
//! `-netdev stream,addr.type=inet`, and kumo processes on two hosts). Both carry the
//! same bytes; these types let `crate::wire`'s threads hold either without caring
//! which, and give a TCP connection the options a wire of small messages needs.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};

/// A connected wire socket.
#[derive(Debug)]
pub enum WireStream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// A listening wire socket: its connections are [`WireStream`]s.
#[derive(Debug)]
pub enum WireListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// How long a TCP peer may stay silent to keepalive probes, or leave sent bytes
/// unacknowledged, before the connection counts as dead (about 20 s; see
/// [`WireStream::prepare`]).
const KEEPALIVE_IDLE_S: i32 = 10;
const KEEPALIVE_INTERVAL_S: i32 = 2;
const KEEPALIVE_PROBES: i32 = 5;
const USER_TIMEOUT_MS: i32 = 20_000;

impl WireStream {
    pub fn try_clone(&self) -> io::Result<WireStream> {
        Ok(match self {
            WireStream::Unix(s) => WireStream::Unix(s.try_clone()?),
            WireStream::Tcp(s) => WireStream::Tcp(s.try_clone()?),
        })
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            WireStream::Unix(s) => s.shutdown(how),
            WireStream::Tcp(s) => s.shutdown(how),
        }
    }

    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            WireStream::Unix(s) => s.set_nonblocking(nonblocking),
            WireStream::Tcp(s) => s.set_nonblocking(nonblocking),
        }
    }

    /// The peer, for logs (a UNIX peer is usually unnamed).
    pub fn peer(&self) -> String {
        match self {
            WireStream::Unix(_) => "a UNIX socket".into(),
            WireStream::Tcp(s) => match s.peer_addr() {
                Ok(addr) => addr.to_string(),
                Err(_) => "a TCP peer".into(),
            },
        }
    }

    /// Makes the socket ready to carry a wire: blocking (the wire's threads block on
    /// it), and for TCP:
    /// - TCP_NODELAY: the wire carries MPI's small messages one at a time, and Nagle
    ///   would hold each behind the previous one's ACK (delayed up to 40 ms).
    /// - SO_KEEPALIVE, probing after 10 s idle, and TCP_USER_TIMEOUT: a peer host that
    ///   vanishes (power, cable, a partition) sends no FIN, so without them the reader
    ///   blocks for good; a listening wire would then never take the next peer, and a
    ///   job would hang until its run limit. Linux's default keepalive (2 hours) is as
    ///   good as off, so the timers are ~20 s. A live but idle peer answers the probes
    ///   from its kernel, so an MPI rank computing for minutes keeps its wire; the
    ///   cost is a few empty segments per idle minute, and that a partition longer
    ///   than ~20 s ends the wire (an MPI job over it cannot recover from that anyway).
    pub fn prepare(&self) -> io::Result<()> {
        self.set_nonblocking(false)?;
        let WireStream::Tcp(s) = self else {
            return Ok(());
        };
        s.set_nodelay(true)?;
        let fd = s.as_raw_fd();
        set_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S)?;
        set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            KEEPALIVE_INTERVAL_S,
        )?;
        set_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES)?;
        // Keepalive probes only while nothing is in flight: unacknowledged bytes
        // otherwise retransmit for ~15 minutes before the write fails.
        set_int(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            USER_TIMEOUT_MS,
        )
    }
}

/// Sets an integer socket option.
fn set_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `fd` is an open socket the caller owns for the call's duration; the
    // option value is a c_int on our stack, its size passed with it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl Read for WireStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            WireStream::Unix(s) => s.read(buf),
            WireStream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for WireStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            WireStream::Unix(s) => s.write(buf),
            WireStream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            WireStream::Unix(s) => s.flush(),
            WireStream::Tcp(s) => s.flush(),
        }
    }
}

impl AsRawFd for WireStream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            WireStream::Unix(s) => s.as_raw_fd(),
            WireStream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl From<UnixStream> for WireStream {
    fn from(s: UnixStream) -> WireStream {
        WireStream::Unix(s)
    }
}

impl From<TcpStream> for WireStream {
    fn from(s: TcpStream) -> WireStream {
        WireStream::Tcp(s)
    }
}

impl WireListener {
    /// The next connection (WouldBlock if none waits and the listener is
    /// non-blocking).
    pub fn accept(&self) -> io::Result<WireStream> {
        Ok(match self {
            WireListener::Unix(l) => WireStream::Unix(l.accept()?.0),
            WireListener::Tcp(l) => WireStream::Tcp(l.accept()?.0),
        })
    }

    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        match self {
            WireListener::Unix(l) => l.set_nonblocking(nonblocking),
            WireListener::Tcp(l) => l.set_nonblocking(nonblocking),
        }
    }
}

impl AsRawFd for WireListener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            WireListener::Unix(l) => l.as_raw_fd(),
            WireListener::Tcp(l) => l.as_raw_fd(),
        }
    }
}

impl From<UnixListener> for WireListener {
    fn from(l: UnixListener) -> WireListener {
        WireListener::Unix(l)
    }
}

impl From<TcpListener> for WireListener {
    fn from(l: TcpListener) -> WireListener {
        WireListener::Tcp(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is an open socket; value and len are ours, len its size.
        let rc = unsafe { libc::getsockopt(fd, level, name, (&raw mut value).cast(), &mut len) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        value
    }

    #[test]
    fn a_prepared_tcp_stream_has_nodelay_and_keepalive_and_blocks() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        client.set_nonblocking(true).unwrap();
        let stream = WireStream::from(client);
        stream.prepare().unwrap();
        let WireStream::Tcp(s) = &stream else {
            unreachable!()
        };
        assert!(s.nodelay().unwrap());
        let fd = s.as_raw_fd();
        assert_eq!(get_int(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
        assert_eq!(
            get_int(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
            KEEPALIVE_IDLE_S
        );
        assert_eq!(
            get_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT),
            USER_TIMEOUT_MS
        );
        // SAFETY: fd is open; F_GETFL reads its flags.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        assert_eq!(flags & libc::O_NONBLOCK, 0, "blocking again");
    }
}
