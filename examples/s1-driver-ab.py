#!/usr/bin/env python3
"""A/B of two kumo builds on S1's node (docs/results/2026-11-29-driver-sensing.md): the
node files lab/src/experiment/s1.rs's rank_node_toml wrote for the loaded domain 0
when those results were taken (300 us a frame; `s1` has charged per TCP segment since,
docs/results/2026-11-29-s1-dom0-per-segment.md) and yielding ranks; rounds outermost, then benchmarks, scenarios and
builds interleaved. One JSON line per run: the benchmark's time, the credit driver's
runs and CPU.

    examples/s1-driver-ab.py ROUNDS BENCHES PCPUS A=KUMO_A B=KUMO_B
    e.g. examples/s1-driver-ab.py 3 cg.W,bt.S,sp.S 0,1 old=/tmp/kumo-old new=target/release/kumo

A build's command may carry a prefix, and `@PLACE` after it sets the node file's
`[scheduler] driver` (auto, beside, node). On a node of CPU 0 alone:
`beside=kumo@beside on-node=kumo@node` runs the credit driver on CPU 1, then on CPU 0;
`on-node="taskset -c 0 kumo"` gets the second by leaving the process no CPU to spare.
"""
import json, os, subprocess, sys, tempfile

rounds, benches, pcpus = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
builds = [a.split("=", 1) for a in sys.argv[4:]]
scenarios = [("30/10", 30, 10, 256), ("1/1", 1, 1, 256), ("1/1-w1024", 1, 1, 1024)]


def toml(bench, ts, tick, weight, driver):
    doms = "".join(
        f'[[domain]]\nname = "u{i}"\nmpi = true\nranks_per_vcpu = 2\nguest_hz = 250\n'
        for i in range(2)
    )
    return (
        f'pcpus = [{pcpus}]\n[scheduler]\nkind = "credit"\ntslice_ms = {ts}\ntick_ms = {tick}\n'
        f'ratelimit_us = 0\naccounting = "tick"\ndriver = "{driver}"\n[dom0]\nweight = {weight}\nframe_cost_us = 300\n'
        f'[network]\nnpb = "{bench}"\nwait = "yield"\n{doms}'
    )


for r in range(1, rounds + 1):
    for bench in benches:
        for name, ts, tick, weight in scenarios:
            for build, spec in builds:
                kumo, _, driver = spec.partition("@")
                with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
                    f.write(toml(bench, ts, tick, weight, driver or "auto"))
                out = subprocess.run(
                    [*kumo.split(), "node", "--config", f.name, "--json"], capture_output=True, text=True
                )
                os.unlink(f.name)
                row = {"round": r, "bench": bench, "scenario": name, "build": build,
                       "rc": out.returncode}
                for line in out.stdout.splitlines():
                    d = json.loads(line)
                    for res in d.get("results", []):
                        row["time_s"] = res["time_s"]
                        row["verified"] = res["verified"]
                    if d.get("node"):
                        row["driver"] = d["credit_driver"]
                        row["wall_s"] = d["wall_s"]
                        row["dom0_cpu_s"] = d["dom0_cpu_s"]
                print(json.dumps(row), flush=True)
