#!/usr/bin/env python3
"""Summary of ops/batch-bench.sh: exact hits per second by frame kind, the median over
rounds, with the ratio to single SEARCH frames, latency per frame, and how busy akerd's
core was (its CPU seconds over the run's wall seconds, warm-up included).

    python3 ops/batch_bench_summary.py target/batch-bench
"""
import glob
import json
import os
import statistics
import sys

KINDS = [("search", "SEARCH, depth 256"), ("batch1", "SEARCH_BATCH of 1, depth 256"),
         ("batch16", "SEARCH_BATCH of 16, depth 16"), ("batch256", "SEARCH_BATCH of 256, depth 1")]


def runs(out, kind):
    got = []
    for path in sorted(glob.glob(os.path.join(out, f"{kind}-r*.json"))):
        run = json.load(open(path))["run"]
        cpu_s, wall_s = map(float, open(path[:-5] + ".cpu").read().split())
        got.append((run, cpu_s / wall_s))
    return got


def exact_share(run):
    return sum(h["share"] for h in run["hits"] if h["kind"] == "exact")


def main(out):
    rows = []
    base = None
    for kind, label in KINDS:
        rs = runs(out, kind)
        if not rs:
            continue
        tput = statistics.median(r["throughput"] for r, _ in rs)
        p50 = statistics.median(r["latency"]["p50_ms"] for r, _ in rs)
        p99 = statistics.median(r["latency"]["p99_ms"] for r, _ in rs)
        busy = statistics.median(b for _, b in rs)
        hit = min(exact_share(r) for r, _ in rs)
        errors = sum(r["errors"] for r, _ in rs)
        base = base or tput
        rows.append((label, len(rs), tput, tput / base, p50, p99, busy, hit, errors))
    print("| frames | runs | exact hits/s (median) | vs SEARCH | frame p50 | frame p99 | akerd core busy | akerd CPU per query | exact hits | errors |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, n, tput, ratio, p50, p99, busy, hit, errors in rows:
        # Busy share over queries per second: akerd's CPU time per query (the warm-up
        # runs at about the counted rate, so the ratio holds over the whole run).
        cpu_us = busy / tput * 1e6 if tput else float("nan")
        print(f"| {label} | {n} | {tput:,.0f} | {ratio:.2f}x | {p50:.3f} ms | {p99:.3f} ms "
              f"| {busy:.0%} | {cpu_us:.2f} µs | {hit:.1%} | {errors} |")
    rates = os.path.join(out, "python-rates.txt")
    if os.path.exists(rates):
        print()
        print("Python client (clients/python/bench/rates.py, the same akerd):")
        print()
        print("```")
        print(open(rates).read().rstrip())
        print("```")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "target/batch-bench")
