//! The BSP's PVH entry state (docs/guest-abi.md, Xen's PVH ABI). Pure.

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use crate::layout::START_INFO;

pub const CODE_SELECTOR: u16 = 0x10;
pub const DATA_SELECTOR: u16 = 0x18;
pub const CR0_PE: u64 = 1 << 0;
pub const CR0_ET: u64 = 1 << 4;

fn flat(selector: u16, type_: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_,
        present: 1,
        dpl: 0,
        db: 1,
        s: 1,
        l: 0,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// General registers at the PVH entry: EIP = entry, EBX = hvm_start_info, EFLAGS = 0x2.
pub fn entry_regs(entry: u32) -> kvm_regs {
    kvm_regs {
        rip: u64::from(entry),
        rbx: START_INFO,
        rflags: 0x2,
        ..Default::default()
    }
}

/// Special registers at the PVH entry, starting from the vCPU's reset state: 32-bit
/// flat protected mode, paging off, CR0 = PE|ET, a busy 32-bit TSS in TR.
pub fn entry_sregs(reset: &kvm_sregs) -> kvm_sregs {
    let mut s = *reset;
    s.cs = flat(CODE_SELECTOR, 0xb); // execute/read, accessed
    let data = flat(DATA_SELECTOR, 0x3); // read/write, accessed
    s.ds = data;
    s.es = data;
    s.fs = data;
    s.gs = data;
    s.ss = data;
    s.tr = kvm_segment {
        base: 0,
        limit: 0x67,
        selector: 0,
        type_: 0xb, // 32-bit busy TSS
        present: 1,
        ..Default::default()
    };
    s.gdt.base = 0;
    s.gdt.limit = 0;
    s.idt.base = 0;
    s.idt.limit = 0;
    s.cr0 = CR0_PE | CR0_ET;
    s.cr2 = 0;
    s.cr3 = 0;
    s.cr4 = 0;
    s.efer = 0;
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvh_entry_state() {
        let r = entry_regs(0x10_0040);
        assert_eq!(r.rip, 0x10_0040);
        assert_eq!(r.rbx, 0x6000);
        assert_eq!(r.rflags, 2, "interrupts off");
        assert_eq!((r.rax, r.rsp), (0, 0));

        let reset = kvm_sregs {
            cr0: 0x6000_0010,
            efer: 0x500,
            apic_base: 0xfee0_0900,
            ..Default::default()
        };
        let s = entry_sregs(&reset);
        assert_eq!(s.cr0, 0x11);
        assert_eq!((s.cr3, s.cr4, s.efer), (0, 0, 0));
        assert_eq!(s.apic_base, 0xfee0_0900, "APIC base kept");
        for (seg, sel, ty) in [
            (s.cs, 0x10, 0xb),
            (s.ds, 0x18, 3),
            (s.ss, 0x18, 3),
            (s.es, 0x18, 3),
        ] {
            assert_eq!((seg.selector, seg.type_), (sel, ty));
            assert_eq!((seg.base, seg.limit), (0, 0xffff_ffff), "flat 4 GiB");
            assert_eq!((seg.present, seg.s, seg.db, seg.g, seg.l), (1, 1, 1, 1, 0));
        }
        assert_eq!((s.tr.type_, s.tr.present), (0xb, 1));
    }
}
