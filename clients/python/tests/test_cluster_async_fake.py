"""aker.AsyncCluster against fake nodes on loopback (fake_server.FakeCluster): what it
shares with aker.Cluster (the state from the seeds, owners, positions, retries,
WriteInDoubt, a new routing version fetched), and what is its own: calls at once over
one connection per node (opened once however many calls need it), a batch's parts sent
to their nodes at once (the fake's barrier holds each reply until every node has one),
a failure met by many calls at once."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aker
from aker.cluster import mix64, nearest_centroid, owner_order
from test_cluster_fake import accepted, dead_address, expected_owner, plain_node, queries, searched

from conftest import run
from fake_server import FakeCluster


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    with FakeCluster(3) as f:
        yield f


def one_per_node(f: FakeCluster, c: aker.AsyncCluster, seed: int = 21) -> np.ndarray:
    """A query owned by each node, in the order of f.ids."""
    qs = queries(200, seed=seed)
    return np.stack([next(q for q in qs if c.owner_of(q) == node) for node in f.ids])


def test_the_state_and_bad_seeds(fake: FakeCluster) -> None:
    async def body() -> None:
        with plain_node() as plain:
            seeds = [dead_address(), f"127.0.0.1:{plain.port}", *fake.seeds[1:]]
            async with await aker.AsyncCluster.connect(seeds, timeout=5.0) as c:
                assert c.state.self_id == fake.ids[1] and len(c.state.live_nodes) == 3
                assert list(c.connections) == [fake.ids[1]] and c.counters.refreshes == 0
                assert repr(c).startswith("<aker.AsyncCluster 'fake-cluster'")
                before = fake.cluster_requests
                assert await c.refresh() is c.state and fake.cluster_requests == before + 1
            assert c.closed and "closed" in repr(c)
            with pytest.raises(aker.ConnectionClosed):
                await c.search(queries(1)[0], 1)
            with pytest.raises(aker.Unsupported):
                await aker.AsyncCluster.connect(f"127.0.0.1:{plain.port}")
        with pytest.raises(aker.AkerConnectionError):
            await aker.AsyncCluster.connect([dead_address()], connect_timeout=2.0)
        for bad in ([], ["no-port"], [("h", -1)]):
            with pytest.raises(aker.InvalidRequest):
                await aker.AsyncCluster.connect(bad)
        with pytest.raises(aker.InvalidRequest):
            await aker.AsyncCluster.connect(fake.seeds, routing="round-robin")

    run(body())


def test_searches_at_once_share_one_connection_per_node(fake: FakeCluster) -> None:
    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds[0], timeout=5.0) as c:
            qs = queries(120, seed=22)
            results = await asyncio.gather(*(c.search(q, 1) for q in qs))
            for q, r in zip(qs, results, strict=True):
                assert r.ids.tolist() == [expected_owner(fake, q)] == [c.owner_of(q)]
                assert r.routing_version == c.state.routing_version
            assert c.nodes_for(qs[0]) == owner_order(c.state, nearest_centroid(c.state, qs[0]))
            # 120 calls at once, one connection per node: each opened by the first call
            # that needed it, the others waited for it.
            assert accepted(fake) == 3 and len(c.connections) == 3
            assert sum(c.counters.requests.values()) == 120 and c.counters.retries == 0
            assert {n: len(searched(fake, n)) for n in fake.ids} == c.counters.requests

    run(body())


def test_a_batch_goes_to_its_nodes_at_once(fake: FakeCluster) -> None:
    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=10.0) as c:
            three = one_per_node(fake, c)
            # Each node holds its reply until all three have their part: sent one after
            # another, the first part would never be answered.
            fake.hold = threading.Barrier(3)
            b = await c.search_batch(three[::-1], 1)
            assert b.ids[:, 0].tolist() == fake.ids[::-1] and b.ok.all() and fake.held_broken == 0
            got = await asyncio.gather(*(c.search(q, 1) for q in three))
            assert [int(r.ids[0]) for r in got] == fake.ids and fake.held_broken == 0
            fake.hold = None
            qs = queries(40, seed=2)
            b = await c.search_batch(qs, 1)
            assert b.ids[:, 0].tolist() == [expected_owner(fake, q) for q in qs] and b.ok.all()
            assert b.routing_version == fake.routing_version and b.kinds == [aker.HitKind.EXACT] * 40
            empty = await c.search_batch(np.zeros((0, 2)), 3)
            assert empty.ids.shape == (0, 3)
            with pytest.raises(aker.BadK):
                await c.search_batch(qs, 0)

    run(body())


def test_writes_carry_their_positions(fake: FakeCluster) -> None:
    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds) as c:
            q = queries(1)[0]
            await c.search(q, 1)
            p = await c.insert_with_position(7, [1.0, 2.0])
            assert p > 1000 and c.position == p
            await c.search(q, 1)
            d = await c.delete_with_position(7)
            assert d.existed and c.position == d.position > p
            await c.search(q, 1, at_position=5)  # one given wins
            assert await c.delete(11) is True
            want = min(fake.ids, key=lambda n: mix64(n ^ 11))
            assert searched(fake, want, 5)[-1] == struct.pack("<QI", 11, 0)
            await c.insert(9, [0.0, 1.0])
        owner_ = expected_owner(fake, q)
        carried = [
            struct.unpack_from("<Q", body, len(body) - 8)[0] if flags == 4 else 0
            for _v, o, flags, body in fake.seen[owner_]
            if o == 3
        ]
        assert carried == [0, p, 5]

    run(body())


def test_a_killed_owner_is_retried_by_every_call_at_once(fake: FakeCluster) -> None:
    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=5.0) as c:
            q = queries(1, seed=6)[0]
            first, second, third = c.nodes_for(q)
            assert (await c.search(q, 1)).ids.tolist() == [first]
            fake.kill(first)
            opened = fake.servers[first].accepted
            got = await asyncio.gather(*(c.search(q, 1) for _ in range(20)))
            assert all(r.ids.tolist() == [second] for r in got)
            assert first not in c.connections and c.nodes_for(q) == [second, third, first]
            # Its dead connection replaced by one connect (refused), shared by the 20.
            assert c.counters.retries == 20 and c.counters.requests[first] == 21
            assert fake.servers[first].accepted == opened and c.counters.refreshes >= 1
            # Avoided for a lease: no call tries it now.
            tried = c.counters.requests[first]
            assert (await c.search_batch(queries(30, seed=7), 1)).ok.all()
            await c.insert(3, q)  # the owner failed: the next node
            assert c.counters.requests[first] == tried and len(searched(fake, second, 4)) == 1

    run(body())


def test_writes_in_doubt_and_writes_never_taken(fake: FakeCluster) -> None:
    q = queries(1, seed=9)[0]

    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=0.3) as c:
            first, second, _ = c.nodes_for(q)
            fake.silent.add(first)
            assert (await c.search(q, 1)).ids.tolist() == [second] and c.counters.retries == 1
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=0.3) as c:
            with pytest.raises(aker.WriteInDoubt) as e:
                await c.insert(5, q)
            assert isinstance(e.value.__cause__, aker.Timeout) and e.value.node_id == first
            assert c.counters.retries == 0 and not searched(fake, second, 4)
        fake.silent.clear()
        fake.refuse.add(first)  # a connection-level SHUTTING_DOWN: never taken
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=5.0) as c:
            p = await c.insert_with_position(6, q)
            assert c.position == p and c.counters.retries == 1 and len(searched(fake, second, 4)) == 1

    run(body())


def test_an_idle_connection_the_server_closed_is_opened_again(fake: FakeCluster) -> None:
    """A write on a connection the node closed while it was idle goes on a new one (not
    in doubt, the node not avoided), even when the read loop has not run since."""
    q = queries(1, seed=13)[0]

    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=5.0) as c:
            first = c.nodes_for(q)[0]
            await c.search(q, 1)
            old = c.connections[first]
            for s in fake.servers[first]._conns:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            time.sleep(0.1)  # blocking on purpose: the end of stream arrives, the loop has not run
            await c.insert(5, q)
            assert len(searched(fake, first, 4)) == 1 and c.counters.retries == 0
            assert old.closed and c.connections[first] is not old and c.nodes_for(q)[0] == first

    run(body())


def test_another_routing_version_fetches_the_state_once(fake: FakeCluster) -> None:
    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds) as c:
            c.refresh_min = 0.0
            q = queries(1, seed=10)[0]
            first = c.owner_of(q)
            await asyncio.gather(*(c.search(qq, 1) for qq in queries(30)))
            v = fake.change(live={first: False})  # type: ignore[dict-item]
            served = sum(fake.cluster_served.values())
            # Every call at once sees the new version; fetches run one at a time.
            await asyncio.gather(*(c.search(q, 1) for _ in range(20)))
            # One fetch, shared by all: it went over the reporting node's connection,
            # behind the 20 replies, so every call saw it under way.
            assert c.state.routing_version == v and c.counters.refreshes == 1
            assert sum(fake.cluster_served.values()) - served == 1
            assert c.owner_of(q) != first and (await c.search(q, 1)).ids.tolist() == [c.owner_of(q)]

    run(body())


def test_a_timed_out_call_leaves_the_others_on_its_connection_alone(fake: FakeCluster) -> None:
    """One call's timeout avoids its node, but the connection stays: a write in flight on
    it is answered (not in doubt), the node's connection is still the same."""
    q = queries(1, seed=23)[0]

    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=5.0) as c:
            first, second, _ = c.nodes_for(q)
            await c.search(q, 1)
            conn = c.connections[first]
            fake.delay[first] = 0.4  # each answer 0.4 s late, one after the other
            search = asyncio.ensure_future(c.search(q, 1, timeout=0.2))
            await asyncio.sleep(0)
            insert = asyncio.ensure_future(c.insert_with_position(5, q))
            r = await search
            assert r.ids.tolist() == [second] and c.counters.retries == 1
            p = await insert
            assert p > 1000 and c.position == p and c.connections[first] is conn and not conn.closed
            assert len(searched(fake, first, 4)) == 1 and not searched(fake, second, 4)
            assert c.nodes_for(q)[-1] == first  # avoided for a lease

    run(body())


