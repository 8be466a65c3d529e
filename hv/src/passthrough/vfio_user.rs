//! kumo's vfio-user client: the [`RegionAccess`] of a device served by another process,
//! and the attach-time questions (regions, interrupts, doorbells) whose answers are
//! checked before use. Every exchange is one request and its reply under one lock
//! (vCPU threads share the socket); a reply that does not answer the request, or a
//! server silent for [`REPLY_TIMEOUT`], fails the access and the device.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use devices::pci::passthrough::RegionAccess;

use super::Backend;
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
    /// The next message id; held across each request and its reply.
    next_id: Mutex<u16>,
}

impl VfioUserClient {
    /// Connects to the server at `path` and agrees on the protocol version.
    pub fn connect(path: &Path) -> Result<VfioUserClient, String> {
        let stream = UnixStream::connect(path)
            .map_err(|e| format!("cannot connect to {}: {e}", path.display()))?;
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let client = VfioUserClient {
            path: path.to_owned(),
            stream,
            next_id: Mutex::new(0),
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

    /// One request and its checked reply.
    pub fn call(&self, request: &Request, fds: &[RawFd]) -> Result<Message, String> {
        let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
        let id = *next;
        *next = next.wrapping_add(1);
        let command = request.command();
        socket::send(&self.stream, &request.encode(id), fds).map_err(|e| e.to_string())?;
        let reply = socket::receive(&self.stream).map_err(|e| match e {
            socket::SocketError::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                format!("no reply within {} s", REPLY_TIMEOUT.as_secs())
            }
            other => other.to_string(),
        })?;
        proto::check_reply(&reply.header, id, command).map_err(|e| e.to_string())?;
        Ok(reply)
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
