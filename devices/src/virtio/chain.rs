//! Validated descriptor chains: every device walks a chain through here before it
//! touches a byte, so all of them refuse the same malformed chains the same way.
//!
//! `virtio-queue`'s [`DescriptorChain`] iterator follows `next` links and indirect
//! tables, bounds the walk by the table's size (a loop ends it) and stops quietly at
//! anything it cannot follow (an unreadable descriptor, a `next` past the table, a bad
//! indirect table, a chain over 4 GiB). [`walk`] turns that quiet stop into an error:
//! a chain whose last descriptor still says "next" was cut short. It then checks what
//! the iterator does not: each buffer's direction and that it lies wholly in guest
//! memory, and the chain's total against the device's limit. Only a chain that passes
//! is read ([`gather`], [`read_at`]) or written ([`scatter`]), or copied from one
//! guest's chain into another's ([`copy_between`]), and only within its own buffers.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::guest_memory::GuestMemorySliceIterator;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

/// One buffer of a chain, known to lie in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: usize,
}

/// Which way the device uses the chain's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The driver's data for the device (TX): every descriptor device-readable.
    DeviceReads,
    /// Room for the device's data (RX): every descriptor device-writable.
    DeviceWrites,
}

/// Why a chain was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("the chain has no descriptors (bad head index, unreadable table or indirect table)")]
    Empty,
    #[error("the chain breaks off (a loop, a next index past the table, a bad indirect table)")]
    Broken,
    #[error("a descriptor points the wrong way for this queue")]
    WrongDirection,
    #[error("a buffer lies outside guest memory")]
    OutOfMemory,
    #[error("the chain holds more than {0} bytes")]
    TooLong(usize),
}

/// Walks `chain`, checking that every buffer points `direction`, lies in guest memory
/// and that together they hold at most `max_bytes`. Zero-length descriptors are
/// skipped.
pub fn walk<M>(
    chain: DescriptorChain<M>,
    direction: Direction,
    max_bytes: usize,
) -> Result<Vec<Segment>, ChainError>
where
    M: Deref,
    M::Target: GuestMemory,
{
    let (readable, writable) = walk_split(chain, max_bytes)?;
    match direction {
        Direction::DeviceReads if writable.is_empty() => Ok(readable),
        Direction::DeviceWrites if readable.is_empty() => Ok(writable),
        _ => Err(ChainError::WrongDirection),
    }
}

/// Walks a request/response chain: device-readable buffers, then device-writable
/// ones (a readable buffer after a writable one is [`ChainError::WrongDirection`]),
/// each in guest memory, at most `max_bytes` in all.
pub fn walk_split<M>(
    chain: DescriptorChain<M>,
    max_bytes: usize,
) -> Result<(Vec<Segment>, Vec<Segment>), ChainError>
where
    M: Deref,
    M::Target: GuestMemory,
{
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    let mut total = 0usize;
    let mut last_had_next = None;
    let mut chain = chain;
    while let Some(desc) = chain.next() {
        last_had_next = Some(desc.has_next());
        let is_writable = desc.is_write_only();
        if !is_writable && !writable.is_empty() {
            return Err(ChainError::WrongDirection);
        }
        let len = desc.len() as usize;
        if len == 0 {
            continue;
        }
        total = total.saturating_add(len);
        if total > max_bytes {
            return Err(ChainError::TooLong(max_bytes));
        }
        let access = if is_writable {
            Permissions::Write
        } else {
            Permissions::Read
        };
        if !chain.memory().check_range(desc.addr(), len, access) {
            return Err(ChainError::OutOfMemory);
        }
        let segment = Segment {
            addr: desc.addr(),
            len,
        };
        if is_writable {
            writable.push(segment);
        } else {
            readable.push(segment);
        }
    }
    match last_had_next {
        None => Err(ChainError::Empty),
        Some(true) => Err(ChainError::Broken),
        Some(false) => Ok((readable, writable)),
    }
}

/// Total bytes of `segments`.
pub fn capacity(segments: &[Segment]) -> usize {
    segments.iter().map(|s| s.len).sum()
}

/// Appends the bytes of `segments` to `out`, leaving out the first `skip` bytes.
pub fn gather<M: GuestMemory>(
    mem: &M,
    segments: &[Segment],
    skip: usize,
    out: &mut Vec<u8>,
) -> Result<(), ChainError> {
    let mut skip = skip;
    for segment in segments {
        if skip >= segment.len {
            skip -= segment.len;
            continue;
        }
        // Within a segment `walk` checked: cannot overflow.
        let addr = segment.addr.unchecked_add(skip as u64);
        let len = segment.len - skip;
        skip = 0;
        let start = out.len();
        out.resize(start + len, 0);
        mem.read_slice(&mut out[start..], addr)
            .map_err(|_| ChainError::OutOfMemory)?;
    }
    Ok(())
}

