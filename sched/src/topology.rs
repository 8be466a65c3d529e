//! Which pCPUs share a module: AMD Bulldozer's two cores behind one front end and
//! L2 (S3), or SMT siblings. A core runs slower while its module's other core is
//! busy, so a module-aware pick ([`crate::Scheduler::set_modules`]) sends a waking or
//! migrating vCPU to an idle core whose siblings are idle too, when there is one.

use crate::ids::PcpuId;
use crate::params::ParamError;

/// pCPUs grouped into modules. Built once (it allocates); read on the pick path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Modules {
    /// Module index of each pCPU.
    module_of: Vec<u32>,
    /// The pCPUs of each module, ascending.
    members: Vec<Vec<PcpuId>>,
}

impl Modules {
    /// `pcpus` pCPUs, every `cores_per_module` consecutive ones a module (pCPUs
    /// 0-1, 2-3, ... for two), as Linux and Xen number a Bulldozer's cores.
    pub fn uniform(pcpus: u32, cores_per_module: u32) -> Result<Modules, ParamError> {
        if cores_per_module == 0 || pcpus == 0 || !pcpus.is_multiple_of(cores_per_module) {
            return Err(ParamError::Modules {
                pcpus,
                cores_per_module,
            });
        }
        Ok(Modules::from_module_of(
            (0..pcpus).map(|p| p / cores_per_module).collect(),
        ))
    }

    /// Any grouping: `module_of[p]` is pCPU p's module (any numbers; equal = shared).
    pub fn from_module_of(module_of: Vec<u32>) -> Modules {
        let mut ids: Vec<u32> = module_of.clone();
        ids.sort_unstable();
        ids.dedup();
        let dense: Vec<u32> = module_of
            .iter()
            .map(|m| ids.binary_search(m).unwrap_or_default() as u32)
            .collect();
        let mut members = vec![Vec::new(); ids.len()];
        for (p, m) in dense.iter().enumerate() {
            members[*m as usize].push(PcpuId(p as u32));
        }
        Modules {
            module_of: dense,
            members,
        }
    }

    /// Number of pCPUs described.
    pub fn pcpus(&self) -> u32 {
        self.module_of.len() as u32
    }

    /// Number of modules.
    pub fn modules(&self) -> u32 {
        self.members.len() as u32
    }

    /// `p`'s module (dense, `0..modules()`).
    pub fn module_of(&self, p: PcpuId) -> u32 {
        self.module_of[p.0 as usize]
    }

    /// The other pCPUs of `p`'s module.
    pub fn siblings(&self, p: PcpuId) -> impl Iterator<Item = PcpuId> + '_ {
        self.members[self.module_of(p) as usize]
            .iter()
            .copied()
            .filter(move |q| *q != p)
    }

    /// Modules with at least two busy pCPUs (S3's contended modules).
    pub fn contended(&self, busy: impl Fn(PcpuId) -> bool) -> u32 {
        self.members
            .iter()
            .filter(|m| m.iter().filter(|p| busy(**p)).count() >= 2)
            .count() as u32
    }
}