def test_a_write_that_never_left_goes_to_the_next_node(fake: FakeCluster) -> None:
    """With a window of 1, an insert waits for the slot a slow search holds; its time runs
    out before it is written: not in doubt, sent to the next node."""
    q = queries(1, seed=24)[0]

    async def body() -> None:
        async with await aker.AsyncCluster.connect(fake.seeds, timeout=5.0, window=1) as c:
            first, second, _ = c.nodes_for(q)
            await c.search(q, 1)
            fake.delay[first] = 0.6
            search = asyncio.ensure_future(c.search(q, 1))
            await asyncio.sleep(0)
            p = await c.insert_with_position(5, q, timeout=0.2)
            assert p > 1000 and c.counters.retries == 1
            assert not searched(fake, first, 4) and len(searched(fake, second, 4)) == 1
            assert (await search).ids.tolist() == [first]  # the slow one is still answered

    run(body())

    async def alone() -> None:
        """The client's own error: a Timeout that says it was never written."""
        host, port = fake.seeds[0].split(":")
        async with await aker.AsyncClient.connect(host, int(port), window=1) as a:
            slow = asyncio.ensure_future(a.search(q, 1))
            await asyncio.sleep(0)
            with pytest.raises(aker.Timeout) as e:
                await a.search(q, 1, timeout=0.2)
            await slow
            assert e.value.not_sent and "not sent" in str(e.value)
            with pytest.raises(aker.Timeout) as late:
                await a.search(q, 1, timeout=0.2)  # written, answered too late
            assert not late.value.not_sent

    fake.delay[fake.ids[0]] = 0.6
    run(alone())


