//! A machine's topology for the simulator (`[topology]` in a simulation file):
//! sockets of cores, and modules of cores that share a front end and an L2, as AMD
//! Bulldozer's two-core modules in S3's Opteron 6376 (`../shared/research/SEEDS.md`).
//! A core whose module has another busy core runs `1 - module_contention` as fast.
//!
//! pCPUs are numbered socket by socket, a module's cores next to each other (pCPUs
//! 0-1 are the first module of socket 0), as Linux and Xen number a Bulldozer.

use anyhow::{Result, bail};
use serde::Deserialize;

/// Most pCPUs of a modelled machine (one `sched::Scheduler`'s limit).
const MAX_PCPUS: u32 = sched::MAX_PCPUS;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopologyFile {
    pub sockets: u32,
    pub cores_per_socket: u32,
    /// Cores sharing a front end and L2 (2 on Bulldozer; 1: no sharing).
    #[serde(default = "two")]
    pub cores_per_module: u32,
    /// How much slower a core runs while another core of its module is busy (0.2: at
    /// 80 % of its speed). A declared parameter: S3 gives no figure for it.
    pub module_contention: f64,
}

fn two() -> u32 {
    2
}

/// A validated topology.
#[derive(Debug, Clone)]
pub struct Topology {
    pub sockets: u32,
    pub cores_per_socket: u32,
    pub cores_per_module: u32,
    pub module_contention: f64,
}

impl Topology {
    pub fn new(file: TopologyFile) -> Result<Topology> {
        let TopologyFile {
            sockets,
            cores_per_socket,
            cores_per_module,
            module_contention,
        } = file;
        if sockets == 0 || cores_per_socket == 0 {
            bail!("[topology]: sockets and cores_per_socket must be at least 1");
        }
        if sockets.saturating_mul(cores_per_socket) > MAX_PCPUS {
            bail!("[topology]: {sockets} x {cores_per_socket} cores is above {MAX_PCPUS} pCPUs");
        }
        if cores_per_module == 0 || !cores_per_socket.is_multiple_of(cores_per_module) {
            bail!(
                "[topology]: cores_per_module {cores_per_module} must be at least 1 and \
                 divide cores_per_socket {cores_per_socket}"
            );
        }
        if !(0.0..1.0).contains(&module_contention) {
            bail!("[topology]: module_contention {module_contention} is outside 0 <= c < 1");
        }
        Ok(Topology {
            sockets,
            cores_per_socket,
            cores_per_module,
            module_contention,
        })
    }

    pub fn pcpus(&self) -> u32 {
        self.sockets * self.cores_per_socket
    }

    pub fn modules(&self) -> u32 {
        self.pcpus() / self.cores_per_module
    }

    pub fn socket_of(&self, pcpu: u32) -> u32 {
        pcpu / self.cores_per_socket
    }

    pub fn module_of(&self, pcpu: u32) -> u32 {
        pcpu / self.cores_per_module
    }

    /// The scheduler's view of the modules of `pcpus` (machine pCPU numbers, in the
    /// scheduler's pCPU order).
    pub fn sched_modules(&self, pcpus: &[u32]) -> sched::Modules {
        sched::Modules::from_module_of(pcpus.iter().map(|p| self.module_of(*p)).collect())
    }

    /// Work a core does per ns, given which machine pCPUs are busy.
    pub fn speed(&self, pcpu: u32, busy: impl Fn(u32) -> bool) -> f64 {
        let module = self.module_of(pcpu);
        let first = module * self.cores_per_module;
        let shared = (first..first + self.cores_per_module).any(|q| q != pcpu && busy(q));
        if shared {
            1.0 - self.module_contention
        } else {
            1.0
        }
    }

    /// Modules with two or more busy cores (S3's contended modules).
    pub fn contended(&self, busy: impl Fn(u32) -> bool) -> u32 {
        (0..self.modules())
            .filter(|m| {
                let first = m * self.cores_per_module;
                (first..first + self.cores_per_module)
                    .filter(|q| busy(*q))
                    .count()
                    >= 2
            })
            .count() as u32
    }
}

