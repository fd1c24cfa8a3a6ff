#!/usr/bin/env python3
"""Medians (and means) of the last criterion run, from target/criterion/*/new/estimates.json.

    python3 ops/criterion_medians.py [target/criterion]

Criterion's console line is the mean; the engine's targets are medians, and rare spikes
(filter rotation re-inserting a generation's survivors) move the mean far more.
"""
import json
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "target/criterion"
rows = []
for group in sorted(os.listdir(root)):
    gdir = os.path.join(root, group)
    if not os.path.isdir(gdir) or group == "report":
        continue
    for bench in sorted(os.listdir(gdir)):
        bdir = os.path.join(gdir, bench)
        if not os.path.isdir(bdir) or bench == "report":
            continue
        for param in sorted(os.listdir(bdir)):
            est = os.path.join(bdir, param, "new", "estimates.json")
            if os.path.exists(est):
                d = json.load(open(est))
                rows.append((group, bench, d["median"]["point_estimate"] / 1e3,
                             d["mean"]["point_estimate"] / 1e3))
print("| group | benchmark | median µs | mean µs |")
print("|---|---|---:|---:|")
for g, b, med, mean in rows:
    print(f"| {g} | {b} | {med:.2f} | {mean:.2f} |")
