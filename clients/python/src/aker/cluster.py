"""Clusters (protocol version 6, PROTOCOL.md "Clusters"): the routing functions and
:class:`Cluster`, a client of a tier of akerd nodes in front of one table.

Every node answers every query correctly; a search sent to the node that *owns* its
query's nearest centroid finds that node's cache, so the tier caches each region once
instead of once per node. Ownership is a pure function of the routing state (CLUSTER):

1. the query's nearest centroid ``c`` (:func:`nearest_centroid`; by angle for the
   ``cosine`` and ``ip`` metrics, ties to the lower index);
2. each node's score for ``c``: ``mix64(node_id ^ mix64(c))`` (:func:`rendezvous_score`,
   splitmix64's finaliser in wrapping u64 arithmetic);
3. the owner (:func:`owner`): ``c``'s override node when it is live, else the live node
   with the highest score (ties: the larger id); on a connection error the next nodes
   of :func:`owner_order`: the other live nodes by descending score, then the others.

These compute what the Rust ``aker::cluster`` computes (the same integers; the nearest
centroid up to float rounding: akerd's SIMD kernels sum in another order, so a query
within rounding of the boundary between two centroids may go to either; routing is for
locality only, any node answers it).

::

    with aker.Cluster(["10.0.0.1:7700", "10.0.0.2:7700"], timeout=5.0) as c:
        c.insert(7, v)              # any node; its position is carried into later searches
        r = c.search(v, k=10)       # the owner of v's centroid; sees the insert
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from ._codec import (
    Payload,
    VectorLike,
    _local,
    _uint,
    as_matrix,
    as_vector,
    check_errors,
)
from ._protocol import BatchResult, ClusterState, Deleted, HitKind, Metric, SearchResult
from .client import DEFAULT, Client
from .errors import (
    AkerConnectionError,
    AkerError,
    BadK,
    ConnectionClosed,
    InvalidRequest,
    ProtocolError,
    StatusError,
    Timeout,
    error_for_status,
)

__all__ = [
    "Cluster",
    "ClusterCounters",
    "ATTEMPTS_MAX",
    "REFRESH_MIN_S",
    "ROUTINGS",
    "mix64",
    "rendezvous_score",
    "nearest_centroid",
    "nearest_centroids",
    "owner_order",
    "owner",
]

U64_MASK = 0xFFFF_FFFF_FFFF_FFFF
#: The most nodes one request is tried on.
ATTEMPTS_MAX = 3
#: The routing state is fetched again at most this often (seconds) because of replies
#: carrying another routing version (nodes can disagree for a renewal period).
REFRESH_MIN_S = 0.1
#: ``"centroid"``: each search to its centroid's owner (the point of a cluster);
#: ``"random"``: to a live node chosen at random (a baseline: every node caches everything).
ROUTINGS = ("centroid", "random")

Address = Tuple[str, int]
SeedLike = Union[str, Tuple[str, int]]
T = TypeVar("T")

# ---------------------------------------------------------------------------- routing


def mix64(z: int) -> int:
    """splitmix64's finaliser (wrapping u64 arithmetic): a bijection of ``0..2**64``."""
    z &= U64_MASK
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & U64_MASK
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & U64_MASK
    return z ^ (z >> 31)


def rendezvous_score(node_id: int, centroid: int) -> int:
    """Node ``node_id``'s score for ``centroid``: the highest live score owns it."""
    return mix64((node_id & U64_MASK) ^ mix64(centroid & 0xFFFF_FFFF))


