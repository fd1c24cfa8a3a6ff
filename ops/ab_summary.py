#!/usr/bin/env python3
"""Before / after table of alternated engine bench runs, from their criterion medians.

    python3 ops/ab_summary.py DIR

DIR holds `{before,after}-R-dD.medians.md` (round R, dimension D; each the output of
ops/criterion_medians.py for one run) and optionally `aa-after-{1,2}-dD.medians.md`, an
A/A pair of one binary run back to back (the noise floor). Prints, per dimension, each
row's medians per round, the median over rounds of each side, their ratio and the A/A
pair's ratio.
"""
import os
import re
import statistics
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "bench/results/insert-visibility"
runs = {}  # (name, round, dim) -> {(group, bench): median}
for f in sorted(os.listdir(root)):
    m = re.fullmatch(r"(before|after|aa-after)-(\d+)-d(\d+)\.medians\.md", f)
    if not m:
        continue
    rows = {}
    for line in open(os.path.join(root, f)):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("engine_"):
            label = cells[0].rsplit("_", 2)[-2] + "_" + cells[0].rsplit("_", 1)[-1]
            rows[(label, cells[1])] = float(cells[2])
    runs[(m.group(1), int(m.group(2)), int(m.group(3)))] = rows

for dim in sorted({d for (_, _, d) in runs}):
    rounds = sorted({r for (n, r, d) in runs if d == dim and n == "before"})
    print(f"\n### d = {dim}\n")
    print("| filter state | row | before (rounds) | after (rounds) | before | after | after / before | A/A |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    keys = sorted({k for (n, r, d), rows in runs.items() if d == dim for k in rows})
    for key in keys:
        b = [runs[("before", r, dim)].get(key) for r in rounds if ("before", r, dim) in runs]
        a = [runs[("after", r, dim)].get(key) for r in rounds if ("after", r, dim) in runs]
        b = [x for x in b if x is not None]
        a = [x for x in a if x is not None]
        if not b or not a:
            continue
        mb, ma = statistics.median(b), statistics.median(a)
        aa = [runs.get(("aa-after", i, dim), {}).get(key) for i in (1, 2)]
        aa_ratio = f"{aa[1] / aa[0]:.2f}" if None not in aa else ""
        fmt = lambda xs: " ".join(f"{x:.2f}" for x in xs)
        print(f"| {key[0]} | {key[1]} | {fmt(b)} | {fmt(a)} | {mb:.2f} | {ma:.2f} | "
              f"{ma / mb:.2f} | {aa_ratio} |")
