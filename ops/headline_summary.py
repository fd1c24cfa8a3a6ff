#!/usr/bin/env python3
"""The tables of ops/headline.sh and bench/results/headline.json's figures.

    python3 ops/headline_summary.py DIR [--json OUT.json]

Per skew: every pair (PostgreSQL alone, then akerd, same round, same database state),
its ratio, recall@10 of both, akerd's hit ratio and database searches per request over
the counted part (misses + recall checks, from akerd's /metrics when counting started
and when it ended; every backend search is counted once: nothing coalesces).
"""
import datetime
import json
import os
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        d = json.load(f)
    return d.get("run", d)  # aker-loadgen's akerd report nests its figures in "run"


def metrics(path):
    """Prometheus text -> {name{labels}: value}, summed over labels a caller drops."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            pass
    return out


def delta(root, name, key):
    m0, m1 = metrics(f"{root}/{name}.metrics0"), metrics(f"{root}/{name}.metrics1")
    if key not in m0 or key not in m1:
        return None
    return m1[key] - m0[key]


def db_per_request(root, name):
    """(database searches per search request, misses, recall checks) over the counted part."""
    requests = delta(root, name, 'aker_requests_total{op="search"}')
    misses = delta(root, name, "aker_misses_total")
    checks = delta(root, name, "aker_recall_checks_done_total") or 0.0
    backend = delta(root, name, 'aker_latency_seconds_count{op="backend_search"}')
    if not requests or misses is None:
        return None, None, None, None
    return (misses + checks) / requests, misses / requests, checks / requests, (backend or 0) / requests


def rss_mb(root, name, key="rss_kb"):
    p = f"{root}/{name}.mem.json"
    return json.load(open(p))[key] / 1024 if os.path.exists(p) else None


def rounds(root, prefix):
    found = {}
    for f in os.listdir(root):
        m = re.fullmatch(re.escape(prefix) + r"-r(\d+)\.json", f)
        if m:
            found[int(m.group(1))] = f[: -len(".json")]
    return dict(sorted(found.items()))


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def skew_set(root, skew):
    pg, cache, bypass = (rounds(root, f"{s}-{skew}") for s in ("pg", "cache", "bypass"))
    pairs = []
    print(f"### skew {skew}\n")
    print("| round | PostgreSQL alone searches/s | akerd searches/s | ratio | recall@10 PG / akerd | hit ratio | DB searches per request (misses + checks) | bypass searches/s (/ PG) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(set(pg) & set(cache)):
        p, c = load(f"{root}/{pg[r]}.json"), load(f"{root}/{cache[r]}.json")
        per, miss, chk, _ = db_per_request(root, cache[r])
        b = load(f"{root}/{bypass[r]}.json") if r in bypass else None
        pair = {
            "round": r,
            "pg": p["throughput"],
            "akerd": c["throughput"],
            "ratio": c["throughput"] / p["throughput"],
            "recall_pg": p.get("recall"),
            "recall_akerd": c.get("recall"),
            "hit_ratio": c.get("hit_ratio"),
            "db_searches_per_request": per,
            "misses_per_request": miss,
            "checks_per_request": chk,
            "bypass": b["throughput"] if b else None,
        }
        pairs.append(pair)
        btxt = f"{b['throughput']:.0f} ({b['throughput'] / p['throughput']:.2f}x)" if b else "-"
        print(f"| {r} | {p['throughput']:.0f} | {c['throughput']:.0f} | **{pair['ratio']:.2f}x** "
              f"| {fmt(pair['recall_pg'], '.3f')} / {fmt(pair['recall_akerd'], '.3f')} | {fmt(pair['hit_ratio'], '.3f')} "
              f"| {fmt(per, '.3f')} ({fmt(miss, '.3f')} + {fmt(chk, '.4f')}) | {btxt} |")
    if not pairs:
        print("(no pairs)\n")
        return None
    med = lambda k: statistics.median(x[k] for x in pairs if x[k] is not None) if any(x[k] is not None for x in pairs) else None
    ratios = [x["ratio"] for x in pairs]
    byp = [x["bypass"] / x["pg"] for x in pairs if x["bypass"]]
    print(f"\nMedian ratio **{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}x); "
          f"recall@10 PostgreSQL alone {fmt(med('recall_pg'), '.3f')}, akerd {fmt(med('recall_akerd'), '.3f')}; "
          f"hit ratio {fmt(med('hit_ratio'), '.3f')}; database searches per request {fmt(med('db_searches_per_request'), '.3f')}"
          + (f"; bypass / PostgreSQL alone median {statistics.median(byp):.2f}x ({min(byp):.2f}-{max(byp):.2f})" if byp else "")
          + ".\n")
    return {
        "ratios": [round(x, 3) for x in ratios],
        "ratio_median": round(statistics.median(ratios), 3),
        "recall_pg": med("recall_pg"),
        "recall_akerd": med("recall_akerd"),
        "hit_ratio": med("hit_ratio"),
        "db_searches_per_request": med("db_searches_per_request"),
        "pairs": pairs,
        "bypass_ratios": [round(x, 3) for x in byp],
    }


def hardware_set(root):
    pgs = {c: rounds(root, f"hw-pg-c{c}") for c in (4, 8)}
    ak = rounds(root, "hw-cache")
    if not ak:
        return None
    print("### Nothing pinned (one machine)\n")
    print("| round | PostgreSQL alone c4 | c8 | akerd (cache 5%) | ratio to the better |")
    print("|---:|---:|---:|---:|---:|")
    best_pg, aks = [], []
    for r in sorted(ak):
        thr = {c: load(f"{root}/{pgs[c][r]}.json")["throughput"] for c in pgs if r in pgs[c]}
        a = load(f"{root}/{ak[r]}.json")["throughput"]
        best = max(thr.values())
        best_pg.append(best)
        aks.append(a)
        print(f"| {r} | {fmt(thr.get(4), '.0f')} | {fmt(thr.get(8), '.0f')} | {a:.0f} | {a / best:.2f}x |")
    pg_m, ak_m = statistics.median(best_pg), statistics.median(aks)
    print(f"\nMedians: PostgreSQL alone at its better count {pg_m:.0f}/s, akerd {ak_m:.0f}/s: **{ak_m / pg_m:.2f}x**.\n")
    return {"pg_alone": round(pg_m, 1), "akerd": round(ak_m, 1), "ratio": round(ak_m / pg_m, 3)}


def memory_set(root):
    ak, pg = rounds(root, "mem-cache"), rounds(root, "mem-pg")
    if not ak:
        return None
    print("### Memory-constrained, equal memory (skew 0.99)\n")
    print("| round | akerd searches/s (PostgreSQL limited) | akerd RSS MiB | PostgreSQL alone searches/s (limit + akerd RSS) | ratio | recall PG / akerd |")
    print("|---:|---:|---:|---:|---:|---:|")
    ratios, rss, limits = [], [], []
    for r in sorted(set(ak) & set(pg)):
        a, p = load(f"{root}/{ak[r]}.json"), load(f"{root}/{pg[r]}.json")
        m = rss_mb(root, ak[r])
        lim = json.load(open(f"{root}/{pg[r]}.mem.json"))["limit_bytes"] / 2**20
        ratios.append(a["throughput"] / p["throughput"])
        rss.append(m)
        limits.append(lim)
        print(f"| {r} | {a['throughput']:.0f} | {m:.1f} | {p['throughput']:.0f} ({lim:.0f} MiB) | **{ratios[-1]:.2f}x** "
              f"| {fmt(p.get('recall'), '.3f')} / {fmt(a.get('recall'), '.3f')} |")
    print(f"\nMedian **{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}x).\n")
    return {"limit_mb": None, "akerd_rss_mb": round(statistics.median(rss), 1),
            "ratios": [round(x, 3) for x in ratios], "ratio": round(statistics.median(ratios), 3)}


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "target/headline"
    json_out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    setup = dict(kv.split("=", 1) for kv in open(f"{root}/setup").read().split())
    commit = open(f"{root}/commit").read().strip()
    print(f"## ops/headline.sh at {commit}\n")
    print(f"Set-up: {' '.join(f'{k}={v}' for k, v in setup.items())}\n")
    s99, s30 = skew_set(root, "0.99"), skew_set(root, "0.30")
    hw, mem = hardware_set(root), memory_set(root)
    if mem:
        mem["limit_mb"] = int(setup["mem_mb"])
    empties = [rss_mb(root, n[: -len(".mem.json")], "rss_empty_kb")
               for n in os.listdir(root) if n.endswith(".mem.json") and not n.startswith("mem-pg")]
    empties = [e for e in empties if e is not None]
    if empties:
        print(f"akerd resident with an empty pool, right after ready: median {statistics.median(empties):.1f} MiB "
              f"({min(empties):.1f}-{max(empties):.1f}, {len(empties)} starts).")
    if json_out:
        doc = {
            "commit": commit,
            "date": datetime.date.today().isoformat(),
            "setup": {
                "ef_search": {"0.99": int(setup["ef_0.99"]), "0.30": int(setup["ef_0.30"])},
                "threads": int(setup["conns"]),
                "delta": int(setup["delta"]),
                "pool": f"{setup['pool_objects']} objects (5%)",
                "pinning": "PostgreSQL on core 0, akerd and aker-loadgen on core 1 (hardware set: none)",
                "pg_settings": "shared_buffers 512MB (memory set 128kB), fsync on, synchronous_commit on, jit off, "
                               "no parallel workers, autovacuum off, wal_level logical",
                "changes": "following (wal_level logical, akerd's default)",
                "rounds": int(setup["rounds"]), "duration_s": int(setup["dur"]), "warmup_s": int(setup["warm"]),
            },
            "bypass_ratio": (round(statistics.median(s99["bypass_ratios"]), 3) if s99 and s99["bypass_ratios"] else None),
            "skew_0.99": s99,
            "skew_0.30": s30,
            "equal_hardware_0.99": hw,
            "equal_memory_0.99": mem,
            "akerd_rss_empty_mb": round(statistics.median(empties), 1) if empties else None,
        }
        with open(json_out, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")


main()
