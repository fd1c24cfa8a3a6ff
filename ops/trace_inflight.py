#!/usr/bin/env python3
"""How often a trace's search repeats one still in flight (issue #42: may identical misses
in flight be coalesced into one database search?).

    python3 ops/trace_inflight.py TRACE [TRACE ...]

For windows of 8 and 64 requests (a closed loop with that many in flight), the share of
searches whose vector was also searched among the previous W requests, and the share
where that earlier search is the vector's first (a compulsory miss whose admission may
not have landed yet: the most a coalescer could merge). Reads formats/TRACE.md's layout.
"""
import struct
import sys


def searches(path):
    """The vector index of every SEARCH record, in file order."""
    f = open(path, "rb").read()
    (dim,) = struct.unpack_from("<I", f, 12)
    nv, nops = struct.unpack_from("<QQ", f, 24)
    off = 40 + 4 * dim * nv
    out = []
    for _ in range(nops):
        tag = f[off]
        if tag == 1:
            v, _k = struct.unpack_from("<II", f, off + 1)
            out.append(v)
            off += 9
        elif tag == 2:
            off += 13
        else:
            off += 9
    return out


def report(path):
    vecs = searches(path)
    n = len(vecs)
    first = {}
    for i, v in enumerate(vecs):
        first.setdefault(v, i)
    print(f"{path}: {n} searches, {len(first)} distinct ({len(first) / n:.3f} compulsory misses)")
    for w in (8, 64):
        last = {}
        dup = dup_first = 0
        for i, v in enumerate(vecs):
            j = last.get(v)
            if j is not None and i - j <= w:
                dup += 1
                if i - first[v] <= w:
                    dup_first += 1
            last[v] = i
        print(f"  window {w}: identical search among the previous {w}: {dup / n:.3f} of requests; "
              f"while the vector's first search may still be in flight: {dup_first / n:.3f}")


for p in sys.argv[1:]:
    report(p)
