"""Compact per-cell tables of the floor rows of a results.csv (bench recall --recall-floors).

python3 bench/results/recall-floor/summary.py DIR [POLICY_PREFIX]
"""
import csv, sys

d = sys.argv[1]
prefix = sys.argv[2] if len(sys.argv) > 2 else ""
rows = list(csv.DictReader(open(f"{d}/results.csv")))
plain = {(r["backend"], r["pool_pct"], r["skew"], r["policy"]): r for r in rows if "@" not in r["policy"]}
print("| backend | pool | skew | policy | floor | measured (floor's recall) | exact recall | hit % (plain) "
      "| estimate [low] | est − measured | last 20k measured | est − last 20k | shadow share % | scale | t/r | held |")
print("|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
for r in rows:
    if "@" not in r["policy"] or not r["policy"].startswith(prefix):
        continue
    pol, fl = r["policy"].split("@")
    fl = float(fl)
    p = plain[(r["backend"], r["pool_pct"], r["skew"], pol)]
    exact = r["backend"] == "exact"
    m = float(r["recall"]) if exact else float(r["relative_recall"])
    tail = float(r["tail_recall"]) if exact else float(r["tail_relative_recall"])
    est = float(r["est_recall"])
    held = "yes" if m >= fl else f"**no** ({m - fl:+.3f})"
    name = "aker" if pol == "aker" else "guarded:clock" if pol.startswith("guarded") and "clock" in pol else pol
    print(f"| {r['backend']} | {r['pool_pct']}% | {float(r['skew']):.2f} | {name} | {fl} | {m:.3f} | {float(r['recall']):.3f} "
          f"| {100*float(r['hit_ratio']):.1f} ({100*float(p['hit_ratio']):.1f}) | {est:.3f} [{float(r['est_low']):.3f}] "
          f"| {est - m:+.3f} | {tail:.3f} | {est - tail:+.3f} | {100*float(r['shadow_share']):.1f} | {float(r['final_scale']):.3g} "
          f"| {r['tightened']}/{r['relaxed']} | {held} |")
