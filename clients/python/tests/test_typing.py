"""The public API's types, as a type checker sees them and as they are at run time.

``mypy --strict`` (ci.sh) checks :func:`types_seen_by_mypy`, which never runs: each
``assert_type`` must hold exactly, and each ``# type: ignore[...]`` must be needed
(``warn_unused_ignores``), so a wrong keyword argument stays a type error. The tests
below check that the arrays really have the dtypes the annotations claim."""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

import aker

from conftest import K_MAX, queries, run

if TYPE_CHECKING:
    from typing_extensions import assert_type


def types_seen_by_mypy(
    c: aker.Client, a: aker.AsyncClient, cl: aker.Cluster, p: aker.Pool, ap: aker.AsyncPool, acl: aker.AsyncCluster
) -> None:
    q = np.zeros(8, np.float32)
    r = c.search(q, 3)
    assert_type(r, aker.SearchResult)
    assert_type(r.ids, npt.NDArray[np.uint64])
    assert_type(r.distances, npt.NDArray[np.float32])
    assert_type(r.kind, aker.HitKind)
    assert_type(r.token, int | None)
    ids, distances = r
    assert_type(ids, npt.NDArray[Any])
    b = c.search_batch([[0.0] * 8, [1.0] * 8], 3, errors="return")
    assert_type(b, aker.BatchResult)
    assert_type(b.ids, npt.NDArray[np.uint64])
    assert_type(b.distances, npt.NDArray[np.float32])
    assert_type(b.counts, npt.NDArray[np.int64])
    assert_type(b.statuses, npt.NDArray[np.uint16])
    assert_type(b.ok, npt.NDArray[np.bool_])
    assert_type(b.kinds, list[aker.HitKind])
    assert_type(b[0], aker.SearchResult)
    assert_type(b.hit_ratio, float)
    assert_type(c.insert(1, [0.0] * 8, payload=b"x"), None)
    assert_type(c.insert_with_position(1, q), int)
    assert_type(c.delete(1), bool)
    assert_type(c.delete_with_position(1), aker.Deleted)
    assert_type(c.ping(memoryview(b"x"), timeout=None), float)
    assert_type(c.stats(timeout=aker.DEFAULT), dict[str, int | float | str])
    assert_type(c.info, aker.ServerInfo)
    assert_type(c.cluster().centroids, npt.NDArray[np.float32])
    assert_type(aker.cluster.nearest_centroids(cl.state, q[None, :]), npt.NDArray[np.int64])

    # A pool's calls take the connection's keyword arguments, typed (TypedDicts).
    assert_type(p.search(q, 3, bypass_cache=True, at_position=5, timeout=1.0), aker.SearchResult)
    assert_type(p.search_batch(q[None, :], 3, errors="return"), aker.BatchResult)
    assert_type(p.delete_with_position(1, collection=2), aker.Deleted)
    assert_type(p.fill(q, 3, [1], [0.5], q[None, :], token=7), bool)

    async def async_calls() -> None:
        assert_type(await a.search(q, 3), aker.SearchResult)
        assert_type(await a.search_batch(q[None, :], 3), aker.BatchResult)
        assert_type(await ap.search(q, 3, deadline=0.5), aker.SearchResult)
        assert_type(await ap.insert_with_position(1, q, collection=1), int)
        await ap.search(q, 3, timout=1.0)  # type: ignore[call-arg]
        await ap.flush(timeout="soon")  # type: ignore[arg-type]
        acl2 = await aker.AsyncCluster.connect(["127.0.0.1:7700"], timeout=5.0)
        assert_type(acl2, aker.AsyncCluster)
        assert_type(await acl.search(q, 3, at_position=1), aker.SearchResult)
        assert_type(await acl.search_batch(q[None, :], 3), aker.BatchResult)
        assert_type(await acl.delete_with_position(1), aker.Deleted)
        assert_type(acl.owner_of(q), int | None)
        assert_type(acl.connections, dict[int, aker.AsyncClient])
        await aker.AsyncCluster.connect(["127.0.0.1:7700"], secret=7)  # type: ignore[arg-type]

    # Wrong types: each ignore is needed (strict mypy fails on an unused one).
    c.ping("text")  # type: ignore[arg-type]
    c.search(q, 3, timeout="soon")  # type: ignore[arg-type]
    aker.Pool("127.0.0.1", 7700, timout=5.0)  # type: ignore[call-arg]
    p.search(q, 3, bypass=True)  # type: ignore[call-arg]
    p.insert(1, q, collection="main")  # type: ignore[arg-type]
    p.stats(errors="return")  # type: ignore[call-arg]
    aker.AsyncPool("127.0.0.1", 7700, ssl=True)  # type: ignore[arg-type]
    aker.Cluster(["127.0.0.1:7700"], secret=7)  # type: ignore[arg-type]
    opts: aker.ClientOptions = {"timeout": 5.0, "ssl": ssl.create_default_context()}
    aker.Pool("127.0.0.1", 7700, **opts)


def check_dtypes(r: aker.SearchResult, b: aker.BatchResult) -> None:
    assert r.ids.dtype == np.uint64 and r.distances.dtype == np.float32
    assert b.ids.dtype == np.uint64 and b.distances.dtype == np.float32
    assert b.counts.dtype == np.int64 and b.statuses.dtype == np.uint16 and b.ok.dtype == np.bool_
    assert b[0].ids.dtype == np.uint64 and b[0].distances.dtype == np.float32
    assert all(isinstance(k, aker.HitKind) for k in b.kinds)


def test_the_arrays_have_the_annotated_dtypes(client: aker.Client) -> None:
    qs = queries(3, seed=70)
    # float64 and list input are converted; the results' dtypes do not depend on them.
    check_dtypes(client.search(qs[0].astype(np.float64), 4), client.search_batch(qs.tolist(), 4))
    check_dtypes(client.search(qs[1], K_MAX), client.search_batch(qs, 2, errors="return"))

    async def body() -> None:
        c = await aker.AsyncClient.connect(*client.address)
        async with c:
            r, b = await asyncio.gather(c.search(qs[2], 4), c.search_batch(qs, 4))
            check_dtypes(r, b)

    run(body())
