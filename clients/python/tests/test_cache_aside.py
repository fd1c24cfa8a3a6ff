"""FILL against a cache-aside akerd: the client is the backend (numpy over the collection)."""

from __future__ import annotations

import numpy as np
import pytest

import aker

from akerd_process import Akerd
from conftest import DELTA, DIM, exact, newest_version, queries, run


class NumpyBackend:
    """The client's own database: exact squared L2 over ``data`` minus deleted rows."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self.deleted: set[int] = set()
        self.calls: list[int] = []

    def __call__(self, q: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self.calls.append(n)
        ids = exact(self.data, q, n, exclude=self.deleted)
        rows = self.data[ids.astype(np.int64)]
        d = ((rows.astype(np.float64) - q) ** 2).sum(axis=1).astype(np.float32)
        order = np.argsort(d, kind="stable")
        return ids[order], d[order], rows[order]


def test_miss_token_fill_then_exact_hit(aside: aker.Client, data: np.ndarray) -> None:
    assert aside.info.delta == DELTA and aside.version == newest_version(aside.info) and aside.version >= 5
    backend = NumpyBackend(data)
    q, k = queries(1, seed=20)[0], 5
    miss = aside.search(q, k)
    assert miss.kind is aker.HitKind.MISS and len(miss) == 0 and miss.token is not None
    ids, d, vecs = backend(q, k + aside.info.delta)
    assert aside.fill(q, k, ids, d, vecs, token=miss.token) is True
    hit = aside.search(q, k)
    assert hit.kind is aker.HitKind.EXACT and hit.ids.tolist() == ids[:k].tolist()
    np.testing.assert_allclose(hit.distances, d[:k], rtol=1e-6)
    assert aside.fill(q, k, ids, d, vecs, token=miss.token) is False  # already cached


def test_search_aside_fills_k_plus_delta(aside: aker.Client, data: np.ndarray) -> None:
    backend = NumpyBackend(data)
    q, k = queries(1, seed=21)[0], 4
    first = aside.search_aside(q, k, backend)
    assert first.kind is aker.HitKind.MISS and first.ids.tolist() == exact(data, q, k).tolist()
    assert backend.calls == [k + DELTA]
    second = aside.search_aside(q, k, backend)
    assert second.kind is aker.HitKind.EXACT and second.ids.tolist() == first.ids.tolist()
    assert backend.calls == [k + DELTA]  # answered by the cache


def test_no_fill_brings_back_an_id_deleted_since_the_miss(aside: aker.Client, data: np.ndarray) -> None:
    backend = NumpyBackend(data)
    q, k = queries(1, seed=22)[0], 5
    miss = aside.search(q, k)
    ids, d, vecs = backend(q, k + DELTA)  # the answer as the database had it
    victim = int(ids[1])
    # Another connection deletes one of them before the FILL.
    with aker.Client(aside.address[0], aside.address[1]) as other:
        other.delete(victim)
    admitted = aside.fill(q, k, ids, d, vecs, token=miss.token)
    r = aside.search(q, k)
    assert victim not in r.ids.tolist()
    # Δ = 3: 8 candidates, the deleted one stripped, 7 >= k = 5 remain: admitted.
    assert admitted is True
    if admitted:
        assert r.kind is aker.HitKind.EXACT
        assert r.ids.tolist() == [i for i in ids.tolist() if i != victim][:k]


def test_fill_input_is_checked(aside: aker.Client) -> None:
    q = queries(1, seed=23)[0]
    v = np.ones((2, DIM), np.float32)
    with pytest.raises(aker.InvalidRequest):
        aside.fill(q, 1, [1, 2], [0.9, 0.1], v)  # not ascending
    with pytest.raises(aker.InvalidRequest):
        aside.fill(q, 1, [1, 1], [0.1, 0.9], v)  # repeated id
    with pytest.raises(aker.NonFinite):
        aside.fill(q, 1, [1, 2], [0.1, np.inf], v)
    with pytest.raises(aker.DimensionMismatch):
        aside.fill(q, 1, [1, 2], [0.1, 0.2], np.ones((2, DIM + 1)))
    with pytest.raises(aker.BadK):
        aside.fill(q, 0, [1, 2], [0.1, 0.2], v)
    # Fewer than k candidates: declined, not an error.
    assert aside.fill(q, 3, [1, 2], [0.1, 0.2], v) is False


def test_async_fill(akerd_aside: Akerd, data: np.ndarray) -> None:
    backend = NumpyBackend(data)

    async def body() -> None:
        async with await aker.AsyncClient.connect(akerd_aside.host, akerd_aside.port) as c:
            await c.flush()
            q, k = queries(1, seed=24)[0], 3
            miss = await c.search(q, k)
            assert miss.kind is aker.HitKind.MISS and miss.token is not None
            ids, d, vecs = backend(q, k + c.info.delta)
            assert await c.fill(q, k, ids, d, vecs, token=miss.token) is True
            assert (await c.search(q, k)).kind is aker.HitKind.EXACT
            q2 = queries(1, seed=25)[0]
            r = await c.search_aside(q2, k, backend)
            assert r.ids.tolist() == exact(data, q2, k).tolist()
            assert (await c.search_aside(q2, k, backend)).kind is aker.HitKind.EXACT

    run(body())
