"""Frames, request bodies, reply decoding and the handshake, without any I/O.

The sync and the async clients share all of it: a request is a :class:`Req` (opcode,
flags, body, how to decode its reply); :func:`handshake` is a generator that yields the
requests of HELLO / AUTH and is sent their reply frames, so each transport drives it.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from . import _auth
from ._protocol import (
    CLUSTER_NAME_BYTES_MAX,
    CLUSTER_NODES_MAX,
    CONNECTION_OP,
    FLAG_AT_POSITION,
    FLAG_BYPASS_CACHE,
    FLAG_FILL_TOKEN,
    FLAG_REFRESH_ENTRY,
    HEADER,
    HEADER_LEN,
    MAGIC,
    MIN_SERVER_FRAME,
    NO_ID,
    NONCE_LEN,
    PROOF_LEN,
    REPLY_BIT,
    REPLY_DISTANCES_TO_QUERY,
    REPLY_TOKEN,
    VERSIONS,
    BatchResult,
    ClusterNode,
    ClusterState,
    Deleted,
    HitKind,
    Metric,
    Opcode,
    SearchResult,
    ServerInfo,
    Status,
)
from .errors import (
    AuthRequired,
    BadK,
    DimensionMismatch,
    IncompatibleServer,
    InvalidRequest,
    NonFinite,
    ProtocolError,
    ServerNotAuthentic,
    StatusError,
    TooLarge,
    Unsupported,
    error_for_status,
)

F32 = np.dtype("<f4")
U64 = np.dtype("<u8")
_NEIGHBOUR = np.dtype([("id", "<u8"), ("distance", "<f4")])
U32_MAX = 0xFFFF_FFFF
U64_MAX = 0xFFFF_FFFF_FFFF_FFFF

#: Anything :func:`numpy.asarray` takes: an ndarray (float32 C-contiguous goes as it is),
#: a list of floats, ...
VectorLike: TypeAlias = npt.ArrayLike
#: PING's and INSERT's payloads (a ``str`` is refused: it has no one encoding).
BytesLike: TypeAlias = bytes | bytearray | memoryview
Payload: TypeAlias = BytesLike | None


@dataclass(frozen=True)
class Frame:
    """A reply frame: its header fields and body."""

    version: int
    opcode: int
    flags: int
    status: int
    request_id: int
    body: bytes

    @property
    def connection_level(self) -> bool:
        return self.request_id == 0 and self.opcode == (CONNECTION_OP | REPLY_BIT)


def encode_frame(version: int, opcode: int, flags: int, request_id: int, body: bytes) -> bytes:
    return HEADER.pack(MAGIC, version, opcode, flags, 0, request_id, len(body)) + body


def parse_header(header: bytes, max_frame_bytes: int) -> tuple[int, int, int, int, int, int]:
    """``(version, opcode, flags, status, request_id, body_len)`` of a reply header."""
    magic, version, opcode, flags, status, request_id, body_len = HEADER.unpack(header)
    if magic != MAGIC:
        raise ProtocolError(f"reply frame with bad magic {magic:#06x}")
    if opcode & REPLY_BIT == 0:
        raise ProtocolError(f"opcode {opcode:#04x} is not a reply opcode")
    if HEADER_LEN + body_len > max_frame_bytes:
        raise ProtocolError(
            f"reply frame of {HEADER_LEN + body_len} bytes is over the client's limit of {max_frame_bytes}"
        )
    return version, opcode, flags, status, request_id, body_len


def take_frame(buf: bytearray, max_frame_bytes: int) -> Frame | None:
    """Removes and returns the first complete frame of ``buf``; ``None`` until one is in."""
    if len(buf) >= 2 and (buf[0] != 0x41 or buf[1] != 0x4B):
        raise ProtocolError("reply bytes are not a frame (bad magic)")
    if len(buf) < HEADER_LEN:
        return None
    version, opcode, flags, status, rid, body_len = parse_header(bytes(buf[:HEADER_LEN]), max_frame_bytes)
    end = HEADER_LEN + body_len
    if len(buf) < end:
        return None
    body = bytes(buf[HEADER_LEN:end])
    del buf[:end]
    return Frame(version, opcode, flags, status, rid, body)


def closes_connection(frame: Frame, opcode: int) -> bool:
    """Whether the server closes the connection after this reply (PROTOCOL.md, "Errors")."""
    if frame.connection_level:
        return True
    if frame.status in (Status.TOO_LARGE, Status.BAD_FRAME, Status.SHUTTING_DOWN):
        return True
    return frame.status == Status.UNAUTHENTICATED and opcode == Opcode.AUTH


def error_of(frame: Frame) -> StatusError:
    message = frame.body.decode("utf-8", errors="replace")
    return error_for_status(frame.status, message, request_id=frame.request_id)


_UNCOUNTED = (Opcode.HELLO, Opcode.PING, Opcode.AUTH)


class Req:
    """One request: what goes on the wire and how its reply decodes.

    ``slots``: how many of the server's ``max_inflight`` it holds (0 for HELLO, PING and
    AUTH, ``count`` for a SEARCH_BATCH, 1 otherwise). ``row``: for a request of
    ``search_batch``, the first matrix row it carries (``slots`` rows from there)."""

    __slots__ = ("opcode", "flags", "body", "parse", "version", "slots", "row")

    def __init__(
        self,
        opcode: Opcode,
        body: bytes = b"",
        flags: int = 0,
        parse: Callable[[int, bytes], Any] | None = None,
        version: int | None = None,
        slots: int | None = None,
        row: int | None = None,
    ) -> None:
        self.opcode = opcode
        self.flags = flags
        self.body = body
        self.parse = parse
        #: Forced version (the handshake); ``None``: the connection's.
        self.version = version
        self.slots: int = (0 if opcode in _UNCOUNTED else 1) if slots is None else slots
        self.row = row

    @property
    def counted(self) -> bool:
        """Whether it counts against the server's ``max_inflight`` (all but HELLO, PING, AUTH)."""
        return self.slots > 0

    def encode(self, version: int, request_id: int) -> bytes:
        v = self.version if self.version is not None else version
        return encode_frame(v, int(self.opcode), self.flags, request_id, self.body)

    def result(self, frame: Frame) -> Any:
        """The decoded reply; raises the status's exception for an error reply."""
        if frame.status != Status.OK:
            err = error_of(frame)
            err.row = self.row
            raise err
        if frame.opcode != (int(self.opcode) | REPLY_BIT):
            raise ProtocolError(
                f"request {frame.request_id} was {self.opcode.name}, the reply's opcode is {frame.opcode:#04x}"
            )
        if frame.flags != 0:
            raise ProtocolError(f"reply flags must be 0, got {frame.flags:#06x}")
        if self.parse is None:
            if frame.body:
                raise ProtocolError(f"{self.opcode.name} reply body must be empty")
            return None
        try:
            return self.parse(frame.version, frame.body)
        except (struct.error, ValueError) as e:
            if isinstance(e, StatusError):
                raise
            raise ProtocolError(f"{self.opcode.name} reply body: {e}") from None


