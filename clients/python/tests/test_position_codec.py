"""Version 5 without a server: the writes' positions in INSERT / DELETE replies (and their
absence below 5), SEARCH and SEARCH_BATCH with AT_POSITION (bytes, sizes, refused below
version 5), the handshake's fallback, PROTOCOL.md's example bytes."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np
import pytest

import aker
from aker import _codec
from aker._protocol import FLAG_AT_POSITION, Opcode, ServerInfo

from fake_server import hello_body
from test_codec import PROTOCOL_MD, hexbytes

LSN = 0x16_B374_D848  # 16/B374D848


INFO = ServerInfo(version=5, version_min=1, version_max=5, metric=aker.Metric.L2SQ, max_frame_bytes=4096, dim=2,
                  k_max=10, max_inflight=8, executors=1, shards=1, delta=2, auth_required=False, max_batch=8)


def info(version: int = 5, **kw: Any) -> ServerInfo:
    """A server's HELLO in ``version`` (also its newest), ``kw`` changed."""
    return dataclasses.replace(INFO, version=version, version_max=version, **kw)


def frame(version: int, op: int, body: bytes, rid: int = 9) -> _codec.Frame:
    return _codec.Frame(version, op | 0x80, 0, 0, rid, body)


# ---------------------------------------------------------------------------- replies


def test_insert_replies_carry_the_position_in_version_5() -> None:
    c = _codec.Codec(info())
    body = struct.pack("<Q", LSN)
    assert c.insert(1, [1.0, 0.0], with_position=True).result(frame(5, Opcode.INSERT, body)) == LSN
    assert c.insert(1, [1.0, 0.0]).result(frame(5, Opcode.INSERT, body)) is None
    # Below version 5 the body is empty, and the position 0.
    assert c.insert(1, [1.0, 0.0], with_position=True).result(frame(4, Opcode.INSERT, b"")) == 0
    assert c.insert(1, [1.0, 0.0]).result(frame(4, Opcode.INSERT, b"")) is None
    for version, bad in ((5, b""), (5, bytes(7)), (5, bytes(9)), (4, bytes(8))):
        with pytest.raises(aker.ProtocolError):
            c.insert(1, [1.0, 0.0]).result(frame(version, Opcode.INSERT, bad))


def test_delete_replies_carry_existed_then_the_position() -> None:
    c = _codec.Codec(info())
    body = b"\x01" + struct.pack("<Q", LSN)
    d = c.delete(3, with_position=True).result(frame(5, Opcode.DELETE, body))
    assert isinstance(d, aker.Deleted) and d == aker.Deleted(existed=True, position=LSN)
    assert c.delete(3).result(frame(5, Opcode.DELETE, body)) is True
    assert c.delete(3).result(frame(5, Opcode.DELETE, b"\x00" + bytes(8))) is False
    assert c.delete(3, with_position=True).result(frame(4, Opcode.DELETE, b"\x00")) == aker.Deleted(False, 0)
    assert c.delete(3).result(frame(4, Opcode.DELETE, b"\x01")) is True
    for version, bad in ((5, b"\x01"), (5, b"\x02" + bytes(8)), (5, body + b"\x00"), (4, body), (4, b"\x02"), (4, b"")):
        with pytest.raises(aker.ProtocolError):
            c.delete(3).result(frame(version, Opcode.DELETE, bad))


def test_the_delete_reply_of_the_protocol_example_decodes() -> None:
    raw = bytearray(hexbytes("41 4B 05 85 00 00 00 00  0A 00 00 00 00 00 00 00  09 00 00 00"
                             "  01  48 D8 74 B3 16 00 00 00"))
    f = _codec.take_frame(raw, 1 << 20)
    assert f is not None and not raw and f.version == 5
    assert _codec.Codec(info()).delete(7, with_position=True).result(f) == aker.Deleted(True, LSN)
    if PROTOCOL_MD.is_file():
        assert "41 4B 05 85 00 00 00 00  0A 00" in PROTOCOL_MD.read_text()


# ---------------------------------------------------------------------------- requests


def test_search_at_a_position_is_the_protocol_example() -> None:
    req = _codec.Codec(info()).search(np.array([1.0, 0.0]), 2, at_position=LSN)
    want = hexbytes(
        "41 4B 05 03 04 00 00 00  09 00 00 00 00 00 00 00  20 00 00 00"
        " 00 00 00 00  02 00 00 00  00 00 00 00  02 00 00 00"
        " 00 00 80 3F  00 00 00 00  48 D8 74 B3 16 00 00 00"
    )
    assert req.flags == FLAG_AT_POSITION == 0x0004
    assert req.encode(5, 9) == want
    if PROTOCOL_MD.is_file():
        assert "41 4B 05 03 04 00 00 00  09 00" in PROTOCOL_MD.read_text()


