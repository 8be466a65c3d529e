//! The descriptor chain walker (devices/src/virtio/chain.rs) over rings and
//! descriptor tables a guest wrote: every chain is walked, and one that passes is
//! read and written within its own buffers.
#![no_main]

use devices::virtio::chain::{self, Direction};
use kumo_fuzz::{Input, guest_memory, queue};
use libfuzzer_sys::fuzz_target;
use virtio_queue::QueueT;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mut queue = queue(&mut input, 256);
    let max_bytes = usize::from(input.u16()) * 16;
    let mode = input.u8();
    let mem = guest_memory(input.rest());
    // A ring's index can claim up to 65535 new chains; serve a bounded number, as a
    // device's pass is bounded.
    for _ in 0..64 {
        let Some(head) = queue.pop_descriptor_chain(&mem) else {
            break;
        };
        let index = head.head_index();
        let result = match mode % 3 {
            0 => chain::walk(head, Direction::DeviceReads, max_bytes).map(|r| (r, Vec::new())),
            1 => chain::walk(head, Direction::DeviceWrites, max_bytes).map(|w| (Vec::new(), w)),
            _ => chain::walk_split(head, max_bytes),
        };
        let written = match result {
            Ok((readable, writable)) => {
                let mut bytes = Vec::new();
                chain::gather(&mem, &readable, usize::from(mode >> 2), &mut bytes)
                    .expect("a walked chain's readable buffers are in memory");
                assert!(bytes.len() <= chain::capacity(&readable));
                let mut head = [0u8; 12];
                let _ = chain::read_at(&mem, &readable, 0, &mut head);
                let copied =
                    chain::copy_between(&mem, &readable, 0, &mem, &writable, 0).unwrap_or(0);
                let scattered = chain::scatter(&mem, &writable, &[&bytes, &head]).unwrap_or(0);
                u32::try_from(copied.max(scattered)).unwrap_or(u32::MAX)
            }
            Err(_) => 0,
        };
        let _ = queue.add_used(&mem, index, written);
    }
});