class BatchReq(Req):
    """A SEARCH_BATCH: its result is the :class:`RowBlock` of its rows, which remembers the
    reply's request id (for the exception of a failed row)."""

    __slots__ = ()

    def result(self, frame: Frame) -> Any:
        block: RowBlock = super().result(frame)
        block.request_id = frame.request_id
        return block


# ---------------------------------------------------------------------------- inputs


def _local(cls: type, message: str) -> StatusError:
    err: StatusError = cls(message, local=True)
    return err


def as_vector(v: VectorLike, dim: int, what: str = "vector") -> npt.NDArray[np.float32]:
    """``v`` as a C-contiguous little-endian float32 vector of ``dim`` finite values
    (converted once, only when it is not one already)."""
    a = np.asarray(v)
    if a.dtype.kind not in "fiu":
        raise _local(InvalidRequest, f"{what} must hold real numbers, not dtype {a.dtype}")
    if a.ndim != 1 or a.shape[0] != dim:
        raise _local(
            DimensionMismatch,
            f"{what} has shape {a.shape}; the server's dimension is {dim}",
        )
    if a.dtype != F32 or not a.flags.c_contiguous:
        with np.errstate(all="ignore"):
            a = np.ascontiguousarray(a, dtype=F32)
    if not np.isfinite(a).all():
        bad = int(np.flatnonzero(~np.isfinite(a))[0])
        raise _local(NonFinite, f"{what}[{bad}] is {float(a[bad])!r} (NaN and infinities are refused)")
    return a


def as_matrix(m: VectorLike, dim: int, what: str = "matrix") -> npt.NDArray[np.float32]:
    """``m`` as a C-contiguous float32 ``(n, dim)`` matrix of finite values."""
    a = np.asarray(m)
    if a.dtype.kind not in "fiu":
        raise _local(InvalidRequest, f"{what} must hold real numbers, not dtype {a.dtype}")
    if a.ndim != 2 or a.shape[1] != dim:
        raise _local(
            DimensionMismatch,
            f"{what} has shape {a.shape}; (n, {dim}) is needed",
        )
    if a.dtype != F32 or not a.flags.c_contiguous:
        with np.errstate(all="ignore"):
            a = np.ascontiguousarray(a, dtype=F32)
    if a.size and not np.isfinite(a).all():
        row, col = (int(x) for x in np.argwhere(~np.isfinite(a))[0])
        raise _local(NonFinite, f"{what}[{row}, {col}] is {float(a[row, col])!r}")
    return a


def _uint(value: int, bits: int, what: str) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise _local(InvalidRequest, f"{what} must be an integer, not {value!r}") from None
    if isinstance(value, bool) or v != value or not 0 <= v < (1 << bits):
        raise _local(InvalidRequest, f"{what} = {value!r} is not a u{bits}")
    return v


