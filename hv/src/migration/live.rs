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
//! Every round ends with a `SYNC` and waits (bounded) for the destination's
//! acknowledgement that it applied it. So a round's rate is what reached the
//! destination's RAM, not what fitted in the socket's buffers, and the pause comes
//! only when the destination has caught up: the downtime holds the last pages and the
//! state, not a backlog of earlier rounds still being applied over there.
//!
//! Any error before the confirmation (the peer going away, a write failing, a wrong
//! reply, no acknowledgement in time) resumes the VM here as if nothing happened.
//!
//! KVM tracks the vCPUs' writes; a device that writes guest RAM from a host thread
//! (virtio RX, a vfio-user server) records its own ([`super::DeviceWrites`], merged by
//! `Hub::take_dirty`) and must be registered before it may be migrated.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES;
use serde::{Deserialize, Serialize};
use vm_memory::{Bytes, GuestAddress};

use super::stream::{self, PAGE_SIZE, RamWriter, Reply, StreamError};
use super::{Hub, memory_bytes, write_all_ram};
use crate::Error;
use crate::machine::set_memory_slot;
use crate::memory_map::{RamRegion, ram_regions};

/// How a migration is paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Stop iterating once the remaining dirty pages would take at most this long.
    pub max_downtime: Duration,
    /// Rounds after the first full pass before stopping regardless.
    pub max_rounds: u32,
    /// Pause the vCPUs before the first page and copy everything once (Xen's and
    /// QEMU's non-live migration): the downtime is the whole transfer.
    pub stop_and_copy: bool,
}

impl Default for Options {
    /// QEMU's defaults: 300 ms of downtime; kumo caps the rounds at 30.
    fn default() -> Self {
        Options {
            max_downtime: Duration::from_millis(300),
            max_rounds: 30,
            stop_and_copy: false,
        }
    }
}

/// One copy round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Round {
    pub pages: u64,
    pub bytes: u64,
    /// From the round's first page read until the destination acknowledged it.
    pub ms: f64,
    /// Of that, waiting for the acknowledgement after the last byte was sent (how
    /// far the destination was behind).
    pub ack_wait_ms: f64,
}

/// The destination as the source sees it: its replies, each wait bounded by the
/// implementation (a socket's read timeout).
pub trait Destination {
    /// Returns once the destination has applied every page up to round `round`.
    fn applied(&mut self, round: u32) -> Result<(), Error>;
    /// Returns once the destination runs the VM.
    fn running(&mut self) -> Result<(), Error>;
}

fn reply_error(waiting_for: &str, e: StreamError) -> Error {
    let why = match e {
        StreamError::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            "no reply in time".to_string()
        }
        StreamError::Truncated => "the connection closed".to_string(),
        e => e.to_string(),
    };
    Error::Migration(format!("the destination did not {waiting_for}: {why}"))
}

/// Reads replies from `r` until round `round` is acknowledged (earlier rounds'
/// acknowledgements are passed over).
pub fn await_applied(r: &mut impl Read, round: u32) -> Result<(), Error> {
    let waiting_for = format!("acknowledge round {round}");
    loop {
        match stream::read_reply(r).map_err(|e| reply_error(&waiting_for, e))? {
            Reply::Applied(n) if n == round => return Ok(()),
            Reply::Applied(n) if n < round => continue,
            other => {
                return Err(Error::Migration(format!(
                    "the destination replied {other:?} while round {round} was awaited"
                )));
            }
        }
    }
}

/// Reads replies from `r` until the destination says it runs the VM.
pub fn await_running(r: &mut impl Read) -> Result<(), Error> {
    loop {
        match stream::read_reply(r).map_err(|e| reply_error("confirm it runs the VM", e))? {
            Reply::Running => return Ok(()),
            Reply::Applied(_) => continue,
        }
    }
}

/// What a migration did and how long it took (host view).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
        hub.track_device_writes(true);
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
        self.hub.track_device_writes(false);
        if let Err(e) = Self::set(self.hub, &self.regions, 0) {
            tracing::warn!("turning dirty logging off failed: {e}");
        }
    }
}

