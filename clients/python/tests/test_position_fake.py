"""Version 5 against a scripted server: the writes' positions reach the caller (sync,
pipelined, asyncio), AT_POSITION reaches the server (SEARCH, SEARCH_BATCH); a version 4
server is spoken to in version 4, reports no positions, and never gets AT_POSITION."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pytest

import aker

from conftest import run
from fake_server import FakeConn, FakeServer, batch_body, batch_item, hello_body, search_body

DIM = 4
#: (version, opcode, flags, body) of every request after HELLO.
Seen = list[tuple[int, int, int, bytes]]


def position(version: int, base: int, id: int) -> bytes:
    """A write reply's position (version 5), ``base + id``; nothing below."""
    return struct.pack("<Q", base + id) if version >= 5 else b""


def server(versions: tuple[int, ...], seen: Seen) -> Callable[[FakeConn], None]:
    """HELLO in ``versions``; INSERT's position 1000 + id, DELETE's 2000 + id (existed when
    the id is odd), SEARCH / SEARCH_BATCH answered with id 1."""
    newest = max(versions)

    def handle(c: FakeConn) -> None:
        while True:
            req = c.recv()
            if req is None:
                return
            version, op, flags, rid, body = req
            if version not in versions:
                c.send(newest, op, rid, b"version not spoken", status=5)
                continue
            if op == 1:
                c.send(version, op, rid, hello_body(version, dim=DIM, vmin=min(versions), vmax=newest))
                continue
            seen.append((version, op, flags, body))
            if op == 3:
                c.send(version, op, rid, search_body([1], [0.5], hit=1))
            elif op == 4:
                c.send(version, op, rid, position(version, 1000, struct.unpack_from("<Q", body)[0]))
            elif op == 5:
                id = struct.unpack_from("<Q", body)[0]
                c.send(version, op, rid, bytes([id & 1]) + position(version, 2000, id))
            elif op == 0x0A:
                count = struct.unpack_from("<I", body, 16)[0]
                c.send(version, op, rid, batch_body([batch_item([1], [0.5], hit=1)] * count))

    return handle


def test_a_version_5_server_gives_positions_and_takes_them() -> None:
    seen: Seen = []
    with FakeServer(server((1, 2, 3, 4, 5), seen)) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            assert c.version == 5
            assert c.insert_with_position(7, np.ones(DIM)) == 1007
            c.insert(8, np.ones(DIM))
            assert c.delete_with_position(9) == aker.Deleted(existed=True, position=2009)
            assert c.delete(10) is False
            assert c.search(np.ones(DIM), 1, at_position=0x16_B374_D848).ids.tolist() == [1]
            b = c.search_batch(np.ones((3, DIM)), 1, at_position=5)
            assert b.ids[:, 0].tolist() == [1, 1, 1]
            with c.pipeline() as p:
                p.insert_with_position(11, np.ones(DIM))
                p.delete_with_position(13)
                p.insert(12, np.ones(DIM))
                p.search(np.ones(DIM), 1, at_position=3)
            assert p.results[:3] == [1011, aker.Deleted(True, 2013), None]

            async def body() -> None:
                a = await aker.AsyncClient.connect("127.0.0.1", fake.port)
                try:
                    assert await a.insert_with_position(21, np.ones(DIM)) == 1021
                    assert await a.delete_with_position(21) == aker.Deleted(True, 2021)
                    r = await a.search(np.ones(DIM), 1, at_position=99)
                    assert r.ids.tolist() == [1]
                finally:
                    await a.close()

            run(body())
    searches = [(v, flags, body) for v, op, flags, body in seen if op == 3]
    assert [(v, flags) for v, flags, _ in searches] == [(5, 4), (5, 4), (5, 4)]
    assert [struct.unpack_from("<Q", b, len(b) - 8)[0] for _, _, b in searches] == [0x16_B374_D848, 3, 99]
    (batch,) = [(v, flags, body) for v, op, flags, body in seen if op == 0x0A]
    assert batch[:2] == (5, 4) and len(batch[2]) == 20 + 4 * DIM * 3 + 8 and batch[2][-8:] == struct.pack("<Q", 5)


def test_a_version_4_server_reports_no_positions_and_gets_no_at_position() -> None:
    seen: Seen = []
    with FakeServer(server((1, 2, 3, 4), seen)) as fake:
        with aker.Client("127.0.0.1", fake.port) as c:
            assert c.version == 4 and c.info.version_max == 4
            assert c.insert_with_position(7, np.ones(DIM)) == 0
            assert c.delete_with_position(9) == aker.Deleted(existed=True, position=0)
            with pytest.raises(aker.InvalidRequest) as e:
                c.search(np.ones(DIM), 1, at_position=1)
            assert e.value.local
            with pytest.raises(aker.InvalidRequest):
                c.search_batch(np.ones((2, DIM)), 1, at_position=1)
            assert c.search(np.ones(DIM), 1).ids.tolist() == [1]
    assert all(v == 4 and flags == 0 for v, _, flags, _ in seen), seen
