#!/usr/bin/env python3
"""The metric comparison of ops/recall-metrics.sh as Markdown: per policy, pool and skew,
recall@10 and hit % of unit-normalised GloVe under l2sq, cosine and ip (and the largest
gap of either to l2sq), then raw GloVe under ip.
    python3 ops/recall_metrics_summary.py [DIR]     # default bench/results/metrics"""
import csv
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/metrics")
POLICIES = ["aker", "aker-bf", "akerd", "prx", "pl10", "none"]


def load(name):
    with open(root / name / "results.csv") as f:
        return {(r["policy"], r["pool_pct"], r["skew"]): r for r in csv.DictReader(f)}


def cell(r):
    return f"{float(r['recall']):.3f} / {100 * float(r['hit_ratio']):.1f}"


unit = {m: load(f"glove-unit-{m}") for m in ["l2sq", "cosine", "ip"]}
print("| policy | pool | skew | l2sq recall / hit % | cosine | ip | largest gap to l2sq (recall, hit pts) |")
print("|---|---:|---:|---:|---:|---:|---:|")
worst = {}
for p in POLICIES:
    keys = sorted(k for k in unit["l2sq"] if k[0] == p)
    for k in keys:
        rows = [unit[m].get(k) for m in ["l2sq", "cosine", "ip"]]
        if any(r is None for r in rows):
            continue
        base = rows[0]
        dr = max(abs(float(r["recall"]) - float(base["recall"])) for r in rows[1:])
        dh = max(abs(float(r["hit_ratio"]) - float(base["hit_ratio"])) for r in rows[1:])
        w = worst.setdefault(p, [0.0, 0.0])
        w[0], w[1] = max(w[0], dr), max(w[1], dh)
        print(f"| {p} | {k[1] + '%' if k[1] else '-'} | {float(k[2]):.2f} | {cell(rows[0])} | {cell(rows[1])} | "
              f"{cell(rows[2])} | {100 * dr:.1f}, {100 * dh:.1f} |")
print()
for p, (dr, dh) in worst.items():
    print(f"- {p}: largest gap to l2sq {100 * dr:.1f} recall points, {100 * dh:.1f} hit points")
raw = root / "glove-ip"
if raw.exists():
    ip = load("glove-ip")
    print("\nRaw GloVe under ip (exact backend):\n")
    print("| policy | pool | skew | recall@10 | hit % | pool MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for p in POLICIES:
        for k in sorted(k for k in ip if k[0] == p):
            r = ip[k]
            print(f"| {p} | {k[1] + '%' if k[1] else '-'} | {float(k[2]):.2f} | {float(r['recall']):.3f} | "
                  f"{100 * float(r['hit_ratio']):.1f} | {int(r['pool_bytes']) / 2**20:.1f} |")
