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
//! is read ([`gather`]) or written ([`scatter`]), and only within its own buffers.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
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
