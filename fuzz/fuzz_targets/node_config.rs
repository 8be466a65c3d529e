//! Node file parsing and validation (vmm/src/spec/node.rs): any text given to
//! `kumo node` must give a node or a one-line error. A valid node's domains must
//! describe themselves (ranks, command line) without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(node) = kumo_vmm::spec::node::parse(text) else {
        return;
    };
    assert!(!node.pcpus.is_empty());
    for domain in &node.domains {
        let _ = domain.ranks();
        let _ = domain.local_ranks();
        let _ = domain.cmdline();
    }
    let _ = node.uses_credit();
});