/// Writes `parts` one after another across `segments`; returns the bytes written.
/// Writes nothing unless all of `parts` fit.
pub fn scatter<M: GuestMemory>(
    mem: &M,
    segments: &[Segment],
    parts: &[&[u8]],
) -> Result<usize, ChainError> {
    let wanted: usize = parts.iter().map(|p| p.len()).sum();
    if wanted > capacity(segments) {
        return Err(ChainError::TooLong(capacity(segments)));
    }
    let mut segments = segments.iter().copied();
    let mut current: Option<Segment> = None;
    for part in parts {
        let mut part: &[u8] = part;
        while !part.is_empty() {
            let segment = match current.take() {
                Some(s) if s.len > 0 => s,
                _ => segments.next().ok_or(ChainError::TooLong(wanted))?,
            };
            let n = part.len().min(segment.len);
            mem.write_slice(&part[..n], segment.addr)
                .map_err(|_| ChainError::OutOfMemory)?;
            part = &part[n..];
            // Within a segment `walk` checked: cannot overflow.
            current = Some(Segment {
                addr: segment.addr.unchecked_add(n as u64),
                len: segment.len - n,
            });
        }
    }
    Ok(wanted)
}

/// The part of `segments` from byte `skip` on, as segments.
fn after(segments: &[Segment], skip: usize) -> impl Iterator<Item = Segment> + '_ {
    let mut skip = skip;
    segments.iter().filter_map(move |s| {
        if skip >= s.len {
            skip -= s.len;
            return None;
        }
        // Within a segment `walk` checked: cannot overflow.
        let segment = Segment {
            addr: s.addr.unchecked_add(skip as u64),
            len: s.len - skip,
        };
        skip = 0;
        Some(segment)
    })
}

/// Fills `out` from `segments`, starting `skip` bytes in.
pub fn read_at<M: GuestMemory>(
    mem: &M,
    segments: &[Segment],
    skip: usize,
    out: &mut [u8],
) -> Result<(), ChainError> {
    let mut done = 0;
    for segment in after(segments, skip) {
        if done == out.len() {
            break;
        }
        let n = segment.len.min(out.len() - done);
        mem.read_slice(&mut out[done..done + n], segment.addr)
            .map_err(|_| ChainError::OutOfMemory)?;
        done += n;
    }
    if done == out.len() {
        Ok(())
    } else {
        Err(ChainError::TooLong(done))
    }
}

/// Copies the bytes of `source` (from `source_skip` on, in guest memory `from`) into
/// `destination` (from `destination_skip` on, in guest memory `to`) with no buffer in
/// between. Copies nothing unless all of it fits; returns the bytes copied.
pub fn copy_between<S: GuestMemory, D: GuestMemory>(
    from: &S,
    source: &[Segment],
    source_skip: usize,
    to: &D,
    destination: &[Segment],
    destination_skip: usize,
) -> Result<usize, ChainError> {
    let wanted = capacity(source).saturating_sub(source_skip);
    let room = capacity(destination).saturating_sub(destination_skip);
    if wanted > room {
        return Err(ChainError::TooLong(room));
    }
    let mut targets = after(destination, destination_skip);
    let mut target: Option<Segment> = None;
    for piece in after(source, source_skip) {
        let (mut addr, mut left) = (piece.addr, piece.len);
        while left > 0 {
            let t = match target.take() {
                Some(t) if t.len > 0 => t,
                _ => targets.next().ok_or(ChainError::TooLong(room))?,
            };
            let n = left.min(t.len);
            copy_range(from, addr, to, t.addr, n)?;
            // Within segments `walk` checked: cannot overflow.
            addr = addr.unchecked_add(n as u64);
            left -= n;
            target = Some(Segment {
                addr: t.addr.unchecked_add(n as u64),
                len: t.len - n,
            });
        }
    }
    Ok(wanted)
}

/// Copies `len` bytes between two guest memories, region boundaries on either side
/// included.
fn copy_range<S: GuestMemory, D: GuestMemory>(
    from: &S,
    source: GuestAddress,
    to: &D,
    destination: GuestAddress,
    len: usize,
) -> Result<(), ChainError> {
    let oom = |_| ChainError::OutOfMemory;
    let mut sources = from
        .get_slices(source, len, Permissions::Read)
        .map_err(oom)?
        .stop_on_error()
        .map_err(oom)?;
    let mut destinations = to
        .get_slices(destination, len, Permissions::Write)
        .map_err(oom)?
        .stop_on_error()
        .map_err(oom)?;
    let (mut s, mut d) = (None, None);
    let mut copied = 0;
    while copied < len {
        let src = match s.take() {
            Some(src) => src,
            None => sources.next().ok_or(ChainError::OutOfMemory)?,
        };
        let dst = match d.take() {
            Some(dst) => dst,
            None => destinations.next().ok_or(ChainError::OutOfMemory)?,
        };
        let n = src.len().min(dst.len());
        let rest = (n < dst.len())
            .then(|| dst.offset(n))
            .transpose()
            .map_err(|_| ChainError::OutOfMemory)?;
        // Copies min(src, dst) = n bytes.
        src.copy_to_volatile_slice(dst);
        copied += n;
        if n < src.len() {
            s = Some(src.offset(n).map_err(|_| ChainError::OutOfMemory)?);
        }
        d = rest;
    }
    Ok(())
}
