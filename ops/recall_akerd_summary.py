#!/usr/bin/env python3
"""paper-Aker (`aker`) against akerd's configuration (`akerd`) in a runner results.csv
(`bench recall --akerd-config ...`), as Markdown: per data set, backend, pool and skew,
recall@10 / hit % / the bytes the pool and entries took / entries.
    python3 ops/recall_akerd_summary.py [bench/results/results.csv]"""
import csv
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/results.csv"
rows = list(csv.DictReader(open(path)))


def pick(ds, be, pool, skew, policy):
    for r in rows:
        if (r["dataset"], r["backend"], r["pool_pct"], r["skew"], r["policy"]) == (
                ds, be, pool, skew, policy):
            return r
    return None


def cell(r):
    return (f"{float(r['recall']):.3f} / {100 * float(r['hit_ratio']):.1f} / "
            f"{int(r['pool_bytes']) / 2**20:.1f} / {r['entries']}")


print("| data set | backend | pool | skew | aker: recall / hit % / MiB / entries | akerd | Δ recall, hit pts |")
print("|---|---|---:|---:|---:|---:|---:|")
seen = []
for r in rows:
    key = (r["dataset"], r["backend"], r["pool_pct"], r["skew"])
    if r["policy"] != "akerd" or key in seen:
        continue
    seen.append(key)
    a, d = pick(*key, "aker"), r
    if a is None:
        continue
    dr = 100 * (float(d["recall"]) - float(a["recall"]))
    dh = 100 * (float(d["hit_ratio"]) - float(a["hit_ratio"]))
    print(f"| {key[0]} | {key[1]} | {key[2]}% | {float(key[3]):.2f} | {cell(a)} | {cell(d)} | "
          f"{dr:+.1f}, {dh:+.1f} |")
