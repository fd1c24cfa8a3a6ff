"""A scripted stand-in for akerd (what a real one never does: stay silent, answer late,
speak only old versions, prove a wrong secret, answer out of order, fail chosen rows of
a SEARCH_BATCH)."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from aker._protocol import HEADER, MAGIC

Request = Tuple[int, int, int, int, bytes]  # version, opcode, flags, request id, body


def hello_body(version: int, *, dim: int = 4, k_max: int = 16, max_inflight: int = 4, delta: int = 2,
               challenge: Optional[bytes] = None, vmin: int = 1, vmax: Optional[int] = None,
               max_frame: int = 1 << 16, max_batch: int = 4) -> bytes:
    """HELLO's reply body in ``version`` (``vmax``: by default that version)."""
    top = max(version, 3) if vmax is None else vmax
    b = struct.pack("<BBBB6I", vmin, top, 0, 0, max_frame, dim, k_max, max_inflight, 1, 1)
    if version >= 2:
        b += struct.pack("<I", delta)
    if version >= 3:
        b += b"\x01" + challenge if challenge is not None else b"\x00"
    if version >= 4:
        b += struct.pack("<I", max_batch)
    return b


BatchQuery = Tuple[int, int, int, int, np.ndarray]  # collection, k, deadline_us, n, (count, n) queries


def parse_batch(body: bytes) -> BatchQuery:
    """A SEARCH_BATCH request body, checked against its layout."""
    collection, k, deadline_us, n, count = struct.unpack_from("<5I", body, 0)
    assert len(body) == 20 + 4 * n * count, (len(body), n, count)
    queries = np.frombuffer(body, dtype="<f4", offset=20).reshape(count, n)
    return collection, k, deadline_us, n, queries


def batch_item(ids: Sequence[int] = (), dists: Sequence[float] = (), *, hit: int = 0, status: int = 0,
               token: Optional[int] = None) -> bytes:
    """One SEARCH_BATCH reply item (a failed one: ``status`` and nothing else)."""
    if status:
        return struct.pack("<HBBI", status, 0, 0, 0)
    flags = 0x01 | (0x02 if token is not None else 0)
    b = struct.pack("<HBBI", 0, hit, flags, len(ids))
    for i, d in zip(ids, dists):
        b += struct.pack("<Qf", i, d)
    return b + (struct.pack("<Q", token) if token is not None else b"")


def batch_body(items: Sequence[bytes]) -> bytes:
    return struct.pack("<I", len(items)) + b"".join(items)


def search_body(ids: List[int], dists: List[float], hit: int = 0) -> bytes:
    b = struct.pack("<BBHI", hit, 1, 0, len(ids))
    for i, d in zip(ids, dists):
        b += struct.pack("<Qf", i, d)
    return b


class FakeConn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(10.0)
        self.buf = b""

    def recv(self) -> Optional[Request]:
        """The next request frame, or None at end of stream."""
        while True:
            if len(self.buf) >= 20:
                magic, version, opcode, flags, _status, rid, n = HEADER.unpack(self.buf[:20])
                assert magic == MAGIC
                if len(self.buf) >= 20 + n:
                    body = self.buf[20 : 20 + n]
                    self.buf = self.buf[20 + n :]
                    return version, opcode, flags, rid, body
            try:
                data = self.sock.recv(65536)
            except OSError:
                return None
            if not data:
                return None
            self.buf += data

    def send(self, version: int, opcode: int, rid: int, body: bytes = b"", status: int = 0) -> None:
        self.sock.sendall(HEADER.pack(MAGIC, version, opcode | 0x80, 0, status, rid, len(body)) + body)


class FakeServer:
    """Accepts connections on 127.0.0.1 and runs ``handler`` for each in a thread."""

    def __init__(self, handler: Callable[[FakeConn], None]) -> None:
        self.handler = handler
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.errors: List[BaseException] = []
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._conns: List[socket.socket] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                s, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self._conns.append(s)
            t = threading.Thread(target=self._run, args=(s,), daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, s: socket.socket) -> None:
        try:
            self.handler(FakeConn(s))
        except (OSError, AssertionError) as e:  # a client that went away, or a test's check
            self.errors.append(e)
        finally:
            try:
                s.close()
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        for s in self._conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.listener.close()
        for t in self._threads:
            t.join(5.0)

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
