//! Saving a running VM and building one from saved state: snapshots to a file and
//! live migration share the stream format of [`stream`].
//!
//! Pausing: a controller thread calls [`Hub::pause`]. Every vCPU thread sees the
//! request before its next KVM_RUN (a kick makes it leave the guest), completes any
//! I/O KVM still holds for it, saves its own state on its own thread and waits. The
//! returned [`Paused`] gives the VM's, the devices' and RAM's state; dropping it
//! resumes the vCPUs, and [`Paused::hand_off`] ends the VM here instead (its run
//! returns [`crate::GuestExit::HandedOff`]).

pub mod auth;
pub mod dirty;
pub mod live;
pub mod state;
pub mod stream;

use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use devices::pci::{ConfigPorts, PciBus};
use devices::{BootTimer, Com1};
use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_cpuid_entry2};
use kvm_ioctls::{VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

pub use state::{DeviceStates, VcpuState, VmState};
pub use stream::{Meta, StreamError};

use crate::Error;
use crate::placement::VcpuControl;
use stream::{PAGE_SIZE, RamWriter};

/// How long a pause waits between kicks of vCPUs that have not stopped yet.
const REKICK: Duration = Duration::from_millis(10);
/// A vCPU that has not stopped after this long (stuck in a device, or held at a
/// scheduler's gate) fails the pause; the others resume.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Device work that runs beside the vCPUs: threads answering doorbells, interrupts
/// queued on their way to KVM. A pause must finish it once the vCPUs have stopped
/// (no new doorbell can ring) and before they save their state, or an interrupt
/// raised meanwhile would land in a LAPIC whose state was already taken and be lost.
pub trait Quiesce: Send + Sync {
    /// Finish what is in flight (into KVM or the device's state) and start nothing
    /// new until [`Quiesce::resume`].
    fn quiesce(&self);
    /// Work on (the VM resumes).
    fn resume(&self);
    /// The VM ends here (it runs elsewhere now): by default, as [`Quiesce::resume`].
    fn hand_off(&self) {
        self.resume();
    }
}

/// A device that writes guest RAM from a host thread (a NIC's receive path): KVM's
/// dirty log sees only vCPU writes, so while a migration tracks, the device records
/// the pages it writes and the copy rounds send them again. Its writes must stop at
/// the pause ([`Quiesce`]), before the last harvest.
pub trait DeviceWrites: Send + Sync {
    /// Start (a migration's dirty logging begins) or stop recording.
    fn track(&self, on: bool);
    /// The guest-physical addresses of the pages written since the last call.
    fn take_written(&self) -> Vec<u64>;
}

/// The devices a running VM has, given to the hub by `Vm::run`.
pub(crate) struct Devices {
    pub com1: Arc<Com1>,
    pub timer: Arc<BootTimer>,
    pub ports: Arc<ConfigPorts>,
    pub pci: Arc<PciBus>,
}

#[derive(Default)]
struct HubState {
    /// vCPU threads waiting at the pause point.
    paused: usize,
    /// Every vCPU stopped and the devices are quiet: the vCPUs save their state now.
    save: bool,
    /// Which vCPUs reached the pause point in this pause.
    stopped: Vec<bool>,
    /// What each paused vCPU saved.
    saved: Vec<Option<Result<VcpuState, String>>>,
    /// A pause is under way (one at a time).
    busy: bool,
    /// The VM is ending: nobody waits for anything any more.
    ending: bool,
    /// The VM was handed off: paused vCPUs end instead of resuming.
    handed_off: bool,
}

/// The meeting point of a VM's vCPU threads and whoever saves the VM.
pub struct Hub {
    vcpus: usize,
    msr_indices: Vec<u32>,
    cpuid: Vec<Vec<kvm_cpuid_entry2>>,
    requested: AtomicBool,
    state: Mutex<HubState>,
    changed: Condvar,
    vm: Arc<VmFd>,
    memory: GuestMemoryMmap,
    memfd: File,
    control: Arc<VcpuControl>,
    devices: Mutex<Option<Arc<Devices>>>,
    quiescers: Mutex<Vec<Arc<dyn Quiesce>>>,
    device_writers: Mutex<Vec<Arc<dyn DeviceWrites>>>,
    /// The vCPUs' dirty rings, if the VM tracks writes with them (else the bitmap).
    rings: Option<dirty::Rings>,
}

impl Hub {
    pub(crate) fn new(
        kvm: &kvm_ioctls::Kvm,
        vcpus: &[VcpuFd],
        dirty: dirty::DirtyLogMode,
        vm: Arc<VmFd>,
        memory: GuestMemoryMmap,
        memfd: &File,
        control: Arc<VcpuControl>,
    ) -> Result<Hub, Error> {
        let cpuid = vcpus
            .iter()
            .map(|v| {
                v.get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                    .map(|c| c.as_slice().to_vec())
                    .map_err(crate::kvm::ioctl("KVM_GET_CPUID2"))
            })
            .collect::<Result<_, _>>()?;
        let rings = match dirty {
            dirty::DirtyLogMode::Ring => Some(dirty::Rings::map(
                vcpus,
                crate::memory_map::ram_regions(memory_bytes(&memory)),
            )?),
            dirty::DirtyLogMode::Bitmap => None,
        };
        Ok(Hub {
            vcpus: vcpus.len(),
            msr_indices: state::msr_indices(kvm),
            cpuid,
            requested: AtomicBool::new(false),
            state: Mutex::new(HubState::default()),
            changed: Condvar::new(),
            vm,
            memory,
            memfd: memfd.try_clone().map_err(|source| Error::Os {
                what: "duplicating the guest RAM memfd",
                source,
            })?,
            control,
            devices: Mutex::new(None),
            quiescers: Mutex::new(Vec::new()),
            device_writers: Mutex::new(Vec::new()),
            rings,
        })
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn attach(&self, devices: Devices) {
        *self.devices.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(devices));
    }

    /// Has pauses quiesce `device` between stopping the vCPUs and saving them.
    pub fn add_quiescer(&self, device: Arc<dyn Quiesce>) {
        self.quiescers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(device);
    }

    /// Has migrations send again the pages `device` writes (see [`DeviceWrites`]).
    pub fn add_device_writes(&self, device: Arc<dyn DeviceWrites>) {
        self.device_writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(device);
    }

    /// Tells every device that writes RAM to start or stop recording.
    pub(crate) fn track_device_writes(&self, on: bool) {
        for device in self
            .device_writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            device.track(on);
        }
    }

    fn quiescers(&self) -> Vec<Arc<dyn Quiesce>> {
        self.quiescers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How this VM tracks written pages.
    pub fn dirty_log_mode(&self) -> dirty::DirtyLogMode {
        match self.rings {
            Some(_) => dirty::DirtyLogMode::Ring,
            None => dirty::DirtyLogMode::Bitmap,
        }
    }

    /// The pages written since the last call (dirty logging must be on), by the
    /// vCPUs and by devices that write RAM, in address order.
    pub(crate) fn take_dirty(&self) -> Result<Vec<u64>, Error> {
        let regions = crate::memory_map::ram_regions(memory_bytes(&self.memory));
        let mut pages = match &self.rings {
            Some(rings) => rings.take(&self.vm)?,
            None => {
                let mut pages = Vec::new();
                for region in &regions {
                    let bitmap = self
                        .vm
                        .get_dirty_log(region.slot, region.size as usize)
                        .map_err(crate::kvm::ioctl("KVM_GET_DIRTY_LOG"))?;
                    pages.extend(dirty::bitmap_pages(&bitmap, region.gpa));
                }
                pages
            }
        };
        let before = pages.len();
        for device in self
            .device_writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            // Page-aligned, and only RAM: the stream carries nothing else.
            pages.extend(
                device
                    .take_written()
                    .into_iter()
                    .map(|gpa| gpa & !(stream::PAGE_SIZE as u64 - 1))
                    .filter(|&gpa| crate::memory_map::is_ram_page(&regions, gpa)),
            );
        }
        if pages.len() != before {
            pages.sort_unstable();
            pages.dedup();
        }
        Ok(pages)
    }

    /// A vCPU left the guest because its dirty ring is full: harvest before it
    /// runs on. False if the VM has no rings (the exit is then unexpected).
    pub(crate) fn dirty_ring_full(&self) -> Result<bool, Error> {
        match &self.rings {
            Some(rings) => rings.harvest(&self.vm).map(|()| true),
            None => Ok(false),
        }
    }

    /// `Vm::run` is ending the VM: wakes every waiter for good.
    pub(crate) fn vm_ending(&self) {
        self.lock().ending = true;
        self.changed.notify_all();
    }

    /// Checked by each vCPU thread before KVM_RUN (one atomic load).
    #[inline]
    pub(crate) fn pause_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// The vCPU thread's side of a pause. Returns true if the VM was handed off (the
    /// thread ends), false to go on running.
    pub(crate) fn pause_point(&self, index: u32, vcpu: &mut VcpuFd) -> bool {
        // KVM completes an I/O read (the value into the register) on the next
        // KVM_RUN; with immediate_exit it does that and returns EINTR at once.
        vcpu.set_kvm_immediate_exit(1);
        let completed = match vcpu.run() {
            Err(e) if e.errno() == libc::EINTR => Ok(()),
            Err(e) => Err(format!("completing pending I/O: {e}")),
            Ok(exit) => Err(format!("completing pending I/O: unexpected exit {exit:?}")),
        };
        vcpu.set_kvm_immediate_exit(0);
        // Saved at once, so the TSC stops where the guest stopped; the LAPIC is read
        // again once the devices are quiet (interrupts they raised meanwhile).
        let mut saved =
            Some(completed.and_then(|()| {
                state::save_vcpu(vcpu, &self.msr_indices).map_err(|e| e.to_string())
            }));
        let mut st = self.lock();
        st.paused += 1;
        if let Some(stopped) = st.stopped.get_mut(index as usize) {
            *stopped = true;
        }
        self.changed.notify_all();
        while self.requested.load(Ordering::Acquire) && !st.ending {
            let unsaved = st.saved.get(index as usize).is_some_and(Option::is_none);
            if st.save
                && unsaved
                && let Some(mut saved) = saved.take()
            {
                if let Ok(state) = &mut saved
                    && !self.quiescers().is_empty()
                {
                    drop(st);
                    match vcpu.get_lapic() {
                        Ok(lapic) => state.lapic = lapic,
                        Err(e) => saved = Err(format!("KVM_GET_LAPIC: {e}")),
                    }
                    st = self.lock();
                }
                if let Some(slot) = st.saved.get_mut(index as usize) {
                    *slot = Some(saved);
                }
                self.changed.notify_all();
                continue;
            }
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.paused -= 1;
        let handed_off = st.handed_off;
        self.changed.notify_all();
        handed_off
    }

    /// Stops every vCPU (on its own thread) and takes its state. Fails, with the VM
    /// running on, if the VM is not running or ends meanwhile, or a vCPU's state cannot
    /// be read.
    pub fn pause(&self) -> Result<Paused<'_>, Error> {
        self.pause_within(PAUSE_TIMEOUT)
    }

    /// The running VM's devices; fails if the VM has not started yet. A migration
    /// checks this before it connects: a destination takes one source only, and one
    /// consumed by a migration that could never pause would be lost to the retry.
    pub fn check_running(&self) -> Result<(), Error> {
        self.running_devices().map(drop)
    }

    fn running_devices(&self) -> Result<Arc<Devices>, Error> {
        self.devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| Error::Migration("the VM is not running yet".into()))
    }

    /// As [`Hub::pause`], giving up after `timeout` if a vCPU does not stop.
    pub fn pause_within(&self, timeout: Duration) -> Result<Paused<'_>, Error> {
        let started = Instant::now();
        let devices = self.running_devices()?;
        let mut st = self.lock();
        if st.busy {
            return Err(Error::Migration(
                "another snapshot or migration is under way".into(),
            ));
        }
        // Threads still leaving an earlier pause must be gone first.
        while st.paused > 0 && !st.ending {
            st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.ending || st.handed_off {
            return Err(Error::Migration("the VM has ended".into()));
        }
        st.busy = true;
        st.saved = (0..self.vcpus).map(|_| None).collect();
        st.stopped = vec![false; self.vcpus];
        self.requested.store(true, Ordering::SeqCst);
        // vCPUs a scheduler parked are out of the guest: they pause at their gates.
        self.control.call_away();
        while st.paused < self.vcpus && !st.ending && started.elapsed() < timeout {
            drop(st);
            for v in 0..self.vcpus {
                if !self.control.has_ended(v) {
                    let _ = self.control.kick_vcpu(v);
                }
            }
            st = self.lock();
            let deadline = Instant::now() + REKICK;
            while st.paused < self.vcpus && !st.ending {
                let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                    break;
                };
                st = self
                    .changed
                    .wait_timeout(st, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        let stopped = if st.ending {
            Err(Error::Migration("the VM ended while pausing".into()))
        } else if st.paused < self.vcpus {
            let stuck: Vec<String> = (0..self.vcpus)
                .filter(|&i| !st.stopped[i])
                .map(|i| i.to_string())
                .collect();
            Err(Error::Migration(format!(
                "vCPU {} did not stop within {:.1} s; the VM runs on",
                stuck.join(", "),
                timeout.as_secs_f64()
            )))
        } else {
            Ok(())
        };
        let result = match stopped {
            Err(e) => Err(e),
            Ok(()) => {
                // Every vCPU is out of the guest: finish the devices' work, then let
                // the vCPUs save (their LAPICs then hold every interrupt raised).
                drop(st);
                for device in self.quiescers() {
                    device.quiesce();
                }
                st = self.lock();
                st.save = true;
                self.changed.notify_all();
                while !st.ending && st.saved.iter().any(Option::is_none) {
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.ending {
                    Err(Error::Migration("the VM ended while pausing".into()))
                } else {
                    st.saved
                        .iter_mut()
                        .enumerate()
                        .map(|(i, s)| match s.take() {
                            Some(Ok(state)) => Ok(state),
                            Some(Err(why)) => Err(Error::Migration(format!("vCPU {i}: {why}"))),
                            None => Err(Error::Migration(format!("vCPU {i} did not save"))),
                        })
                        .collect::<Result<Vec<_>, _>>()
                }
            }
        };
        drop(st);
        let vcpus = match result {
            Ok(v) => v,
            Err(e) => {
                self.resume(false);
                return Err(e);
            }
        };
        Ok(Paused {
            hub: self,
            vcpus,
            devices,
            handed_off: false,
            paused_at: Instant::now(),
            pause_took: started.elapsed(),
        })
    }

    fn resume(&self, hand_off: bool) {
        let mut st = self.lock();
        st.handed_off |= hand_off;
        st.busy = false;
        st.save = false;
        self.requested.store(false, Ordering::SeqCst);
        drop(st);
        self.changed.notify_all();
        for device in self.quiescers() {
            if hand_off {
                device.hand_off();
            } else {
                device.resume();
            }
        }
    }

    pub(crate) fn vm(&self) -> &VmFd {
        &self.vm
    }

    pub(crate) fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    pub(crate) fn memfd(&self) -> &File {
        &self.memfd
    }

    /// The META section's contents for this VM.
    pub fn meta(&self, app: String) -> Meta {
        Meta {
            vcpus: self.vcpus as u32,
            memory_bytes: memory_bytes(&self.memory),
            cpuid: self.cpuid.clone(),
            app,
            huge_pages: crate::machine::on_huge_pages(&self.memfd),
        }
    }
}

/// The guest's RAM size (what [`crate::memory_map::ram_regions`] was given).
fn memory_bytes(memory: &GuestMemoryMmap) -> u64 {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
    memory.iter().map(|r| r.len()).sum()
}

/// A VM whose vCPUs are all stopped and saved. Dropping it resumes them.
pub struct Paused<'a> {
    hub: &'a Hub,
    vcpus: Vec<VcpuState>,
    devices: Arc<Devices>,
    handed_off: bool,
    paused_at: Instant,
    pause_took: Duration,
}

impl std::fmt::Debug for Paused<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Paused")
            .field("vcpus", &self.vcpus.len())
            .finish()
    }
}

