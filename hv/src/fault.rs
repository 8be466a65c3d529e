//! How a VM that did not exit cleanly is reported.

use std::fmt;

/// Why the VM stopped without a debug-exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultReason {
    /// KVM_EXIT_SHUTDOWN: the guest triple-faulted (or otherwise shut down the CPU).
    TripleFault,
    /// KVM_EXIT_INTERNAL_ERROR (suberror 1 = the instruction emulator failed).
    InternalError { suberror: u32, data: Vec<u64> },
    /// KVM_EXIT_FAIL_ENTRY: the hardware refused to enter the guest.
    FailEntry { hardware_reason: u64, cpu: u32 },
    /// KVM_RUN itself failed with this errno (e.g. the guest touched memory KVM could
    /// not map).
    RunFailed { errno: i32 },
    /// Any other exit kumo does not handle.
    UnhandledExit(String),
    /// The watchdog saw the vCPU use this much CPU time with no exit and no change of
    /// its registers (e.g. stuck inside KVM_RUN on an instruction the host cannot
    /// complete).
    NoProgress { cpu_time: std::time::Duration },
    /// Every vCPU is halted with interrupts disabled or was never started (see
    /// `halt`): nothing can make the guest run again. Where each one stopped, and the
    /// last line the guest wrote to its console.
    HaltedForever { vcpus: String, last_line: String },
}

impl fmt::Display for FaultReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultReason::TripleFault => write!(f, "triple fault (KVM_EXIT_SHUTDOWN)"),
            FaultReason::InternalError { suberror, data } => {
                let what = match suberror {
                    1 => " (instruction emulation failed)",
                    2 => " (simultaneous exceptions)",
                    3 => " (delivery event via the IDT failed)",
                    4 => " (unexpected VM exit during event delivery)",
                    _ => "",
                };
                write!(f, "KVM internal error, suberror {suberror}{what}")?;
                if !data.is_empty() {
                    write!(f, ", data")?;
                    for d in data {
                        write!(f, " {d:#x}")?;
                    }
                }
                Ok(())
            }
            FaultReason::FailEntry {
                hardware_reason,
                cpu,
            } => write!(
                f,
                "VM entry failed, hardware reason {hardware_reason:#x} (host CPU {cpu})"
            ),
            FaultReason::RunFailed { errno } => write!(
                f,
                "KVM_RUN failed: {} (errno {errno})",
                std::io::Error::from_raw_os_error(*errno)
            ),
            FaultReason::UnhandledExit(kind) => write!(f, "unhandled exit {kind}"),
            FaultReason::NoProgress { cpu_time } => write!(
                f,
                "no progress for {:.1} s of CPU time: no exit and no change of registers \
                 (watchdog; stuck in KVM_RUN? the last sampled registers follow)",
                cpu_time.as_secs_f64()
            ),
            FaultReason::HaltedForever { vcpus, last_line } => write!(
                f,
                "the guest stopped for good: every vCPU is halted with interrupts disabled \
                 or was never started ({vcpus}); its last console line: {last_line:?}"
            ),
        }
    }
}

/// The execution mode of the faulting vCPU, from CR0, EFER and CS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuMode {
    Real,
    Virtual8086,
    Protected16,
    Protected32,
    Compat,
    Long64,
}

impl CpuMode {
    pub fn from_state(cr0: u64, efer: u64, rflags: u64, cs_l: bool, cs_db: bool) -> Self {
        const LMA: u64 = 1 << 10;
        const VM: u64 = 1 << 17;
        if cr0 & 1 == 0 {
            CpuMode::Real
        } else if efer & LMA != 0 {
            if cs_l {
                CpuMode::Long64
            } else {
                CpuMode::Compat
            }
        } else if rflags & VM != 0 {
            CpuMode::Virtual8086
        } else if cs_db {
            CpuMode::Protected32
        } else {
            CpuMode::Protected16
        }
    }
}

impl fmt::Display for CpuMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CpuMode::Real => "real mode",
            CpuMode::Virtual8086 => "virtual-8086 mode",
            CpuMode::Protected16 => "16-bit protected mode",
            CpuMode::Protected32 => "32-bit protected mode",
            CpuMode::Compat => "compatibility mode",
            CpuMode::Long64 => "64-bit mode",
        })
    }
}