def test_close_stops_connects_and_fetches_under_way(fake: FakeCluster) -> None:
    """close() while a call is connecting to a slow node: the call fails with
    ConnectionClosed, and no connection is left open (nor opened later); a cancelled
    connect() leaves none either; the event loop reports no unretrieved exception."""
    errors: list[dict[str, Any]] = []

    async def wait_for_ends(server: Any) -> None:
        for _ in range(500):
            if server.ended == server.accepted:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{server.accepted - server.ended} connection(s) left open")

    async def body() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        c = await aker.AsyncCluster.connect(fake.seeds[0], timeout=5.0)
        q = one_per_node(fake, c)[1]
        fake.hello_delay[fake.ids[1]] = 1.0  # its HELLO comes late: the connect is under way
        call = asyncio.ensure_future(c.search(q, 1))
        for _ in range(500):
            if fake.servers[fake.ids[1]].accepted:
                break
            await asyncio.sleep(0.01)
        await c.close()
        for _ in range(5):  # a few turns of the loop, not the HELLO's second
            await asyncio.sleep(0)
        assert call.done()
        with pytest.raises(aker.ConnectionClosed):
            await call
        assert c.connections == {}
        await wait_for_ends(fake.servers[fake.ids[1]])
        await wait_for_ends(fake.servers[fake.ids[0]])
        # A connect() cancelled while the seed is slow to answer CLUSTER (HELLO done).
        fake.delay[fake.ids[2]] = 0.5
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(aker.AsyncCluster.connect(fake.seeds[2]), 0.2)
        await wait_for_ends(fake.servers[fake.ids[2]])
        with pytest.raises(TypeError):
            aker.AsyncCluster(fake.seeds)

    run(body())
    gc.collect()
    assert errors == []