def _distances(centroids: np.ndarray, queries: np.ndarray, metric: Metric) -> np.ndarray:
    """``(m, n)`` float32 distances from each query to each centroid by the routing metric
    (PROTOCOL.md: squared L2 for ``l2sq``, ``1 - cos`` for ``cosine`` and ``ip``), summed
    in float64 as akerd's scalar reference does; NaN counted as ``+inf`` (never nearest)."""
    c = centroids.astype(np.float64)
    q = queries.astype(np.float64)
    m, n = q.shape[0], c.shape[0]
    out = np.empty((m, n), dtype=np.float32)
    if n == 0 or m == 0:
        return out
    with np.errstate(all="ignore"):  # a float64 sum past f32's range is +inf, as in akerd
        if metric == Metric.L2SQ:
            step = max(1, (1 << 22) // max(1, n * c.shape[1]))  # bounded memory per chunk
            for i in range(0, m, step):
                diff = q[i : i + step, None, :] - c[None, :, :]
                out[i : i + step] = np.einsum("ijk,ijk->ij", diff, diff)
        else:
            ab = q @ c.T
            aa = np.einsum("ij,ij->i", q, q)[:, None]
            bb = np.einsum("ij,ij->i", c, c)[None, :]
            d = 1.0 - ab / (np.sqrt(aa) * np.sqrt(bb))
            d = np.where((aa == 0.0) | (bb == 0.0), 1.0, d)
            d = np.where((aa == 0.0) & (bb == 0.0), 0.0, d)
            out[:] = d
    out[np.isnan(out)] = np.inf
    return out


def nearest_centroids(state: ClusterState, matrix: VectorLike) -> np.ndarray:
    """Each row's nearest centroid (int64, shape ``(m,)``), as :func:`nearest_centroid`."""
    mat = as_matrix(matrix, state.dim)
    if state.n_centroids == 0:
        return np.zeros(mat.shape[0], dtype=np.int64)
    # argmin: the first of equal minima (ties to the lower index); all +inf: 0.
    out: np.ndarray = np.argmin(_distances(state.centroids, mat, state.metric), axis=1).astype(np.int64)
    return out


def nearest_centroid(state: ClusterState, vector: VectorLike) -> int:
    """The index of the centroid nearest to ``vector`` by the cluster's routing metric
    (squared L2 for ``l2sq``; by angle, ``1 - cos``, for ``cosine`` and ``ip``); ties to
    the lower index; 0 when there is none."""
    q = as_vector(vector, state.dim)
    return int(nearest_centroids(state, q[None, :])[0])


def owner_order(state: ClusterState, centroid: int) -> List[int]:
    """The nodes to send a query of ``centroid`` to, in order: its override's node when
    live, then the live nodes by descending rendezvous score (ties: the larger id), then
    the nodes not live by the same order (a lease can lapse while a node still answers)."""

    def key(node_id: int) -> Tuple[int, int]:
        return rendezvous_score(node_id, centroid), node_id

    live = sorted((n.node_id for n in state.nodes if n.live), key=key, reverse=True)
    order: List[int] = []
    for c, node in state.overrides:
        if c == centroid:
            if node in live:
                order.append(node)
            break
    for node in live:
        if node not in order:
            order.append(node)
    order.extend(sorted((n.node_id for n in state.nodes if not n.live), key=key, reverse=True))
    return order


def owner(state: ClusterState, centroid: int) -> Optional[int]:
    """The owner of ``centroid`` (``None``: the state has no node at all)."""
    order = owner_order(state, centroid)
    return order[0] if order else None


# ---------------------------------------------------------------------------- the client


@dataclass
class ClusterCounters:
    """What a :class:`Cluster` sent, retried and fetched again."""

    #: Requests sent, per node id (a retried request counts on each node tried).
    requests: Dict[int, int] = field(default_factory=dict)
    #: Requests sent again to another node after a connection error.
    retries: int = 0
    #: CLUSTER fetches after the first.
    refreshes: int = 0


def _seed(seed: SeedLike) -> Address:
    if isinstance(seed, tuple) and len(seed) == 2:
        return str(seed[0]), _uint(seed[1], 16, "port")
    if isinstance(seed, str):
        addr = parse_address(seed)
        if addr is not None:
            return addr
    raise _local(InvalidRequest, "a seed must be 'host:port' or (host, port), not %r" % (seed,))


def parse_address(text: str) -> Optional[Address]:
    """``"host:port"`` (or ``"[v6 address]:port"``) as ``(host, port)``; ``None`` when it
    is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 0xFFFF:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def is_connection_error(e: AkerError) -> bool:
    """Whether a request that failed so may be sent to another node: the connection
    failed, timed out, or the server closed it (a connection-level reply, request id 0:
    SHUTTING_DOWN, BUSY at connect)."""
    if isinstance(e, (AkerConnectionError, Timeout)):
        return True
    return isinstance(e, StatusError) and e.request_id == 0 and not e.local


class Cluster:
    """A client of a cluster of akerd nodes (protocol version 6, ``docs/CLUSTER.md``).

    Args:
        seeds: node addresses (``"host:port"`` or ``(host, port)``); the routing state
            (CLUSTER) comes from the first that answers it, later from any live node.
        routing: ``"centroid"`` (each search to its centroid's owner) or ``"random"``
            (to a live node at random: a baseline).
        client_options: :class:`aker.Client`'s keyword arguments, for every node
            (``timeout``, ``connect_timeout``, ``secret``, ``ssl``, ``server_hostname``, ...).

    Searches go to the owner of the query's nearest centroid, a batch is split by owner
    (one ``search_batch`` per node, rows back in order); writes go to any node and their
    positions are carried into this handle's later searches as ``at_position``
    (read-your-writes across nodes). On a connection error (refused, lost, timed out,
    closed by the server) a request is sent at once to the next node of
    :func:`owner_order`, on at most :data:`ATTEMPTS_MAX` nodes; the failed node is
    avoided for one lease (``state.lease_ms``) and the state fetched again. A reply whose
    ``routing_version`` differs from the state's makes the handle fetch the state again
    (at most every :data:`REFRESH_MIN_S` seconds). One connection per node, opened when
    first needed. Calls are serialized (a lock), as :class:`aker.Client`'s.
    """

    def __init__(
        self, seeds: Union[SeedLike, Sequence[SeedLike]], *, routing: str = "centroid", **client_options: Any
    ) -> None:
        # One seed: "host:port" or (host, port); else a sequence of them.
        one = isinstance(seeds, str) or (
            isinstance(seeds, tuple) and len(seeds) == 2 and isinstance(seeds[0], str) and isinstance(seeds[1], int)
        )
        seq: Sequence[Any] = [seeds] if one else seeds
        self._seeds: List[Address] = [_seed(s) for s in seq]
        if not self._seeds:
            raise _local(InvalidRequest, "no seed address given")
        self._routing = self._check_routing(routing)
        self._options = client_options
        self._lock = threading.RLock()
        self._conns: Dict[int, Client] = {}
        #: Node -> the monotonic time until which it is avoided (it failed a connection).
        self._suspect: Dict[int, float] = {}
        self._position = 0
        self._rng = random.Random()
        self._closed = False
        self.counters = ClusterCounters()
        #: Seconds between fetches caused by replies (:data:`REFRESH_MIN_S`).
        self.refresh_min = REFRESH_MIN_S
        state, client = self._fetch([(None, a) for a in self._seeds])
        self._state = state
        self._adopt(state.self_id, client)
        self._last_fetch = time.monotonic()

    # ------------------------------------------------------------------ state

    @staticmethod
    def _check_routing(routing: str) -> str:
        if routing not in ROUTINGS:
            raise _local(InvalidRequest, 'routing must be "centroid" or "random", not %r' % (routing,))
        return routing

    @property
    def state(self) -> ClusterState:
        """The routing state as last fetched."""
        return self._state

    @property
    def routing(self) -> str:
        return self._routing

    @routing.setter
    def routing(self, routing: str) -> None:
        self._routing = self._check_routing(routing)

    @property
    def position(self) -> int:
        """The newest write position this handle has seen (0: none); later searches
        carry it as ``at_position`` unless given one."""
        return self._position

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connections(self) -> Dict[int, Client]:
        """The open connections, per node id (a copy)."""
        return {n: c for n, c in self._conns.items() if not c.closed}

    def _check(self) -> None:
        if self._closed:
            raise ConnectionClosed("the cluster handle is closed")

    def _is_suspect(self, node: int, now: float) -> bool:
        return self._suspect.get(node, 0.0) > now

    def _adopt(self, node: int, client: Client) -> None:
        old = self._conns.get(node)
        if old is not None and old is not client:
            old.close()
        self._conns[node] = client

    def _drop(self, node: int) -> None:
        c = self._conns.pop(node, None)
        if c is not None:
            c.close()

    def _fetch(self, candidates: List[Tuple[Optional[int], Address]]) -> Tuple[ClusterState, Client]:
        """CLUSTER from the first candidate that answers it (a node's open connection
        when there is one, else a new one): the state and the connection it came on."""
        last: AkerError = AkerConnectionError("no address to fetch the cluster state from")
        for node, addr in candidates:
            c = self._conns.get(node) if node is not None else None
            fresh = c is None or c.closed
            if c is None or c.closed:
                try:
                    c = Client(addr[0], addr[1], **self._options)
                except AkerError as e:
                    last = e
                    continue
            try:
                return c.cluster(), c
            except AkerError as e:
                last = e
                if fresh:
                    c.close()
                elif node is not None and is_connection_error(e):
                    self._drop(node)
        raise last

    def refresh(self) -> ClusterState:
        """Fetches the routing state again, from a live node (not one that just failed)
        or else a seed; returns it (also :attr:`state`)."""
        with self._lock:
            self._check()
            now = time.monotonic()
            candidates: List[Tuple[Optional[int], Address]] = []
            for n in self._state.nodes:
                addr = parse_address(n.advertise)
                if n.live and addr is not None and not self._is_suspect(n.node_id, now):
                    candidates.append((n.node_id, addr))
            candidates.extend((None, a) for a in self._seeds)
            state, client = self._fetch(candidates)
            self._state = state
            self._adopt(state.self_id, client)
            self._last_fetch = time.monotonic()
            self.counters.refreshes += 1
            return state

    def _note_routing(self, versions: Sequence[int]) -> None:
        """Replies carried these routing versions: one other than the state's (not 0)
        fetches the state again, at most every :attr:`refresh_min` seconds."""
        v = self._state.routing_version
        if any(r != 0 and r != v for r in versions) and time.monotonic() - self._last_fetch >= self.refresh_min:
            try:
                self.refresh()
            except AkerError:
                pass  # the next reply tries again; routing goes on with the state held

    # ------------------------------------------------------------------ routing

    def _order(self, centroid: int, now: float) -> List[int]:
        order = owner_order(self._state, centroid)
        if self._routing == "random":
            n = min(max(1, len(self._state.live_nodes)), len(order))
            if n:
                by = self._rng.randrange(n)
                order[:n] = order[by:n] + order[:by]
        return [x for x in order if not self._is_suspect(x, now)] + [x for x in order if self._is_suspect(x, now)]

    def nodes_for(self, vector: VectorLike) -> List[int]:
        """The nodes a search of ``vector`` is tried on, in order: its centroid's
        :func:`owner_order` (``routing="random"``: a random live node first), the nodes
        that failed recently last."""
        with self._lock:
            return self._order(nearest_centroid(self._state, vector), time.monotonic())

    def owner_of(self, vector: VectorLike) -> Optional[int]:
        """The owner of ``vector``'s nearest centroid by the state held (``None``: no node)."""
        with self._lock:
            return owner(self._state, nearest_centroid(self._state, vector))

    def _conn(self, node: int) -> Client:
        c = self._conns.get(node)
        if c is not None and not c.closed:
            return c
        n = self._state.node(node)
        if n is None:
            raise ProtocolError("node %016x is not in the cluster state" % node)
        addr = parse_address(n.advertise)
        if addr is None:
            raise ProtocolError("node %016x's address %r is not host:port" % (node, n.advertise))
        c = Client(addr[0], addr[1], **self._options)
        self._adopt(node, c)
        return c

    def _on_nodes(self, order: Sequence[int], f: Callable[[Client], T]) -> T:
        """``f`` on the nodes of ``order`` until one answers (at most :data:`ATTEMPTS_MAX`);
        a node whose connection fails is dropped, avoided for a lease, and the state
        fetched again. Any other error is raised at once."""
        last: AkerError = AkerConnectionError("the cluster has no node to send to")
        for i, node in enumerate(order[:ATTEMPTS_MAX]):
            if i:
                self.counters.retries += 1
            self.counters.requests[node] = self.counters.requests.get(node, 0) + 1
            try:
                return f(self._conn(node))
            except AkerError as e:
                if not is_connection_error(e):
                    raise
                last = e
                self._drop(node)
                self._suspect[node] = time.monotonic() + self._state.lease_ms / 1000.0
                try:
                    self.refresh()
                except AkerError:
                    pass
        raise last

    def _at(self, at_position: Optional[int]) -> Optional[int]:
        if at_position is None and self._position:
            return self._position
        return at_position

    # ------------------------------------------------------------------ requests

    def search(
        self,
        vector: VectorLike,
        k: int = 10,
        *,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: Optional[float] = None,
        collection: int = 0,
        at_position: Optional[int] = None,
        timeout: Any = DEFAULT,
    ) -> SearchResult:
        """As :meth:`aker.Client.search`, on the owner of ``vector``'s nearest centroid;
        ``at_position`` defaults to the newest write position this handle has seen."""
        with self._lock:
            self._check()
            q = as_vector(vector, self._state.dim)
            at = self._at(at_position)
            order = self._order(nearest_centroid(self._state, q), time.monotonic())
            r = self._on_nodes(
                order,
                lambda c: c.search(
                    q,
                    k,
                    bypass_cache=bypass_cache,
                    refresh_entry=refresh_entry,
                    deadline=deadline,
                    collection=collection,
                    at_position=at,
                    timeout=timeout,
                ),
            )
            self._note_routing([r.routing_version])
            return r

    def search_batch(
        self,
        matrix: VectorLike,
        k: int = 10,
        *,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: Optional[float] = None,
        collection: int = 0,
        at_position: Optional[int] = None,
        errors: str = "raise",
        timeout: Any = DEFAULT,
    ) -> BatchResult:
        """As :meth:`aker.Client.search_batch`: the rows split by the owner of their
        nearest centroid, one ``search_batch`` per node (one after the other), the rows
        back in the matrix's order; ``routing_version`` the largest of the nodes'.

        ``errors="raise"``: after every node answered, the first failed row in row order
        raises its status's exception with ``.row`` (an error reply to a node's whole
        request fails each row it carried); ``errors="return"``: as the Client's."""
        with self._lock:
            self._check()
            check_errors(errors)
            mat = as_matrix(matrix, self._state.dim)
            kk = _uint(k, 32, "k")
            if kk < 1:
                raise _local(BadK, "k = 0 (at least 1)")
            at = self._at(at_position)
            now = time.monotonic()
            orders: Dict[int, List[int]] = {}
            groups: Dict[Optional[int], Tuple[List[int], List[int]]] = {}
            for i, c in enumerate(nearest_centroids(self._state, mat).tolist()):
                if self._routing == "random":
                    order = self._order(c, now)
                else:
                    if c not in orders:
                        orders[c] = self._order(c, now)
                    order = orders[c]
                groups.setdefault(order[0] if order else None, (order, []))[1].append(i)
            n = mat.shape[0]
            ids = np.full((n, kk), np.uint64(U64_MASK), dtype=np.uint64)
            distances = np.full((n, kk), np.inf, dtype=np.float32)
            counts = np.zeros(n, dtype=np.int64)
            kinds = [HitKind.MISS] * n
            tokens: List[Optional[int]] = [None] * n
            dtq = [False] * n
            statuses = np.zeros(n, dtype=np.uint16)
            versions: List[int] = []
            for order, rows in groups.values():
                sub = mat[rows]
                b = self._on_nodes(
                    order,
                    lambda c: c.search_batch(
                        sub,
                        kk,
                        bypass_cache=bypass_cache,
                        refresh_entry=refresh_entry,
                        deadline=deadline,
                        collection=collection,
                        at_position=at,
                        errors="return",
                        timeout=timeout,
                    ),
                )
                idx = np.asarray(rows, dtype=np.int64)
                ids[idx] = b.ids
                distances[idx] = b.distances
                counts[idx] = b.counts
                statuses[idx] = b.statuses
                for j, row in enumerate(rows):
                    kinds[row] = b.kinds[j]
                    tokens[row] = b.tokens[j] if b.tokens else None
                    dtq[row] = b.distances_to_query[j] if b.distances_to_query else True
                versions.append(b.routing_version)
            self._note_routing(versions)
            if errors == "raise":
                bad = np.flatnonzero(statuses)
                if bad.shape[0]:
                    row = int(bad[0])
                    err = error_for_status(int(statuses[row]), "search_batch row %d" % row)
                    err.row = row
                    raise err
            return BatchResult(
                ids=ids,
                distances=distances,
                kinds=kinds,
                counts=counts,
                tokens=tokens,
                distances_to_query=dtq,
                statuses=statuses,
                routing_version=max(versions, default=0),
            )

    def insert_with_position(
        self, id: int, vector: VectorLike, payload: Payload = None, *, collection: int = 0, timeout: Any = DEFAULT
    ) -> int:
        """As :meth:`aker.Client.insert_with_position`, on the owner of ``vector``'s
        centroid (any node would do); the position is carried into later searches."""
        with self._lock:
            self._check()
            q = as_vector(vector, self._state.dim)
            order = self._order(nearest_centroid(self._state, q), time.monotonic())
            p: int = self._on_nodes(
                order, lambda c: c.insert_with_position(id, q, payload, collection=collection, timeout=timeout)
            )
            self._position = max(self._position, p)
            return p

    def insert(
        self, id: int, vector: VectorLike, payload: Payload = None, *, collection: int = 0, timeout: Any = DEFAULT
    ) -> None:
        """As :meth:`aker.Client.insert` (its position carried: :meth:`insert_with_position`)."""
        self.insert_with_position(id, vector, payload, collection=collection, timeout=timeout)

    def delete_with_position(self, id: int, *, collection: int = 0, timeout: Any = DEFAULT) -> Deleted:
        """As :meth:`aker.Client.delete_with_position`, on a live node chosen by the id;
        the position is carried into later searches."""
        with self._lock:
            self._check()
            key = _uint(id, 64, "id")
            now = time.monotonic()
            order = sorted((n.node_id for n in self._state.nodes if n.live), key=lambda n: mix64(n ^ key))
            order.sort(key=lambda n: self._is_suspect(n, now))
            d: Deleted = self._on_nodes(
                order, lambda c: c.delete_with_position(id, collection=collection, timeout=timeout)
            )
            self._position = max(self._position, d.position)
            return d

    def delete(self, id: int, *, collection: int = 0, timeout: Any = DEFAULT) -> bool:
        """As :meth:`aker.Client.delete`; whether the id was present."""
        return self.delete_with_position(id, collection=collection, timeout=timeout).existed

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Closes every connection (idempotent)."""
        with self._lock:
            self._closed = True
            conns, self._conns = self._conns, {}
        for c in conns.values():
            c.close()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self._state
        return "<aker.Cluster %r routing_version=%#x nodes=%d live=%d%s>" % (
            s.name,
            s.routing_version,
            len(s.nodes),
            len(s.live_nodes),
            " closed" if self._closed else "",
        )
