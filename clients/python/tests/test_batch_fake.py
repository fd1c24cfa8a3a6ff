"""search_batch against a scripted server: SEARCH_BATCH frames (v4) chunked by max_batch,
the frame size and the reply bound, the window counted in rows, per-row errors raised or
returned, and the same answers through pipelined SEARCHes from a version 3 server."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

import aker
from aker.aio import _Slots

from conftest import run
from fake_server import FakeConn, FakeServer, batch_body, batch_item, hello_body, parse_batch, search_body

DIM = 4
OP_SEARCH, OP_BATCH = 0x03, 0x0A

#: opcode, flags, k, deadline_us, the rows' first components (the row numbers)
Seen = tuple[int, int, int, int, list[int]]


def rows(n: int, start: int = 0, dim: int = DIM) -> np.ndarray:
    """Row i's first component is ``start + i``: the fake answers with it as the first id."""
    m = np.zeros((n, dim), np.float32)
    m[:, 0] = np.arange(start, start + n)
    return m


def answer(i: int, k: int) -> tuple[list[int], list[float]]:
    """The fake's k neighbours of row i: ids i, i + 1000, ...; distances 0.5, 1.5, ..."""
    return [i + 1000 * j for j in range(k)], [0.5 + j for j in range(k)]


class Fake:
    """A v4 (or older) akerd stand-in that records what it is sent and the most window
    slots its requests held at once (a SEARCH_BATCH of n rows holds n, as akerd)."""

    def __init__(self, *, versions: tuple[int, ...] = (1, 2, 3, 4), dim: int = DIM, k_max: int = 16,
                 max_inflight: int = 8, max_batch: int = 4, max_frame: int = 1 << 16,
                 row_status: Callable[[int], int] | None = None,
                 frame_status: Callable[[list[int]], int] | None = None,
                 delay: Callable[[int], float] | None = None) -> None:
        self.versions, self.dim, self.k_max = versions, dim, k_max
        self.max_inflight, self.max_batch, self.max_frame = max_inflight, max_batch, max_frame
        self.row_status = row_status or (lambda i: 0)
        self.frame_status = frame_status or (lambda rs: 0)
        self.delay = delay or (lambda i: 0.0)
        self.seen: list[Seen] = []
        self.held = 0
        self.most = 0
        self.busy = 0
        self.lock = threading.Lock()
        self.server = FakeServer(self.handle)
        self.port = self.server.port

    def __enter__(self) -> Fake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        assert not [e for e in self.server.errors if isinstance(e, AssertionError)], self.server.errors

    def batches(self) -> list[int]:
        """The row count of every SEARCH_BATCH frame, in arrival order."""
        return [len(s[4]) for s in self.seen if s[0] == OP_BATCH]

    def _take(self, n: int) -> bool:
        with self.lock:
            if self.held + n > self.max_inflight:
                self.busy += 1
                return False
            self.held += n
            self.most = max(self.most, self.held)
            return True

    def _reply(self, c: FakeConn, version: int, op: int, rid: int, body: bytes, status: int, n: int) -> None:
        with self.lock:
            self.held -= n  # free before the reply is sent, as akerd does
            assert 20 + len(body) <= self.max_frame, f"reply of {20 + len(body)} bytes"
            try:
                c.send(version, op, rid, body, status=status)
            except OSError:
                pass

    def _later(self, first: int, *args: object) -> None:
        t = threading.Timer(self.delay(first), self._reply, args)
        t.daemon = True
        t.start()

    def _search(self, c: FakeConn, version: int, flags: int, rid: int, body: bytes) -> None:
        _coll, k, deadline, _n = struct.unpack_from("<4I", body, 0)
        i = int(struct.unpack_from("<f", body, 16)[0])
        self.seen.append((OP_SEARCH, flags, k, deadline, [i]))
        if not self._take(1):
            c.send(version, OP_SEARCH, rid, b"busy", status=2)
            return
        status = self.row_status(i) or self.frame_status([i])
        out = b"row %d failed" % i if status else search_body(*answer(i, k), hit=1)
        self._later(i, c, version, OP_SEARCH, rid, out, status, 1)

    def _batch(self, c: FakeConn, version: int, flags: int, rid: int, body: bytes) -> None:
        assert version >= 4, f"SEARCH_BATCH in a version {version} frame"
        assert 20 + len(body) <= self.max_frame, f"request of {20 + len(body)} bytes"
        _coll, k, deadline, n, queries = parse_batch(body)
        assert n == self.dim and 1 <= len(queries) <= self.max_batch, (n, len(queries))
        assert 24 + len(queries) * (16 + 12 * k) <= self.max_frame, "the reply could be too large"
        rs = [int(q[0]) for q in queries]
        self.seen.append((OP_BATCH, flags, k, deadline, rs))
        if not self._take(len(rs)):
            c.send(version, OP_BATCH, rid, b"busy", status=2)
            return
        status = self.frame_status(rs)
        items = [batch_item(*answer(i, k), hit=1, status=self.row_status(i)) for i in rs]
        out = b"the frame failed" if status else batch_body(items)
        self._later(rs[0], c, version, OP_BATCH, rid, out, status, len(rs))

    def handle(self, c: FakeConn) -> None:
        newest = max(self.versions)
        while True:
            req = c.recv()
            if req is None:
                return
            version, op, flags, rid, body = req
            if version not in self.versions:
                c.send(newest, op, rid, b"version not spoken", status=5)
            elif op == 1:
                c.send(version, op, rid, hello_body(
                    version, dim=self.dim, k_max=self.k_max, max_inflight=self.max_inflight, vmin=min(self.versions),
                    vmax=newest, max_frame=self.max_frame, max_batch=self.max_batch))
            elif op == 2:
                c.send(version, op, rid, body)
            elif op == OP_SEARCH:
                self._search(c, version, flags, rid, body)
            elif op == OP_BATCH:
                self._batch(c, version, flags, rid, body)