def as_bytes(data: Any, what: str) -> bytes:
    """``data`` (bytes, bytearray or memoryview) as bytes; anything else is refused (a str
    has no one encoding, and ``bytes(5)`` would be five zero bytes)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise _local(InvalidRequest, f"{what} must be bytes, bytearray or memoryview, not {type(data).__name__}")


def check_metric(metric: Any) -> Metric:
    try:
        return Metric(metric)
    except ValueError:
        raise _local(InvalidRequest, f"unknown metric {metric!r}") from None


def _deadline_us(deadline: float | None) -> int:
    if deadline is None:
        return 0
    if isinstance(deadline, (str, bytes, bool)):
        raise _local(InvalidRequest, f"deadline must be a number of seconds, not {deadline!r}")
    try:
        d = float(deadline)
    except (TypeError, ValueError):
        raise _local(InvalidRequest, f"deadline must be a number of seconds, not {deadline!r}") from None
    if not d > 0 or not math.isfinite(d):
        raise _local(InvalidRequest, f"deadline must be a positive number of seconds, not {deadline!r}")
    us = int(math.ceil(d * 1e6))
    if us > U32_MAX:
        raise _local(InvalidRequest, f"deadline {deadline!r} s is over the protocol's {U32_MAX} µs")
    return us


# ---------------------------------------------------------------------------- replies


def _hello(version: int, body: bytes) -> tuple[dict[str, Any], bytes | None]:
    v4 = (37, 37 + NONCE_LEN)  # versions 5 and 6 add nothing to version 4's HELLO
    want = v4 if version >= 4 else {2: (32,), 3: (33, 33 + NONCE_LEN)}.get(version, (28,))
    if len(body) not in want:
        raise ProtocolError(f"HELLO reply of version {version} has {len(body)} bytes")
    vmin, vmax, metric, reserved = struct.unpack_from("<BBBB", body, 0)
    if reserved != 0:
        raise ProtocolError(f"HELLO reply: reserved byte is {reserved}")
    max_frame, dim, k_max, max_inflight, executors, shards = struct.unpack_from("<6I", body, 4)
    delta = struct.unpack_from("<I", body, 28)[0] if version >= 2 else 0
    challenge: bytes | None = None
    auth = False
    if version >= 3:
        mode = body[32]
        after = 33 + (4 if version >= 4 else 0)  # v4: max_batch ends the body
        if mode == 1 and len(body) == after + NONCE_LEN:
            challenge = bytes(body[33 : 33 + NONCE_LEN])
            auth = True
        elif not (mode == 0 and len(body) == after):
            raise ProtocolError(f"HELLO reply: auth mode {mode} with {len(body)} bytes")
    max_batch = struct.unpack_from("<I", body, len(body) - 4)[0] if version >= 4 else None
    try:
        m = Metric(metric)
    except ValueError:
        raise IncompatibleServer(f"the server's metric code {metric} is unknown to this client") from None
    fields = dict(
        version_min=vmin,
        version_max=vmax,
        metric=m,
        max_frame_bytes=max_frame,
        dim=dim,
        k_max=k_max,
        max_inflight=max_inflight,
        executors=executors,
        shards=shards,
        delta=delta,
        auth_required=auth,
        max_batch=max_batch,
    )
    return fields, challenge


def decode_search(version: int, body: bytes, k: int) -> SearchResult:
    if len(body) < 8:
        raise ProtocolError(f"SEARCH reply of {len(body)} bytes")
    hit, flags, reserved, m = struct.unpack_from("<BBHI", body, 0)
    try:
        kind = HitKind(hit)
    except ValueError:
        raise ProtocolError(f"SEARCH reply: unknown hit kind {hit}") from None
    defined = REPLY_DISTANCES_TO_QUERY | (REPLY_TOKEN if version >= 2 else 0)
    if flags & ~defined or reserved:
        raise ProtocolError(f"SEARCH reply: undefined flags {flags:#04x} or reserved {reserved}")
    token_len = 8 if flags & REPLY_TOKEN else 0
    routing_len = 8 if version >= 6 else 0  # v6: the routing version ends the body
    if len(body) != 8 + 12 * m + token_len + routing_len:
        raise ProtocolError(f"SEARCH reply of version {version}: {m} neighbours in {len(body)} bytes")
    if m > k:
        raise ProtocolError(f"SEARCH reply: {m} neighbours for k = {k}")
    arr = np.frombuffer(body, dtype=_NEIGHBOUR, count=m, offset=8)
    token = struct.unpack_from("<Q", body, 8 + 12 * m)[0] if token_len else None
    routing = struct.unpack_from("<Q", body, len(body) - 8)[0] if routing_len else 0
    return SearchResult(
        ids=arr["id"].astype(np.uint64),
        distances=arr["distance"].astype(np.float32),
        kind=kind,
        distances_to_query=bool(flags & REPLY_DISTANCES_TO_QUERY),
        token=token,
        routing_version=int(routing),
    )


def _position(version: int, body: bytes, at: int, what: str) -> int:
    """A write reply's position at ``at`` (version 5: its last 8 bytes; 0 below, where the
    body ends at ``at``)."""
    want = at + (8 if version >= 5 else 0)
    if len(body) != want:
        raise ProtocolError(f"{what} reply body of version {version} must be {want} bytes, got {len(body)}")
    return int(struct.unpack_from("<Q", body, at)[0]) if version >= 5 else 0


def _inserted(with_position: bool) -> Callable[[int, bytes], int | None]:
    def parse(version: int, body: bytes) -> int | None:
        position = _position(version, body, 0, "INSERT")
        return position if with_position else None

    return parse


def _deleted(with_position: bool) -> Callable[[int, bytes], bool | Deleted]:
    def parse(version: int, body: bytes) -> bool | Deleted:
        position = _position(version, body, 1, "DELETE")
        if body[0] > 1:
            raise ProtocolError(f"DELETE reply: existed must be 0 or 1, got {body[0]}")
        existed = body[0] == 1
        return Deleted(existed, position) if with_position else existed

    return parse


def _bool(what: str) -> Callable[[int, bytes], bool]:
    def parse(version: int, body: bytes) -> bool:
        if len(body) != 1 or body[0] > 1:
            raise ProtocolError(f"{what} reply body must be one 0/1 byte, got {body[:8]!r}")
        return body[0] == 1

    return parse


def parse_stats(version: int, body: bytes) -> dict[str, int | float | str]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("STATS text is not UTF-8") from None
    out: dict[str, int | float | str] = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        if not name:
            continue
        value = value.strip()
        num: int | float | str
        try:
            num = int(value)
        except ValueError:
            try:
                num = float(value)
            except ValueError:
                num = value
        out[name] = num
    return out


class _Body:
    """A cursor over a reply body; running past its end is a :class:`ProtocolError`
    naming the field."""

    __slots__ = ("body", "off", "what")

    def __init__(self, body: bytes, what: str) -> None:
        self.body = body
        self.off = 0
        self.what = what

    def take(self, n: int, field: str) -> bytes:
        if n > len(self.body) - self.off:
            raise ProtocolError(
                f"{self.what} reply of {len(self.body)} bytes ends inside {field} (at byte {self.off})"
            )
        out = self.body[self.off : self.off + n]
        self.off += n
        return out

    def unpack(self, fmt: str, field: str) -> tuple[Any, ...]:
        s = struct.Struct(fmt)
        return s.unpack(self.take(s.size, field))

    def text(self, field: str) -> str:
        """A u16 length and that many bytes of UTF-8, at most 255."""
        (n,) = self.unpack("<H", field + "'s length")
        if n > CLUSTER_NAME_BYTES_MAX:
            raise ProtocolError(f"{self.what} reply: {field} of {n} bytes (at most {CLUSTER_NAME_BYTES_MAX})")
        raw = self.take(n, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.what} reply: {field} is not UTF-8") from None

    def finish(self) -> None:
        if self.off != len(self.body):
            raise ProtocolError(f"{self.what} reply: {len(self.body) - self.off} bytes after its last field")


def decode_cluster(version: int, body: bytes) -> ClusterState:
    """A CLUSTER reply body (version 6; PROTOCOL.md "CLUSTER"), checked as the Rust client
    checks it: a known metric, reserved bytes 0, a dimension of at least 1, finite
    centroids, at most 1,024 nodes and 1,024 overrides, names of at most 255 bytes of
    UTF-8, ``live`` 0 or 1, nothing after the name."""
    c = _Body(body, "CLUSTER")
    routing_version, centroids_version, balance_epoch, self_id, lease_ms, code = c.unpack("<QQQQIB", "the header")
    if c.take(3, "reserved bytes") != b"\x00\x00\x00":
        raise ProtocolError("CLUSTER reply: reserved bytes must be 0")
    try:
        metric = Metric(code)
    except ValueError:
        raise ProtocolError(f"CLUSTER reply: unknown metric code {code}") from None
    dim, n = c.unpack("<II", "dim and n")
    if dim == 0 or 4 * dim * n > len(body) - c.off:
        raise ProtocolError(f"CLUSTER reply: {n} centroids of dimension {dim} do not fit the body")
    centroids = np.frombuffer(c.take(4 * dim * n, "the centroids"), dtype=F32).astype(np.float32).reshape(n, dim)
    if not np.isfinite(centroids).all():
        row = int(np.argwhere(~np.isfinite(centroids))[0][0])
        raise ProtocolError(f"CLUSTER reply: centroid {row} is not finite")
    (n_nodes,) = c.unpack("<I", "the node count")
    if n_nodes > CLUSTER_NODES_MAX:
        raise ProtocolError(f"CLUSTER reply: {n_nodes} nodes (at most {CLUSTER_NODES_MAX})")
    nodes: list[ClusterNode] = []
    for i in range(n_nodes):
        node_id, live, reserved = c.unpack("<QBB", f"node {i}")
        if live > 1:
            raise ProtocolError(f"CLUSTER reply: node {i}'s live byte is {live} (0 or 1)")
        if reserved:
            raise ProtocolError(f"CLUSTER reply: node {i}'s reserved byte is {reserved}")
        nodes.append(ClusterNode(node_id=node_id, live=live == 1, advertise=c.text(f"node {i}'s address")))
    (n_over,) = c.unpack("<I", "the override count")
    if n_over > CLUSTER_NODES_MAX:
        raise ProtocolError(f"CLUSTER reply: {n_over} overrides (at most {CLUSTER_NODES_MAX})")
    overrides = [c.unpack("<IQ", f"override {i}") for i in range(n_over)]
    name = c.text("the cluster name")
    c.finish()
    return ClusterState(
        name=name,
        routing_version=routing_version,
        centroids_version=centroids_version,
        balance_epoch=balance_epoch,
        self_id=self_id,
        lease_ms=lease_ms,
        metric=metric,
        dim=dim,
        centroids=centroids,
        nodes=nodes,
        overrides=[(int(cc), int(nn)) for cc, nn in overrides],
    )


# ---------------------------------------------------------------------------- batches

_KINDS = tuple(HitKind)  # by code: MISS, EXACT, ALIAS, APPROXIMATE
_NOT_DTQ = np.uint8(0xFF ^ REPLY_DISTANCES_TO_QUERY)
BATCH_ERRORS = ("raise", "return")


@dataclass
class RowBlock:
    """Consecutive rows of a search_batch: the arrays of a :class:`BatchResult` being
    filled (rows padded; a failed row: count 0, kind MISS, its status)."""

    ids: npt.NDArray[np.uint64]
    distances: npt.NDArray[np.float32]
    counts: npt.NDArray[np.int64]
    kinds: list[HitKind]
    tokens: list[int | None]
    distances_to_query: list[bool]
    statuses: npt.NDArray[np.uint16]
    #: The id of the SEARCH_BATCH reply that brought the rows.
    request_id: int = 0
    #: (v6) The reply's routing version (the largest of the blocks put in).
    routing_version: int = 0

    @classmethod
    def empty(cls, n: int, k: int) -> RowBlock:
        return cls(
            ids=np.full((n, k), NO_ID, dtype=np.uint64),
            distances=np.full((n, k), np.inf, dtype=np.float32),
            counts=np.zeros(n, dtype=np.int64),
            kinds=[HitKind.MISS] * n,
            tokens=[None] * n,
            distances_to_query=[False] * n,
            statuses=np.zeros(n, dtype=np.uint16),
        )

    def put_block(self, row: int, b: RowBlock) -> None:
        end = row + len(b.kinds)
        self.ids[row:end] = b.ids
        self.distances[row:end] = b.distances
        self.counts[row:end] = b.counts
        self.kinds[row:end] = b.kinds
        self.tokens[row:end] = b.tokens
        self.distances_to_query[row:end] = b.distances_to_query
        self.statuses[row:end] = b.statuses
        self.routing_version = max(self.routing_version, b.routing_version)

    def put_one(self, row: int, r: SearchResult) -> None:
        m = len(r)
        self.ids[row, :m] = r.ids
        self.distances[row, :m] = r.distances
        self.counts[row] = m
        self.kinds[row] = r.kind
        self.tokens[row] = r.token
        self.distances_to_query[row] = r.distances_to_query
        self.routing_version = max(self.routing_version, r.routing_version)

    def first_error(self, row: int) -> StatusError | None:
        """The exception of the first failed row (``row``: where the block starts)."""
        bad = np.flatnonzero(self.statuses)
        if bad.shape[0] == 0:
            return None
        i = int(bad[0])
        err = error_for_status(
            int(self.statuses[i]), f"search_batch row {row + i}", request_id=self.request_id
        )
        err.row = row + i
        return err

    def result(self) -> BatchResult:
        return BatchResult(
            ids=self.ids,
            distances=self.distances,
            kinds=self.kinds,
            counts=self.counts,
            tokens=self.tokens,
            distances_to_query=self.distances_to_query,
            statuses=self.statuses,
            routing_version=self.routing_version,
        )


@functools.lru_cache(maxsize=64)
def _items_dtype(k: int) -> np.dtype[np.void]:
    """A reply item with k neighbours and no token (the layout of a reply of full hits)."""
    return np.dtype([("status", "<u2"), ("hit", "u1"), ("flags", "u1"), ("m", "<u4"), ("nb", _NEIGHBOUR, (k,))])


def decode_batch(version: int, body: bytes, k: int, count: int) -> RowBlock:
    """A SEARCH_BATCH reply body: ``count``, (v6) the routing version, then ``count``
    items, each a status and a SEARCH answer."""
    start = 12 if version >= 6 else 4
    if len(body) < start:
        raise ProtocolError(f"SEARCH_BATCH reply of version {version} of {len(body)} bytes")
    got = struct.unpack_from("<I", body, 0)[0]
    if got != count:
        raise ProtocolError(f"SEARCH_BATCH reply of {got} items for {count} queries")
    routing = int(struct.unpack_from("<Q", body, 4)[0]) if version >= 6 else 0
    block: RowBlock | None = None
    if len(body) == start + count * (8 + 12 * k):
        items = np.frombuffer(body, _items_dtype(k), count, start)
        if (items["m"] == k).all() and not items["status"].any() and not (items["flags"] & REPLY_TOKEN).any():
            block = _full_block(items, k)
    if block is None:
        block = _item_block(body, k, count, start)
    # The server writes the largest of the answered items' versions: 0 when none was.
    if routing and not (block.statuses == 0).any():
        raise ProtocolError(f"SEARCH_BATCH reply: routing version {routing:#x} with no query answered")
    block.routing_version = routing
    return block


def _full_block(items: npt.NDArray[np.void], k: int) -> RowBlock:
    """Every item OK with k neighbours and no token: read as one array."""
    hits, flags = items["hit"], items["flags"]
    if int(hits.max()) >= len(_KINDS) or (flags & _NOT_DTQ).any():
        raise ProtocolError("SEARCH_BATCH reply: an unknown hit kind or undefined flags")
    count = items.shape[0]
    return RowBlock(
        ids=items["nb"]["id"].astype(np.uint64),
        distances=items["nb"]["distance"].astype(np.float32),
        counts=np.full(count, k, dtype=np.int64),
        kinds=[_KINDS[h] for h in hits.tolist()],
        tokens=[None] * count,
        distances_to_query=(flags & REPLY_DISTANCES_TO_QUERY).astype(bool).tolist(),
        statuses=np.zeros(count, dtype=np.uint16),
    )


#: The statuses one query of a SEARCH_BATCH can fail with (PROTOCOL.md, the item table);
#: the others refuse a whole frame, and an item carrying one is the server's error.
_ITEM_STATUSES = frozenset(
    (
        Status.NOT_FOUND,
        Status.BUSY,
        Status.NON_FINITE,
        Status.DEADLINE_EXCEEDED,
        Status.UNKNOWN_COLLECTION,
        Status.UNSUPPORTED,
        Status.UNAVAILABLE,
        Status.INTERNAL,
    )
)


def _item_block(body: bytes, k: int, count: int, start: int = 4) -> RowBlock:
    """The items one by one (failed rows, short rows, tokens), from byte ``start`` (12 in
    version 6, after the count and the routing version; 4 before)."""
    b = RowBlock.empty(count, k)
    off = start
    for i in range(count):
        status, hit, flags, m = struct.unpack_from("<HBBI", body, off)
        off += 8
        if status != Status.OK:
            if status not in _ITEM_STATUSES:
                raise ProtocolError(f"SEARCH_BATCH reply item {i}: status {status} is not a query's")
            if hit or flags or m:
                raise ProtocolError(f"SEARCH_BATCH reply item {i}: status {status} with a hit, flags or neighbours")
            b.statuses[i] = status
            continue
        if hit >= len(_KINDS) or flags & ~(REPLY_DISTANCES_TO_QUERY | REPLY_TOKEN):
            raise ProtocolError(f"SEARCH_BATCH reply item {i}: hit kind {hit}, flags {flags:#04x}")
        if m > k:
            raise ProtocolError(f"SEARCH_BATCH reply item {i}: {m} neighbours for k = {k}")
        if m:
            arr = np.frombuffer(body, dtype=_NEIGHBOUR, count=m, offset=off)
            b.ids[i, :m] = arr["id"]
            b.distances[i, :m] = arr["distance"]
        off += 12 * m
        b.counts[i] = m
        b.kinds[i] = _KINDS[hit]
        b.distances_to_query[i] = bool(flags & REPLY_DISTANCES_TO_QUERY)
        if flags & REPLY_TOKEN:
            b.tokens[i] = struct.unpack_from("<Q", body, off)[0]
            off += 8
    if off != len(body):
        raise ProtocolError(f"SEARCH_BATCH reply: {len(body) - off} bytes after the last item")
    return b


def batch_of(outs: Sequence[Any], reqs: Sequence[Req], k: int) -> BatchResult:
    """search_batch's answer from its requests' results, in row order: a :class:`RowBlock`
    (SEARCH_BATCH), a :class:`SearchResult` (one SEARCH per row), or, with
    ``errors="return"``, the :class:`StatusError` of a request's error reply (every row
    it carried failed with that status)."""
    if len(outs) == 1 and isinstance(outs[0], RowBlock):
        return outs[0].result()  # one SEARCH_BATCH carried every row: nothing to copy
    out = RowBlock.empty(sum(r.slots for r in reqs), k)
    for res, req in zip(outs, reqs, strict=True):
        row = req.row or 0
        if isinstance(res, RowBlock):
            out.put_block(row, res)
        elif isinstance(res, SearchResult):
            out.put_one(row, res)
        else:
            out.statuses[row : row + req.slots] = res.code
    return out.result()


def batch_result(outs: Sequence[Any], reqs: Sequence[Req], k: int, errors: str) -> BatchResult:
    """:func:`batch_of`; with ``errors="raise"``, raises the first failed row's exception."""
    if errors == "raise":
        for res, req in zip(outs, reqs, strict=True):
            err = res.first_error(req.row or 0) if isinstance(res, RowBlock) else None
            if err is not None:
                raise err
    return batch_of(outs, reqs, k)


