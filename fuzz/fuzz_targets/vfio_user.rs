//! The vfio-user message parser (devices/src/vfio_user/proto.rs), both ways: requests
//! a server (`kumo nic-server`) reads from a client, and the replies a client (kumo's
//! passthrough) reads from a server. The first byte picks what the body is parsed as.
#![no_main]

use devices::vfio_user::proto::{
    self, DeviceInfo, HEADER_SIZE, Header, IrqInfo, RegionInfo, Request,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, message)) = data.split_first() else {
        return;
    };
    let Ok(header) = Header::parse(message) else {
        return;
    };
    let body = &message[HEADER_SIZE.min(message.len())..];
    let body = &body[..header.body_len().min(body.len())];
    let _ = proto::check_reply(&header, header.id, header.command);
    match which % 6 {
        0 => {
            if let Ok(request) = Request::parse(header.command, body) {
                // What a server parsed, a client encodes back the same way.
                let encoded = request.encode(header.id);
                let again = Header::parse(&encoded).expect("our own header");
                assert_eq!(again.command, request.command());
                let reparsed = Request::parse(again.command, &encoded[HEADER_SIZE..])
                    .expect("our own encoding parses");
                assert_eq!(reparsed, request);
            }
        }
        1 => {
            if let Ok(info) = DeviceInfo::parse(body) {
                assert_eq!(DeviceInfo::parse(&info.encode()), Ok(info));
            }
        }
        2 => {
            if let Ok(info) = RegionInfo::parse(body) {
                assert_eq!(RegionInfo::parse(&info.encode()), Ok(info));
            }
        }
        3 => {
            if let Ok(info) = IrqInfo::parse(body) {
                assert_eq!(IrqInfo::parse(&info.encode()), Ok(info));
            }
        }
        4 => {
            let _ = proto::parse_io_fds(body, u32::from(which >> 3), usize::from(which >> 5));
        }
        _ => {
            let count = usize::from(header.id);
            if let Ok(read) = proto::parse_region_read(body, 7, 0x100, count) {
                assert_eq!(read.len(), count);
            }
        }
    }
});