def check_answers(b: aker.BatchResult, first: int, n: int, k: int) -> None:
    assert len(b) == n and b.ids.shape == (n, k) and b.statuses.tolist() == [0] * n
    for r in range(n):
        ids, dists = answer(first + r, k)
        assert b.ids[r].tolist() == ids and b.distances[r].tolist() == dists
    assert b.kinds == [aker.HitKind.EXACT] * n and b.counts.tolist() == [k] * n and b.ok.all()


# ---------------------------------------------------------------------------- HELLO, chunking


def test_a_v4_server_reports_max_batch_and_gets_search_batch_frames() -> None:
    with Fake(max_batch=4, max_inflight=8) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            assert c.version == 4 and c.info.max_batch == 4 and c.info.version_max == 4
            b = c.search_batch(rows(10), 2, bypass_cache=True, deadline=0.25)
            check_answers(b, 0, 10, 2)
        assert fake.batches() == [4, 4, 2]
        assert [s[4] for s in fake.seen] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        assert all(s[1] == 0x1 and s[2] == 2 and s[3] == 250_000 for s in fake.seen)
        assert not [s for s in fake.seen if s[0] == OP_SEARCH]


def test_a_v3_server_gets_one_search_per_row_with_the_same_answer() -> None:
    got = []
    for versions in ((1, 2, 3, 4), (1, 2, 3), (2,)):
        with Fake(versions=versions) as fake:
            with aker.Client("127.0.0.1", fake.port) as c:
                assert c.version == max(versions)
                assert (c.info.max_batch is None) is (max(versions) < 4)
                got.append(c.search_batch(rows(9), 3, refresh_entry=True))
            ops = {s[0] for s in fake.seen}
            assert ops == ({OP_BATCH} if max(versions) == 4 else {OP_SEARCH})
            assert all(s[1] == 0x2 for s in fake.seen)
    for b in got:
        check_answers(b, 0, 9, 3)
        assert np.array_equal(b.ids, got[0].ids) and np.array_equal(b.distances, got[0].distances)
        assert b.distances_to_query == got[0].distances_to_query == [True] * 9


def test_chunks_fit_the_request_frame() -> None:
    # 40 + 4 * 1000 * count <= 65536: at most 16 rows of dimension 1000 a frame.
    with Fake(dim=1000, max_batch=64, max_inflight=64) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            check_answers(c.search_batch(rows(40, dim=1000), 1), 0, 40, 1)
        assert fake.batches() == [16, 16, 8]


