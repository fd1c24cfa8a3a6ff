"""search_batch against a real akerd speaking version 4: SEARCH_BATCH frames (counted by
akerd's STATS), chunks of max_batch, answers equal to per-row SEARCH, hit kinds, per-row
statuses (DEADLINE_EXCEEDED, NON_FINITE, UNKNOWN_COLLECTION) raised or returned."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aker
from aker import _codec

from akerd_process import Akerd
from conftest import K_MAX, MAX_INFLIGHT, abatch_until, batch_until, exact, newest_version, queries, run

EXACT = aker.HitKind.EXACT
MISS = aker.HitKind.MISS


@pytest.fixture
def client3(akerd_batch3: Akerd) -> Iterator[aker.Client]:
    """A client of the akerd with max_batch 3, its cache flushed first."""
    c = aker.Client(akerd_batch3.host, akerd_batch3.port, timeout=10.0)
    c.flush()
    try:
        yield c
    finally:
        c.close()


def batches(stats: dict[str, Any]) -> tuple[int, int]:
    """The server's SEARCH_BATCH frames and the queries they carried."""
    return int(stats["server_batches"]), int(stats["server_batch_queries"])


def test_search_batch_goes_in_chunks_of_max_batch(client3: aker.Client, data: np.ndarray) -> None:
    c = client3
    assert c.version == newest_version(c.info) and c.version >= 5 and c.info.max_batch == 3 and c.window == MAX_INFLIGHT
    qs = queries(20, seed=50)
    frames, rows = batches(c.stats())
    b = c.search_batch(qs, 6)
    assert batches(c.stats()) == (frames + 7, rows + 20)  # ceil(20 / 3) frames
    assert b.kinds == [MISS] * 20 and b.statuses.tolist() == [0] * 20 and b.ok.all()
    for row, q in enumerate(qs):
        single = c.search(q, 6, bypass_cache=True)
        assert b.ids[row].tolist() == single.ids.tolist() == exact(data, q, 6).tolist()
        np.testing.assert_allclose(b.distances[row], single.distances, rtol=1e-6, atol=1e-6)
    again = batch_until(c, qs, 6, EXACT)
    assert again.kinds == [EXACT] * 20 and np.array_equal(again.ids, b.ids)
    assert again[7].kind is EXACT and again[7].ids.tolist() == b.ids[7].tolist()
    assert c.stats()["server_busy_inflight"] == 0


def test_the_default_max_batch_is_capped_by_max_inflight(client: aker.Client, data: np.ndarray) -> None:
    assert client.info.max_batch == MAX_INFLIGHT
    qs = queries(60, seed=51)
    frames, rows = batches(client.stats())
    b = client.search_batch(qs, 4, bypass_cache=True)
    assert batches(client.stats()) == (frames + 8, rows + 60)  # ceil(60 / 8)
    for row, q in enumerate(qs):
        assert b.ids[row].tolist() == exact(data, q, 4).tolist()


def test_async_search_batch(akerd_batch3: Akerd, data: np.ndarray) -> None:
    async def body() -> None:
        async with await aker.AsyncClient.connect(akerd_batch3.host, akerd_batch3.port, timeout=10.0) as c:
            await c.flush()
            assert c.version == newest_version(c.info) and c.version >= 5 and c.info.max_batch == 3
            qs = queries(10, seed=52)
            frames, _ = batches(await c.stats())
            b = await c.search_batch(qs, 5)
            assert batches(await c.stats())[0] == frames + 4
            assert b.kinds == [MISS] * 10
            for row, q in enumerate(qs):
                assert b.ids[row].tolist() == (await c.search(q, 5, bypass_cache=True)).ids.tolist()
                assert b.ids[row].tolist() == exact(data, q, 5).tolist()
            again = await abatch_until(c, qs, 5, EXACT)
            assert again.kinds == [EXACT] * 10 and np.array_equal(again.ids, b.ids)
            # Batches and single searches at once on one connection: never over max_inflight.
            more = queries(12, seed=53)
            (forward, backward), singles = await asyncio.gather(
                asyncio.gather(c.search_batch(more, 3, bypass_cache=True),
                               c.search_batch(more[::-1], 3, bypass_cache=True)),
                asyncio.gather(*(c.search(q, 3, bypass_cache=True) for q in more)))
            for row, q in enumerate(more):
                want = exact(data, q, 3).tolist()
                assert forward.ids[row].tolist() == backward.ids[11 - row].tolist() == want
                assert singles[row].ids.tolist() == want
            assert (await c.stats())["server_busy_inflight"] == 0

    run(body())


