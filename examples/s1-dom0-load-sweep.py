#!/usr/bin/env python3
"""S1's node under `kumo node` with a loaded domain 0: for each domain-0 cost in
COSTS (`F`: `[dom0] frame_cost_us = F`; `F+K`: also `kib_cost_us = K`), each
benchmark and each scheduler setting, one run, rounds interleaved (settings inside
benchmarks inside costs inside rounds). One JSON line a run: time
(rank 0's), verified, domain 0's CPU, the switch's frames and bytes, and the ranks'
timeouts and resent frames (summed). The node file
is the one `kumo experiment s1` writes (lab/src/experiment/s1.rs, rank_node_toml); the
ranks' wait is `WAIT` from the environment (default `yield`, as `s1`'s). KUMO may be
a comma-separated list of binaries (an A/B of two builds): each runs every item in
turn, inside the settings.

    examples/s1-dom0-load-sweep.py KUMO COSTS BENCHES SETTINGS [ROUNDS]
    examples/s1-dom0-load-sweep.py target/release/kumo 200,250,300 \\
        cg.W,sp.S,bt.S,ep.A 30:10:256,30:10:64 3
    examples/s1-dom0-load-sweep.py target/release/kumo 0,300,20+30 lu.S 30:10:256,1:1:256
    examples/s1-dom0-load-sweep.py OLD/kumo,NEW/kumo 100+70.718 cg.W 30:10:256,1:1:256 2

SETTINGS are SLICE_MS:TICK_MS:DOM0_WEIGHT (Xen 3.4.2: tick accounting, no ratelimit).
"""
import json
import os
import subprocess
import sys
import tempfile


def node_toml(npb, tslice, tick, weight, cost):
    text = (
        f'pcpus = [0, 1]\n[scheduler]\nkind = "credit"\ntslice_ms = {tslice}\n'
        f'tick_ms = {tick}\nratelimit_us = 0\naccounting = "tick"\n'
        f"[dom0]\nweight = {weight}\n"
    )
    frame, _, kib = cost.partition("+")
    if float(frame):
        text += f"frame_cost_us = {frame}\n"
    if kib and float(kib):
        text += f"kib_cost_us = {kib}\n"
    wait = os.environ.get("WAIT", "yield")
    text += f'[network]\nnpb = "{npb}"\nwait = "{wait}"\n'
    for i in range(2):
        text += f'[[domain]]\nname = "u{i}"\nmpi = true\nranks_per_vcpu = 2\nguest_hz = 250\n'
    return text


def run(kumo, path):
    out = subprocess.run(
        [kumo, "node", "--config", path, "--json"], capture_output=True, text=True
    )
    found = {"time": None, "verified": False, "dom0": None, "frames": None, "bytes": None,
             "timeouts": 0, "resent": 0}
    for line in out.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        for result in item.get("results", []):
            found["time"], found["verified"] = result["time_s"], result["verified"]
        for probe in item.get("probes", []):
            if probe.get("probe") == "mpistats":
                found["timeouts"] += probe["timeouts"]
                found["resent"] += probe["resent"]
        if item.get("node"):
            found["dom0"] = item["dom0_cpu_s"]
            found["frames"] = item["switch"]["frames"]
            found["bytes"] = item["switch"]["bytes"]
    return found


def main():
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    kumos = sys.argv[1].split(",")
    costs = sys.argv[2].split(",")
    benches = sys.argv[3].split(",")
    settings = [s.split(":") for s in sys.argv[4].split(",")]
    rounds = int(sys.argv[5]) if len(sys.argv) == 6 else 1
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "node.toml")
        for r in range(rounds):
            for cost in costs:
                for bench in benches:
                    for tslice, tick, weight in settings:
                        with open(path, "w") as f:
                            f.write(node_toml(bench, tslice, tick, weight, cost))
                        for kumo in kumos:
                            row = {"round": r, "cost_us": cost, "bench": bench,
                                   "setting": f"{tslice}/{tick} w{weight}"}
                            if len(kumos) > 1:
                                row["kumo"] = kumo
                            row.update(run(kumo, path))
                            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
