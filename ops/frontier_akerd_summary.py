#!/usr/bin/env python3
"""The table of ops/frontier-akerd.sh's runs: recall@10 / hit % of paper-Aker (ids only,
Delta 0, its default) and of akerd's configuration under each variant, at equal bytes.

    python3 ops/frontier_akerd_summary.py [DIR]    # default bench/results/frontier-akerd
"""
import csv
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "bench/results/frontier-akerd"
VARIANTS = [
    ("aker", "aker, FIFO, Δ 10, vectors"),
    ("rerank", "aker_rerank"),
    ("guarded4", "guarded"),
    ("guarded2", "guarded minD/2"),
    ("aker-clock", "aker + clock"),
    ("rerank-clock", "aker_rerank + clock"),
    ("guarded4-clock", "guarded + clock"),
    ("guarded4-clock-ids-d0", "guarded + clock, ids, Δ 0"),
    ("default", "**akerd default** (guarded + clock, ids, Δ 2)"),
]


def rows(variant):
    p = os.path.join(root, variant, "results.csv")
    if not os.path.exists(p):
        return {}
    return {(r["pool_pct"], r["skew"], r["policy"]): r for r in csv.DictReader(open(p)) if r["pool_pct"]}


runs = {v: rows(v) for v, _ in VARIANTS}
present = [(v, t) for v, t in VARIANTS if runs[v]]
if not present:
    sys.exit(f"no runs under {root}")
cells = sorted({(p, s) for v, _ in present for (p, s, _) in runs[v]},
               key=lambda c: (float(c[0]), float(c[1])))
cell = lambda r: f"{float(r['recall']):.3f} / {100 * float(r['hit_ratio']):.1f}"
print("| pool | skew | paper-Aker (ids only, Δ 0) | " + " | ".join(t for _, t in present) + " |")
print("|---:|---:|---:|" + "---:|" * len(present))
for pool, skew in cells:
    base = next((runs[v].get((pool, skew, "aker")) for v, _ in present if runs[v].get((pool, skew, "aker"))), None)
    line = [f"{pool}%", skew, cell(base) if base else "-"]
    for v, _ in present:
        r = runs[v].get((pool, skew, "akerd"))
        line.append(cell(r) if r else "-")
    print("| " + " | ".join(line) + " |")
print()
print("Approximate-hit recall / entries of akerd's rows:\n")
print("| pool | skew | " + " | ".join(t for _, t in present) + " |")
print("|---:|---:|" + "---:|" * len(present))
for pool, skew in cells:
    line = [f"{pool}%", skew]
    for v, _ in present:
        r = runs[v].get((pool, skew, "akerd"))
        ap = r and r["approx_hit_recall"]
        line.append(f"{float(ap):.2f} / {r['entries']}" if r and ap else ("- / " + r["entries"] if r else "-"))
    print("| " + " | ".join(line) + " |")
