//! virtio-net's request parsing (devices/src/virtio/net.rs): TX chains (header and
//! frame), RX buffers receiving frames, and control-queue commands, all on rings and
//! buffers a guest wrote. The queues' count, sizes, places and the features come from
//! the input, as a driver would choose them.
#![no_main]

use devices::virtio::net::{NetConfig, VirtioNet};
use kumo_fuzz::{Input, activate, guest_memory};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let queue_pairs = 1 + u16::from(input.u8() % 4);
    let mut setup = Input::new(input.bytes(64));
    let ops = input.bytes(16);
    let frame_len = input_len(&mut input);
    let frame = input.bytes(usize::from(frame_len));
    let mem = guest_memory(input.rest());
    let Ok(net) = VirtioNet::new(
        NetConfig {
            mac: [2, 0, 0, 0, 0, 1],
            queue_pairs,
            queue_size: 256,
        },
        mem,
    ) else {
        return;
    };
    if !activate(&net, &mut setup) {
        return;
    }
    for op in ops {
        let pair = u16::from(op >> 2) % queue_pairs;
        match op % 4 {
            0 => {
                let _ = net.transmit(pair, |frame| frame.len() % 2 == 0);
            }
            1 => {
                let _ = net.receive(frame);
            }
            2 => {
                let _ = net.process_ctrl();
            }
            _ => {
                let _ = net.transmit_bounded(pair, 3, |frame| {
                    let _ = frame.header();
                    !frame.bytes().is_empty()
                });
            }
        }
    }
});

/// The length of the frame the device receives (up to 2 KiB).
fn input_len(input: &mut Input<'_>) -> u16 {
    input.u16() % 2048
}
