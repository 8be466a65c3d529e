use std::process::ExitCode;
use std::time::Instant;

use kumo::cli::{BenchCommand, Command};
use kumo_vmm::run;

/// Status for bad input and host problems (clap uses the same for usage errors).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    // The boot-time figure is measured from here: as close to process start as we get.
    let epoch = Instant::now();
    // Before the first large allocation: see kumo::heap.
    kumo::heap::fix_mmap_threshold();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    tracing::debug!(
        since_start_us = epoch.elapsed().as_micros() as u64,
        "boot: tracing ready"
    );
    // The host CPUs kumo may use are read once, here, before any thread is pinned:
    // a node pins the thread that runs it, and a count taken then would be 1.
    hv::placement::host_cpus();
    // First, before any thread exists: every thread inherits the blocked signals.
    if let Err(e) = kumo_vmm::signals::install() {
        eprintln!("kumo: error: cannot set up signal handling: {e}");
        return ExitCode::from(EXIT_USAGE);
    }
    tracing::debug!(
        since_start_us = epoch.elapsed().as_micros() as u64,
        "boot: host CPUs read, signals set"
    );
    let cli = match kumo::cli::parse() {
        Ok(cli) => cli,
        Err(refusal) => {
            eprintln!("kumo: error: {refusal}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    tracing::debug!(
        since_start_us = epoch.elapsed().as_micros() as u64,
        "command line parsed"
    );
    let vm = &cli.vm;
    let limits = match &cli.command {
        Some(Command::Node(args)) => args.limits.limits(),
        Some(Command::Mpi(args)) => args.limits.limits(),
        _ => vm.limits.limits(),
    };
    hv::stop::set_default_limits(limits);
    hv::seccomp::set_mode(match &cli.command {
        Some(Command::Node(args)) => args.limits.seccomp,
        Some(Command::Mpi(args)) => args.limits.seccomp,
        Some(Command::NicServer(args)) => args.seccomp,
        _ => vm.limits.seccomp,
    });
    let result = match (&cli.command, &vm.dump_guest) {
        (Some(Command::Native(args)), _) => kumo_lab::native::run_native(args),
        (Some(Command::Bench(BenchCommand::Overhead(args))), _) => {
            kumo::bench::overhead::run_overhead(args)
        }
        (Some(Command::Bench(BenchCommand::Api(args))), _) => kumo::bench::api::run_api(args),
        (Some(Command::Node(args)), _) => kumo_vmm::node::run_node(args, epoch),
        (Some(Command::Ctl(args)), _) => kumo_vmm::ctl::run_ctl(args),
        (Some(Command::Sim(args)), _) => kumo_lab::sim::run_sim(args),
        (Some(Command::Bench(BenchCommand::Wake(args))), _) => {
            kumo::bench::wake::run_wake(args, epoch)
        }
        (Some(Command::Bench(BenchCommand::Preempt(args))), _) => {
            kumo::bench::preempt::run_preempt(args)
        }
        (Some(Command::Bench(BenchCommand::Switch(args))), _) => {
            kumo::bench::switch::run_switch(args, epoch)
        }
        (Some(Command::Bench(BenchCommand::Irq(args))), _) => kumo_vmm::irq::run_bench(args, epoch),
        (Some(Command::Bench(BenchCommand::Migrate(args))), _) => {
            kumo::bench::migrate::run_bench(args, epoch)
        }
        (Some(Command::Bench(BenchCommand::Net(args))), _) => kumo::mpi::run_bench(args, epoch),
        (Some(Command::Bench(BenchCommand::Process(args))), _) => {
            kumo::bench::process::run_process(args)
        }
        (Some(Command::Bench(BenchCommand::Oversub(args))), _) => kumo::bench::oversub::run(args),
        (Some(Command::Bench(BenchCommand::Soak(args))), _) => {
            kumo::bench::soak::run_soak(args, epoch)
        }
        (Some(Command::Bench(BenchCommand::Record(args))), _) => {
            kumo::bench::suite::run_record(args)
        }
        (Some(Command::Bench(BenchCommand::Compare(args))), _) => {
            kumo::bench::compare::run_compare(args)
        }
        (Some(Command::Mpi(args)), _) => kumo::mpi::run_mpi(args, epoch),
        (Some(Command::Experiment(args)), _) => kumo_lab::experiment::run_experiment(args, epoch),
        (Some(Command::NicServer(args)), _) => kumo_vmm::nic_server::run(args),
        (Some(Command::DiskImage(args)), _) => kumo::disk_image::run(args),
        (None, Some(path)) => run::dump_guest(path),
        // Every single-VM run: its flags (or --spec) as a VmSpec, run by its guest.
        (None, None) => kumo_vmm::vm_command::run_args(vm, epoch),
    };
    // A signal stopped the VMs: whatever the command made of that (a verdict, or an
    // error from a bench that lost its measurement), the status says which signal.
    // VMs whose destruction was deferred go to a reaper process now (see hv::teardown).
    hv::teardown::hand_off();
    let signalled = hv::stop::requested()
        .map(|signal| kumo_vmm::report::stop_status(hv::StopCause::Signal(signal)));
    match result {
        Ok(code) => ExitCode::from(signalled.unwrap_or(code)),
        Err(err) => {
            eprintln!("kumo: error: {}", kumo_vmm::output::error_chain(&err));
            ExitCode::from(signalled.unwrap_or(EXIT_USAGE))
        }
    }
}
