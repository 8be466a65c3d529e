//! The kernel's VFIO for `--passthrough BDF`: which host device, and whether this host
//! can hand it to a VM. Each check names the one thing that is missing, in the order
//! an administrator would fix them: the address is well formed, the device exists, it
//! sits in an IOMMU group, it is bound to `vfio-pci`, and the VFIO container and group
//! devices exist.

use std::path::{Path, PathBuf};

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

/// Opens `bdf` on this host: the checks above on the real `/sys` and `/dev`.
pub fn open(bdf: &Bdf) -> Result<VfioTarget, VfioError> {
    check(bdf, &HostPaths::default())
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
}
