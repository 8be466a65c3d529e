//! kumo's vfio-user client: the [`RegionAccess`] of a device served by another process,
//! and the attach-time questions (regions, interrupts, doorbells) whose answers are
//! checked before use. Every exchange is one request and its reply under one lock
//! (vCPU threads share the socket); a reply that does not answer the request, or a
//! server silent for [`REPLY_TIMEOUT`], fails the access and the device.
//!
//! The timeout is a deadline per request that the vCPU threads' kicks do not restart.
//! A server that missed it (silent, or a reply cut short) has lost step with the
//! client: the connection counts as broken, every later access fails at once, and
//! the VM gets one report naming the server and the request it did not answer.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devices::pci::passthrough::RegionAccess;

use super::Backend;
use crate::coordinator::DeviceHealth;
use devices::vfio_user::proto::{
    self, DeviceInfo, IoFd, IrqInfo, MAX_DATA, RegionInfo, Request, parse_io_fds,
    parse_region_read, vfio,
};
use devices::vfio_user::socket::{self, Message};
use vmm_sys_util::eventfd::EventFd;

/// How long a reply may take before the device counts as failed.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

pub struct VfioUserClient {
    path: PathBuf,
    stream: UnixStream,
    /// The next message id and, once the server missed a deadline, why the connection
    /// is broken; held across each request and its reply.
    exchange: Mutex<Exchange>,
    /// Where a broken connection is reported while the VM runs.
    health: Mutex<Option<Arc<DeviceHealth>>>,
}

#[derive(Default)]
struct Exchange {
    next_id: u16,
    broken: Option<String>,
}

/// A request's name in a report.
fn command_name(command: u16) -> String {
    use proto::command::*;
    match command {
        VERSION => "VERSION".into(),
        DMA_MAP => "DMA_MAP".into(),
        DMA_UNMAP => "DMA_UNMAP".into(),
        DEVICE_GET_INFO => "DEVICE_GET_INFO".into(),
        DEVICE_GET_REGION_INFO => "DEVICE_GET_REGION_INFO".into(),
        DEVICE_GET_REGION_IO_FDS => "DEVICE_GET_REGION_IO_FDS".into(),
        DEVICE_GET_IRQ_INFO => "DEVICE_GET_IRQ_INFO".into(),
        DEVICE_SET_IRQS => "DEVICE_SET_IRQS".into(),
        REGION_READ => "REGION_READ".into(),
        REGION_WRITE => "REGION_WRITE".into(),
        DEVICE_RESET => "DEVICE_RESET".into(),
        other => format!("command {other}"),
    }
}

impl VfioUserClient {
    /// Connects to the server at `path` and agrees on the protocol version.
    pub fn connect(path: &Path) -> Result<VfioUserClient, String> {
        let stream = UnixStream::connect(path)
            .map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
        // A server that stops reading cannot hold a sender for ever either.
        stream
            .set_write_timeout(Some(REPLY_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let client = VfioUserClient {
            path: path.to_owned(),
            stream,
            exchange: Mutex::new(Exchange::default()),
            health: Mutex::new(None),
        };
        let reply = client.call(
            &Request::Version {
                major: proto::VERSION_MAJOR,
                minor: proto::VERSION_MINOR,
                capabilities: format!(
                    "{{\"capabilities\":{{\"max_msg_fds\":{}}}}}",
                    proto::MAX_FDS
                ),
            },
            &[],
        )?;
        let major = reply
            .body
            .get(..2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]));
        if major != Some(proto::VERSION_MAJOR) {
            return Err(format!("the server speaks vfio-user {major:?}, not 0.x"));
        }
        Ok(client)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// One request and its checked reply, within [`REPLY_TIMEOUT`].
    pub fn call(&self, request: &Request, fds: &[RawFd]) -> Result<Message, String> {
        let mut exchange = self.exchange.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &exchange.broken {
            return Err(why.clone());
        }
        let id = exchange.next_id;
        exchange.next_id = id.wrapping_add(1);
        let command = request.command();
        let deadline = Instant::now() + REPLY_TIMEOUT;
        let sent = socket::send(&self.stream, &request.encode(id), fds);
        let reply = sent.and_then(|()| socket::receive_by(&self.stream, deadline));
        let reply = match reply {
            Ok(reply) => reply,
            Err(e) => {
                let why = self.missed(command, &e);
                // A hang-up is the monitor's to report; anything else leaves the
                // stream out of step (a late reply would answer the next request).
                if !matches!(e, socket::SocketError::Closed) {
                    exchange.broken = Some(why.clone());
                    drop(exchange);
                    self.report(&why);
                }
                return Err(why);
            }
        };
        proto::check_reply(&reply.header, id, command).map_err(|e| e.to_string())?;
        Ok(reply)
    }

    /// What the server failed to do for `command`.
    fn missed(&self, command: u16, error: &socket::SocketError) -> String {
        let name = command_name(command);
        match error {
            socket::SocketError::Late { .. } => format!(
                "the server at {} did not answer {name} within {} s: {error}",
                self.path.display(),
                REPLY_TIMEOUT.as_secs()
            ),
            other => format!(
                "the server at {} failed {name}: {other}",
                self.path.display()
            ),
        }
    }

    /// Tells the running VM its device failed (once: the first report wins).
    fn report(&self, why: &str) {
        if let Some(health) = &*self.health.lock().unwrap_or_else(|e| e.into_inner()) {
            health.fail(format!("passthrough vfio-user: {why}; the device failed"));
        }
    }
}

impl Backend for VfioUserClient {
    /// `DMA_MAP` with the memfd: the server maps guest memory itself.
    fn dma_map(
        &self,
        fd: RawFd,
        file_offset: u64,
        _host: u64,
        guest: u64,
        size: u64,
    ) -> Result<(), String> {
        self.call(
            &Request::DmaMap {
                flags: vfio::DMA_READ | vfio::DMA_WRITE,
                offset: file_offset,
                address: guest,
                size,
            },
            &[fd],
        )
        .map(drop)
    }

