#!/usr/bin/env python3
"""Tables (and a figure) of ops/pgvector-bench.sh: aker in front of pgvector against
pgvector alone, from the JSON files in DIR (default target/pgbench).

    python3 ops/pgvector_summary.py [DIR]

Cost bound (as ops/e2e_summary.py): every request through akerd pays o (1 / the
all-exact-hit throughput), a miss also pays b (bypass costs o + b); with hit ratio h the
best a cache can do is (o + b) / (o + (1 - h) b) times the bypass throughput.
"""
import glob
import json
import os
import re
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "target/pgbench"
SKEWS = ["0.99", "0.30"]
TAGS = [("free", "unconstrained (shared_buffers 512MB)"),
        ("mem", "memory-constrained (cgroup limit, shared_buffers 128kB)")]


def load(name):
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return json.load(f)


def akerd_run(name):
    d = load(name)
    return None if d is None else d["run"]


def lat_us(run):
    """(p50, p99, p99.9) in µs of an akerd run or a SQL run."""
    if "latency" in run:
        l = run["latency"]
        return l["p50_ms"] * 1e3, l["p99_ms"] * 1e3, l["p999_ms"] * 1e3
    return run["p50_us"], run["p99_us"], run["p999_us"]


def fmt(x, spec=".0f"):
    return "" if x is None else format(x, spec)


def mib(b):
    return f"{b / 2**20:.0f} MiB"


print("# aker in front of pgvector against pgvector alone (ops/pgvector-bench.sh)\n")
ld = load("load")
if ld:
    print(f"Collection: {ld['rows']:,} x {ld['dim']} (GloVe), binary COPY {ld['copy_s']:.1f} s; "
          f"HNSW m {ld['m']}, ef_construction {ld['ef_construction']}, built in "
          f"{ld['index_s']:.1f} s; table {mib(ld['table_bytes'])}, index {mib(ld['index_bytes'])}.\n")
vp = os.path.join(out, "pg-version")
if os.path.exists(vp):
    lines = open(vp).read().split("\n")
    print(f"Server: {lines[0]}; pgvector {lines[1] if len(lines) > 1 else '?'}.\n")

print("## hnsw.ef_search tuned for recall@10 of about 0.9 without a cache\n")
print("| skew | ef_search | recall@10 (SQL, 2 connections) |")
print("|---:|---:|---:|")
efs = {}
for skew in SKEWS:
    p = os.path.join(out, f"ef-{skew}")
    if not os.path.exists(p):
        continue
    ef = int(open(p).read().strip())
    efs[skew] = ef
    t = load(f"tune-{skew}-ef{ef}")
    print(f"| {skew} | {ef} | {fmt(t and t['recall'], '.3f')} |")
print()

