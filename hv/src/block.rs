//! Disks: a virtio-blk device (`devices::virtio::block`) per raw image file on the VM's
//! PCI bus, wired like the NIC (`net.rs`): the shared virtio PCI transport, MSI-X
//! through an irqfd per vector (`irq::fast_group`), and the queue doorbell either
//! served on the vCPU thread or by a backend thread.
//!
//! Where requests are served ([`DiskIo`]):
//! - `vcpu`: the doorbell write exits to the vCPU thread that made it (an MMIO exit),
//!   which serves every queued request before re-entering the guest. The request is
//!   complete when the guest's write instruction retires: no thread wake-up, and a
//!   polling driver needs no interrupt.
//! - `thread`: the doorbell is a KVM ioeventfd (no exit to kumo); a backend thread per
//!   disk (on the [`BackendWorker`], the doorbell edge-triggered: one `epoll_wait` per
//!   wake-up) wakes on it and serves the queue while the vCPU runs on. The vCPU spends
//!   no time in I/O, at the cost of a thread wake-up per doorbell.
//!
//! README "Disks" has both measured from the guest (`blk=check`'s polled 4 KiB reads).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use devices::virtio::VirtioPciDevice;
use devices::virtio::block::{
    BlockConfig, BlockStats, DEFAULT_QUEUE_SIZE, VirtioBlock, default_id,
};
use devices::virtio::transport::{ActionSink, BAR_SIZE, TransportAction};
use vm_memory::GuestMemoryMmap;
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::Error;
use crate::backend_worker::{BackendWorker, Control, Events, Handler};
use crate::irq::fast_group;
use crate::vm::Vm;

/// Which thread serves a disk's requests (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiskIo {
    /// On the vCPU that rang the doorbell.
    Vcpu,
    /// On a backend thread (kumo's default).
    #[default]
    Thread,
}

impl DiskIo {
    pub fn name(self) -> &'static str {
        match self {
            DiskIo::Vcpu => "vcpu",
            DiskIo::Thread => "thread",
        }
    }
}

/// One `--disk PATH[,readonly][,io=vcpu|thread]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSetup {
    pub path: PathBuf,
    pub readonly: bool,
    pub io: DiskIo,
}

/// Where requests are served unless `io=` says otherwise (see README "Disks" for the
/// measurement behind the choice).
pub const DEFAULT_IO: DiskIo = DiskIo::Thread;

impl std::str::FromStr for DiskSetup {
    type Err = String;

    /// `PATH[,readonly][,io=vcpu|thread]` (a path cannot contain a comma).
    fn from_str(text: &str) -> Result<Self, String> {
        let mut parts = text.split(',');
        let path = parts.next().unwrap_or_default();
        if path.is_empty() {
            return Err("a disk needs an image path: PATH[,readonly][,io=vcpu|thread]".into());
        }
        let mut setup = DiskSetup {
            path: PathBuf::from(path),
            readonly: false,
            io: DEFAULT_IO,
        };
        for option in parts {
            match option {
                "readonly" => setup.readonly = true,
                "io=vcpu" => setup.io = DiskIo::Vcpu,
                "io=thread" => setup.io = DiskIo::Thread,
                other => {
                    return Err(format!(
                        "unknown disk option '{other}' (known: readonly, io=vcpu, io=thread)"
                    ));
                }
            }
        }
        Ok(setup)
    }
}

