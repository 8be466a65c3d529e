//! The kernel's VFIO for `--passthrough BDF`: which host device, and whether this host
//! can hand it to a VM. Each check names the one thing that is missing, in the order
//! an administrator would fix them: the address is well formed, the device exists, it
//! sits in an IOMMU group, it is bound to `vfio-pci`, and the VFIO container and group
//! devices exist.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use devices::pci::passthrough::RegionAccess;
use devices::vfio_user::proto::vfio as vfio_consts;
use devices::vfio_user::proto::{DeviceInfo, IoFd, IrqInfo, RegionInfo};
use vmm_sys_util::eventfd::EventFd;

use super::{Backend, DeviceMapping};

/// A PCI address: domain, bus, device, function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bdf {
    pub domain: u16,
    pub bus: u8,
    pub device: u8,
    pub function: u8,
}

impl std::fmt::Display for Bdf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl std::str::FromStr for Bdf {
    type Err = String;
    /// `DDDD:BB:DD.F` (hex; the domain may be left out: `BB:DD.F`).
    fn from_str(text: &str) -> Result<Bdf, String> {
        let bad = || {
            format!(
                "--passthrough {text:?}: not a PCI address (DDDD:BB:DD.F, e.g. 0000:03:00.0) nor vfio-user:PATH"
            )
        };
        let hex = |s: &str, digits: usize| {
            (s.len() == digits && s.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(s, 16).ok())
                .flatten()
                .ok_or_else(bad)
        };
        let parts: Vec<&str> = text.split(':').collect();
        let (domain, bus, rest) = match parts.as_slice() {
            [domain, bus, rest] => (hex(domain, 4)?, hex(bus, 2)?, *rest),
            [bus, rest] => (0, hex(bus, 2)?, *rest),
            _ => return Err(bad()),
        };
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let (device, function) = (hex(device, 2)?, hex(function, 1)?);
        if device > 0x1f || function > 7 {
            return Err(bad());
        }
        Ok(Bdf {
            domain: domain as u16,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

/// What this host lacks to pass `bdf` through (one line each).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VfioError {
    #[error("--passthrough {bdf}: no such PCI device on this host (nothing at {})", path.display())]
    NoDevice { bdf: Bdf, path: PathBuf },
    #[error(
        "--passthrough {bdf}: the device has no IOMMU group (no IOMMU on this host, or it is off: boot with intel_iommu=on or amd_iommu=on)"
    )]
    NoIommuGroup { bdf: Bdf },
    #[error(
        "--passthrough {bdf}: the device is bound to {driver}, not vfio-pci (unbind it and bind vfio-pci)"
    )]
    WrongDriver { bdf: Bdf, driver: String },
    #[error("--passthrough {bdf}: no {} (load the vfio-pci module)", path.display())]
    NoVfio { bdf: Bdf, path: PathBuf },
    #[error("--passthrough {bdf}: {}: {why}", path.display())]
    Open {
        bdf: Bdf,
        path: PathBuf,
        why: String,
    },
}

/// Where the checks look (the real host's `/sys` and `/dev`, or a test's tree).
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub sysfs_devices: PathBuf,
    pub dev_vfio: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            sysfs_devices: "/sys/bus/pci/devices".into(),
            dev_vfio: "/dev/vfio".into(),
        }
    }
}

/// The group device a VFIO user opens for `bdf`, after every check passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioTarget {
    pub container: PathBuf,
    pub group: PathBuf,
}

/// Checks that `bdf` can be passed through on the host under `paths`.
pub fn check(bdf: &Bdf, paths: &HostPaths) -> Result<VfioTarget, VfioError> {
    let device = paths.sysfs_devices.join(bdf.to_string());
    if !device.exists() {
        return Err(VfioError::NoDevice {
            bdf: *bdf,
            path: device,
        });
    }
    let group =
        link_name(&device.join("iommu_group")).ok_or(VfioError::NoIommuGroup { bdf: *bdf })?;
    let driver = link_name(&device.join("driver")).unwrap_or_else(|| "no driver".into());
    if driver != "vfio-pci" {
        return Err(VfioError::WrongDriver { bdf: *bdf, driver });
    }
    let container = paths.dev_vfio.join("vfio");
    if !container.exists() {
        return Err(VfioError::NoVfio {
            bdf: *bdf,
            path: container,
        });
    }
    let group = paths.dev_vfio.join(group);
    if !group.exists() {
        return Err(VfioError::NoVfio {
            bdf: *bdf,
            path: group,
        });
    }
    Ok(VfioTarget { container, group })
}

