//! The kernel's VFIO for `--passthrough BDF`, through rust-vmm's `vfio-ioctls`.
//!
//! First the checks: which host device, and whether this host can hand it to a VM. Each
//! names the one thing that is missing, in the order an administrator would fix them:
//! the address is well formed, the device exists, it sits in an IOMMU group, it is
//! bound to `vfio-pci`, and the device files of one of the kernel's two VFIO interfaces
//! exist: the device's own character device with `/dev/iommu` (iommufd, preferred when
//! the host has both), or the type-1 container `/dev/vfio/vfio` with the group's device.
//!
//! Then [`VfioDevice`]: the crate opens the device on the interface [`check`] chose and
//! does every ioctl (container or iommufd, group, device, region and interrupt info, DMA
//! maps, `SET_IRQS`). kumo keeps what the crate leaves to its caller: region accesses
//! that report their errors, the choice of which parts of a BAR become mappings (the
//! crate's sparse-mmap areas, checked before they are trusted), and KVM's VFIO device.

use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use devices::pci::passthrough::RegionAccess;
use devices::vfio_user::proto::vfio as vfio_consts;
use devices::vfio_user::proto::{DeviceInfo, IoFd, IrqInfo, RegionInfo};
use iommufd_ioctls::IommuFd;
use kvm_ioctls::VmFd;
use vfio_ioctls::{VfioContainer, VfioDeviceFd, VfioIommufd, VfioOps, VfioRegionInfoCap};
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
    #[error(
        "--passthrough {bdf}: no {} (the device's VFIO character device: is devtmpfs mounted?)",
        path.display()
    )]
    NoCdev { bdf: Bdf, path: PathBuf },
    #[error("--passthrough {bdf}: no {} (load the iommufd module)", path.display())]
    NoIommufd { bdf: Bdf, path: PathBuf },
    #[error("--passthrough {bdf}: {}: {why}", path.display())]
    Open {
        bdf: Bdf,
        path: PathBuf,
        why: String,
    },
    #[error("--passthrough {bdf}: KVM's VFIO device: {why} (a kernel without CONFIG_KVM_VFIO?)")]
    KvmVfio { bdf: Bdf, why: String },
}

/// Where the checks look (the real host's `/sys` and `/dev`, or a test's tree).
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub sysfs_devices: PathBuf,
    pub dev_vfio: PathBuf,
    pub dev_iommu: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        HostPaths {
            sysfs_devices: "/sys/bus/pci/devices".into(),
            dev_vfio: "/dev/vfio".into(),
            dev_iommu: "/dev/iommu".into(),
        }
    }
}

/// The VFIO interface `bdf` is opened through, after every check passed, with the
/// device files it opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VfioTarget {
    /// iommufd: the device's own character device (`/dev/vfio/devices/vfioN`), bound
    /// to `/dev/iommu`, whose address space holds guest RAM.
    Cdev { device: PathBuf, iommufd: PathBuf },
    /// The legacy interface: a container with a type-1 IOMMU (`/dev/vfio/vfio`) and
    /// the device's group (`/dev/vfio/GROUP`).
    Container { container: PathBuf, group: PathBuf },
}

/// Checks that `bdf` can be passed through on the host under `paths`, and chooses the
/// interface: iommufd where the host has all of it, else the container; if neither is
/// whole, the missing piece named is the iommufd one when the kernel made the device a
/// character device (its sysfs `vfio-dev`), the container one otherwise.
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
    let cdev = cdev_name(&device).map(|name| paths.dev_vfio.join("devices").join(name));
    if let Some(cdev) = &cdev {
        match (cdev.exists(), paths.dev_iommu.exists()) {
            (true, true) => {
                return Ok(VfioTarget::Cdev {
                    device: cdev.clone(),
                    iommufd: paths.dev_iommu.clone(),
                });
            }
            (false, _) if !legacy_whole(paths, &group) => {
                return Err(VfioError::NoCdev {
                    bdf: *bdf,
                    path: cdev.clone(),
                });
            }
            (true, false) if !legacy_whole(paths, &group) => {
                return Err(VfioError::NoIommufd {
                    bdf: *bdf,
                    path: paths.dev_iommu.clone(),
                });
            }
            _ => {}
        }
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
    Ok(VfioTarget::Container { container, group })
}