/// The registers of the faulting vCPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registers {
    /// rax, rbx, rcx, rdx, rsi, rdi, rbp, r8..r15 in that order.
    pub gprs: [u64; 15],
    pub rip: u64,
    pub rsp: u64,
    pub rflags: u64,
    pub cr0: u64,
    pub cr2: u64,
    pub cr3: u64,
    pub cr4: u64,
    pub efer: u64,
    pub cs: u16,
    /// Current privilege level (the RPL of CS; 0 in real mode).
    pub cpl: u8,
    pub mode: Option<CpuMode>,
}

pub const GPR_NAMES: [&str; 15] = [
    "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11", "r12", "r13", "r14",
    "r15",
];

/// A guest fault: why, on which vCPU, and the vCPU's registers at that point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultReport {
    pub reason: FaultReason,
    pub vcpu: u32,
    /// None if KVM would not give them (the error says why).
    pub registers: Result<Registers, String>,
}

impl fmt::Display for FaultReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} on vCPU {}", self.reason, self.vcpu)?;
        let r = match &self.registers {
            Ok(r) => r,
            Err(e) => return write!(f, "  registers unavailable: {e}"),
        };
        let mode = r
            .mode
            .map(|m| m.to_string())
            .unwrap_or_else(|| "unknown mode".into());
        writeln!(
            f,
            "  rip {:#018x}  cs {:#06x} ({mode}, CPL {})  rsp {:#018x}  rflags {:#x}",
            r.rip, r.cs, r.cpl, r.rsp, r.rflags
        )?;
        for (row, names) in GPR_NAMES.chunks(4).enumerate() {
            write!(f, " ")?;
            for (i, name) in names.iter().enumerate() {
                write!(f, " {name:>3} {:#018x}", r.gprs[row * 4 + i])?;
            }
            writeln!(f)?;
        }
        write!(
            f,
            "  cr0 {:#x}  cr2 {:#x}  cr3 {:#x}  cr4 {:#x}  efer {:#x}",
            r.cr0, r.cr2, r.cr3, r.cr4, r.efer
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_reason_vcpu_and_registers() {
        let mut regs = Registers {
            rip: 0x100005,
            cs: 0x10,
            cr0: 0x11,
            mode: Some(CpuMode::Protected32),
            ..Default::default()
        };
        regs.gprs[14] = 0xdead;
        let report = FaultReport {
            reason: FaultReason::TripleFault,
            vcpu: 1,
            registers: Ok(regs),
        };
        let text = report.to_string();
        assert!(
            text.starts_with("triple fault (KVM_EXIT_SHUTDOWN) on vCPU 1\n"),
            "{text}"
        );
        assert!(text.contains("rip 0x0000000000100005"), "{text}");
        assert!(text.contains("32-bit protected mode"), "{text}");
        assert!(text.contains("r15 0x000000000000dead"), "{text}");
        assert!(text.contains("cr0 0x11"), "{text}");
        assert_eq!(text.lines().count(), 7, "{text}");

        let report = FaultReport {
            reason: FaultReason::InternalError {
                suberror: 1,
                data: vec![0x10, 0x20],
            },
            vcpu: 0,
            registers: Err("KVM_GET_REGS failed".into()),
        };
        let text = report.to_string();
        assert!(
            text.contains("suberror 1 (instruction emulation failed), data 0x10 0x20 on vCPU 0"),
            "{text}"
        );
        assert!(text.contains("registers unavailable"), "{text}");
    }

    #[test]
    fn modes_from_control_registers() {
        assert_eq!(CpuMode::from_state(0x10, 0, 2, false, false), CpuMode::Real);
        assert_eq!(
            CpuMode::from_state(0x11, 0, 2, false, true),
            CpuMode::Protected32
        );
        assert_eq!(
            CpuMode::from_state(0x11, 0, 2, false, false),
            CpuMode::Protected16
        );
        assert_eq!(
            CpuMode::from_state(0x8000_0011, 0x500, 2, true, false),
            CpuMode::Long64
        );
        assert_eq!(
            CpuMode::from_state(0x8000_0011, 0x500, 2, false, true),
            CpuMode::Compat
        );
        assert_eq!(
            CpuMode::from_state(0x11, 0, 0x20002, false, false),
            CpuMode::Virtual8086
        );
    }
}
