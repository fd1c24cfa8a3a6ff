"""Version 4 without a server: HELLO's max_batch, SEARCH_BATCH request bytes, reply
items decoded (every layout the protocol allows, malformed ones refused), chunk sizes,
per-row errors raised or returned."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np
import pytest

import aker
from aker import _codec
from aker._protocol import Opcode, ServerInfo

from fake_server import batch_body, batch_item, hello_body
from test_codec import PROTOCOL_MD, hexbytes

INFO = ServerInfo(version=4, version_min=1, version_max=4, metric=aker.Metric.L2SQ, max_frame_bytes=4096, dim=2,
                  k_max=10, max_inflight=8, executors=1, shards=1, delta=2, auth_required=False, max_batch=8)


def info(**kw: Any) -> ServerInfo:
    """A version 4 server's HELLO, ``kw`` changed."""
    return dataclasses.replace(INFO, **kw)


def frame(op: int, body: bytes, rid: int = 9, status: int = 0) -> _codec.Frame:
    return _codec.Frame(4, op | 0x80, 0, status, rid, body)


# ---------------------------------------------------------------------------- HELLO


@pytest.mark.parametrize("challenge", [None, bytes(range(16))])
def test_hello_v4_layout(challenge: object) -> None:
    body = hello_body(4, dim=8, k_max=32, max_inflight=16, challenge=challenge, max_batch=7)  # type: ignore[arg-type]
    assert len(body) == (53 if challenge else 37)
    assert struct.unpack_from("<I", body, 49 if challenge else 33)[0] == 7  # PROTOCOL.md's offsets
    fields, got = _codec._hello(4, body)
    assert fields["max_batch"] == 7 and fields["max_inflight"] == 16 and fields["dim"] == 8
    assert got == challenge and fields["auth_required"] is (challenge is not None)
    for bad in (body[:-1], body + b"\x00", body[:33]):
        with pytest.raises(aker.ProtocolError):
            _codec._hello(4, bad)


def test_hello_v3_and_v2_have_no_max_batch() -> None:
    for version in (2, 3):
        fields, _ = _codec._hello(version, hello_body(version, max_batch=7))
        assert fields["max_batch"] is None
    with pytest.raises(aker.ProtocolError):  # a v4 body in a v3 reply
        _codec._hello(3, hello_body(4))


def test_the_handshake_speaks_the_newest_then_falls_back() -> None:
    steps = _codec.handshake(None)
    req = next(steps)
    assert req.version == 6 and req.opcode is Opcode.HELLO and aker.VERSIONS == (6, 5, 4, 3, 2)
    again = steps.send(_codec.Frame(3, 0x81, 0, int(aker.Status.BAD_VERSION), 1, b""))
    assert again.version == 3
    with pytest.raises(StopIteration) as stop:
        steps.send(_codec.Frame(3, 0x81, 0, 0, 2, hello_body(3, vmax=3)))
    assert stop.value.value.version == 3 and stop.value.value.max_batch is None


# ---------------------------------------------------------------------------- requests


def test_search_batch_request_bytes() -> None:
    c = _codec.Codec(info())
    mat = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]], np.float32)
    reqs = c.search_batch_rows(mat, 2, 2, bypass_cache=True, deadline=0.001, collection=0)
    assert [(r.slots, r.row, r.opcode) for r in reqs] == [(2, 0, Opcode.SEARCH_BATCH), (1, 2, Opcode.SEARCH_BATCH)]
    wire = reqs[0].encode(4, 7)
    assert wire[:20] == struct.pack("<HBBHHQI", 0x4B41, 4, 0x0A, 1, 0, 7, 20 + 16)
    assert wire[20:40] == struct.pack("<5I", 0, 2, 1000, 2, 2)
    assert wire[40:] == struct.pack("<4f", 1.0, 0.0, 0.0, 2.0)  # row-major
    assert reqs[1].body == struct.pack("<5I", 0, 2, 1000, 2, 1) + struct.pack("<2f", 3.0, 4.0)
    refresh = c.search_batch_rows(mat, 2, 8, refresh_entry=True)
    assert len(refresh) == 1 and refresh[0].flags == 2 and refresh[0].slots == 3


