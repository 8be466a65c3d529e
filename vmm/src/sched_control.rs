//! What a running kumo's API serves of its scheduler: the credit scheduler's parameters and
//! its domains' weights and caps (nodes, and single VMs under `--sched`). Apart from
//! `node` and `run` so that both use it and neither depends on the other for it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use hv::credit::CreditDriver;
use hv::placement::{ThreadGroup, VcpuControl};

use crate::api::{self, Controlled, Refused, SchedTarget};
use crate::spec::control::{
    BalloonState, Counters, DomainInfo, RunKind, RunState, SchedParams, SchedUpdate, VmInfo,
};
use crate::spec::node::{self as config, Domain};
use crate::spec::sched as sched_params;

/// Serves the API at `path` for a scheduler (or, without one, for domains the host
/// schedules), and says where it is.
pub fn serve(
    driver: Option<Arc<CreditDriver>>,
    domains: Vec<(Domain, Arc<VcpuControl>)>,
    path: &std::path::Path,
    dom0: Arc<ThreadGroup>,
) -> Result<api::Server> {
    let control = Arc::new(SchedControl::new(driver, domains));
    // The API's threads are part of domain 0 (scheduled with it).
    let server = api::Server::start(path, control, move || dom0.join_current())?;
    server.announce();
    Ok(server)
}

/// What the API sees: the credit driver (if any) and the domains.
pub struct SchedControl {
    driver: Option<Arc<CreditDriver>>,
    domains: Vec<(Domain, Arc<VcpuControl>)>,
}

impl SchedControl {
    pub fn new(
        driver: Option<Arc<CreditDriver>>,
        domains: Vec<(Domain, Arc<VcpuControl>)>,
    ) -> SchedControl {
        SchedControl { driver, domains }
    }
}

/// A kumo whose only control is its scheduler's (a single VM started with `--sched`
/// and no API socket of its own).
impl Controlled for SchedControl {
    fn sched(&self) -> &dyn SchedTarget {
        self
    }
}

impl SchedTarget for SchedControl {
    fn sched_params(&self) -> SchedParams {
        match &self.driver {
            Some(d) => match d.auto_slice() {
                Some(_) => SchedParams {
                    auto_slice: true,
                    ..sched_params::view(d.params())
                },
                None => sched_params::view(d.params()),
            },
            None => SchedParams {
                tslice_ms: 0.0,
                tick_ms: 0.0,
                ratelimit_us: 0,
                accounting: crate::spec::control::Accounting::Exact,
                directed_yield: false,
                auto_slice: false,
            },
        }
    }

    fn set_sched_params(&self, update: SchedUpdate) -> Result<SchedParams, Refused> {
        let driver = self.driver()?;
        // Under auto the update changes its long setting.
        let auto = driver.auto_slice();
        let base = auto.as_ref().map_or_else(|| driver.params(), |a| a.long());
        let params = sched_params::apply(base, update).map_err(|e| Refused::bad(e.to_string()))?;
        let fixes_slice =
            update.tslice_ms.is_some() || update.tick_ms.is_some() || update.ratelimit_us.is_some();
        let auto_on = update.auto_slice.unwrap_or(auto.is_some() && !fixes_slice);
        driver
            .set_params(params)
            .map_err(|e| Refused::bad(e.to_string()))?;
        if auto_on {
            driver.set_auto(true);
        }
        Ok(SchedTarget::sched_params(self))
    }

    fn domains(&self) -> Vec<DomainInfo> {
        match &self.driver {
            Some(d) => d
                .domains()
                .into_iter()
                .map(|v| DomainInfo {
                    domain: v.name,
                    weight: u32::from(v.weight),
                    cap: v.cap,
                    vcpus: v.vcpus,
                    cpu_s: v.cpu.as_secs_f64(),
                    progress: None,
                })
                .collect(),
            None => self
                .domains
                .iter()
                .map(|(d, control)| DomainInfo {
                    domain: d.name.clone(),
                    weight: d.weight,
                    cap: d.cap,
                    vcpus: d.vcpus,
                    cpu_s: (0..control.vcpus())
                        .filter_map(|v| control.cpu_time(v))
                        .sum::<Duration>()
                        .as_secs_f64(),
                    progress: None,
                })
                .collect(),
        }
    }

    fn vcpu_balloon(
        &self,
        domain: Option<&str>,
        active: Option<u32>,
    ) -> Result<BalloonState, Refused> {
        let names = || {
            let names: Vec<&str> = self.domains.iter().map(|(d, _)| d.name.as_str()).collect();
            names.join(", ")
        };
        let Some(name) = domain else {
            return Err(Refused::bad(format!(
                "vcpu-balloon: name the node's domain with --domain ({})",
                names()
            )));
        };
        let (_, control) = self
            .domains
            .iter()
            .find(|(d, _)| d.name == name)
            .ok_or_else(|| {
                Refused::not_found(format!(
                    "vcpu-balloon: no domain '{name}' (the node has {})",
                    names()
                ))
            })?;
        api::vcpu_balloon_of(control, active)
    }

    fn set_domain(
        &self,
        name: &str,
        weight: Option<u32>,
        cap: Option<u32>,
    ) -> Result<DomainInfo, Refused> {
        let driver = self.driver()?;
        let weight = match weight {
            Some(w) if !(config::WEIGHT_RANGE.0..=config::WEIGHT_RANGE.1).contains(&w) => {
                return Err(Refused::bad(format!(
                    "weight {w} is outside {}..={}",
                    config::WEIGHT_RANGE.0,
                    config::WEIGHT_RANGE.1
                )));
            }
            Some(w) => Some(w as u16),
            None => None,
        };
        let v = driver
            .set_domain(name, weight, cap)
            .map_err(|e| Refused::bad(e.to_string()))?;
        Ok(DomainInfo {
            domain: v.name,
            weight: u32::from(v.weight),
            cap: v.cap,
            vcpus: v.vcpus,
            cpu_s: v.cpu.as_secs_f64(),
            progress: None,
        })
    }

    fn info(&self) -> VmInfo {
        // Without domains of its own this serves a single VM under `--sched`: the
        // driver knows its vCPUs.
        let (kind, vcpus, domains) = if self.domains.is_empty() {
            let vcpus = SchedTarget::domains(self)
                .iter()
                .filter(|d| d.domain != hv::credit::DOM0_NAME)
                .map(|d| d.vcpus)
                .sum();
            (RunKind::Vm, vcpus, 1)
        } else {
            (
                RunKind::Node,
                self.domains.iter().map(|(d, _)| d.vcpus).sum(),
                u32::try_from(self.domains.len()).unwrap_or(u32::MAX),
            )
        };
        VmInfo {
            kind,
            state: RunState::Running,
            vcpus,
            domains,
            pid: std::process::id(),
            credit_scheduler: self.driver.is_some(),
        }
    }

    fn counters(&self) -> Counters {
        Counters {
            vcpus: self
                .domains
                .iter()
                .flat_map(|(d, control)| api::vcpu_counters(control, Some(&d.name)))
                .collect(),
        }
    }
}

impl SchedControl {
    fn driver(&self) -> Result<&Arc<CreditDriver>, Refused> {
        self.driver.as_ref().ok_or_else(|| {
            Refused::conflict("this kumo has no credit scheduler (scheduler kind = host)")
        })
    }
}
