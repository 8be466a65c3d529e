//! Round-trip cost of a guest exit to kumo's vCPU loop and back: a CPL0 `out` to an
//! unclaimed port (KVM_EXIT_IO) and a CPL0 write to unmapped memory (KVM_EXIT_MMIO).
//! A tiny PVH guest does the exits in an unrolled loop, then writes debug-exit; the time
//! of `Vm::run` is measured per exit, and criterion's linear fit removes the fixed cost
//! (thread start, first entry). Also: `hv::builder::build_for_boot` and a whole trivial boot.
//!
//! Compare with PLATFORM.md (kvm_pvm): ~10.5 us PIO, ~11-12 us MMIO at CPL0.

use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use hv::testing::{PvhImage, asm};
use hv::{GuestExit, Vm, VmConfig};

/// Exits per loop iteration: the emulated `dec ecx; jnz` (~1.8 us here) is paid once
/// per UNROLL exits.
const UNROLL: u64 = 16;
/// `out dx, al` with dx = 0x510 (no device there).
const PIO_EXIT: &[u8] = &[0xee];
/// `mov [0xd0000000], eax` (nothing mapped there: 64 MiB of RAM).
const MMIO_EXIT: &[u8] = &[0xa3, 0x00, 0x00, 0x00, 0xd0];

fn config(kernel: Vec<u8>) -> VmConfig {
    VmConfig {
        vcpus: 1,
        memory_mib: 64,
        kernel: kernel.into(),
        cmdline: String::new(),
        modules: Vec::new(),
        kvm_device: "/dev/kvm".into(),
        huge_pages: false,
    }
}

/// A guest doing `loops * UNROLL` exits of `exit`, then debug-exit 0.
fn exit_loop_guest(exit: &[u8], loops: u32) -> Vec<u8> {
    let body = exit.repeat(UNROLL as usize);
    let mut code = vec![0x66, 0xba, 0x10, 0x05]; // mov dx, 0x510
    code.extend(asm::repeat(loops, &body));
    code.extend(asm::out8_imm(0xf4, 0));
    PvhImage::new(&code).build()
}

fn run_to_exit(vm: Vm) -> Duration {
    let start = Instant::now();
    let outcome = vm.run(Box::new(std::io::sink()), start).expect("run VM");
    let t = start.elapsed();
    assert_eq!(
        outcome.exit,
        GuestExit::DebugExit(0),
        "the benchmark guest failed"
    );
    t
}

fn exits(c: &mut Criterion) {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("exit benchmarks skipped: /dev/kvm is missing");
        return;
    }
    let mut group = c.benchmark_group("exit_round_trip");
    group.sampling_mode(SamplingMode::Linear);
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    for (name, exit) in [
        ("pio_out_unclaimed_port", PIO_EXIT),
        ("mmio_write_unmapped", MMIO_EXIT),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let loops = iters.div_ceil(UNROLL).max(1);
                let vm = hv::builder::build_for_boot(config(exit_loop_guest(exit, loops as u32)))
                    .expect("create VM");
                let t = run_to_exit(vm);
                // Scale to exactly `iters` exits.
                t.mul_f64(iters as f64 / (loops * UNROLL) as f64)
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("vm");
    group.sample_size(30);
    let trivial = PvhImage::new(&asm::out8_imm(0xf4, 0)).build();
    group.bench_function("new_1_vcpu_64_mib", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let vm = hv::builder::build_for_boot(config(trivial.clone())).expect("create VM");
                total += start.elapsed();
                drop(vm);
            }
            total
        })
    });
    group.bench_function("run_trivial_guest_1_vcpu", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let vm = hv::builder::build_for_boot(config(trivial.clone())).expect("create VM");
                total += run_to_exit(vm);
            }
            total
        })
    });
    group.bench_function("new_and_run_trivial_guest_4_vcpus", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let vm = hv::builder::build_for_boot(VmConfig {
                    vcpus: 4,
                    ..config(trivial.clone())
                })
                .expect("create VM");
                run_to_exit(vm);
                total += start.elapsed();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, exits);
criterion_main!(benches);
