#!/usr/bin/env python3
"""Tables of the end-to-end benchmark (ops/e2e.sh) from loadgen's JSON files.

Cost model (loadgen issue): every request pays o (network, parsing; measured by the
all-exact-hit run as 1 / throughput), a miss also pays the backend b (the bypass run
costs o + b). With hit ratio h the best any cache can do is (o + b) / (o + (1 - h) b)
times the bypass throughput. Closed-loop runs at the same concurrency, so 1 / throughput
is the cost per request of the busiest resource.
"""
import json
import os
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "target/e2e"


def load(name):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)["run"]


def us(ms):
    return f"{ms * 1000:.0f}"


def hits(run):
    """Latency summary of cache hits (exact + alias + approximate), weighted by count."""
    hs = [h for h in run["hits"] if h["kind"] != "miss"]
    return hs


print("# End-to-end benchmark (ops/e2e.sh)\n")
# Configurations: 2 executors before 1, then backend nice 10, 0, idle.
confs = []
for n in os.listdir(out):
    if n.startswith("ex") and n.endswith("-exact-only.json"):
        confs.append(n[: -len("-exact-only.json")])
NICE_ORDER = {"nice10": 0, "nice0": 1, "niceidle": 2}
confs.sort(key=lambda c: (-int(c.split("-")[0][2:]), NICE_ORDER.get(c.split("-")[1], 9), c))
skews = ["0.99", "0.30"]


def label(conf):
    ex, nice = conf.split("-")
    return f"{ex[2:]} | {nice[4:]}"

print("## Throughput through the cache vs bypassing it (closed loop, 8 connections x 8 deep)\n")
print("| executors | backend nice | skew | exact-only req/s | bypass req/s | cache req/s | hit ratio h | recall@10 | measured ratio | bound (o+b)/(o+(1-h)b) | % of bound |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for ex in confs:
    exact = load(f"{ex}-exact-only")
    if exact is None:
        continue
    o = 1.0 / exact["throughput"]
    for skew in skews:
        byp = load(f"{ex}-bypass-{skew}")
        cache = load(f"{ex}-cache-{skew}")
        if byp is None or cache is None:
            continue
        b = max(1.0 / byp["throughput"] - o, 0.0)
        h = cache["hit_ratio"] or 0.0
        bound = (o + b) / (o + (1 - h) * b)
        ratio = cache["throughput"] / byp["throughput"]
        rec = cache["recall"]
        print(f"| {label(ex)} | {skew} | {exact['throughput']:.0f} | {byp['throughput']:.0f} | "
              f"{cache['throughput']:.0f} | {h:.3f} | {rec if rec is None else f'{rec:.3f}'} | "
              f"{ratio:.2f}x | {bound:.2f}x | {100 * ratio / bound:.0f}% |")

print("\n## Latency at 50 / 70 / 90% of the cache's maximum rate (open loop, Poisson, µs)\n")
print("| executors | backend nice | skew | load | target req/s | achieved req/s | h | p50 | p99 | p99.9 | max | hits p99 | hits p99.9 | misses p99 | errors |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for ex in confs:
    for skew in skews:
        for pct in (50, 70, 90):
            r = load(f"{ex}-open{pct}-{skew}")
            if r is None:
                continue
            lat = r["latency"]
            hs = hits(r)
            # p99 of hits: the worst per-kind p99 (exact / alias / approximate), a safe upper bound.
            hp99 = max((h["latency"]["p99_ms"] for h in hs), default=0.0)
            hp999 = max((h["latency"]["p999_ms"] for h in hs), default=0.0)
            miss = [h for h in r["hits"] if h["kind"] == "miss"]
            mp99 = miss[0]["latency"]["p99_ms"] if miss else 0.0
            print(f"| {label(ex)} | {skew} | {pct}% | {r['rate']:.0f} | {r['throughput']:.0f} | "
                  f"{(r['hit_ratio'] or 0):.3f} | {us(lat['p50_ms'])} | {us(lat['p99_ms'])} | "
                  f"{us(lat['p999_ms'])} | {us(lat['max_ms'])} | {us(hp99)} | {us(hp999)} | "
                  f"{us(mp99)} | {r['errors']} |")

print("\n## Per hit kind in the closed-loop cache runs (µs)\n")
print("| executors | backend nice | skew | kind | share | recall | p50 | p99 | p99.9 |")
print("|---:|---:|---:|---|---:|---:|---:|---:|---:|")
for ex in confs:
    for skew in skews:
        r = load(f"{ex}-cache-{skew}")
        if r is None:
            continue
        for h in r["hits"]:
            rec = h["recall"]
            print(f"| {label(ex)} | {skew} | {h['kind']} | {h['share']:.3f} | "
                  f"{'' if rec is None else f'{rec:.3f}'} | {us(h['latency']['p50_ms'])} | "
                  f"{us(h['latency']['p99_ms'])} | {us(h['latency']['p999_ms'])} |")