def test_pools_search_batch(akerd_batch3: Akerd, data: np.ndarray) -> None:
    qs = queries(7, seed=54)
    with aker.Pool(akerd_batch3.host, akerd_batch3.port, size=2) as pool:
        b = pool.search_batch(qs, 4, bypass_cache=True)
        assert [b.ids[r].tolist() for r in range(7)] == [exact(data, q, 4).tolist() for q in qs]

    async def body() -> None:
        async with aker.AsyncPool(akerd_batch3.host, akerd_batch3.port, size=2) as pool:
            got = await asyncio.gather(*(pool.search_batch(qs, 4, bypass_cache=True) for _ in range(3)))
            assert all(np.array_equal(g.ids, b.ids) for g in got)

    run(body())


def test_per_row_deadline(client: aker.Client, data: np.ndarray) -> None:
    qs = queries(8, seed=55)
    late = None
    for _ in range(20):  # 1 µs: backend searches cannot make it (bounded retries)
        b = client.search_batch(qs, K_MAX, bypass_cache=True, deadline=1e-6, errors="return")
        if (b.statuses == aker.Status.DEADLINE_EXCEEDED).any():
            late = b
            break
    assert late is not None
    assert set(late.statuses.tolist()) <= {0, int(aker.Status.DEADLINE_EXCEEDED)}
    for row, q in enumerate(qs):
        if late.ok[row]:
            assert late.ids[row].tolist() == exact(data, q, K_MAX).tolist()
        else:
            assert late.counts[row] == 0 and late.kinds[row] is MISS
    raised = None
    for _ in range(20):
        try:
            client.search_batch(qs, K_MAX, bypass_cache=True, deadline=1e-6)
        except aker.DeadlineExceeded as e:
            raised = e
            break
    assert raised is not None and raised.row is not None and 0 <= raised.row < 8 and not raised.local
    assert client.search_batch(qs, 3).ok.all()  # the connection stays


def test_per_row_non_finite_from_the_server(client3: aker.Client, data: np.ndarray) -> None:
    """The client refuses NaN rows itself; past that check, akerd fails only that row."""
    c = client3
    mat = queries(5, seed=56)
    mat[3, 1] = np.nan
    reqs = c._codec.search_batch_rows(mat, 2, c._codec.batch_count(2, c.window, 1 << 30))
    outs = c._exchange(reqs)
    b = _codec.batch_result(outs, reqs, 2, "return")
    assert b.statuses.tolist() == [0, 0, 0, int(aker.Status.NON_FINITE), 0]
    for row in (0, 1, 2, 4):
        assert b.ids[row].tolist() == exact(data, mat[row], 2).tolist()
    with pytest.raises(aker.NonFinite) as e:
        _codec.batch_result(outs, reqs, 2, "raise")
    assert e.value.row == 3 and not e.value.local and e.value.request_id > 0
    with pytest.raises(aker.NonFinite) as e2:  # the same through search_batch: refused before sending
        c.search_batch(mat, 2)
    assert e2.value.local


def test_unknown_collection_and_server_refusals(client3: aker.Client) -> None:
    c = client3
    qs = queries(5, seed=57)
    with pytest.raises(aker.UnknownCollection) as e:
        c.search_batch(qs, 2, collection=7)
    assert e.value.row == 0 and not e.value.local
    b = c.search_batch(qs, 2, collection=7, errors="return")
    assert b.statuses.tolist() == [int(aker.Status.UNKNOWN_COLLECTION)] * 5 and not b.ok.any()
    # A frame over max_batch, sent past the client's chunking: BAD_REQUEST for the frame.
    over = c._codec.search_batch_rows(queries(4, seed=58), 2, 4)
    with pytest.raises(aker.InvalidRequest) as e2:
        c._exchange(over)
    assert e2.value.status is aker.Status.BAD_REQUEST and e2.value.row == 0
    assert c.search_batch(qs, 2).ok.all()
