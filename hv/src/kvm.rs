//! Opening KVM and mapping its errors.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use kvm_ioctls::Kvm;

use crate::Error;

pub(crate) fn open(path: &Path) -> Result<Kvm, Error> {
    let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| Error::KvmOpen {
        path: path.to_owned(),
        source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
    })?;
    let kvm = Kvm::new_with_path(&cpath).map_err(|e| match e.errno() {
        libc::ENOENT | libc::ENODEV | libc::ENXIO => Error::KvmMissing {
            path: path.to_owned(),
        },
        libc::EACCES | libc::EPERM => Error::KvmPermission {
            path: path.to_owned(),
        },
        errno => Error::KvmOpen {
            path: path.to_owned(),
            source: std::io::Error::from_raw_os_error(errno),
        },
    })?;
    let version = kvm.get_api_version();
    if version != kvm_bindings::KVM_API_VERSION as i32 {
        return Err(Error::KvmApiVersion(version));
    }
    Ok(kvm)
}

pub(crate) fn max_vcpus(kvm: &Kvm) -> u32 {
    u32::try_from(kvm.get_max_vcpus()).unwrap_or(u32::MAX)
}

/// Wraps a kvm-ioctls error with the ioctl's name.
pub(crate) fn ioctl(name: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm {
        ioctl: name,
        source,
    }
}

/// The TSC rate KVM gives a new vCPU here, in kHz (another VMM told to keep the
/// guest's TSC invariant across a migration must be told it).
pub fn host_tsc_khz(kvm_device: &Path) -> Result<u32, Error> {
    let kvm = open(kvm_device)?;
    let vm = kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?;
    let vcpu = vm.create_vcpu(0).map_err(ioctl("KVM_CREATE_VCPU"))?;
    vcpu.get_tsc_khz().map_err(ioctl("KVM_GET_TSC_KHZ"))
}
