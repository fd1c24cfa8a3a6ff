"""Version 6 without a server: HELLO (version 4's layout), the handshake offering 6, the
routing version ending SEARCH replies and following a SEARCH_BATCH reply's count, the
CLUSTER request and its reply (hand-written bytes, round trips, every limit refused)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pytest

import aker
from aker import _codec
from aker._protocol import Opcode, ServerInfo

from fake_server import batch_body, batch_item, cluster_body, hello_body, search_body
from test_codec import hexbytes

ROUTING = 0x0102_0304_0506_0708


def info(version: int = 6, **kw: object) -> ServerInfo:
    base: dict[str, object] = dict(version=version, version_min=1, version_max=version, metric=aker.Metric.L2SQ,
                                   max_frame_bytes=4096, dim=2, k_max=10, max_inflight=8, executors=1, shards=1,
                                   delta=2, auth_required=False, max_batch=8)
    base.update(kw)
    return ServerInfo(**base)  # type: ignore[arg-type]


def frame(version: int, op: int, body: bytes, rid: int = 9, status: int = 0) -> _codec.Frame:
    return _codec.Frame(version, op | 0x80, 0, status, rid, body)


# ---------------------------------------------------------------------------- handshake


def test_hello_v6_is_v4s_layout_and_the_handshake_offers_6() -> None:
    for challenge in (None, bytes(range(16))):
        body = hello_body(6, max_batch=6, challenge=challenge)
        assert body == hello_body(4, max_batch=6, challenge=challenge, vmax=6)
        fields, got = _codec._hello(6, body)
        assert fields["max_batch"] == 6 and fields["version_max"] == 6 and got == challenge
        with pytest.raises(aker.ProtocolError):
            _codec._hello(6, body + b"\x00")
    steps = _codec.handshake(None)
    req = next(steps)
    assert req.version == 6 and aker.VERSIONS[0] == 6
    with pytest.raises(StopIteration) as stop:
        steps.send(_codec.Frame(6, 0x81, 0, 0, 1, hello_body(6, vmax=6)))
    assert stop.value.value.version == 6


# ---------------------------------------------------------------------------- SEARCH


def test_a_v6_search_reply_ends_with_the_routing_version() -> None:
    req = _codec.Codec(info()).search([1.0, 0.0], 2)
    r = req.result(frame(6, Opcode.SEARCH, search_body([5, 9], [0.0, 0.25], hit=1, routing=ROUTING)))
    assert r.routing_version == ROUTING and r.ids.tolist() == [5, 9] and r.token is None
    # After the token, when there is one.
    r = req.result(frame(6, Opcode.SEARCH, search_body([], [], hit=0, token=77, routing=ROUTING)))
    assert r.routing_version == ROUTING and r.token == 77 and len(r) == 0
    zero = req.result(frame(6, Opcode.SEARCH, search_body([5], [0.0], routing=0)))
    assert zero.routing_version == 0
    # Below version 6 there is none, and the attribute is 0.
    old = req.result(frame(5, Opcode.SEARCH, search_body([5], [0.0], token=3)))
    assert old.routing_version == 0 and old.token == 3
    for version, bad in (
        (6, search_body([5], [0.0])),  # no routing version
        (6, search_body([5], [0.0], routing=1) + b"\x00"),
        (6, search_body([5], [0.0], token=3)),  # the token taken for the routing version: 8 bytes short
        (5, search_body([5], [0.0], routing=1)),  # 8 bytes too many below 6
    ):
        with pytest.raises(aker.ProtocolError):
            req.result(frame(version, Opcode.SEARCH, bad))


def test_the_search_example_in_version_6() -> None:
    """PROTOCOL.md's SEARCH reply example, version 6: the same bytes and the routing version."""
    raw = bytearray(hexbytes(
        "41 4B 06 83 00 00 00 00  07 00 00 00 00 00 00 00  28 00 00 00"
        " 01 01 00 00  02 00 00 00"
        " 05 00 00 00 00 00 00 00  00 00 00 00"
        " 09 00 00 00 00 00 00 00  00 00 80 3E"
        " 08 07 06 05 04 03 02 01"
    ))
    f = _codec.take_frame(raw, 1 << 20)
    assert f is not None and not raw and f.version == 6
    r = _codec.Codec(info()).search([1.0, 0.0], 2).result(f)
    assert r.kind is aker.HitKind.EXACT and r.ids.tolist() == [5, 9] and r.routing_version == ROUTING