/// The last component of the symlink at `link` (a sysfs group number or driver name).
fn link_name(link: &Path) -> Option<String> {
    let target = std::fs::read_link(link).ok()?;
    Some(target.file_name()?.to_string_lossy().into_owned())
}

/// Checks `bdf` on this host: the checks above on the real `/sys` and `/dev`.
pub fn open(bdf: &Bdf) -> Result<VfioTarget, VfioError> {
    check(bdf, &HostPaths::default())
}

/// linux/vfio.h: ioctl numbers (`_IO(';', 100 + n)`) and the flags kumo uses.
mod sys {
    const fn io(nr: u64) -> u64 {
        (b';' as u64) << 8 | nr
    }
    pub const GET_API_VERSION: u64 = io(100);
    pub const CHECK_EXTENSION: u64 = io(101);
    pub const SET_IOMMU: u64 = io(102);
    pub const GROUP_GET_STATUS: u64 = io(103);
    pub const GROUP_SET_CONTAINER: u64 = io(104);
    pub const GROUP_GET_DEVICE_FD: u64 = io(106);
    pub const DEVICE_GET_INFO: u64 = io(107);
    pub const DEVICE_GET_REGION_INFO: u64 = io(108);
    pub const DEVICE_GET_IRQ_INFO: u64 = io(109);
    pub const DEVICE_SET_IRQS: u64 = io(110);
    pub const IOMMU_MAP_DMA: u64 = io(113);
    pub const API_VERSION: i32 = 0;
    pub const TYPE1_IOMMU: u64 = 1;
    pub const TYPE1V2_IOMMU: u64 = 3;
    pub const GROUP_FLAGS_VIABLE: u32 = 1;
    pub const DMA_MAP_READ_WRITE: u32 = 3;
    pub const REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
    pub const REGION_INFO_FLAG_CAPS: u32 = 1 << 3;
    pub const REGION_INFO_CAP_SPARSE_MMAP: u16 = 1;
}

/// A host device opened through the kernel's VFIO: container (with a type-1 IOMMU),
/// group and device descriptors. Regions are read and written with `pread`/`pwrite`
/// on the device descriptor at each region's offset; the parts of BARs the kernel lets
/// us `mmap` (`VFIO_REGION_INFO_FLAG_MMAP`, cut by its sparse-mmap capability) are
/// mapped and become direct windows into the guest, all but the MSI-X pages.
pub struct VfioDevice {
    bdf: Bdf,
    container: std::fs::File,
    _group: std::fs::File,
    device: std::fs::File,
    /// Each region's offset in the device descriptor and size, by index.
    regions: Vec<(u64, u64)>,
}

fn ioctl_error(bdf: &Bdf, path: &Path, what: &str) -> VfioError {
    VfioError::Open {
        bdf: *bdf,
        path: path.to_owned(),
        why: format!("{what}: {}", std::io::Error::last_os_error()),
    }
}

