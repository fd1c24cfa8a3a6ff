"""A scripted stand-in for akerd (what a real one never does: stay silent, answer late,
speak only old versions, prove a wrong secret, answer out of order, fail chosen rows of
a SEARCH_BATCH), and a cluster of them (:class:`FakeCluster`, protocol version 6)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from aker._protocol import HEADER, MAGIC

Request = tuple[int, int, int, int, bytes]  # version, opcode, flags, request id, body


def hello_body(version: int, *, dim: int = 4, k_max: int = 16, max_inflight: int = 4, delta: int = 2,
               challenge: bytes | None = None, vmin: int = 1, vmax: int | None = None,
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


BatchQuery = tuple[int, int, int, int, np.ndarray]  # collection, k, deadline_us, n, (count, n) queries


def parse_batch(body: bytes) -> BatchQuery:
    """A SEARCH_BATCH request body, checked against its layout."""
    collection, k, deadline_us, n, count = struct.unpack_from("<5I", body, 0)
    assert len(body) == 20 + 4 * n * count, (len(body), n, count)
    queries = np.frombuffer(body, dtype="<f4", offset=20).reshape(count, n)
    return collection, k, deadline_us, n, queries


def batch_item(ids: Sequence[int] = (), dists: Sequence[float] = (), *, hit: int = 0, status: int = 0,
               token: int | None = None) -> bytes:
    """One SEARCH_BATCH reply item (a failed one: ``status`` and nothing else)."""
    if status:
        return struct.pack("<HBBI", status, 0, 0, 0)
    flags = 0x01 | (0x02 if token is not None else 0)
    b = struct.pack("<HBBI", 0, hit, flags, len(ids))
    for i, d in zip(ids, dists, strict=True):
        b += struct.pack("<Qf", i, d)
    return b + (struct.pack("<Q", token) if token is not None else b"")


def batch_body(items: Sequence[bytes], routing: int | None = None) -> bytes:
    """A SEARCH_BATCH reply body; ``routing``: (v6) the routing version after the count."""
    head = struct.pack("<I", len(items)) + (struct.pack("<Q", routing) if routing is not None else b"")
    return head + b"".join(items)


def search_body(ids: list[int], dists: list[float], hit: int = 0, routing: int | None = None,
                token: int | None = None) -> bytes:
    """A SEARCH reply body; ``routing``: (v6) the routing version ending it."""
    b = struct.pack("<BBHI", hit, 1 | (2 if token is not None else 0), 0, len(ids))
    for i, d in zip(ids, dists, strict=True):
        b += struct.pack("<Qf", i, d)
    if token is not None:
        b += struct.pack("<Q", token)
    return b + (struct.pack("<Q", routing) if routing is not None else b"")


Node = tuple[int, bool, str]  # node_id, live, advertise


def cluster_body(*, routing_version: int = 1, centroids_version: int = 1, balance_epoch: int = 0,
                 self_id: int = 1, lease_ms: int = 3000, metric: int = 0, dim: int = 2,
                 centroids: Sequence[Sequence[float]] = ((0.0, 0.0),), nodes: Sequence[Node] = (),
                 overrides: Sequence[tuple[int, int]] = (), name: str = "fake") -> bytes:
    """A CLUSTER reply body (v6), written from PROTOCOL.md's table (not by the client's code)."""
    flat = [float(x) for row in centroids for x in row]
    b = struct.pack("<QQQQIB3xII", routing_version, centroids_version, balance_epoch, self_id, lease_ms, metric,
                    dim, len(flat) // dim if dim else 0)
    b += struct.pack(f"<{len(flat)}f", *flat)
    b += struct.pack("<I", len(nodes))
    for node_id, live, advertise in nodes:
        a = advertise.encode()
        b += struct.pack("<QBBH", node_id, int(live), 0, len(a)) + a
    b += struct.pack("<I", len(overrides))
    for c, node_id in overrides:
        b += struct.pack("<IQ", c, node_id)
    n = name.encode()
    return b + struct.pack("<H", len(n)) + n


class FakeConn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(10.0)
        self.buf = b""

    def recv(self) -> Request | None:
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
        self.errors: list[BaseException] = []
        #: Connections accepted so far.
        self.accepted = 0
        #: Connections whose handler has returned (the client closed it, or the server).
        self.ended = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                s, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(s)
            self.accepted += 1
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
            self.ended += 1

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

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeCluster:
    """``n`` fake akerd nodes of one cluster on 127.0.0.1 (protocol versions 1 to 6).

    Every node answers HELLO, CLUSTER (the shared state: :attr:`live`, :attr:`overrides`,
    :attr:`routing_version`, this node as ``self_id``), SEARCH and SEARCH_BATCH (one
    neighbour per query: the answering node's id, so a test sees who answered; the
    replies carry the node's routing version), INSERT and DELETE (positions counting up
    from 1000). :attr:`seen` records each node's requests but HELLO and CLUSTER; a node
    in :attr:`silent` never answers them (a client's timeout), one in :attr:`drop` closes
    the connection on them without an answer (after recording them: they may have been
    executed), one in :attr:`refuse` answers them with a connection-level SHUTTING_DOWN
    and closes (before recording them: not taken). A node in :attr:`removed` is left out
    of the state. :attr:`cluster_served` counts each node's CLUSTER replies."""

    def __init__(self, n: int = 3, *, dim: int = 2, centroids: Sequence[Sequence[float]] | None = None,
                 metric: int = 0, lease_ms: int = 3000, name: str = "fake-cluster",
                 node_ids: Sequence[int] | None = None) -> None:
        self.dim = dim
        self.metric = metric
        self.lease_ms = lease_ms
        self.name = name
        if centroids is None:  # 8 centroids on a circle of radius 10 (dimension 2)
            angles = np.arange(8) * (2 * np.pi / 8)
            centroids = [[10 * float(np.cos(a)), 10 * float(np.sin(a))] + [0.0] * (dim - 2) for a in angles]
        self.centroids = [list(map(float, c)) for c in centroids]
        self.ids: list[int] = list(node_ids) if node_ids is not None else [0x1000 + 0x111 * i for i in range(n)]
        self.lock = threading.Lock()
        self.routing_version = 0x5EED_0001
        #: A node's own routing version in its replies, when it differs from the state's.
        self.node_routing: dict[int, int] = {}
        self.live: dict[int, bool] = {i: True for i in self.ids}
        self.overrides: list[tuple[int, int]] = []
        self.silent: set[int] = set()
        self.drop: set[int] = set()
        self.refuse: set[int] = set()
        self.removed: set[int] = set()
        #: When set, a node holds each SEARCH / SEARCH_BATCH reply until as many nodes
        #: hold one as the barrier has parties: a client that sends to one node after
        #: another never gets past the first (that reply is not sent; ``held_broken``
        #: counts them).
        self.hold: threading.Barrier | None = None
        #: Node -> seconds it waits before each answer but HELLO's (CLUSTER's included).
        self.delay: dict[int, float] = {}
        #: Node -> seconds it waits before answering HELLO (a connect under way).
        self.hello_delay: dict[int, float] = {}
        self.held_broken = 0
        self.cluster_served: dict[int, int] = {i: 0 for i in self.ids}
        self.position = 1000
        self.cluster_requests = 0
        self.seen: dict[int, list[tuple[int, int, int, bytes]]] = {i: [] for i in self.ids}
        self.servers: dict[int, FakeServer] = {}
        for node_id in self.ids:
            self.servers[node_id] = FakeServer(self._handler(node_id))

    @property
    def seeds(self) -> list[str]:
        return [f"127.0.0.1:{self.servers[i].port}" for i in self.ids]

    def body(self, self_id: int) -> bytes:
        with self.lock:
            nodes = [(i, self.live[i], f"127.0.0.1:{self.servers[i].port}") for i in self.ids
                     if i not in self.removed]
            return cluster_body(routing_version=self.routing_version, self_id=self_id, lease_ms=self.lease_ms,
                                metric=self.metric, dim=self.dim, centroids=self.centroids, nodes=nodes,
                                overrides=self.overrides, name=self.name, balance_epoch=len(self.overrides))

    def change(self, *, live: dict[int, bool] | None = None,
               overrides: list[tuple[int, int]] | None = None, removed: set[int] | None = None) -> int:
        """A new routing state (every node's replies carry its version at once)."""
        with self.lock:
            if live is not None:
                self.live.update(live)
            if overrides is not None:
                self.overrides = list(overrides)
            if removed is not None:
                self.removed = set(removed)
            self.routing_version += 1
            return self.routing_version

    def kill(self, node_id: int) -> None:
        """Closes the node's port and its connections (the state still says it is live)."""
        self.servers[node_id].close()

    def _handler(self, node_id: int) -> Callable[[FakeConn], None]:
        def handle(c: FakeConn) -> None:
            while True:
                req = c.recv()
                if req is None:
                    return
                version, op, flags, rid, body = req
                wait = self.hello_delay.get(node_id, 0.0) if op == 1 else self.delay.get(node_id, 0.0)
                if wait:
                    time.sleep(wait)
                if not 1 <= version <= 6:
                    c.send(6, op, rid, b"version not spoken", status=5)
                    continue
                if op == 1:
                    c.send(version, op, rid, hello_body(version, dim=self.dim, vmax=6, max_inflight=8, max_batch=8))
                    continue
                if op == 2:
                    c.send(version, op, rid, body)
                    continue
                if op == 0x0B:
                    with self.lock:
                        self.cluster_requests += 1
                        self.cluster_served[node_id] += 1
                    c.send(version, op, rid, self.body(node_id))
                    continue
                if node_id in self.refuse:  # connection-level, request id 0; then closes
                    c.send(version, 0, 0, b"shutting down", status=15)
                    c.sock.shutdown(socket.SHUT_WR)
                    return
                with self.lock:
                    self.seen[node_id].append((version, op, flags, body))
                    routing = self.node_routing.get(node_id, self.routing_version) if version >= 6 else None
                    self.position += 1
                    position = struct.pack("<Q", self.position) if version >= 5 else b""
                    if node_id in self.silent:
                        continue
                    if node_id in self.drop:
                        return
                hold = self.hold
                if hold is not None and op in (3, 0x0A):
                    try:
                        hold.wait(5.0)
                    except threading.BrokenBarrierError:
                        with self.lock:
                            self.held_broken += 1
                        continue
                if op == 3:
                    c.send(version, op, rid, search_body([node_id], [0.5], hit=1, routing=routing))
                elif op == 0x0A:
                    count = struct.unpack_from("<I", body, 16)[0]
                    c.send(version, op, rid, batch_body([batch_item([node_id], [0.5], hit=1)] * count, routing))
                elif op == 4:
                    c.send(version, op, rid, position)
                elif op == 5:
                    c.send(version, op, rid, b"\x01" + position)
                else:
                    c.send(version, op, rid, b"not here", status=13)

        return handle

    def close(self) -> None:
        for s in self.servers.values():
            s.close()

    def __enter__(self) -> FakeCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
