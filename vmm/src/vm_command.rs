//! `kumo` without a subcommand: its VM flags (or `--spec FILE`) become one [`VmSpec`],
//! which `--print-spec` prints and which is otherwise run by the run for its guest
//! (the embedded guest, `--kernel`, `--irq-check`, `--api-socket`, `--restore`,
//! `--incoming`), each building its VM through [`crate::launch`].

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::args::VmArgs;
use crate::launch;
use crate::run::{self, RunOptions};
use crate::spec::vm::{self, Guest, VmSpec};

/// Largest `--spec` file read (a spec is a few hundred bytes).
const SPEC_FILE_LIMIT: u64 = 1 << 20;

/// `kumo [VM flags]`, `kumo --spec FILE` and `kumo --print-spec ...`.
pub fn run_args(args: &VmArgs, epoch: Instant) -> Result<u8> {
    let spec = match &args.spec {
        Some(path) => read_spec(path)?,
        None => spec_of_args(args)?,
    };
    if args.print_spec {
        let text = serde_json::to_string_pretty(&spec).context("printing the spec")?;
        crate::output::out(format_args!("{text}\n"));
        return Ok(crate::report::EXIT_OK);
    }
    let options = RunOptions {
        kvm_device: args.kvm_device.clone(),
        json: args.json,
        kvm_stats: args.kvm_stats,
    };
    run(&spec, &options, epoch)
}

/// A spec file, parsed; any fault is one line naming the file.
pub fn read_spec(path: &Path) -> Result<VmSpec> {
    let bytes = crate::input::read_bounded("spec", path, SPEC_FILE_LIMIT)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| anyhow::anyhow!("spec {}: not UTF-8 text", path.display()))?;
    VmSpec::from_json(&text).map_err(|e| anyhow::anyhow!("spec {}: {e}", path.display()))
}

/// Runs `spec` as its guest asks.
pub fn run(spec: &VmSpec, options: &RunOptions, epoch: Instant) -> Result<u8> {
    match &spec.guest {
        Guest::Snapshot { .. } => crate::migrate::run_restore(spec, options, epoch),
        Guest::Incoming { .. } => crate::migrate::run_incoming(spec, options, epoch),
        Guest::Kernel { .. } => {
            if spec.migration.api_socket.is_some() {
                anyhow::bail!(
                    "a kernel cannot be saved or moved: api_socket needs the embedded guest"
                );
            }
            if spec.sched.is_some() {
                anyhow::bail!("sched applies to the embedded guest only");
            }
            run::run_kernel(spec, options, epoch)
        }
        Guest::Npb { .. } if spec.migration.api_socket.is_some() => {
            crate::migrate::run_controlled(spec, options, epoch)
        }
        Guest::Npb { benchmarks, .. }
            if spec.devices.irq_test.is_some() && benchmarks.is_empty() =>
        {
            crate::irq::run_check(spec, options, epoch)
        }
        Guest::Npb { .. } => run::run_embedded(spec, options, epoch),
    }
}