/// Whether the container interface's two device files exist for `group`.
fn legacy_whole(paths: &HostPaths, group: &str) -> bool {
    paths.dev_vfio.join("vfio").exists() && paths.dev_vfio.join(group).exists()
}

/// The name of the device's VFIO character device (`vfioN`), from its sysfs
/// `vfio-dev` folder, if the kernel made one (the single folder in it, as the crate
/// requires when it opens it).
fn cdev_name(sysfs_device: &Path) -> Option<String> {
    let mut entries = std::fs::read_dir(sysfs_device.join("vfio-dev"))
        .ok()?
        .filter_map(|entry| entry.ok());
    let only = entries.next()?;
    if entries.next().is_some() || !only.path().is_dir() {
        return None;
    }
    Some(only.file_name().to_string_lossy().into_owned())
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

/// A host device opened through the kernel's VFIO by `vfio-ioctls`, on either of its
/// interfaces. Regions are read and written with `pread`/`pwrite` on the device
/// descriptor at each region's offset; the parts of BARs the kernel lets us `mmap`
/// (`VFIO_REGION_INFO_FLAG_MMAP`, cut by its sparse-mmap capability) are mapped and
/// become direct windows into the guest, all but the MSI-X pages.
pub struct VfioDevice {
    bdf: Bdf,
    /// Dropped first: the crate closes the device, then lets go of its group.
    device: vfio_ioctls::VfioDevice,
    /// The container or the iommufd: where guest RAM is mapped for the device's DMA.
    dma: Arc<dyn VfioOps>,
}

impl VfioDevice {
    /// Checks `bdf` (one line naming what is missing), then opens it on the interface
    /// the check chose, registered with `vm`'s KVM VFIO device (which tells KVM that a
    /// device may DMA without snooping the CPU's caches).
    pub fn open(bdf: &Bdf, vm: &VmFd) -> Result<VfioDevice, VfioError> {
        let target = open(bdf)?;
        let kvm = kvm_vfio_device(vm).map_err(|why| VfioError::KvmVfio { bdf: *bdf, why })?;
        let sysfs = HostPaths::default().sysfs_devices.join(bdf.to_string());
        let failed = |path: &Path, why: String| VfioError::Open {
            bdf: *bdf,
            path: path.to_owned(),
            why,
        };
        let (dma, device_path): (Arc<dyn VfioOps>, PathBuf) = match target {
            VfioTarget::Cdev { device, iommufd } => {
                let fd = IommuFd::new().map_err(|e| failed(&iommufd, e.to_string()))?;
                let ops = VfioIommufd::new(Arc::new(fd), None, Some(kvm))
                    .map_err(|e| failed(&iommufd, describe(&e)))?;
                (Arc::new(ops), device)
            }
            VfioTarget::Container { container, group } => {
                let ops =
                    VfioContainer::new(Some(kvm)).map_err(|e| failed(&container, describe(&e)))?;
                (Arc::new(ops), group)
            }
        };
        let device = vfio_ioctls::VfioDevice::new(&sysfs, dma.clone(), true)
            .map_err(|e| failed(&device_path, describe(&e)))?;
        Ok(VfioDevice {
            bdf: *bdf,
            device,
            dma,
        })
    }

    /// Where `[offset, offset + len)` of region `region` is in the device descriptor.
    fn locate(&self, region: u32, offset: u64, len: usize) -> Result<u64, String> {
        let base = self.device.get_region_offset(region);
        let size = self.device.get_region_size(region);
        region_position(base, size, offset, len)
            .ok_or_else(|| format!("{}: access outside region {region}", self.bdf))
    }

    /// The device descriptor as a `File`, for `pread`/`pwrite`; never closed by kumo.
    fn file(&self) -> ManuallyDrop<File> {
        // SAFETY: the descriptor is the crate's device, open while `self` lives; the
        // `File` is a view that is never dropped, so it never closes it.
        ManuallyDrop::new(unsafe { File::from_raw_fd(self.device.as_raw_fd()) })
    }
}

/// KVM's VFIO pseudo-device for `vm`, which the crate tells of each group or device.
fn kvm_vfio_device(vm: &VmFd) -> Result<Arc<VfioDeviceFd>, String> {
    let mut create = kvm_bindings::kvm_create_device {
        type_: kvm_bindings::kvm_device_type_KVM_DEV_TYPE_VFIO,
        fd: 0,
        flags: 0,
    };
    let fd = vm.create_device(&mut create).map_err(|e| e.to_string())?;
    Ok(Arc::new(VfioDeviceFd::new_from_kvm(fd)))
}

/// The crate's error as one line, with what to do where kumo knows it.
fn describe(error: &vfio_ioctls::VfioError) -> String {
    use vfio_ioctls::VfioError as E;
    match error {
        E::GroupViable => {
            "the IOMMU group is not viable (bind every device in it to vfio-pci)".into()
        }
        E::VfioExtension | E::VfioType1V2 => "the VFIO container offers no type-1 v2 IOMMU".into(),
        other => {
            let mut line = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !line.contains(&text) {
                    line = format!("{line}: {text}");
                }
                source = cause.source();
            }
            line
        }
    }
}

