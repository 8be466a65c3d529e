//! How `kumo bench switch`'s controller hands one host CPU back and forth between two
//! spinners: a VM's two vCPUs, or the native twin's two host threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;
use hv::placement::{Policy, VcpuControl};

/// FIFO priorities: the chosen vCPU above the other; the controller above both.
pub const RUNNING_RANK: u8 = 2;
pub const WAITING_RANK: u8 = 1;
pub const CONTROLLER_RANK: u8 = 3;

/// What the controller hands the CPU between: a VM's two vCPUs, or the native twin's
/// two host threads (`switch_native`).
pub trait Handover {
    fn set_policy(&self, who: usize, policy: Policy) -> Result<()>;
    fn park(&self, who: usize) -> Result<()>;
    fn unpark(&self, who: usize);
}

impl Handover for VcpuControl {
    fn set_policy(&self, who: usize, policy: Policy) -> Result<()> {
        Ok(VcpuControl::set_policy(self, who, policy)?)
    }

    fn park(&self, who: usize) -> Result<()> {
        Ok(VcpuControl::park(self, who)?)
    }

    fn unpark(&self, who: usize) {
        VcpuControl::unpark(self, who);
    }
}

/// Lets the first hold the CPU and the second wait (ranked below it, or parked). Call
/// it before the two share a CPU: pinned there first, they would take turns under the
/// host's own scheduler, switches the guest sees and the controller never asked for.
pub fn hold_first(control: &dyn Handover, mechanism: Mechanism) -> Result<()> {
    match mechanism {
        Mechanism::Fifo => {
            control.set_policy(0, Policy::Fifo(RUNNING_RANK))?;
            control.set_policy(1, Policy::Fifo(WAITING_RANK))?;
        }
        Mechanism::Park => control.park(1)?,
    }
    Ok(())
}

/// Hands the CPU to the other one every `slice` until `stop`, the first holding it
/// ([`hold_first`]); returns how many hand-overs it made.
pub fn alternate(
    control: &dyn Handover,
    mechanism: Mechanism,
    slice: Duration,
    stop: &AtomicBool,
) -> Result<u64> {
    let mut running = 0;
    let mut switches = 0u64;
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(slice);
        let next = 1 - running;
        match mechanism {
            // An error here means the VM is ending (its vCPU threads are gone); the
            // start-up calls above already proved the permissions.
            Mechanism::Fifo => {
                // Raise first: equal ranks do not preempt, so the switch happens at
                // the lowering, in one step.
                let raised = control.set_policy(next, Policy::Fifo(RUNNING_RANK));
                if raised.is_err()
                    || control
                        .set_policy(running, Policy::Fifo(WAITING_RANK))
                        .is_err()
                {
                    break;
                }
            }
            Mechanism::Park => {
                if control.park(running).is_err() {
                    break;
                }
                control.unpark(next);
            }
        }
        running = next;
        switches += 1;
    }
    Ok(switches)
}

/// How a scheduler hands a host CPU from one vCPU to another (`hv::placement`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// SCHED_FIFO ranks: the kernel preempts inside KVM_RUN.
    Fifo,
    /// Park the running vCPU outside KVM_RUN (signal kick), unpark the next.
    Park,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Fifo => "fifo",
            Mechanism::Park => "park",
        }
    }
}
