#!/usr/bin/env python3
"""Sweep one knob of a `kumo sim` file and print each program's speed-ups.

    examples/sim-sweep.py KUMO CONFIG KEY=V1,V2,... [KEY2=...]

Every line `KEY = ...` of CONFIG (all nodes', all sections') is set to each value in
turn (several KEY=... sweep together, value by value; the key `compute*` multiplies
every `compute:MS` phase instead), `KUMO sim --json` runs the
result, and one row per value gives, per program, the first scenario's simulated
time (and domain 0's CPU in it) and every other scenario's speed-up over it, with the
messages lost for a full receive ring where the file models one (the simulator's own numbers; this
script only rewrites the file and tabulates). Used by
docs/results/2026-11-28-s1-what-it-takes.md.
"""
import json
import re
import subprocess
import sys
import tempfile


def usage():
    sys.stderr.write(__doc__)
    sys.exit(2)


def value_of(sweeps, i):
    return " ".join(v[i] for _, v in sweeps)


def main():
    if len(sys.argv) < 4:
        usage()
    kumo, config = sys.argv[1], sys.argv[2]
    sweeps = []
    for arg in sys.argv[3:]:
        if "=" not in arg:
            usage()
        key, values = arg.split("=", 1)
        sweeps.append((key, values.split(",")))
    count = len(sweeps[0][1])
    if any(len(v) != count for _, v in sweeps):
        sys.stderr.write("sim-sweep: every KEY needs as many values\n")
        sys.exit(2)
    text = open(config).read()
    header = None
    for i in range(count):
        changed = text
        for key, values in sweeps:
            if key == "compute*":
                # Every `compute:MS` phase times the value (a coarser grain of work).
                factor = float(values[i])
                changed = re.sub(
                    r"compute:([0-9.]+)",
                    lambda m: f"compute:{float(m.group(1)) * factor:.4f}",
                    changed,
                )
                continue
            pattern = re.compile(rf"^{re.escape(key)} = .*$", re.M)
            if not pattern.search(changed):
                sys.stderr.write(f"sim-sweep: no line '{key} = ...' in {config}\n")
                sys.exit(2)
            changed = pattern.sub(f"{key} = {values[i]}", changed)
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
            f.write(changed)
            f.flush()
            done = subprocess.run(
                [kumo, "sim", "--config", f.name, "--json"],
                capture_output=True, text=True,
            )
        if done.returncode != 0:
            sys.stderr.write(f"sim-sweep: {value_of(sweeps, i)}: {done.stderr}")
            sys.exit(1)
        out = done.stdout
        runs = json.loads(out)["runs"]
        programs = list(dict.fromkeys(r["program"] for r in runs))
        cells, names = [], []

        def lost(r):
            # Messages lost for a full receive ring (files with rx_ring_frames).
            n = r.get("lost_messages")
            return "" if n is None else f" [lost {n}]"

        for p in programs:
            mine = [r for r in runs if r["program"] == p]
            base = mine[0]
            names.append(f"{p} {base['scenario']} s (dom0 s)")
            cells.append(f"{base['time_s']:.3f} ({base['dom0_cpu_s']:.3f}){lost(base)}")
            for r in mine[1:]:
                names.append(f"{p} {r['scenario']}")
                cells.append(f"{(r['speedup'] - 1) * 100:+.1f} %{lost(r)}")
        keys = " ".join(k for k, _ in sweeps)
        if header is None:
            header = [keys] + names
            print("| " + " | ".join(header) + " |")
            print("|" + "---|" * len(header))
        value = value_of(sweeps, i)
        print("| " + " | ".join([value] + cells) + " |")


if __name__ == "__main__":
    main()
