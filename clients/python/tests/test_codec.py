"""Encoding and decoding without a server: PROTOCOL.md's example bytes, HELLO layouts,
the status table, the input checks, the proofs."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aker
from aker import _auth, _codec
from aker._protocol import Opcode, ServerInfo

PROTOCOL_MD = Path(__file__).resolve().parents[3] / "PROTOCOL.md"


INFO = ServerInfo(version=3, version_min=1, version_max=3, metric=aker.Metric.L2SQ, max_frame_bytes=4096, dim=2,
                  k_max=10, max_inflight=4, executors=1, shards=1, delta=2, auth_required=False)


def info(**kw: Any) -> ServerInfo:
    """A version 3 server's HELLO, ``kw`` changed."""
    return dataclasses.replace(INFO, **kw)


def hexbytes(text: str) -> bytes:
    return bytes.fromhex(" ".join(re.findall(r"\b[0-9A-F]{2}\b", text)))


def test_search_request_is_the_protocol_example() -> None:
    req = _codec.Codec(info()).search(np.array([1.0, 0.0]), 2)
    want = hexbytes(
        "41 4B 04 03 00 00 00 00  07 00 00 00 00 00 00 00  18 00 00 00"
        " 00 00 00 00  02 00 00 00  00 00 00 00  02 00 00 00 00 00 80 3F  00 00 00 00"
    )
    assert req.encode(4, 7) == want
    assert req.encode(3, 7) == want[:2] + b"\x03" + want[3:]  # the same request in version 3
    if PROTOCOL_MD.is_file():  # the same bytes as in the document itself
        assert "41 4B 04 03 00 00 00 00  07 00" in PROTOCOL_MD.read_text()


def test_search_reply_of_the_protocol_example_decodes() -> None:
    raw = bytearray(
        hexbytes(
            "41 4B 04 83 00 00 00 00  07 00 00 00 00 00 00 00  20 00 00 00"
            " 01 01 00 00  02 00 00 00"
            " 05 00 00 00 00 00 00 00  00 00 00 00"
            " 09 00 00 00 00 00 00 00  00 00 80 3E"
        )
    )
    frame = _codec.take_frame(raw, 1 << 20)
    assert frame is not None and not raw
    r = _codec.Codec(info()).search([1.0, 0.0], 2).result(frame)
    assert r.kind is aker.HitKind.EXACT and r.hit and r.distances_to_query
    assert r.ids.dtype == np.uint64 and r.distances.dtype == np.float32
    assert r.ids.tolist() == [5, 9] and r.distances.tolist() == [0.0, 0.25]
    ids, dists = r
    assert ids is r.ids and dists is r.distances


def test_partial_frames_wait_for_the_rest() -> None:
    whole = _codec.encode_frame(3, Opcode.PING | 0x80, 0, 5, b"abc")
    buf = bytearray(whole[:7])
    assert _codec.take_frame(buf, 1 << 20) is None
    buf += whole[7:]
    f = _codec.take_frame(buf, 1 << 20)
    assert f is not None and f.body == b"abc" and f.request_id == 5


def test_bad_magic_and_oversized_replies_are_protocol_errors() -> None:
    with pytest.raises(aker.ProtocolError):
        _codec.take_frame(bytearray(b"XX" + bytes(30)), 1 << 20)
    big = bytearray(_codec.encode_frame(3, 0x82, 0, 1, bytes(100)))
    with pytest.raises(aker.ProtocolError):
        _codec.take_frame(big, 64)


@pytest.mark.parametrize(
    "version,extra,auth",
    [(2, b"", False), (3, b"\x00", False), (3, b"\x01" + bytes(range(16)), True)],
)
def test_hello_layouts(version: int, extra: bytes, auth: bool) -> None:
    body = struct.pack("<BBBB7I", 1, 3, 1, 0, 4096, 8, 32, 16, 2, 4, 3)[: 32 if version >= 2 else 28] + extra
    fields, challenge = _codec._hello(version, body)
    assert fields["metric"] is aker.Metric.COSINE and fields["dim"] == 8 and fields["delta"] == 3
    assert fields["auth_required"] is auth and (challenge == bytes(range(16))) is auth
    with pytest.raises(aker.ProtocolError):
        _codec._hello(version, body + b"\x00")


def test_every_status_has_its_class() -> None:
    names = {s for s in aker.Status if s != aker.Status.OK}
    assert set(aker.STATUS_ERRORS) == names and len(names) == 17
    for status, cls in aker.STATUS_ERRORS.items():
        e = aker.error_for_status(int(status), "msg", request_id=9)
        assert type(e) is cls and isinstance(e, aker.StatusError) and isinstance(e, aker.AkerError)
        assert e.status is status and e.code == status and e.request_id == 9 and not e.local
    for cls in (aker.DimensionMismatch, aker.NonFinite, aker.BadK, aker.UnknownCollection, aker.TooLarge):
        assert issubclass(cls, ValueError)
    assert issubclass(aker.Unauthenticated, aker.AuthError)
    unknown = aker.error_for_status(99, "future")
    assert type(unknown) is aker.StatusError and unknown.status is None and unknown.code == 99


