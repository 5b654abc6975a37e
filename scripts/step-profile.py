#!/usr/bin/env python3
"""Where one decode step's GPU time goes, from ncu's CSV of per-kernel durations.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv ... > profile.csv
    scripts/step-profile.py profile.csv            # the last whole decode step
    scripts/step-profile.py --prompt profile.csv   # everything up to the first draw

A step is the kernels after one device draw (sample_kernel) up to and including the next:
the last complete one in the file is summed per kernel, longest total first. With --prompt,
the kernels up to and including the first draw (the prompt's forward) are summed instead.
"""
import csv
import re
import sys
from collections import defaultdict


def short_name(name: str) -> str:
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    # The row stream's job source tells its products apart (plain: o, down, lm_head).
    jobs = re.search(r"(Plain|Gated|QkvRope)Jobs", name)
    name = re.split(r"[<(]", name, maxsplit=1)[0]  # template arguments, parameters
    name = name.split("::")[-1].split(" ")[-1].strip()
    return f"{name}[{jobs.group(1).lower()}]" if jobs else name


def main() -> int:
    prompt = "--prompt" in sys.argv[1:]
    path = [arg for arg in sys.argv[1:] if arg != "--prompt"][0]
    rows = []
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not CSV
    for record in csv.DictReader(lines):
        if record.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(record["Metric Value"].replace(",", ""))
        unit = record.get("Metric Unit", "nsecond")
        ns = value * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        rows.append((short_name(record["Kernel Name"]), ns))
    draws = [i for i, (name, _) in enumerate(rows) if name == "sample_kernel"]
    if len(draws) < (1 if prompt else 2):
        print("step-profile: too few device draws in the profile", file=sys.stderr)
        return 1
    step = rows[: draws[0] + 1] if prompt else rows[draws[-2] + 1 : draws[-1] + 1]
    totals, counts = defaultdict(float), defaultdict(int)
    for name, ns in step:
        totals[name] += ns
        counts[name] += 1
    whole = sum(totals.values())
    what = "the prompt" if prompt else "one decode step"
    print(f"{what}: {len(step)} kernels, {whole / 1e6:.3f} ms of kernel time")
    for name, ns in sorted(totals.items(), key=lambda item: -item[1]):
        print(f"  {name:<34} {counts[name]:>5} x {ns / counts[name] / 1e3:8.2f} us = "
              f"{ns / 1e6:7.3f} ms ({100 * ns / whole:4.1f}%)")
    # The step's first kernels in order: the embedding, then whole layers one kernel each.
    if prompt:
        return 0
    print("the step's first kernels, in order:")
    for name, ns in step[:16]:
        print(f"  {name:<34} {ns / 1e3:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