def test_chunks_fit_the_largest_reply() -> None:
    # 24 + count * (16 + 12 * 500) <= 65536: at most 10 rows at k = 500 (11 would be 66,200 bytes).
    with Fake(k_max=512, max_batch=64, max_inflight=64) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            check_answers(c.search_batch(rows(25), 500), 0, 25, 500)
            check_answers(c.search_batch(rows(25), 1), 0, 25, 1)
        assert fake.batches() == [10, 10, 5, 25]


def test_not_one_row_fits_a_batch_frame_so_searches_go() -> None:
    # One SEARCH of dimension 16,375 just fits 64 KiB (36 + 65,500 bytes); a batch of one
    # row is 4 bytes more (its count).
    with Fake(dim=16375, max_frame=65536) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            assert c._codec.batch_count(1, c.window, 1 << 30) == 0
            check_answers(c.search_batch(rows(3, dim=16375), 1), 0, 3, 1)
        assert {s[0] for s in fake.seen} == {OP_SEARCH} and len(fake.seen) == 3
    with Fake(dim=16374, max_frame=65536) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            assert c._codec.batch_count(1, c.window, 1 << 30) == 1
            check_answers(c.search_batch(rows(3, dim=16374), 1), 0, 3, 1)
        assert fake.batches() == [1, 1, 1]


def test_an_empty_matrix_sends_nothing() -> None:
    with Fake() as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            b = c.search_batch(np.zeros((0, DIM), np.float32), 3)
            assert b.ids.shape == (0, 3) and b.kinds == [] and b.statuses.shape == (0,)
        assert fake.seen == []


# ---------------------------------------------------------------------------- the window


def slow(i: int) -> float:
    # Long enough that every chunk the window holds is sent before the first is
    # answered, even on a loaded machine: the tests count the most in flight.
    return 0.25


def test_the_window_counts_rows_and_pipelines_chunks() -> None:
    with Fake(max_batch=4, max_inflight=8, delay=slow) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            check_answers(c.search_batch(rows(24), 1), 0, 24, 1)
        assert fake.most == 8 and fake.busy == 0  # two chunks of 4 in flight, never more
        fake.most = 0
        with aker.Client("127.0.0.1", fake.port, window=6) as c:
            check_answers(c.search_batch(rows(12), 1), 0, 12, 1)
        assert fake.most == 4 and fake.busy == 0 and fake.batches()[-3:] == [4, 4, 4]
        fake.most = 0
        with aker.Client("127.0.0.1", fake.port, window=3) as c:
            check_answers(c.search_batch(rows(7), 1), 0, 7, 1)
        assert fake.most == 3 and fake.batches()[-3:] == [3, 3, 1]


def late_first(i: int) -> float:
    return 0.8 if i == 0 else 0.0


def test_a_timed_out_request_keeps_its_slot_from_a_batch() -> None:
    with Fake(max_batch=4, max_inflight=4, delay=late_first) as fake:
        with aker.Client("127.0.0.1", fake.port, timeout=0.3) as c:
            with pytest.raises(aker.Timeout):
                c.search(rows(1)[0], 1)
            t0 = time.monotonic()
            # 4 rows need the whole window: sent once the late reply freed its slot.
            check_answers(c.search_batch(rows(4, start=1), 1, timeout=5.0), 1, 4, 1)
            assert time.monotonic() - t0 > 0.2 and c._counted_out == 0 and not c._abandoned
        assert fake.busy == 0 and fake.most == 4


def test_async_batches_and_searches_share_the_window() -> None:
    async def body() -> None:
        with Fake(max_batch=4, max_inflight=6, delay=slow) as fake:
            async with await aker.AsyncClient.connect("127.0.0.1", fake.port) as c:
                assert c.version == 4 and c.info.max_batch == 4
                # All at once (the tasks made in this order): two batches, six searches.
                (b12, b5), singles = await asyncio.gather(
                    asyncio.gather(c.search_batch(rows(12), 1), c.search_batch(rows(5, start=100), 1)),
                    asyncio.gather(*(c.search(r, 1) for r in rows(6, start=200))))
                check_answers(b12, 0, 12, 1)
                check_answers(b5, 100, 5, 1)
                assert [int(r.ids[0]) for r in singles] == list(range(200, 206))
                assert c.in_flight == 0 and c._slots is not None and c._slots.used == 0
            assert fake.busy == 0 and fake.most == 6
            assert sorted(fake.batches()) == [1, 4, 4, 4, 4]

    run(body())