/// The descriptor offset of an access wholly inside a region at `base` of `size`
/// bytes, if it is.
fn region_position(base: u64, size: u64, offset: u64, len: usize) -> Option<u64> {
    let end = offset.checked_add(len as u64)?;
    (end <= size).then(|| base.checked_add(offset)).flatten()
}

/// The crate's own `region_read`/`region_write` log a failure and return nothing (and
/// add the offset unchecked); a device access must fail visibly, so kumo reads and
/// writes the device descriptor itself, at the offsets the crate reported.
impl RegionAccess for VfioDevice {
    fn region_read(&self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), String> {
        let at = self.locate(region, offset, data.len())?;
        std::os::unix::fs::FileExt::read_exact_at(&*self.file(), data, at)
            .map_err(|e| e.to_string())
    }

    fn region_write(&self, region: u32, offset: u64, data: &[u8]) -> Result<(), String> {
        let at = self.locate(region, offset, data.len())?;
        std::os::unix::fs::FileExt::write_all_at(&*self.file(), data, at).map_err(|e| e.to_string())
    }
}

impl Backend for VfioDevice {
    /// Maps this process's mapping of guest RAM into the device's IOMMU address space
    /// (`VFIO_IOMMU_MAP_DMA` on the container, `IOMMU_IOAS_MAP` on the iommufd) at
    /// its guest-physical address, which is what the device is told.
    fn dma_map(
        &self,
        _fd: RawFd,
        _file_offset: u64,
        host: u64,
        guest: u64,
        size: u64,
    ) -> Result<(), String> {
        let size = usize::try_from(size).map_err(|_| format!("{size:#x} bytes of RAM"))?;
        // SAFETY: `host..host + size` is a region of guest RAM, mapped for the VM's
        // lifetime, which outlives this device (and its container or iommufd, whose
        // closing unmaps it). kumo reaches guest RAM only through vm-memory's volatile
        // accesses and system calls, never a Rust reference, as the device's
        // concurrent DMA requires.
        unsafe { self.dma.vfio_dma_map(guest, size, host as *mut u8) }.map_err(|e| describe(&e))
    }

    /// The crate checked the kernel's `VFIO_DEVICE_GET_INFO` when it opened the
    /// device (a PCI device has at least the configuration region and the MSI-X
    /// interrupt index, else it is refused) and keeps no more of it: this is what it
    /// guarantees. The device sits under `/sys/bus/pci/devices`, so it is PCI.
    fn device_info(&self) -> Result<DeviceInfo, String> {
        Ok(DeviceInfo {
            flags: vfio_consts::DEVICE_FLAGS_PCI,
            regions: vfio_consts::PCI_CONFIG_REGION_INDEX + 1,
            irqs: vfio_consts::PCI_MSIX_IRQ_INDEX + 1,
        })
    }

    fn region_info(&self, index: u32) -> Result<RegionInfo, String> {
        Ok(RegionInfo {
            flags: self.device.get_region_flags(index),
            index,
            size: self.device.get_region_size(index),
            offset: self.device.get_region_offset(index),
        })
    }