/// The spec the VM flags describe. Checks what needs no host (the NPB list, `--sched`,
/// disk and passthrough syntax); the host is asked when the spec is launched.
pub fn spec_of_args(args: &VmArgs) -> Result<VmSpec> {
    let machine = vm::Machine {
        vcpus: args.vcpus,
        memory_mib: args.memory,
        huge_pages: args.huge_pages,
    };
    let guest = if let Some(path) = &args.restore {
        Guest::Snapshot { path: path.clone() }
    } else if let Some(addr) = &args.incoming {
        Guest::Incoming {
            addr: addr.clone(),
            token_file: args.token_file.clone(),
        }
    } else if let Some(path) = &args.kernel {
        Guest::Kernel {
            path: path.clone(),
            cmdline: args.cmdline.clone().unwrap_or_default(),
            modules: args.module.clone(),
        }
    } else {
        let benchmarks = if args.irq_check {
            Vec::new()
        } else {
            let specs = match &args.npb {
                Some(list) => crate::guest::parse_specs(list)?,
                None => crate::guest::default_specs(),
            };
            specs.iter().map(ToString::to_string).collect()
        };
        Guest::Npb {
            benchmarks,
            barrier_wait: args.barrier_wait,
            vcpu_balloon: args.vcpu_balloon,
            cmdline: None,
        }
    };
    let irq_path = args.irq_path;
    let passthrough = args
        .passthrough
        .iter()
        .map(|text| {
            text.parse::<hv::passthrough::PassthroughSpec>()
                .map_err(anyhow::Error::msg)?;
            Ok(vm::Passthrough {
                device: text.clone(),
                irq_path,
            })
        })
        .collect::<Result<_>>()?;
    let sched = args
        .sched
        .as_ref()
        .map(|text| {
            crate::spec::sched::parse_spec(text)?;
            Ok::<_, anyhow::Error>(vm::Sched {
                credit: text.clone(),
                ..vm::Sched::default()
            })
        })
        .transpose()?;
    Ok(VmSpec {
        machine,
        guest,
        devices: vm::Devices {
            irq_test: args.irq_check.then_some(vm::IrqTest {
                irq_path,
                rounds: args.irq_rounds,
            }),
            disks: args.disk.iter().map(launch::disk_to_spec).collect(),
            passthrough,
            nics: Vec::new(),
        },
        sched,
        migration: vm::Migration {
            dirty_log: match args.dirty_log.unwrap_or_default() {
                hv::migration::dirty::DirtyLogMode::Bitmap => vm::DirtyLog::Bitmap,
                hv::migration::dirty::DirtyLogMode::Ring => vm::DirtyLog::Ring,
            },
            api_socket: args.api_socket.clone(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        vm: VmArgs,
    }

    fn spec(flags: &[&str]) -> VmSpec {
        let cli = Cli::try_parse_from(std::iter::once("kumo").chain(flags.iter().copied()))
            .unwrap_or_else(|e| panic!("{flags:?}: {e}"));
        spec_of_args(&cli.vm).unwrap()
    }

    #[test]
    fn the_embedded_run_names_its_benchmarks_and_machine() {
        let s = spec(&[
            "--vcpus",
            "4",
            "--npb",
            "ep.S, cg.W",
            "--memory",
            "512",
            "--huge-pages",
            "--sched",
            "credit:tslice=1ms",
            "--barrier-wait",
            "hlt",
        ]);
        assert_eq!(
            s.machine,
            vm::Machine {
                vcpus: 4,
                memory_mib: Some(512),
                huge_pages: true
            }
        );
        assert_eq!(
            s.guest,
            Guest::Npb {
                benchmarks: vec!["ep.S".into(), "cg.W".into()],
                barrier_wait: vm::BarrierWait::Hlt,
                vcpu_balloon: vm::VcpuBalloon::Auto,
                cmdline: None,
            }
        );
        assert_eq!(s.sched.unwrap().credit, "credit:tslice=1ms");
        assert_eq!(s.devices, vm::Devices::default());
    }

    #[test]
    fn without_npb_the_default_list_is_spelt_out() {
        let s = spec(&[]);
        let Guest::Npb { benchmarks, .. } = &s.guest else {
            panic!("{s:?}")
        };
        let defaults: Vec<String> = crate::guest::default_specs()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(benchmarks, &defaults);
        assert_eq!(s.machine.memory_mib, None);
    }

    #[test]
    fn a_kernel_run_takes_its_cmdline_modules_disks_and_passthrough() {
        let s = spec(&[
            "--kernel",
            "/k.elf",
            "--cmdline",
            "a b",
            "--module",
            "/m1",
            "--module",
            "/m2",
            "--disk",
            "/d.img,readonly,io=vcpu",
            "--passthrough",
            "vfio-user:/p.sock",
            "--irq-path",
            "fast",
        ]);
        assert_eq!(
            s.guest,
            Guest::Kernel {
                path: "/k.elf".into(),
                cmdline: "a b".into(),
                modules: vec!["/m1".into(), "/m2".into()],
            }
        );
        assert_eq!(
            s.devices.disks,
            vec![vm::Disk {
                path: "/d.img".into(),
                readonly: true,
                io: vm::DiskIo::Vcpu
            }]
        );
        assert_eq!(
            s.devices.passthrough,
            vec![vm::Passthrough {
                device: "vfio-user:/p.sock".into(),
                irq_path: vm::IrqPath::Fast
            }]
        );
    }

    #[test]
    fn irq_check_is_the_test_device_and_no_benchmarks() {
        let s = spec(&["--irq-check", "--irq-rounds", "7", "--irq-path", "fast"]);
        assert_eq!(
            s.devices.irq_test,
            Some(vm::IrqTest {
                irq_path: vm::IrqPath::Fast,
                rounds: Some(7)
            })
        );
        let Guest::Npb { benchmarks, .. } = &s.guest else {
            panic!("{s:?}")
        };
        assert!(benchmarks.is_empty());
    }

    #[test]
    fn movable_runs_carry_their_socket_dirty_log_and_source() {
        let s = spec(&["--api-socket", "/a.sock", "--dirty-log", "ring"]);
        assert_eq!(s.migration.dirty_log, vm::DirtyLog::Ring);
        assert_eq!(s.migration.api_socket, Some("/a.sock".into()));
        let s = spec(&["--incoming", "tcp:127.0.0.1:9", "--token-file", "/t"]);
        assert_eq!(
            s.guest,
            Guest::Incoming {
                addr: "tcp:127.0.0.1:9".into(),
                token_file: Some("/t".into())
            }
        );
        let s = spec(&["--restore", "/snap"]);
        assert_eq!(
            s.guest,
            Guest::Snapshot {
                path: "/snap".into()
            }
        );
    }

    #[test]
    fn bad_values_are_refused_before_any_vm() {
        for flags in [
            &["--npb", "xx.S"][..],
            &["--sched", "credit:tslice=fast"][..],
            &["--kernel", "/k", "--passthrough", "vfio-user:"][..],
        ] {
            let cli =
                Cli::try_parse_from(std::iter::once("kumo").chain(flags.iter().copied())).unwrap();
            assert!(spec_of_args(&cli.vm).is_err(), "{flags:?}");
        }
    }

    #[test]
    fn the_printed_spec_reads_back_as_the_same_spec() {
        let s = spec(&["--vcpus", "3", "--npb", "ep.S", "--sched", "credit"]);
        let text = serde_json::to_string_pretty(&s).unwrap();
        assert_eq!(VmSpec::from_json(&text).unwrap(), s);
    }
}