def test_at_position_combines_with_the_other_flags_and_ends_the_body() -> None:
    c = _codec.Codec(info())
    plain = c.search([1.0, 0.0], 2, bypass_cache=True, refresh_entry=True)
    at = c.search([1.0, 0.0], 2, bypass_cache=True, refresh_entry=True, at_position=0)
    assert (plain.flags, at.flags) == (0x0003, 0x0007)
    assert at.body == plain.body + bytes(8)
    top = c.search([1.0, 0.0], 2, at_position=(1 << 64) - 1)
    assert top.body[-8:] == b"\xff" * 8
    for bad in (-1, 1 << 64, 1.5, "16/B374D848", True):
        with pytest.raises(aker.InvalidRequest):
            c.search([1.0, 0.0], 2, at_position=bad)


def test_search_batch_at_a_position_ends_each_frame_with_it() -> None:
    c = _codec.Codec(info())
    mat = np.arange(10, dtype=np.float32).reshape(5, 2)
    reqs, k = _codec.batch_requests(c, mat, 3, window=8, reply_limit=1 << 20, errors="raise", at_position=LSN)
    assert k == 3 and len(reqs) == 1
    r = reqs[0]
    assert r.opcode is Opcode.SEARCH_BATCH and r.flags == FLAG_AT_POSITION and r.slots == 5
    assert struct.unpack_from("<5I", r.body) == (0, 3, 0, 2, 5)
    assert len(r.body) == 20 + 4 * 2 * 5 + 8
    assert struct.unpack_from("<Q", r.body, len(r.body) - 8)[0] == LSN
    # Several frames: each carries the position.
    reqs, _ = _codec.batch_requests(c, mat, 3, window=2, reply_limit=1 << 20, errors="raise", at_position=7)
    assert [q.slots for q in reqs] == [2, 2, 1]
    assert all(q.body[-8:] == struct.pack("<Q", 7) for q in reqs)


def test_the_position_counts_against_the_request_frame() -> None:
    # 40 + 4·dim·count <= max_frame without a position; 8 bytes fewer with one.
    c = _codec.Codec(info(dim=32, max_frame_bytes=40 + 128 * 8, max_batch=64, max_inflight=64))
    assert c.batch_count(1, 64, 1 << 20) == 8
    assert c.batch_count(1, 64, 1 << 20, 8) == 7
    mat = np.zeros((8, 32), np.float32)
    reqs, _ = _codec.batch_requests(c, mat, 1, 64, 1 << 20, "raise", at_position=1)
    assert [q.slots for q in reqs] == [7, 1]
    assert all(20 + len(q.body) <= c.info.max_frame_bytes for q in reqs)


@pytest.mark.parametrize("version", [2, 3, 4])
def test_at_position_below_version_5_is_refused_before_sending(version: int) -> None:
    c = _codec.Codec(info(version))
    with pytest.raises(aker.InvalidRequest) as e:
        c.search([1.0, 0.0], 2, at_position=1)
    assert e.value.local and "version 5" in str(e.value)
    mat = np.zeros((3, 2), np.float32)
    for rows in (mat, mat[:0]):
        with pytest.raises(aker.InvalidRequest):
            _codec.batch_requests(c, rows, 2, 8, 1 << 20, "raise", at_position=1)
    # Without a position, nothing changes.
    assert c.search([1.0, 0.0], 2).flags == 0


# ---------------------------------------------------------------------------- handshake


def test_hello_v5_is_v4s_layout() -> None:
    for challenge in (None, bytes(range(16))):
        body = hello_body(5, max_batch=6, challenge=challenge)
        assert body == hello_body(4, max_batch=6, challenge=challenge, vmax=5)
        fields, got = _codec._hello(5, body)
        assert fields["max_batch"] == 6 and fields["version_max"] == 5 and got == challenge


def test_the_handshake_falls_back_to_5_and_to_4() -> None:
    for newest in (5, 4):
        steps = _codec.handshake(None)
        assert next(steps).version == 6
        again = steps.send(_codec.Frame(newest, 0x81, 0, int(aker.Status.BAD_VERSION), 1, b""))
        assert again.version == newest
        with pytest.raises(StopIteration) as stop:
            steps.send(_codec.Frame(newest, 0x81, 0, 0, 2, hello_body(newest, vmax=newest)))
        assert stop.value.value.version == newest and stop.value.value.max_batch == 4