    fn irq_info(&self, index: u32) -> Result<IrqInfo, String> {
        let irq = self
            .device
            .get_irq_info(index)
            .ok_or_else(|| format!("{}: no interrupt index {index}", self.bdf))?;
        Ok(IrqInfo {
            flags: irq.flags,
            index: irq.index,
            count: irq.count,
        })
    }

    /// A hardware device's registers have no eventfds: every BAR write is trapped.
    fn doorbells(&self, _index: u32) -> Result<Vec<(IoFd, EventFd)>, String> {
        Ok(Vec::new())
    }

    /// `VFIO_DEVICE_SET_IRQS` (MSI-X, eventfds, trigger) through the crate.
    fn set_msix(&self, fds: &[RawFd]) -> Result<(), String> {
        // The crate takes `EventFd`s; these are views of the caller's descriptors.
        let views: Vec<ManuallyDrop<EventFd>> = fds
            .iter()
            // SAFETY: the caller keeps each descriptor open for the call; a view is
            // never dropped, so it never closes one (the kernel takes its own reference
            // to each eventfd).
            .map(|&fd| ManuallyDrop::new(unsafe { EventFd::from_raw_fd(fd) }))
            .collect();
        self.device
            .enable_msix(views.iter().map(|fd| &**fd).collect())
            .map_err(|e| format!("{}: {}", self.bdf, describe(&e)))
    }

    fn hangup_fd(&self) -> Option<RawFd> {
        None
    }

    fn shutdown(&self) {}

    /// The areas of the BAR the kernel lets us map, each `mmap`ped from the device
    /// descriptor (areas not in whole pages stay trapped).
    fn map_region(&self, index: u32) -> Result<Vec<DeviceMapping>, String> {
        let size = self.device.get_region_size(index);
        if size == 0 {
            return Ok(Vec::new());
        }
        let base = self.device.get_region_offset(index);
        let flags = self.device.get_region_flags(index);
        let caps = self.device.get_region_caps(index);
        let page = devices::pci::passthrough::WINDOW_PAGE;
        mmap_areas(flags, &caps, size)
            .map_err(|e| format!("{}: BAR {index}: {e}", self.bdf))?
            .into_iter()
            .filter(|&(offset, len)| offset % page == 0 && len % page == 0 && len > 0)
            .map(|(offset, len)| {
                let at = base
                    .checked_add(offset)
                    .ok_or_else(|| format!("{}: BAR {index}: offset out of range", self.bdf))?;
                DeviceMapping::map(self.device.as_raw_fd(), at, len, offset)
                    .map_err(|e| format!("{}: BAR {index}: {e}", self.bdf))
            })
            .collect()
    }
}

/// Most sparse-mmap areas kumo takes for one region.
const MAX_SPARSE_AREAS: usize = 64;