def tenth(i: int) -> float:
    return 0.1


def test_an_async_call_waits_behind_one_chunk_not_the_whole_batch() -> None:
    """64 rows in chunks as wide as the window (8) take 8 round trips; a search made on
    the same connection meanwhile queues behind one chunk, so it is answered long before
    the batch is."""
    async def body() -> None:
        with Fake(max_batch=8, max_inflight=8, delay=tenth) as fake:
            async with await aker.AsyncClient.connect("127.0.0.1", fake.port) as c:
                loop = asyncio.get_running_loop()
                done: dict[str, float] = {}

                async def batch() -> None:
                    check_answers(await c.search_batch(rows(64), 1), 0, 64, 1)
                    done["batch"] = loop.time()

                async def one() -> None:
                    await asyncio.sleep(0.05)
                    r = await c.search(rows(1, start=500)[0], 1)
                    assert int(r.ids[0]) == 500
                    done["search"] = loop.time()

                await asyncio.gather(batch(), one())
                assert done["search"] < done["batch"], done
            assert fake.most <= 8 and fake.busy == 0

    run(body())


def test_async_timed_out_request_keeps_its_slot_from_a_batch() -> None:
    async def body() -> None:
        with Fake(max_batch=4, max_inflight=4, delay=late_first) as fake:
            async with await aker.AsyncClient.connect("127.0.0.1", fake.port, timeout=0.3) as c:
                with pytest.raises(aker.Timeout):
                    await c.search(rows(1)[0], 1)
                check_answers(await c.search_batch(rows(4, start=1), 1, timeout=5.0), 1, 4, 1)
            assert fake.busy == 0 and fake.most == 4

    run(body())


def test_window_slots_are_taken_n_at_once_in_order() -> None:
    async def body() -> None:
        s = _Slots(4)
        await s.acquire(3)
        big = asyncio.ensure_future(s.acquire(4))
        small = asyncio.ensure_future(s.acquire(1))  # fits, but waits behind the big one
        await asyncio.sleep(0)
        assert not big.done() and not small.done() and s.used == 3
        s.release(3)
        await asyncio.sleep(0)
        assert big.done() and not small.done() and s.used == 4
        s.release(4)
        await asyncio.sleep(0)
        assert small.done() and s.used == 1
        blocked = asyncio.ensure_future(s.acquire(4))
        behind = asyncio.ensure_future(s.acquire(3))
        await asyncio.sleep(0)
        blocked.cancel()  # a waiter given up lets the next one in
        await asyncio.gather(blocked, return_exceptions=True)
        await asyncio.sleep(0)
        assert behind.done() and s.used == 4 and not s._waiters

    run(body())


# ---------------------------------------------------------------------------- per-row errors


def two_rows_fail(i: int) -> int:
    return {2: 14, 5: 11}.get(i, 0)  # UNAVAILABLE, DEADLINE_EXCEEDED


def reverse(i: int) -> float:
    return 0.3 if i < 4 else 0.0  # the first chunk answers last


@pytest.mark.parametrize("versions", [(1, 2, 3, 4), (1, 2, 3)])
def test_a_failed_row_raises_with_its_index(versions: tuple[int, ...]) -> None:
    with Fake(versions=versions, row_status=two_rows_fail) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            with pytest.raises(aker.Unavailable) as e:
                c.search_batch(rows(8), 2)
            assert e.value.row == 2 and not e.value.local and e.value.request_id > 0
            assert e.value.status is aker.Status.UNAVAILABLE
            assert c.ping() >= 0  # the connection stays


def test_the_first_failed_row_in_row_order_raises_whatever_answers_first() -> None:
    with Fake(row_status=two_rows_fail, delay=reverse) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            with pytest.raises(aker.Unavailable) as e:
                c.search_batch(rows(8), 2)
            assert e.value.row == 2 and "row 2" in str(e.value)


