//! Pre-copy live migration, the sending side. The stream is the snapshot format
//! ([`super::stream`]) written while the guest runs:
//!
//! 1. header and META; dirty logging on (KVM_MEM_LOG_DIRTY_PAGES on every RAM slot);
//! 2. round 0: every page that holds data (the memfd's holes are zeros on both sides);
//! 3. further rounds: the pages KVM_GET_DIRTY_LOG reports dirtied meanwhile, until
//!    the dirty set would take no longer than the downtime target at the rate the
//!    last round achieved, or the round cap is reached;
//! 4. pause every vCPU, send the last dirty pages and all state, wait for the
//!    destination to confirm it runs the VM; only then does the VM end here.
//!
//! Any error before the confirmation (the peer going away, a write failing, a wrong
//! reply) resumes the VM here as if nothing happened.
//!
//! Only vCPU writes are tracked: kumo's devices never write guest RAM from host
//! threads. A device that does (virtio RX, a vfio-user server) must mark its pages
//! dirty too before it may be migrated.

use std::io::Write;
use std::time::{Duration, Instant};

use kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES;
use serde::Serialize;
use vm_memory::{Bytes, GuestAddress};

use super::stream::{self, PAGE_SIZE, RamWriter};
use super::{Hub, memory_bytes, write_all_ram};
use crate::Error;
use crate::memory_map::{RamRegion, ram_regions};
use crate::vm::set_memory_slot;

/// How a migration is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Stop iterating once the remaining dirty pages would take at most this long.
    pub max_downtime: Duration,
    /// Rounds after the first full pass before stopping regardless.
    pub max_rounds: u32,
}

impl Default for Options {
    /// QEMU's defaults: 300 ms of downtime; kumo caps the rounds at 30.
    fn default() -> Self {
        Options {
            max_downtime: Duration::from_millis(300),
            max_rounds: 30,
        }
    }
}

/// One copy round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Round {
    pub pages: u64,
    pub bytes: u64,
    pub ms: f64,
}

/// What a migration did and how long it took (host view).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The live rounds (the first is the full pass).
    pub rounds: Vec<Round>,
    /// Pages and bytes sent with the VM paused.
    pub final_pages: u64,
    pub final_bytes: u64,
    pub total_bytes: u64,
    /// From the start to the destination's confirmation.
    pub total_ms: f64,
    /// From asking the vCPUs to stop until the destination confirmed it runs.
    pub downtime_ms: f64,
    /// Of that, stopping the vCPUs (their devices quiesced, their state saved).
    pub pause_ms: f64,
    /// Then the last harvest of dirty pages.
    pub harvest_ms: f64,
    /// Then sending the last pages.
    pub final_pages_ms: f64,
    /// Then taking the VM's and devices' state and sending all state.
    pub state_ms: f64,
    /// vCPU 0's TSC as saved at the pause (to place the guest's own view of the
    /// pause on its clock) and its rate.
    pub saved_tsc: Option<u64>,
    pub tsc_khz: u32,
    /// Of that, until the last pages and the state were sent (the rest is the
    /// destination building and starting the VM, and its confirmation).
    pub sent_ms: f64,
}

/// Dirty logging on every RAM slot while this lives (read through the VM's tracker,
/// bitmap or ring: `Hub::take_dirty`).
struct DirtyLog<'a> {
    hub: &'a Hub,
    regions: Vec<RamRegion>,
}

impl<'a> DirtyLog<'a> {
    fn set(hub: &Hub, regions: &[RamRegion], flags: u32) -> Result<(), Error> {
        // The same slots, ranges and mapping as the VM was created with (the hub holds
        // a clone of the mapping, alive as long as the VM); only the flags change.
        for region in regions {
            set_memory_slot(hub.vm(), hub.memory(), region, flags)?;
        }
        Ok(())
    }

    fn enable(hub: &'a Hub) -> Result<Self, Error> {
        let regions = ram_regions(memory_bytes(hub.memory()));
        Self::set(hub, &regions, KVM_MEM_LOG_DIRTY_PAGES)?;
        let log = DirtyLog { hub, regions };
        // Whatever an earlier, abandoned migration left in the rings predates the
        // full pass that follows.
        log.take()?;
        Ok(log)
    }

