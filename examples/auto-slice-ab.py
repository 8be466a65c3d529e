#!/usr/bin/env python3
"""The auto slice (`tslice_ms = "auto"`) against fixed slices on real VMs: for each
shape, benchmark and setting one `kumo node` run, rounds interleaved (settings inside
benchmarks inside shapes inside rounds). Xen 3.4.2's accounting (tick, no ratelimit),
domain 0 at 256, spin-waiting ranks on host CPUs 0-1.

Shapes:
  s1    S1's node: 2 DomUs x 1 vCPU x 2 ranks (guest tick 250 Hz), as `kumo experiment s1`
  over  oversubscribed: 4 DomUs x 1 vCPU x 1 rank on the 2 CPUs (the old s1 shape,
        where 1 ms wins: every message waits for a slice at 30 ms)
  s1loaded  S1's node with the loaded domain 0 of `kumo experiment s1 --dom0 loaded`
        ([dom0] frame_cost_us = 300), where 1/1 is slower than 30/10
Settings: 30/10, 1/1 (slice/tick ms) and auto (its long setting 30/10).

    examples/auto-slice-ab.py KUMO SHAPES BENCHES [ROUNDS [SVG]]
    examples/auto-slice-ab.py target/release/kumo s1,over cg.W,ep.A 3 auto.svg

One JSON line a run, then a table of medians: each setting's time, auto over the best
fixed setting, and the share of auto's epochs in the short setting. SVG: the slice
auto chose over time in each shape's and benchmark's first auto run.
"""
import json
import statistics
import subprocess
import sys
import tempfile

SETTINGS = {"30/10": (30, 10), "1/1": (1, 1), "auto": ('"auto"', 10)}


def node_toml(shape, npb, setting):
    tslice, tick = SETTINGS[setting]
    text = (
        f'pcpus = [0, 1]\n[scheduler]\nkind = "credit"\ntslice_ms = {tslice}\n'
        f'tick_ms = {tick}\nratelimit_us = 0\naccounting = "tick"\n'
        f'[dom0]\nweight = 256\n'
    )
    if shape == "s1loaded":
        text += "frame_cost_us = 300\n"
    text += f'[network]\nnpb = "{npb}"\nwait = "spin"\n'
    if shape in ("s1", "s1loaded"):
        domains, extra = 2, "ranks_per_vcpu = 2\nguest_hz = 250\n"
    else:
        domains, extra = 4, ""
    for i in range(domains):
        text += f'[[domain]]\nname = "u{i}"\nmpi = true\n{extra}'
    return text


def run(kumo, path):
    out = subprocess.run(
        [kumo, "node", "--config", path, "--json"], capture_output=True, text=True
    )
    found = {"time": None, "verified": False, "short_share": None, "changes": None,
             "timeline": None}
    for line in out.stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        for result in item.get("results", []):
            found["time"], found["verified"] = result["time_s"], result["verified"]
        auto = item.get("auto_slice") if item.get("node") else None
        if auto:
            found["short_share"] = auto["short_epochs"] / max(auto["epochs"], 1)
            found["changes"] = len(auto["changes"])
            # (seconds, slice ms) from the start to the last epoch decided.
            found["timeline"] = [(0.0, 30.0)] + [
                (c["at_s"], c["tslice_ms"]) for c in auto["changes"]
            ] + [(auto["epochs"] * auto["epoch_ms"] / 1e3, None)]
    return found


def svg(rows, path):
    """Each shape's and benchmark's first auto run: its slice over time, a bar per
    setting (long: grey, 1 ms: blue)."""
    runs = []
    for x in rows:
        key = (x["shape"], x["npb"])
        if x["setting"] == "auto" and x["timeline"] and key not in [k for k, _ in runs]:
            runs.append((key, x["timeline"]))
    if not runs:
        return
    end = max(t[-1][0] for _, t in runs) or 1.0
    left, width, row = 150, 600, 28
    height = 60 + row * len(runs)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" '
           f'height="{height}" font-family="sans-serif" font-size="12">',
           f'<text x="10" y="18">The slice the auto slice chose over time '
           f'(grey: its long setting, 30 ms; blue: 1 ms)</text>']
    for i, ((shape, npb), timeline) in enumerate(runs):
        y = 35 + i * row
        out.append(f'<text x="10" y="{y + 14}">{shape} {npb}</text>')
        for (t0, ms), (t1, _) in zip(timeline, timeline[1:]):
            x0, x1 = left + width * t0 / end, left + width * t1 / end
            color = "#3465a4" if ms is not None and ms <= 1.0 else "#babdb6"
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 0.5):.1f}" '
                       f'height="18" fill="{color}"/>')
    axis = 40 + row * len(runs)
    out.append(f'<line x1="{left}" y1="{axis}" x2="{left + width}" y2="{axis}" stroke="black"/>')
    for k in range(6):
        x = left + width * k / 5
        out.append(f'<text x="{x:.1f}" y="{axis + 14}" text-anchor="middle">'
                   f'{end * k / 5:.1f} s</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    if len(sys.argv) not in (4, 5, 6):
        sys.exit(__doc__)
    kumo, shapes, benches = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    rounds = int(sys.argv[4]) if len(sys.argv) >= 5 else 3
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for shape in shapes:
                for npb in benches:
                    for setting in SETTINGS:
                        path = f"{tmp}/node.toml"
                        with open(path, "w") as f:
                            f.write(node_toml(shape, npb, setting))
                        found = run(kumo, path)
                        row = {"round": r, "shape": shape, "npb": npb, "setting": setting, **found}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        print(f"round {r + 1}/{rounds} {shape} {npb} {setting}: {found['time']}",
                              file=sys.stderr, flush=True)
    print("shape  bench  30/10 (s)  1/1 (s)  auto (s)  auto/best  auto short share  verified")
    for shape in shapes:
        for npb in benches:
            med = {}
            ok = True
            for setting in SETTINGS:
                mine = [x for x in rows if x["shape"] == shape and x["npb"] == npb
                        and x["setting"] == setting]
                times = [x["time"] for x in mine if x["verified"]]
                ok = ok and len(times) == len(mine)
                med[setting] = statistics.median(times) if times else float("nan")
            shares = [x["short_share"] for x in rows if x["shape"] == shape
                      and x["npb"] == npb and x["setting"] == "auto" and x["short_share"] is not None]
            best = min(med["30/10"], med["1/1"])
            print(f"{shape:5}  {npb:5}  {med['30/10']:9.3f}  {med['1/1']:7.3f}  {med['auto']:8.3f}"
                  f"  {med['auto'] / best:9.3f}  {statistics.median(shares) if shares else float('nan'):16.2f}"
                  f"  {ok}")
    if len(sys.argv) == 6:
        svg(rows, sys.argv[5])


if __name__ == "__main__":
    main()