@pytest.mark.parametrize("versions", [(1, 2, 3, 4), (1, 2, 3)])
def test_failed_rows_are_returned_on_request(versions: tuple[int, ...]) -> None:
    with Fake(versions=versions, row_status=two_rows_fail) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            b = c.search_batch(rows(8), 2, errors="return")
        assert b.statuses.dtype == np.uint16 and b.statuses.tolist() == [0, 0, 14, 0, 0, 11, 0, 0]
        assert b.ok.tolist() == [True, True, False, True, True, False, True, True]
        for r in (2, 5):
            assert b.counts[r] == 0 and b.ids[r].tolist() == [int(aker.NO_ID)] * 2 and np.isinf(b.distances[r]).all()
            assert b.kinds[r] is aker.HitKind.MISS and b.tokens[r] is None and len(b[r]) == 0
        for r in (0, 1, 3, 4, 6, 7):
            assert b.ids[r].tolist() == answer(r, 2)[0] and b.kinds[r] is aker.HitKind.EXACT
        assert b.hit_ratio == 6 / 8


def chunk_of_row_4_busy(rs: list[int]) -> int:
    return 2 if 4 in rs else 0


def test_an_error_reply_to_a_whole_frame() -> None:
    with Fake(frame_status=chunk_of_row_4_busy) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            with pytest.raises(aker.Busy) as e:
                c.search_batch(rows(10), 1)
            assert e.value.row == 4 and e.value.message == "the frame failed"
            b = c.search_batch(rows(10), 1, errors="return")
            assert b.statuses.tolist() == [0] * 4 + [2] * 4 + [0] * 2  # every row of that frame
            assert b.ids[:, 0].tolist()[:4] == [0, 1, 2, 3] and b.counts.tolist()[4:8] == [0] * 4


def test_async_and_pool_per_row_errors() -> None:
    async def body(port: int) -> None:
        async with await aker.AsyncClient.connect("127.0.0.1", port) as c:
            with pytest.raises(aker.DeadlineExceeded) as e:
                await c.search_batch(rows(8, start=3), 1)
            assert e.value.row == 2  # matrix row 2 is the fake's row 5
            b = await c.search_batch(rows(8), 1, errors="return")
            assert b.statuses.tolist() == [0, 0, 14, 0, 0, 11, 0, 0]
        async with aker.AsyncPool("127.0.0.1", port, size=2) as pool:
            b = await pool.search_batch(rows(8), 1, errors="return")
            assert b.ok.sum() == 6
            with pytest.raises(aker.Unavailable):
                await pool.search_batch(rows(8), 1)

    with Fake(row_status=two_rows_fail) as fake:
        run(body(fake.port))
        with aker.Pool("127.0.0.1", fake.port, size=1) as pool:
            assert pool.search_batch(rows(8), 1, errors="return").statuses.tolist()[2] == 14
            with pytest.raises(aker.Unavailable) as e2:
                pool.search_batch(rows(8), 1)
            assert e2.value.row == 2


# ---------------------------------------------------------------------------- bad input


def test_bad_input_is_refused_before_sending() -> None:
    nan = rows(3)
    nan[1, 2] = np.nan
    inf = rows(3)
    inf[2, 0] = np.inf
    with Fake() as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            cases: list[tuple[Callable[[], object], type[aker.StatusError]]] = [
                (lambda: c.search_batch(np.ones((3, DIM + 1)), 2), aker.DimensionMismatch),
                (lambda: c.search_batch(np.ones(DIM), 2), aker.DimensionMismatch),
                (lambda: c.search_batch(nan, 2), aker.NonFinite),
                (lambda: c.search_batch(inf, 2), aker.NonFinite),
                (lambda: c.search_batch(rows(3), 17), aker.BadK),
                (lambda: c.search_batch(rows(3), 2, errors="ignore"), aker.InvalidRequest),
                (lambda: c.search_batch(rows(3), 2, deadline=0), aker.InvalidRequest),
                (lambda: c.search_batch(rows(3), 2, collection=-1), aker.InvalidRequest),
            ]
            for call, cls in cases:
                with pytest.raises(cls) as e:
                    call()
                assert e.value.local and isinstance(e.value, ValueError) and e.value.row is None

            async def body() -> None:
                async with await aker.AsyncClient.connect("127.0.0.1", fake.port) as a:
                    with pytest.raises(aker.NonFinite):
                        await a.search_batch(nan, 2)
                    with pytest.raises(aker.InvalidRequest):
                        await a.search_batch(rows(3), 2, errors="Raise")

            run(body())
            assert c.ping() >= 0
        assert fake.seen == []  # nothing reached the server