/// A pCPU list such as `0-7,16-23`, `0,2,4` or `0-30:2` (every second one), in the
/// order given, each pCPU once and below `pcpus`.
pub fn parse_pcpus(text: &str, pcpus: u32) -> Result<Vec<u32>> {
    let number = |s: &str| -> Result<u32> {
        match s.trim().parse::<u32>() {
            Ok(n) if n < pcpus => Ok(n),
            Ok(n) => bail!("pCPU {n} is not below the topology's {pcpus}"),
            Err(_) => bail!("'{}' is not a pCPU number", s.trim()),
        }
    };
    let mut list = Vec::new();
    for part in text.split(',') {
        let (range, stride) = match part.split_once(':') {
            Some((range, stride)) => match stride.trim().parse::<usize>() {
                Ok(s) if s >= 1 => (range, s),
                _ => bail!("'{}' is not a stride (1 or more)", stride.trim()),
            },
            None => (part, 1),
        };
        match range.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (number(a)?, number(b)?);
                if a > b {
                    bail!("pCPU range {a}-{b} runs backwards");
                }
                list.extend((a..=b).step_by(stride));
            }
            None if stride != 1 => bail!("a stride needs a range: '{}'", part.trim()),
            None => list.push(number(range)?),
        }
    }
    let mut sorted = list.clone();
    sorted.sort_unstable();
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        bail!("pCPU list '{text}' names a pCPU twice");
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opteron(contention: f64) -> Topology {
        Topology::new(TopologyFile {
            sockets: 2,
            cores_per_socket: 16,
            cores_per_module: 2,
            module_contention: contention,
        })
        .unwrap()
    }

    #[test]
    fn two_opterons_have_32_pcpus_in_16_modules() {
        let t = opteron(0.2);
        assert_eq!((t.pcpus(), t.modules()), (32, 16));
        assert_eq!((t.module_of(17), t.socket_of(17)), (8, 1));
        let busy = |p: u32| [0, 1, 2, 16, 17, 18, 19].contains(&p);
        assert_eq!(t.contended(busy), 3, "modules 0, 8 and 9");
        assert_eq!(t.contended(|p| p % 2 == 0), 0, "even cores only");
        assert_eq!(t.contended(|p| p < 16), 8, "one socket, all busy");
    }

    #[test]
    fn a_core_slows_only_while_its_sibling_is_busy() {
        let t = opteron(0.25);
        assert_eq!(t.speed(0, |p| p == 1), 0.75);
        assert_eq!(t.speed(1, |p| p == 0), 0.75);
        assert_eq!(t.speed(0, |p| p == 2), 1.0, "another module");
        assert_eq!(t.speed(0, |p| p == 0), 1.0, "itself");
        assert_eq!(opteron(0.0).speed(0, |_| true), 1.0);
    }

    #[test]
    fn the_scheduler_sees_the_same_modules() {
        let t = opteron(0.2);
        let m = t.sched_modules(&[0, 1, 16, 17, 24]);
        assert_eq!(m.modules(), 3);
        assert_eq!(
            m.siblings(sched::PcpuId(2)).collect::<Vec<_>>(),
            [sched::PcpuId(3)]
        );
    }

    #[test]
    fn pcpu_lists_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_pcpus("0-2,16,20-21", 32).unwrap(),
            [0, 1, 2, 16, 20, 21]
        );
        assert_eq!(parse_pcpus("0-7:2,9", 32).unwrap(), [0, 2, 4, 6, 9]);
        for (bad, why) in [
            ("0-32", "not below"),
            ("3-1", "backwards"),
            ("0,x", "'x' is not"),
            ("0-3,2", "twice"),
            ("0-7:0", "stride"),
            ("4:2", "needs a range"),
        ] {
            let err = parse_pcpus(bad, 32).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let bad = |c: f64, cpm: u32| {
            Topology::new(TopologyFile {
                sockets: 2,
                cores_per_socket: 16,
                cores_per_module: cpm,
                module_contention: c,
            })
        };
        assert!(bad(1.0, 2).is_err());
        assert!(bad(-0.1, 2).is_err());
        assert!(bad(0.2, 3).is_err());
        assert!(bad(f64::NAN, 2).is_err());
    }
}