# ---------------------------------------------------------------------------- requests


class Codec:
    """Builds the requests of one connection, checked against its HELLO."""

    def __init__(self, info: ServerInfo) -> None:
        self.info = info

    def _sized(self, req: Req) -> Req:
        size = HEADER_LEN + len(req.body)
        if size > self.info.max_frame_bytes:
            raise _local(
                TooLarge,
                f"{req.opcode.name} request of {size} bytes is over the server's max_frame_bytes "
                f"{self.info.max_frame_bytes}",
            )
        return req

    def _k(self, k: int) -> int:
        kk = _uint(k, 32, "k")
        if not 1 <= kk <= self.info.k_max:
            raise _local(BadK, f"k = {kk} is outside 1..={self.info.k_max} (the server's k_max)")
        return kk

    def ping(self, payload: BytesLike = b"") -> Req:
        data = as_bytes(payload, "PING payload")

        def parse(version: int, body: bytes) -> bytes:
            if body != data:
                raise ProtocolError("PING reply does not echo the payload")
            return body

        return self._sized(Req(Opcode.PING, data, parse=parse))

    def _at_position(self, at_position: int | None) -> bytes:
        """AT_POSITION's 8 bytes (none without a position); refused below version 5."""
        if at_position is None:
            return b""
        p = _uint(at_position, 64, "at_position")
        if self.info.version < 5:
            raise _local(
                InvalidRequest,
                f"at_position needs protocol version 5; this connection speaks version {self.info.version} "
                "(the server's newest): nothing was sent",
            )
        return struct.pack("<Q", p)

    def search_vec(
        self,
        vec: npt.NDArray[np.float32],
        k: int,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: float | None = None,
        collection: int = 0,
        at_position: int | None = None,
    ) -> Req:
        """SEARCH for an already checked vector (:func:`as_vector`)."""
        kk = self._k(k)
        flags = _search_flags(bypass_cache, refresh_entry, at_position)
        head = struct.pack(
            "<IIII", _uint(collection, 32, "collection"), kk, _deadline_us(deadline), vec.shape[0]
        )
        tail = self._at_position(at_position)

        def parse(version: int, body: bytes) -> SearchResult:
            return decode_search(version, body, kk)

        return self._sized(Req(Opcode.SEARCH, head + vec.tobytes() + tail, flags, parse))

    def search(self, vector: VectorLike, k: int, **kw: Any) -> Req:
        return self.search_vec(as_vector(vector, self.info.dim), k, **kw)

    def batch_count(self, k: int, window: int, reply_limit: int, extra: int = 0) -> int:
        """The most rows one SEARCH_BATCH at ``k`` may carry (PROTOCOL.md, SEARCH_BATCH):
        ``max_batch``, the window, and both the request frame (``40 + 4·dim·count``, and
        ``extra`` bytes: 8 for AT_POSITION's position) and the largest reply
        (``24 + count·(16 + 12·k)``) within ``max_frame_bytes`` (and the client's
        ``reply_limit``). 0: no SEARCH_BATCH (below version 4, or not one row fits)."""
        info = self.info
        if info.version < 4 or not info.max_batch:
            return 0
        by_request = (info.max_frame_bytes - HEADER_LEN - 20 - extra) // (4 * info.dim)
        by_reply = (min(info.max_frame_bytes, reply_limit) - HEADER_LEN - 4) // (16 + 12 * k)
        return max(0, min(info.max_batch, window, by_request, by_reply))

    def search_batch_rows(
        self,
        mat: npt.NDArray[np.float32],
        k: int,
        count: int,
        bypass_cache: bool = False,
        refresh_entry: bool = False,
        deadline: float | None = None,
        collection: int = 0,
        at_position: int | None = None,
    ) -> list[Req]:
        """SEARCH_BATCH requests of at most ``count`` rows each, for an already checked
        matrix (:func:`as_matrix`), in row order (``at_position``: for every one)."""
        kk = self._k(k)
        flags = _search_flags(bypass_cache, refresh_entry, at_position)
        fields = (_uint(collection, 32, "collection"), kk, _deadline_us(deadline), mat.shape[1])
        tail = self._at_position(at_position)
        reqs: list[Req] = []
        for row in range(0, mat.shape[0], count):
            chunk = mat[row : row + count]
            c = chunk.shape[0]
            body = struct.pack("<5I", *fields, c) + chunk.tobytes() + tail
            reqs.append(self._sized(BatchReq(Opcode.SEARCH_BATCH, body, flags, _batch_parse(kk, c), slots=c, row=row)))
        return reqs

    def insert(
        self, id: int, vector: VectorLike, payload: Payload = None, collection: int = 0, with_position: bool = False
    ) -> Req:
        """INSERT; its result is ``None``, or with ``with_position`` the write's position
        (an int: 0 below version 5)."""
        vec = as_vector(vector, self.info.dim)
        data = b"" if payload is None else as_bytes(payload, "payload")
        head = struct.pack(
            "<QIII", _uint(id, 64, "id"), _uint(collection, 32, "collection"), vec.shape[0], len(data)
        )
        return self._sized(Req(Opcode.INSERT, head + vec.tobytes() + data, parse=_inserted(with_position)))

    def delete(self, id: int, collection: int = 0, with_position: bool = False) -> Req:
        """DELETE; its result is ``existed``, or with ``with_position`` a :class:`Deleted`."""
        body = struct.pack("<QI", _uint(id, 64, "id"), _uint(collection, 32, "collection"))
        return Req(Opcode.DELETE, body, parse=_deleted(with_position))

    def fill(
        self,
        query: VectorLike,
        k: int,
        ids: VectorLike,
        distances: VectorLike,
        vectors: VectorLike,
        token: int | None = None,
        collection: int = 0,
    ) -> Req:
        dim = self.info.dim
        q = as_vector(query, dim, "query")
        kk = self._k(k)
        id_arr = np.asarray(ids)
        if id_arr.dtype.kind not in "iu" and id_arr.size:
            raise _local(InvalidRequest, f"ids must be integers, not dtype {id_arr.dtype}")
        id_arr = id_arr.reshape(-1)
        if id_arr.size and (int(id_arr.min()) < 0 or int(id_arr.max()) > U64_MAX):
            raise _local(InvalidRequest, "ids must be u64")
        id_arr = id_arr.astype(U64)
        m = id_arr.shape[0]
        dist_in = np.asarray(distances)
        if dist_in.dtype.kind not in "fiu" and dist_in.size:
            raise _local(InvalidRequest, f"distances must be real numbers, not dtype {dist_in.dtype}")
        dist = dist_in.astype(np.float64).reshape(-1)
        if dist.shape[0] != m:
            raise _local(InvalidRequest, f"{m} ids but {dist.shape[0]} distances")
        vec_arr = np.asarray(vectors)
        if m == 0 and vec_arr.size == 0:
            vec_arr = np.zeros((0, dim), F32)
        vecs = as_matrix(vec_arr, dim, "vectors")
        if vecs.shape[0] != m:
            raise _local(InvalidRequest, f"{m} ids but {vecs.shape[0]} vectors")
        with np.errstate(all="ignore"):
            d32 = dist.astype(F32)
        if not np.isfinite(d32).all():
            raise _local(NonFinite, "every FILL distance must be finite")
        if m > 1 and bool((np.diff(d32) < 0).any()):
            raise _local(InvalidRequest, "FILL candidates must be ascending by distance")
        if np.unique(id_arr).shape[0] != m:
            raise _local(InvalidRequest, "FILL candidate ids must be distinct")
        rows = np.empty(m, dtype=np.dtype([("id", "<u8"), ("distance", "<f4"), ("vector", "<f4", (dim,))]))
        rows["id"] = id_arr
        rows["distance"] = d32
        rows["vector"] = vecs
        flags = 0
        tail = b""
        if token is not None:
            flags = FLAG_FILL_TOKEN
            tail = struct.pack("<Q", _uint(token, 64, "token"))
        head = struct.pack("<IIII", _uint(collection, 32, "collection"), kk, dim, m)
        body = head + q.tobytes() + rows.tobytes() + tail
        return self._sized(Req(Opcode.FILL, body, flags, _bool("FILL")))

    def flush(self) -> Req:
        return Req(Opcode.FLUSH)

    def cluster(self) -> Req:
        """CLUSTER (version 6); its result is a :class:`ClusterState`. Refused here, with
        :class:`~aker.Unsupported` as a node in no cluster answers, below version 6."""
        if self.info.version < 6:
            raise _local(
                Unsupported,
                f"CLUSTER needs protocol version 6; this connection speaks version {self.info.version} "
                "(the server's newest): nothing was sent",
            )
        return Req(Opcode.CLUSTER, parse=decode_cluster)

    def stats(self) -> Req:
        return Req(Opcode.STATS, parse=parse_stats)


