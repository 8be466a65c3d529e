//! Boots tiny PVH guests built with `hv::testing` on the real KVM.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use hv::testing::{LOAD_ADDRESS, PvhImage, asm};
use hv::{Error, FaultReason, GuestExit, RunOutcome, VmConfig};
use vm_memory::{Bytes, GuestAddress};

/// A hang guard, not a performance threshold.
const HANG_LIMIT: Duration = Duration::from_secs(60);

use hv::testing::kvm_available;

#[derive(Clone, Default)]
struct Console(Arc<Mutex<Vec<u8>>>);

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Console {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn config(vcpus: u32, kernel: Vec<u8>) -> VmConfig {
    VmConfig {
        kernel: kernel.into(),
        ..hv::testing::code_vm(vcpus, 16, &[])
    }
}

/// Creates and runs the VM on another thread; fails the test if it has not returned
/// within HANG_LIMIT.
fn boot(config: VmConfig) -> (RunOutcome, Console) {
    let console = Console::default();
    let out = console.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let vm = hv::builder::build_for_boot(config).expect("create VM");
        let _ = tx.send(vm.run(Box::new(out), Instant::now()));
    });
    let outcome = rx
        .recv_timeout(HANG_LIMIT)
        .unwrap_or_else(|_| panic!("the VM still runs after {HANG_LIMIT:?}: hung"))
        .expect("run VM");
    (outcome, console)
}

