//! A [`Comm`] of host threads: one thread per rank, an unbounded channel per ordered
//! pair of ranks. For the MPI kernels' unit tests and the native twin. Collectives go
//! through rank 0 and combine in rank order, so every rank gets the same bits.

extern crate std;

use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Instant;
use std::vec;
use std::vec::Vec;

use super::{Comm, Error, Op};
use crate::team::Arena;

/// Tags of the collectives (the kernels' own tags are below 1000).
const TAG_COLLECTIVE: u32 = 0xC011;

/// A message on a channel: its tag and bytes.
type Message = (u32, Vec<u8>);

/// One rank's end of the channels.
pub struct ThreadComm {
    rank: usize,
    size: usize,
    /// `to[j]`: to rank `j`.
    to: Vec<Sender<Message>>,
    /// `from[j]`: from rank `j`.
    from: Vec<Receiver<Message>>,
    origin: Instant,
}

/// Runs `body` on `ranks` threads, each with its own zeroed arena of `bytes`, and
/// returns every rank's result in rank order.
pub fn run_ranks<R: Send>(
    ranks: usize,
    bytes: usize,
    body: impl Fn(&mut ThreadComm, &mut Arena) -> R + Sync,
) -> Vec<R> {
    let mut senders: Vec<Vec<Sender<Message>>> = (0..ranks).map(|_| Vec::new()).collect();
    let mut receivers: Vec<Vec<Receiver<Message>>> = (0..ranks).map(|_| Vec::new()).collect();
    // senders[src][dst] and receivers[dst][src] are the two ends of one channel.
    for row in senders.iter_mut() {
        for dst_receivers in receivers.iter_mut() {
            let (tx, rx) = channel();
            row.push(tx);
            dst_receivers.push(rx);
        }
    }
    let origin = Instant::now();
    let comms: Vec<ThreadComm> = senders
        .into_iter()
        .zip(receivers)
        .enumerate()
        .map(|(rank, (to, from))| ThreadComm {
            rank,
            size: ranks,
            to,
            from,
            origin,
        })
        .collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|mut comm| {
                let body = &body;
                scope.spawn(move || {
                    let mut memory = vec![0u64; bytes / 8 + 8];
                    // SAFETY: `memory` outlives the arena and is this thread's alone.
                    let mut arena =
                        unsafe { Arena::new(memory.as_mut_ptr().cast(), memory.len() * 8) };
                    body(&mut comm, &mut arena)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

impl ThreadComm {
    fn take(&mut self, src: usize, tag: u32) -> Result<Vec<u8>, Error> {
        let (got, data) = self.from[src].recv().map_err(|_| Error("peer-gone"))?;
        if got != tag {
            return Err(Error("tag-mismatch"));
        }
        Ok(data)
    }

    /// Every rank's `buf` to rank 0 (in rank order through `combine`), then back.
    fn allreduce_bytes(
        &mut self,
        buf: &mut [u8],
        combine: impl Fn(&mut [u8], &[u8]),
    ) -> Result<(), Error> {
        if self.rank == 0 {
            for src in 1..self.size {
                let other = self.take(src, TAG_COLLECTIVE)?;
                combine(buf, &other);
            }
        } else {
            self.send(0, TAG_COLLECTIVE, buf)?;
        }
        self.bcast(0, buf)
    }
}

fn reduce<T: Copy>(
    acc: &mut [u8],
    other: &[u8],
    f: impl Fn(T, T) -> T,
    from: fn([u8; 8]) -> T,
    to: fn(T) -> [u8; 8],
) {
    for (a, b) in acc.chunks_exact_mut(8).zip(other.chunks_exact(8)) {
        let x = from(a.try_into().unwrap());
        let y = from(b.try_into().unwrap());
        a.copy_from_slice(&to(f(x, y)));
    }
}

impl Comm for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn seconds(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    fn barrier(&mut self) -> Result<(), Error> {
        self.allreduce_bytes(&mut [], |_, _| {})
    }

    fn send(&mut self, dst: usize, tag: u32, data: &[u8]) -> Result<(), Error> {
        self.to[dst]
            .send((tag, data.to_vec()))
            .map_err(|_| Error("peer-gone"))
    }

    fn recv(&mut self, src: usize, tag: u32, buf: &mut [u8]) -> Result<usize, Error> {
        let data = self.take(src, tag)?;
        if data.len() > buf.len() {
            return Err(Error("truncated"));
        }
        buf[..data.len()].copy_from_slice(&data);
        Ok(data.len())
    }

    fn sendrecv(
        &mut self,
        dst: usize,
        send_tag: u32,
        data: &[u8],
        src: usize,
        recv_tag: u32,
        buf: &mut [u8],
    ) -> Result<usize, Error> {
        // Channels never block a sender.
        self.send(dst, send_tag, data)?;
        self.recv(src, recv_tag, buf)
    }

    fn bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<(), Error> {
        if self.rank == root {
            for dst in (0..self.size).filter(|&d| d != root) {
                self.send(dst, TAG_COLLECTIVE, buf)?;
            }
            Ok(())
        } else {
            let n = self.recv(root, TAG_COLLECTIVE, buf)?;
            if n == buf.len() {
                Ok(())
            } else {
                Err(Error("truncated"))
            }
        }
    }

    fn allreduce_f64(&mut self, values: &mut [f64], op: Op) -> Result<(), Error> {
        let f = move |x: f64, y: f64| match op {
            Op::Sum => x + y,
            Op::Max => x.max(y),
            Op::Min => x.min(y),
        };
        self.allreduce_bytes(super::bytes_mut(values), |a, b| {
            reduce(a, b, f, f64::from_le_bytes, f64::to_le_bytes)
        })
    }

    fn allreduce_i64(&mut self, values: &mut [i64], op: Op) -> Result<(), Error> {
        let f = move |x: i64, y: i64| match op {
            Op::Sum => x.wrapping_add(y),
            Op::Max => x.max(y),
            Op::Min => x.min(y),
        };
        self.allreduce_bytes(super::bytes_mut(values), |a, b| {
            reduce(a, b, f, i64::from_le_bytes, i64::to_le_bytes)
        })
    }

    fn alltoall(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        let block = send.len() / self.size;
        let counts = vec![block; self.size];
        let displs: Vec<usize> = (0..self.size).map(|j| j * block).collect();
        self.alltoallv(send, &counts, &displs, recv, &counts, &displs)
    }

    fn alltoallv(
        &mut self,
        send: &[u8],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<(), Error> {
        for j in 0..self.size {
            if send_displs[j] + send_counts[j] > send.len()
                || recv_displs[j] + recv_counts[j] > recv.len()
            {
                return Err(Error("bad-layout"));
            }
        }
        // Unbounded channels: every send completes at once.
        for j in 0..self.size {
            self.send(
                j,
                TAG_COLLECTIVE + 1,
                &send[send_displs[j]..send_displs[j] + send_counts[j]],
            )?;
        }
        for j in 0..self.size {
            let data = self.take(j, TAG_COLLECTIVE + 1)?;
            if data.len() != recv_counts[j] {
                return Err(Error("truncated"));
            }
            recv[recv_displs[j]..recv_displs[j] + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_agree_on_every_rank() {
        let results = run_ranks(4, 64, |comm, _| {
            let me = comm.rank() as i64;
            let mut v = [me, me * 10];
            comm.allreduce_i64(&mut v, Op::Sum).unwrap();
            let mut m = [me as f64];
            comm.allreduce_f64(&mut m, Op::Max).unwrap();
            let send: Vec<u8> = (0..4).map(|j| (me * 4 + j) as u8).collect();
            let mut got = [0u8; 4];
            comm.alltoall(&send, &mut got).unwrap();
            comm.barrier().unwrap();
            (v, m[0], got)
        });
        for (rank, (v, m, got)) in results.into_iter().enumerate() {
            assert_eq!(v, [6, 60]);
            assert_eq!(m, 3.0);
            let expected: Vec<u8> = (0..4).map(|j| (j * 4 + rank) as u8).collect();
            assert_eq!(got.to_vec(), expected);
        }
    }
}