impl Paused<'_> {
    pub fn vcpus(&self) -> &[VcpuState] {
        &self.vcpus
    }

    /// How long stopping every vCPU took.
    pub fn pause_took(&self) -> Duration {
        self.pause_took
    }

    /// Since every vCPU stopped.
    pub fn paused_for(&self) -> Duration {
        self.paused_at.elapsed()
    }

    pub fn vm_state(&self) -> Result<VmState, Error> {
        state::save_vm(self.hub.vm())
    }

    pub fn device_states(&self) -> Result<DeviceStates, Error> {
        let d = &self.devices;
        Ok(DeviceStates {
            com1: d.com1.state(),
            boot_timer: d.timer.state(),
            pci_address: d.ports.address(),
            pci: d
                .pci
                .save_state()
                .map_err(|e| Error::Migration(e.to_string()))?,
        })
    }

    /// The VM ends here: its vCPU threads end and its run returns
    /// [`crate::GuestExit::HandedOff`].
    pub fn hand_off(mut self) {
        self.handed_off = true;
        self.hub.resume(true);
    }

    /// Writes the final sections: vCPUs, VM, devices, the program's `app` if given
    /// (replacing META's), END.
    pub fn write_state(&self, w: &mut impl Write, app: Option<String>) -> Result<(), Error> {
        let vm = self.vm_state()?;
        let devices = self.device_states()?;
        stream::write_json(w, stream::TAG_VCPU, &self.vcpus)?;
        stream::write_json(w, stream::TAG_VM, &vm)?;
        stream::write_json(w, stream::TAG_DEVICES, &devices)?;
        if let Some(app) = app {
            stream::write_json(w, stream::TAG_APP, &app)?;
        }
        stream::write_section(w, stream::TAG_END, &[])?;
        Ok(())
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        if !self.handed_off {
            self.hub.resume(false);
        }
    }
}

