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

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import numpy as np
import numpy.typing as npt

from ._codec import (
    Payload,
    VectorLike,
    _local,
    _uint,
    as_matrix,
    as_vector,
    check_errors,
)
from ._protocol import BatchResult, ClusterNode, ClusterState, Deleted, HitKind, Metric, SearchResult, Status
from .aio import AsyncClient
from .client import DEFAULT, Client, ClientOptions, TimeoutArg
from .errors import (
    AkerConnectionError,
    AkerError,
    BadK,
    ConnectionClosed,
    InvalidRequest,
    ProtocolError,
    StatusError,
    Timeout,
    WriteInDoubt,
    error_for_status,
)

if TYPE_CHECKING:
    # **kwargs typed by a TypedDict (PEP 692); for type checkers only (never imported).
    from typing_extensions import Unpack

__all__ = [
    "Cluster",
    "AsyncCluster",
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

Address: TypeAlias = tuple[str, int]
#: A seed: ``"host:port"`` or ``(host, port)``.
SeedLike: TypeAlias = str | tuple[str, int]
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


def _distances(
    centroids: npt.NDArray[np.float32], queries: npt.NDArray[np.float32], metric: Metric
) -> npt.NDArray[np.float32]:
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


def nearest_centroids(state: ClusterState, matrix: VectorLike) -> npt.NDArray[np.int64]:
    """Each row's nearest centroid (int64, shape ``(m,)``), as :func:`nearest_centroid`."""
    mat = as_matrix(matrix, state.dim)
    if state.n_centroids == 0:
        return np.zeros(mat.shape[0], dtype=np.int64)
    # argmin: the first of equal minima (ties to the lower index); all +inf: 0.
    out: npt.NDArray[np.int64] = np.argmin(_distances(state.centroids, mat, state.metric), axis=1).astype(np.int64)
    return out


def nearest_centroid(state: ClusterState, vector: VectorLike) -> int:
    """The index of the centroid nearest to ``vector`` by the cluster's routing metric
    (squared L2 for ``l2sq``; by angle, ``1 - cos``, for ``cosine`` and ``ip``); ties to
    the lower index; 0 when there is none."""
    q = as_vector(vector, state.dim)
    return int(nearest_centroids(state, q[None, :])[0])


def owner_order(state: ClusterState, centroid: int) -> list[int]:
    """The nodes to send a query of ``centroid`` to, in order: its override's node when
    live, then the live nodes by descending rendezvous score (ties: the larger id), then
    the nodes not live by the same order (a lease can lapse while a node still answers)."""

    def key(node_id: int) -> tuple[int, int]:
        return rendezvous_score(node_id, centroid), node_id

    live = sorted((n.node_id for n in state.nodes if n.live), key=key, reverse=True)
    order: list[int] = []
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


def owner(state: ClusterState, centroid: int) -> int | None:
    """The owner of ``centroid`` (``None``: the state has no node at all)."""
    order = owner_order(state, centroid)
    return order[0] if order else None


# ---------------------------------------------------------------------------- the client


@dataclass
class ClusterCounters:
    """What a cluster handle sent, retried and fetched again."""

    #: Requests sent, per node id (a retried request counts on each node tried).
    requests: dict[int, int] = field(default_factory=dict)
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
    raise _local(InvalidRequest, f"a seed must be 'host:port' or (host, port), not {seed!r}")


def _seeds(seeds: SeedLike | Sequence[SeedLike]) -> list[Address]:
    # One seed: "host:port" or (host, port); else a sequence of them.
    one = isinstance(seeds, str) or (
        isinstance(seeds, tuple) and len(seeds) == 2 and isinstance(seeds[0], str) and isinstance(seeds[1], int)
    )
    seq: Sequence[Any] = [seeds] if one else seeds
    out = [_seed(s) for s in seq]
    if not out:
        raise _local(InvalidRequest, "no seed address given")
    return out


def parse_address(text: str) -> Address | None:
    """``"host:port"`` (or ``"[v6 address]:port"``) as ``(host, port)``; ``None`` when it
    is not one."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 0xFFFF:
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def is_connection_error(e: AkerError) -> bool:
    """Whether a search that failed so may be sent to another node: the connection
    failed, timed out, or the server closed it (a connection-level reply, request id 0:
    SHUTTING_DOWN, BUSY at connect)."""
    if isinstance(e, (AkerConnectionError, Timeout)):
        return True
    return isinstance(e, StatusError) and e.request_id == 0 and not e.local


def is_refusal(e: AkerError) -> bool:
    """Whether the node refused the connection before taking any request on it: a
    connection-level ``SHUTTING_DOWN`` (sent once every request in flight is answered)
    or ``BUSY`` (``max_connections``). A write that failed so never reached the node."""
    return (
        isinstance(e, StatusError)
        and e.request_id == 0
        and not e.local
        and e.status in (Status.SHUTTING_DOWN, Status.BUSY)
    )


def _in_doubt(node: int, known: ClusterNode, e: AkerError) -> WriteInDoubt:
    return WriteInDoubt(
        f"the write's outcome is unknown: node {node:016x} ({known.advertise}) may have executed it "
        f"({type(e).__name__}: {e}); it was not sent to another node",
        address=known.advertise,
        node_id=node,
    )


class _BatchRows:
    """A batch's rows put back in the matrix's order as each node's reply comes."""

    def __init__(self, n: int, k: int) -> None:
        self.ids = np.full((n, k), np.uint64(U64_MASK), dtype=np.uint64)
        self.distances = np.full((n, k), np.inf, dtype=np.float32)
        self.counts = np.zeros(n, dtype=np.int64)
        self.kinds = [HitKind.MISS] * n
        self.tokens: list[int | None] = [None] * n
        self.dtq = [False] * n
        self.statuses = np.zeros(n, dtype=np.uint16)
        #: (node, routing_version) of each reply, in the order they came.
        self.versions: list[tuple[int, int]] = []

    def put(self, node: int, rows: list[int], b: BatchResult) -> None:
        idx = np.asarray(rows, dtype=np.int64)
        self.ids[idx] = b.ids
        self.distances[idx] = b.distances
        self.counts[idx] = b.counts
        self.statuses[idx] = b.statuses
        for j, row in enumerate(rows):
            self.kinds[row] = b.kinds[j]
            self.tokens[row] = b.tokens[j] if b.tokens else None
            self.dtq[row] = b.distances_to_query[j] if b.distances_to_query else True
        self.versions.append((node, b.routing_version))

    def result(self, errors: str) -> BatchResult:
        """``errors="raise"``: the first failed row in row order raises its status's
        exception with ``.row``."""
        if errors == "raise":
            bad = np.flatnonzero(self.statuses)
            if bad.shape[0]:
                row = int(bad[0])
                err = error_for_status(int(self.statuses[row]), f"search_batch row {row}")
                err.row = row
                raise err
        return BatchResult(
            ids=self.ids,
            distances=self.distances,
            kinds=self.kinds,
            counts=self.counts,
            tokens=self.tokens,
            distances_to_query=self.dtq,
            statuses=self.statuses,
            routing_version=max((v for _n, v in self.versions), default=0),
        )


class _ClusterRouting:
    """What :class:`Cluster` and :class:`AsyncCluster` share, none of it I/O: the routing
    state held, the order of nodes a request is tried on, the nodes avoided after a
    failure, when to fetch the state again, the position carried into searches."""

    def __init__(self, seeds: SeedLike | Sequence[SeedLike], routing: str) -> None:
        self._seeds: list[Address] = _seeds(seeds)
        self._routing = self._check_routing(routing)
        self._state: ClusterState
        #: Node -> the monotonic time until which it is avoided (it failed a connection).
        self._suspect: dict[int, float] = {}
        #: Centroid -> its owner_order under the state held (emptied when it changes).
        self._orders: dict[int, tuple[int, ...]] = {}
        self._position = 0
        self._rng = random.Random()
        self._closed = False
        self.counters = ClusterCounters()
        #: Seconds between fetches caused by replies (:data:`REFRESH_MIN_S`).
        self.refresh_min = REFRESH_MIN_S
        self._last_fetch = 0.0

    @staticmethod
    def _check_routing(routing: str) -> str:
        if routing not in ROUTINGS:
            raise _local(InvalidRequest, f'routing must be "centroid" or "random", not {routing!r}')
        return routing

    @property
    def state(self) -> ClusterState:
        """The routing state as last fetched."""
        return self._state

    def _set_state(self, state: ClusterState, *, refreshed: bool = True) -> None:
        self._state = state
        self._orders = {}
        self._last_fetch = time.monotonic()
        if refreshed:
            self.counters.refreshes += 1

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

    def _check(self) -> None:
        if self._closed:
            raise ConnectionClosed("the cluster handle is closed")

    def _is_suspect(self, node: int, now: float) -> bool:
        return self._suspect.get(node, 0.0) > now

    def _avoid(self, node: int) -> None:
        """``node`` failed a connection: avoided for one lease."""
        now = time.monotonic()
        if self._suspect:
            self._suspect = {n: t for n, t in self._suspect.items() if t > now}
        self._suspect[node] = now + self._state.lease_ms / 1000.0

    def _refresh_candidates(
        self, open_now: Sequence[int], first: int | None
    ) -> list[tuple[int | None, Address | None]]:
        """Where to fetch the state from, in order: the open connection to ``first`` (the
        node whose reply carried another routing version), the other open connections to
        live nodes not avoided, new connections to such nodes, the seeds. ``(node, None)``:
        over the open connection to ``node``; ``(node or None, address)``: a new one."""
        now = time.monotonic()
        usable = {n.node_id for n in self._state.nodes if n.live and not self._is_suspect(n.node_id, now)}
        candidates: list[tuple[int | None, Address | None]] = []
        if first is not None and first in open_now:
            candidates.append((first, None))
        candidates.extend((n, None) for n in open_now if n in usable and n != first)
        for n in self._state.nodes:
            addr = parse_address(n.advertise)
            if n.node_id in usable and n.node_id not in open_now and addr is not None:
                candidates.append((n.node_id, addr))
        candidates.extend((None, a) for a in self._seeds)
        return candidates

    def _refresh_due(self, replies: Sequence[tuple[int, int]]) -> tuple[bool, int | None]:
        """Replies ``(node, routing_version)``: whether the state is to be fetched again
        (a version other than the state's, not 0, and :attr:`refresh_min` seconds since
        the last fetch), and from which node first."""
        v = self._state.routing_version
        for node, r in replies:
            if r != 0 and r != v:
                return time.monotonic() - self._last_fetch >= self.refresh_min, node
        return False, None

    def _owner_order(self, centroid: int) -> tuple[int, ...]:
        """:func:`owner_order` under the state held, computed once per centroid."""
        order = self._orders.get(centroid)
        if order is None:
            order = self._orders[centroid] = tuple(owner_order(self._state, centroid))
        return order

    def _order(self, centroid: int, now: float) -> list[int]:
        order = list(self._owner_order(centroid))
        if self._routing == "random":
            n = min(max(1, len(self._state.live_nodes)), len(order))
            if n:
                by = self._rng.randrange(n)
                order[:n] = order[by:n] + order[:by]
        return self._suspects_last(order, now)

    def _suspects_last(self, order: list[int], now: float) -> list[int]:
        if not self._suspect:
            return order
        late = [x for x in order if self._is_suspect(x, now)]
        if not late:
            return order
        return [x for x in order if not self._is_suspect(x, now)] + late

    def _nodes_for(self, vector: VectorLike) -> list[int]:
        return self._order(nearest_centroid(self._state, vector), time.monotonic())

    def _owner_of(self, vector: VectorLike) -> int | None:
        order = self._owner_order(nearest_centroid(self._state, vector))
        return order[0] if order else None

    def _delete_order(self, id: int) -> list[int]:
        """A delete's nodes: the live ones ordered by the id (the avoided ones last)."""
        key = _uint(id, 64, "id")
        order = sorted((n.node_id for n in self._state.nodes if n.live), key=lambda n: mix64(n ^ key))
        return self._suspects_last(order, time.monotonic())

    def _batch_plan(self, mat: npt.NDArray[np.float32]) -> list[tuple[list[int], list[int]]]:
        """A batch's rows grouped by the first node to try: ``(order, rows)`` per group."""
        now = time.monotonic()
        orders: dict[int, list[int]] = {}
        groups: dict[int | None, tuple[list[int], list[int]]] = {}
        for i, c in enumerate(nearest_centroids(self._state, mat).tolist()):
            if self._routing == "random":
                order = self._order(c, now)
            else:
                if c not in orders:
                    orders[c] = self._order(c, now)
                order = orders[c]
            groups.setdefault(order[0] if order else None, (order, []))[1].append(i)
        return list(groups.values())

    def _node_address(self, node: int) -> Address:
        n = self._state.node(node)
        if n is None:
            raise ProtocolError(f"node {node:016x} is not in the cluster state")
        addr = parse_address(n.advertise)
        if addr is None:
            raise ProtocolError(f"node {node:016x}'s address {n.advertise!r} is not host:port")
        return addr

    def _count(self, node: int, tried: int) -> None:
        if tried:
            self.counters.retries += 1
        self.counters.requests[node] = self.counters.requests.get(node, 0) + 1

    def _at(self, at_position: int | None) -> int | None:
        if at_position is None and self._position:
            return self._position
        return at_position

    def _carry(self, position: int) -> None:
        self._position = max(self._position, position)

    def __repr__(self) -> str:
        s = self._state
        closed = " closed" if self._closed else ""
        return (
            f"<aker.{type(self).__name__} {s.name!r} routing_version={s.routing_version:#x} nodes={len(s.nodes)} "
            f"live={len(s.live_nodes)}{closed}>"
        )


class Cluster(_ClusterRouting):
    """A client of a cluster of akerd nodes (protocol version 6, ``docs/CLUSTER.md``).

    Args:
        seeds: node addresses (``"host:port"`` or ``(host, port)``); the routing state
            (CLUSTER) comes from the first that answers it, later from the nodes this
            handle has connections to (else any live node, else a seed).
        routing: ``"centroid"`` (each search to its centroid's owner) or ``"random"``
            (to a live node at random: a baseline).
        client_options: :class:`aker.Client`'s keyword arguments, for every node
            (``timeout``, ``connect_timeout``, ``secret``, ``ssl``, ``server_hostname``, ...).

    Searches go to the owner of the query's nearest centroid, a batch is split by owner
    (one ``search_batch`` per node, rows back in order); writes go to any node and their
    positions are carried into this handle's later searches as ``at_position``
    (read-your-writes across nodes).

    Failures: a node whose connection fails is avoided for one lease (``state.lease_ms``)
    and the state fetched again. A search that met a connection error (refused, lost,
    timed out, closed by the server) is sent at once to the next node of
    :func:`owner_order`, on at most :data:`ATTEMPTS_MAX` nodes. A write (insert, delete)
    is sent to the next node only when it provably never reached the node: the connection
    could not be opened (connect, TLS, HELLO), or the node refused it (connection-level
    ``SHUTTING_DOWN`` or ``BUSY``). After a timeout, a reset or a close once it was sent,
    its outcome is unknown: :class:`aker.WriteInDoubt` (the node may still commit it
    later, so sending it elsewhere could let that late commit overwrite a newer write).

    A reply whose ``routing_version`` differs from the state's makes the handle fetch the
    state again (at most every :data:`REFRESH_MIN_S` seconds), first from the node that
    sent that reply, over its open connection. One connection per node, opened when
    first needed and kept (an idle one the server closed is opened again). Calls are
    serialized (a lock), as :class:`aker.Client`'s; :class:`AsyncCluster` runs them
    concurrently.
    """

    def __init__(
        self,
        seeds: SeedLike | Sequence[SeedLike],
        *,
        routing: str = "centroid",
        **client_options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(seeds, routing)
        self._options = client_options
        self._lock = threading.RLock()
        self._conns: dict[int, Client] = {}
        state, _node, client = self._fetch([(None, a) for a in self._seeds])
        self._set_state(state, refreshed=False)
        if client is not None:
            self._keep(state.self_id, client)

    # ------------------------------------------------------------------ connections

    @property
    def connections(self) -> dict[int, Client]:
        """The open connections, per node id (a copy)."""
        return {n: c for n, c in self._conns.items() if not c.closed}

    def _keep(self, node: int, client: Client) -> None:
        """Keeps a connection just opened to ``node``, unless one to it is open already
        (that one stays: a healthy connection is never closed for another)."""
        old = self._conns.get(node)
        if old is not None and old is not client and not old.closed:
            client.close()
            return
        self._conns[node] = client

    def _drop(self, node: int) -> None:
        c = self._conns.pop(node, None)
        if c is not None:
            c.close()

    def _open(self, node: int) -> Client | None:
        """The open connection to ``node`` when it is usable; one the server closed while
        it was idle (``idle_timeout_ms``, a restart), or holding bytes nobody asked for,
        is closed and forgotten (``None``)."""
        c = self._conns.get(node)
        if c is None:
            return None
        if c.closed or not c._idle_usable():
            self._drop(node)
            return None
        return c

    def _connect(self, node: int) -> Client:
        """A usable connection to ``node``: the open one, else a new one (kept)."""
        c = self._open(node)
        if c is not None:
            return c
        host, port = self._node_address(node)
        c = Client(host, port, **self._options)
        self._conns[node] = c
        return c

    # ------------------------------------------------------------------ state

    def _fetch(
        self, candidates: Sequence[tuple[int | None, Address | None]]
    ) -> tuple[ClusterState, int | None, Client | None]:
        """CLUSTER from the first candidate that answers it: ``(node, None)`` asks over the
        open connection to ``node`` (skipped when there is none), ``(node, address)`` over
        a new connection. Returns the state, the node whose open connection answered
        (``None``: a new one did) and the new connection (``None``: an open one answered)."""
        last: AkerError = AkerConnectionError("no address to fetch the cluster state from")
        for node, addr in candidates:
            if addr is None:
                c = None if node is None else self._open(node)
                if node is None or c is None:
                    continue
                try:
                    return c.cluster(), node, None
                except AkerError as e:
                    last = e
                    if is_connection_error(e):
                        self._drop(node)
                continue
            try:
                fresh = Client(addr[0], addr[1], **self._options)
            except AkerError as e:
                last = e
                continue
            try:
                return fresh.cluster(), None, fresh
            except AkerError as e:
                last = e
                fresh.close()
        raise last

    def _refresh(self, first: int | None = None) -> ClusterState:
        open_now = [n for n in list(self._conns) if self._open(n) is not None]
        state, _node, client = self._fetch(self._refresh_candidates(open_now, first))
        self._set_state(state)
        if client is not None:
            self._keep(state.self_id, client)
        return state

    def refresh(self) -> ClusterState:
        """Fetches the routing state again, over an open connection to a live node when
        there is one (no connection is opened then), else from a live node (not one that
        just failed) or a seed; returns it (also :attr:`state`)."""
        with self._lock:
            self._check()
            return self._refresh()

    def _try_refresh(self, first: int | None = None) -> None:
        try:
            self._refresh(first)
        except AkerError:
            pass  # routing goes on with the state held; a later reply or failure tries again

    def _note_routing(self, replies: Sequence[tuple[int, int]]) -> None:
        due, node = self._refresh_due(replies)
        if due:
            self._try_refresh(node)

    # ------------------------------------------------------------------ routing

    def nodes_for(self, vector: VectorLike) -> list[int]:
        """The nodes a search of ``vector`` is tried on, in order: its centroid's
        :func:`owner_order` (``routing="random"``: a random live node first), the nodes
        that failed recently last."""
        with self._lock:
            return self._nodes_for(vector)

    def owner_of(self, vector: VectorLike) -> int | None:
        """The owner of ``vector``'s nearest centroid by the state held (``None``: no node)."""
        with self._lock:
            return self._owner_of(vector)

    def _failed(self, node: int) -> None:
        """``node``'s connection failed: dropped, the node avoided for a lease, the state
        fetched again."""
        self._drop(node)
        self._avoid(node)
        self._try_refresh()

    def _on_nodes(self, order: Sequence[int], f: Callable[[Client], T], *, write: bool = False) -> tuple[int, T]:
        """``f`` on the nodes of ``order`` until one answers (at most :data:`ATTEMPTS_MAX`):
        that node and ``f``'s result. A node the state (fetched again meanwhile) no longer
        names is skipped. A node whose connection fails is dropped, avoided for a lease,
        and the state fetched again; then a search goes on to the next node, a write only
        when it never reached the node (the connection could not be opened, or the node
        refused it: :func:`is_refusal`), else it raises :class:`WriteInDoubt`. Any other
        error is raised at once."""
        last: AkerError = AkerConnectionError("the cluster has no node to send to")
        tried = 0
        for node in order:
            if tried >= ATTEMPTS_MAX:
                break
            known = self._state.node(node)
            if known is None:
                continue  # the state was fetched again and no longer names it
            self._count(node, tried)
            tried += 1
            try:
                c = self._connect(node)
            except AkerError as e:
                if not is_connection_error(e):
                    raise
                last = e
                self._failed(node)
                continue  # nothing was sent
            try:
                return node, f(c)
            except AkerError as e:
                if not is_connection_error(e):
                    raise
                last = e
                self._failed(node)
                if write and not is_refusal(e):
                    raise _in_doubt(node, known, e) from e
        raise last

    # ------------------------------------------------------------------ requests

    def search(
        self,
        vector: VectorLike,
        k: int = 10,
        *,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: float | None = None,
        collection: int = 0,
        at_position: int | None = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> SearchResult:
        """As :meth:`aker.Client.search`, on the owner of ``vector``'s nearest centroid;
        ``at_position`` defaults to the newest write position this handle has seen."""
        with self._lock:
            self._check()
            q = as_vector(vector, self._state.dim)
            at = self._at(at_position)
            node, r = self._on_nodes(
                self._nodes_for(q),
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
            self._note_routing([(node, r.routing_version)])
            return r

    def search_batch(
        self,
        matrix: VectorLike,
        k: int = 10,
        *,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: float | None = None,
        collection: int = 0,
        at_position: int | None = None,
        errors: str = "raise",
        timeout: TimeoutArg = DEFAULT,
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
            out = _BatchRows(mat.shape[0], kk)

            def rows_of(sub: npt.NDArray[np.float32]) -> Callable[[Client], BatchResult]:
                def call(c: Client) -> BatchResult:
                    return c.search_batch(
                        sub,
                        kk,
                        bypass_cache=bypass_cache,
                        refresh_entry=refresh_entry,
                        deadline=deadline,
                        collection=collection,
                        at_position=at,
                        errors="return",
                        timeout=timeout,
                    )

                return call

            for order, rows in self._batch_plan(mat):
                node, b = self._on_nodes(order, rows_of(mat[rows]))
                out.put(node, rows, b)
            self._note_routing(out.versions)
            return out.result(errors)

    def insert_with_position(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> int:
        """As :meth:`aker.Client.insert_with_position`, on the owner of ``vector``'s
        centroid (any node would do); the position is carried into later searches.

        Sent to the next node only when it never reached the one tried (connection not
        opened, or refused); a connection that fails once it was sent raises
        :class:`aker.WriteInDoubt` (the insert may or may not take effect there)."""
        with self._lock:
            self._check()
            q = as_vector(vector, self._state.dim)
            _node, p = self._on_nodes(
                self._nodes_for(q),
                lambda c: c.insert_with_position(id, q, payload, collection=collection, timeout=timeout),
                write=True,
            )
            self._carry(p)
            return p

    def insert(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> None:
        """As :meth:`aker.Client.insert` (its position carried: :meth:`insert_with_position`)."""
        self.insert_with_position(id, vector, payload, collection=collection, timeout=timeout)

    def delete_with_position(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> Deleted:
        """As :meth:`aker.Client.delete_with_position`, on a live node chosen by the id;
        the position is carried into later searches. Retried as
        :meth:`insert_with_position` (else :class:`aker.WriteInDoubt`)."""
        with self._lock:
            self._check()
            _node, d = self._on_nodes(
                self._delete_order(id),
                lambda c: c.delete_with_position(id, collection=collection, timeout=timeout),
                write=True,
            )
            self._carry(d.position)
            return d

    def delete(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> bool:
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

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _retrieve(f: asyncio.Future[Any]) -> None:
    """A done callback: marks a shared task's exception retrieved (the callers awaiting
    it still get it raised), so that one nobody awaits any more is not reported."""
    if not f.cancelled():
        f.exception()


def _being_cancelled() -> bool:
    """Whether the running task has a cancellation pending (Python 3.11+; 3.10 cannot
    tell, and answers False)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False


class AsyncCluster(_ClusterRouting):
    """:class:`Cluster` for asyncio; make one with ``await AsyncCluster.connect(seeds,
    ...)`` (the same arguments); ``async with`` closes it.

    Routing, retries, :class:`aker.WriteInDoubt`, the positions carried and the state
    fetched again are :class:`Cluster`'s; what differs is that calls run concurrently:

    - one :class:`aker.AsyncClient` per node, shared by every call to that node (their
      requests multiplexed on it, up to the node's window);
    - a connection is opened by the first call that needs it; calls that need it
      meanwhile wait for that one (never two connects to one node at once);
    - a batch's parts go to their nodes at once (``search_batch`` waits for the
      slowest node, not for the sum of them);
    - the state is fetched by one task at a time: a call that needs it fetched while a
      fetch is under way waits for that fetch's result;
    - a call that timed out avoids its node for a lease but leaves the connection open
      (other calls' requests on it are still answered); a connection that failed (lost,
      closed by the server) is dropped;
    - a write that never left the client (the connection was found closed before it
      was written, or its time ran out waiting for a slot of the node's window) is sent
      to the next node, as one the node refused.
    """

    _options: ClientOptions
    _conns: dict[int, AsyncClient]
    #: Node -> the connect under way to it (shared by the calls waiting for it).
    _opening: dict[int, asyncio.Task[AsyncClient]]
    _fetching: asyncio.Task[ClusterState] | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("make an AsyncCluster with `await AsyncCluster.connect(seeds, ...)`")

    @classmethod
    async def connect(
        cls,
        seeds: SeedLike | Sequence[SeedLike],
        *,
        routing: str = "centroid",
        **client_options: Unpack[ClientOptions],
    ) -> AsyncCluster:
        """A handle with the routing state from the first seed that answers CLUSTER
        (raises the last seed's error when none does)."""
        c = cls.__new__(cls)
        _ClusterRouting.__init__(c, seeds, routing)
        c._options = client_options
        c._conns = {}
        c._opening = {}
        c._fetching = None
        state, _node, client = await c._fetch([(None, a) for a in c._seeds])
        c._set_state(state, refreshed=False)
        if client is not None:
            c._keep(state.self_id, client)
        return c

    # ------------------------------------------------------------------ connections

    @property
    def connections(self) -> dict[int, AsyncClient]:
        """The open connections, per node id (a copy)."""
        return {n: c for n, c in self._conns.items() if not c.closed}

    def _keep(self, node: int, client: AsyncClient) -> None:
        """Keeps a connection just opened to ``node``, unless one to it is open already
        (that one stays) or the handle was closed meanwhile."""
        old = self._conns.get(node)
        if self._closed or (old is not None and old is not client and not old.closed):
            client._abort()
            return
        self._conns[node] = client

    def _forget(self, node: int, client: AsyncClient) -> None:
        """Closes ``client`` and forgets it as ``node``'s connection, if it still is (a
        call whose connection failed must not drop the one another call opened since).
        Closed without waiting: a cancellation must not find a call here."""
        if self._conns.get(node) is client:
            del self._conns[node]
        client._abort()

    def _open(self, node: int) -> AsyncClient | None:
        """The open connection to ``node`` when it is usable, else ``None``. An idle
        connection the server closed (idle_timeout_ms, a restart) is replaced before
        anything is sent on it, so that a write goes on a new connection instead of
        failing on this one, in doubt."""
        c = self._conns.get(node)
        if c is None:
            return None
        if c.closed or (c.in_flight == 0 and not c._idle_usable()):
            self._forget(node, c)
            return None
        return c

    async def _connect(self, node: int) -> AsyncClient:
        """A usable connection to ``node``: the open one, the one being opened, else a
        new one (kept)."""
        self._check()
        c = self._open(node)
        if c is not None:
            return c
        task = self._opening.get(node)
        if task is None:
            host, port = self._node_address(node)
            task = asyncio.ensure_future(self._open_new(node, host, port))
            task.add_done_callback(_retrieve)
            self._opening[node] = task
        # Shielded: a caller cancelled or timed out leaves the connect to the others.
        return await self._shared(task)

    async def _shared(self, task: asyncio.Task[T]) -> T:
        """``task``'s result, shielded from this caller's cancellation; when close()
        cancelled the task itself, ConnectionClosed (the caller was not cancelled)."""
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled() and self._closed and not _being_cancelled():
                raise ConnectionClosed("the cluster handle was closed") from None
            raise

    async def _open_new(self, node: int, host: str, port: int) -> AsyncClient:
        try:
            c = await AsyncClient.connect(host, port, **self._options)
            self._keep(node, c)
            self._check()
            return self._conns.get(node, c)
        finally:
            self._opening.pop(node, None)

    # ------------------------------------------------------------------ state

    async def _fetch(
        self, candidates: Sequence[tuple[int | None, Address | None]]
    ) -> tuple[ClusterState, int | None, AsyncClient | None]:
        """:meth:`Cluster._fetch <aker.Cluster>`'s order, asynchronously; a connection it
        opened is closed unless returned, whatever ends the fetch (a cancellation too)."""
        last: AkerError = AkerConnectionError("no address to fetch the cluster state from")
        for node, addr in candidates:
            self._check()
            if addr is None:
                c = None if node is None else self._conns.get(node)
                if node is None or c is None or c.closed:
                    continue
                try:
                    return await c.cluster(), node, None
                except AkerError as e:
                    last = e
                    if c.closed:
                        self._forget(node, c)
                continue
            try:
                fresh = await AsyncClient.connect(addr[0], addr[1], **self._options)
            except AkerError as e:
                last = e
                continue
            try:
                return await fresh.cluster(), None, fresh
            except BaseException as e:
                fresh._abort()
                if not isinstance(e, AkerError):
                    raise
                last = e
        raise last

    async def _fetch_again(self, first: int | None) -> ClusterState:
        open_now = [n for n, c in list(self._conns.items()) if not c.closed]
        state, _node, client = await self._fetch(self._refresh_candidates(open_now, first))
        self._set_state(state)
        if client is not None:
            self._keep(state.self_id, client)
        return state

    async def _refresh(self, first: int | None = None) -> ClusterState:
        task = self._fetching
        if task is None or task.done():
            task = self._fetching = asyncio.ensure_future(self._fetch_again(first))
            task.add_done_callback(_retrieve)
        return await self._shared(task)

    async def refresh(self) -> ClusterState:
        """As :meth:`Cluster.refresh <aker.Cluster.refresh>` (a fetch under way is
        waited for instead of starting another)."""
        self._check()
        return await self._refresh()

    async def _try_refresh(self, first: int | None = None) -> None:
        try:
            await self._refresh(first)
        except AkerError:
            pass  # routing goes on with the state held; a later reply or failure tries again

    async def _note_routing(self, replies: Sequence[tuple[int, int]]) -> None:
        due, node = self._refresh_due(replies)
        if due:
            await self._try_refresh(node)

    # ------------------------------------------------------------------ routing

    def nodes_for(self, vector: VectorLike) -> list[int]:
        """As :meth:`Cluster.nodes_for <aker.Cluster.nodes_for>`."""
        return self._nodes_for(vector)

    def owner_of(self, vector: VectorLike) -> int | None:
        """As :meth:`Cluster.owner_of <aker.Cluster.owner_of>`."""
        return self._owner_of(vector)

    async def _failed(self, node: int, client: AsyncClient | None) -> None:
        """A call to ``node`` met a connection error: the connection dropped if it failed
        (not after a timeout: other calls' requests on it may still be answered), the
        node avoided for a lease, the state fetched again."""
        if client is not None and client.closed:
            self._forget(node, client)
        self._avoid(node)
        await self._try_refresh()

    async def _on_nodes(
        self, order: Sequence[int], f: Callable[[AsyncClient], Awaitable[T]], *, write: bool = False
    ) -> tuple[int, T]:
        """:meth:`Cluster._on_nodes <aker.Cluster>`, asynchronously: ``f`` on the nodes of
        ``order`` until one answers; searches retried, writes only when they never
        reached the node, else :class:`aker.WriteInDoubt`."""
        last: AkerError = AkerConnectionError("the cluster has no node to send to")
        tried = 0
        for node in order:
            if tried >= ATTEMPTS_MAX:
                break
            known = self._state.node(node)
            if known is None:
                continue  # the state was fetched again and no longer names it
            self._count(node, tried)
            tried += 1
            try:
                c = await self._connect(node)
            except AkerError as e:
                if not is_connection_error(e) or self._closed:
                    raise
                last = e
                await self._failed(node, None)
                continue  # nothing was sent
            try:
                return node, await f(c)
            except AkerError as e:
                if not is_connection_error(e):
                    raise
                never_reached = is_refusal(e) or getattr(e, "not_sent", False)
                if write and not never_reached:
                    if not self._closed:
                        await self._failed(node, c)
                    raise _in_doubt(node, known, e) from e
                if self._closed:
                    raise
                last = e
                await self._failed(node, c)
        raise last

    # ------------------------------------------------------------------ requests

    async def search(
        self,
        vector: VectorLike,
        k: int = 10,
        *,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: float | None = None,
        collection: int = 0,
        at_position: int | None = None,
        timeout: TimeoutArg = DEFAULT,
    ) -> SearchResult:
        """As :meth:`Cluster.search <aker.Cluster.search>`."""
        self._check()
        q = as_vector(vector, self._state.dim)
        at = self._at(at_position)
        node, r = await self._on_nodes(
            self._nodes_for(q),
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
        await self._note_routing([(node, r.routing_version)])
        return r

    async def search_batch(
        self,
        matrix: VectorLike,
        k: int = 10,
        *,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: float | None = None,
        collection: int = 0,
        at_position: int | None = None,
        errors: str = "raise",
        timeout: TimeoutArg = DEFAULT,
    ) -> BatchResult:
        """As :meth:`Cluster.search_batch <aker.Cluster.search_batch>`, the nodes' parts
        sent at once. A part that no node answered (its nodes' connections failed)
        raises its error once every part is done (the first such part in row order)."""
        self._check()
        check_errors(errors)
        mat = as_matrix(matrix, self._state.dim)
        kk = _uint(k, 32, "k")
        if kk < 1:
            raise _local(BadK, "k = 0 (at least 1)")
        at = self._at(at_position)
        out = _BatchRows(mat.shape[0], kk)
        plan = self._batch_plan(mat)

        def rows_of(sub: npt.NDArray[np.float32]) -> Callable[[AsyncClient], Awaitable[BatchResult]]:
            def call(c: AsyncClient) -> Awaitable[BatchResult]:
                return c.search_batch(
                    sub,
                    kk,
                    bypass_cache=bypass_cache,
                    refresh_entry=refresh_entry,
                    deadline=deadline,
                    collection=collection,
                    at_position=at,
                    errors="return",
                    timeout=timeout,
                )

            return call

        parts = await asyncio.gather(
            *(self._on_nodes(order, rows_of(mat[rows])) for order, rows in plan), return_exceptions=True
        )
        for (_order, rows), part in zip(plan, parts, strict=True):
            if isinstance(part, BaseException):
                raise part
            out.put(part[0], rows, part[1])
        await self._note_routing(out.versions)
        return out.result(errors)

    async def insert_with_position(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> int:
        """As :meth:`Cluster.insert_with_position <aker.Cluster.insert_with_position>`."""
        self._check()
        q = as_vector(vector, self._state.dim)
        _node, p = await self._on_nodes(
            self._nodes_for(q),
            lambda c: c.insert_with_position(id, q, payload, collection=collection, timeout=timeout),
            write=True,
        )
        self._carry(p)
        return p

    async def insert(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> None:
        """As :meth:`Cluster.insert <aker.Cluster.insert>`."""
        await self.insert_with_position(id, vector, payload, collection=collection, timeout=timeout)

    async def delete_with_position(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> Deleted:
        """As :meth:`Cluster.delete_with_position <aker.Cluster.delete_with_position>`."""
        self._check()
        _node, d = await self._on_nodes(
            self._delete_order(id),
            lambda c: c.delete_with_position(id, collection=collection, timeout=timeout),
            write=True,
        )
        self._carry(d.position)
        return d

    async def delete(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> bool:
        """As :meth:`Cluster.delete <aker.Cluster.delete>`."""
        return (await self.delete_with_position(id, collection=collection, timeout=timeout)).existed

    # ------------------------------------------------------------------ lifetime

    async def close(self) -> None:
        """Closes every connection (idempotent): connects and fetches under way are
        cancelled and waited for, so that nothing is opened once it returns; calls in
        flight fail (a write sent already: :class:`aker.WriteInDoubt`)."""
        self._closed = True
        busy = [t for t in (*self._opening.values(), self._fetching) if t is not None and not t.done()]
        for t in busy:
            t.cancel()
        if busy:
            await asyncio.wait(busy)
        conns, self._conns = self._conns, {}
        for c in conns.values():
            await c.close()

    async def __aenter__(self) -> AsyncCluster:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
