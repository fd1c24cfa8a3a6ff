"""The blocking client, its pipeline and a connection pool.

One :class:`Client` is one TCP connection. Every call may carry many requests on the wire
at once (:meth:`Client.search_batch`, :meth:`Client.pipeline`): up to the window (the
server's ``max_inflight`` by default; a SEARCH_BATCH of ``count`` rows takes ``count`` of
it), their replies matched by request id in whatever order the server answers. The socket
is non-blocking and driven by a selector, so the client reads replies while it writes
requests and never deadlocks against a server that stops reading until its replies are
read.
"""

from __future__ import annotations

import enum
import numbers
import os
import selectors
import socket
import ssl as _ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypedDict

import numpy as np
import numpy.typing as npt

from ._auth import load_secret
from ._codec import (
    BytesLike,
    Codec,
    Frame,
    Handshake,
    Payload,
    Req,
    VectorLike,
    as_vector,
    batch_requests,
    batch_result,
    check_metric,
    closes_connection,
    error_of,
    handshake,
    take_frame,
)
from ._pipeline import PipelineRequests
from ._protocol import VERSIONS, BatchResult, ClusterState, Deleted, HitKind, Metric, SearchResult, ServerInfo
from .errors import (
    AkerConnectionError,
    AkerError,
    ConnectionClosed,
    InvalidRequest,
    ProtocolError,
    StatusError,
    Timeout,
    TLSError,
)

if TYPE_CHECKING:
    # **kwargs typed by a TypedDict (PEP 692); for type checkers only (never imported).
    from typing_extensions import Unpack

__all__ = [
    "Client",
    "ClientOptions",
    "CallOptions",
    "WriteOptions",
    "SearchOptions",
    "BatchOptions",
    "FillOptions",
    "Pipeline",
    "Pool",
    "Backend",
    "DEFAULT",
    "TimeoutArg",
]

#: ``secret=``: bytes, or a str (as UTF-8).
SecretLike: TypeAlias = bytes | bytearray | str | None
#: ``secret_file=``: a path.
PathLike: TypeAlias = str | os.PathLike[str] | None
#: ``backend(query, n) -> (ids, distances, vectors)``: a cache-aside client's own search
#: of its database for the ``n`` nearest rows, ascending by distance (the query is the
#: checked float32 vector; the three results anything :func:`numpy.asarray` takes).
Backend: TypeAlias = Callable[[npt.NDArray[np.float32], int], tuple[npt.ArrayLike, npt.ArrayLike, npt.ArrayLike]]


def _check_window(window: int | None) -> None:
    if window is None:
        return
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise InvalidRequest(f"window must be an integer of at least 1, not {window!r}", local=True)


