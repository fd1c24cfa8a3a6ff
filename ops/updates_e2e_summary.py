#!/usr/bin/env python3
"""The table of ops/updates-e2e.sh: per akerd configuration and write share, each
phase's throughput, hit ratio and recall (read-only phases), and the writes' latency
under load (loadgen: from the intended send; akerd: its own per-operation histogram).

    python3 ops/updates_e2e_summary.py DIR
"""
import json
import os
import sys

out = sys.argv[1]


def run(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p))["run"] if os.path.exists(p) else None


def metrics(path):
    m = {}
    if not os.path.exists(path):
        return m
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        k, _, v = line.rpartition(" ")
        try:
            m[k] = float(v)
        except ValueError:
            pass
    return m


def op(r, name):
    return next((o for o in r.get("ops", []) if o["op"] == name), None)


def lat(o):
    if not o:
        return "-"
    s = o["latency"]
    return f"{s['p50_ms']:.2f} / {s['p99_ms']:.2f}"


names = sorted({f[: -len("-warm.json")] for f in os.listdir(out) if f.endswith("-warm.json")})
print("| akerd | writes | phase | ops/s | searches | hit % | recall@10 | inserts | deletes | insert p50 / p99 ms | delete p50 / p99 ms | errors |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|")
for n in names:
    config, pct = n.rsplit("-", 1)
    for phase in ("warm", "writes", "replay"):
        r = run(f"{n}-{phase}")
        if not r:
            continue
        s, i, d = op(r, "SEARCH"), op(r, "INSERT"), op(r, "DELETE")
        count = lambda o: o["latency"]["count"] if o else 0
        recall = r.get("recall")
        print(f"| {config} | {pct.replace('pct', '%')} | {phase} | {r['throughput']:.0f} | {count(s)} | "
              f"{100 * (r.get('hit_ratio') or 0):.1f} | {recall:.4f} | " if recall is not None else
              f"| {config} | {pct.replace('pct', '%')} | {phase} | {r['throughput']:.0f} | {count(s)} | "
              f"{100 * (r.get('hit_ratio') or 0):.1f} | - | ", end="")
        print(f"{count(i)} | {count(d)} | {lat(i)} | {lat(d)} | {r['errors']} |")
for n in names:
    w = run(f"{n}-writes")
    if w and w["errors"]:
        print(f"\n**{n}: the writes phase had {w['errors']} errors ({w['errors_by_cause']}): a write that failed"
              " is not in the collection the replay's ground truth describes, so its recall is not exact.**")
print()
print("akerd's own write latency over its life up to the end of the writes phase (queue, store write, every shard's refresh; µs), and its refresh counters:")
print()
print("| akerd | writes | insert p50 / p99 | delete p50 / p99 | fast-path updates | slow-path steps | delete repairs | invalidations |")
print("|---|---|---|---|---:|---:|---:|---:|")
for n in names:
    config, pct = n.rsplit("-", 1)
    m = metrics(os.path.join(out, f"{n}-writes.metrics"))
    def q(op_, p):
        return m.get(f'aker_latency_seconds{{op="{op_}",quantile="{p}"}}')
    def us(op_):
        a, b = q(op_, "0.5"), q(op_, "0.99")
        return f"{a * 1e6:.0f} / {b * 1e6:.0f}" if a is not None and b is not None else "-"
    def total(name):
        v = m.get(f"aker_{name}_total")
        return f"{v:.0f}" if v is not None else "-"
    print(f"| {config} | {pct.replace('pct', '%')} | {us('insert')} | {us('delete')} | {total('fast_path_updates')} | "
          f"{total('slow_path_steps')} | {total('delete_repairs')} | {total('invalidations')} |")
