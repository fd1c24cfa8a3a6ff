#!/usr/bin/env python3
"""Queries/s of exact hits through the Python client: one search at a time (sync), many
in flight on one connection (async gather, a window of `max_inflight`), and
`search_batch` (SEARCH_BATCH frames of at most `max_batch` rows from a version 4 akerd,
pipelined SEARCHes from an older one; `max_inflight` rows in flight). The same vector every
time after one miss, so every counted request is an EXACT hit and the figures are the
client's and the protocol's cost, not the backend's.

    python bench/rates.py --port 7700 [--seconds 5] [--batch 256]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np
import numpy.typing as npt

import aker


def sync_rate(c: aker.Client, q: npt.NDArray[np.float32], seconds: float) -> float:
    n, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        assert c.search(q, 10).kind == aker.HitKind.EXACT
        n += 1
    return n / (time.perf_counter() - start)


def batch_rate(c: aker.Client, q: npt.NDArray[np.float32], rows: int, seconds: float) -> float:
    m = np.repeat(q[None, :], rows, axis=0)
    n, end = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < end:
        b = c.search_batch(m, 10)
        n += rows
    assert all(k == aker.HitKind.EXACT for k in b.kinds)
    return n / (time.perf_counter() - start)


async def async_rate(host: str, port: int, q: npt.NDArray[np.float32], inflight: int, seconds: float) -> float:
    c = await aker.AsyncClient.connect(host, port)
    try:
        n, end = 0, time.perf_counter() + seconds
        start = time.perf_counter()
        while time.perf_counter() < end:
            rs = await asyncio.gather(*(c.search(q, 10) for _ in range(inflight)))
            n += len(rs)
        assert all(r.kind == aker.HitKind.EXACT for r in rs)
        return n / (time.perf_counter() - start)
    finally:
        await c.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7700)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16, 256])
    a = p.parse_args()
    with aker.Client(a.host, a.port) as c:
        q = np.random.default_rng(1).random(c.info.dim, dtype=np.float32)
        # The miss that admits it; admission is asynchronous in akerd, so wait (bounded)
        # until the vector is an EXACT hit before measuring.
        warm_end = time.monotonic() + 10.0
        while c.search(q, 10).kind != aker.HitKind.EXACT:
            if time.monotonic() > warm_end:
                raise SystemExit("the vector was not admitted within 10 s")
            time.sleep(0.01)
        mode = f"SEARCH_BATCH, max_batch {c.info.max_batch}" if c.info.max_batch else "pipelined SEARCH"
        print(f"server: dim {c.info.dim}, max_inflight {c.info.max_inflight}, protocol v{c.version} ({mode})")
        print(f"sync, one at a time: {sync_rate(c, q, a.seconds):,.0f} exact hits/s")
        for rows in a.batch:
            print(f"search_batch of {rows}: {batch_rate(c, q, rows, a.seconds):,.0f} exact hits/s")
        window = c.info.max_inflight
    rate = asyncio.run(async_rate(a.host, a.port, q, window, a.seconds))
    print(f"async, {window} in flight: {rate:,.0f} exact hits/s")


if __name__ == "__main__":
    main()
