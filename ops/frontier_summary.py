#!/usr/bin/env python3
"""Policy frontiers from a runner results.csv (`bench recall --equal-bytes` with swept
policies): per data set, backend, pool and skew, the recall-vs-hit-ratio Pareto front of
each policy family, and the guarded family against paper-Aker's swept front at the
three points #22 names: recall at paper-Aker default's hit ratio, hit ratio at recall
0.95 and at 0.98.
    python3 ops/frontier_summary.py [bench/results/frontier/results.csv]"""
import csv
import sys

path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/frontier/results.csv"
rows = list(csv.DictReader(open(path)))


def family(policy):
    """`aker`: paper-Aker's swept front (FIFO); `new`: every guarded or clock row."""
    clock = ":clock" in policy
    if (policy == "aker" or policy.startswith("aker:")) and not clock:
        return "aker"
    if policy.startswith("guarded") or clock:
        return "new"
    return None


def front(points):
    """The upper hull of the Pareto front of (hit, recall) points, ascending by hit: what
    a family reaches, a mix of two neighbouring settings giving the line between them
    (the same for both families, so neither gains from a dent in the other)."""
    pts = sorted(set(points))
    pareto = [p for p in pts if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in pts)]
    hull = []
    for p in sorted(pareto):
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            # drop the middle point when it lies on or below the chord
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    return hull


def recall_at(fr, hit):
    for (h0, r0), (h1, r1) in zip(fr, fr[1:]):
        if h0 <= hit <= h1:
            return r0 + (r1 - r0) * (hit - h0) / (h1 - h0) if h1 > h0 else max(r0, r1)
    return None


def hit_at(fr, recall):
    for (h0, r0), (h1, r1) in zip(fr, fr[1:]):
        if r1 <= recall <= r0:
            return h0 + (h1 - h0) * (r0 - recall) / (r0 - r1) if r0 > r1 else max(h0, h1)
    return None


def fmt(x, scale=1.0, digits=3):
    return "-" if x is None else f"{x * scale:.{digits}f}"


cells = sorted({(r["dataset"], r["backend"], r["pool_pct"], r["skew"]) for r in rows
                if r["pool_pct"]}, key=lambda c: (c[0], c[1], float(c[2]), float(c[3])))
print("| data set | backend | pool | skew | aker default recall / hit % | recall at that hit %: "
      "aker front / new front | hit % at recall 0.95: aker / new | at 0.98: aker / new |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for ds, be, pool, skew in cells:
    mine = [r for r in rows if (r["dataset"], r["backend"], r["pool_pct"], r["skew"])
            == (ds, be, pool, skew)]
    fams = {}
    for r in mine:
        f = family(r["policy"])
        if f:
            fams.setdefault(f, []).append((100 * float(r["hit_ratio"]), float(r["recall"])))
    default = next((r for r in mine if r["policy"] == "aker"), None)
    if default is None or "new" not in fams:
        continue
    a, g = front(fams["aker"]), front(fams["new"])
    h0, r0 = 100 * float(default["hit_ratio"]), float(default["recall"])
    cols = [f"{r0:.3f} / {h0:.1f}",
            f"{fmt(recall_at(a, h0))} / {fmt(recall_at(g, h0))}",
            f"{fmt(hit_at(a, 0.95), digits=1)} / {fmt(hit_at(g, 0.95), digits=1)}",
            f"{fmt(hit_at(a, 0.98), digits=1)} / {fmt(hit_at(g, 0.98), digits=1)}"]
    print(f"| {ds} | {be} | {pool}% | {float(skew):.2f} | " + " | ".join(cols) + " |")

# Which rows make the new front: each new family on its own.
FAMILIES = {
    "aker + clock": lambda p: (p == "aker" or p.startswith("aker:")) and ":clock" in p,
    "guarded (FIFO)": lambda p: p.startswith("guarded") and ":clock" not in p,
    "guarded + clock": lambda p: p.startswith("guarded") and ":clock" in p,
}
print("\nEach new family alone (recall at paper-Aker default's hit ratio / hit % at recall 0.98):\n")
print("| data set | pool | skew | aker front | " + " | ".join(FAMILIES) + " |")
print("|---|---:|---:|---:|" + "---:|" * len(FAMILIES))
for ds, be, pool, skew in cells:
    mine = [r for r in rows if (r["dataset"], r["backend"], r["pool_pct"], r["skew"])
            == (ds, be, pool, skew)]
    default = next((r for r in mine if r["policy"] == "aker"), None)
    if default is None:
        continue
    h0 = 100 * float(default["hit_ratio"])
    pts = lambda pred: front([(100 * float(r["hit_ratio"]), float(r["recall"]))
                              for r in mine if pred(r["policy"])])
    a = front([(100 * float(r["hit_ratio"]), float(r["recall"]))
               for r in mine if family(r["policy"]) == "aker"])
    cols = [f"{fmt(recall_at(a, h0))} / {fmt(hit_at(a, 0.98), digits=1)}"]
    for pred in FAMILIES.values():
        f = pts(pred)
        cols.append(f"{fmt(recall_at(f, h0))} / {fmt(hit_at(f, 0.98), digits=1)}")
    print(f"| {ds} | {pool}% | {float(skew):.2f} | " + " | ".join(cols) + " |")
