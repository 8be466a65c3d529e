//! Devices named on a command line or in a node file, parsed and checked.

use anyhow::Result;
use hv::passthrough::PassthroughSpec;

/// One passthrough device (`vfio-user:PATH` or a host PCI address), checked against the
/// host: a kernel VFIO device must exist and open.
pub fn passthrough_spec(text: &str) -> Result<PassthroughSpec> {
    let spec: PassthroughSpec = text.parse().map_err(anyhow::Error::msg)?;
    if let PassthroughSpec::Kernel(bdf) = &spec {
        hv::passthrough::vfio::open(bdf)?;
    }
    Ok(spec)
}
