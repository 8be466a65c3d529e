//! What a running kumo's control socket serves: the credit scheduler's parameters and
//! its domains' weights and caps (nodes, and single VMs under `--sched`). Apart from
//! `node` and `run` so that both use it and neither depends on the other for it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use hv::credit::CreditDriver;
use hv::placement::{ThreadGroup, VcpuControl};

use crate::ctl::{self, Controlled, DomainInfo, SchedParams, SchedUpdate};
use crate::spec::node::{self as config, Domain};
use crate::spec::sched as sched_params;

/// Serves the control socket at `path` for a scheduler (or, without one, for domains
/// the host schedules), and says where it is.
pub fn serve(
    driver: Option<Arc<CreditDriver>>,
    domains: Vec<(Domain, Arc<VcpuControl>)>,
    path: &std::path::Path,
    dom0: Arc<ThreadGroup>,
) -> Result<ctl::Server> {
    let control = Arc::new(SchedControl::new(driver, domains));
    // The socket's thread is part of domain 0 (scheduled with it).
    let server = ctl::Server::start(path, control, move || dom0.join_current())?;
    eprintln!("kumo: control socket {}", server.path().display());
    Ok(server)
}

/// What the control socket sees: the credit driver (if any) and the domains.
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

impl Controlled for SchedControl {
    fn sched_params(&self) -> SchedParams {
        match &self.driver {
            Some(d) => sched_params::view(d.params()),
            None => SchedParams {
                tslice_ms: 0.0,
                tick_ms: 0.0,
                ratelimit_us: 0,
                accounting: crate::ctl::Accounting::Exact,
                directed_yield: false,
            },
        }
    }

    fn set_sched_params(&self, update: SchedUpdate) -> Result<SchedParams, String> {
        let driver = self
            .driver
            .as_ref()
            .ok_or("this node has no credit scheduler (scheduler kind = host)")?;
        let params = sched_params::apply(driver.params(), update).map_err(|e| e.to_string())?;
        driver.set_params(params).map_err(|e| e.to_string())?;
        Ok(sched_params::view(params))
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
                })
                .collect(),
        }
    }

    fn vcpu_balloon(
        &self,
        domain: Option<&str>,
        active: Option<u32>,
    ) -> Result<ctl::BalloonState, String> {
        let names = || {
            let names: Vec<&str> = self.domains.iter().map(|(d, _)| d.name.as_str()).collect();
            names.join(", ")
        };
        let Some(name) = domain else {
            return Err(format!(
                "vcpu-balloon: name the node's domain with --domain ({})",
                names()
            ));
        };
        let (_, control) = self
            .domains
            .iter()
            .find(|(d, _)| d.name == name)
            .ok_or_else(|| {
                format!(
                    "vcpu-balloon: no domain '{name}' (the node has {})",
                    names()
                )
            })?;
        ctl::vcpu_balloon_of(control, active)
    }

    fn set_domain(
        &self,
        name: &str,
        weight: Option<u32>,
        cap: Option<u32>,
    ) -> Result<DomainInfo, String> {
        let driver = self
            .driver
            .as_ref()
            .ok_or("this node has no credit scheduler (scheduler kind = host)")?;
        let weight = match weight {
            Some(w) if !(config::WEIGHT_RANGE.0..=config::WEIGHT_RANGE.1).contains(&w) => {
                return Err(format!(
                    "weight {w} is outside {}..={}",
                    config::WEIGHT_RANGE.0,
                    config::WEIGHT_RANGE.1
                ));
            }
            Some(w) => Some(w as u16),
            None => None,
        };
        let v = driver
            .set_domain(name, weight, cap)
            .map_err(|e| e.to_string())?;
        Ok(DomainInfo {
            domain: v.name,
            weight: u32::from(v.weight),
            cap: v.cap,
            vcpus: v.vcpus,
            cpu_s: v.cpu.as_secs_f64(),
        })
    }
}
