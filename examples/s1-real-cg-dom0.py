#!/usr/bin/env python3
"""Real CG.W runs of S1's node for docs/results/2026-11-28-sim-loaded-dom0.md: node files as
lab/src/experiment/s1.rs's rank_node_toml writes them, plus [dom0] frame_cost_us; rounds
outermost, then costs, then scenarios (interleaved). One JSON line per run (kumo node --json).

    examples/s1-real-cg-dom0.py KUMO ROUNDS COSTS   e.g. target/release/kumo 2 0,400,1000
"""
import json, os, subprocess, sys, tempfile
kumo, rounds = sys.argv[1], int(sys.argv[2])
costs = [int(c) for c in sys.argv[3].split(",")]
scen = [("30/10", 30, 10, 256), ("1/1", 1, 1, 256), ("1/1-w1024", 1, 1, 1024), ("30/10-w64", 30, 10, 64)]
def toml(ts, tick, w, cost):
    dom = "".join(f'[[domain]]\nname = "u{i}"\nmpi = true\nranks_per_vcpu = 2\nguest_hz = 250\n' for i in range(2))
    return (f'pcpus = [0, 1]\n[scheduler]\nkind = "credit"\ntslice_ms = {ts}\ntick_ms = {tick}\n'
            f'ratelimit_us = 0\naccounting = "tick"\n[dom0]\nweight = {w}\nframe_cost_us = {cost}\n'
            f'[network]\nnpb = "cg.W"\nwait = "spin"\n{dom}')
for r in range(1, rounds + 1):
    for c in costs:
        for name, ts, tick, w in scen:
            with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
                f.write(toml(ts, tick, w, c))
            out = subprocess.run([kumo, "node", "--config", f.name, "--json"], capture_output=True, text=True)
            os.unlink(f.name)
            print(json.dumps({"cost": c, "scenario": name, "round": r, "rc": out.returncode,
                              "stdout": out.stdout[-6000:], "stderr": out.stderr[-500:]}), flush=True)