fn code(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn hello_then_debug_exit() {
    if !kvm_available() {
        return;
    }
    let guest = code(&[
        asm::com1_print(b"hi\n"),
        asm::out8_imm(0xf4, 0x2a),
        asm::halt_forever(),
    ]);
    let (outcome, console) = boot(config(1, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(0x2a));
    assert_eq!(console.text(), "hi\n");
    assert_eq!(outcome.workload_started, None);
}

#[test]
fn the_boot_timer_and_a_32_bit_exit_value() {
    if !kvm_available() {
        return;
    }
    let guest = code(&[
        asm::out8_imm(0x80, 0x02),
        asm::out8_imm(0x80, 0x01),
        asm::debug_exit(0x1234_5678),
    ]);
    let (outcome, _) = boot(config(1, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(0x1234_5678));
    assert!(outcome.workload_started.is_some());
}

#[test]
fn the_entry_state_follows_the_pvh_abi() {
    if !kvm_available() {
        return;
    }
    // Print EBX's low byte... simpler: compare EBX with 0x6000 and CR0 with 0x11 in the
    // guest, exiting with 1 on success.
    let guest = code(&[
        vec![0x81, 0xfb, 0x00, 0x60, 0x00, 0x00], // cmp ebx, 0x6000
        vec![0x75, 0x0f],                         // jne fail
        vec![0x0f, 0x20, 0xc0],                   // mov eax, cr0
        vec![0x83, 0xf8, 0x11],                   // cmp eax, 0x11
        vec![0x75, 0x06],                         // jne fail
        asm::out8_imm(0xf4, 1),                   // ok
        vec![0xeb, 0xfe],
        asm::out8_imm(0xf4, 2), // fail:
    ]);
    let (outcome, _) = boot(config(1, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(1));
    // An ELF32 image of the same code is entered the same way.
    let (outcome, _) = boot(config(1, PvhImage::new(&guest).elf32().build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(1));
}

#[test]
fn boot_data_is_where_the_abi_says() {
    if !kvm_available() {
        return;
    }
    let mut cfg = config(2, PvhImage::new(&asm::halt_forever()).bss(0x1800).build());
    cfg.cmdline = "npb=ep.S fault=none".into();
    cfg.modules = vec![b"first module".to_vec(), vec![0xab; 5000]];
    let vm = hv::builder::build_for_boot(cfg).unwrap();
    let mem = vm.memory();
    let u32_at = |a: u64| mem.read_obj::<u32>(GuestAddress(a)).unwrap();
    let u64_at = |a: u64| mem.read_obj::<u64>(GuestAddress(a)).unwrap();
    assert_eq!(u32_at(0x6000), 0x336e_c578);
    assert_eq!(u32_at(0x6000 + 12), 2, "nr_modules");
    assert_eq!(u64_at(0x6000 + 16), 0x6040);
    assert_eq!(u64_at(0x6000 + 24), 0x20000);
    assert_eq!(u64_at(0x6000 + 32), 0xe0000);
    assert_eq!(u64_at(0x6000 + 40), 0x7000);
    assert_eq!(
        u32_at(0x6000 + 48),
        4,
        "memory map: low RAM, reserved, RAM, ECAM"
    );
    let mut cmdline = [0u8; 20];
    mem.read_slice(&mut cmdline, GuestAddress(0x20000)).unwrap();
    assert_eq!(&cmdline, b"npb=ep.S fault=none\0");
    // Kernel: 4 bytes of code + 0x1800 bss at 1 MiB; modules page-aligned after.
    let kernel_end = LOAD_ADDRESS + 4 + 0x1800;
    let m0 = u64_at(0x6040);
    assert_eq!(m0, (kernel_end + 0xfff) & !0xfff);
    assert_eq!(u64_at(0x6048), 12);
    let m1 = u64_at(0x6060);
    assert_eq!(m1, m0 + 0x1000);
    assert_eq!(u64_at(0x6068), 5000);
    let mut buf = [0u8; 12];
    mem.read_slice(&mut buf, GuestAddress(m0)).unwrap();
    assert_eq!(&buf, b"first module");
    assert_eq!(mem.read_obj::<u8>(GuestAddress(m1 + 4999)).unwrap(), 0xab);
    let mut rsdp = [0u8; 8];
    mem.read_slice(&mut rsdp, GuestAddress(0xe0000)).unwrap();
    assert_eq!(&rsdp, b"RSD PTR ");
    assert_eq!(
        mem.read_obj::<u8>(GuestAddress(LOAD_ADDRESS)).unwrap(),
        0xfa,
        "kernel loaded"
    );
}

fn expect_fault(outcome: &RunOutcome) -> &hv::FaultReport {
    match &outcome.exit {
        GuestExit::Fault(report) => report,
        other => panic!("expected a fault, got {other:?}"),
    }
}

#[test]
fn a_triple_fault_is_reported() {
    if !kvm_available() {
        return;
    }
    // lidt [zero descriptor]; ud2. (Not int3: kvm_pvm's CPL0 emulator cannot deliver a
    // software interrupt in protected mode and reports an internal error instead.)
    let desc = LOAD_ADDRESS as u32 + 10;
    let mut guest = vec![0x0f, 0x01, 0x1d];
    guest.extend_from_slice(&desc.to_le_bytes());
    guest.extend_from_slice(&[0x0f, 0x0b, 0xf4]);
    guest.extend_from_slice(&[0; 6]);
    let (outcome, _) = boot(config(2, PvhImage::new(&guest).build()));
    let report = expect_fault(&outcome);
    eprintln!("{report}");
    assert_eq!(report.reason, FaultReason::TripleFault);
    assert_eq!(report.vcpu, 0);
    let regs = report.registers.as_ref().unwrap();
    assert!(
        (LOAD_ADDRESS..LOAD_ADDRESS + 16).contains(&regs.rip),
        "rip {:#x}",
        regs.rip
    );
    let text = report.to_string();
    for needle in ["triple fault", "vCPU 0", "rip", "cr0"] {
        assert!(text.contains(needle), "{text}");
    }
    eprintln!("{text}");
}

#[test]
fn an_instruction_kvm_cannot_run_is_reported() {
    if !kvm_available() {
        return;
    }
    // fld1 (x87: the CPL0 emulator of kvm_pvm gives up: internal error); on hardware
    // virtualization it runs, and the ud2 after it triple-faults (no IDT).
    let guest = [0xd9, 0xe8, 0x0f, 0x0b];
    let (outcome, _) = boot(config(1, PvhImage::new(&guest).build()));
    let report = expect_fault(&outcome);
    eprintln!("{report}");
    assert_eq!(report.vcpu, 0);
    assert!(
        matches!(
            report.reason,
            FaultReason::InternalError { .. } | FaultReason::TripleFault
        ),
        "{report}"
    );
    let rip = report.registers.as_ref().unwrap().rip;
    assert!(
        (LOAD_ADDRESS..LOAD_ADDRESS + 4).contains(&rip),
        "rip {rip:#x}"
    );
}

/// INIT then SIPI (vector 0x08: the AP starts at 0x8000 in real mode) to APIC ID 1,
/// after copying `trampoline` to 0x8000.
fn start_ap(trampoline: &[u8]) -> Vec<u8> {
    let mut c = Vec::new();
    let mut t = trampoline.to_vec();
    t.resize(t.len().next_multiple_of(4), 0x90);
    for (i, w) in t.chunks(4).enumerate() {
        c.extend(asm::store32(
            0x8000 + 4 * i as u32,
            u32::from_le_bytes(w.try_into().unwrap()),
        ));
    }
    c.extend(asm::store32(0xfee0_00f0, 0x1ff)); // SVR: APIC on
    c.extend(asm::store32(0xfee0_0310, 1 << 24));
    c.extend(asm::store32(0xfee0_0300, 0x4500)); // INIT
    c.extend(asm::store32(0xfee0_0310, 1 << 24));
    c.extend(asm::store32(0xfee0_0300, 0x4608)); // SIPI, vector 8
    c
}

#[test]
fn exit_stops_an_ap_that_never_started() {
    if !kvm_available() {
        return;
    }
    let guest = code(&[asm::out8_imm(0xf4, 5)]);
    let (outcome, _) = boot(config(2, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(5));
}

#[test]
fn exit_stops_an_ap_halted_in_kvm_run() {
    if !kvm_available() {
        return;
    }
    // AP (real mode): mov byte [0x8100], 1; cli; hlt; jmp hlt
    let ap = [0xc6, 0x06, 0x00, 0x81, 0x01, 0xfa, 0xf4, 0xeb, 0xfd];
    let guest = code(&[
        start_ap(&ap),
        vec![0x80, 0x3d, 0x00, 0x81, 0x00, 0x00, 0x01, 0x75, 0xf7], // wait for the flag
        asm::out8_imm(0xf4, 0x11),
    ]);
    let (outcome, _) = boot(config(2, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(0x11));
}

#[test]
fn an_ap_exit_stops_a_spinning_bsp() {
    if !kvm_available() {
        return;
    }
    // AP: mov al, 7; out 0xf4, al; cli; hlt
    let ap = [0xb0, 0x07, 0xe6, 0xf4, 0xfa, 0xf4, 0xeb, 0xfd];
    let guest = code(&[start_ap(&ap), asm::spin_forever()]);
    let (outcome, _) = boot(config(2, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(7));
}

#[test]
fn a_fault_stops_the_other_vcpus() {
    if !kvm_available() {
        return;
    }
    // AP halts forever; BSP waits for it, then triple-faults on ud2 (no IDT).
    let ap = [0xc6, 0x06, 0x00, 0x81, 0x01, 0xfa, 0xf4, 0xeb, 0xfd];
    let guest = code(&[
        start_ap(&ap),
        vec![0x80, 0x3d, 0x00, 0x81, 0x00, 0x00, 0x01, 0x75, 0xf7],
        vec![0x0f, 0x0b],
    ]);
    let (outcome, _) = boot(config(4, PvhImage::new(&guest).build()));
    let report = expect_fault(&outcome);
    assert_eq!(report.reason, FaultReason::TripleFault);
    assert_eq!(report.vcpu, 0);
}

#[test]
fn more_vcpus_than_host_cores() {
    if !kvm_available() {
        return;
    }
    let guest = code(&[asm::com1_print(b"ok"), asm::out8_imm(0xf4, 0)]);
    let (outcome, console) = boot(config(16, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(0));
    assert_eq!(console.text(), "ok");
}

#[test]
fn mmio_to_nothing_reads_all_ones() {
    if !kvm_available() {
        return;
    }
    // mov eax, [0xd0000000]; out 0xf4, eax  (RAM is 16 MiB: nothing there)
    let guest = [0xa1, 0x00, 0x00, 0x00, 0xd0, 0xe7, 0xf4];
    let (outcome, _) = boot(config(1, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(0xffff_ffff));
}

#[test]
fn unclaimed_ports_read_all_ones() {
    if !kvm_available() {
        return;
    }
    // mov dx, 0x510; in eax, dx; out 0xf4, eax
    let guest = [0x66, 0xba, 0x10, 0x05, 0xed, 0xe7, 0xf4];
    let (outcome, _) = boot(config(1, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(0xffff_ffff));
}

#[test]
fn rep_outsb_prints_every_byte() {
    if !kvm_available() {
        return;
    }
    // mov esi, text; mov ecx, 4; mov dx, 0x3f8; rep outsb; out 0xf4, al(=0 from below)
    let text_at = LOAD_ADDRESS as u32 + 20;
    let mut guest = vec![0xbe];
    guest.extend_from_slice(&text_at.to_le_bytes());
    guest.extend_from_slice(&[0xb9, 4, 0, 0, 0, 0x66, 0xba, 0xf8, 0x03, 0xf3, 0x6e]);
    guest.extend(asm::out8_imm(0xf4, 9));
    guest.resize(20, 0x90);
    guest.extend_from_slice(b"rep!");
    let (outcome, console) = boot(config(1, PvhImage::new(&guest).build()));
    assert_eq!(outcome.exit, GuestExit::DebugExit(9));
    assert_eq!(console.text(), "rep!");
}

fn new_err(cfg: VmConfig) -> Error {
    hv::builder::build_for_boot(cfg).expect_err("build_for_boot must refuse this")
}

#[test]
fn bad_configurations_are_refused_with_the_right_error() {
    if !kvm_available() {
        return;
    }
    let ok = || config(1, PvhImage::new(&[0xf4]).build());

    let e = new_err(VmConfig { vcpus: 0, ..ok() });
    assert!(matches!(e, Error::NoVcpus), "{e}");

    let max = hv::max_vcpus(Path::new("/dev/kvm")).unwrap();
    assert!(max >= 1);
    let e = new_err(VmConfig {
        vcpus: max + 1,
        ..ok()
    });
    assert!(
        matches!(e, Error::TooManyVcpus { requested, max: m } if requested == max + 1 && m == max),
        "{e}"
    );
    assert!(e.to_string().contains(&format!("limit of {max}")), "{e}");

    let e = new_err(VmConfig {
        kernel: PvhImage::new(&[0xf4])
            .load_address(0x200_0000)
            .build()
            .into(),
        ..ok()
    });
    assert!(
        matches!(
            e,
            Error::MemoryTooSmall {
                memory_mib: 16,
                needed_mib: 33
            }
        ),
        "{e}"
    );
    let e = new_err(VmConfig {
        memory_mib: 0,
        ..ok()
    });
    assert!(
        matches!(
            e,
            Error::MemoryTooSmall {
                memory_mib: 0,
                needed_mib: 2
            }
        ),
        "{e}"
    );
    let too_large = hv::memory_map::host_limit().max_mib + 1;
    let e = new_err(VmConfig {
        memory_mib: too_large,
        ..ok()
    });
    assert!(
        matches!(e, Error::MemoryTooLarge { memory_mib, .. } if memory_mib == too_large),
        "{e}"
    );
    assert!(
        e.to_string()
            .contains(&format!("at most {} MiB", too_large - 1)),
        "{e}"
    );
    let e = new_err(VmConfig {
        modules: vec![vec![0; 16 << 20]],
        ..ok()
    });
    assert!(
        matches!(
            e,
            Error::MemoryTooSmall {
                memory_mib: 16,
                needed_mib: 18
            }
        ),
        "{e}"
    );

    let e = new_err(VmConfig {
        kernel: b"#!/bin/sh\necho not a kernel\n".as_slice().into(),
        ..ok()
    });
    assert!(matches!(e, Error::NotElf), "{e}");
    assert!(e.to_string().contains("not an ELF"), "{e}");

    let e = new_err(VmConfig {
        kernel: PvhImage::new(&[0xf4]).without_pvh_note().build().into(),
        ..ok()
    });
    assert!(matches!(e, Error::NoPvhNote), "{e}");
    assert_eq!(
        e.to_string(),
        "no XEN_ELFNOTE_PHYS32_ENTRY note: not a PVH kernel"
    );

    let e = new_err(VmConfig {
        kernel: PvhImage::new(&[0xf4; 100]).truncate(300).build().into(),
        ..ok()
    });
    assert!(matches!(e, Error::MalformedElf(_)), "{e}");

    let e = new_err(VmConfig {
        kvm_device: "/nonexistent/kvm".into(),
        ..ok()
    });
    assert!(matches!(e, Error::KvmMissing { .. }), "{e}");
    assert!(
        e.to_string().contains("KVM is not available on this host"),
        "{e}"
    );
    let e = hv::max_vcpus(Path::new("/nonexistent/kvm")).unwrap_err();
    assert!(matches!(e, Error::KvmMissing { .. }), "{e}");
}

/// The credit driver's two looks at whether a vCPU sleeps agree: KVM's `blocking` (the
/// cheap one, for a vCPU whose wake-up runs at once) and `/proc` (exact for any). The
/// AP halts in the kernel; the BSP spins until the test lets it exit.
#[test]
fn kvm_and_proc_agree_on_a_halted_and_a_spinning_vcpu() {
    if !kvm_available() {
        return;
    }
    const GO: u32 = 0x8200;
    let ap = [0xfa, 0xf4, 0xeb, 0xfd]; // cli; hlt; jmp hlt
    let guest = code(&[
        start_ap(&ap),
        vec![0x80, 0x3d, 0x00, 0x82, 0x00, 0x00, 0x01, 0x75, 0xf7], // until [GO] = 1
        asm::out8_imm(0xf4, 0x33),
    ]);
    let vm = hv::builder::build_for_boot(config(2, PvhImage::new(&guest).build())).unwrap();
    let control = vm.control();
    let memory = vm.memory().clone();
    let runner = std::thread::spawn(move || vm.run(Box::new(std::io::sink()), Instant::now()));
    assert!(control.wait_started(HANG_LIMIT));
    let deadline = Instant::now() + HANG_LIMIT;
    let looks = |v| (control.runnable(v, true), control.runnable(v, false));
    while looks(1) != (Some(false), Some(false)) {
        assert!(
            Instant::now() < deadline,
            "the AP never looked halted: {:?}",
            looks(1)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(looks(0), (Some(true), Some(true)), "the BSP spins");
    memory.write_obj(1u8, GuestAddress(u64::from(GO))).unwrap();
    let outcome = runner.join().unwrap().unwrap();
    assert_eq!(outcome.exit, GuestExit::DebugExit(0x33));
    assert_eq!(control.runnable(0, true), None, "ended");
}
