//! CPUID policy: a pure function from KVM's supported CPUID to one vCPU's CPUID.

use kvm_bindings::{KVM_CPUID_FLAG_SIGNIFCANT_INDEX, kvm_cpuid_entry2};

/// Leaf 1 ECX: CMPXCHG16B (cannot be emulated at CPL0 under kvm_pvm).
const LEAF1_ECX_CX16: u32 = 1 << 13;
/// Leaf 1 ECX: running under a hypervisor.
const LEAF1_ECX_HYPERVISOR: u32 = 1 << 31;
/// Leaf 1 EDX: HTT (EBX[23:16] is valid).
const LEAF1_EDX_HTT: u32 = 1 << 28;
/// Leaf 0x80000007 EDX: invariant TSC.
const EXT7_EDX_INVARIANT_TSC: u32 = 1 << 8;
pub const HYPERVISOR_BASE: u32 = 0x4000_0000;
/// The VMware/KVM "timing information" leaf.
pub const HYPERVISOR_TIMING: u32 = 0x4000_0010;
/// KVM's in-kernel LAPIC timer runs at 1 GHz.
pub const LAPIC_TIMER_KHZ: u32 = 1_000_000;

fn entry(function: u32, index: u32, flags: u32, regs: [u32; 4]) -> kvm_cpuid_entry2 {
    kvm_cpuid_entry2 {
        function,
        index,
        flags,
        eax: regs[0],
        ebx: regs[1],
        ecx: regs[2],
        edx: regs[3],
        ..Default::default()
    }
}

/// Bits needed to hold `n` distinct IDs (`ceil(log2(n))`).
fn id_bits(n: u32) -> u32 {
    if n <= 1 {
        0
    } else {
        32 - (n - 1).leading_zeros()
    }
}

/// Extended topology (leaf 0xB / 0x1F): one thread per core, `count` cores in one
/// package; the x2APIC ID is the vCPU index.
fn topology(function: u32, apic_id: u32, count: u32) -> [kvm_cpuid_entry2; 3] {
    let f = KVM_CPUID_FLAG_SIGNIFCANT_INDEX;
    [
        // SMT level: 1 logical processor per core.
        entry(function, 0, f, [0, 1, 1 << 8, apic_id]),
        // Core level: `count` logical processors in the package.
        entry(
            function,
            1,
            f,
            [id_bits(count), count.min(0xffff), (2 << 8) | 1, apic_id],
        ),
        // Terminator (level type 0).
        entry(function, 2, f, [0, 0, 2, apic_id]),
    ]
}

