//! Both interrupt paths against a real vCPU: a tiny 32-bit guest enables its local
//! APIC, loads an IDT whose handlers print their vector to COM1 and acknowledge it,
//! then halts until it has taken as many interrupts as the test announced.
//!
//! The handlers do not `iretd` (KVM's instruction emulator, which runs all CPL0 code
//! on PVM hosts, cannot emulate a protected-mode `iret`): they reset the stack and jump
//! back to the loop, which re-enables interrupts.

use std::io::Write;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devices::interrupt::MsiMessage;
use hv::testing::{LOAD_ADDRESS, PvhImage, asm, kvm_available};
use hv::{GuestExit, Vm, VmConfig};

const HANG_LIMIT: Duration = Duration::from_secs(60);

/// Vectors with handlers: each prints itself as a byte ('@' + n for 0x40 + n).
const FIRST_VECTOR: u8 = 0x40;
const VECTORS: u8 = 8;

const BASE: u32 = LOAD_ADDRESS as u32;
const COUNTER: u32 = BASE + 0x7e0;
const IDTR: u32 = BASE + 0x7f0;
const GDTR: u32 = BASE + 0x7f8;
const GDT: u32 = BASE + 0x7c0;
const STUBS: u32 = BASE + 0x400;
const COMMON: u32 = BASE + 0x480;
const IDT: u32 = BASE + 0x800;
const CODE_SEGMENT: u16 = 0x10;
const STACK_TOP: u32 = BASE + 0x1_0000;

