//! hv on a real KVM: VMs built and run in this process, one module per area.

mod doorbells;
mod irq;
mod kvm;
mod migration;
mod passthrough_windows;
