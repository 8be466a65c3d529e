//! `--kvm-stats`: what KVM counted inside the kernel for a VM that ended (exits,
//! halts, page faults, TLB flushes), beside kumo's own report: the exits that never
//! reach kumo, which are most of a guest's exits.

use hv::kvm_stats::{Counter, KvmStats};
use std::collections::BTreeMap;

use serde::Serialize;

/// `--kvm-stats`'s JSON line: `{"kvm_stats":{"vm":{..},"vcpus":[{..},..]}}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvmStatsLine {
    pub kvm_stats: KvmStatsJson,
}

/// Every counter by KVM's name: the VM's, and each vCPU's (index = vCPU).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvmStatsJson {
    pub vm: BTreeMap<String, u64>,
    pub vcpus: Vec<BTreeMap<String, u64>>,
}

/// Prints `stats` on stdout: a table of the counters that are not zero everywhere
/// (a column for the VM and one per vCPU), or one JSON line with all of them.
pub fn print(stats: &KvmStats, json: bool) {
    if stats.vm.is_empty() && stats.vcpus.iter().all(Vec::is_empty) {
        eprintln!("kumo: KVM on this host gave no statistics (KVM_GET_STATS_FD needs Linux 5.14)");
    }
    if json {
        crate::output::json_line(&to_json(stats));
    } else {
        crate::out!("{}", table(stats));
    }
}

fn to_json(stats: &KvmStats) -> KvmStatsLine {
    let object = |counters: &[Counter]| -> BTreeMap<String, u64> {
        counters.iter().map(|c| (c.name.clone(), c.value)).collect()
    };
    KvmStatsLine {
        kvm_stats: KvmStatsJson {
            vm: object(&stats.vm),
            vcpus: stats.vcpus.iter().map(|c| object(c)).collect(),
        },
    }
}

fn table(stats: &KvmStats) -> String {
    let columns: Vec<&[Counter]> = std::iter::once(stats.vm.as_slice())
        .chain(stats.vcpus.iter().map(Vec::as_slice))
        .collect();
    let mut names: Vec<&str> = Vec::new();
    for counter in columns.iter().flat_map(|c| c.iter()) {
        if counter.value != 0 && !names.contains(&counter.name.as_str()) {
            names.push(&counter.name);
        }
    }
    let mut header = vec!["KVM counter".to_string(), "vm".to_string()];
    header.extend((0..stats.vcpus.len()).map(|v| format!("vcpu{v}")));
    let mut rows = vec![header];
    for name in names {
        let mut row = vec![name.to_string()];
        row.extend(columns.iter().map(|counters| {
            counters
                .iter()
                .find(|c| c.name == name)
                .map_or("-".to_string(), |c| c.value.to_string())
        }));
        rows.push(row);
    }
    crate::output::table(&rows, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(pairs: &[(&str, u64)]) -> Vec<Counter> {
        pairs
            .iter()
            .map(|&(name, value)| Counter {
                name: name.into(),
                value,
            })
            .collect()
    }

    fn stats() -> KvmStats {
        KvmStats {
            vm: counters(&[("remote_tlb_flush", 1), ("mmu_recycled", 0)]),
            vcpus: vec![
                counters(&[("exits", 8148), ("halt_exits", 12), ("nmi_injections", 0)]),
                counters(&[("exits", 7338), ("halt_exits", 0), ("nmi_injections", 0)]),
            ],
        }
    }

    #[test]
    fn the_table_has_a_column_per_vcpu_and_drops_counters_zero_everywhere() {
        let text = table(&stats());
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0], ["KVM", "counter", "vm", "vcpu0", "vcpu1"]);
        assert!(lines.contains(&vec!["remote_tlb_flush", "1", "-", "-"]));
        assert!(lines.contains(&vec!["exits", "-", "8148", "7338"]));
        assert!(lines.contains(&vec!["halt_exits", "-", "12", "0"]));
        assert!(!text.contains("nmi_injections") && !text.contains("mmu_recycled"));
    }

    #[test]
    fn json_keeps_every_counter() {
        let value = serde_json::to_value(to_json(&stats())).unwrap();
        assert_eq!(value["kvm_stats"]["vm"]["mmu_recycled"], 0);
        assert_eq!(value["kvm_stats"]["vcpus"][1]["exits"], 7338);
        assert_eq!(value["kvm_stats"]["vcpus"].as_array().unwrap().len(), 2);
    }
}
