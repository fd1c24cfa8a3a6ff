#!/usr/bin/env python3
"""The table of ops/durable-bench.sh: the embedded store in memory against durable.

    python3 ops/durable_bench_summary.py DIR
"""
import json
import os
import sys

out = sys.argv[1]


def run(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p))["run"] if os.path.exists(p) else None


def op(r, name):
    return next((o for o in r["ops"] if o["op"] == name), None)


print("| run | in memory | durable (data_dir) | ratio |")
print("|---|---:|---:|---:|")
for c in (1, 8):
    m, d = run(f"insert-mem-c{c}"), run(f"insert-durable-c{c}")
    if not (m and d):
        continue
    print(f"| inserts/s, {c} connection(s) x 1 | {m['throughput']:.0f} | {d['throughput']:.0f} | "
          f"{d['throughput'] / m['throughput']:.2f}x |")
    for q in ("p50_ms", "p99_ms", "p999_ms"):
        a, b = op(m, "INSERT")["latency"][q], op(d, "INSERT")["latency"][q]
        print(f"| acknowledged insert {q[:-3]}, {c} conn. (ms) | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
m, d = run("search-mem"), run("search-durable")
if m and d:
    for q in ("p50_ms", "p99_ms", "p999_ms", "max_ms"):
        a, b = op(m, "SEARCH")["latency"][q], op(d, "SEARCH")["latency"][q]
        print(f"| search {q[:-3]} at 2,000/s beside 1,000 inserts/s (ms) | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
m, d = run("writes-beside-mem"), run("writes-beside-durable")
if m and d:
    for q in ("p50_ms", "p99_ms", "p999_ms", "max_ms"):
        a, b = op(m, "INSERT")["latency"][q], op(d, "INSERT")["latency"][q]
        print(f"| insert {q[:-3]} at 1,000/s beside the searches (ms) | {a:.3f} | {b:.3f} | {b / a:.1f}x |")
ck = os.path.join(out, "checkpoints")
if os.path.exists(ck):
    print(f"\nCheckpoints written by the durable akerd during the runs: {open(ck).read().strip()}.")

starts = {k: os.path.join(out, f"glove-{k}.seconds") for k in ("import", "recover")}
if all(os.path.exists(p) for p in starts.values()):
    imp, rec = (float(open(starts[k]).read()) for k in ("import", "recover"))
    size = int(open(os.path.join(out, "glove-data.bytes")).read())
    print(f"\nGloVe (400,000 x 50, exact index), process start to ready: first start (import into "
          f"data_dir) {imp:.2f} s, restart (recover from the checkpoint) {rec:.2f} s; data_dir "
          f"{size / 2**20:.0f} MiB.")
