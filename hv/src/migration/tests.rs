//! The stream format without KVM: round trips, and arbitrary or damaged bytes.

use proptest::prelude::*;

use super::state::{DeviceStates, VcpuState, VmState};
use super::stream::{self, Meta, RamWriter, Reply, StreamError};

fn meta() -> Meta {
    Meta {
        vcpus: 1,
        memory_bytes: 1 << 20,
        cpuid: vec![vec![kvm_bindings::kvm_cpuid_entry2 {
            function: 1,
            eax: 0x306a9,
            ..Default::default()
        }]],
        app: r#"{"npb":"ep.S"}"#.into(),
        huge_pages: true,
    }
}

#[test]
fn a_meta_from_before_huge_pages_means_4k_pages() {
    let mut old = serde_json::to_value(meta()).unwrap();
    old.as_object_mut().unwrap().remove("huge_pages");
    let read: Meta = serde_json::from_value(old).unwrap();
    assert!(!read.huge_pages);
    assert_eq!(read.app, meta().app);
}

fn vcpu() -> VcpuState {
    VcpuState {
        regs: kvm_bindings::kvm_regs {
            rip: 0x10_0000,
            rax: 7,
            ..Default::default()
        },
        sregs: Default::default(),
        xsave: Default::default(),
        xcrs: Default::default(),
        lapic: Default::default(),
        msrs: vec![kvm_bindings::kvm_msr_entry {
            index: 0x10,
            data: 12345,
            ..Default::default()
        }],
        events: Default::default(),
        mp_state: Default::default(),
        debugregs: Default::default(),
        tsc_khz: 2_000_000,
    }
}

fn devices() -> DeviceStates {
    DeviceStates {
        com1: devices::Com1::new(Box::new(std::io::sink())).state(),
        boot_timer: devices::BootTimer::new().state(),
        pci_address: 0x8000_0000,
        pci: devices::pci::PciBus::new(0xe000_0000).save_state().unwrap(),
    }
}

/// A small valid stream: two data pages and a zero page, in two rounds.
fn sample() -> Vec<u8> {
    let mut w = Vec::new();
    stream::write_header(&mut w).unwrap();
    stream::write_json(&mut w, stream::TAG_META, &meta()).unwrap();
    let mut ram = RamWriter::new();
    ram.page(&mut w, 0, &[1u8; 4096]).unwrap();
    ram.page(&mut w, 0x1000, &[0u8; 4096]).unwrap();
    ram.flush(&mut w).unwrap();
    stream::write_sync(&mut w, 0).unwrap();
    ram.page(&mut w, 0xf_f000, &[0xab; 4096]).unwrap();
    ram.flush(&mut w).unwrap();
    stream::write_sync(&mut w, 1).unwrap();
    stream::write_json(&mut w, stream::TAG_VCPU, &vec![vcpu()]).unwrap();
    stream::write_json(
        &mut w,
        stream::TAG_VM,
        &VmState {
            clock: Default::default(),
            pic_master: Default::default(),
            pic_slave: Default::default(),
            ioapic: Default::default(),
        },
    )
    .unwrap();
    stream::write_json(&mut w, stream::TAG_DEVICES, &devices()).unwrap();
    stream::write_section(&mut w, stream::TAG_END, &[]).unwrap();
    w
}

#[test]
fn a_stream_round_trips() {
    let bytes = sample();
    let parsed = stream::parse(&mut &bytes[..]).unwrap();
    assert_eq!(parsed.meta, meta());
    assert_eq!(parsed.pages.len(), 3);
    assert_eq!(parsed.pages[0], (0, Some(vec![1u8; 4096])));
    assert_eq!(
        parsed.pages[1],
        (0x1000, None),
        "zero pages are sent as records"
    );
    assert_eq!(parsed.vcpus[0].regs.rip, 0x10_0000);
    assert_eq!(parsed.vcpus[0].msrs[0].data, 12345);
    assert_eq!(parsed.devices, devices());
    assert_eq!(parsed.syncs, [0, 1], "each round's end is marked");
}

/// A stream whose META is followed by SYNC sections with these payloads.
fn with_syncs(rounds: &[&[u8]]) -> Vec<u8> {
    let mut w = Vec::new();
    stream::write_header(&mut w).unwrap();
    stream::write_json(&mut w, stream::TAG_META, &meta()).unwrap();
    for payload in rounds {
        stream::write_section(&mut w, stream::TAG_SYNC, payload).unwrap();
    }
    w
}

#[test]
fn sync_sections_must_count_up_from_zero_and_hold_four_bytes() {
    let err = |rounds: &[&[u8]]| stream::parse(&mut &with_syncs(rounds)[..]).unwrap_err();
    let msg = err(&[&1u32.to_le_bytes()]).to_string();
    assert!(msg.contains("round 1 where round 0 belongs"), "{msg}");
    let msg = err(&[&0u32.to_le_bytes(), &0u32.to_le_bytes()]).to_string();
    assert!(msg.contains("round 0 where round 1 belongs"), "{msg}");
    let msg = err(&[&[0, 0, 0]]).to_string();
    assert!(msg.contains("3 bytes where a round number"), "{msg}");
    // Well-formed syncs and then the stream just ends: truncated, not accepted.
    assert!(matches!(
        err(&[&0u32.to_le_bytes(), &1u32.to_le_bytes()]),
        StreamError::Truncated
    ));
}