def test_search_batch_is_the_protocol_example() -> None:
    """PROTOCOL.md's SEARCH_BATCH example: id 8, k 1, dimension 2, (1.0, 0.0) and a NaN
    query (sent past the client's own check), answered EXACT and NON_FINITE."""
    mat = np.array([[1.0, 0.0], [np.nan, 0.0]], np.float32)
    req = _codec.Codec(info()).search_batch_rows(mat, 1, 8)[0]
    want = hexbytes(
        "41 4B 04 0A 00 00 00 00  08 00 00 00 00 00 00 00  24 00 00 00"
        " 00 00 00 00  01 00 00 00  00 00 00 00  02 00 00 00  02 00 00 00"
        " 00 00 80 3F  00 00 00 00  00 00 C0 7F  00 00 00 00"
    )
    assert req.encode(4, 8) == want
    raw = bytearray(hexbytes(
        "41 4B 04 8A 00 00 00 00  08 00 00 00 00 00 00 00  20 00 00 00  02 00 00 00"
        " 00 00 01 01  01 00 00 00  05 00 00 00 00 00 00 00  00 00 00 00"
        " 09 00 00 00  00 00 00 00"
    ))
    reply = _codec.take_frame(raw, 1 << 20)
    assert reply is not None and not raw
    block = req.result(reply)
    assert block.statuses.tolist() == [0, 9] and block.kinds == [aker.HitKind.EXACT, aker.HitKind.MISS]
    assert block.ids[0].tolist() == [5] and block.distances[0].tolist() == [0.0] and block.request_id == 8
    with pytest.raises(aker.NonFinite) as e:
        _codec.batch_result([block], [req], 1, "raise")
    assert e.value.row == 1 and e.value.request_id == 8
    if PROTOCOL_MD.is_file():
        text = PROTOCOL_MD.read_text()
        assert "41 4B 04 0A 00 00 00 00  08 00" in text and "09 00 00 00  00 00 00 00" in text


def test_the_fallback_is_one_search_per_row() -> None:
    for i in (info(version=3, max_batch=None), info(max_batch=0)):
        reqs, k = _codec.batch_requests(_codec.Codec(i), np.ones((3, 2)), 4, 8, 1 << 20, "raise")
        assert k == 4 and [(r.opcode, r.slots, r.row) for r in reqs] == [(Opcode.SEARCH, 1, j) for j in range(3)]


def test_batch_count_bounds() -> None:
    c = _codec.Codec(info(max_frame_bytes=4096, dim=2, max_batch=1000, k_max=1000))
    # reply: 24 + count * (16 + 12 k) <= 4096: 29 at k = 10 (30 would be 4,104 bytes), 145 at k = 1
    assert c.batch_count(10, 1000, 1 << 30) == 29
    assert c.batch_count(1, 1000, 1 << 30) == 145 and 24 + 146 * 28 > 4096 >= 24 + 145 * 28
    # request: 40 + 4 * dim * count <= 4096: 10 rows of dimension 100
    wide = _codec.Codec(info(max_frame_bytes=4096, dim=100, max_batch=1000))
    assert wide.batch_count(1, 1000, 1 << 30) == 10 and 40 + 400 * 11 > 4096 >= 40 + 400 * 10
    assert c.batch_count(10, 5, 1 << 30) == 5  # the window
    assert _codec.Codec(info(max_batch=3)).batch_count(1, 8, 1 << 30) == 3  # max_batch
    assert c.batch_count(10, 1000, 24 + 136 * 4) == 4  # the client's max_reply_bytes
    assert _codec.Codec(info(version=3, max_batch=None)).batch_count(1, 8, 1 << 30) == 0


def test_errors_must_be_raise_or_return() -> None:
    for bad in ("ignore", None, "RAISE", 1):
        with pytest.raises(aker.InvalidRequest) as e:
            _codec.check_errors(bad)  # type: ignore[arg-type]
        assert e.value.local