/// The CPUID of vCPU `index` (APIC ID = `index`) in a VM of `count` vCPUs, derived
/// from KVM's supported CPUID. `tsc_khz` goes in leaf 0x40000010 (0 = unknown).
pub fn vcpu_cpuid(
    supported: &[kvm_cpuid_entry2],
    index: u32,
    count: u32,
    tsc_khz: u32,
) -> Vec<kvm_cpuid_entry2> {
    let mut out: Vec<kvm_cpuid_entry2> = Vec::with_capacity(supported.len() + 8);
    let mut has_0x1f = false;
    for e in supported {
        let mut e = *e;
        match e.function {
            0x1 => {
                e.ebx = (e.ebx & 0x0000_ffff) | (index.min(255) << 24) | (count.min(255) << 16);
                if count > 1 {
                    e.edx |= LEAF1_EDX_HTT;
                }
                e.ecx &= !LEAF1_ECX_CX16;
                e.ecx |= LEAF1_ECX_HYPERVISOR;
            }
            0xb => continue,
            0x1f => {
                has_0x1f = true;
                continue;
            }
            0x8000_0007 => e.edx |= EXT7_EDX_INVARIANT_TSC,
            0x8000_0008 => {
                // AMD: ECX[7:0] = cores - 1, ECX[15:12] = APIC ID bits for the core.
                e.ecx = (e.ecx & !0xf0ff) | ((count - 1).min(255)) | (id_bits(count).min(15) << 12);
            }
            HYPERVISOR_BASE => e.eax = e.eax.max(HYPERVISOR_TIMING),
            HYPERVISOR_TIMING => continue,
            _ => {}
        }
        out.push(e);
    }
    out.extend(topology(0xb, index, count));
    if has_0x1f {
        out.extend(topology(0x1f, index, count));
    }
    if !out.iter().any(|e| e.function == HYPERVISOR_BASE) {
        // "KVMKVMKVM\0\0\0"
        out.push(entry(
            HYPERVISOR_BASE,
            0,
            0,
            [HYPERVISOR_TIMING, 0x4b4d_564b, 0x564b_4d56, 0x4d],
        ));
    }
    out.push(entry(
        HYPERVISOR_TIMING,
        0,
        0,
        [tsc_khz, LAPIC_TIMER_KHZ, 0, 0],
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slice of this host's KVM_GET_SUPPORTED_CPUID (AMD, kvm_pvm).
    fn supported() -> Vec<kvm_cpuid_entry2> {
        vec![
            entry(0, 0, 0, [0x1c, 0x6874_7541, 0x444d_4163, 0x6974_6e65]),
            entry(
                1,
                0,
                0,
                [
                    0x00b0_0f21,
                    0x0002_0800,
                    0x8120_2000 | LEAF1_ECX_CX16,
                    0x078b_fbff,
                ],
            ),
            entry(0xb, 0, 1, [0, 0, 0, 0]),
            entry(0xd, 0, 1, [0xe7, 0x980, 0x980, 0]),
            entry(0x8000_0000, 0, 0, [0x8000_0021, 0, 0, 0]),
            entry(0x8000_0007, 0, 0, [0, 0, 0, 0]),
            entry(0x8000_0008, 0, 0, [0x3030, 0x5002_0005, 0x7001, 0]),
            entry(
                HYPERVISOR_BASE,
                0,
                0,
                [0x4000_0001, 0x4b4d_564b, 0x564b_4d56, 0x4d],
            ),
            entry(0x4000_0001, 0, 0, [0x0100_7efb, 0, 0, 0]),
        ]
    }

    fn find(c: &[kvm_cpuid_entry2], function: u32, index: u32) -> kvm_cpuid_entry2 {
        let all: Vec<_> = c
            .iter()
            .filter(|e| e.function == function && e.index == index)
            .collect();
        assert_eq!(
            all.len(),
            1,
            "leaf {function:#x}.{index}: {} entries",
            all.len()
        );
        *all[0]
    }

    #[test]
    fn leaf1_carries_the_apic_id_hypervisor_bit_and_no_cx16() {
        let c = vcpu_cpuid(&supported(), 3, 4, 2_995_200);
        let l1 = find(&c, 1, 0);
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_eq!(l1.ebx & 0xffff, 0x0800, "CLFLUSH size kept");
        assert_eq!(l1.ecx & LEAF1_ECX_CX16, 0);
        assert_ne!(l1.ecx & LEAF1_ECX_HYPERVISOR, 0);
        assert_eq!(l1.eax, 0x00b0_0f21);
    }

    #[test]
    fn leaf_b_gives_x2apic_id_and_topology() {
        for (index, count) in [(0, 1), (1, 2), (5, 6), (299, 300)] {
            let c = vcpu_cpuid(&supported(), index, count, 1);
            let smt = find(&c, 0xb, 0);
            let core = find(&c, 0xb, 1);
            let end = find(&c, 0xb, 2);
            for l in [smt, core, end] {
                assert_eq!(l.edx, index, "x2APIC ID");
                assert_eq!(
                    l.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
                    KVM_CPUID_FLAG_SIGNIFCANT_INDEX
                );
            }
            assert_eq!((smt.ecx >> 8) & 0xff, 1, "SMT level");
            assert_eq!(smt.ebx, 1);
            assert_eq!((core.ecx >> 8) & 0xff, 2, "core level");
            assert_eq!(core.ebx, count);
            assert!(1u64 << core.eax >= u64::from(count), "shift covers all IDs");
            assert_eq!(index >> core.eax, 0, "one package");
            assert_eq!((end.ecx >> 8) & 0xff, 0, "terminator");
        }
    }

    #[test]
    fn hypervisor_timing_leaf() {
        let c = vcpu_cpuid(&supported(), 0, 1, 2_995_200);
        assert_eq!(find(&c, HYPERVISOR_BASE, 0).eax, 0x4000_0010);
        assert_eq!(
            find(&c, HYPERVISOR_BASE, 0).ebx,
            0x4b4d_564b,
            "signature kept"
        );
        let t = find(&c, HYPERVISOR_TIMING, 0);
        assert_eq!(t.eax, 2_995_200);
        assert_eq!(t.ebx, 1_000_000);
        assert_eq!(
            find(&c, 0x4000_0001, 0).eax,
            0x0100_7efb,
            "KVM features kept"
        );
        // Without KVM's leaf, kumo adds its own.
        let bare: Vec<_> = supported()
            .into_iter()
            .filter(|e| e.function < HYPERVISOR_BASE)
            .collect();
        let c = vcpu_cpuid(&bare, 0, 1, 7);
        assert_eq!(find(&c, HYPERVISOR_BASE, 0).eax, 0x4000_0010);
        assert_eq!(find(&c, HYPERVISOR_TIMING, 0).eax, 7);
    }

    #[test]
    fn invariant_tsc_and_amd_core_count() {
        let c = vcpu_cpuid(&supported(), 0, 4, 1);
        assert_ne!(find(&c, 0x8000_0007, 0).edx & EXT7_EDX_INVARIANT_TSC, 0);
        let l = find(&c, 0x8000_0008, 0);
        assert_eq!(l.ecx & 0xff, 3);
        assert_eq!((l.ecx >> 12) & 0xf, 2);
    }

    #[test]
    fn existing_timing_leaf_is_replaced_and_0x1f_mirrors_0xb() {
        let mut s = supported();
        s.push(entry(HYPERVISOR_TIMING, 0, 0, [1, 2, 3, 4]));
        s.push(entry(0x1f, 0, 1, [9, 9, 9, 9]));
        let c = vcpu_cpuid(&s, 2, 3, 5);
        assert_eq!(find(&c, HYPERVISOR_TIMING, 0).eax, 5);
        assert_eq!(find(&c, 0x1f, 1).ebx, 3);
        assert_eq!(find(&c, 0x1f, 0).edx, 2);
    }
}
