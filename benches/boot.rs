//! Boot of the embedded guest: from VM creation to the guest's "workload started" mark
//! (boot-timer port), for 1, 2 and 4 vCPUs. The guest runs an empty workload (`npb=`).

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use hv::VmConfig;
use kumo_vmm::guest::EMBEDDED_GUEST;

fn config(vcpus: u32) -> VmConfig {
    VmConfig {
        vcpus,
        memory_mib: 64,
        kernel: EMBEDDED_GUEST.into(),
        cmdline: "npb=".to_string(),
        modules: Vec::new(),
        kvm_device: "/dev/kvm".into(),
        huge_pages: false,
    }
}

fn boot_to_workload_start(c: &mut Criterion) {
    if !std::path::Path::new("/dev/kvm").exists() {
        eprintln!("boot benchmark skipped: /dev/kvm is missing");
        return;
    }
    let mut group = c.benchmark_group("boot");
    group.sample_size(20);
    for vcpus in [1, 2, 4] {
        group.bench_function(format!("{vcpus}_vcpus_to_workload_start"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let epoch = Instant::now();
                    let vm = hv::builder::build_for_boot(config(vcpus)).expect("create VM");
                    let outcome = vm.run(Box::new(std::io::sink()), epoch).expect("run VM");
                    total += outcome
                        .workload_started
                        .expect("the guest marks its workload start");
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(benches, boot_to_workload_start);
criterion_main!(benches);