    fn device_info(&self) -> Result<DeviceInfo, String> {
        let reply = self.call(&Request::DeviceGetInfo, &[])?;
        DeviceInfo::parse(&reply.body).map_err(|e| e.to_string())
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo, String> {
        let reply = self.call(&Request::GetRegionInfo { index }, &[])?;
        let info = RegionInfo::parse(&reply.body).map_err(|e| e.to_string())?;
        if info.index != index {
            return Err(format!("asked for region {index}, told of {}", info.index));
        }
        Ok(info)
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, String> {
        let reply = self.call(&Request::GetIrqInfo { index }, &[])?;
        let info = IrqInfo::parse(&reply.body).map_err(|e| e.to_string())?;
        if info.index != index {
            return Err(format!(
                "asked for IRQ index {index}, told of {}",
                info.index
            ));
        }
        Ok(info)
    }

    /// The doorbells of region `index`: where a write only signals, and the eventfd
    /// it signals (to be registered as a KVM ioeventfd).
    fn doorbells(&self, index: u32) -> Result<Vec<(IoFd, EventFd)>, String> {
        let reply = self.call(&Request::GetRegionIoFds { index }, &[])?;
        let entries =
            parse_io_fds(&reply.body, index, reply.fds.len()).map_err(|e| e.to_string())?;
        let mut fds: Vec<Option<File>> = reply.fds.into_iter().map(Some).collect();
        entries
            .into_iter()
            .map(|entry| {
                let file = fds
                    .get_mut(entry.fd_index as usize)
                    .and_then(Option::take)
                    .ok_or("two doorbells name one descriptor")?;
                // SAFETY: `into_raw_fd` gives up the File's ownership of a descriptor
                // this process received; the EventFd becomes its only owner.
                let eventfd = unsafe { EventFd::from_raw_fd(file.into_raw_fd()) };
                Ok((entry, eventfd))
            })
            .collect()
    }

    /// Interrupts `0..fds.len()` of the MSI-X index signal `fds`.
    fn set_msix(&self, fds: &[RawFd]) -> Result<(), String> {
        self.call(
            &Request::SetIrqs {
                flags: vfio::IRQ_SET_DATA_EVENTFD | vfio::IRQ_SET_ACTION_TRIGGER,
                index: vfio::PCI_MSIX_IRQ_INDEX,
                start: 0,
                count: fds.len() as u32,
            },
            fds,
        )
        .map(drop)
    }

    fn hangup_fd(&self) -> Option<RawFd> {
        Some(self.stream.as_raw_fd())
    }

    fn report_failures_to(&self, health: Arc<DeviceHealth>) {
        *self.health.lock().unwrap_or_else(|e| e.into_inner()) = Some(health);
    }

    /// Closes the connection (the server sees the client leave).
    fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

impl RegionAccess for VfioUserClient {
    fn region_read(&self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), String> {
        let mut at = offset;
        for chunk in data.chunks_mut(MAX_DATA) {
            let count = chunk.len();
            let reply = self.call(
                &Request::RegionRead {
                    region,
                    offset: at,
                    count: count as u32,
                },
                &[],
            )?;
            let bytes =
                parse_region_read(&reply.body, region, at, count).map_err(|e| e.to_string())?;
            chunk.copy_from_slice(bytes);
            at += count as u64;
        }
        Ok(())
    }

    fn region_write(&self, region: u32, offset: u64, data: &[u8]) -> Result<(), String> {
        let mut at = offset;
        for chunk in data.chunks(MAX_DATA) {
            self.call(
                &Request::RegionWrite {
                    region,
                    offset: at,
                    data: chunk.to_vec(),
                },
                &[],
            )?;
            at += chunk.len() as u64;
        }
        Ok(())
    }
}
