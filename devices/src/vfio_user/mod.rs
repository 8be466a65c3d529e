//! vfio-user: a PCI device served by another process over a UNIX socket (the protocol
//! QEMU, SPDK and libvfio-user speak). [`proto`] is the message format, parsed without
//! trusting the peer; [`socket`] moves whole messages and their file descriptors.
//! kumo's client is `hv::passthrough`; its NIC server is `kumo nic-server`.

pub mod proto;
pub mod socket;
