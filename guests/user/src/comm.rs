//! The guest's MPI as the NPB-MPI kernels' [`npb::mpi::Comm`]: a thin adapter (error
//! names, layouts as fixed arrays, the NIC's clock in seconds).

use npb::mpi::{Comm, Error};

use crate::mpi::{self, Link, MAX_RANKS, Mpi, Op};

pub struct MpiComm<'a, L: Link> {
    pub mpi: &'a mut Mpi<L>,
    /// Clock ticks per millisecond (the link's clock is the TSC).
    pub tsc_khz: u64,
    pub progress: Progress,
}

/// Where a kernel's progress goes (the guest: an `@kumo progress` line, which a
/// host's balancer reads; `kumo experiment s5`), and how much was shown.
pub struct Progress {
    pub show: fn(done: usize, of: usize),
    /// The last step shown, in [`PROGRESS_STEPS`]ths of the timed loop.
    shown: usize,
}

impl Progress {
    pub fn new(show: fn(done: usize, of: usize)) -> Progress {
        Progress { show, shown: 0 }
    }
}

/// Steps of progress a rank shows over a kernel's timed loop: each line is a trap
/// (ring 0, emulated on kvm_pvm hosts), so a 400-step SP shows 20 of them.
pub const PROGRESS_STEPS: usize = 20;

fn error(e: mpi::Error) -> Error {
    Error(e.name())
}

fn op(op: npb::mpi::Op) -> Op {
    match op {
        npb::mpi::Op::Sum => Op::Sum,
        npb::mpi::Op::Max => Op::Max,
        npb::mpi::Op::Min => Op::Min,
    }
}

/// `(counts, displs)` as the MPI takes them; false if there are more than it holds.
fn layout(counts: &[usize], displs: &[usize]) -> Option<([usize; MAX_RANKS], [usize; MAX_RANKS])> {
    if counts.len() > MAX_RANKS || displs.len() != counts.len() {
        return None;
    }
    let mut out = ([0; MAX_RANKS], [0; MAX_RANKS]);
    out.0[..counts.len()].copy_from_slice(counts);
    out.1[..displs.len()].copy_from_slice(displs);
    Some(out)
}

impl<L: Link> Comm for MpiComm<'_, L> {
    fn rank(&self) -> usize {
        self.mpi.rank()
    }

    fn size(&self) -> usize {
        self.mpi.size()
    }

    fn seconds(&self) -> f64 {
        self.mpi.link().now() as f64 / (self.tsc_khz as f64 * 1000.0)
    }

    fn barrier(&mut self) -> Result<(), Error> {
        self.mpi.barrier().map_err(error)
    }

    /// Shown in twentieths: an MPI job's one result comes at its end, and a balancer
    /// wants to see it move.
    fn progress(&mut self, done: usize, of: usize) {
        let step = done.saturating_mul(PROGRESS_STEPS) / of.max(1);
        if step > self.progress.shown {
            self.progress.shown = step;
            (self.progress.show)(done, of);
        }
    }

    fn send(&mut self, dst: usize, tag: u32, data: &[u8]) -> Result<(), Error> {
        self.mpi.send(dst, tag, data).map_err(error)
    }

    fn recv(&mut self, src: usize, tag: u32, buf: &mut [u8]) -> Result<usize, Error> {
        self.mpi.recv(src, tag, buf).map_err(error)
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
        self.mpi
            .sendrecv(dst, send_tag, data, src, recv_tag, buf)
            .map_err(error)
    }

    fn bcast(&mut self, root: usize, buf: &mut [u8]) -> Result<(), Error> {
        self.mpi.bcast(root, buf).map_err(error)
    }

    fn allreduce_f64(&mut self, values: &mut [f64], o: npb::mpi::Op) -> Result<(), Error> {
        self.mpi.allreduce_f64(values, op(o)).map_err(error)
    }

    fn allreduce_i64(&mut self, values: &mut [i64], o: npb::mpi::Op) -> Result<(), Error> {
        self.mpi.allreduce_i64(values, op(o)).map_err(error)
    }

    fn alltoall(&mut self, send: &[u8], recv: &mut [u8]) -> Result<(), Error> {
        self.mpi.alltoall(send, recv).map_err(error)
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
        let bad = Error(mpi::Error::BadLayout.name());
        let send_layout = layout(send_counts, send_displs).ok_or(bad)?;
        let recv_layout = layout(recv_counts, recv_displs).ok_or(bad)?;
        self.mpi
            .alltoallv(send, &send_layout, recv, &recv_layout)
            .map_err(error)
    }
}