def open_loop_tables(rows):
    """Open loop at 50% / 90% of PostgreSQL alone's best: latency from intended send times."""
    lines = []
    for skew, pgs, best_c, best in rows:
        for pct in (50, 90):
            pg, ak = load(f"free-open{pct}-pg-{skew}"), akerd_run(f"free-open{pct}-cache5-{skew}")
            for label, r in ((f"PostgreSQL alone ({best_c} conn.)", pg), ("akerd, cache 5%", ak)):
                if not r:
                    continue
                p50, p99, p999 = lat_us(r)
                rate = r.get("target_rate") or r.get("rate")
                hit = r.get("hit_ratio")
                unsent = r.get("unsent")
                lines.append(f"| {skew} | {pct}% ({fmt(rate)}/s) | {label} | {r['throughput']:.0f} | "
                             f"{p50:.0f} | {p99:.0f} | {p999:.0f} | {fmt(hit, '.3f')} | "
                             f"{fmt(r.get('recall'), '.3f')} | {fmt(unsent)} |")
    if not lines:
        return
    print("\nOpen loop at the same intended rates (50% / 90% of PostgreSQL alone's best closed-loop "
          "throughput), latency from the intended send time on both sides:\n")
    print("| skew | rate | set-up | served/s | p50 µs | p99 µs | p99.9 µs | hit ratio | recall@10 | "
          "unsent |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(lines))


def repeat_table(rows):
    """The headline pair three more times (closed loop): median and range of the ratio."""
    lines = []
    for skew, pgs, best_c, best in rows:
        pairs = []
        for rep_i in (1, 2, 3):
            pg, ak = load(f"free-rep{rep_i}-pg-{skew}"), akerd_run(f"free-rep{rep_i}-cache5-{skew}")
            if pg and ak:
                pairs.append((pg, ak))
        if not pairs:
            continue
        ratios = [ak["throughput"] / pg["throughput"] for pg, ak in pairs]
        cells = "; ".join(f"{pg['throughput']:.0f} / {ak['throughput']:.0f} (h {ak.get('hit_ratio', 0):.3f}, "
                          f"recall {pg['recall']:.3f} / {ak.get('recall') or 0:.3f})" for pg, ak in pairs)
        lines.append(f"| {skew} | {best_c} | {cells} | {statistics.median(ratios):.2f}x | "
                     f"{min(ratios):.2f}-{max(ratios):.2f}x |")
    if not lines:
        return
    rs = (load("free-rep1-pg-0.99") or {}).get("seconds")
    print(f"\nThe headline pair again, three times, {fmt(rs)} s counted each (PostgreSQL alone at its best "
          "connection count / akerd cache 5%, closed loop, searches/s):\n")
    print("| skew | PG conn. | runs: PG alone / akerd | median ratio | range |")
    print("|---:|---:|---|---:|---:|")
    print("\n".join(lines))


figure = {}
for tag, title in TAGS:
    rows = []
    for skew in SKEWS:
        pgs = [(c, load(f"{tag}-pg-c{c}-{skew}")) for c in (1, 2, 4, 8)]
        pgs = [(c, r) for c, r in pgs if r]
        if not pgs:
            continue
        best_c, best = max(pgs, key=lambda x: x[1]["throughput"])
        rows.append((skew, pgs, best_c, best))
    if not rows:
        continue
    print(f"## {title}\n")
    print("PostgreSQL alone, by connection count (searches/s):\n")
    print("| skew | " + " | ".join(f"{c} conn." for c in (1, 2, 4, 8)) + " | best |")
    print("|---:|" + "---:|" * 5)
    for skew, pgs, best_c, best in rows:
        by = {c: r for c, r in pgs}
        cells = " | ".join(fmt(by[c]["throughput"]) if c in by else "" for c in (1, 2, 4, 8))
        print(f"| {skew} | {cells} | {best_c} |")
    print()
    print("| skew | set-up | req/s | vs PG alone | p50 µs | p99 µs | p99.9 µs | hit ratio | "
          "recall@10 | of bound | akerd RSS | pool bytes | disk read |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for skew, pgs, best_c, best in rows:
        base = best["throughput"]
        p50, p99, p999 = lat_us(best)
        bmem = load(f"{tag}-pg-c{best_c}-{skew}.mem") or {}
        bdisk = f"{bmem['disk_read_sectors'] * 512 / 2**20:.0f} MiB" if "disk_read_sectors" in bmem else ""
        print(f"| {skew} | PostgreSQL alone ({best_c} conn.) | {base:.0f} | 1.00x | {p50:.0f} | "
              f"{p99:.0f} | {p999:.0f} | | {fmt(best['recall'], '.3f')} | | | | {bdisk} |")
        eq = load(f"{tag}-eq-pg-{skew}")
        if eq:
            eqm = load(f"{tag}-eq-pg-{skew}.mem") or {}
            e50, e99, e999 = lat_us(eq)
            print(f"| {skew} | PostgreSQL alone, limit + akerd's RSS ({mib(eqm.get('limit_bytes', 0))}) | "
                  f"{eq['throughput']:.0f} | {eq['throughput'] / base:.2f}x | {e50:.0f} | {e99:.0f} | "
                  f"{e999:.0f} | | {fmt(eq['recall'], '.3f')} | | | | |")
        exact = akerd_run(f"{tag}-exact-only-{skew}")
        byp = akerd_run(f"{tag}-bypass-{skew}")
        o = 1.0 / exact["throughput"] if exact else None
        b = max(1.0 / byp["throughput"] - o, 0.0) if (byp and o) else None
        for name, label in ((f"{tag}-bypass-{skew}", "akerd, cache bypassed"),
                            (f"{tag}-cache5-{skew}", "akerd, cache 5%"),
                            (f"{tag}-cache1-{skew}", "akerd, cache 1%")):
            r = akerd_run(name)
            if not r:
                continue
            p50, p99, p999 = lat_us(r)
            h = r.get("hit_ratio") or 0.0
            of_bound = ""
            if "cache" in name and o and b is not None and byp:
                bound = (o + b) / (o + (1 - h) * b)
                of_bound = f"{100 * (r['throughput'] / byp['throughput']) / bound:.0f}% of {bound:.2f}x"
            mem = load(name + ".mem") or {}
            rss = f"{mem['rss_kb'] / 1024:.0f} MiB" if mem.get("rss_kb") else ""
            pool = mib(float(mem["pool_bytes"])) if mem.get("pool_bytes") else ""
            disk = f"{mem['disk_read_sectors'] * 512 / 2**20:.0f} MiB" if "disk_read_sectors" in mem else ""
            h_cell = f"{h:.3f}" if "cache" in name else ""
            print(f"| {skew} | {label} | {r['throughput']:.0f} | {r['throughput'] / base:.2f}x | "
                  f"{p50:.0f} | {p99:.0f} | {p999:.0f} | {h_cell} | "
                  f"{fmt(r.get('recall'), '.3f')} | {of_bound} | {rss} | {pool} | {disk} |")
            figure.setdefault(tag, []).append((skew, label, r["throughput"], r.get("recall")))
        figure.setdefault(tag, []).append((skew, "PostgreSQL alone", base, best["recall"]))
    sweep = []
    for skew, pgs, best_c, best in rows:
        pts = [(100, best["throughput"])]
        eq = load(f"{tag}-eq-pg-{skew}")
        if eq:
            pts.append(((load(f"{tag}-eq-pg-{skew}.mem") or {}).get("limit_bytes", 0) / 2**20, eq["throughput"]))
        for path in glob.glob(os.path.join(out, f"{tag}-sweep*-pg-{skew}.json")):
            mb = int(re.search(r"sweep(\d+)-pg", path).group(1))
            pts.append((mb, load(os.path.basename(path)[:-5])["throughput"]))
        if len(pts) > 2:
            sweep.append((skew, sorted(pts)))
    if sweep:
        print("\nPostgreSQL alone by memory limit (searches/s at its best connection count), and the "
              "limit at which it matches akerd with a 5% pool in front of it at 100 MiB:\n")
        print("| skew | searches/s at limit (MiB) | matches akerd 5% at |")
        print("|---:|---|---:|")
        for skew, pts in sweep:
            target = (akerd_run(f"{tag}-cache5-{skew}") or {}).get("throughput")
            need = ""
            if target:
                for (m0, t0), (m1, t1) in zip(pts, pts[1:]):
                    if t0 < target <= t1:
                        need = f"{m0 + (target - t0) / (t1 - t0) * (m1 - m0):.0f} MiB (interpolated)"
                        break
                if not need:
                    need = "below 100 MiB" if pts[0][1] >= target else f"above {pts[-1][0]:.0f} MiB"
            cells = ", ".join(f"{t:.0f} at {m:.0f}" for m, t in pts)
            print(f"| {skew} | {cells} | {need} |")
    if tag == "free":
        open_loop_tables(rows)
        repeat_table(rows)
    usage = os.path.join(out, f"{tag}-cgroup-max-usage")
    if os.path.exists(usage):
        print(f"\nPostgreSQL's memory group, peak usage (processes + page cache): "
              f"{mib(int(open(usage).read()))}.")
    print()

w_pg, w_ak, w_s = load("writes-pg"), akerd_run("writes-akerd"), akerd_run("search-while-writes")
if w_pg or w_ak:
    print("## Writes (unconstrained set-up, the same GloVe rows on both sides)\n")
    if w_pg:
        print(f"- Straight into PostgreSQL ({w_pg['connections']} connections, {w_pg['n']} rows inserted, "
              f"then deleted): {w_pg['inserts_per_s']:.0f} inserts/s, {w_pg['deletes_per_s']:.0f} deletes/s.")
    if w_ak:
        ops = {o["op"]: o for o in w_ak.get("ops", [])}
        ins, dele = ops.get("insert"), ops.get("delete")
        print(f"- Through akerd (4 connections, 1 deep, inserts and deletes of the inserted, mixed): "
              f"{w_ak['throughput']:.0f} writes/s"
              + (f" ({ins['throughput']:.0f} inserts/s, {dele['throughput']:.0f} deletes/s)" if ins and dele else "")
              + ".")
    if w_s:
        p50, p99, p999 = lat_us(w_s)
        loop = f"open loop at {w_s['rate']:.0f}/s" if w_s.get("mode") == "open" else "closed loop, 64 in flight"
        print(f"- Searches (skew 0.99, cache 5%, {loop}) beside 100 writes/s through akerd: "
              f"{w_s['throughput']:.0f} req/s, p50 {p50:.0f} µs, p99 {p99:.0f} µs, p99.9 {p999:.0f} µs.")
        w_n = akerd_run("search-no-writes")
        if w_n:
            n50, n99, n999 = lat_us(w_n)
            print(f"- The same searches without writes: {w_n['throughput']:.0f} req/s, p50 {n50:.0f} µs, "
                  f"p99 {n99:.0f} µs, p99.9 {n999:.0f} µs.")
    print()

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None
if plt and figure:
    fig, axes = plt.subplots(1, len(figure), figsize=(6 * len(figure), 4.5), squeeze=False)
    for ax, (tag, pts) in zip(axes[0], figure.items()):
        for skew, marker in zip(SKEWS, ("o", "s")):
            for label, color in (("PostgreSQL alone", "black"), ("akerd, cache bypassed", "grey"),
                                 ("akerd, cache 5%", "tab:blue"), ("akerd, cache 1%", "tab:orange")):
                for s, l, thr, rec in pts:
                    if s == skew and l == label and rec is not None:
                        ax.scatter(thr, rec, color=color, marker=marker,
                                   label=f"{label}, skew {skew}")
        ax.set_xlabel("throughput (searches/s)")
        ax.set_ylabel("recall@10")
        ax.set_title(dict(TAGS)[tag])
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "pgvector-vs-aker.png"), dpi=120)
    print(f"Figure: `pgvector-vs-aker.png`.")