# ---------------------------------------------------------------------------- handshake


def _hello_req(version: int) -> Req:
    return Req(Opcode.HELLO, parse=_hello, version=version)


Handshake = Generator[Req, Frame, ServerInfo]


def handshake(
    secret: bytes | None,
    expect_dim: int | None = None,
    expect_metric: Metric | None = None,
) -> Handshake:
    """HELLO in the newest version both ends speak (at least 2), then AUTH when the server
    asks for it. Yields requests, is sent their replies, returns the :class:`ServerInfo`."""
    version = VERSIONS[0]
    frame = yield _hello_req(version)
    if frame.status == Status.BAD_VERSION and not frame.connection_level:
        # The reply carries the newest version the server speaks.
        newest = frame.version
        version = max((v for v in VERSIONS if v <= newest), default=0)
        if version == 0 or version == VERSIONS[0]:
            spoken = " or ".join(str(v) for v in sorted(VERSIONS))
            raise IncompatibleServer(f"the server speaks protocol versions up to {newest}; this client needs {spoken}")
        frame = yield _hello_req(version)
    fields, challenge = _hello_req(version).result(frame)
    if not fields["version_min"] <= version <= fields["version_max"]:
        raise IncompatibleServer(
            f"the server answered HELLO in version {version} but says it speaks "
            f"{fields['version_min']}..={fields['version_max']}"
        )
    info = ServerInfo(version=version, **fields)
    if info.dim < 1 or info.k_max < 1 or info.max_inflight < 1 or info.max_frame_bytes < MIN_SERVER_FRAME:
        raise IncompatibleServer(f"the server's HELLO limits are not usable: {info!r}")
    # One SEARCH of the server's dimension: header, 16 bytes of fields, dim float32.
    one_search = HEADER_LEN + 16 + 4 * info.dim
    if info.max_frame_bytes < one_search:
        raise IncompatibleServer(
            f"the server's max_frame_bytes {info.max_frame_bytes} cannot hold one SEARCH of dimension {info.dim} "
            f"({one_search} bytes)"
        )
    if expect_dim is not None and info.dim != expect_dim:
        raise IncompatibleServer(f"the server's dimension is {info.dim}, not the expected {expect_dim}")
    if expect_metric is not None and info.metric != check_metric(expect_metric):
        raise IncompatibleServer(
            f"the server's metric is {info.metric.name}, not the expected {check_metric(expect_metric).name}"
        )
    if challenge is None:
        if secret is not None:
            raise ServerNotAuthentic(
                f"a secret was given but the server (protocol version {version}) did not ask for AUTH: "
                "it cannot prove it knows the secret"
            )
        return info
    if secret is None:
        raise AuthRequired("the server requires authentication (protocol version 3 AUTH) and no secret was given")
    nonce = _auth.random_nonce()
    proof = _auth.client_proof(secret, challenge, nonce)
    frame = yield Req(Opcode.AUTH, nonce + proof, parse=_raw_proof, version=version)
    server_proof = Req(Opcode.AUTH, parse=_raw_proof).result(frame)
    if not _auth.verify_server(secret, challenge, nonce, server_proof):
        raise ServerNotAuthentic("the server's AUTH proof does not hold: it does not know the secret")
    return info