/// The parts `(offset, size)` of a region of `region_size` bytes that may be
/// `mmap`ped, from the region's flags and the capabilities the crate parsed: none
/// without the MMAP flag, the sparse-mmap capability's areas if it has one, else the
/// whole region. The crate reads the capability chain as the kernel wrote it, unchecked;
/// here every area is checked before it is mapped, and a bad one refuses the region.
fn mmap_areas(
    flags: u32,
    caps: &[VfioRegionInfoCap],
    region_size: u64,
) -> Result<Vec<(u64, u64)>, String> {
    if flags & vfio_bindings::bindings::vfio::VFIO_REGION_INFO_FLAG_MMAP == 0 {
        return Ok(Vec::new());
    }
    let mut sparse = caps.iter().filter_map(|cap| match cap {
        VfioRegionInfoCap::SparseMmap(sparse) => Some(&sparse.areas),
        _ => None,
    });
    let Some(areas) = sparse.next() else {
        return Ok(vec![(0, region_size)]);
    };
    if sparse.next().is_some() {
        return Err("region info: two sparse-mmap capabilities".into());
    }
    if areas.len() > MAX_SPARSE_AREAS {
        return Err(format!(
            "region info: more than {MAX_SPARSE_AREAS} sparse-mmap areas"
        ));
    }
    areas
        .iter()
        .map(|area| match area.offset.checked_add(area.size) {
            Some(end) if end <= region_size => Ok((area.offset, area.size)),
            _ => Err(format!(
                "region info: sparse-mmap area {:#x}+{:#x} lies outside the region",
                area.offset, area.size
            )),
        })
        .collect()
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

    /// A fake host: `/sys/bus/pci/devices/BDF` with the links given (and a `vfio-dev`
    /// folder naming `cdev` if given), and the files of `/dev/vfio` and `/dev` in `dev`.
    fn host(
        group: Option<&str>,
        driver: Option<&str>,
        cdev: Option<&str>,
        dev: &[&str],
    ) -> (tempdir::Dir, HostPaths) {
        let dir = tempdir::Dir::new();
        let sys = dir.path().join("sys");
        let dev_root = dir.path().join("dev");
        let dev_vfio = dev_root.join("vfio");
        let device = sys.join("0000:03:00.0");
        std::fs::create_dir_all(&device).unwrap();
        std::fs::create_dir_all(dev_vfio.join("devices")).unwrap();
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
        if let Some(cdev) = cdev {
            std::fs::create_dir_all(device.join("vfio-dev").join(cdev)).unwrap();
        }
        for name in dev {
            std::fs::write(dev_root.join(name), b"").unwrap();
        }
        (
            dir,
            HostPaths {
                sysfs_devices: sys,
                dev_vfio,
                dev_iommu: dev_root.join("iommu"),
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
        assert_eq!(region_position(0x1000, 0x100, 0xfc, 4), Some(0x10fc));
        assert_eq!(region_position(0x1000, 0x100, 0xfd, 4), None);
        assert_eq!(region_position(0x1000, 0x100, u64::MAX, 1), None);
        assert_eq!(region_position(u64::MAX, 0x100, 1, 1), None);
        // A region the crate does not know has size 0: nothing is inside it.
        assert_eq!(region_position(0x10_0000, 0, 0, 1), None);
    }

    #[test]
    fn each_missing_piece_is_named() {
        let bdf: Bdf = "0000:03:00.0".parse().unwrap();
        let other: Bdf = "0000:04:00.0".parse().unwrap();
        let legacy = ["vfio/vfio", "vfio/7"];
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), None, &legacy);
        assert!(matches!(
            check(&other, &paths),
            Err(VfioError::NoDevice { .. })
        ));
        assert_eq!(
            check(&bdf, &paths),
            Ok(VfioTarget::Container {
                container: paths.dev_vfio.join("vfio"),
                group: paths.dev_vfio.join("7")
            })
        );
        let (_d, paths) = host(None, Some("vfio-pci"), None, &["vfio/vfio"]);
        assert_eq!(check(&bdf, &paths), Err(VfioError::NoIommuGroup { bdf }));
        let (_d, paths) = host(Some("7"), Some("ixgbe"), None, &legacy);
        let e = check(&bdf, &paths).unwrap_err();
        assert!(
            e.to_string().contains("bound to ixgbe, not vfio-pci"),
            "{e}"
        );
        let (_d, paths) = host(Some("7"), None, None, &legacy);
        assert!(
            check(&bdf, &paths)
                .unwrap_err()
                .to_string()
                .contains("bound to no driver")
        );
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), None, &[]);
        assert!(
            check(&bdf, &paths)
                .unwrap_err()
                .to_string()
                .contains("/vfio (load the vfio-pci module)")
        );
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), None, &["vfio/vfio"]);
        assert!(matches!(check(&bdf, &paths), Err(VfioError::NoVfio { .. })));
    }

    #[test]
    fn iommufd_is_chosen_where_the_host_has_all_of_it() {
        let bdf: Bdf = "0000:03:00.0".parse().unwrap();
        let cdev = "vfio/devices/vfio0";
        // Both interfaces whole: iommufd.
        let (_d, paths) = host(
            Some("7"),
            Some("vfio-pci"),
            Some("vfio0"),
            &["vfio/vfio", "vfio/7", cdev, "iommu"],
        );
        assert_eq!(
            check(&bdf, &paths),
            Ok(VfioTarget::Cdev {
                device: paths.dev_vfio.join("devices/vfio0"),
                iommufd: paths.dev_iommu.clone(),
            })
        );
        // Only iommufd (a kernel without the group interface).
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), Some("vfio0"), &[cdev, "iommu"]);
        assert!(matches!(check(&bdf, &paths), Ok(VfioTarget::Cdev { .. })));
        // No /dev/iommu, but the container is whole: the container.
        let (_d, paths) = host(
            Some("7"),
            Some("vfio-pci"),
            Some("vfio0"),
            &["vfio/vfio", "vfio/7", cdev],
        );
        assert!(matches!(
            check(&bdf, &paths),
            Ok(VfioTarget::Container { .. })
        ));
        // Neither whole, the kernel made a character device: name the iommufd piece.
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), Some("vfio0"), &[cdev]);
        let e = check(&bdf, &paths).unwrap_err();
        assert_eq!(
            e,
            VfioError::NoIommufd {
                bdf,
                path: paths.dev_iommu.clone()
            }
        );
        assert!(e.to_string().contains("(load the iommufd module)"), "{e}");
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), Some("vfio0"), &["iommu"]);
        let e = check(&bdf, &paths).unwrap_err();
        assert!(matches!(e, VfioError::NoCdev { .. }), "{e}");
        assert!(e.to_string().contains("/vfio/devices/vfio0"), "{e}");
        // A `vfio-dev` folder that is not one character device's: the container.
        let (_d, paths) = host(Some("7"), Some("vfio-pci"), None, &["vfio/vfio", "vfio/7"]);
        let vfio_dev = paths.sysfs_devices.join("0000:03:00.0/vfio-dev");
        std::fs::create_dir_all(vfio_dev.join("vfio0")).unwrap();
        std::fs::create_dir_all(vfio_dev.join("vfio1")).unwrap();
        assert!(matches!(
            check(&bdf, &paths),
            Ok(VfioTarget::Container { .. })
        ));
    }

    /// Every check's line is one line.
    #[test]
    fn each_refusal_is_one_line() {
        let bdf: Bdf = "0000:03:00.0".parse().unwrap();
        let path = PathBuf::from("/dev/x");
        for e in [
            VfioError::NoDevice {
                bdf,
                path: path.clone(),
            },
            VfioError::NoIommuGroup { bdf },
            VfioError::WrongDriver {
                bdf,
                driver: "ixgbe".into(),
            },
            VfioError::NoVfio {
                bdf,
                path: path.clone(),
            },
            VfioError::NoCdev {
                bdf,
                path: path.clone(),
            },
            VfioError::NoIommufd {
                bdf,
                path: path.clone(),
            },
            VfioError::KvmVfio {
                bdf,
                why: "ENODEV".into(),
            },
        ] {
            let line = e.to_string();
            assert!(line.starts_with("--passthrough 0000:03:00.0: "), "{line}");
            assert!(!line.contains('\n'), "{line}");
        }
    }

    #[test]
    fn the_crates_errors_read_as_one_line_with_the_remedy() {
        use vfio_ioctls::VfioError as E;
        assert!(describe(&E::GroupViable).contains("bind every device in it to vfio-pci"));
        assert!(describe(&E::VfioType1V2).contains("type-1 v2"));
        let e = E::OpenContainer(std::io::Error::from_raw_os_error(libc::ENOENT));
        let line = describe(&e);
        assert!(line.contains("/dev/vfio/vfio"), "{line}");
        assert!(line.contains("No such file"), "{line}");
        assert!(!line.contains('\n'), "{line}");
        let e = E::GroupGetDeviceFD(vmm_sys_util::errno::Error::new(libc::EBUSY));
        assert!(describe(&e).contains("busy"), "{}", describe(&e));
    }

    /// What of the crate's path runs on a host without VFIO: KVM's VFIO device is
    /// made (as it is before any container or iommufd is opened), and opening the
    /// interfaces fails with the crate's error, told as one line.
    #[test]
    fn kvm_vfio_device_and_the_crates_refusal_on_this_host() {
        let Ok(kvm) = kvm_ioctls::Kvm::new() else {
            eprintln!("no /dev/kvm: skipped");
            return;
        };
        let vm = kvm.create_vm().unwrap();
        let device = kvm_vfio_device(&vm).expect("KVM's VFIO device");
        assert!(device.try_clone().is_ok());
        if !Path::new("/dev/vfio/vfio").exists() {
            let e = VfioContainer::new(Some(device.clone())).err().unwrap();
            assert!(describe(&e).contains("/dev/vfio/vfio"), "{}", describe(&e));
        }
        if !Path::new("/dev/iommu").exists() {
            assert!(IommuFd::new().is_err());
        }
    }

    fn sparse(areas: &[(u64, u64)]) -> VfioRegionInfoCap {
        VfioRegionInfoCap::SparseMmap(vfio_ioctls::VfioRegionInfoCapSparseMmap {
            areas: areas
                .iter()
                .map(|&(offset, size)| vfio_ioctls::VfioRegionSparseMmapArea { offset, size })
                .collect(),
        })
    }

    const MMAP: u32 = vfio_bindings::bindings::vfio::VFIO_REGION_INFO_FLAG_MMAP;
    const CAPS: u32 = vfio_bindings::bindings::vfio::VFIO_REGION_INFO_FLAG_CAPS;

    #[test]
    fn mappable_areas_come_from_the_mmap_flag_and_the_sparse_capability() {
        let size = 0x10000;
        assert_eq!(mmap_areas(3, &[], size), Ok(vec![]));
        assert_eq!(mmap_areas(3 | MMAP, &[], size), Ok(vec![(0, size)]));
        // Sparse areas without the MMAP flag: nothing is mapped.
        assert_eq!(
            mmap_areas(3 | CAPS, &[sparse(&[(0, 0x1000)])], size),
            Ok(vec![])
        );
        // The kernel's sparse areas around an MSI-X table at 0x8000, after another
        // capability (MSI-X mappable: not one kumo needs).
        let areas = [(0, 0x8000), (0x9000, 0x7000)];
        let caps = [VfioRegionInfoCap::MsixMappable, sparse(&areas)];
        assert_eq!(mmap_areas(3 | MMAP | CAPS, &caps, size), Ok(areas.to_vec()));
        // Capabilities without a sparse one: the whole region.
        let caps = [VfioRegionInfoCap::MsixMappable];
        assert_eq!(
            mmap_areas(3 | MMAP | CAPS, &caps, size),
            Ok(vec![(0, size)])
        );
        // A sparse capability with no areas: nothing may be mapped.
        assert_eq!(
            mmap_areas(3 | MMAP | CAPS, &[sparse(&[])], size),
            Ok(vec![])
        );
    }

    #[test]
    fn malformed_region_info_is_refused_never_trusted() {
        const FLAGS: u32 = 3 | MMAP | CAPS;
        let size = 0x10000;
        let many: Vec<(u64, u64)> = (0..65).map(|i| (i * 0x100, 0x100)).collect();
        for (caps, why) in [
            (vec![sparse(&[(0x8000, 0x9000)])], "outside the region"),
            (vec![sparse(&[(u64::MAX, 2)])], "outside the region"),
            (
                vec![sparse(&[(0, 0x1000), (0x10000, 1)])],
                "outside the region",
            ),
            (vec![sparse(&many)], "more than 64"),
            (
                vec![sparse(&[(0, 0x1000)]), sparse(&[(0, 0x2000)])],
                "two sparse-mmap",
            ),
        ] {
            let err = mmap_areas(FLAGS, &caps, size).unwrap_err();
            assert!(err.contains(why), "{err} (wanted {why})");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_sparse_areas_are_mapped_only_inside_the_region(
            areas in proptest::collection::vec(
                (proptest::prelude::any::<u64>(), proptest::prelude::any::<u64>()),
                0..80,
            ),
            flags in proptest::prelude::any::<u32>(),
            size in proptest::prelude::any::<u64>(),
        ) {
            if let Ok(mapped) = mmap_areas(flags, &[sparse(&areas)], size) {
                proptest::prop_assert!(mapped.len() <= MAX_SPARSE_AREAS);
                for (offset, len) in mapped {
                    proptest::prop_assert!(offset.checked_add(len).is_some_and(|e| e <= size));
                }
            }
        }
    }
}
