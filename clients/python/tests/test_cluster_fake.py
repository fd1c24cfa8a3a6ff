"""aker.Cluster against fake nodes on loopback (fake_server.FakeCluster): the state from
the seeds, each search on its centroid's owner, batches split by owner and put back in
order, positions carried across nodes, overrides, a killed or silent node retried on
the next (a write only when it never reached the node, else WriteInDoubt), a node gone
from the state skipped, the state fetched again on a new routing version (from the node
that reported it, over its connection), owner orders cached. (The README's Clusters
block runs against these fake nodes in test_readme.py.)"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import aker
from aker.cluster import mix64, nearest_centroid, owner, owner_order, rendezvous_score

from conftest import run
from fake_server import FakeCluster, FakeConn, FakeServer, hello_body


@pytest.fixture
def fake() -> Iterator[FakeCluster]:
    with FakeCluster(3) as f:
        yield f


def dead_address() -> str:
    """An address where nothing listens (connections refused)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


def plain_node(version: int = 6) -> FakeServer:
    """A node in no cluster: HELLO up to ``version``, CLUSTER answered UNSUPPORTED."""

    def handle(c: FakeConn) -> None:
        while True:
            req = c.recv()
            if req is None:
                return
            v, op, _flags, rid, _body = req
            if v > version:
                c.send(version, op, rid, b"version not spoken", status=5)
            elif op == 1:
                c.send(v, op, rid, hello_body(v, dim=2, vmax=version))
            else:
                c.send(v, op, rid, b"this node is in no cluster", status=13)

    return FakeServer(handle)


def queries(n: int, seed: int = 1) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((n, 2)) * 10).astype(np.float32)


def expected_owner(f: FakeCluster, q: np.ndarray) -> int:
    """The owner by PROTOCOL.md's rule, computed here from the fake's own state."""
    c = int(np.argmin(((np.asarray(f.centroids) - q.astype(np.float64)) ** 2).sum(axis=1)))
    for cc, node in f.overrides:
        if cc == c and f.live[node]:
            return node
    return max((i for i in f.ids if f.live[i]), key=lambda i: (mix64(i ^ mix64(c)), i))


def searched(f: FakeCluster, node: int, op: int = 3) -> list[bytes]:
    return [body for _v, o, _fl, body in f.seen[node] if o == op]


# ---------------------------------------------------------------------------- the state


def test_the_state_comes_from_the_first_seed_that_answers(fake: FakeCluster) -> None:
    with plain_node() as plain:
        seeds: list[Any] = [dead_address(), ("127.0.0.1", plain.port)] + fake.seeds[1:]
        with aker.Cluster(seeds, timeout=5.0) as c:
            s = c.state
            assert s.name == "fake-cluster" and s.self_id == fake.ids[1] and s.lease_ms == 3000
            assert s.routing_version == fake.routing_version and s.metric is aker.Metric.L2SQ and s.dim == 2
            assert s.centroids.shape == (8, 2) and s.overrides == [] and len(s.live_nodes) == 3
            assert [n.node_id for n in s.nodes] == fake.ids and [n.advertise for n in s.nodes] == fake.seeds
            assert list(c.connections) == [fake.ids[1]] and c.counters.refreshes == 0
            assert "fake-cluster" in repr(c)
        for one in (fake.seeds[0], ("127.0.0.1", int(fake.seeds[0].split(":")[1])), tuple(fake.seeds[:2])):
            with aker.Cluster(one) as c1:
                assert c1.state.self_id == fake.ids[0]
        with aker.Cluster(seeds, timeout=5.0) as c:
            before = fake.cluster_requests
            again = c.refresh()
            assert again is c.state and c.counters.refreshes == 1 and fake.cluster_requests == before + 1


def test_no_seed_answering_raises_the_last_error() -> None:
    with pytest.raises(aker.AkerConnectionError):
        aker.Cluster([dead_address()], connect_timeout=2.0)
    with plain_node() as plain:
        with pytest.raises(aker.Unsupported) as e:
            aker.Cluster(f"127.0.0.1:{plain.port}")
        assert not e.value.local
    with plain_node(version=5) as old:  # below version 6 the client knows there is no CLUSTER
        with pytest.raises(aker.Unsupported) as e:
            aker.Cluster([("127.0.0.1", old.port)])
        assert e.value.local
        with aker.Client("127.0.0.1", old.port) as client:
            assert client.version == 5
            with pytest.raises(aker.Unsupported) as e:
                client.cluster()
            assert e.value.local
    for bad in ([], ["no-port"], ["h:99999"], [("h", -1)], [7]):
        with pytest.raises(aker.InvalidRequest):
            aker.Cluster(bad)  # type: ignore[arg-type]