/// Opens a disk's image: a regular file, writable unless the disk is read-only.
fn open_image(setup: &DiskSetup) -> Result<File, Error> {
    let bad = |why: String| Error::Disk {
        path: setup.path.clone(),
        why,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(!setup.readonly)
        .open(&setup.path)
        .map_err(|e| bad(e.to_string()))?;
    let meta = file.metadata().map_err(|e| bad(e.to_string()))?;
    if !meta.is_file() {
        return Err(bad("not a regular file (kumo takes raw image files)".into()));
    }
    if meta.len() < devices::virtio::block::SECTOR_SIZE {
        return Err(bad(format!(
            "{} bytes: smaller than one 512-byte sector",
            meta.len()
        )));
    }
    Ok(file)
}

/// What the transport asks of a disk's VMM side.
struct DiskActions {
    blk: Arc<VirtioBlock<GuestMemoryMmap>>,
    /// Thread mode: the doorbell the backend waits on (a notification that came by an
    /// MMIO exit is passed on to it).
    doorbell: Option<EventFd>,
}

impl ActionSink for DiskActions {
    fn act(&self, action: TransportAction) {
        if let TransportAction::QueueNotify(_) = action {
            match &self.doorbell {
                Some(fd) => {
                    let _ = fd.write(1);
                }
                // vCPU mode: serve the queue here, on the vCPU thread that rang, a
                // queue's worth at most (the most a driver can have outstanding): then
                // the vCPU goes back to its guest and its stop checks. What a budget
                // leaves waits for the next doorbell.
                None => {
                    self.blk.process();
                }
            }
        }
        // Activation and reset need nothing here: `process` serves only a live queue,
        // and the model's reset waits for a request in progress.
    }
}

/// A disk on a VM: its model (for counters) and, in thread mode, its backend.
pub struct Disk {
    blk: Arc<VirtioBlock<GuestMemoryMmap>>,
    _transport: Arc<VirtioPciDevice>,
    _backend: Option<BackendWorker>,
}

impl Disk {
    pub fn stats(&self) -> BlockStats {
        self.blk.stats()
    }
}

fn os(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Os { what, source }
}

/// A disk whose image is open and checked, not yet on a VM.
pub struct OpenDisk {
    setup: DiskSetup,
    image: File,
}

/// Opens and checks every disk's image (before a VM exists, so a bad path fails fast).
pub fn open(setups: &[DiskSetup]) -> Result<Vec<OpenDisk>, Error> {
    setups
        .iter()
        .map(|setup| {
            Ok(OpenDisk {
                setup: setup.clone(),
                image: open_image(setup)?,
            })
        })
        .collect()
}

/// Plugs a virtio-blk disk per opened image into `vm` (before it runs), in order (the
/// first is `kumo-disk-0`). Keep the returned disks until the run ends.
pub fn attach(vm: &mut Vm, disks: Vec<OpenDisk>) -> Result<Vec<Disk>, Error> {
    disks
        .into_iter()
        .enumerate()
        .map(|(index, disk)| attach_one(vm, index, disk))
        .collect()
}

fn attach_one(vm: &mut Vm, index: usize, disk: OpenDisk) -> Result<Disk, Error> {
    let OpenDisk { setup, image } = disk;
    let blk = Arc::new(
        VirtioBlock::new(
            BlockConfig {
                readonly: setup.readonly,
                id: default_id(index),
                queue_size: DEFAULT_QUEUE_SIZE,
            },
            image,
            vm.memory().clone(),
        )
        .map_err(|e| Error::Device(e.to_string()))?,
    );
    // MSI-X: the configuration vector and the queue's.
    let sink = Arc::new(fast_group(2, &vm.gsi_router())?);
    let doorbell = match setup.io {
        DiskIo::Vcpu => None,
        DiskIo::Thread => Some(EventFd::new(0).map_err(os("creating a disk doorbell eventfd"))?),
    };
    let dup = |fd: &EventFd| {
        fd.try_clone()
            .map_err(os("duplicating a disk doorbell eventfd"))
    };
    let actions = Arc::new(DiskActions {
        blk: blk.clone(),
        doorbell: doorbell.as_ref().map(dup).transpose()?,
    });
    let transport = Arc::new(
        VirtioPciDevice::new(blk.clone(), sink, actions)
            .map_err(|e| Error::Device(e.to_string()))?,
    );
    transport.place_bar(vm.allocate_bar(BAR_SIZE)?);
    let backend = match doorbell {
        None => {
            vm.add_pci_device(transport.clone())?;
            None
        }
        Some(doorbell) => {
            vm.add_pci_device_with_doorbells(transport.clone(), vec![dup(&doorbell)?])?;
            Some(start_backend(index, blk.clone(), doorbell)?)
        }
    };
    Ok(Disk {
        blk,
        _transport: transport,
        _backend: backend,
    })
}

/// The backend thread `disk<index>`: waits on the doorbell and serves the queue, until
/// stopped. It stays out of domain 0, as it always has (its scheduling is the host's).
fn start_backend(
    index: usize,
    blk: Arc<VirtioBlock<GuestMemoryMmap>>,
    doorbell: EventFd,
) -> Result<BackendWorker, Error> {
    let events = Events::new()?;
    events.add_edge(doorbell.as_raw_fd(), 0)?;
    BackendWorker::spawn(
        &format!("disk{index}"),
        Control::new()?,
        events,
        None,
        Serve {
            blk,
            more: false,
            _doorbell: doorbell,
        },
    )
}

/// A disk backend's handler: every doorbell serves the queue, a queue's worth at a
/// time; while requests are left the worker polls (looking at stop and pause between
/// two portions) and the next portion is served when the poll finds nothing else.
struct Serve {
    blk: Arc<VirtioBlock<GuestMemoryMmap>>,
    /// The last portion left requests in the queue.
    more: bool,
    /// Kept open while the worker waits on it.
    _doorbell: EventFd,
}

impl Serve {
    fn serve(&mut self) {
        self.more = self.blk.process().more;
    }
}

impl Handler for Serve {
    fn handle(&mut self, _token: u64, _events: EventSet) {
        self.serve();
    }

    fn timeout(&mut self) -> Option<Duration> {
        self.more.then_some(Duration::ZERO)
    }

    fn timed_out(&mut self) {
        if self.more {
            self.serve();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_specs_parse_and_bad_ones_say_why() {
        let d: DiskSetup = "/tmp/a.img".parse().unwrap();
        assert_eq!(
            d,
            DiskSetup {
                path: "/tmp/a.img".into(),
                readonly: false,
                io: DEFAULT_IO
            }
        );
        let d: DiskSetup = "b.img,readonly,io=thread".parse().unwrap();
        assert!(d.readonly);
        assert_eq!(d.io, DiskIo::Thread);
        assert!(
            "x.img,rw"
                .parse::<DiskSetup>()
                .unwrap_err()
                .contains("unknown disk option 'rw'")
        );
        assert!("".parse::<DiskSetup>().unwrap_err().contains("image path"));
        assert!(",readonly".parse::<DiskSetup>().is_err());
    }
}