def _check_size(size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
        raise InvalidRequest(f"size must be an integer of at least 1, not {size!r}", local=True)


class _Default(enum.Enum):
    """The type of :data:`DEFAULT` (an enum of one member: a type checker narrows
    ``timeout is DEFAULT``)."""

    DEFAULT = "DEFAULT"

    def __repr__(self) -> str:
        return "DEFAULT"


#: The ``timeout`` of a call when it is not given: the client's ``timeout``.
DEFAULT: Final = _Default.DEFAULT
#: A call's ``timeout=``: seconds, ``None`` (wait for ever) or :data:`DEFAULT` (the
#: client's ``timeout``).
TimeoutArg: TypeAlias = float | None | _Default


class ClientOptions(TypedDict, total=False):
    """The keyword arguments of :class:`Client` (and :meth:`AsyncClient.connect
    <aker.AsyncClient.connect>`), which :class:`Pool`, :class:`~aker.AsyncPool` and
    :class:`~aker.Cluster` pass on to every connection they open."""

    secret: SecretLike
    secret_file: PathLike
    connect_timeout: float | None
    timeout: float | None
    window: int | None
    expect_dim: int | None
    expect_metric: Metric | None
    max_reply_bytes: int
    ssl: _ssl.SSLContext | None
    server_hostname: str | None

class CallOptions(TypedDict, total=False):
    """The keyword arguments every call takes (:class:`Pool`'s and
    :class:`~aker.AsyncPool`'s calls pass them on to the connection's)."""

    timeout: TimeoutArg


class WriteOptions(CallOptions, total=False):
    """Keyword arguments of ``insert``, ``delete`` and their ``_with_position`` forms."""

    collection: int


class SearchOptions(WriteOptions, total=False):
    """Keyword arguments of ``search``."""

    bypass_cache: bool
    refresh_entry: bool
    deadline: float | None
    at_position: int | None


class BatchOptions(SearchOptions, total=False):
    """Keyword arguments of ``search_batch``."""

    errors: str


class FillOptions(WriteOptions, total=False):
    """Keyword arguments of ``fill``."""

    token: int | None


_READ = 256 * 1024


def _tls_handshake(
    sock: socket.socket, ctx: _ssl.SSLContext, server_hostname: str, address: tuple[str, int]
) -> socket.socket:
    """TLS over a connected socket (still blocking, with the connect timeout)."""
    host, port = address
    try:
        return ctx.wrap_socket(sock, server_hostname=server_hostname)
    except TimeoutError:
        sock.close()
        raise Timeout(f"TLS handshake with {host}:{port} timed out") from None
    except _ssl.SSLError as e:
        sock.close()
        raise TLSError(f"TLS handshake with {host}:{port} failed: {e}") from e
    except OSError as e:
        sock.close()
        # Closed without a TLS alert: an akerd over connections_max closes TLS clients
        # without a frame, a server without TLS may too: not a certificate problem.
        raise AkerConnectionError(
            f"{host}:{port} closed the connection during the TLS handshake (overloaded, or not TLS on that port): {e}"
        ) from e


class Client:
    """A blocking connection to akerd.

    Args:
        host, port: where akerd listens.
        secret: the shared secret (bytes, or str as UTF-8) when the server requires AUTH;
            with one, a server that does not ask for AUTH is refused
            (:class:`~aker.ServerNotAuthentic`).
        secret_file: or a file whose first line is the secret (as akerd reads it).
        connect_timeout: seconds for the TCP connect and the handshake (HELLO, AUTH).
        timeout: seconds a request may wait for its reply (``None``: forever); each call
            can override it. A timed-out request's late reply is dropped.
        window: most requests in flight on this connection (a SEARCH_BATCH of n rows
            counts n); at most (and by default) the server's ``max_inflight``.
        expect_dim, expect_metric: refuse a server with another dimension / metric
            (:class:`~aker.IncompatibleServer`).
        max_reply_bytes: largest reply frame accepted.
        ssl: an :class:`ssl.SSLContext` for a server with ``[tls]`` (e.g.
            ``ssl.create_default_context(cafile="ca.crt")``; for mutual TLS also
            ``ctx.load_cert_chain("client.crt", "client.key")``). ``None``: plaintext.
        server_hostname: the name the server's certificate must carry (default: ``host``).

    A client is safe to share between threads (calls are serialized); a :class:`Pool`
    gives threads connections of their own.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7700,
        *,
        secret: SecretLike = None,
        secret_file: PathLike = None,
        connect_timeout: float | None = 5.0,
        timeout: float | None = 10.0,
        window: int | None = None,
        expect_dim: int | None = None,
        expect_metric: Metric | None = None,
        max_reply_bytes: int = 64 << 20,
        ssl: _ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self._secret = load_secret(secret, secret_file)
        self._tls = ssl is not None
        #: TLS: a send that needs a read first (SSLWantReadError), or a recv that needs a
        #: write (SSLWantWriteError): the selector waits for what the SSL layer needs.
        self._send_needs_read = False
        self._recv_needs_write = False
        _check_window(window)
        if expect_metric is not None:
            check_metric(expect_metric)
        self.address: tuple[str, int] = (host, int(port))
        self.timeout = timeout
        self._max_reply = int(max_reply_bytes)
        self._lock = threading.RLock()
        self._rbuf = bytearray()
        self._wbuf = bytearray()
        self._next_id = 1
        #: Requests that timed out or were given up, not yet answered: id -> window slots.
        self._abandoned: dict[int, int] = {}
        #: Window slots (``Req.slots``) of the requests sent and not answered yet.
        self._counted_out = 0
        self._dead: AkerError | None = None
        self._write_error: OSError | None = None
        self._version = VERSIONS[0]
        self._window = 1
        self._sock = self._connect(connect_timeout, ssl, server_hostname or host)
        self._events = selectors.EVENT_READ
        try:
            self._sel = selectors.DefaultSelector()
        except BaseException:
            self._sock.close()
            raise
        try:
            self._sel.register(self._sock, self._events)
            self.info: ServerInfo = self._handshake(handshake(self._secret, expect_dim, expect_metric), connect_timeout)
        except BaseException:
            self.close()
            raise
        self._version = self.info.version
        self._codec = Codec(self.info)
        want = self.info.max_inflight if window is None else int(window)
        self._window = min(want, self.info.max_inflight)

    # ------------------------------------------------------------------ plumbing

    def _connect(
        self, connect_timeout: float | None, ctx: _ssl.SSLContext | None, server_hostname: str
    ) -> socket.socket:
        host, port = self.address
        try:
            sock = socket.create_connection(self.address, timeout=connect_timeout)
        except TimeoutError:
            raise Timeout(f"connecting to {host}:{port} timed out after {connect_timeout} s") from None
        except OSError as e:
            raise AkerConnectionError(f"cannot connect to {host}:{port}: {e}") from e
        if ctx is not None:
            sock = _tls_handshake(sock, ctx, server_hostname, self.address)
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return sock

    def _handshake(self, steps: Handshake, timeout: float | None) -> ServerInfo:
        deadline = None if timeout is None else time.monotonic() + timeout
        req = next(steps)
        while True:
            rid = self._new_id()
            self._wbuf += req.encode(self._version, rid)
            while True:
                frame = self._read_frame(deadline)
                if frame.request_id == rid or frame.connection_level:
                    break
                err = ProtocolError(f"reply to request {frame.request_id} during the handshake")
                self._kill(err)
                raise err
            if closes_connection(frame, req.opcode):
                self._kill(ConnectionClosed("the server closed the connection during the handshake"))
            try:
                req = steps.send(frame)
            except StopIteration as stop:
                info: ServerInfo = stop.value
                return info

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id = 1 if rid >= 0xFFFF_FFFF_FFFF_FFFF else rid + 1
        return rid

    def _kill(self, why: AkerError) -> None:
        if self._dead is None:
            self._dead = why
        try:
            self._sel.close()
        except Exception:
            pass
        try:
            self._sock.close()
        except OSError:
            pass

    def _check(self) -> None:
        if self._dead is not None:
            raise ConnectionClosed(f"the connection is closed: {self._dead}")

    def _pump(self, deadline: float | None) -> None:
        """Writes what is queued and reads what has come, until something was read."""
        self._check()
        writable = self._wbuf and self._write_error is None and not self._send_needs_read
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if writable or self._recv_needs_write else 0)
        if want != self._events:
            try:
                self._sel.modify(self._sock, want)
            except (OSError, ValueError, KeyError) as e:
                self._kill(ConnectionClosed("the connection is closed"))
                raise ConnectionClosed(f"the connection is closed: {self._dead}") from e
            self._events = want
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise Timeout("no reply within the timeout")
        try:
            ready = self._sel.select(left)
        except (OSError, ValueError) as e:  # the selector was closed by close() elsewhere
            self._kill(ConnectionClosed("the connection is closed"))
            raise ConnectionClosed(f"the connection is closed: {self._dead}") from e
        if not ready:
            raise Timeout("no reply within the timeout")
        for _key, ev in ready:
            if ev & selectors.EVENT_READ:
                self._send_needs_read = False
            if ev & selectors.EVENT_WRITE:
                self._recv_needs_write = False
            if ev & selectors.EVENT_WRITE and self._wbuf and not self._send_needs_read:
                try:
                    n = self._sock.send(self._wbuf)
                    del self._wbuf[:n]
                except (BlockingIOError, InterruptedError, _ssl.SSLWantWriteError):
                    pass
                except _ssl.SSLWantReadError:
                    self._send_needs_read = True
                except OSError as e:
                    # Keep reading: the server's last reply (and its close) may be there.
                    self._write_error = e
                    self._wbuf.clear()
            if ev & selectors.EVENT_READ:
                try:
                    data = self._sock.recv(_READ)
                    # TLS: records already decrypted wait in the SSL object, where
                    # select() does not see them: take them now.
                    while data and self._tls and self._sock.pending():  # type: ignore[attr-defined]
                        data += self._sock.recv(self._sock.pending())  # type: ignore[attr-defined]
                except (BlockingIOError, InterruptedError, _ssl.SSLWantReadError):
                    # TLS: a record not complete yet, or only a session ticket.
                    continue
                except _ssl.SSLWantWriteError:
                    self._recv_needs_write = True
                    continue
                except OSError as e:
                    if self._dead is not None:  # close() from another thread
                        self._kill(self._dead)
                        raise ConnectionClosed(f"the connection is closed: {self._dead}") from e
                    self._kill(ConnectionClosed(f"connection lost: {e}"))
                    raise ConnectionClosed(f"connection lost: {e}") from e
                if not data:
                    if self._dead is not None:  # close() from another thread
                        self._kill(self._dead)
                        raise ConnectionClosed(f"the connection is closed: {self._dead}")
                    why = "the server closed the connection"
                    if self._write_error is not None:
                        why += f" (writing failed: {self._write_error})"
                    self._kill(ConnectionClosed(why))
                    raise ConnectionClosed(why)
                self._rbuf += data

    def _read_frame(self, deadline: float | None) -> Frame:
        while True:
            try:
                frame = take_frame(self._rbuf, self._max_reply)
            except ProtocolError as e:
                self._kill(e)
                raise
            if frame is not None:
                return frame
            self._pump(deadline)

    def _fits(self, req: Req) -> bool:
        """Whether ``req``'s window slots are free now (one wider than the whole window,
        which search_batch never makes, would go alone rather than wait forever)."""
        return self._counted_out + req.slots <= max(self._window, req.slots)

    def _exchange(self, reqs: list[Req], timeout: TimeoutArg = DEFAULT, return_exceptions: bool = False) -> list[Any]:
        """Sends ``reqs`` (at most the window's slots in flight) and returns their results in order."""
        t: float | None = self.timeout if timeout is DEFAULT else timeout
        n = len(reqs)
        results: list[Any] = [None] * n
        with self._lock:
            self._check()
            own: dict[int, tuple[int, float]] = {}
            sent = 0
            left = n
            waiting_since = time.monotonic()
            try:
                while left:
                    now = time.monotonic()
                    while sent < n and self._fits(reqs[sent]):
                        rid = self._new_id()
                        self._wbuf += reqs[sent].encode(self._version, rid)
                        own[rid] = (sent, now)
                        self._counted_out += reqs[sent].slots
                        sent += 1
                    # Each request has `t` from when it was sent; the oldest bounds the wait.
                    start = next(iter(own.values()))[1] if own else waiting_since
                    try:
                        frame = self._read_frame(None if t is None else start + t)
                    except Timeout:
                        if not own and sent < n and self._abandoned:
                            # Nothing of ours could be sent: the window is full of
                            # abandoned requests the server does not answer. The
                            # connection is unusable; close it (a pool drops it).
                            self._kill(ConnectionClosed(
                                "the window is full of requests the server never answered"))
                            raise Timeout(
                                f"no window slot within {t} s: the window is full of unanswered "
                                "requests; the connection was closed") from None
                        raise
                    rid = frame.request_id
                    if frame.connection_level:
                        err = error_of(frame)
                        self._kill(err)
                        raise err
                    if rid in own:
                        idx, _ = own.pop(rid)
                        req = reqs[idx]
                        self._counted_out -= req.slots
                        left -= 1
                        waiting_since = time.monotonic()
                        if closes_connection(frame, req.opcode):
                            why = f"the server closed the connection after status {frame.status}"
                            self._kill(ConnectionClosed(why))
                        try:
                            results[idx] = req.result(frame)
                        except StatusError as e:
                            if not return_exceptions:
                                raise
                            results[idx] = e
                    elif rid in self._abandoned:
                        self._counted_out -= self._abandoned.pop(rid)
                        waiting_since = time.monotonic()
                    else:
                        err2 = ProtocolError(f"reply for request {rid}, which is not in flight")
                        self._kill(err2)
                        raise err2
            except BaseException:
                # What is still in flight is given up: its replies are dropped when they come.
                for rid, (idx, _) in own.items():
                    self._abandoned[rid] = reqs[idx].slots
                raise
        return results

    def _one(self, req: Req, timeout: TimeoutArg) -> Any:
        return self._exchange([req], timeout)[0]

    # ------------------------------------------------------------------ public

    @property
    def version(self) -> int:
        """The protocol version this connection speaks."""
        return self._version

    @property
    def window(self) -> int:
        """Most requests this client keeps in flight."""
        return self._window

    @property
    def closed(self) -> bool:
        return self._dead is not None

    def close(self) -> None:
        """Closes the connection (idempotent). From another thread, it interrupts a call
        blocked on this connection, which raises :class:`~aker.ConnectionClosed`."""
        if self._dead is None:
            self._dead = ConnectionClosed("closed by the client")
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes a select() blocked elsewhere
        except OSError:
            pass
        # Let a blocked call notice and leave first (it closes the socket itself).
        if self._lock.acquire(timeout=1.0):
            try:
                self._kill(self._dead)
            finally:
                self._lock.release()
        else:
            self._kill(self._dead)

    def _idle_usable(self) -> bool:
        """For a pool, before lending an idle connection: False when the server closed it
        (EOF), sent something unasked (e.g. SHUTTING_DOWN before closing), or it broke."""
        if self._dead is not None or self._rbuf or self._wbuf:
            return False
        try:
            if self._tls:
                # No MSG_PEEK on TLS: a byte read here means the connection is not idle
                # (it is not lent out again); nothing but a session ticket means it is.
                if self._sock.pending():  # type: ignore[attr-defined]
                    return False
                self._rbuf += self._sock.recv(1)
                return False
            self._sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError, _ssl.SSLWantReadError, _ssl.SSLWantWriteError):
            return True
        except OSError:
            return False
        return False  # b"" (EOF) or unread bytes

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"v{self._version}"
        host, port = self.address
        return f"<aker.Client {host}:{port} {state}>"

    def ping(self, payload: BytesLike = b"", *, timeout: TimeoutArg = DEFAULT) -> float:
        """PING; returns the round trip in seconds."""
        t0 = time.perf_counter()
        self._one(self._codec.ping(payload), timeout)
        return time.perf_counter() - t0

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
        """The ``k`` nearest neighbours of ``vector``.

        ``bypass_cache``: answer from the backend, the cache untouched; ``refresh_entry``:
        from the backend, replacing the cached entry; ``deadline``: the server's time
        budget in seconds (``DEADLINE_EXCEEDED`` past it).

        ``at_position`` (protocol version 5, read-your-writes): an answer that holds every
        change committed up to this position, as :meth:`insert_with_position` /
        :meth:`delete_with_position` return it (or PostgreSQL's ``pg_current_wal_lsn()``
        after one's own COMMIT, as a number). With pgvector the cache answers once the
        change stream has applied it (the server waits up to 100 ms), else the database
        does. A server below version 5 cannot take it: :class:`~aker.InvalidRequest`
        (``local``), nothing sent.
        """
        req = self._codec.search(
            vector,
            k,
            bypass_cache=bypass_cache,
            refresh_entry=refresh_entry,
            deadline=deadline,
            collection=collection,
            at_position=at_position,
        )
        result: SearchResult = self._one(req, timeout)
        return result

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
        """The ``k`` nearest neighbours of each row of ``matrix`` ``(n, dim)``, in row order
        (``ids`` / ``distances`` of shape ``(n, k)``); the flags and ``at_position`` as
        :meth:`search`'s, for every row (``deadline``: for each request carrying rows).

        A version 4 server gets SEARCH_BATCH frames of at most ``info.max_batch`` rows
        (fewer when the request or its largest reply would be over ``max_frame_bytes``,
        or the window is smaller), several in flight within the window, where a frame of
        ``count`` rows takes ``count`` slots. An older server gets one SEARCH per row,
        pipelined within the window; the result is the same.

        ``errors="raise"`` (the default): a failed row raises its status's exception
        (:mod:`aker.errors`) with ``.row``, the failed row's index: the first failed row
        in row order, or an error reply to a whole request when it comes (``.row``: the
        first row it carried; what is not sent yet is not sent). ``errors="return"``: no
        status raises; each failed row's code is in ``BatchResult.statuses`` and the row
        is padded as an empty one (``ok[i]`` False). Connection errors and timeouts raise
        either way.
        """
        reqs, kk = batch_requests(
            self._codec,
            matrix,
            k,
            self._window,
            self._max_reply,
            errors,
            bypass_cache=bypass_cache,
            refresh_entry=refresh_entry,
            deadline=deadline,
            collection=collection,
            at_position=at_position,
        )
        return batch_result(self._exchange(reqs, timeout, errors == "return"), reqs, kk, errors)

    def insert(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> None:
        """Inserts or replaces ``id``; returns once the backend committed it."""
        self._one(self._codec.insert(id, vector, payload, collection), timeout)

    def insert_with_position(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> int:
        """As :meth:`insert`; returns the write's **position** (protocol version 5), for
        :meth:`search`'s ``at_position``: with pgvector the WAL position after its COMMIT;
        0 where there is nothing to wait for (the embedded store and cache-aside, whose
        acknowledged writes are already in the cache, or a server below version 5)."""
        position: int = self._one(self._codec.insert(id, vector, payload, collection, with_position=True), timeout)
        return position

    def delete(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> bool:
        """Deletes ``id``; whether it was present. A deleted id is never served again."""
        existed: bool = self._one(self._codec.delete(id, collection), timeout)
        return existed

    def delete_with_position(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> Deleted:
        """As :meth:`delete`: a :class:`~aker.Deleted`, ``existed`` and the write's
        ``position`` (as :meth:`insert_with_position`'s); a search at that position never
        serves the id."""
        d: Deleted = self._one(self._codec.delete(id, collection, with_position=True), timeout)
        return d

    def fill(
        self,
        query: VectorLike,
        k: int,
        ids: VectorLike,
        distances: VectorLike,
        vectors: VectorLike,
        *,
        token: int | None = None,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> bool:
        """Cache-aside: hands the cache the backend's answer after a MISS — ``k + Δ``
        candidates (``info.delta``), ascending by distance, with their vectors ``(m, dim)``
        — and the MISS's ``token`` (``SearchResult.token``). Whether it was admitted."""
        req = self._codec.fill(query, k, ids, distances, vectors, token, collection)
        admitted: bool = self._one(req, timeout)
        return admitted

    def search_aside(
        self, vector: VectorLike, k: int, backend: Backend, *, timeout: TimeoutArg = DEFAULT
    ) -> SearchResult:
        """Cache-aside search: SEARCH; on a MISS without neighbours, ``backend(query,
        k + Δ)`` answers, the answer is FILLed with the MISS's token, and its first k are
        returned (kind MISS)."""
        q = as_vector(vector, self.info.dim)
        r = self.search(q, k, timeout=timeout)
        if r.kind != HitKind.MISS or len(r) > 0:
            return r
        ids, dist, vecs = backend(q, k + self.info.delta)
        self.fill(q, k, ids, dist, vecs, token=r.token, timeout=timeout)
        return _aside_result(ids, dist, k, r.token)

    def flush(self, *, timeout: TimeoutArg = DEFAULT) -> None:
        """Drops every cache entry (the backend is untouched)."""
        self._one(self._codec.flush(), timeout)

    def stats(self, *, timeout: TimeoutArg = DEFAULT) -> dict[str, int | float | str]:
        """The server's counters, ``name -> value`` (numbers parsed)."""
        stats: dict[str, int | float | str] = self._one(self._codec.stats(), timeout)
        return stats

    def cluster(self, *, timeout: TimeoutArg = DEFAULT) -> ClusterState:
        """CLUSTER (protocol version 6): the routing state of the cluster this node is in,
        a :class:`~aker.ClusterState` (:class:`aker.Cluster` routes by it). A node in no
        cluster answers :class:`~aker.Unsupported`; below version 6 the client raises it
        (``local``), nothing sent."""
        state: ClusterState = self._one(self._codec.cluster(), timeout)
        return state

    def pipeline(self) -> Pipeline:
        """Requests queued, then sent together (many in flight): see :class:`Pipeline`."""
        return Pipeline(self)


def _aside_result(ids: npt.ArrayLike, dist: npt.ArrayLike, k: int, token: int | None) -> SearchResult:
    i = np.asarray(ids).reshape(-1)[:k].astype(np.uint64)
    d = np.asarray(dist).reshape(-1)[:k].astype(np.float32)
    return SearchResult(ids=i, distances=d, kind=HitKind.MISS, distances_to_query=True, token=token)


class Pipeline(PipelineRequests):
    """Requests queued on one connection and sent together, replies matched by id.

    ::

        with client.pipeline() as p:
            p.search(q1, 10)
            p.insert(7, v)
            p.search(q2, 10)
        first, _, second = p.results

    Each method checks its arguments at once and returns the request's index;
    :meth:`execute` (or leaving the ``with`` block) sends them, at most the window in
    flight, and returns the results in order. The requests are concurrent: the server
    may run and answer them in any order, so do not pipeline a write and a read that
    must see it. On an error reply :meth:`execute` raises it (requests not yet sent are
    not sent) unless ``return_exceptions=True``, which puts the exception in its place.
    """

    _client: Client

    def execute(self, *, timeout: TimeoutArg = DEFAULT, return_exceptions: bool = False) -> list[Any]:
        reqs, self._reqs = self._reqs, []
        out = self._client._exchange(reqs, timeout, return_exceptions)
        # PING results are the echoed payload here (no round trip measured).
        self.results = out
        return out

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None and self._reqs:
            self.execute()


class Pool:
    """Up to ``size`` :class:`Client` connections shared by threads.

    ``with pool.connection() as c:`` lends one (made when none is idle, waiting up to
    ``acquire_timeout`` when ``size`` are lent); the pool's own methods do that for one
    call. A connection that broke is dropped and a new one made on demand. Keyword
    arguments are :class:`Client`'s.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7700,
        *,
        size: int = 4,
        acquire_timeout: float | None = 10.0,
        **client_options: Unpack[ClientOptions],
    ) -> None:
        _check_size(size)
        self.address = (host, port)
        self.size = size
        self.acquire_timeout = acquire_timeout
        self._options = client_options
        self._idle: list[Client] = []
        self._count = 0
        self._closed = False
        self._cond = threading.Condition()
        self._info: ServerInfo | None = None

    @property
    def info(self) -> ServerInfo:
        """HELLO's answer (connects once if nothing has yet)."""
        if self._info is None:
            with self.connection():
                pass
        assert self._info is not None
        return self._info

    def _acquire(self) -> Client:
        deadline = None if self.acquire_timeout is None else time.monotonic() + self.acquire_timeout
        with self._cond:
            while True:
                if self._closed:
                    raise ConnectionClosed("the pool is closed")
                while self._idle:
                    idle = self._idle.pop()
                    if idle._idle_usable():
                        return idle
                    idle.close()  # akerd closed it (idle_timeout_ms) or is stopping
                    self._count -= 1
                if self._count < self.size:
                    self._count += 1
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(f"no pooled connection free within {self.acquire_timeout} s")
                self._cond.wait(left)
        try:
            c = Client(self.address[0], self.address[1], **self._options)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise
        self._info = c.info
        return c

    def _release(self, c: Client) -> None:
        with self._cond:
            if c.closed or self._closed:
                self._count -= 1
                c.close()
            else:
                self._idle.append(c)
            self._cond.notify()

    @contextmanager
    def connection(self) -> Iterator[Client]:
        c = self._acquire()
        try:
            yield c
        finally:
            self._release(c)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for c in self._idle:
                c.close()
                self._count -= 1
            self._idle.clear()
            self._cond.notify_all()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def ping(self, payload: BytesLike = b"", **kw: Unpack[CallOptions]) -> float:
        with self.connection() as c:
            return c.ping(payload, **kw)

    def search(self, vector: VectorLike, k: int = 10, **kw: Unpack[SearchOptions]) -> SearchResult:
        with self.connection() as c:
            return c.search(vector, k, **kw)

    def search_batch(self, matrix: VectorLike, k: int = 10, **kw: Unpack[BatchOptions]) -> BatchResult:
        with self.connection() as c:
            return c.search_batch(matrix, k, **kw)

    def insert(self, id: int, vector: VectorLike, payload: Payload = None, **kw: Unpack[WriteOptions]) -> None:
        with self.connection() as c:
            c.insert(id, vector, payload, **kw)

    def delete(self, id: int, **kw: Unpack[WriteOptions]) -> bool:
        with self.connection() as c:
            return c.delete(id, **kw)

    def insert_with_position(
        self, id: int, vector: VectorLike, payload: Payload = None, **kw: Unpack[WriteOptions]
    ) -> int:
        with self.connection() as c:
            return c.insert_with_position(id, vector, payload, **kw)

    def delete_with_position(self, id: int, **kw: Unpack[WriteOptions]) -> Deleted:
        with self.connection() as c:
            return c.delete_with_position(id, **kw)

    def fill(
        self,
        query: VectorLike,
        k: int,
        ids: VectorLike,
        distances: VectorLike,
        vectors: VectorLike,
        **kw: Unpack[FillOptions],
    ) -> bool:
        with self.connection() as c:
            return c.fill(query, k, ids, distances, vectors, **kw)

    def search_aside(self, vector: VectorLike, k: int, backend: Backend, **kw: Unpack[CallOptions]) -> SearchResult:
        with self.connection() as c:
            return c.search_aside(vector, k, backend, **kw)

    def flush(self, **kw: Unpack[CallOptions]) -> None:
        with self.connection() as c:
            c.flush(**kw)

    def stats(self, **kw: Unpack[CallOptions]) -> dict[str, int | float | str]:
        with self.connection() as c:
            return c.stats(**kw)