impl VfioDevice {
    /// Checks `bdf` (one line naming what is missing), then opens container, group and
    /// device and reads the regions' layout.
    pub fn open(bdf: &Bdf) -> Result<VfioDevice, VfioError> {
        use std::os::fd::AsRawFd;
        let target = open(bdf)?;
        let rw = |path: &Path| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| VfioError::Open {
                    bdf: *bdf,
                    path: path.to_owned(),
                    why: e.to_string(),
                })
        };
        let container = rw(&target.container)?;
        // SAFETY: argument-less ioctls on a descriptor this function owns.
        let version = unsafe { libc::ioctl(container.as_raw_fd(), sys::GET_API_VERSION as _) };
        if version != sys::API_VERSION {
            return Err(ioctl_error(bdf, &target.container, "VFIO API version"));
        }
        // SAFETY: as above; the argument is an integer, not a pointer.
        let iommu = if unsafe {
            libc::ioctl(
                container.as_raw_fd(),
                sys::CHECK_EXTENSION as _,
                sys::TYPE1V2_IOMMU,
            )
        } > 0
        {
            sys::TYPE1V2_IOMMU
        } else {
            sys::TYPE1_IOMMU
        };
        let group = rw(&target.group)?;
        let mut status = [8u32, 0];
        // SAFETY: `status` is a live vfio_group_status (argsz, flags) the kernel fills.
        if unsafe {
            libc::ioctl(
                group.as_raw_fd(),
                sys::GROUP_GET_STATUS as _,
                status.as_mut_ptr(),
            )
        } < 0
        {
            return Err(ioctl_error(bdf, &target.group, "VFIO_GROUP_GET_STATUS"));
        }
        if status[1] & sys::GROUP_FLAGS_VIABLE == 0 {
            return Err(VfioError::Open {
                bdf: *bdf,
                path: target.group.clone(),
                why: "the IOMMU group is not viable (bind every device in it to vfio-pci)".into(),
            });
        }
        let container_fd = container.as_raw_fd();
        // SAFETY: the argument points at a live descriptor number for the call.
        if unsafe {
            libc::ioctl(
                group.as_raw_fd(),
                sys::GROUP_SET_CONTAINER as _,
                &container_fd,
            )
        } < 0
        {
            return Err(ioctl_error(bdf, &target.group, "VFIO_GROUP_SET_CONTAINER"));
        }
        // SAFETY: an integer argument.
        if unsafe { libc::ioctl(container_fd, sys::SET_IOMMU as _, iommu) } < 0 {
            return Err(ioctl_error(bdf, &target.container, "VFIO_SET_IOMMU"));
        }
        let name = std::ffi::CString::new(bdf.to_string())
            .map_err(|_| VfioError::NoIommuGroup { bdf: *bdf })?;
        // SAFETY: `name` is a NUL-terminated string alive for the call; the kernel
        // returns a new descriptor or -1.
        let fd = unsafe {
            libc::ioctl(
                group.as_raw_fd(),
                sys::GROUP_GET_DEVICE_FD as _,
                name.as_ptr(),
            )
        };
        if fd < 0 {
            return Err(ioctl_error(bdf, &target.group, "VFIO_GROUP_GET_DEVICE_FD"));
        }
        // SAFETY: the kernel just returned this descriptor; nothing else owns it.
        let device = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut opened = VfioDevice {
            bdf: *bdf,
            container,
            _group: group,
            device,
            regions: Vec::new(),
        };
        let info = opened.raw_device_info().map_err(|why| VfioError::Open {
            bdf: *bdf,
            path: target.group.clone(),
            why,
        })?;
        for index in 0..info.regions.min(16) {
            let region = opened
                .raw_region_info(index)
                .map_err(|why| VfioError::Open {
                    bdf: *bdf,
                    path: target.group.clone(),
                    why,
                })?;
            opened.regions.push((region.offset, region.size));
        }
        Ok(opened)
    }

    /// An ioctl on the device descriptor whose argument the kernel reads (and fills).
    ///
    /// # Safety
    /// `arg` points to a live, writable buffer at least as long as the `argsz` in it
    /// (the structure `request` takes), for the duration of the call.
    unsafe fn device_ioctl(&self, request: u64, arg: *mut u8, what: &str) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        // SAFETY: the caller vouches for `arg`; the descriptor is this device's.
        if unsafe { libc::ioctl(self.device.as_raw_fd(), request as _, arg) } < 0 {
            return Err(format!("{what}: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    fn raw_device_info(&self) -> Result<DeviceInfo, String> {
        let mut raw = [0u8; 16];
        raw[0..4].copy_from_slice(&16u32.to_le_bytes());
        // SAFETY: `raw` is a live vfio_device_info of argsz 16.
        unsafe {
            self.device_ioctl(
                sys::DEVICE_GET_INFO,
                raw.as_mut_ptr(),
                "VFIO_DEVICE_GET_INFO",
            )?
        };
        let word = |at| le32(&raw, at).unwrap_or(0);
        Ok(DeviceInfo {
            flags: word(4),
            regions: word(8),
            irqs: word(12),
        })
    }

    fn raw_region_info(&self, index: u32) -> Result<RegionInfo, String> {
        let raw = self.region_info_bytes(index)?;
        Ok(RegionInfo {
            flags: le32(&raw, 4).unwrap_or(0),
            index: le32(&raw, 8).unwrap_or(0),
            size: le64(&raw, 16).unwrap_or(0),
            offset: le64(&raw, 24).unwrap_or(0),
        })
    }

    /// Region `index`'s `vfio_region_info` with its capability chain, as bytes.
    fn region_info_bytes(&self, index: u32) -> Result<Vec<u8>, String> {
        let mut argsz = 32u32;
        for _ in 0..2 {
            // The kernel copies the structure in and out: no alignment needed.
            let mut raw = vec![0u8; argsz as usize];
            raw[0..4].copy_from_slice(&argsz.to_le_bytes());
            raw[8..12].copy_from_slice(&index.to_le_bytes());
            // SAFETY: `raw` is a live buffer of `argsz` bytes the kernel fills with a
            // vfio_region_info and its capabilities (never more than argsz).
            unsafe {
                self.device_ioctl(
                    sys::DEVICE_GET_REGION_INFO,
                    raw.as_mut_ptr(),
                    &format!("VFIO_DEVICE_GET_REGION_INFO {index}"),
                )?
            };
            let wanted = le32(&raw, 0).unwrap_or(0);
            if wanted <= argsz || wanted > MAX_REGION_INFO {
                return Ok(raw);
            }
            argsz = wanted; // the capabilities did not fit: ask again with room
        }
        Err(format!(
            "VFIO_DEVICE_GET_REGION_INFO {index}: its size keeps growing"
        ))
    }

    /// Where `[offset, offset + len)` of region `region` is in the device descriptor.
    fn locate(&self, region: u32, offset: u64, len: usize) -> Result<u64, String> {
        region_position(&self.regions, region, offset, len)
            .ok_or_else(|| format!("{}: access outside region {region}", self.bdf))
    }
}

/// The descriptor offset of an access wholly inside a region of `regions` ((offset,
/// size) by index), if it is.
fn region_position(regions: &[(u64, u64)], region: u32, offset: u64, len: usize) -> Option<u64> {
    let &(base, size) = regions.get(region as usize)?;
    let end = offset.checked_add(len as u64)?;
    (end <= size).then(|| base.checked_add(offset)).flatten()
}

impl RegionAccess for VfioDevice {
    fn region_read(&self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), String> {
        let at = self.locate(region, offset, data.len())?;
        std::os::unix::fs::FileExt::read_exact_at(&self.device, data, at).map_err(|e| e.to_string())
    }

    fn region_write(&self, region: u32, offset: u64, data: &[u8]) -> Result<(), String> {
        let at = self.locate(region, offset, data.len())?;
        std::os::unix::fs::FileExt::write_all_at(&self.device, data, at).map_err(|e| e.to_string())
    }
}

impl Backend for VfioDevice {
    /// `VFIO_IOMMU_MAP_DMA` of this process's mapping of guest RAM: the IOMMU then
    /// translates the device's guest-physical addresses to it.
    fn dma_map(
        &self,
        _fd: RawFd,
        _file_offset: u64,
        host: u64,
        guest: u64,
        size: u64,
    ) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        // argsz, flags, vaddr, iova, size.
        #[repr(C)]
        struct DmaMap {
            argsz: u32,
            flags: u32,
            vaddr: u64,
            iova: u64,
            size: u64,
        }
        let map = DmaMap {
            argsz: std::mem::size_of::<DmaMap>() as u32,
            flags: sys::DMA_MAP_READ_WRITE,
            vaddr: host,
            iova: guest,
            size,
        };
        // SAFETY: `map` is a live vfio_iommu_type1_dma_map; `host..host + size` is
        // guest RAM, mapped for the VM's lifetime, which outlives the container.
        if unsafe { libc::ioctl(self.container.as_raw_fd(), sys::IOMMU_MAP_DMA as _, &map) } < 0 {
            return Err(format!(
                "VFIO_IOMMU_MAP_DMA: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    fn device_info(&self) -> Result<DeviceInfo, String> {
        self.raw_device_info()
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo, String> {
        self.raw_region_info(index)
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, String> {
        let mut raw = [0u8; 16];
        raw[0..4].copy_from_slice(&16u32.to_le_bytes());
        raw[8..12].copy_from_slice(&index.to_le_bytes());
        // SAFETY: `raw` is a live vfio_irq_info of argsz 16.
        unsafe {
            self.device_ioctl(
                sys::DEVICE_GET_IRQ_INFO,
                raw.as_mut_ptr(),
                "VFIO_DEVICE_GET_IRQ_INFO",
            )?
        };
        let word = |at| le32(&raw, at).unwrap_or(0);
        Ok(IrqInfo {
            flags: word(4),
            index: word(8),
            count: word(12),
        })
    }

    /// A hardware device's registers have no eventfds: every BAR write is trapped.
    fn doorbells(&self, _index: u32) -> Result<Vec<(IoFd, EventFd)>, String> {
        Ok(Vec::new())
    }

    fn set_msix(&self, fds: &[RawFd]) -> Result<(), String> {
        let mut raw = irq_set_msix(fds);
        // SAFETY: `raw` is a live vfio_irq_set with its eventfd array, argsz covering it.
        unsafe {
            self.device_ioctl(
                sys::DEVICE_SET_IRQS,
                raw.as_mut_ptr().cast(),
                "VFIO_DEVICE_SET_IRQS",
            )
        }
    }

    fn hangup_fd(&self) -> Option<RawFd> {
        None
    }

    fn shutdown(&self) {}

    /// The areas of the BAR the kernel lets us map, each `mmap`ped from the device
    /// descriptor (areas not in whole pages stay trapped).
    fn map_region(&self, index: u32) -> Result<Vec<DeviceMapping>, String> {
        use std::os::fd::AsRawFd;
        let Some(&(base, size)) = self.regions.get(index as usize) else {
            return Ok(Vec::new());
        };
        let info = self.region_info_bytes(index)?;
        let page = devices::pci::passthrough::WINDOW_PAGE;
        mmap_areas(&info, size)?
            .into_iter()
            .filter(|&(offset, len)| offset % page == 0 && len % page == 0 && len > 0)
            .map(|(offset, len)| {
                DeviceMapping::map(self.device.as_raw_fd(), base + offset, len, offset)
                    .map_err(|e| format!("{}: BAR {index}: {e}", self.bdf))
            })
            .collect()
    }
}

/// Largest `vfio_region_info` with capabilities kumo accepts from the kernel.
const MAX_REGION_INFO: u32 = 4096;

fn le32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn le64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// The parts `(offset, size)` of a region of `region_size` bytes that may be
/// `mmap`ped, from its `vfio_region_info` bytes: none without the MMAP flag, the
/// sparse-mmap capability's areas if it has one, else the whole region. The chain is
/// walked with a bound and every offset checked: a malformed one is an error.
fn mmap_areas(info: &[u8], region_size: u64) -> Result<Vec<(u64, u64)>, String> {
    let bad = |why: &str| format!("region info: {why}");
    let flags = le32(info, 4).ok_or_else(|| bad("short"))?;
    if flags & sys::REGION_INFO_FLAG_MMAP == 0 {
        return Ok(Vec::new());
    }
    let mut at = if flags & sys::REGION_INFO_FLAG_CAPS != 0 {
        le32(info, 12).ok_or_else(|| bad("short"))? as usize
    } else {
        0
    };
    for _ in 0..16 {
        if at == 0 {
            return Ok(vec![(0, region_size)]);
        }
        let header = le32(info, at).ok_or_else(|| bad("a capability lies outside it"))?;
        let next = le32(info, at + 4).ok_or_else(|| bad("a capability lies outside it"))?;
        if header as u16 == sys::REGION_INFO_CAP_SPARSE_MMAP {
            let count = le32(info, at + 8).ok_or_else(|| bad("short sparse-mmap capability"))?;
            if count > 64 {
                return Err(bad("more than 64 sparse-mmap areas"));
            }
            return (0..count as usize)
                .map(|i| {
                    let area = at + 16 + 16 * i;
                    let (offset, size) = le64(info, area)
                        .zip(le64(info, area + 8))
                        .ok_or_else(|| bad("a sparse-mmap area lies outside it"))?;
                    match offset.checked_add(size) {
                        Some(end) if end <= region_size => Ok((offset, size)),
                        _ => Err(bad("a sparse-mmap area lies outside the region")),
                    }
                })
                .collect();
        }
        if (next as usize) <= at {
            // Capabilities only point forward; anything else would loop.
            return if next == 0 {
                Ok(vec![(0, region_size)])
            } else {
                Err(bad("the capability chain points backwards"))
            };
        }
        at = next as usize;
    }
    Err(bad("the capability chain is too long"))
}

/// A `vfio_irq_set` binding MSI-X vectors `0..fds.len()` to `fds`, as 32-bit words
/// (argsz, flags, index, start, count, then the descriptors).
fn irq_set_msix(fds: &[RawFd]) -> Vec<u32> {
    let mut raw = vec![
        (20 + 4 * fds.len()) as u32,
        vfio_consts::IRQ_SET_DATA_EVENTFD | vfio_consts::IRQ_SET_ACTION_TRIGGER,
        vfio_consts::PCI_MSIX_IRQ_INDEX,
        0,
        fds.len() as u32,
    ];
    raw.extend(fds.iter().map(|&fd| fd as u32));
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_canonically() {
        let bdf: Bdf = "0000:03:00.0".parse().unwrap();
        assert_eq!(
            bdf,
            Bdf {
                domain: 0,
                bus: 3,
                device: 0,
                function: 0
            }
        );
        assert_eq!(
            "03:1f.7".parse::<Bdf>().unwrap().to_string(),
            "0000:03:1f.7"
        );
        assert_eq!(
            "ABCD:ff:00.1".parse::<Bdf>().unwrap().to_string(),
            "abcd:ff:00.1"
        );
        for bad in [
            "",
            "0000:03:00",
            "0000:03:20.0",
            "0000:03:00.8",
            "03:00.0.0",
            "g000:03:00.0",
            "0:3:0.0",
            "0000:03:00.0:1",
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad}");
        }
    }

    /// A fake host: `/sys/bus/pci/devices/BDF` with the links given, and `/dev/vfio`.
    fn host(group: Option<&str>, driver: Option<&str>, vfio: &[&str]) -> (tempdir::Dir, HostPaths) {
        let dir = tempdir::Dir::new();
        let sys = dir.path().join("sys");
        let dev = dir.path().join("dev");
        let device = sys.join("0000:03:00.0");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::create_dir_all(&dev).unwrap();
        if let Some(group) = group {
            std::os::unix::fs::symlink(
                format!("../../../kernel/iommu_groups/{group}"),
                device.join("iommu_group"),
            )
            .unwrap();
        }
        if let Some(driver) = driver {
            std::os::unix::fs::symlink(
                format!("../../../bus/pci/drivers/{driver}"),
                device.join("driver"),
            )
            .unwrap();
        }
        for name in vfio {
            std::fs::write(dev.join(name), b"").unwrap();
        }
        (
            dir,
            HostPaths {
                sysfs_devices: sys,
                dev_vfio: dev,
            },
        )
    }

    mod tempdir {
        pub struct Dir(std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "kumo-vfio-test-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }
            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn region_accesses_stay_inside_their_region() {
        let regions = [(0x1000, 0x100), (0x10_0000, 0)];
        assert_eq!(region_position(&regions, 0, 0xfc, 4), Some(0x10fc));
        assert_eq!(region_position(&regions, 0, 0xfd, 4), None);
        assert_eq!(region_position(&regions, 0, u64::MAX, 1), None);
        assert_eq!(region_position(&regions, 1, 0, 1), None);
        assert_eq!(region_position(&regions, 7, 0, 1), None);
    }

    #[test]
    fn msix_eventfds_are_bound_with_the_kernels_layout() {
        let raw = irq_set_msix(&[7, 9]);
        assert_eq!(raw, vec![28, (1 << 2) | (1 << 5), 2, 0, 2, 7, 9]);
        assert_eq!(sys::GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(sys::IOMMU_MAP_DMA, 0x3b71);
    }

    #[test]
    fn each_missing_piece_is_named() {
        let bdf: Bdf = "0000:03:00.0".parse().unwrap();
        let other: Bdf = "0000:04:00.0".parse().unwrap();
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), &["vfio", "7"]);
        assert!(matches!(
            check(&other, &paths),
            Err(VfioError::NoDevice { .. })
        ));
        assert_eq!(
            check(&bdf, &paths),
            Ok(VfioTarget {
                container: paths.dev_vfio.join("vfio"),
                group: paths.dev_vfio.join("7")
            })
        );
        let (_d, paths) = host(None, Some("vfio-pci"), &["vfio"]);
        assert_eq!(check(&bdf, &paths), Err(VfioError::NoIommuGroup { bdf }));
        let (_d, paths) = host(Some("7"), Some("ixgbe"), &["vfio", "7"]);
        let e = check(&bdf, &paths).unwrap_err();
        assert!(
            e.to_string().contains("bound to ixgbe, not vfio-pci"),
            "{e}"
        );
        let (_d, paths) = host(Some("7"), None, &["vfio", "7"]);
        assert!(
            check(&bdf, &paths)
                .unwrap_err()
                .to_string()
                .contains("bound to no driver")
        );
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), &[]);
        assert!(
            check(&bdf, &paths)
                .unwrap_err()
                .to_string()
                .contains("/vfio (load the vfio-pci module)")
        );
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), &["vfio"]);
        assert!(matches!(check(&bdf, &paths), Err(VfioError::NoVfio { .. })));
    }

    /// A `vfio_region_info` of `flags` with the given capabilities (id, next, body).
    fn region_info(flags: u32, caps: &[(u16, u32, Vec<u8>)]) -> Vec<u8> {
        let mut info = vec![0u8; 32];
        info[4..8].copy_from_slice(&flags.to_le_bytes());
        if !caps.is_empty() {
            info[12..16].copy_from_slice(&32u32.to_le_bytes());
        }
        for (id, next, body) in caps {
            info.extend_from_slice(&u32::from(*id).to_le_bytes()); // id, version 0
            info.extend_from_slice(&next.to_le_bytes());
            info.extend_from_slice(body);
        }
        info
    }

    fn sparse(areas: &[(u64, u64)]) -> Vec<u8> {
        let mut body = (areas.len() as u32).to_le_bytes().to_vec();
        body.extend_from_slice(&[0; 4]);
        for (offset, size) in areas {
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&size.to_le_bytes());
        }
        body
    }

    #[test]
    fn mappable_areas_come_from_the_mmap_flag_and_the_sparse_capability() {
        const MMAP: u32 = sys::REGION_INFO_FLAG_MMAP;
        const CAPS: u32 = sys::REGION_INFO_FLAG_CAPS;
        let size = 0x10000;
        assert_eq!(mmap_areas(&region_info(3, &[]), size), Ok(vec![]));
        assert_eq!(
            mmap_areas(&region_info(3 | MMAP, &[]), size),
            Ok(vec![(0, size)])
        );
        // The kernel's sparse areas around an MSI-X table at 0x8000, after another
        // capability (id 3, MSI-X mappable: not one kumo needs).
        let areas = [(0, 0x8000), (0x9000, 0x7000)];
        let info = region_info(3 | MMAP | CAPS, &[(3, 40, vec![]), (1, 0, sparse(&areas))]);
        assert_eq!(mmap_areas(&info, size), Ok(areas.to_vec()));
        // A chain without a sparse capability: the whole region.
        let info = region_info(3 | MMAP | CAPS, &[(3, 0, vec![])]);
        assert_eq!(mmap_areas(&info, size), Ok(vec![(0, size)]));
    }

    #[test]
    fn malformed_region_info_is_refused_never_trusted() {
        const FLAGS: u32 = 3 | sys::REGION_INFO_FLAG_MMAP | sys::REGION_INFO_FLAG_CAPS;
        let size = 0x10000;
        for (info, why) in [
            (vec![0u8; 6], "short"),
            (
                region_info(FLAGS, &[(1, 0, sparse(&[(0x8000, 0x9000)]))]),
                "outside the region",
            ),
            (
                region_info(FLAGS, &[(1, 0, sparse(&[(u64::MAX, 2)]))]),
                "outside the region",
            ),
            (region_info(FLAGS, &[(3, 32, vec![])]), "backwards"),
            (region_info(FLAGS, &[(3, 4000, vec![])]), "outside it"),
            (
                {
                    let mut info = region_info(FLAGS, &[(1, 0, sparse(&[(0, 0x1000)]))]);
                    info[40..44].copy_from_slice(&1000u32.to_le_bytes()); // areas
                    info
                },
                "more than 64",
            ),
            (
                {
                    let mut info = region_info(FLAGS, &[(1, 0, sparse(&[(0, 0x1000)]))]);
                    info.truncate(50);
                    info
                },
                "outside it",
            ),
        ] {
            let err = mmap_areas(&info, size).unwrap_err();
            assert!(err.contains(why), "{err} (wanted {why})");
        }
    }

    proptest::proptest! {
        #[test]
        fn region_info_of_any_bytes_never_panics(
            info in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
            size in proptest::prelude::any::<u64>(),
        ) {
            if let Ok(areas) = mmap_areas(&info, size) {
                for (offset, len) in areas {
                    proptest::prop_assert!(offset.checked_add(len).is_some_and(|e| e <= size));
                }
            }
        }
    }
}