/// What writing a stream sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub pages: u64,
    pub bytes: u64,
}

/// Writes every page of RAM that holds data (the memfd's holes read as zeros on
/// the other side too, so they are skipped without being read).
pub(crate) fn write_all_ram(
    memory: &GuestMemoryMmap,
    memfd: &File,
    w: &mut impl Write,
) -> Result<Written, Error> {
    let size = memory_bytes(memory);
    let mut ram = RamWriter::new();
    let mut page = vec![0u8; PAGE_SIZE];
    let guest_ranges = data_ranges(memfd, size)
        .into_iter()
        .flat_map(|(start, end)| crate::memory_map::file_to_guest(size, start, end));
    for (start, end) in guest_ranges {
        let mut gpa = start;
        while gpa < end {
            memory
                .read_slice(&mut page, GuestAddress(gpa))
                .map_err(|e| Error::GuestMemory(e.to_string()))?;
            ram.page(w, gpa, &page)?;
            gpa += PAGE_SIZE as u64;
        }
    }
    ram.flush(w)?;
    Ok(Written {
        pages: ram.total_pages,
        bytes: ram.total_bytes,
    })
}

/// The page-aligned ranges of the memfd (file offsets) that hold data (SEEK_DATA /
/// SEEK_HOLE); the whole file if the kernel cannot tell.
fn data_ranges(memfd: &File, size: u64) -> Vec<(u64, u64)> {
    use std::os::fd::AsRawFd;
    let fd = memfd.as_raw_fd();
    let mut ranges = Vec::new();
    let mut at: i64 = 0;
    let size_i = size as i64;
    while at < size_i {
        // SAFETY: lseek on a descriptor we own; it only moves this descriptor's offset
        // (this duplicate is used by nothing else).
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                break; // no data after `at`
            }
            return vec![(0, size)];
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let hole = if hole < 0 { size_i } else { hole.min(size_i) };
        let start = (data as u64) & !(PAGE_SIZE as u64 - 1);
        let end = (hole as u64).next_multiple_of(PAGE_SIZE as u64).min(size);
        ranges.push((start, end));
        at = end as i64;
    }
    ranges
}

/// Saves the whole VM to `w` (a snapshot): header, META, RAM, state, END. The VM
/// stays paused while it is written; the caller decides whether it resumes (drop
/// the returned [`Paused`]) or ends ([`Paused::hand_off`]).
/// `app` describes the program's side (see [`Meta::app`]); it is asked for once the
/// vCPUs are stopped, so it may include what they produced so far.
pub fn write_snapshot<'a>(
    hub: &'a Hub,
    w: &mut impl Write,
    app: impl FnOnce() -> String,
) -> Result<(Paused<'a>, Written), Error> {
    let paused = hub.pause()?;
    stream::write_header(w)?;
    stream::write_json(w, stream::TAG_META, &hub.meta(app()))?;
    let written = write_all_ram(hub.memory(), hub.memfd(), w)?;
    paused.write_state(w, None)?;
    w.flush().map_err(StreamError::from)?;
    Ok((paused, written))
}

#[cfg(test)]
mod tests;