fn abs(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

/// The guest: takes `count` interrupts, then debug-exit 0.
fn interrupt_guest(count: u8) -> Vec<u8> {
    assert!(count < 0x80);
    let mut image = vec![0u8; 0x800 + 8 * usize::from(FIRST_VECTOR + VECTORS)];
    // A stack for the interrupt frames (the PVH entry state has none).
    let mut code = vec![0xbc];
    code.extend(abs(STACK_TOP));
    // Software-enable the xAPIC (spurious vector 0xff) and load the IDT.
    code.extend([0xc7, 0x05, 0xf0, 0x00, 0xe0, 0xfe, 0xff, 0x01, 0x00, 0x00]);
    code.extend([0x0f, 0x01, 0x1d]);
    code.extend(abs(IDTR));
    // A GDT with the entry state's flat segments: taking an interrupt reloads CS.
    code.extend([0x0f, 0x01, 0x15]);
    code.extend(abs(GDTR));
    code.extend(asm::com1_print(b"R"));
    let top = code.len();
    code.extend([0xfb, 0xf4]); // sti; hlt
    let check = BASE + code.len() as u32;
    code.extend([0x83, 0x3d]); // cmp dword [COUNTER], count
    code.extend(abs(COUNTER));
    code.push(count);
    let back = top as i32 - (code.len() as i32 + 2);
    code.extend([0x72, back as i8 as u8]); // jb top
    code.extend(asm::debug_exit(0));
    image[..code.len()].copy_from_slice(&code);

    // Stubs: mov al, vector; jmp COMMON.
    for n in 0..VECTORS {
        let at = STUBS + 8 * u32::from(n);
        let stub_end = at + 7;
        let mut stub = vec![0xb0, FIRST_VECTOR + n, 0xe9];
        stub.extend((COMMON.wrapping_sub(stub_end)).to_le_bytes());
        let off = (at - BASE) as usize;
        image[off..off + 7].copy_from_slice(&stub);
        // 32-bit interrupt gate to the stub.
        let gate = (IDT - BASE) as usize + 8 * usize::from(FIRST_VECTOR + n);
        image[gate..gate + 2].copy_from_slice(&(at as u16).to_le_bytes());
        image[gate + 2..gate + 4].copy_from_slice(&CODE_SEGMENT.to_le_bytes());
        image[gate + 5] = 0x8e;
        image[gate + 6..gate + 8].copy_from_slice(&((at >> 16) as u16).to_le_bytes());
    }
    // Common handler: print al, count, EOI, drop the frame, back to the check.
    let mut common = vec![0x66, 0xba, 0xf8, 0x03, 0xee]; // mov dx, 0x3f8; out dx, al
    common.extend([0xff, 0x05]); // inc dword [COUNTER]
    common.extend(abs(COUNTER));
    common.extend([0xc7, 0x05, 0xb0, 0x00, 0xe0, 0xfe, 0, 0, 0, 0]); // EOI
    common.push(0xbc); // mov esp, stack top
    common.extend(abs(STACK_TOP));
    common.push(0xb8); // mov eax, check; jmp eax
    common.extend(abs(check));
    common.extend([0xff, 0xe0]);
    let off = (COMMON - BASE) as usize;
    image[off..off + common.len()].copy_from_slice(&common);
    // IDTR: limit, base.
    let off = (IDTR - BASE) as usize;
    let limit = 8 * u16::from(FIRST_VECTOR + VECTORS) - 1;
    image[off..off + 2].copy_from_slice(&limit.to_le_bytes());
    image[off + 2..off + 6].copy_from_slice(&IDT.to_le_bytes());
    // GDT: null, unused, code 0x10, data 0x18 (flat 4 GiB).
    let off = (GDT - BASE) as usize;
    image[off + 0x10..off + 0x18].copy_from_slice(&0x00cf_9a00_0000_ffffu64.to_le_bytes());
    image[off + 0x18..off + 0x20].copy_from_slice(&0x00cf_9200_0000_ffffu64.to_le_bytes());
    let off = (GDTR - BASE) as usize;
    image[off..off + 2].copy_from_slice(&0x1fu16.to_le_bytes());
    image[off + 2..off + 6].copy_from_slice(&GDT.to_le_bytes());
    PvhImage::new(&image).build()
}

/// A console that forwards every byte to the test.
struct Console(Mutex<Sender<u8>>);

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let tx = self.0.lock().unwrap();
        for &b in buf {
            let _ = tx.send(b);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Running {
    bytes: Receiver<u8>,
    done: Receiver<GuestExit>,
}

impl Running {
    fn next_byte(&self) -> u8 {
        match self.bytes.recv_timeout(HANG_LIMIT) {
            Ok(b) => b,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("the guest printed nothing more: hung"),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the VM ended early: {:?}", self.done.recv())
            }
        }
    }

    fn finish(self) -> Vec<u8> {
        let exit = self.done.recv_timeout(HANG_LIMIT).expect("VM did not end");
        assert_eq!(exit, GuestExit::DebugExit(0));
        self.bytes.try_iter().collect()
    }
}

/// Creates the VM, lets `setup` take its interrupt handles, runs it on another thread
/// and waits until the guest is ready for interrupts.
fn start<T>(count: u8, setup: impl FnOnce(&Vm) -> T) -> (Running, T) {
    let vm = hv::builder::build_for_boot(VmConfig {
        vcpus: 1,
        memory_mib: 16,
        kernel: interrupt_guest(count).into(),
        cmdline: String::new(),
        modules: Vec::new(),
        kvm_device: "/dev/kvm".into(),
        huge_pages: false,
    })
    .expect("create VM");
    let handles = setup(&vm);
    let (byte_tx, bytes) = mpsc::channel();
    let (done_tx, done) = mpsc::channel();
    std::thread::spawn(move || {
        let outcome = vm
            .run(Box::new(Console(Mutex::new(byte_tx))), Instant::now())
            .expect("run VM");
        let _ = done_tx.send(outcome.exit);
    });
    let running = Running { bytes, done };
    assert_eq!(running.next_byte(), b'R');
    (running, handles)
}

fn letter(vector: u8) -> u8 {
    b'@' + (vector - FIRST_VECTOR)
}

#[test]
fn the_generic_path_delivers_in_order() {
    if !kvm_available() {
        return;
    }
    let (running, event_loop) = start(3, |vm| vm.start_event_loop().expect("event loop"));
    let sink = event_loop.sink();
    for vector in [0x41, 0x43, 0x42] {
        sink.raise(MsiMessage::fixed(0, vector));
        assert_eq!(running.next_byte(), letter(vector));
    }
    assert!(running.finish().is_empty());
    assert_eq!(
        event_loop
            .stats()
            .injected
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[test]
fn the_fast_path_delivers_reroutes_and_masks() {
    if !kvm_available() {
        return;
    }
    let (running, (router, event_loop)) = start(3, |vm| {
        (vm.gsi_router(), vm.start_event_loop().expect("event loop"))
    });
    let a = router.vector().expect("vector");
    let b = router.vector().expect("vector");
    assert_ne!(a.gsi(), b.gsi());

    a.route(Some(MsiMessage::fixed(0, 0x44))).expect("route");
    a.trigger();
    assert_eq!(running.next_byte(), letter(0x44));

    // The guest rewrote the entry: same GSI, new vector.
    a.route(Some(MsiMessage::fixed(0, 0x45))).expect("re-route");
    a.trigger();
    assert_eq!(running.next_byte(), letter(0x45));

    // Masked: the irqfd is gone, a trigger is not delivered. Another vector through
    // the generic path proves the guest was still taking interrupts.
    b.route(Some(MsiMessage::fixed(0, 0x46))).expect("route");
    b.route(None).expect("mask");
    b.trigger();
    event_loop.sink().raise(MsiMessage::fixed(0, 0x47));
    assert_eq!(running.next_byte(), letter(0x47));
    // The guest has now counted 3 and exits; a delivered masked vector would show.
    assert!(running.finish().is_empty());
}

#[test]
fn a_vector_dropped_while_routed_leaves_the_table_clean() {
    if !kvm_available() {
        return;
    }
    let (running, (router, event_loop)) = start(1, |vm| {
        (vm.gsi_router(), vm.start_event_loop().expect("event loop"))
    });
    {
        let gone = router.vector().expect("vector");
        gone.route(Some(MsiMessage::fixed(0, 0x41))).expect("route");
    }
    // Another vector's route commits the table without the dropped GSI.
    let kept = Arc::new(router.vector().expect("vector"));
    kept.route(Some(MsiMessage::fixed(0, 0x42))).expect("route");
    kept.trigger();
    assert_eq!(running.next_byte(), letter(0x42));
    drop(event_loop);
    assert!(running.finish().is_empty());
}
