"""The asyncio client against a real akerd: the same checks as the blocking one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aker

from akerd_process import Akerd
from conftest import (
    DIM,
    K_MAX,
    MAX_FRAME,
    MAX_INFLIGHT,
    abatch_until,
    asearch_until,
    exact,
    newest_version,
    queries,
    run,
)

EXACT = aker.HitKind.EXACT


async def connect(akerd: Akerd, **kw: object) -> aker.AsyncClient:
    c = await aker.AsyncClient.connect(akerd.host, akerd.port, timeout=10.0, **kw)  # type: ignore[arg-type]
    await c.flush()
    return c


def test_async_hello_search_and_cache(akerd: Akerd, data: np.ndarray) -> None:
    async def body() -> None:
        async with await connect(akerd, window=1000) as c:
            assert c.version == newest_version(c.info) and c.version >= 5
            assert c.info.dim == DIM and c.window == MAX_INFLIGHT
            for q in queries(4, seed=40):
                want = exact(data, q, 6).tolist()
                r = await c.search(q, 6)
                assert r.kind is aker.HitKind.MISS and r.ids.tolist() == want
                assert r.ids.dtype == np.uint64 and r.distances.dtype == np.float32
                again = await asearch_until(c, q.astype(np.float64), 6, EXACT)
                assert again.kind is aker.HitKind.EXACT and again.ids.tolist() == want
                assert (await c.search(q, 6, bypass_cache=True)).kind is aker.HitKind.MISS
                assert (await c.search(q, 6, refresh_entry=True)).ids.tolist() == want

    run(body())


def test_async_concurrent_calls_share_one_connection(akerd: Akerd, data: np.ndarray) -> None:
    async def body() -> None:
        async with await connect(akerd) as c:
            qs = queries(40, seed=41)
            rs = await asyncio.gather(*(c.search(q, 5) for q in qs))
            for q, r in zip(qs, rs, strict=True):
                assert r.ids.tolist() == exact(data, q, 5).tolist()
            assert (await c.stats())["server_busy_inflight"] == 0

    run(body())


def test_async_search_batch(akerd: Akerd, data: np.ndarray) -> None:
    async def body() -> None:
        async with await connect(akerd) as c:
            qs = queries(50, seed=42)
            b = await c.search_batch(qs, 4)
            assert b.ids.shape == (50, 4) and b.kinds == [aker.HitKind.MISS] * 50
            for row, q in enumerate(qs):
                assert b.ids[row].tolist() == exact(data, q, 4).tolist()
            again = await abatch_until(c, qs, 4, EXACT)
            assert again.hit_ratio == 1.0 and np.array_equal(again.ids, b.ids)

    run(body())


def test_async_insert_delete_and_deleted_ids(akerd: Akerd, data: np.ndarray) -> None:
    async def body() -> None:
        async with await connect(akerd) as c:
            q = queries(1, seed=43)[0]
            await c.insert(4_000_000, q, b"payload")
            r = await c.search(q, 4)
            assert r.ids[0] == 4_000_000
            assert await c.delete(4_000_000) is True
            assert await c.delete(4_000_000) is False
            assert 4_000_000 not in (await c.search(q, 4)).ids.tolist()
            # A cached neighbour deleted: the entry never serves it again.
            victim = int(r.ids[1])
            try:
                assert await c.delete(victim) is True
                after = await c.search(q, 4)
                assert victim not in after.ids.tolist()
                assert after.ids.tolist() == exact(data, q, 4, exclude=[victim]).tolist()
            finally:
                await c.insert(victim, data[victim])

    run(body())


def test_async_pipeline_stats_ping_flush(akerd: Akerd, data: np.ndarray) -> None:
    async def body() -> None:
        async with await connect(akerd) as c:
            q = queries(1, seed=44)[0]
            async with c.pipeline() as p:
                p.search(q, 3)
                p.ping(b"hi")
                p.stats()
                p.delete(5_000_000)
                p.flush()
            r, pong, stats, existed, flushed = p.results
            assert r.ids.tolist() == exact(data, q, 3).tolist() and pong == b"hi"
            assert stats["server_requests"] > 0 and existed is False and flushed is None
            p2 = c.pipeline()
            p2.search(q, 3, collection=9)
            p2.search(q, 3)
            out = await p2.execute(return_exceptions=True)
            assert isinstance(out[0], aker.UnknownCollection) and isinstance(out[1], aker.SearchResult)
            p2.search(q, 3, collection=9)
            with pytest.raises(aker.UnknownCollection):
                await p2.execute()
            assert await c.ping() > 0
            await c.search(q, 3)
            assert (await asearch_until(c, q, 3, EXACT)).hit
            await c.flush()
            assert not (await c.search(q, 3)).hit

    run(body())


def test_async_bad_input(akerd: Akerd) -> None:
    async def body() -> None:
        async with await connect(akerd) as c:
            q = queries(1)[0]
            nan = q.copy()
            nan[0] = np.nan
            with pytest.raises(aker.DimensionMismatch):
                await c.search(q[:3], 3)
            with pytest.raises(aker.NonFinite):
                await c.search(nan, 3)
            with pytest.raises(aker.BadK):
                await c.search(q, K_MAX + 1)
            with pytest.raises(aker.TooLarge):
                await c.insert(1, q, bytes(MAX_FRAME))
            with pytest.raises(aker.NonFinite):
                await c.search_batch(np.stack([q, nan]), 3)
            with pytest.raises(aker.Unsupported):
                await c.fill(q, 1, [1], [0.0], [q])
            with pytest.raises(aker.UnknownCollection):
                await c.delete(1, collection=4)
            assert await c.ping() > 0
        assert c.closed
        with pytest.raises(aker.ConnectionClosed):
            await c.ping()

    run(body())


def test_async_pool(akerd: Akerd, data: np.ndarray) -> None:
    async def body() -> None:
        async with aker.AsyncPool(akerd.host, akerd.port, size=3, timeout=10.0) as pool:
            assert (await pool.info()).dim == DIM
            qs = queries(30, seed=45)
            rs = await asyncio.gather(*(pool.search(q, 3, bypass_cache=True) for q in qs))
            for q, r in zip(qs, rs, strict=True):
                assert r.ids.tolist() == exact(data, q, 3).tolist()
            assert 1 <= pool.connections <= 3
            b = await pool.search_batch(qs, 3, bypass_cache=True)
            assert b.ids[5].tolist() == exact(data, qs[5], 3).tolist()
            await pool.insert(6_000_000, qs[0])
            assert await pool.delete(6_000_000) is True
            assert await pool.ping() > 0 and isinstance(await pool.stats(), dict)
            await pool.flush()

    run(body())