def test_the_statuses_are_the_protocols() -> None:
    if not PROTOCOL_MD.is_file():
        pytest.skip("PROTOCOL.md not beside the package")
    rows = re.findall(r"^\| (\d+) +\| `([A-Z_]+)`", PROTOCOL_MD.read_text(), re.M)
    assert {int(c): n for c, n in rows} == {int(s): s.name for s in aker.Status}


def test_input_checks_are_local_value_errors() -> None:
    c = _codec.Codec(info())
    cases: list[tuple[Callable[[], object], type[aker.StatusError]]] = [
        (lambda: c.search([1.0, 2.0, 3.0], 2), aker.DimensionMismatch),
        (lambda: c.search([[1.0, 2.0]], 2), aker.DimensionMismatch),
        (lambda: c.search([np.nan, 0.0], 2), aker.NonFinite),
        (lambda: c.search([np.inf, 0.0], 2), aker.NonFinite),
        (lambda: c.search(np.array([1e300, 0.0]), 2), aker.NonFinite),  # overflows f32
        (lambda: c.search(["a", "b"], 2), aker.InvalidRequest),
        (lambda: c.search([1.0, 0.0], 0), aker.BadK),
        (lambda: c.search([1.0, 0.0], 11), aker.BadK),
        (lambda: c.search([1.0, 0.0], 2, deadline=-1.0), aker.InvalidRequest),
        (lambda: c.insert(-1, [1.0, 0.0]), aker.InvalidRequest),
        (lambda: c.insert(1 << 64, [1.0, 0.0]), aker.InvalidRequest),
        (lambda: c.insert(1, [1.0, 0.0], bytes(5000)), aker.TooLarge),
        (lambda: c.fill([0.0, 0.0], 1, [1, 2], [0.5, 0.1], [[0, 0], [1, 1]]), aker.InvalidRequest),
        (lambda: c.fill([0.0, 0.0], 1, [1, 1], [0.1, 0.5], [[0, 0], [1, 1]]), aker.InvalidRequest),
        (lambda: c.fill([0.0, 0.0], 1, [1], [np.nan], [[0, 0]]), aker.NonFinite),
        (lambda: c.fill([0.0, 0.0], 1, [1], [0.1], [[0, 0, 0]]), aker.DimensionMismatch),
    ]
    for call, cls in cases:
        with pytest.raises(cls) as e:
            call()
        assert e.value.local and isinstance(e.value, ValueError) and isinstance(e.value, aker.AkerError)


def test_vectors_are_converted_once_to_float32() -> None:
    v = np.array([1.0, 2.0], dtype=np.float32)
    assert _codec.as_vector(v, 2) is v  # already right: no copy
    strided = np.arange(4, dtype=np.float64)[::2]
    out = _codec.as_vector(strided, 2)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.tolist() == [0.0, 2.0]
    assert _codec.as_vector([3, 4], 2).dtype == np.float32
    m = _codec.as_matrix(np.ones((3, 2), dtype=np.float64, order="F"), 2)
    assert m.dtype == np.float32 and m.flags.c_contiguous


def test_fill_body_layout() -> None:
    req = _codec.Codec(info()).fill([0.0, 1.0], 1, [4, 6], [0.5, 0.5], [[1, 2], [3, 4]], token=77)
    assert req.flags == 1
    head = struct.unpack_from("<IIII", req.body)
    assert head == (0, 1, 2, 2)
    assert len(req.body) == 16 + 8 + 2 * (12 + 8) + 8
    assert struct.unpack_from("<Q", req.body, len(req.body) - 8)[0] == 77
    assert struct.unpack_from("<Qf2f", req.body, 24) == (4, 0.5, 1.0, 2.0)


def test_proofs_are_hmac_sha256() -> None:
    secret, challenge, nonce = b"k" * 20, bytes(range(16)), bytes(range(16, 32))
    want = hmac.new(secret, b"aker-auth-v3 client" + challenge + nonce, hashlib.sha256).digest()
    assert _auth.client_proof(secret, challenge, nonce) == want
    s = _auth.server_proof(secret, challenge, nonce)
    assert s != want and _auth.verify_server(secret, challenge, nonce, s)
    assert not _auth.verify_server(secret, challenge, nonce, want)


def test_secrets(tmp_path: Path) -> None:
    f = tmp_path / "s"
    f.write_bytes(b"correct horse battery staple\r\nignored\n")
    assert aker.load_secret(secret_file=f) == b"correct horse battery staple"
    assert aker.load_secret("correct horse battery staple") == b"correct horse battery staple"
    assert aker.load_secret() is None
    for bad in (dict(secret=b"short"), dict(secret="x" * 5000), dict(secret_file=tmp_path / "missing")):
        with pytest.raises(aker.InvalidSecret) as e:
            aker.load_secret(**bad)
        assert isinstance(e.value, ValueError)
    f.write_bytes(b"tiny\n")
    with pytest.raises(aker.InvalidSecret) as e:
        aker.load_secret(secret_file=f)
    assert "tiny" not in str(e.value)
