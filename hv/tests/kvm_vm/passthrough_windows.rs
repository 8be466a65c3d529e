//! A passthrough device whose BAR its backend can map (as kernel VFIO maps a real
//! device's BAR) is reached by the guest directly: its stores land in the device's
//! memory with no exit to kumo, except on the MSI-X table's page, which stays trapped;
//! the mapping follows the BAR when the guest moves it and is gone while it does not
//! decode. The device here is a test backend over a memfd; the mapping, the KVM memory
//! slots and the mediation are kumo's real ones.

use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use devices::pci::passthrough::{CONFIG_REGION, RegionAccess};
use devices::vfio_user::proto::vfio as consts;
use devices::vfio_user::proto::{DeviceInfo, IoFd, IrqInfo, RegionInfo};
use hv::GuestExit;
use hv::irq::IrqPath;
use hv::passthrough::{Backend, DeviceMapping, PassthroughSpec};
use hv::testing::{asm, code_vm, kvm_available};
use vmm_sys_util::eventfd::EventFd;

/// The device is the first one plugged in: slot 1, BAR 0 at the window's start.
const CONFIG: u32 = 0xe000_0000 + (1 << 15);
const COMMAND: u32 = CONFIG + 0x04;
const BAR0: u32 = CONFIG + 0x10;
const OLD: u32 = 0xc000_0000;
const NEW: u32 = 0xc010_0000;
const BAR_SIZE: u64 = 0x10000;
/// The MSI-X table (one vector) and PBA share BAR 0's page at 0x8000.
const TABLE: u32 = 0x8000;
const PBA: u32 = 0x8800;

/// A device with one 64 KiB memory BAR over a memfd and one MSI-X vector.
struct MemoryBarDevice {
    config: [u8; 256],
    bar: std::fs::File,
    /// BAR 0 offsets that reached the device through kumo (trapped accesses).
    trapped: Mutex<Vec<u64>>,
}

impl MemoryBarDevice {
    fn new() -> MemoryBarDevice {
        let mut config = [0u8; 256];
        config[0..4].copy_from_slice(&0x5678_1234u32.to_le_bytes());
        config[0x06] = 0x10; // status: capability list
        config[0x0b] = 0x02; // class: network controller
        config[0x34] = 0x40;
        config[0x40] = 0x11; // MSI-X, last capability, one vector
        config[0x44..0x48].copy_from_slice(&TABLE.to_le_bytes()); // BAR 0
        config[0x48..0x4c].copy_from_slice(&PBA.to_le_bytes());
        // SAFETY: a valid NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"test-bar".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: a new descriptor nothing else owns.
        let bar = unsafe { std::fs::File::from_raw_fd(fd) };
        bar.set_len(BAR_SIZE).unwrap();
        MemoryBarDevice {
            config,
            bar,
            trapped: Mutex::new(Vec::new()),
        }
    }

    fn word(&self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.bar.read_exact_at(&mut b, offset).unwrap();
        u32::from_le_bytes(b)
    }
}

impl RegionAccess for MemoryBarDevice {
    fn region_read(&self, region: u32, offset: u64, data: &mut [u8]) -> Result<(), String> {
        match region {
            CONFIG_REGION => {
                let at = offset as usize;
                data.copy_from_slice(&self.config[at..at + data.len()]);
            }
            _ => data.fill(0),
        }
        Ok(())
    }

    fn region_write(&self, region: u32, offset: u64, _data: &[u8]) -> Result<(), String> {
        if region == 0 {
            self.trapped.lock().unwrap().push(offset);
        }
        Ok(())
    }
}

impl Backend for MemoryBarDevice {
    fn dma_map(&self, _: i32, _: u64, _: u64, _: u64, _: u64) -> Result<(), String> {
        Ok(())
    }
    fn device_info(&self) -> Result<DeviceInfo, String> {
        Ok(DeviceInfo {
            flags: consts::DEVICE_FLAGS_PCI,
            regions: 9,
            irqs: 5,
        })
    }
    fn region_info(&self, index: u32) -> Result<RegionInfo, String> {
        let size = match index {
            0 => BAR_SIZE,
            CONFIG_REGION => 256,
            _ => 0,
        };
        Ok(RegionInfo {
            flags: 3,
            index,
            size,
            offset: 0,
        })
    }
    fn irq_info(&self, index: u32) -> Result<IrqInfo, String> {
        Ok(IrqInfo {
            flags: 0,
            index,
            count: 1,
        })
    }
    fn doorbells(&self, _index: u32) -> Result<Vec<(IoFd, EventFd)>, String> {
        Ok(Vec::new())
    }
    fn set_msix(&self, _fds: &[i32]) -> Result<(), String> {
        Ok(())
    }
    fn map_region(&self, index: u32) -> Result<Vec<DeviceMapping>, String> {
        match index {
            0 => Ok(vec![DeviceMapping::map(
                self.bar.as_raw_fd(),
                0,
                BAR_SIZE,
                0,
            )?]),
            _ => Ok(Vec::new()),
        }
    }
    fn hangup_fd(&self) -> Option<i32> {
        None
    }
    fn shutdown(&self) {}
}

#[test]
fn a_mapped_bar_is_reached_without_exits_and_follows_the_bar() {
    if !kvm_available() {
        return;
    }
    let code = [
        asm::store32(COMMAND, 0x2),              // memory space on
        asm::store32(OLD + 0x100, 0x1111_1111),  // a window: straight into the device
        asm::store32(OLD + TABLE, 0xfee0_0000),  // the MSI-X table: kumo's
        asm::store32(OLD + 0x8100, 0x2222_2222), // the table's page: trapped, forwarded
        asm::store32(COMMAND, 0),                // memory space off: nothing decodes
        asm::store32(OLD + 0x200, 0x3333_3333),
        asm::store32(BAR0, NEW), // moved while off
        asm::store32(COMMAND, 0x2),
        asm::store32(NEW + 0x300, 0x4444_4444), // the window, at its new place
        asm::store32(OLD + 0x400, 0x5555_5555), // nothing there any more
        asm::debug_exit(0),
    ]
    .concat();
    let mut vm = hv::builder::build_for_boot(code_vm(1, 64, &code)).expect("VM");
    let device = Arc::new(MemoryBarDevice::new());
    let spec = PassthroughSpec::VfioUser("test-memory-bar".into());
    let _attached =
        hv::passthrough::attach_backend(&mut vm, &spec, device.clone(), IrqPath::Generic, None)
            .expect("attach");
    let outcome = vm
        .run(Box::new(std::io::sink()), Instant::now())
        .expect("run");
    assert_eq!(outcome.exit, GuestExit::DebugExit(0));

    assert_eq!(device.word(0x100), 0x1111_1111, "the window's store");
    assert_eq!(device.word(0x300), 0x4444_4444, "the moved window's store");
    for (offset, why) in [
        (0x200, "stored while memory space was off"),
        (0x400, "stored at the old address after the move"),
        (u64::from(TABLE), "the MSI-X table reached the device"),
        (0x8100, "the trapped page was mapped"),
    ] {
        assert_eq!(device.word(offset), 0, "{why}");
    }
    // Only the store on the MSI-X page (outside the table) went through kumo.
    assert_eq!(*device.trapped.lock().unwrap(), [0x8100]);
}
