//! ACPI tables: RSDP (revision 2) -> XSDT -> FADT (hardware-reduced, -> DSDT), MADT
//! and MCFG (PCI ECAM for bus 0).
//! Pure: builds one blob to be placed at a given guest address, RSDP first.

use crate::layout::{IOAPIC_BASE, LAPIC_BASE, PCI_ECAM_BASE};

const OEM_ID: &[u8; 6] = b"KUMO  ";
const OEM_TABLE_ID: &[u8; 8] = b"KUMOVM  ";
const CREATOR_ID: &[u8; 4] = b"KUMO";
const HEADER_LEN: usize = 36;
const FADT_LEN: usize = 276;
const FADT_FLAG_HW_REDUCED_ACPI: u32 = 1 << 20;
const IAPC_BOOT_ARCH_VGA_NOT_PRESENT: u16 = 1 << 2;
const IAPC_BOOT_ARCH_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;
const MADT_PCAT_COMPAT: u32 = 1;
const MADT_LAPIC: u8 = 0;
const MADT_IOAPIC: u8 = 1;
const MADT_X2APIC: u8 = 9;
const LAPIC_ENABLED: u32 = 1;
/// Highest APIC ID a (8-bit) Processor Local APIC entry carries; 0xFF means broadcast.
const MAX_XAPIC_ID: u32 = 254;

/// The tables for `vcpus` vCPUs, to be placed at guest address `base` (the RSDP is at
/// `base`).
pub fn build(vcpus: u32, base: u64) -> Vec<u8> {
    let mut blob = vec![0u8; 36];
    let place = |blob: &mut Vec<u8>, table: Vec<u8>| -> u64 {
        blob.resize(blob.len().next_multiple_of(16), 0);
        let at = base + blob.len() as u64;
        blob.extend_from_slice(&table);
        at
    };
    let dsdt = place(&mut blob, table(b"DSDT", 2, &[]));
    let fadt = place(&mut blob, fadt(dsdt));
    let madt = place(&mut blob, madt(vcpus));
    let mcfg = place(&mut blob, mcfg());
    let mut xsdt_body = Vec::new();
    for table in [fadt, madt, mcfg] {
        xsdt_body.extend_from_slice(&table.to_le_bytes());
    }
    let xsdt = place(&mut blob, table(b"XSDT", 1, &xsdt_body));
    blob[..36].copy_from_slice(&rsdp(xsdt));
    blob
}

fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |s, b| s.wrapping_add(*b))
        .wrapping_neg()
}

/// A table: standard header + `body`, checksummed.
fn table(signature: &[u8; 4], revision: u8, body: &[u8]) -> Vec<u8> {
    let len = HEADER_LEN + body.len();
    let mut t = Vec::with_capacity(len);
    t.extend_from_slice(signature);
    t.extend_from_slice(&(len as u32).to_le_bytes());
    t.push(revision);
    t.push(0); // checksum
    t.extend_from_slice(OEM_ID);
    t.extend_from_slice(OEM_TABLE_ID);
    t.extend_from_slice(&1u32.to_le_bytes()); // OEM revision
    t.extend_from_slice(CREATOR_ID);
    t.extend_from_slice(&1u32.to_le_bytes()); // creator revision
    t.extend_from_slice(body);
    t[9] = checksum(&t);
    t
}

fn rsdp(xsdt: u64) -> [u8; 36] {
    let mut r = [0u8; 36];
    r[..8].copy_from_slice(b"RSD PTR ");
    r[9..15].copy_from_slice(OEM_ID);
    r[15] = 2; // revision
    // RsdtAddress (16..20) stays 0: XSDT only.
    r[20..24].copy_from_slice(&36u32.to_le_bytes());
    r[24..32].copy_from_slice(&xsdt.to_le_bytes());
    r[8] = checksum(&r[..20]);
    r[32] = checksum(&r);
    r
}

fn fadt(dsdt: u64) -> Vec<u8> {
    // Offsets below are those of the full table (ACPI 6.5, table 5.9).
    let mut body = vec![0u8; FADT_LEN - HEADER_LEN];
    let mut put =
        |off: usize, bytes: &[u8]| body[off - HEADER_LEN..][..bytes.len()].copy_from_slice(bytes);
    let iapc = IAPC_BOOT_ARCH_VGA_NOT_PRESENT | IAPC_BOOT_ARCH_CMOS_RTC_NOT_PRESENT;
    put(109, &iapc.to_le_bytes());
    put(112, &FADT_FLAG_HW_REDUCED_ACPI.to_le_bytes());
    put(131, &[5]); // FADT minor version
    put(140, &dsdt.to_le_bytes()); // X_DSDT
    put(268, b"KUMO\0\0\0\0"); // hypervisor vendor identity
    table(b"FACP", 6, &body)
}

fn madt(vcpus: u32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&LAPIC_BASE.to_le_bytes());
    body.extend_from_slice(&MADT_PCAT_COMPAT.to_le_bytes());
    for id in 0..vcpus {
        if id <= MAX_XAPIC_ID {
            body.extend_from_slice(&[MADT_LAPIC, 8, id as u8, id as u8]);
            body.extend_from_slice(&LAPIC_ENABLED.to_le_bytes());
        } else {
            body.extend_from_slice(&[MADT_X2APIC, 16, 0, 0]);
            body.extend_from_slice(&id.to_le_bytes());
            body.extend_from_slice(&LAPIC_ENABLED.to_le_bytes());
            body.extend_from_slice(&id.to_le_bytes()); // ACPI processor UID
        }
    }
    // I/O APIC: ID = vCPU count (8-bit field), GSI base 0.
    body.extend_from_slice(&[MADT_IOAPIC, 12, vcpus.min(255) as u8, 0]);
    body.extend_from_slice(&IOAPIC_BASE.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    table(b"APIC", 5, &body)
}