# ---------------------------------------------------------------------------- SEARCH_BATCH


def batch_req(count: int, k: int = 2) -> _codec.Req:
    return _codec.Codec(info()).search_batch_rows(np.ones((count, 2), np.float32), k, 8)[0]


def test_a_v6_batch_reply_carries_the_routing_version_after_the_count() -> None:
    full = [batch_item([1, 2], [0.0, 0.5], hit=1), batch_item([3, 4], [0.1, 0.2], hit=3)]
    body = batch_body(full, ROUTING)
    assert body[:12] == struct.pack("<IQ", 2, ROUTING)
    block = batch_req(2).result(frame(6, Opcode.SEARCH_BATCH, body))  # every row full: the fast path
    b = _codec.batch_of([block], [batch_req(2)], 2)
    assert b.routing_version == ROUTING and b.ids.tolist() == [[1, 2], [3, 4]]
    assert b[0].routing_version == ROUTING and b[1].kind is aker.HitKind.APPROXIMATE
    # Items one by one: a short row, a token, a failed row.
    mixed = [batch_item([1], [0.0], hit=1), batch_item([], [], token=9), batch_item(status=11)]
    block = batch_req(3).result(frame(6, Opcode.SEARCH_BATCH, batch_body(mixed, ROUTING)))
    assert block.routing_version == ROUTING and block.statuses.tolist() == [0, 0, 11] and block.tokens[1] == 9
    # Below version 6: no routing version, 0.
    block = batch_req(2).result(frame(5, Opcode.SEARCH_BATCH, batch_body(full)))
    assert block.routing_version == 0 and block.ids.tolist() == [[1, 2], [3, 4]]


def test_v6_batch_replies_that_do_not_hold_are_refused() -> None:
    item = batch_item([1, 2], [0.0, 0.5], hit=1)
    failed = batch_item(status=14)
    # A routing version with no query answered: the server writes 0 then.
    assert batch_req(2).result(frame(6, Opcode.SEARCH_BATCH, batch_body([failed, failed], 0))).statuses.all()
    for version, bad in (
        (6, batch_body([failed, failed], 5)),
        (6, batch_body([item, item])),  # no routing version
        (6, batch_body([item, item], 1) + b"\x00"),
        (6, struct.pack("<I", 2) + b"\x00" * 7),
        (5, batch_body([item, item], 1)),
    ):
        with pytest.raises(aker.ProtocolError):
            batch_req(2).result(frame(version, Opcode.SEARCH_BATCH, bad))


def test_batches_of_many_frames_keep_the_largest_routing_version() -> None:
    reqs = _codec.Codec(info()).search_batch_rows(np.ones((3, 2), np.float32), 1, 2)
    assert [r.slots for r in reqs] == [2, 1]
    one = batch_item([1], [0.0], hit=1)
    outs = [reqs[0].result(frame(6, Opcode.SEARCH_BATCH, batch_body([one, one], 7))),
            reqs[1].result(frame(6, Opcode.SEARCH_BATCH, batch_body([one], 9)))]
    assert _codec.batch_of(outs, reqs, 1).routing_version == 9
    # One SEARCH per row (a server below version 4) keeps the largest too.
    singles = [_codec.Codec(info()).search([0.0, 0.0], 1) for _ in range(2)]
    for i, s in enumerate(singles):
        s.row = i
    res = [s.result(frame(6, Opcode.SEARCH, search_body([1], [0.0], routing=r)))
           for s, r in zip(singles, (4, 3), strict=True)]
    assert _codec.batch_of(res, singles, 1).routing_version == 4


# ---------------------------------------------------------------------------- CLUSTER