# ---------------------------------------------------------------------------- replies


def reply_of(reqs: list[_codec.Req], bodies: list[bytes]) -> list[object]:
    return [r.result(frame(0x0A, b, rid=20 + i)) for i, (r, b) in enumerate(zip(reqs, bodies, strict=True))]


def test_a_reply_of_full_hits_decodes() -> None:
    req = _codec.Codec(info()).search_batch_rows(np.ones((3, 2), np.float32), 2, 8)[0]
    body = batch_body([batch_item([i, i + 10], [0.25, 0.5], hit=1 + i) for i in range(3)])
    block = req.result(frame(0x0A, body, rid=33))
    assert isinstance(block, _codec.RowBlock) and block.request_id == 33
    assert block.ids.tolist() == [[0, 10], [1, 11], [2, 12]] and block.ids.dtype == np.uint64
    assert block.distances.tolist() == [[0.25, 0.5]] * 3 and block.distances.dtype == np.float32
    assert block.kinds == [aker.HitKind.EXACT, aker.HitKind.ALIAS, aker.HitKind.APPROXIMATE]
    assert block.counts.tolist() == [2, 2, 2] and block.statuses.tolist() == [0, 0, 0]
    assert block.distances_to_query == [True] * 3 and block.tokens == [None] * 3
    # The same body read item by item gives the same block.
    slow = _codec._item_block(body, 2, 3)
    for name in ("ids", "distances", "counts", "statuses"):
        assert np.array_equal(getattr(slow, name), getattr(block, name)), name
    assert (slow.kinds, slow.tokens, slow.distances_to_query) == (block.kinds, block.tokens, block.distances_to_query)


def test_a_reply_of_every_item_kind_decodes() -> None:
    req = _codec.Codec(info()).search_batch_rows(np.ones((4, 2), np.float32), 3, 8, collection=0)[0]
    no_dtq = struct.pack("<HBBI", 0, 3, 0, 1) + struct.pack("<Qf", 8, 1.5)  # approximate, not re-ranked
    body = batch_body([
        batch_item([5, 6], [0.0, 0.5], hit=1),            # short row
        batch_item([], [], hit=0, token=0xDEADBEEF),      # cache-aside MISS
        batch_item(status=9),                             # NON_FINITE
        no_dtq,
    ])
    b = req.result(frame(0x0A, body))
    assert b.counts.tolist() == [2, 0, 0, 1] and b.statuses.tolist() == [0, 0, 9, 0]
    assert b.ids[0].tolist() == [5, 6, int(aker.NO_ID)] and np.isinf(b.distances[0, 2])
    assert b.tokens == [None, 0xDEADBEEF, None, None] and b.distances_to_query == [True, True, False, False]
    assert b.kinds == [aker.HitKind.EXACT, aker.HitKind.MISS, aker.HitKind.MISS, aker.HitKind.APPROXIMATE]
    result = _codec.batch_of([b], [req], 3)
    assert result[1].token == 0xDEADBEEF and result[3].distances_to_query is False and len(result[0]) == 2
    assert result.ok.tolist() == [True, True, False, True]


