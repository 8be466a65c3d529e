//! Opening a job's wire: connecting to (retrying until a deadline) or listening for
//! the other end a [`WireSpec`] names, over a UNIX socket or TCP, and plugging the
//! stream into domain 0's switch (`hv::net`, whose wire threads carry the frames).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hv::net::Network;
use hv::placement::ThreadGroup;
use hv::wire_socket::{WireListener, WireStream};

use crate::spec::job::{WireAddr, WireSpec};

/// Pause between attempts to reach a peer that is not there yet.
const RETRY: Duration = Duration::from_millis(20);
/// Longest single TCP connect: a host that drops SYNs must not use up the whole
/// patience on one of its addresses while another would answer.
const TCP_CONNECT_MAX: Duration = Duration::from_secs(3);

/// Opening a wire ([`WireSpec`] is its plain description).
pub trait WireAttach {
    fn attach(
        &self,
        network: &Network,
        patience: Duration,
        dom0: Option<&Arc<ThreadGroup>>,
    ) -> Result<WireGuard>;
}

impl WireAttach for WireSpec {
    /// Opens the wire and plugs it into `network`: a connection to a listener, or the
    /// first peer of this side's listener, which keeps listening (and a UNIX socket's
    /// file stays) until the returned guard is dropped: when that peer's connection
    /// closes (its VM moved to another process), the next one takes the same switch
    /// port.
    fn attach(
        &self,
        network: &Network,
        patience: Duration,
        dom0: Option<&Arc<ThreadGroup>>,
    ) -> Result<WireGuard> {
        let deadline = Instant::now() + patience;
        match self {
            WireSpec::Connect(addr) => {
                let stream = connect(addr, deadline).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot reach the wire {} within {:.1} s: {e}",
                        shown(addr),
                        patience.as_secs_f64()
                    )
                })?;
                network.attach_wire(stream, dom0)?;
                Ok(WireGuard { listening: None })
            }
            WireSpec::Listen(addr) => {
                let (listener, guard) = listen(addr)?;
                listener.set_nonblocking(true)?;
                let stream = loop {
                    match listener.accept() {
                        Ok(stream) => break stream,
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                && Instant::now() < deadline
                                && hv::stop::requested().is_none() =>
                        {
                            std::thread::sleep(RETRY);
                        }
                        Err(e) => bail!(
                            "no peer connected to {} within {:.1} s ({e})",
                            shown(addr),
                            patience.as_secs_f64()
                        ),
                    }
                };
                tracing::info!("wire {}: peer {}", shown(addr), stream.peer());
                network.attach_listening_wire(stream, listener, dom0)?;
                Ok(guard)
            }
        }
    }
}

/// How messages name a wire's address: a UNIX socket by its path (as before TCP).
fn shown(addr: &WireAddr) -> String {
    match addr {
        WireAddr::Unix(path) => path.display().to_string(),
        WireAddr::Tcp { .. } => addr.to_string(),
    }
}

/// Connects to `addr`, retrying (a listener not up yet, a name not resolving yet)
/// until `deadline`; the last failure if it passes.
fn connect(addr: &WireAddr, deadline: Instant) -> std::io::Result<WireStream> {
    loop {
        let attempt = match addr {
            WireAddr::Unix(path) => UnixStream::connect(path).map(WireStream::from),
            WireAddr::Tcp { host, port } => connect_tcp(host, *port, deadline),
        };
        match attempt {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!("wire {}: {e}; retrying", shown(addr));
                std::thread::sleep(RETRY);
            }
            Err(e) => return Err(e),
        }
    }
}

/// One attempt at each address `host` resolves to, in order.
fn connect_tcp(host: &str, port: u16, deadline: Instant) -> std::io::Result<WireStream> {
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    let mut last = std::io::Error::new(
        std::io::ErrorKind::NotFound,
        format!("{host} resolves to no address"),
    );
    for addr in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = left.clamp(Duration::from_millis(10), TCP_CONNECT_MAX);
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(stream) => return Ok(stream.into()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Binds `addr`'s listener; the guard removes a UNIX socket's file.
fn listen(addr: &WireAddr) -> Result<(WireListener, WireGuard)> {
    match addr {
        WireAddr::Unix(path) => {
            let listener = UnixListener::bind(path)
                .with_context(|| format!("cannot listen on {}", path.display()))?;
            crate::signals::track_socket(path.clone());
            Ok((
                listener.into(),
                WireGuard {
                    listening: Some(path.clone()),
                },
            ))
        }
        WireAddr::Tcp { host, port } => {
            // std binds with SO_REUSEADDR: a job run again at once finds its port free
            // although the last run's connection lingers in TIME_WAIT.
            let listener = TcpListener::bind((host.as_str(), *port))
                .with_context(|| format!("cannot listen on {addr}"))?;
            let bound = listener.local_addr()?;
            if *port == 0 {
                // The port the system chose: the peer must be told it.
                eprintln!("kumo: wire listening on tcp:{bound}");
            } else {
                tracing::info!("wire: listening on tcp:{bound}");
            }
            Ok((listener.into(), WireGuard { listening: None }))
        }
    }
}

/// A listening wire's UNIX socket file, removed when the job ends.
pub struct WireGuard {
    listening: Option<PathBuf>,
}

impl Drop for WireGuard {
    fn drop(&mut self) {
        if let Some(path) = self.listening.take() {
            let _ = std::fs::remove_file(&path);
            crate::signals::untrack_socket(&path);
        }
    }
}
