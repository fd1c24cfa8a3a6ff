"""Wire constants and the public result types (PROTOCOL.md)."""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAGIC",
    "HEADER",
    "HEADER_LEN",
    "REPLY_BIT",
    "CONNECTION_OP",
    "VERSIONS",
    "Opcode",
    "Status",
    "HitKind",
    "Metric",
    "ServerInfo",
    "SearchResult",
    "BatchResult",
    "Deleted",
    "ClusterNode",
    "ClusterState",
    "NO_ID",
]

#: ``"AK"`` on the wire, read as a little-endian u16.
MAGIC = 0x4B41
#: magic u16, version u8, opcode u8, flags u16, status u16, request id u64, body length u32.
HEADER = struct.Struct("<HBBHHQI")
HEADER_LEN = 20
assert HEADER.size == HEADER_LEN
REPLY_BIT = 0x80
#: Request opcode of connection-level replies (sent with request id 0).
CONNECTION_OP = 0
#: The protocol versions this client speaks, newest first (version 1 lacks Δ and the
#: MISS token, so it is not spoken). Version 4 adds SEARCH_BATCH; version 5 the writes'
#: positions and searches AT_POSITION (read-your-writes); version 6 CLUSTER and the
#: routing version of SEARCH / SEARCH_BATCH replies.
VERSIONS = (6, 5, 4, 3, 2)

FLAG_BYPASS_CACHE = 0x0001
FLAG_REFRESH_ENTRY = 0x0002
#: (v5) SEARCH / SEARCH_BATCH: an 8-byte position ends the body.
FLAG_AT_POSITION = 0x0004
FLAG_FILL_TOKEN = 0x0001
REPLY_DISTANCES_TO_QUERY = 0x01
REPLY_TOKEN = 0x02

NONCE_LEN = 16
PROOF_LEN = 32
#: The smallest ``max_frame_bytes`` a server may be configured with.
MIN_SERVER_FRAME = 256
#: (v6) The most nodes, and the most overrides, a CLUSTER reply may carry.
CLUSTER_NODES_MAX = 1024
#: (v6) The longest node address (``advertise``) or cluster name, in bytes of UTF-8.
CLUSTER_NAME_BYTES_MAX = 255

#: Padding id of :class:`BatchResult` rows that have fewer than k neighbours.
NO_ID = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


class Opcode(enum.IntEnum):
    HELLO = 0x01
    PING = 0x02
    SEARCH = 0x03
    INSERT = 0x04
    DELETE = 0x05
    FILL = 0x06
    FLUSH = 0x07
    STATS = 0x08
    AUTH = 0x09
    SEARCH_BATCH = 0x0A
    CLUSTER = 0x0B


class Status(enum.IntEnum):
    """Reply status codes (PROTOCOL.md, "Errors")."""

    OK = 0
    NOT_FOUND = 1
    BUSY = 2
    TOO_LARGE = 3
    BAD_FRAME = 4
    BAD_VERSION = 5
    UNKNOWN_OP = 6
    BAD_REQUEST = 7
    DIM_MISMATCH = 8
    NON_FINITE = 9
    BAD_K = 10
    DEADLINE_EXCEEDED = 11
    UNKNOWN_COLLECTION = 12
    UNSUPPORTED = 13
    UNAVAILABLE = 14
    SHUTTING_DOWN = 15
    INTERNAL = 16
    UNAUTHENTICATED = 17


class HitKind(enum.IntEnum):
    """How a SEARCH was answered."""

    #: Not from the cache: the backend's answer (also BYPASS_CACHE / REFRESH_ENTRY); in
    #: cache-aside mode, no neighbours and a token for the FILL that follows.
    MISS = 0
    #: The same query vector was cached.
    EXACT = 1
    #: A query recorded as an alias of a cached representative.
    ALIAS = 2
    #: Answered from a nearby cached query's result.
    APPROXIMATE = 3


class Metric(enum.IntEnum):
    """The server's distance; smaller is closer."""

    #: Squared L2.
    L2SQ = 0
    #: ``1 - cos``.
    COSINE = 1
    #: ``-dot``.
    IP = 2


@dataclass(frozen=True)
class ServerInfo:
    """What HELLO told, and the version this connection speaks."""

    #: The protocol version requests go out in (the newest both ends speak).
    version: int
    version_min: int
    version_max: int
    metric: Metric
    #: Largest frame (header + body) the server accepts.
    max_frame_bytes: int
    dim: int
    k_max: int
    #: Requests one connection may have in progress; the client keeps its window at most this.
    max_inflight: int
    executors: int
    shards: int
    #: Δ: a cache-aside client FILLs ``k + delta`` candidates.
    delta: int
    #: Whether the server required (and got) AUTH on this connection.
    auth_required: bool
    #: (v4) The most queries one SEARCH_BATCH may carry; ``None`` below version 4 (no
    #: SEARCH_BATCH: :meth:`aker.Client.search_batch` pipelines one SEARCH per row).
    max_batch: int | None = None