@pytest.mark.parametrize(
    "body",
    [
        b"\x01\x00",                                                          # no count
        batch_body([batch_item([1], [0.5], hit=1)] * 2),                      # 2 items for 3 queries
        batch_body([batch_item([1], [0.5], hit=1)] * 3) + b"\x00",            # a byte after the last
        batch_body([batch_item([1], [0.5], hit=1)] * 2 + [b"\x00\x00\x01"]),  # a cut item
        batch_body([batch_item([1, 2, 3], [0.1, 0.2, 0.3], hit=1)] * 3),      # m > k
        batch_body([batch_item([1, 2], [0.1, 0.2], hit=4)] * 3),              # unknown hit kind (all full)
        batch_body([batch_item([1], [0.1], hit=4)] * 3),                      # unknown hit kind (item by item)
        batch_body([struct.pack("<HBBI", 0, 1, 0x05, 0)] * 3),                # undefined flag
        batch_body([struct.pack("<HBBI", 0, 1, 0x04, 2) + bytes(24)] * 3),    # undefined flag (all full)
        batch_body([struct.pack("<HBBI", 11, 1, 0, 0)] * 3),                  # a failed item with a hit
        batch_body([struct.pack("<HBBI", 11, 0, 0, 1) + bytes(12)] * 3),      # a failed item with neighbours
        batch_body([struct.pack("<HBBI", 0, 1, 0x03, 0)] * 3),                # a token missing
        batch_body([struct.pack("<HBBI", 15, 0, 0, 0)] * 3),                  # SHUTTING_DOWN: a connection's
        batch_body([struct.pack("<HBBI", 10, 0, 0, 0)] * 3),                  # BAD_K: a frame's
        batch_body([struct.pack("<HBBI", 0xFFFF, 0, 0, 0)] * 3),              # no such status
    ],
)
def test_malformed_replies_are_protocol_errors(body: bytes) -> None:
    req = _codec.Codec(info()).search_batch_rows(np.ones((3, 2), np.float32), 2, 8)[0]
    with pytest.raises(aker.ProtocolError):
        req.result(frame(0x0A, body))


def test_an_error_reply_to_a_frame_names_its_first_row() -> None:
    reqs = _codec.Codec(info()).search_batch_rows(np.ones((5, 2), np.float32), 1, 2)
    with pytest.raises(aker.Busy) as e:
        reqs[1].result(frame(0x0A, b"a batch of 2 needs 2 slots", rid=44, status=2))
    assert e.value.row == 2 and e.value.request_id == 44 and e.value.message.startswith("a batch")


# ---------------------------------------------------------------------------- per-row errors


def blocks() -> tuple[list[_codec.Req], list[object]]:
    reqs = _codec.Codec(info()).search_batch_rows(np.ones((6, 2), np.float32), 1, 3)
    first = batch_body([batch_item([0], [0.1], hit=1), batch_item(status=11), batch_item([2], [0.1], hit=1)])
    second = batch_body([batch_item(status=14), batch_item([4], [0.1], hit=1), batch_item([5], [0.1])])
    return reqs, reply_of(reqs, [first, second])


def test_the_first_failed_row_raises() -> None:
    reqs, outs = blocks()
    with pytest.raises(aker.DeadlineExceeded) as e:
        _codec.batch_result(outs, reqs, 1, "raise")
    assert e.value.row == 1 and e.value.request_id == 20 and not e.value.local and "row 1" in str(e.value)
    with pytest.raises(aker.Unavailable) as e2:  # the later block alone: its row in the matrix
        _codec.batch_result(outs[1:], reqs[1:], 1, "raise")
    assert e2.value.row == 3 and e2.value.request_id == 21


def test_failed_rows_returned_and_frames_failed_whole() -> None:
    reqs, outs = blocks()
    b = _codec.batch_result(outs, reqs, 1, "return")
    assert b.statuses.tolist() == [0, 11, 0, 14, 0, 0] and b.ids[:, 0].tolist()[4:] == [4, 5]
    assert b.kinds[5] is aker.HitKind.MISS and b.kinds[4] is aker.HitKind.EXACT
    busy = aker.error_for_status(2, "busy")
    b2 = _codec.batch_result([outs[0], busy], reqs, 1, "return")
    assert b2.statuses.tolist() == [0, 11, 0, 2, 2, 2] and b2.counts.tolist() == [1, 0, 1, 0, 0, 0]


def test_a_batch_result_built_by_hand_is_all_ok() -> None:
    b = aker.BatchResult(ids=np.zeros((2, 1), np.uint64), distances=np.zeros((2, 1), np.float32),
                         kinds=[aker.HitKind.EXACT] * 2, counts=np.ones(2, np.int64))
    assert b.ok.tolist() == [True, True] and b.statuses.shape == (0,)