    /// The pages written since the last call (or since logging began), by address.
    fn take(&self) -> Result<Vec<u64>, Error> {
        self.hub.take_dirty()
    }
}

impl Drop for DirtyLog<'_> {
    fn drop(&mut self) {
        if let Err(e) = Self::set(self.hub, &self.regions, 0) {
            tracing::warn!("turning dirty logging off failed: {e}");
        }
    }
}

fn send_pages(hub: &Hub, w: &mut impl Write, pages: &[u64]) -> Result<(u64, u64), Error> {
    let mut ram = RamWriter::new();
    let mut page = vec![0u8; PAGE_SIZE];
    for &gpa in pages {
        hub.memory()
            .read_slice(&mut page, GuestAddress(gpa))
            .map_err(|e| Error::GuestMemory(e.to_string()))?;
        ram.page(w, gpa, &page)?;
    }
    ram.flush(w)?;
    Ok((ram.total_pages, ram.total_bytes))
}

fn io(e: std::io::Error) -> Error {
    Error::Stream(e.into())
}

/// Sends the running VM to `w` and, once `confirm` says the destination runs it,
/// hands it off. `app_start` goes in META; `app_final` is asked for with the vCPUs
/// stopped and goes in the final APPS section. On any error the VM runs on here.
pub fn send(
    hub: &Hub,
    w: &mut impl Write,
    app_start: String,
    app_final: impl FnOnce() -> String,
    options: &Options,
    confirm: impl FnOnce() -> Result<(), Error>,
) -> Result<Report, Error> {
    let start = Instant::now();
    stream::write_header(w)?;
    stream::write_json(w, stream::TAG_META, &hub.meta(app_start))?;
    let log = DirtyLog::enable(hub)?;
    let mut rounds = Vec::new();
    let mut total_bytes = 0;

    let t = Instant::now();
    let first = write_all_ram(hub.memory(), hub.memfd(), w)?;
    w.flush().map_err(io)?;
    let mut last = Round {
        pages: first.pages,
        bytes: first.bytes,
        ms: t.elapsed().as_secs_f64() * 1e3,
    };
    total_bytes += first.bytes;
    rounds.push(last);

    let mut pending = log.take()?;
    while (rounds.len() as u32) <= options.max_rounds {
        // Bytes per ms the last round achieved (a round of a few pages says little:
        // at least 1 ms is assumed).
        let rate = last.bytes as f64 / last.ms.max(1.0);
        let predicted_ms = pending.len() as f64 * (PAGE_SIZE + 21) as f64 / rate.max(1.0);
        if predicted_ms <= options.max_downtime.as_secs_f64() * 1e3 {
            break;
        }
        let t = Instant::now();
        let (pages, bytes) = send_pages(hub, w, &pending)?;
        w.flush().map_err(io)?;
        last = Round {
            pages,
            bytes,
            ms: t.elapsed().as_secs_f64() * 1e3,
        };
        total_bytes += bytes;
        rounds.push(last);
        pending = log.take()?;
    }

    let down = Instant::now();
    let ms_since = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let paused = hub.pause()?;
    let pause_ms = ms_since(down);
    let saved_tsc = paused.vcpus().first().and_then(|v| v.tsc());
    let tsc_khz = paused.vcpus().first().map_or(0, |v| v.tsc_khz);
    let t = Instant::now();
    let mut last_pages = log.take()?;
    let harvest_ms = ms_since(t);
    last_pages.extend_from_slice(&pending);
    last_pages.sort_unstable();
    last_pages.dedup();
    let t = Instant::now();
    let (final_pages, final_bytes) = send_pages(hub, w, &last_pages)?;
    let final_pages_ms = ms_since(t);
    let t = Instant::now();
    paused.write_state(w, Some(app_final()))?;
    w.flush().map_err(io)?;
    let state_ms = ms_since(t);
    let sent_ms = ms_since(down);
    confirm()?;
    let downtime_ms = down.elapsed().as_secs_f64() * 1e3;
    paused.hand_off();
    drop(log);
    Ok(Report {
        rounds,
        final_pages,
        final_bytes,
        total_bytes: total_bytes + final_bytes,
        total_ms: start.elapsed().as_secs_f64() * 1e3,
        downtime_ms,
        pause_ms,
        harvest_ms,
        final_pages_ms,
        state_ms,
        saved_tsc,
        tsc_khz,
        sent_ms,
    })
}