@dataclass(frozen=True, eq=False)
class SearchResult:
    """One SEARCH answer: ``ids`` (uint64) and ``distances`` (float32), ascending by
    distance, at most k of them, and how it was answered.

    ``len(result)`` is the number of neighbours; iterating yields the two arrays
    ``(ids, distances)`` (not the neighbours), so that ``ids, distances = result``
    unpacks. To walk the neighbours use ``zip(result.ids, result.distances)``."""

    ids: npt.NDArray[np.uint64]
    distances: npt.NDArray[np.float32]
    kind: HitKind
    #: False when the distances are to the cached representative query's vector (an
    #: approximate hit that was not re-ranked).
    distances_to_query: bool = True
    #: A cache-aside MISS's token, for :meth:`aker.Client.fill`.
    token: int | None = None
    #: (v6) The version of the cluster's routing state the answering node holds (0: a
    #: node in no cluster, or a connection below version 6). Compare for equality only.
    routing_version: int = 0

    @property
    def hit(self) -> bool:
        """Whether the cache answered (any kind but MISS)."""
        return self.kind != HitKind.MISS

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __iter__(self) -> Iterator[npt.NDArray[Any]]:
        """Yields ``ids`` then ``distances`` (two arrays, whatever ``len()`` is), for
        ``ids, distances = result`` (typed ``NDArray[Any]``, as one iterator yields both:
        the attributes are typed exactly)."""
        return iter((self.ids, self.distances))


@dataclass(frozen=True)
class Deleted:
    """A DELETE's answer with its position (:meth:`aker.Client.delete_with_position`)."""

    #: The id was present (cache-aside: whether the cache held it).
    existed: bool
    #: (v5) The write's position, as :meth:`aker.Client.insert_with_position` returns it.
    position: int = 0


def _no_statuses() -> npt.NDArray[np.uint16]:
    return np.zeros(0, dtype=np.uint16)


@dataclass(frozen=True, eq=False)
class BatchResult:
    """The answers to many queries, in the order of the rows asked.

    ``ids`` has shape ``(n, k)`` (uint64) and ``distances`` ``(n, k)`` (float32). A row with
    fewer than k neighbours (``counts[i] < k``: a cache-aside MISS, a small collection) is
    padded with :data:`NO_ID` and ``+inf``.

    ``statuses`` (uint16, shape ``(n,)``) is each row's status code: ``0`` (``Status.OK``)
    for an answered row. Only ``search_batch(..., errors="return")`` gives back a batch
    with failed rows; such a row is padded as an empty one (``counts[i] == 0``, kind
    ``MISS``, no token) and ``ok[i]`` is False.

    ``len(batch)`` and ``batch[i]`` (a :class:`SearchResult`) are per row, but iterating
    yields the two ``(n, k)`` arrays ``(ids, distances)``, not the rows, so that
    ``ids, distances = batch`` unpacks. To walk the rows use
    ``(batch[i] for i in range(len(batch)))``.
    """

    ids: npt.NDArray[np.uint64]
    distances: npt.NDArray[np.float32]
    kinds: list[HitKind]
    counts: npt.NDArray[np.int64]
    tokens: list[int | None] = field(default_factory=list)
    distances_to_query: list[bool] = field(default_factory=list)
    statuses: npt.NDArray[np.uint16] = field(default_factory=_no_statuses)
    #: (v6) The routing version the reply carried (the largest of its frames'; 0 from a
    #: node in no cluster, or below version 6), as :attr:`SearchResult.routing_version`.
    routing_version: int = 0

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __getitem__(self, i: int) -> SearchResult:
        m = int(self.counts[i])
        return SearchResult(
            ids=self.ids[i, :m],
            distances=self.distances[i, :m],
            kind=self.kinds[i],
            distances_to_query=self.distances_to_query[i] if self.distances_to_query else True,
            token=self.tokens[i] if self.tokens else None,
            routing_version=self.routing_version,
        )

    def __iter__(self) -> Iterator[npt.NDArray[Any]]:
        """Yields the ``(n, k)`` arrays ``ids`` then ``distances`` (not the rows), for
        ``ids, distances = batch`` (typed as :meth:`SearchResult.__iter__`)."""
        return iter((self.ids, self.distances))

    @property
    def ok(self) -> npt.NDArray[np.bool_]:
        """Per row, whether it was answered (``statuses == 0``), a bool array of shape ``(n,)``."""
        if self.statuses.shape[0] != len(self):
            return np.ones(len(self), dtype=bool)
        return np.asarray(self.statuses == 0)

    @property
    def hit_ratio(self) -> float:
        """Fraction of the rows the cache answered (a failed row is no hit)."""
        if not self.kinds:
            return 0.0
        return sum(1 for k in self.kinds if k != HitKind.MISS) / len(self.kinds)


@dataclass(frozen=True)
class ClusterNode:
    """A node of a :class:`ClusterState`."""

    #: Stable across the node's restarts (not its address); the rendezvous hash's input.
    node_id: int
    #: Its lease is held (as judged by the node that answered CLUSTER).
    live: bool
    #: ``host:port`` where clients reach it.
    advertise: str


@dataclass(frozen=True, eq=False)
class ClusterState:
    """A CLUSTER reply (protocol version 6, PROTOCOL.md "Clusters"): what a client routes
    by (:mod:`aker.cluster`). The owner of centroid ``c`` is the node of ``c``'s override
    when that node is live, else the live node with the highest rendezvous score."""

    name: str
    #: A digest of everything routing depends on (centroids version, overrides, live
    #: nodes): what SEARCH replies carry. Compare for equality only; never 0.
    routing_version: int
    #: The centroids' version (a retrain publishes the next).
    centroids_version: int
    #: The overrides' version (0: none published).
    balance_epoch: int
    #: The node that answered.
    self_id: int
    #: A node is live while its lease (renewed every second) holds.
    lease_ms: int
    metric: Metric
    dim: int
    #: ``(n, dim)`` float32, row-major, all finite.
    centroids: npt.NDArray[np.float32]
    nodes: list[ClusterNode]
    #: ``(centroid, node_id)``: a hot centroid given to another node than its rendezvous
    #: owner, to balance load.
    overrides: list[tuple[int, int]]

    @property
    def n_centroids(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def live_nodes(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.live]

    def node(self, node_id: int) -> ClusterNode | None:
        """The node with this id (``None``: not in this state)."""
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        return None