/// One allocation: segment 0, buses 0..=0 at PCI_ECAM_BASE.
fn mcfg() -> Vec<u8> {
    let mut body = vec![0u8; 8]; // reserved
    body.extend_from_slice(&PCI_ECAM_BASE.to_le_bytes());
    body.extend_from_slice(&0u16.to_le_bytes()); // PCI segment group
    body.extend_from_slice(&[0, 0]); // start and end bus
    body.extend_from_slice(&[0; 4]); // reserved
    table(b"MCFG", 1, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0xe0000;

    fn u32_at(b: &[u8], o: usize) -> u32 {
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
    }
    fn u64_at(b: &[u8], o: usize) -> u64 {
        u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
    }
    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |s, x| s.wrapping_add(*x))
    }

    /// The table at guest address `addr`, checked: signature, length and checksum.
    fn table_at<'a>(blob: &'a [u8], addr: u64, sig: &[u8; 4]) -> &'a [u8] {
        let off = (addr - BASE) as usize;
        assert_eq!(&blob[off..off + 4], sig);
        let len = u32_at(blob, off + 4) as usize;
        let t = &blob[off..off + len];
        assert_eq!(sum(t), 0, "{} checksum", String::from_utf8_lossy(sig));
        t
    }

    struct Parsed {
        fadt: Vec<u8>,
        dsdt: Vec<u8>,
        madt: Vec<u8>,
    }

    fn parse(blob: &[u8]) -> Parsed {
        let rsdp = &blob[..36];
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert_eq!(rsdp[15], 2);
        assert_eq!(sum(&rsdp[..20]), 0, "RSDP checksum");
        assert_eq!(sum(rsdp), 0, "RSDP extended checksum");
        assert_eq!(u32_at(rsdp, 20), 36);
        let xsdt = table_at(blob, u64_at(rsdp, 24), b"XSDT");
        assert_eq!(xsdt.len(), 36 + 24);
        let fadt = table_at(blob, u64_at(xsdt, 36), b"FACP").to_vec();
        let madt = table_at(blob, u64_at(xsdt, 44), b"APIC").to_vec();
        let mcfg = table_at(blob, u64_at(xsdt, 52), b"MCFG");
        assert_eq!(mcfg.len(), 36 + 8 + 16);
        assert_eq!(u64_at(mcfg, 44), PCI_ECAM_BASE);
        assert_eq!(&mcfg[52..56], &[0, 0, 0, 0], "segment 0, buses 0..=0");
        assert_eq!(fadt.len(), 276);
        let dsdt = table_at(blob, u64_at(&fadt, 140), b"DSDT").to_vec();
        Parsed { fadt, dsdt, madt }
    }

    /// MADT entries as (type, bytes).
    fn entries(madt: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 44;
        while at < madt.len() {
            let len = madt[at + 1] as usize;
            assert!(len >= 2);
            out.push((madt[at], madt[at..at + len].to_vec()));
            at += len;
        }
        assert_eq!(at, madt.len());
        out
    }

    #[test]
    fn tables_chain_and_checksum() {
        for vcpus in [1, 2, 4, 255, 300] {
            let blob = build(vcpus, BASE);
            let p = parse(&blob);
            assert_eq!(p.dsdt.len(), 36, "empty DSDT");
            assert_ne!(u32_at(&p.fadt, 112) & (1 << 20), 0, "hardware-reduced");
            assert_eq!(u32_at(&p.fadt, 40), 0, "32-bit DSDT unused");
            assert_eq!(u32_at(&p.madt, 36), 0xfee0_0000);
            assert!(blob.len() < 0x20000, "fits below 1 MiB");
        }
    }

    #[test]
    fn madt_has_one_enabled_lapic_per_vcpu_and_one_ioapic() {
        let blob = build(4, BASE);
        let e = entries(&parse(&blob).madt);
        let lapics: Vec<_> = e.iter().filter(|(t, _)| *t == 0).collect();
        assert_eq!(lapics.len(), 4);
        for (i, (_, b)) in lapics.iter().enumerate() {
            assert_eq!(b.len(), 8);
            assert_eq!(b[3] as usize, i, "APIC ID");
            assert_eq!(u32_at(b, 4) & 1, 1, "enabled");
        }
        let ioapics: Vec<_> = e.iter().filter(|(t, _)| *t == 1).collect();
        assert_eq!(ioapics.len(), 1);
        let io = &ioapics[0].1;
        assert_eq!(io[2], 4, "I/O APIC ID = vCPU count");
        assert_eq!(u32_at(io, 4), 0xfec0_0000);
        assert_eq!(u32_at(io, 8), 0, "GSI base");
        assert_eq!(e.len(), 5);
    }

    #[test]
    fn ids_above_254_use_x2apic_entries() {
        let blob = build(300, BASE);
        let e = entries(&parse(&blob).madt);
        let mut ids = Vec::new();
        for (t, b) in &e {
            match t {
                0 => {
                    assert_eq!(u32_at(b, 4) & 1, 1);
                    ids.push(u32::from(b[3]));
                }
                9 => {
                    assert_eq!(b.len(), 16);
                    assert!(u32_at(b, 4) > 254);
                    assert_eq!(u32_at(b, 8) & 1, 1);
                    ids.push(u32_at(b, 4));
                }
                1 => {}
                other => panic!("unexpected MADT entry {other}"),
            }
        }
        assert_eq!(ids, (0..300).collect::<Vec<_>>());
        assert_eq!(e.iter().filter(|(t, _)| *t == 0).count(), 255);
    }
}
