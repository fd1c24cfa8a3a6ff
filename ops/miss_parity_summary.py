#!/usr/bin/env python3
"""The table of ops/miss-parity.sh: each run's throughput, PostgreSQL's core, where the
searching sessions spent the counted part, and akerd's backend threads' run-queue delay.

    python3 ops/miss_parity_summary.py DIR
"""
import collections
import json
import os
import re
import statistics
import sys

root = sys.argv[1] if len(sys.argv) > 1 else "target/miss-parity"
runs = collections.defaultdict(dict)  # name -> round -> row
for f in sorted(os.listdir(root)):
    m = re.fullmatch(r"(.+)-r(\d+)\.json", f)
    if not m:
        continue
    name, r = m.group(1), int(m.group(2))
    main = json.load(open(os.path.join(root, f)))
    main = main.get("run", main)  # aker-loadgen's akerd report nests its figures in "run"
    extra_path = os.path.join(root, f"{name}-r{r}.extra.json")
    extra = json.load(open(extra_path)) if os.path.exists(extra_path) else {}
    states = collections.Counter()
    sessions = os.path.join(root, f"{name}-r{r}.sessions")
    if os.path.exists(sessions):
        states.update(line.strip() for line in open(sessions) if line.strip())
    total = sum(states.values()) or 1
    thr = main["throughput"]
    done = main.get("requests") or main.get("ok")
    runq_us = None
    if extra.get("runq_ns") and done:
        runq_us = extra["runq_ns"] / 1e3 / done
    cpu_us = idle_us = None
    if extra.get("akerd_cpu_s") is not None and done and not name.startswith("pg"):
        # Net of akerd's CPU with no load (idle rate x the counted seconds).
        idle = extra.get("akerd_idle_cpu_per_s", 0.0) * extra.get("counted_s", 0.0)
        cpu_us = (extra["akerd_cpu_s"] - idle) * 1e6 / done
        idle_us = idle * 1e6 / done
    exact = next((h for h in main.get("hits", []) if h.get("kind") == "exact"), None)
    runs[name][r] = {
        "hit_ratio": main.get("hit_ratio"),
        "exact_p99_ms": exact["latency"]["p99_ms"] if exact else None,
        "thr": thr,
        "recall": main.get("recall"),
        "cpu0": extra.get("cpu0_busy"),
        "active": states["active"] / total,
        "client": states["ClientRead"] / total,
        "runq_us": runq_us,
        "cpu_us": cpu_us,
        "idle_ms_per_s": None if name.startswith("pg") or extra.get("akerd_idle_cpu_per_s") is None else extra["akerd_idle_cpu_per_s"] * 1e3,
    }


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


pg = statistics.median(r["thr"] for r in runs.get("pg", {}).values()) if "pg" in runs else None
print("| run | round | searches/s | / PostgreSQL alone (median) | recall@10 | core 0 busy | sessions active | idle in ClientRead | backend run-queue delay per search (µs) | akerd CPU per search, net of idle (µs) | akerd CPU idle (ms/s) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name in ["pg"] + sorted(n for n in runs if n != "pg"):
    for r, row in sorted(runs.get(name, {}).items()):
        ratio = row["thr"] / pg if pg else None
        print(f"| {name} | {r} | {row['thr']:.0f} | {fmt(ratio, '.2f')} | {fmt(row['recall'], '.3f')} | {fmt(row['cpu0'], '.0%')} "
              f"| {row['active']:.0%} | {row['client']:.0%} | {fmt(row['runq_us'], '.0f')} | {fmt(row['cpu_us'], '.1f')} | {fmt(row['idle_ms_per_s'], '.1f')} |")
print()
print("| run | median searches/s | / PostgreSQL alone | hit ratio (median) | exact-hit p99, ms (median) | akerd CPU per search net of idle, µs (median) |")
print("|---|---:|---:|---:|---:|---:|")
for name in ["pg"] + sorted(n for n in runs if n != "pg"):
    if name not in runs:
        continue
    med = statistics.median(r["thr"] for r in runs[name].values())
    def mid(key):
        xs = [r[key] for r in runs[name].values() if r[key] is not None]
        return statistics.median(xs) if xs else None
    print(f"| {name} | {med:.0f} | {fmt(med / pg if pg else None, '.2f')} "
          f"| {fmt(mid('hit_ratio'), '.3f')} | {fmt(mid('exact_p99_ms'), '.3f')} | {fmt(mid('cpu_us'), '.1f')} |")
