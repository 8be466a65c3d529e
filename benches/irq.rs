//! The interrupt paths' injection primitives, measured from user space on a VM whose
//! vCPU is not running (so what is timed is kumo's and KVM's side of delivery, not the
//! guest's wake-up; `kumo bench irq` measures that end to end):
//! - one `KVM_SIGNAL_MSI` ioctl (the generic path's injection),
//! - one irqfd write (the whole fast path from the device's side),
//! - one event-loop hop: queue to the generic path's thread until it has injected.

use std::sync::atomic::Ordering;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use devices::interrupt::MsiMessage;
use hv::testing::{PvhImage, asm};
use hv::{Vm, VmConfig};

fn idle_vm() -> Vm {
    hv::builder::build_for_boot(VmConfig {
        vcpus: 1,
        memory_mib: 16,
        kernel: PvhImage::new(&asm::halt_forever()).build().into(),
        cmdline: String::new(),
        modules: Vec::new(),
        kvm_device: "/dev/kvm".into(),
        huge_pages: false,
    })
    .expect("create VM")
}

fn injection(c: &mut Criterion) {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("interrupt benchmarks skipped: /dev/kvm is missing");
        return;
    }
    let vm = idle_vm();
    let msi = MsiMessage::fixed(0, 0x41);
    let mut group = c.benchmark_group("irq_injection");

    group.bench_function("kvm_signal_msi", |b| {
        b.iter(|| vm.signal_msi(msi).expect("KVM_SIGNAL_MSI"))
    });

    let router = vm.gsi_router();
    let vector = router.vector().expect("fast vector");
    vector.route(Some(msi)).expect("route");
    group.bench_function("irqfd_write", |b| b.iter(|| vector.trigger()));

    let event_loop = vm.start_event_loop().expect("event loop");
    let sink = event_loop.sink();
    let injected = &event_loop.stats().injected;
    group.bench_function("event_loop_hop", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                let before = injected.load(Ordering::Acquire);
                sink.raise(msi);
                while injected.load(Ordering::Acquire) == before {
                    std::hint::spin_loop();
                }
            }
            start.elapsed()
        })
    });
    group.finish();
}

criterion_group!(benches, injection);
criterion_main!(benches);