def test_the_cluster_request() -> None:
    req = _codec.Codec(info()).cluster()
    assert req.opcode is Opcode.CLUSTER and req.body == b"" and req.flags == 0 and req.slots == 1
    assert req.encode(6, 5) == hexbytes("41 4B 06 0B 00 00 00 00  05 00 00 00 00 00 00 00  00 00 00 00")
    for version in (5, 4, 2):
        with pytest.raises(aker.Unsupported) as e:
            _codec.Codec(info(version)).cluster()
        assert e.value.local and "version 6" in str(e.value)


#: A CLUSTER reply written by hand from PROTOCOL.md's table.
CLUSTER_REPLY = (
    "41 4B 06 8B 00 00 00 00  05 00 00 00 00 00 00 00  7D 00 00 00"
    " 08 07 06 05 04 03 02 01"  # routing_version
    " 02 00 00 00 00 00 00 00"  # centroids_version 2
    " 01 00 00 00 00 00 00 00"  # balance_epoch 1
    " A1 00 00 00 00 00 00 00"  # self_id 0xA1
    " B8 0B 00 00  01  00 00 00"  # lease_ms 3000, metric cosine, reserved
    " 02 00 00 00  02 00 00 00"  # dim 2, n 2
    " 00 00 80 3F  00 00 00 00  00 00 00 00  00 00 80 3F"  # (1, 0), (0, 1)
    " 02 00 00 00"  # 2 nodes
    " A1 00 00 00 00 00 00 00  01 00  03 00  68 3A 31"  # 0xA1 live "h:1"
    " B2 00 00 00 00 00 00 00  00 00  0A 00  5B 3A 3A 31 5D 3A 37 37 30 30"  # 0xB2 not live "[::1]:7700"
    " 01 00 00 00  01 00 00 00  A1 00 00 00 00 00 00 00"  # 1 override: centroid 1 -> 0xA1
    " 02 00  63 31"  # name "c1"
)


def test_the_cluster_reply_decodes() -> None:
    raw = bytearray(hexbytes(CLUSTER_REPLY))
    f = _codec.take_frame(raw, 1 << 20)
    assert f is not None and not raw and len(f.body) == 125
    assert f.body == cluster_body(routing_version=ROUTING, centroids_version=2, balance_epoch=1, self_id=0xA1,
                                  metric=1, centroids=[[1, 0], [0, 1]], nodes=[(0xA1, True, "h:1"),
                                  (0xB2, False, "[::1]:7700")], overrides=[(1, 0xA1)], name="c1")
    s = _codec.Codec(info()).cluster().result(f)
    assert isinstance(s, aker.ClusterState)
    assert (s.name, s.routing_version, s.centroids_version, s.balance_epoch, s.self_id, s.lease_ms) == (
        "c1", ROUTING, 2, 1, 0xA1, 3000)
    assert s.metric is aker.Metric.COSINE and s.dim == 2 and s.n_centroids == 2
    assert s.centroids.dtype == np.float32 and s.centroids.shape == (2, 2) and s.centroids.tolist() == [[1, 0], [0, 1]]
    assert s.nodes == [aker.ClusterNode(0xA1, True, "h:1"), aker.ClusterNode(0xB2, False, "[::1]:7700")]
    assert s.live_nodes == s.nodes[:1] and s.node(0xB2) == s.nodes[1] and s.node(7) is None
    assert s.overrides == [(1, 0xA1)]


def random_state(rng: np.random.Generator) -> dict[str, Any]:
    dim = int(rng.integers(1, 6))
    n = int(rng.integers(0, 5))
    nodes = [(int(rng.integers(0, 1 << 63)) * 2 + 1, bool(rng.integers(0, 2)), f"node-{i}.example:{7700 + i}")
             for i in range(int(rng.integers(0, 6)))]
    return dict(routing_version=int(rng.integers(1, 1 << 63)), centroids_version=int(rng.integers(0, 9)),
                balance_epoch=int(rng.integers(0, 9)), self_id=nodes[0][0] if nodes else 0,
                lease_ms=int(rng.integers(0, 1 << 32)), metric=int(rng.integers(0, 3)), dim=dim,
                centroids=rng.standard_normal((n, dim)).astype(np.float32).tolist(), nodes=nodes,
                overrides=[(int(rng.integers(0, 64)), int(rng.integers(0, 1 << 64, dtype=np.uint64)))
                           for _ in range(int(rng.integers(0, 4)))],
                name=f"cluster-ü-{int(rng.integers(0, 100))}")