def _raw_proof(version: int, body: bytes) -> bytes:
    if len(body) != PROOF_LEN:
        raise ProtocolError(f"AUTH reply of {len(body)} bytes, not {PROOF_LEN}")
    return body


def _search_flags(bypass_cache: bool, refresh_entry: bool, at_position: int | None = None) -> int:
    return (
        (FLAG_BYPASS_CACHE if bypass_cache else 0)
        | (FLAG_REFRESH_ENTRY if refresh_entry else 0)
        | (FLAG_AT_POSITION if at_position is not None else 0)
    )


def _batch_parse(k: int, count: int) -> Callable[[int, bytes], RowBlock]:
    def parse(version: int, body: bytes) -> RowBlock:
        return decode_batch(version, body, k, count)

    return parse


def check_errors(errors: str) -> str:
    if errors not in BATCH_ERRORS:
        raise _local(InvalidRequest, f'errors must be "raise" or "return", not {errors!r}')
    return errors


def batch_requests(
    codec: Codec, matrix: VectorLike, k: int, window: int, reply_limit: int, errors: str, **kw: Any
) -> tuple[list[Req], int]:
    """search_batch's requests for ``matrix`` (converted and checked once): SEARCH_BATCH
    chunks (:meth:`Codec.batch_count` rows each) when the server speaks version 4, else
    one SEARCH per row; and the checked k. ``at_position`` (in ``kw``) needs version 5."""
    check_errors(errors)
    mat = as_matrix(matrix, codec.info.dim)
    kk = codec._k(k)
    at = codec._at_position(kw.get("at_position"))  # refused below version 5, rows or none
    count = codec.batch_count(kk, window, reply_limit, len(at))
    if count:
        return codec.search_batch_rows(mat, kk, count, **kw), kk
    reqs = [codec.search_vec(mat[i], kk, **kw) for i in range(mat.shape[0])]
    for i, req in enumerate(reqs):
        req.row = i
    return reqs, kk
