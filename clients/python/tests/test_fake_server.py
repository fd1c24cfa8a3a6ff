"""What a real akerd does not do on demand: old versions, silence, late or reordered
replies, connection-level BUSY. A scripted server on loopback stands in."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

import aker

from conftest import run
from fake_server import FakeConn, FakeServer, hello_body, search_body

DIM = 4


def first_component(body: bytes) -> int:
    """The SEARCH request's vector[0] (the tests put the row's index there)."""
    return int(struct.unpack_from("<f", body, 16)[0])


def server(
    versions: tuple[int, ...] = (1, 2, 3),
    max_inflight: int = 4,
    search_delay: Callable[[int], float] | None = None,
    reverse_batches: int = 0,
    seen: list[int] | None = None,
) -> Callable[[FakeConn], None]:
    """A handler: HELLO in ``versions``; SEARCH answered with id = vector[0], after
    ``search_delay(vector[0])`` seconds, or ``reverse_batches`` at a time in reverse."""
    newest = max(versions)

    def handle(c: FakeConn) -> None:
        lock = threading.Lock()
        outstanding = [0]
        batch: list[tuple[int, int, int, bytes]] = []

        def reply(version: int, op: int, rid: int, body: bytes) -> None:
            with lock:
                outstanding[0] -= 1
                try:
                    c.send(version, op, rid, body)
                except OSError:
                    pass

        while True:
            req = c.recv()
            if req is None:
                return
            version, op, _flags, rid, body = req
            if version not in versions:
                c.send(newest, op, rid, b"version not spoken", status=5)
                continue
            if op == 1:
                c.send(version, op, rid, hello_body(version, dim=DIM, max_inflight=max_inflight,
                                                    vmin=min(versions), vmax=newest))
            elif op == 2:
                c.send(version, op, rid, body)
            elif op == 3:
                i = first_component(body)
                out = search_body([i], [0.5])
                with lock:
                    outstanding[0] += 1
                    if seen is not None:
                        seen.append(outstanding[0])
                if reverse_batches:
                    batch.append((version, op, rid, out))
                    if len(batch) == reverse_batches:
                        for b in reversed(batch):
                            reply(*b)
                        batch.clear()
                elif search_delay is not None:
                    t = threading.Timer(search_delay(i), reply, (version, op, rid, out))
                    t.daemon = True
                    t.start()
                else:
                    reply(version, op, rid, out)

    return handle


def rows(n: int) -> np.ndarray:
    m = np.zeros((n, DIM), np.float32)
    m[:, 0] = np.arange(n)
    return m


def test_a_version_2_server_is_spoken_to_in_version_2() -> None:
    with FakeServer(server(versions=(1, 2))) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            assert c.version == 2 and c.info.version_max == 2 and not c.info.auth_required
            assert c.search(rows(3)[2], 1).ids.tolist() == [2]


def test_a_version_1_server_is_incompatible() -> None:
    with FakeServer(server(versions=(1,))) as fake:
        with pytest.raises(aker.IncompatibleServer):
            aker.Client("127.0.0.1", fake.port)

        async def body() -> None:
            with pytest.raises(aker.IncompatibleServer):
                await aker.AsyncClient.connect("127.0.0.1", fake.port)

        run(body())


def test_a_secret_is_refused_by_a_version_2_server() -> None:
    with FakeServer(server(versions=(2,))) as fake:
        with pytest.raises(aker.ServerNotAuthentic):
            aker.Client("127.0.0.1", fake.port, secret=b"a shared secret of some length")


def test_connection_level_busy() -> None:
    def full(c: FakeConn) -> None:
        # Read the HELLO first: closing with it unread would reset the connection, and
        # a reset can discard the BUSY before the client reads it.
        c.recv()
        c.send(1, 0, 0, b"max_connections", status=2)

    with FakeServer(full) as fake:
        with pytest.raises(aker.Busy) as e:
            aker.Client("127.0.0.1", fake.port)
        assert e.value.request_id == 0

        async def body() -> None:
            with pytest.raises(aker.Busy):
                await aker.AsyncClient.connect("127.0.0.1", fake.port)

        run(body())


def test_a_silent_server_times_out() -> None:
    def silent(c: FakeConn) -> None:
        while c.recv() is not None:
            pass

    with FakeServer(silent) as fake:
        t0 = time.monotonic()
        with pytest.raises(aker.Timeout) as e:
            aker.Client("127.0.0.1", fake.port, connect_timeout=0.3)
        assert isinstance(e.value, TimeoutError) and time.monotonic() - t0 < 5

        async def body() -> None:
            with pytest.raises(aker.Timeout):
                await aker.AsyncClient.connect("127.0.0.1", fake.port, connect_timeout=0.3)

        run(body())


def slow_first(i: int) -> float:
    return 0.8 if i == 0 else 0.0


def test_a_request_timeout_keeps_the_connection() -> None:
    with FakeServer(server(search_delay=slow_first)) as fake:
        with aker.Client("127.0.0.1", fake.port, timeout=0.2) as c:
            with pytest.raises(aker.Timeout):
                c.search(rows(1)[0], 1)
            assert c.ping() >= 0  # answered while the late reply is still to come
            # Answered at once, before the late reply (due 0.8 s after the first search).
            r = c.search(rows(2)[1], 1, timeout=5.0)
            assert r.ids.tolist() == [1]
            assert c._abandoned and c._counted_out == 1  # the timed-out one, still out
            time.sleep(0.9)
            # The late reply has come by now: this call reads it first and drops it.
            assert c.search(rows(4)[3], 1).ids.tolist() == [3]
            for _ in range(100):  # bounded: should already be so
                if not c._abandoned:
                    break
                c.ping()
                time.sleep(0.05)
            assert c._abandoned == {} and c._counted_out == 0 and not c.closed


def test_async_request_timeout_keeps_the_connection() -> None:
    async def body() -> None:
        with FakeServer(server(search_delay=slow_first)) as fake:
            c = await aker.AsyncClient.connect("127.0.0.1", fake.port, timeout=0.2)
            try:
                with pytest.raises(aker.Timeout):
                    await c.search(rows(1)[0], 1)
                assert await c.ping() >= 0
                assert (await c.search(rows(2)[1], 1, timeout=5.0)).ids.tolist() == [1]
                for _ in range(100):  # the late reply frees its window slot (bounded)
                    if c.in_flight == 0:
                        break
                    await asyncio.sleep(0.05)
                assert c.in_flight == 0 and not c.closed
            finally:
                await c.close()

    run(body())


def test_replies_out_of_order_are_matched_by_id() -> None:
    with FakeServer(server(reverse_batches=4)) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            b = c.search_batch(rows(8), 1)
            assert b.ids[:, 0].tolist() == list(range(8))
            assert b.counts.tolist() == [1] * 8
            assert b.ids[0].tolist() == [0] and b.distances[0].tolist() == [0.5]

        async def body() -> None:
            async with await aker.AsyncClient.connect("127.0.0.1", fake.port) as a:
                got = await a.search_batch(rows(8), 1)
                assert got.ids[:, 0].tolist() == list(range(8))

        run(body())


def test_fewer_neighbours_than_k_are_padded() -> None:
    with FakeServer(server()) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            b = c.search_batch(rows(2), 3)
            assert b.ids.shape == (2, 3) and b.counts.tolist() == [1, 1]
            assert b.ids[0, 1] == aker.NO_ID and np.isinf(b.distances[0, 1])
            assert len(b[1]) == 1


def test_the_window_never_exceeds_max_inflight() -> None:
    seen: list[int] = []
    with FakeServer(server(max_inflight=3, search_delay=lambda i: 0.02, seen=seen)) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            assert c.window == 3
            b = c.search_batch(rows(20), 1)
            assert b.ids[:, 0].tolist() == list(range(20))
        assert max(seen) == 3

        seen.clear()

        async def body() -> None:
            async with await aker.AsyncClient.connect("127.0.0.1", fake.port) as a:
                got = await asyncio.gather(*(a.search(r, 1) for r in rows(20)))
                assert [int(r.ids[0]) for r in got] == list(range(20))
                assert (await a.search_batch(rows(12), 1)).ids[:, 0].tolist() == list(range(12))

        run(body())
        assert max(seen) == 3


def hello_then(on_search: Callable[[FakeConn, int, int], None], *, max_inflight: int = 4, dim: int = DIM,
               after_ping: Callable[[FakeConn], None] | None = None) -> Callable[[FakeConn], None]:
    """A handler: HELLO (v3), PING echoed, SEARCH handed to ``on_search(conn, version, rid)``."""

    def handle(c: FakeConn) -> None:
        while True:
            req = c.recv()
            if req is None:
                return
            version, op, _flags, rid, body = req
            if op == 1:
                c.send(version, op, rid, hello_body(version, dim=dim, max_inflight=max_inflight))
            elif op == 2:
                c.send(version, op, rid, body)
                if after_ping is not None:
                    after_ping(c)
            elif op == 3:
                on_search(c, version, rid)

    return handle


def drop_connection(c: FakeConn, version: int, rid: int) -> None:
    time.sleep(0.2)
    c.sock.shutdown(2)
    c.sock.close()


def never_answer(c: FakeConn, version: int, rid: int) -> None:
    pass


def test_async_window_waiters_wake_when_the_connection_dies() -> None:
    async def body() -> None:
        with FakeServer(hello_then(drop_connection, max_inflight=1)) as fake:
            c = await aker.AsyncClient.connect("127.0.0.1", fake.port, timeout=30.0)
            try:
                assert c.window == 1
                t0 = time.monotonic()
                out = await asyncio.wait_for(
                    asyncio.gather(c.search(rows(1)[0], 1), c.search(rows(2)[1], 1), return_exceptions=True), 5.0)
                assert all(isinstance(e, aker.ConnectionClosed) for e in out), out
                assert time.monotonic() - t0 < 5 and c.closed
            finally:
                await c.close()

    run(body())


def test_close_from_another_thread_interrupts_a_blocked_call() -> None:
    with FakeServer(hello_then(never_answer)) as fake:
        c = aker.Client("127.0.0.1", fake.port, timeout=30.0)
        got: list[BaseException] = []

        def call() -> None:
            try:
                c.search(rows(1)[0], 1)
            except BaseException as e:  # checked below
                got.append(e)

        t = threading.Thread(target=call)
        t.start()
        time.sleep(0.2)
        t0 = time.monotonic()
        c.close()
        t.join(5.0)
        assert not t.is_alive() and time.monotonic() - t0 < 5
        assert len(got) == 1 and isinstance(got[0], aker.ConnectionClosed), got
        assert c.closed


def test_a_window_full_of_abandoned_requests_closes_the_connection() -> None:
    with FakeServer(hello_then(never_answer, max_inflight=1)) as fake:
        with aker.Client("127.0.0.1", fake.port, timeout=0.2) as c:
            with pytest.raises(aker.Timeout):
                c.search(rows(1)[0], 1)
            assert not c.closed  # one timeout: the connection stays
            with pytest.raises(aker.Timeout):
                c.search(rows(2)[1], 1)  # nothing could be sent: the window is full
            assert c.closed
        with aker.Pool("127.0.0.1", fake.port, size=1, timeout=0.2) as pool:
            for _ in range(2):
                with pytest.raises(aker.Timeout):
                    pool.search(rows(2)[1], 1)
            assert pool._count == 0 and pool._idle == []  # the broken one was dropped


def test_the_pool_does_not_lend_a_connection_the_server_closed() -> None:
    def close_after_ping(c: FakeConn) -> None:
        c.sock.shutdown(2)

    with FakeServer(hello_then(never_answer, after_ping=close_after_ping)) as fake:
        with aker.Pool("127.0.0.1", fake.port, size=1) as pool:
            assert pool.ping() >= 0
            time.sleep(0.2)  # the server has closed the idle connection
            assert pool.ping() >= 0  # on a new connection, not the dead one
            assert pool._count == 1


def test_a_frame_limit_below_one_search_is_incompatible() -> None:
    with FakeServer(hello_then(never_answer, dim=20000)) as fake:  # 80 KB vectors, 64 KiB frames
        with pytest.raises(aker.IncompatibleServer):
            aker.Client("127.0.0.1", fake.port)

        async def body() -> None:
            with pytest.raises(aker.IncompatibleServer):
                await aker.AsyncClient.connect("127.0.0.1", fake.port)

        run(body())