/// Sends `pages` through `ram`, one writer for the whole migration: its 4 MiB buffer
/// is mapped once, before the VM pauses, not again in every round and in the
/// downtime. Returns the pages and bytes this call sent.
fn send_pages(
    hub: &Hub,
    w: &mut impl Write,
    ram: &mut RamWriter,
    pages: &[u64],
) -> Result<(u64, u64), Error> {
    let (pages_before, bytes_before) = (ram.total_pages, ram.total_bytes);
    let mut page = [0u8; PAGE_SIZE];
    for &gpa in pages {
        hub.memory()
            .read_slice(&mut page, GuestAddress(gpa))
            .map_err(|e| Error::GuestMemory(e.to_string()))?;
        ram.page(w, gpa, &page)?;
    }
    ram.flush(w)?;
    Ok((
        ram.total_pages - pages_before,
        ram.total_bytes - bytes_before,
    ))
}

fn io(e: std::io::Error) -> Error {
    Error::Stream(e.into())
}

/// Ends copy round `number`, begun at `began` with `pages` pages in `bytes`: its
/// `SYNC`, then the destination's acknowledgement.
fn end_round(
    w: &mut impl Write,
    peer: &mut impl Destination,
    number: u32,
    began: Instant,
    (pages, bytes): (u64, u64),
) -> Result<Round, Error> {
    stream::write_sync(w, number)?;
    w.flush().map_err(io)?;
    let sent = Instant::now();
    peer.applied(number)?;
    Ok(Round {
        pages,
        bytes,
        ms: began.elapsed().as_secs_f64() * 1e3,
        ack_wait_ms: sent.elapsed().as_secs_f64() * 1e3,
    })
}

/// Sends the running VM to `w` and, once `peer` says the destination runs it,
/// hands it off. `app_start` goes in META; `app_final` is asked for with the vCPUs
/// stopped and goes in the final APPS section. On any error the VM runs on here.
pub fn send(
    hub: &Hub,
    w: &mut impl Write,
    app_start: String,
    app_final: impl FnOnce() -> String,
    options: &Options,
    peer: &mut impl Destination,
) -> Result<Report, Error> {
    let start = Instant::now();
    stream::write_header(w)?;
    stream::write_json(w, stream::TAG_META, &hub.meta(app_start))?;
    let log = DirtyLog::enable(hub)?;
    let mut rounds = Vec::new();
    let mut total_bytes = 0;
    let ms_since = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    // Stop-and-copy pauses here; dropping `early` on an error resumes the VM.
    let early = if options.stop_and_copy {
        let down = Instant::now();
        let paused = hub.pause()?;
        Some((down, paused, ms_since(down)))
    } else {
        None
    };

    let t = Instant::now();
    let first = write_all_ram(hub.memory(), hub.memfd(), w)?;
    let mut last = end_round(w, peer, 0, t, (first.pages, first.bytes))?;
    total_bytes += first.bytes;
    rounds.push(last);

    let mut ram = RamWriter::new();
    let mut pending = log.take()?;
    while early.is_none() && (rounds.len() as u32) <= options.max_rounds {
        // Bytes per ms the last round achieved into the destination's RAM (a round of
        // a few pages says little: at least 1 ms is assumed).
        let rate = last.bytes as f64 / last.ms.max(1.0);
        let predicted_ms = pending.len() as f64 * (PAGE_SIZE + 21) as f64 / rate.max(1.0);
        if predicted_ms <= options.max_downtime.as_secs_f64() * 1e3 {
            break;
        }
        let t = Instant::now();
        let sent = send_pages(hub, w, &mut ram, &pending)?;
        last = end_round(w, peer, rounds.len() as u32, t, sent)?;
        total_bytes += last.bytes;
        rounds.push(last);
        pending = log.take()?;
    }

    let (down, paused, pause_ms) = match early {
        Some(early) => early,
        None => {
            let down = Instant::now();
            let paused = hub.pause()?;
            (down, paused, ms_since(down))
        }
    };
    let saved_tsc = paused.vcpus().first().and_then(|v| v.tsc());
    let tsc_khz = paused.vcpus().first().map_or(0, |v| v.tsc_khz);
    let t = Instant::now();
    let mut last_pages = log.take()?;
    let harvest_ms = ms_since(t);
    last_pages.extend_from_slice(&pending);
    last_pages.sort_unstable();
    last_pages.dedup();
    let t = Instant::now();
    let (final_pages, final_bytes) = send_pages(hub, w, &mut ram, &last_pages)?;
    let final_pages_ms = ms_since(t);
    let t = Instant::now();
    paused.write_state(w, Some(app_final()))?;
    w.flush().map_err(io)?;
    let state_ms = ms_since(t);
    let sent_ms = ms_since(down);
    peer.running()?;
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
