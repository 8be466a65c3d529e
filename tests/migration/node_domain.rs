//! A node's domain moving to a standby node (`kumo ctl migrate --domain NAME --to`):
//! S1's migration of a DomU, under the credit scheduler on both sides.

use crate::common;
use crate::migration::{assert_one_line_error, free_port, succeeded, token, wait_listening};

use std::path::{Path, PathBuf};

use common::*;

/// The job: CG.W (4 ranks) six times in a row, seconds of work on one host CPU, so
/// that a migration started once the VMs run lands inside it.
const JOB: &str = "cg.W,cg.W,cg.W,cg.W,cg.W,cg.W";

/// The source node: two domains of 1 vCPU x 2 ranks (ranks 0-1, 2-3) on host CPU 0
/// under the credit scheduler at 1/1 ms, its switch listening on `wire` for the
/// standby node.
fn source_node(name: &str, wire: &Path) -> PathBuf {
    let path = scratch(&format!("{name}-source.toml"));
    let text = format!(
        "pcpus = [0]\n\
         [scheduler]\ntslice_ms = 1\ntick_ms = 1\n\
         [network]\nnpb = \"{JOB}\"\nwait = \"block\"\nwire = \"listen:unix:{}\"\n\
         [[domain]]\nname = \"u0\"\nmpi = true\nranks_per_vcpu = 2\n\
         [[domain]]\nname = \"u1\"\nmpi = true\nranks_per_vcpu = 2\n",
        wire.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The standby node: host CPU 1, no domain of its own but one waiting at each of
/// `incoming` (name, port), its switch connected to the source's by `wire`.
fn standby_node(name: &str, wire: &Path, secret: &Path, incoming: &[(&str, u16)]) -> PathBuf {
    let path = scratch(&format!("{name}-standby.toml"));
    let mut text = format!(
        "pcpus = [1]\n\
         [scheduler]\ntslice_ms = 1\ntick_ms = 1\n\
         [network]\njob_size = 4\nwire = \"unix:{}\"\n",
        wire.display()
    );
    for (domain, port) in incoming {
        text.push_str(&format!(
            "[[domain]]\nname = \"{domain}\"\nweight = 512\n\
             incoming = \"tcp:127.0.0.1:{port}\"\ntoken_file = \"{}\"\n",
            secret.display()
        ));
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn node(config: &Path, socket: &Path) -> Background {
    kumo_background(&[
        "node",
        "--config",
        config.to_str().unwrap(),
        "--ctl-socket",
        socket.to_str().unwrap(),
        "--json",
    ])
}

/// `kumo ctl --json migrate --domain NAME --to tcp:127.0.0.1:PORT` with `options`,
/// retried while the domain's VM has not started yet.
fn migrate_domain(
    socket: &Path,
    domain: &str,
    port: u16,
    secret: &Path,
    options: &[&str],
) -> std::process::Output {
    let to = format!("tcp:127.0.0.1:{port}");
    common::migrate_once_running(socket, &["--domain", domain, "--to", &to], secret, options)
}

/// The node's JSON line of `domain`.
fn domain_line<'a>(lines: &'a [serde_json::Value], domain: &str) -> &'a serde_json::Value {
    lines
        .iter()
        .find(|l| l["domain"] == domain)
        .unwrap_or_else(|| panic!("no line of domain {domain}: {lines:?}"))
}

/// Rank 0's domain's results: a verified row of 4 ranks for every kernel of [`JOB`].
fn assert_job_verified(line: &serde_json::Value) {
    assert_eq!(line["ok"], true, "{line}");
    let results = line["results"].as_array().unwrap();
    assert_eq!(results.len(), JOB.split(',').count(), "{line}");
    for row in results {
        assert_eq!(row["benchmark"], "cg", "{row}");
        assert_eq!(row["ranks"], 4, "{row}");
        assert_eq!(row["verified"], true, "{row}");
    }
}

/// Moves `moves` (domain, extra `kumo ctl migrate` options) of the source node to the
/// standby node, one after the other, while the job runs; returns both nodes' JSON
/// lines.
fn move_domains(
    name: &str,
    moves: &[(&str, &[&str])],
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let wire = scratch(&format!("{name}.wire"));
    let source_socket = scratch(&format!("{name}-source.sock"));
    let standby_socket = scratch(&format!("{name}-standby.sock"));
    let secret = token(&format!("{name}.token"), "node secret");
    let ports: Vec<u16> = moves.iter().map(|_| free_port()).collect();
    let incoming: Vec<(&str, u16)> = moves.iter().map(|m| m.0).zip(ports.clone()).collect();
    let standby = node(
        &standby_node(name, &wire, &secret, &incoming),
        &standby_socket,
    );
    for &port in &ports {
        wait_listening(port);
    }
    let source = node(&source_node(name, &wire), &source_socket);
    wait_for_path(&source_socket);
    for ((domain, options), &port) in moves.iter().zip(&ports) {
        let ctl = migrate_domain(&source_socket, domain, port, &secret, options);
        assert!(ctl.status.success(), "kumo ctl: {}", text(&ctl.stderr));
        let reply: serde_json::Value = serde_json::from_slice(&ctl.stdout).unwrap();
        assert_eq!(reply["ok"], true, "{reply}");
        assert_eq!(reply["domain"], *domain, "{reply}");
        assert!(reply["total_bytes"].as_u64().unwrap() > 0, "{reply}");
    }
    let source = succeeded(&source.finish(), "source node");
    let standby_out = standby.finish();
    assert!(
        text(&standby_out.stderr).contains("arrived"),
        "{}",
        text(&standby_out.stderr)
    );
    let standby = succeeded(&standby_out, "standby node");
    (source, standby)
}

#[test]
#[ignore = "slow (25 s in a debug build): .ci/run runs it with --include-ignored"]
fn a_nodes_domain_moves_live_to_a_standby_node_and_the_job_verifies() {
    if !kvm_available() {
        return;
    }
    let _turn = take_turn();
    let (source, standby) = move_domains("node-live", &[("u1", &[])]);
    // The source shows ranks 2-3's domain as gone, and judges rank 0's results.
    let moved = domain_line(&source, "u1");
    let to = moved["migrated_to"].as_str().unwrap();
    assert!(to.starts_with("tcp:127.0.0.1:"), "{moved}");
    assert_eq!(moved["ok"], true, "{moved}");
    assert_eq!(moved["results"].as_array().unwrap().len(), 0, "{moved}");
    assert_job_verified(domain_line(&source, "u0"));
    // The standby ran it to its end under its own scheduler, with its file's weight.
    let arrived = domain_line(&standby, "u1");
    assert_eq!(arrived["ok"], true, "{arrived}");
    assert_eq!(arrived["weight"], 512, "{arrived}");
    assert!(
        arrived["arrived_on"].as_str().unwrap().starts_with("tcp:"),
        "{arrived}"
    );
    assert!(arrived["cpu_s"].as_f64().unwrap() > 0.0, "{arrived}");
    let node = standby.last().unwrap();
    assert_eq!(node["scheduler"], "credit", "{node}");
    assert!(node["switch"]["frames"].as_u64().unwrap() > 0, "{node}");
}

#[test]
#[ignore = "slow (30 s in a debug build): .ci/run runs it with --include-ignored"]
fn both_domains_move_stopped_and_copied_then_live_and_rank_0_verifies_on_the_standby() {
    if !kvm_available() {
        return;
    }
    let _turn = take_turn();
    let (source, standby) = move_domains("node-both", &[("u0", &["--stop-and-copy"]), ("u1", &[])]);
    for domain in ["u0", "u1"] {
        let moved = domain_line(&source, domain);
        assert!(moved["migrated_to"].is_string(), "{moved}");
        assert_eq!(moved["ok"], true, "{moved}");
        assert_eq!(domain_line(&standby, domain)["ok"], true);
    }
    assert_job_verified(domain_line(&standby, "u0"));
}

#[test]
fn what_cannot_move_is_refused_in_one_line() {
    if !kvm_available() {
        return;
    }
    let _turn = take_turn();
    // A node whose one domain has the interrupt test device: it does not move, and
    // a name it does not have, or none, is refused too.
    let config = scratch("node-refusals.toml");
    std::fs::write(
        &config,
        "pcpus = [0]\n[[domain]]\nname = \"irqd\"\nirq = \"check\"\nidle_ms = 4000\n",
    )
    .unwrap();
    let socket = scratch("node-refusals.sock");
    let secret = token("node-refusals.token", "secret");
    let running = node(&config, &socket);
    wait_for_path(&socket);
    let port = free_port();
    for (domain, needle) in [
        (
            Some("irqd"),
            "migrate --domain irqd: a node's domain with the interrupt test device does not move",
        ),
        (
            Some("nope"),
            "migrate --domain nope: the node has no such domain",
        ),
        (None, "migrate: name the node's domain with --domain (irqd)"),
    ] {
        let to = format!("tcp:127.0.0.1:{port}");
        let mut args = vec!["ctl", "--socket", socket.to_str().unwrap(), "migrate", &to];
        args.extend(["--token-file", secret.to_str().unwrap()]);
        if let Some(domain) = domain {
            args.extend(["--domain", domain]);
        }
        assert_one_line_error(&kumo(&args), "kumo ctl", needle);
    }
    let out = running.finish();
    assert!(out.status.success(), "{}", text(&out.stderr));
}