#[test]
fn replies_round_trip_and_damage_is_refused() {
    let mut w = Vec::new();
    stream::write_reply(&mut w, Reply::Applied(7)).unwrap();
    stream::write_reply(&mut w, Reply::Running).unwrap();
    let mut r = &w[..];
    assert_eq!(stream::read_reply(&mut r).unwrap(), Reply::Applied(7));
    assert_eq!(stream::read_reply(&mut r).unwrap(), Reply::Running);
    assert!(matches!(
        stream::read_reply(&mut r),
        Err(StreamError::Truncated)
    ));
    let mut bad = w.clone();
    bad[12] ^= 1; // the round number, under the checksum
    assert!(matches!(
        stream::read_reply(&mut &bad[..]),
        Err(StreamError::Checksum { .. })
    ));
    // A stream section is not a reply, and a reply may not be long.
    let mut section = Vec::new();
    stream::write_sync(&mut section, 0).unwrap();
    assert!(matches!(
        stream::read_reply(&mut &section[..]),
        Err(StreamError::UnknownSection(_))
    ));
    let mut long = Vec::new();
    stream::write_section(&mut long, stream::TAG_ACK, &[0; 5]).unwrap();
    assert!(matches!(
        stream::read_reply(&mut &long[..]),
        Err(StreamError::TooLong { .. })
    ));
    let mut running = Vec::new();
    stream::write_section(&mut running, stream::TAG_RUNNING, &[1]).unwrap();
    assert!(stream::read_reply(&mut &running[..]).is_err());
}

#[test]
fn damage_is_named() {
    let good = sample();
    let check = |bytes: &[u8], want: &str| {
        let err = stream::parse(&mut &bytes[..]).unwrap_err().to_string();
        assert!(err.contains(want), "{err} (wanted {want})");
    };
    let mut bad = good.clone();
    bad[0] = b'X';
    check(&bad, "bad magic");
    let mut bad = good.clone();
    bad[8] = 9;
    check(&bad, "version 9");
    check(&good[..good.len() - 1], "truncated");
    let mut bad = good.clone();
    let at = good.len() / 2;
    bad[at] ^= 1;
    check(&bad, "checksum");
    // A RAM record outside the 1 MiB of RAM META declared.
    let mut w = Vec::new();
    stream::write_header(&mut w).unwrap();
    stream::write_json(&mut w, stream::TAG_META, &meta()).unwrap();
    let mut ram = RamWriter::new();
    ram.page(&mut w, 1 << 20, &[1; 4096]).unwrap();
    ram.flush(&mut w).unwrap();
    check(&w, "not a page of the VM's RAM");
    // State before META.
    let mut w = Vec::new();
    stream::write_header(&mut w).unwrap();
    stream::write_section(&mut w, stream::TAG_END, &[]).unwrap();
    check(&w, "out of order");
}

#[test]
fn an_oversized_section_is_refused_before_it_is_read() {
    let mut w = Vec::new();
    stream::write_header(&mut w).unwrap();
    w.extend_from_slice(b"RAM ");
    w.extend_from_slice(&u32::MAX.to_le_bytes());
    w.extend_from_slice(&0u32.to_le_bytes());
    assert!(matches!(
        stream::parse(&mut &w[..]),
        Err(StreamError::TooLong { .. })
    ));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _ = stream::parse(&mut &bytes[..]);
        // Behind a valid header too, so the section reader sees them.
        let mut framed = Vec::new();
        stream::write_header(&mut framed).unwrap();
        framed.extend_from_slice(&bytes);
        prop_assert!(stream::parse(&mut &framed[..]).is_err());
    }

    #[test]
    fn arbitrary_reply_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut r = &bytes[..];
        while stream::read_reply(&mut r).is_ok() {}
    }

    #[test]
    fn any_flipped_byte_is_refused(at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = sample();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert!(stream::parse(&mut &bytes[..]).is_err());
    }

    #[test]
    fn any_section_payload_never_panics(
        tag in prop::sample::select(vec![
            stream::TAG_META, stream::TAG_RAM, stream::TAG_VCPU,
            stream::TAG_VM, stream::TAG_DEVICES, stream::TAG_END, stream::TAG_SYNC,
        ]),
        payload in proptest::collection::vec(any::<u8>(), 0..9000),
    ) {
        // Checksummed correctly, so the payload's own decoding is what is tested.
        let good = sample();
        let mut w = good[..16].to_vec();
        let meta_len = u32::from_le_bytes(good[20..24].try_into().unwrap()) as usize;
        w.extend_from_slice(&good[16..28 + meta_len]);
        stream::write_section(&mut w, tag, &payload).unwrap();
        let _ = stream::parse(&mut &w[..]);
    }
}

#[test]
fn every_bit_flip_in_the_header_and_first_section_header_is_refused() {
    // Exhaustive where no checksum covers the bytes (the proptest samples the rest):
    // the stream header, then the META section's tag and length.
    let base = sample();
    for i in 0..64 {
        for bit in 0..8 {
            let mut bytes = base.clone();
            bytes[i] ^= 1 << bit;
            assert!(
                stream::parse(&mut &bytes[..]).is_err(),
                "byte {i} bit {bit} flipped went unnoticed"
            );
        }
    }
}