def test_client_cluster_sync_pipelined_and_async(fake: FakeCluster) -> None:
    host, port = fake.seeds[2].split(":")
    with aker.Client(host, int(port)) as c:
        assert c.version == 6
        s = c.cluster()
        assert s.self_id == fake.ids[2] and s.routing_version == fake.routing_version
        with c.pipeline() as p:
            p.cluster()
            p.ping(b"x")
        assert p.results[0].self_id == fake.ids[2]

    async def body() -> None:
        async with await aker.AsyncClient.connect(host, int(port)) as a:
            assert (await a.cluster()).nodes == s.nodes

    run(body())


# ---------------------------------------------------------------------------- routing


def test_each_search_goes_to_its_centroids_owner(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        qs = queries(120)
        for q in qs:
            r = c.search(q, 1)
            want = expected_owner(fake, q)
            assert r.ids.tolist() == [want] and c.owner_of(q) == want
            assert c.nodes_for(q) == owner_order(c.state, nearest_centroid(c.state, q))
            assert r.routing_version == fake.routing_version == c.state.routing_version
        got = c.counters.requests
        assert sum(got.values()) == 120 and len(got) == 3 and c.counters.retries == 0
        assert {n: len(searched(fake, n)) for n in fake.ids} == got
        assert c.counters.refreshes == 0


def test_a_batch_is_split_by_owner_and_put_back_in_order(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        qs = queries(40, seed=2)
        b = c.search_batch(qs, 1)
        owners = [expected_owner(fake, q) for q in qs]
        assert b.ids[:, 0].tolist() == owners and b.ok.all() and b.routing_version == fake.routing_version
        assert b[5].routing_version == fake.routing_version and b.kinds == [aker.HitKind.EXACT] * 40
        for node in fake.ids:
            # Each node got its rows, in order (frames of at most max_batch = 8 rows).
            rows = [i for i, o in enumerate(owners) if o == node]
            frames = searched(fake, node, 0x0A)
            assert len(frames) == -(-len(rows) // 8)
            sent = [np.frombuffer(f, "<f4", offset=20).reshape(-1, 2) for f in frames]
            assert np.concatenate(sent).tolist() == qs[rows].tolist()
        empty = c.search_batch(np.zeros((0, 2)), 3)
        assert empty.ids.shape == (0, 3) and empty.routing_version == 0


def test_random_routing_spreads_one_query(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds, routing="random") as c:
        q = queries(1)[0]
        answered = {int(c.search(q, 1).ids[0]) for _ in range(60)}
        assert len(answered) >= 2 and answered <= set(fake.ids)
        assert c.search_batch(queries(30), 1).ok.all()
        c.routing = "centroid"
        assert {int(c.search(q, 1).ids[0]) for _ in range(5)} == {expected_owner(fake, q)}
        with pytest.raises(aker.InvalidRequest):
            c.routing = "nearest"
    with pytest.raises(aker.InvalidRequest):
        aker.Cluster(fake.seeds, routing="round-robin")


def test_an_override_moves_a_centroid(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds) as c:
        c.refresh_min = 0.0
        q = queries(1, seed=4)[0]
        centroid = nearest_centroid(c.state, q)
        first, other = owner_order(c.state, centroid)[:2]
        assert c.search(q, 1).ids.tolist() == [first]
        fake.change(overrides=[(centroid, other)])
        assert c.search(q, 1).ids.tolist() == [first]  # its reply carries the new version: fetched
        assert c.counters.refreshes == 1 and c.state.overrides == [(centroid, other)]
        assert c.owner_of(q) == other and c.search(q, 1).ids.tolist() == [other]
        fake.change(overrides=[(centroid, other)], live={other: False})  # an override to a node not live
        c.search(q, 1)
        assert c.owner_of(q) == first and c.search(q, 1).ids.tolist() == [first]


# ---------------------------------------------------------------------------- writes


def test_writes_carry_their_positions_into_later_searches(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds) as c:
        assert c.position == 0
        c.search(queries(1)[0], 1)
        assert all(flags == 0 for n in fake.ids for _v, _o, flags, _b in fake.seen[n])
        p = c.insert_with_position(7, [1.0, 2.0])
        assert p > 1000 and c.position == p
        qs = queries(6, seed=5)
        for q in qs:
            c.search(q, 1)
        c.search_batch(qs, 1)
        d = c.delete_with_position(7)
        assert d.existed and d.position > p and c.position == d.position
        c.search(qs[0], 1)
        c.search(qs[1], 1, at_position=5)  # one given wins
        assert c.delete(8) is True
        c.insert(9, [0.0, 1.0])
    searches = [(o, flags, body) for n in fake.ids for _v, o, flags, body in fake.seen[n] if o in (3, 0x0A)]
    carried = [struct.unpack_from("<Q", body, len(body) - 8)[0] for _o, flags, body in searches if flags == 4]
    assert sorted(carried) == sorted([p] * (6 + len({expected_owner(fake, q) for q in qs})) + [d.position, 5])
    assert sum(1 for _o, flags, _b in searches if flags == 0) == 1  # the one before any write


def test_deletes_go_to_a_live_node_chosen_by_the_id(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds) as c:
        for i in range(20):
            c.delete(i)
            want = min(fake.ids, key=lambda n: mix64(n ^ i))
            assert searched(fake, want, 5)[-1] == struct.pack("<QI", i, 0)


# ---------------------------------------------------------------------------- failures


def test_a_killed_owner_is_retried_on_the_next_node(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        q = queries(1, seed=6)[0]
        first, second, third = c.nodes_for(q)
        assert c.search(q, 1).ids.tolist() == [first]  # a connection to it is open
        fake.kill(first)
        assert c.search(q, 1).ids.tolist() == [second]
        assert c.counters.retries == 1 and c.counters.requests[first] == 2 and c.counters.refreshes == 1
        assert first not in c.connections
        # Avoided for a lease: the next searches go to the second at once.
        assert c.nodes_for(q) == [second, third, first] and c.owner_of(q) == first
        assert c.search(q, 1).ids.tolist() == [second] and c.counters.retries == 1
        # A batch whose rows it owned goes to the next nodes too.
        qs = queries(30, seed=7)
        b = c.search_batch(qs, 1)
        assert first not in b.ids[:, 0].tolist() and b.ok.all()
        c.insert(3, q)  # its owner failed: the next node
        assert searched(fake, second, 4)


def test_at_most_three_nodes_are_tried() -> None:
    with FakeCluster(4) as fake:
        with aker.Cluster(fake.seeds, timeout=5.0) as c:
            q = queries(1, seed=8)[0]
            order = c.nodes_for(q)
            for node in order[:3]:
                fake.kill(node)
            with pytest.raises(aker.AkerConnectionError):
                c.search(q, 1)
            assert c.counters.retries == 2 and order[3] not in c.counters.requests
            assert c.search(q, 1).ids.tolist() == [order[3]]  # the three are avoided now


def test_a_silent_node_times_out_and_is_retried(fake: FakeCluster) -> None:
    """A search that timed out goes on to the next node; a write does not: it may still
    be executed by the silent node, so its outcome is unknown (WriteInDoubt)."""
    q = queries(1, seed=9)[0]
    with aker.Cluster(fake.seeds, timeout=0.3) as c:
        first, second, _ = c.nodes_for(q)
        fake.silent.add(first)
        assert c.search(q, 1).ids.tolist() == [second] and c.counters.retries == 1
    with aker.Cluster(fake.seeds, timeout=0.3) as c:
        with pytest.raises(aker.WriteInDoubt) as e:
            c.insert(5, q)
        assert isinstance(e.value, aker.AkerConnectionError) and isinstance(e.value.__cause__, aker.Timeout)
        assert e.value.node_id == first and e.value.address == fake.seeds[fake.ids.index(first)]
        assert "outcome is unknown" in str(e.value) and e.value.address in str(e.value)
        assert c.counters.retries == 0 and c.counters.requests == {first: 1}
        assert len(searched(fake, first, 4)) == 1 and not searched(fake, second, 4)  # not resent
        # The node is avoided for a lease and the state was fetched again.
        assert c.nodes_for(q)[-1] == first and c.counters.refreshes == 1 and first not in c.connections
        assert c.search(q, 1).ids.tolist() == [second]


def test_a_write_whose_connection_drops_after_sending_is_in_doubt(fake: FakeCluster) -> None:
    q = queries(1, seed=11)[0]
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        first, second, third = c.nodes_for(q)
        fake.drop.add(first)  # takes the request, then closes without an answer
        with pytest.raises(aker.WriteInDoubt) as e:
            c.insert_with_position(5, q)
        assert isinstance(e.value.__cause__, aker.ConnectionClosed) and e.value.node_id == first
        assert c.counters.retries == 0 and c.position == 0 and c.counters.refreshes == 1
        assert len(searched(fake, first, 4)) == 1 and not any(searched(fake, n, 4) for n in (second, third))
        assert c.nodes_for(q) == [second, third, first]
        # A search over a dropped connection is retried on the next node.
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        assert c.search(q, 1).ids.tolist() == [second] and c.counters.retries == 1
    # A delete as well: the id whose first node is the dropping one.
    i = next(i for i in range(100) if min(fake.ids, key=lambda n: mix64(n ^ i)) == first)
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        with pytest.raises(aker.WriteInDoubt) as e:
            c.delete(i)
        assert e.value.node_id == first and c.counters.retries == 0
        assert searched(fake, first, 5) == [struct.pack("<QI", i, 0)]
        assert not any(searched(fake, n, 5) for n in (second, third))


def test_a_write_the_node_never_took_goes_to_the_next_node(fake: FakeCluster) -> None:
    """Connections refused (a killed node), or a connection-level SHUTTING_DOWN (the node
    took nothing): the write provably never reached it and is sent to the next node."""
    q = queries(1, seed=12)[0]
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        first, second, third = c.nodes_for(q)
        i = next(i for i in range(100) if min(fake.ids, key=lambda n: mix64(n ^ i)) == first)
    fake.refuse.add(first)
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        p = c.insert_with_position(5, q)
        assert p > 1000 and c.position == p and c.counters.retries == 1 and c.counters.requests[first] == 1
        assert not searched(fake, first, 4) and len(searched(fake, second, 4)) == 1
        assert c.nodes_for(q)[-1] == first  # avoided for a lease
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        d = c.delete_with_position(i)
        assert d.existed and c.counters.retries == 1 and not searched(fake, first, 5)
    fake.refuse.clear()
    fake.kill(first)  # connections refused
    with aker.Cluster([s for n, s in zip(fake.ids, fake.seeds, strict=True) if n != first], timeout=5.0) as c:
        assert first not in c.connections
        c.insert(6, q)
        assert c.counters.retries == 1 and c.counters.requests[first] == 1
        assert len(searched(fake, second, 4)) == 2 and c.nodes_for(q) == [second, third, first]


def test_an_idle_connection_the_server_closed_is_opened_again(fake: FakeCluster) -> None:
    """A connection the node closed while it was idle (idle_timeout_ms): a write is sent
    on a new one (not in doubt), the node is not avoided."""
    q = queries(1, seed=13)[0]
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        first = c.nodes_for(q)[0]
        assert c.search(q, 1).ids.tolist() == [first]
        old = c.connections[first]
        for s in fake.servers[first]._conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        while old._idle_usable() and time.monotonic() < deadline:
            time.sleep(0.01)
        c.insert(5, q)
        assert len(searched(fake, first, 4)) == 1 and c.counters.retries == 0 and c.counters.refreshes == 0
        assert old.closed and c.connections[first] is not old and c.nodes_for(q)[0] == first


def test_a_node_missing_from_the_refreshed_state_is_skipped(fake: FakeCluster) -> None:
    q = queries(1, seed=14)[0]
    with aker.Cluster(fake.seeds, timeout=5.0) as c, aker.Cluster(fake.seeds, timeout=5.0) as w:
        first, second, third = c.nodes_for(q)
        assert w.nodes_for(q) == [first, second, third]
        fake.kill(first)
        fake.change(removed={second})
        # first fails, the state fetched again no longer names second: on to third.
        assert c.search(q, 1).ids.tolist() == [third]
        assert c.state.node(second) is None and c.counters.refreshes == 1
        assert c.counters.retries == 1 and second not in c.counters.requests
        w.insert(5, q)  # a write refused by first (connections refused) goes on the same way
        assert len(searched(fake, third, 4)) == 1 and not searched(fake, second, 4)
        assert w.counters.retries == 1 and second not in w.counters.requests


def test_another_routing_version_fetches_the_state_again(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds) as c:
        q = queries(1, seed=10)[0]
        first = c.owner_of(q)
        assert first is not None
        c.refresh_min = 60.0  # fetched at most once a minute: a new version is not fetched yet
        v = fake.change(live={first: False})
        r = c.search(q, 1)
        assert r.routing_version == v != c.state.routing_version and c.counters.refreshes == 0
        c.refresh_min = 0.0
        c.search(q, 1)
        assert c.counters.refreshes == 1 and c.state.routing_version == v
        assert c.state.node(first) == aker.ClusterNode(first, False, fake.seeds[fake.ids.index(first)])
        assert c.owner_of(q) != first and c.search(q, 1).ids.tolist() == [c.owner_of(q)]
        assert c.counters.refreshes == 1  # the same version: nothing fetched
        # A batch's version counts as well; 0 (a node in no cluster) never does.
        v2 = fake.change(live={first: True})
        b = c.search_batch(queries(5), 1)
        assert b.routing_version == v2 and c.counters.refreshes == 2 and c.state.routing_version == v2
        fake.node_routing[first] = 0
        for _ in range(3):
            c.search(q, 1)
        assert c.counters.refreshes == 2


def accepted(fake: FakeCluster) -> int:
    return sum(s.accepted for s in fake.servers.values())


def test_a_refresh_asks_the_reporting_node_over_its_open_connection(fake: FakeCluster) -> None:
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        c.refresh_min = 0.0
        seed_node = c.state.self_id
        q = next(q for q in queries(50, seed=15) if c.owner_of(q) != seed_node)
        owner_ = c.owner_of(q)
        assert owner_ is not None and c.search(q, 1).ids.tolist() == [owner_]
        conns = c.connections
        assert list(conns) == [seed_node, owner_]  # the seed's connection comes first
        opened, served = accepted(fake), dict(fake.cluster_served)
        v = fake.change()
        assert c.search(q, 1).routing_version == v
        # Fetched from the node whose reply carried v, over its connection; none opened or closed.
        assert c.state.routing_version == v and c.state.self_id == owner_ and c.counters.refreshes == 1
        assert fake.cluster_served[owner_] == served[owner_] + 1
        assert all(fake.cluster_served[n] == served[n] for n in fake.ids if n != owner_)
        assert accepted(fake) == opened and c.connections == conns and not any(x.closed for x in conns.values())
        # A batch: the first node whose reply differs.
        v2 = fake.change()
        b = c.search_batch(queries(20, seed=16), 1)
        assert b.routing_version == v2 == c.state.routing_version and c.counters.refreshes == 2
        assert sum(fake.cluster_served.values()) == sum(served.values()) + 2
        # refresh() too: over an open connection, none opened.
        opened = accepted(fake)
        conns = c.connections
        c.refresh()
        assert accepted(fake) == opened and c.connections == conns and c.counters.refreshes == 3
        # After a failure: the others' open connections, not new ones.
        fake.kill(owner_)
        opened = accepted(fake)
        assert c.search(q, 1).ids.tolist() == [c.nodes_for(q)[0]] and c.counters.refreshes == 4
        assert accepted(fake) <= opened + 1  # at most the connection the retry needed


def test_owner_orders_are_computed_once_per_state(fake: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = aker.cluster.owner_order

    def counted(state: aker.ClusterState, centroid: int) -> list[int]:
        calls.append(centroid)
        return real(state, centroid)

    monkeypatch.setattr(aker.cluster, "owner_order", counted)
    with aker.Cluster(fake.seeds, timeout=5.0) as c:
        qs = queries(200, seed=17)
        for q in qs[:50]:
            centroid = nearest_centroid(c.state, q)
            assert c.nodes_for(q) == real(c.state, centroid) and c.owner_of(q) == real(c.state, centroid)[0]
            assert c.search(q, 1).ids.tolist() == [real(c.state, centroid)[0]]
        c.search_batch(qs, 1)
        assert len(calls) == len(set(calls)) <= 8  # once per centroid
        # A new state: computed again, from it.
        centroid = nearest_centroid(c.state, qs[0])
        first, other = real(c.state, centroid)[:2]
        fake.change(overrides=[(centroid, other)])
        c.refresh()
        assert c.nodes_for(qs[0]) == real(c.state, centroid) and c.nodes_for(qs[0])[0] == other
        assert c.search(qs[0], 1).ids.tolist() == [other] and calls.count(centroid) == 2
        b = c.search_batch(qs, 1)
        assert b.ids[:, 0].tolist() == [real(c.state, nearest_centroid(c.state, q))[0] for q in qs]


def test_close(fake: FakeCluster) -> None:
    c = aker.Cluster(fake.seeds)
    c.search_batch(queries(20), 1)
    conns = list(c.connections.values())
    assert len(conns) == 3
    with c:
        pass
    assert c.closed and all(x.closed for x in conns) and "closed" in repr(c)
    with pytest.raises(aker.ConnectionClosed):
        c.search(queries(1)[0], 1)
    c.close()


def test_the_routing_functions_are_exported() -> None:
    assert aker.cluster.mix64 is mix64 and aker.cluster.owner is owner
    assert rendezvous_score(1, 0) == 0x5692_161D_100B_05E5
