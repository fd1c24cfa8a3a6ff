#!/usr/bin/env python3
"""The table of ops/recall-floor-e2e.sh: loadgen's measured recall against akerd's own
estimate, per policy and floor, open loop (spare backend time) and closed loop.

    python3 ops/recall_floor_e2e_summary.py DIR
"""
import json
import os
import re
import sys

out = sys.argv[1]
STATES = ["off", "warming", "holding", "tightening", "unreachable", "unavailable"]


def metrics(path):
    """Prometheus text -> {name{labels}: value}."""
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


def run(name):
    p = os.path.join(out, name + ".json")
    return json.load(open(p))["run"] if os.path.exists(p) else None


print("| policy | floor | mode | searches/s | hit % | recall@10 (measured) | akerd estimate [low] | state | scale | checks done / dropped (busy, stale) | approximate: measured / estimated |")
print("|---|---:|---|---:|---:|---:|---|---|---:|---|---|")
for p in ("aker", "guarded"):
    for floor in ("0", "0.95", "0.98"):
        for mode in ("open", "closed"):
            name = f"{p}-floor{floor}-{mode}"
            r = run(name)
            if not r:
                continue
            m = metrics(os.path.join(out, name + ".metrics"))
            est = m.get("aker_recall_estimate")
            low = m.get("aker_recall_estimate_low")
            state = STATES[int(m.get("aker_recall_floor_state", 0))]
            scale = m.get("aker_recall_threshold_scale", 1.0)
            done = m.get("aker_recall_checks_done_total", 0)
            dropped = {k: v for k, v in m.items() if k.startswith("aker_recall_checks_dropped_total")}
            busy = sum(v for k, v in dropped.items() if 'busy' in k)
            stale = sum(v for k, v in dropped.items() if 'stale' in k)
            hits = {h["kind"]: h for h in r.get("hits", [])}
            ap = hits.get("approximate", {}).get("recall")
            ap_est = m.get('aker_recall_kind_estimate{kind="approximate"}')
            print(f"| {p} | {floor} | {mode} | {r['throughput']:.0f} | {100 * r.get('hit_ratio', 0):.1f} | "
                  f"{r.get('recall') or 0:.3f} | "
                  + (f"{est:.3f} [{low:.3f}]" if est is not None else "-")
                  + f" | {state} | {scale:.3g} | {done:.0f} / {busy:.0f}, {stale:.0f} | "
                  + (f"{ap:.3f}" if ap is not None else "-") + " / "
                  + (f"{ap_est:.3f}" if ap_est is not None else "-") + " |")
print("\nakerd's counters cover the process's life (the open-loop run, then the closed-loop one after it) and its estimate weighs recent checks (half-life 30 s); loadgen's recall is over each counted run.")