def test_cluster_replies_round_trip() -> None:
    rng = np.random.default_rng(6)
    for _ in range(50):
        want = random_state(rng)
        s = _codec.decode_cluster(6, cluster_body(**want))
        got = dict(routing_version=s.routing_version, centroids_version=s.centroids_version,
                   balance_epoch=s.balance_epoch, self_id=s.self_id, lease_ms=s.lease_ms, metric=int(s.metric),
                   dim=s.dim, centroids=s.centroids.tolist(), nodes=[(n.node_id, n.live, n.advertise) for n in s.nodes],
                   overrides=s.overrides, name=s.name)
        assert got == want
        assert s.centroids.shape == (len(want["centroids"]), want["dim"])


def test_the_cluster_limits_are_enforced() -> None:
    node = (1, True, "h:1")
    ok: list[dict[str, Any]] = [
        dict(nodes=[(i, True, f"a:{i}") for i in range(1024)]),
        dict(overrides=[(i, 1) for i in range(1024)]),
        dict(nodes=[(1, True, "a" * 255)]),
        dict(name="n" * 255),
        dict(centroids=[], dim=3),
    ]
    for kw in ok:
        _codec.decode_cluster(6, cluster_body(**kw))
    good = cluster_body(nodes=[node], overrides=[(0, 1)])
    head = good[:48 + 8]  # through one centroid of dimension 2
    bad = {
        "1025 nodes": cluster_body(nodes=[(i, True, "a") for i in range(1025)]),
        "1025 overrides": cluster_body(overrides=[(0, 1)] * 1025),
        "node 0's address of 256 bytes": cluster_body(nodes=[(1, True, "a" * 256)]),
        "the cluster name of 256 bytes": cluster_body(name="n" * 256),
        "not UTF-8": cluster_body(name="x").replace(b"\x01\x00x", b"\x01\x00\xff"),
        "centroid 1 is not finite": cluster_body(centroids=[[0, 0], [float("nan"), 0]]),
        "centroid 0 is not finite": cluster_body(centroids=[[float("inf"), 0]]),
        "do not fit": cluster_body(centroids=[], dim=0),
        "unknown metric code 3": cluster_body(metric=3),
        "reserved bytes": good[:37] + b"\x00\x01\x00" + good[40:],
        "live byte is 2": head + struct.pack("<IQBBH", 1, 1, 2, 0, 0) + good[-22:],
        "reserved byte is 1": head + struct.pack("<IQBBH", 1, 1, 1, 1, 0) + good[-22:],
        "1 bytes after": good + b"\x00",
        "100 centroids of dimension 2 do not fit": good[:44] + struct.pack("<I", 100) + good[48:],
    }
    assert head + struct.pack("<IQBBH", 1, 1, 1, 0, 3) + b"h:1" + good[-22:] == good  # the pieces are right
    for what, body in bad.items():
        with pytest.raises(aker.ProtocolError, match=what):
            _codec.decode_cluster(6, body)
    for cut in range(len(good)):  # every truncation
        with pytest.raises(aker.ProtocolError):
            _codec.decode_cluster(6, good[:cut])
    # Through a request, a bad body is the request's ProtocolError.
    with pytest.raises(aker.ProtocolError, match="CLUSTER"):
        _codec.Codec(info()).cluster().result(frame(6, Opcode.CLUSTER, good[:-1]))
    # A node in no cluster answers UNSUPPORTED.
    with pytest.raises(aker.Unsupported) as e:
        _codec.Codec(info()).cluster().result(frame(6, Opcode.CLUSTER, b"not in a cluster", status=13))
    assert not e.value.local
