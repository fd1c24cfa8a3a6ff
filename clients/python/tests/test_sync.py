"""The blocking client against a real akerd (exact store over a known collection)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import aker

from akerd_process import Akerd
from conftest import (
    DELTA,
    DIM,
    K_MAX,
    MAX_FRAME,
    MAX_INFLIGHT,
    batch_until,
    exact,
    newest_version,
    queries,
    search_until,
)

EXACT = aker.HitKind.EXACT


def test_hello_is_checked_and_remembered(client: aker.Client) -> None:
    i = client.info
    assert (i.dim, i.metric, i.k_max, i.delta, i.max_inflight, i.max_frame_bytes) == (
        DIM, aker.Metric.L2SQ, K_MAX, DELTA, MAX_INFLIGHT, MAX_FRAME)
    assert client.version == newest_version(i) and i.version_max >= 5 and not i.auth_required
    # max_batch defaults to 256, capped by max_inflight: HELLO reports the cap.
    assert i.max_batch == MAX_INFLIGHT and client.window == MAX_INFLIGHT


def test_expectations_refuse_another_server(akerd: Akerd) -> None:
    with pytest.raises(aker.IncompatibleServer):
        aker.Client(akerd.host, akerd.port, expect_dim=DIM + 1)
    with pytest.raises(aker.IncompatibleServer):
        aker.Client(akerd.host, akerd.port, expect_metric=aker.Metric.COSINE)
    with aker.Client(akerd.host, akerd.port, expect_dim=DIM, expect_metric=aker.Metric.L2SQ, window=100) as c:
        assert c.window == MAX_INFLIGHT  # never above the server's max_inflight


def test_search_is_exact_then_cached(client: aker.Client, data: np.ndarray) -> None:
    for q in queries(5):
        want = exact(data, q, 7)
        r = client.search(q, 7)
        assert r.kind is aker.HitKind.MISS and not r.hit
        assert r.ids.dtype == np.uint64 and r.distances.dtype == np.float32
        assert r.ids.tolist() == want.tolist()
        d = ((data[want.astype(np.int64)] - q) ** 2).sum(axis=1)
        np.testing.assert_allclose(r.distances, d, rtol=1e-4, atol=1e-5)
        again = search_until(client, q, 7, EXACT)
        assert again.kind is aker.HitKind.EXACT and again.ids.tolist() == want.tolist()
        # An entry cached for k answers a smaller k from its prefix.
        small = client.search(q, 3)
        assert small.kind is aker.HitKind.EXACT and small.ids.tolist() == want[:3].tolist()


def test_any_dtype_and_layout_is_converted(client: aker.Client, data: np.ndarray) -> None:
    q = queries(1, seed=3)[0]
    want = exact(data, q, 4).tolist()
    wide = np.zeros((DIM, 2))
    wide[:, 0] = q
    for v in (q.astype(np.float64), q.tolist(), wide[:, 0], q.astype(">f4")):
        assert client.search(v, 4, bypass_cache=True).ids.tolist() == want
    ints = np.arange(DIM, dtype=np.int32)
    assert client.search(ints, 4, bypass_cache=True).ids.tolist() == exact(data, ints, 4).tolist()


def test_flags_bypass_and_refresh(client: aker.Client, data: np.ndarray) -> None:
    q = queries(1, seed=4)[0]
    assert client.search(q, 5, bypass_cache=True).kind is aker.HitKind.MISS
    assert client.search(q, 5).kind is aker.HitKind.MISS  # bypass cached nothing
    assert search_until(client, q, 5, EXACT).kind is aker.HitKind.EXACT
    r = client.search(q, 5, refresh_entry=True)
    assert r.kind is aker.HitKind.MISS and r.ids.tolist() == exact(data, q, 5).tolist()
    assert search_until(client, q, 5, EXACT, deadline=2.0).kind is aker.HitKind.EXACT


def test_insert_then_delete(client: aker.Client, data: np.ndarray) -> None:
    q = queries(1, seed=5)[0]
    new_id = 1_000_000
    client.insert(new_id, q, payload=b"kept nowhere (embedded)")
    r = client.search(q, 5)
    assert r.ids[0] == new_id and r.distances[0] == 0.0
    assert search_until(client, q, 5, EXACT).kind is aker.HitKind.EXACT
    assert client.delete(new_id) is True
    assert client.delete(new_id) is False
    r = client.search(q, 5)
    assert new_id not in r.ids.tolist()
    assert r.ids.tolist() == exact(data, q, 5).tolist()


def test_writes_report_position_0_and_searches_take_one(client: aker.Client, data: np.ndarray) -> None:
    # The embedded store (v5): every acknowledged write is in the cache, so its position is
    # 0, and a search at any position is served as usual.
    q = queries(1, seed=15)[0]
    new_id = 1_000_005
    assert client.insert_with_position(new_id, q) == 0
    r = client.search(q, 5, at_position=0x16_B374_D848)
    assert r.ids[0] == new_id
    gone = client.delete_with_position(new_id)
    assert gone == aker.Deleted(existed=True, position=0)
    r = client.search(q, 5, at_position=gone.position)
    assert new_id not in r.ids.tolist() and r.ids.tolist() == exact(data, q, 5).tolist()
    b = client.search_batch(queries(3, seed=16), 4, at_position=1)
    assert b.ok.all() and b.ids.shape == (3, 4)
    stats = client.stats()
    assert int(stats["searches_at_position"]) >= 5 and stats["searches_position_database"] == 0


def test_a_deleted_id_is_never_returned(client: aker.Client, data: np.ndarray) -> None:
    qs = queries(12, seed=6)
    k = 5
    first = client.search_batch(qs, k)
    assert batch_until(client, qs, k, EXACT).kinds == [aker.HitKind.EXACT] * len(qs)
    gone = sorted({int(i) for i in first.ids[:, 0]})
    try:
        for i in gone:
            assert client.delete(i) is True
        for _ in range(2):  # from the cache's reserve (Δ), then again
            b = client.search_batch(qs, k)
            assert not set(b.ids.ravel().tolist()) & set(gone)
            for row, q in enumerate(qs):
                assert b.ids[row].tolist() == exact(data, q, k, exclude=gone).tolist()
        for q in qs:
            assert not set(client.search(q, K_MAX, bypass_cache=True).ids.tolist()) & set(gone)
    finally:
        for i in gone:
            client.insert(i, data[i])


def test_search_batch_is_pipelined_and_in_order(client: aker.Client, data: np.ndarray) -> None:
    qs = queries(60, seed=8)  # many more than max_inflight: the window is used
    b = client.search_batch(qs, 6)
    assert b.ids.shape == (60, 6) and b.distances.shape == (60, 6) and len(b) == 60
    assert b.ids.dtype == np.uint64 and b.distances.dtype == np.float32
    assert b.kinds == [aker.HitKind.MISS] * 60 and b.hit_ratio == 0.0
    for row, q in enumerate(qs):
        assert b.ids[row].tolist() == exact(data, q, 6).tolist()
    again = batch_until(client, qs.astype(np.float64), 6, EXACT)
    assert again.hit_ratio == 1.0 and np.array_equal(again.ids, b.ids)
    one = again[3]
    assert one.kind is aker.HitKind.EXACT and one.ids.tolist() == b.ids[3].tolist()
    assert client.stats()["server_busy_inflight"] == 0
    empty = client.search_batch(np.zeros((0, DIM), np.float32), 3)
    assert empty.ids.shape == (0, 3) and empty.kinds == []


def test_pipeline_mixed_operations(client: aker.Client, data: np.ndarray) -> None:
    q = queries(1, seed=9)[0]
    with client.pipeline() as p:
        p.search(q, 3)
        p.ping(b"echo")
        p.stats()
        p.delete(2_000_000)
        # Far from q: the search runs concurrently and must not depend on this insert.
        p.insert(2_000_001, q + 1000.0)
        assert len(p) == 5
    r, pong, stats, existed, inserted = p.results
    assert isinstance(r, aker.SearchResult) and r.ids.tolist() == exact(data, q, 3).tolist()
    assert pong == b"echo" and isinstance(stats, dict) and existed is False and inserted is None
    assert client.delete(2_000_001) is True


def test_pipeline_errors_in_place_or_raised(client: aker.Client) -> None:
    q = queries(1, seed=10)[0]
    p = client.pipeline()
    p.search(q, 2)
    p.search(q, 2, collection=7)
    p.ping()
    out = p.execute(return_exceptions=True)
    assert isinstance(out[0], aker.SearchResult) and out[2] == b""
    assert isinstance(out[1], aker.UnknownCollection) and not out[1].local
    p.search(q, 2, collection=7)
    with pytest.raises(aker.UnknownCollection):
        p.execute()
    assert client.ping() > 0  # the connection stays


def test_stats_ping_flush(client: aker.Client) -> None:
    q = queries(1, seed=11)[0]
    client.search(q, 4)
    assert search_until(client, q, 4, EXACT).hit
    stats = client.stats()
    assert isinstance(stats["server_requests"], int) and stats["server_requests"] > 0
    assert client.ping(b"x" * 100) > 0
    client.flush()
    assert client.search(q, 4).kind is aker.HitKind.MISS


def test_bad_input_is_refused_before_sending(client: aker.Client) -> None:
    before = int(client.stats()["server_requests"])
    q = queries(1)[0]
    nan = q.copy()
    nan[2] = np.nan
    cases: list[Any] = [
        (lambda: client.search(q[:-1], 3), aker.DimensionMismatch),
        (lambda: client.search(np.stack([q, q]), 3), aker.DimensionMismatch),
        (lambda: client.search(nan, 3), aker.NonFinite),
        (lambda: client.search(q, K_MAX + 1), aker.BadK),
        (lambda: client.search(q, 0), aker.BadK),
        (lambda: client.insert(5, nan), aker.NonFinite),
        (lambda: client.insert(5, q, payload=bytes(MAX_FRAME)), aker.TooLarge),
        (lambda: client.search_batch(np.ones((3, DIM + 1)), 3), aker.DimensionMismatch),
        (lambda: client.search_batch(np.stack([q, nan]), 3), aker.NonFinite),
        # Wrong types on purpose: refused at run time as well.
        (lambda: client.ping("x"), aker.InvalidRequest),  # type: ignore[arg-type]  # str: no one encoding
        (lambda: client.ping(5), aker.InvalidRequest),  # type: ignore[arg-type]  # not five zero bytes
        (lambda: client.insert(5, q, payload="x"), aker.InvalidRequest),  # type: ignore[arg-type]
        (lambda: client.search(q, 3, deadline="soon"), aker.InvalidRequest),  # type: ignore[arg-type]
        (lambda: client.fill(q, 1, [1], ["near"], [q]), aker.InvalidRequest),
        (lambda: aker.Client(*client.address, window=0), aker.InvalidRequest),
        (lambda: aker.Client(*client.address, expect_metric=99), aker.InvalidRequest),  # type: ignore[arg-type]
        (lambda: aker.Pool(*client.address, size=0), aker.InvalidRequest),
        (lambda: aker.AsyncPool(*client.address, size=0), aker.InvalidRequest),
        (lambda: client.fill(q, 3, [1], [0.0], [q]), None),  # reaches the server: UNSUPPORTED
    ]
    for call, cls in cases[:-1]:
        with pytest.raises(cls) as e:
            call()
        assert e.value.local and isinstance(e.value, ValueError) and isinstance(e.value, aker.AkerError)
    # STATS counts itself: one more request, nothing from the refused ones.
    assert client.stats()["server_requests"] == before + 1
    # bytes-like payloads are all accepted
    assert client.ping(bytearray(b"ab")) > 0 and client.ping(memoryview(b"cd")) > 0
    with pytest.raises(aker.Unsupported) as e2:
        cases[-1][0]()
    assert not e2.value.local


def test_server_statuses_map_to_their_exceptions(client: aker.Client) -> None:
    """What the server refuses itself (the client's own check moved out of the way)."""
    q = queries(1)[0]
    real = client._codec.info
    try:
        client._codec.info = aker.ServerInfo(**{**real.__dict__, "k_max": 1000})
        with pytest.raises(aker.BadK) as e:
            client.search(q, 1000)
        client._codec.info = aker.ServerInfo(**{**real.__dict__, "dim": DIM + 1})
        with pytest.raises(aker.DimensionMismatch) as e2:
            client.search(q.tolist() + [0.0], 3)
    finally:
        client._codec.info = real
    assert not e.value.local and e.value.request_id > 0 and not e2.value.local
    with pytest.raises(aker.UnknownCollection):
        client.search(q, 3, collection=3)
    with pytest.raises(aker.UnknownCollection):
        client.insert(3, q, collection=3)
    assert client.search(q, 3).kind is aker.HitKind.MISS  # still connected


def test_the_server_deadline(client: aker.Client) -> None:
    q = queries(1, seed=12)[0]
    kinds: dict[str, int] = {}
    for _ in range(20):  # 1 µs: a backend search cannot make it (bounded retries)
        try:
            client.search(q, K_MAX, bypass_cache=True, deadline=1e-6)
            kinds["ok"] = kinds.get("ok", 0) + 1
        except aker.DeadlineExceeded as e:
            assert not e.local
            kinds["late"] = kinds.get("late", 0) + 1
            break
    assert kinds.get("late") == 1, kinds


def test_a_closed_client_refuses_calls(akerd: Akerd) -> None:
    c = aker.Client(akerd.host, akerd.port)
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(aker.ConnectionClosed):
        c.ping()


def test_connect_refused_is_a_connection_error() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(aker.AkerConnectionError):
        aker.Client("127.0.0.1", port, connect_timeout=2.0)


def test_pool_shares_connections_between_threads(akerd: Akerd, data: np.ndarray) -> None:
    qs = queries(24, seed=13)
    errors: list[BaseException] = []
    with aker.Pool(akerd.host, akerd.port, size=3, timeout=10.0) as pool:
        assert pool.info.dim == DIM

        def work(rows: np.ndarray) -> None:
            try:
                for q in rows:
                    r = pool.search(q, 4, bypass_cache=True)
                    assert r.ids.tolist() == exact(data, q, 4).tolist()
                b = pool.search_batch(rows, 4, bypass_cache=True)
                assert b.ids[0].tolist() == exact(data, rows[0], 4).tolist()
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(qs[i::6],)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        assert pool._count <= 3
        assert pool.ping() > 0 and isinstance(pool.stats(), dict)
        pool.insert(3_000_000, qs[0])
        assert pool.delete(3_000_000) is True
        pool.flush()
