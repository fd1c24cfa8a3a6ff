"""The asyncio client (streams), its pipeline and a pool.

One :class:`AsyncClient` is one connection that any number of tasks share: each call
sends its request at once (within the window, the server's ``max_inflight``; a
SEARCH_BATCH of ``count`` rows takes ``count`` slots) and a reader task hands each reply
to its caller by request id, so concurrent calls are pipelined on the wire.
"""

from __future__ import annotations

import asyncio
import collections
import select
import ssl as _ssl
import time
from typing import TYPE_CHECKING, Any

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
    parse_header,
)
from ._pipeline import PipelineRequests
from ._protocol import (
    HEADER_LEN,
    VERSIONS,
    BatchResult,
    ClusterState,
    Deleted,
    HitKind,
    Metric,
    SearchResult,
    ServerInfo,
)
from .client import (
    DEFAULT,
    Backend,
    BatchOptions,
    CallOptions,
    ClientOptions,
    FillOptions,
    PathLike,
    SearchOptions,
    SecretLike,
    TimeoutArg,
    WriteOptions,
    _aside_result,
    _check_size,
    _check_window,
)
from .errors import (
    AkerConnectionError,
    AkerError,
    ConnectionClosed,
    ProtocolError,
    StatusError,
    Timeout,
    TLSError,
)

if TYPE_CHECKING:
    # **kwargs typed by a TypedDict (PEP 692); for type checkers only (never imported).
    from typing_extensions import Unpack

__all__ = ["AsyncClient", "AsyncPipeline", "AsyncPool"]


def _readable_now(fd: int) -> bool:
    """Whether ``fd`` has something to read (an end of stream counts), without waiting."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])


class _Slots:
    """The window: ``capacity`` slots, taken ``n`` at once (a SEARCH_BATCH of ``n`` rows)
    in FIFO order, so a large request is not starved by small ones and two callers never
    each hold part of what the other needs."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, n: int) -> None:
        n = min(n, self.capacity)  # never more than the whole window (not to wait forever)
        if not self._waiters and self.used + n <= self.capacity:
            self.used += n
            return
        entry = (n, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        try:
            await entry[1]
        except BaseException:
            if entry[1].done() and not entry[1].cancelled():
                self.release(n)  # granted, but the caller was cancelled meanwhile
            else:
                try:
                    self._waiters.remove(entry)
                except ValueError:
                    pass
                self._wake()
            raise

    def release(self, n: int) -> None:
        self.used -= min(n, self.capacity)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, fut = self._waiters[0]
            if fut.done():  # cancelled
                self._waiters.popleft()
                continue
            if self.used + n > self.capacity:
                return
            self._waiters.popleft()
            self.used += n
            fut.set_result(None)


class AsyncClient:
    """An asyncio connection to akerd; make one with ``await AsyncClient.connect(...)``
    (the same options as :class:`aker.Client`). ``async with`` closes it."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, timeout: float | None, max_reply_bytes: int
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.timeout = timeout
        self._max_reply = max_reply_bytes
        #: Sent, not answered: id -> (request, future); a timed-out call's entry stays
        #: until its reply comes (and is dropped), so the window stays honest.
        self._pending: dict[int, tuple[Req, asyncio.Future[Frame]]] = {}
        self._next_id = 1
        self._version = VERSIONS[0]
        self._window = 1
        self._slots: _Slots | None = None
        self._wlock = asyncio.Lock()
        self._dead: AkerError | None = None
        self._task: asyncio.Task[None] = asyncio.ensure_future(self._read_loop())
        self.info: ServerInfo
        self._codec: Codec
        self.address: tuple[str, int] = ("", 0)

    @classmethod
    async def connect(
        cls,
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
    ) -> AsyncClient:
        key = load_secret(secret, secret_file)
        _check_window(window)
        if expect_metric is not None:
            check_metric(expect_metric)
        t0 = time.monotonic()
        try:
            if ssl is None:
                opened = asyncio.open_connection(host, int(port))
            else:
                opened = asyncio.open_connection(host, int(port), ssl=ssl, server_hostname=server_hostname or host)
            reader, writer = await asyncio.wait_for(opened, connect_timeout)
        except asyncio.TimeoutError:
            raise Timeout(f"connecting to {host}:{int(port)} timed out after {connect_timeout} s") from None
        except _ssl.SSLError as e:
            raise TLSError(f"TLS handshake with {host}:{int(port)} failed: {e}") from e
        except OSError as e:
            raise AkerConnectionError(f"cannot connect to {host}:{int(port)}: {e}") from e
        c = cls(reader, writer, timeout=timeout, max_reply_bytes=int(max_reply_bytes))
        c.address = (host, int(port))
        left = None if connect_timeout is None else max(0.0, connect_timeout - (time.monotonic() - t0))
        try:
            try:
                info = await asyncio.wait_for(c._handshake(handshake(key, expect_dim, expect_metric)), left)
            except asyncio.TimeoutError:
                raise Timeout(f"no handshake within {connect_timeout} s") from None
        except BaseException:
            await c.close()
            raise
        c.info = info
        c._version = info.version
        c._codec = Codec(info)
        c._window = min(info.max_inflight if window is None else int(window), info.max_inflight)
        c._slots = _Slots(c._window)
        return c

    # ------------------------------------------------------------------ plumbing

    async def _handshake(self, steps: Handshake) -> ServerInfo:
        req = next(steps)
        while True:
            frame = await self._send(req)
            try:
                req = steps.send(frame)
            except StopIteration as stop:
                info: ServerInfo = stop.value
                return info

    def _new_id(self) -> int:
        rid = self._next_id
        self._next_id = 1 if rid >= 0xFFFF_FFFF_FFFF_FFFF else rid + 1
        return rid

    def _check(self) -> None:
        """Raises when the connection is closed; called only before a request is written."""
        if self._dead is not None:
            e = ConnectionClosed(f"the connection is closed: {self._dead}")
            e.not_sent = True
            raise e

    def _fail(self, why: AkerError) -> None:
        if self._dead is None:
            self._dead = why
        pending, self._pending = self._pending, {}
        for req, fut in pending.values():
            if not fut.done():
                fut.set_exception(why)
                # A timed-out request's future has nobody awaiting it: mark the exception
                # retrieved (an awaiting caller still gets it raised).
                fut.exception()
            # Give back the window slots those requests held, so that calls blocked on
            # the window wake up and raise ConnectionClosed (their _check after acquire).
            if req.slots and self._slots is not None:
                self._slots.release(req.slots)
        try:
            self._writer.close()
        except Exception:
            pass

    async def _read_loop(self) -> None:
        try:
            while True:
                header = await self._reader.readexactly(HEADER_LEN)
                version, opcode, flags, status, rid, body_len = parse_header(header, self._max_reply)
                body = await self._reader.readexactly(body_len) if body_len else b""
                frame = Frame(version, opcode, flags, status, rid, body)
                if frame.connection_level:
                    self._fail(error_of(frame))
                    return
                entry = self._pending.pop(rid, None)
                if entry is None:
                    self._fail(ProtocolError(f"reply for request {rid}, which is not in flight"))
                    return
                req, fut = entry
                if req.slots and self._slots is not None:
                    self._slots.release(req.slots)
                if not fut.done():
                    fut.set_result(frame)
                if closes_connection(frame, req.opcode):
                    self._fail(ConnectionClosed(f"the server closed the connection after status {status}"))
                    return
        except asyncio.IncompleteReadError:
            self._fail(ConnectionClosed("the server closed the connection"))
        except ProtocolError as e:
            self._fail(e)
        except (OSError, ConnectionError) as e:
            self._fail(ConnectionClosed(f"connection lost: {e}"))
        except asyncio.CancelledError:
            self._fail(ConnectionClosed("closed by the client"))
            raise
        except BaseException as e:
            self._fail(ConnectionClosed(f"the reader stopped: {e!r}"))
            raise

    async def _send(self, req: Req, written: list[bool] | None = None) -> Frame:
        """Sends ``req`` and waits for its reply frame (no timeout here); ``written[0]`` is
        set once it is handed to the transport."""
        self._check()
        slots = self._slots if req.slots else None
        if slots is not None:
            await slots.acquire(req.slots)
        sent = False
        rid = 0
        try:
            self._check()
            rid = self._new_id()
            fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
            self._pending[rid] = (req, fut)
            data = req.encode(self._version, rid)
            async with self._wlock:
                self._check()
                self._writer.write(data)
                sent = True
                if written is not None:
                    written[0] = True
                try:
                    await self._writer.drain()
                except (OSError, ConnectionError) as e:
                    self._fail(ConnectionClosed(f"connection lost: {e}"))
        finally:
            # Not sent: give its slots back, unless _fail already did (it took the entry).
            if not sent and (not rid or self._pending.pop(rid, None) is not None) and slots is not None:
                slots.release(req.slots)
        return await fut

    async def _call(self, req: Req, timeout: TimeoutArg = DEFAULT) -> Any:
        t: float | None = self.timeout if timeout is DEFAULT else timeout
        written = [False]
        try:
            if t is None:
                frame = await self._send(req, written)
            else:
                frame = await asyncio.wait_for(self._send(req, written), t)
        except asyncio.TimeoutError:
            err = Timeout(f"no reply within {t} s" if written[0] else f"not sent within {t} s (the window was full)")
            err.not_sent = not written[0]
            raise err from None
        return req.result(frame)

    async def _many(self, reqs: list[Req], timeout: TimeoutArg = DEFAULT, return_exceptions: bool = False) -> list[Any]:
        """Runs ``reqs`` concurrently (at most the window's slots in flight); results in order."""
        self._check()
        results: list[Any] = [None] * len(reqs)
        order = iter(range(len(reqs)))

        async def worker() -> None:
            for i in order:
                try:
                    results[i] = await self._call(reqs[i], timeout)
                except StatusError as e:
                    if not return_exceptions:
                        raise
                    results[i] = e

        # As many workers as the window holds requests of the widest: a batch of chunks
        # as wide as the window queues one chunk at a time, so that a call made meanwhile
        # on this connection waits behind one chunk, not behind all of them.
        widest = max((r.slots for r in reqs), default=1)
        workers = max(1, min(len(reqs), self._window // max(widest, 1)))
        tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return results

    # ------------------------------------------------------------------ public

    @property
    def version(self) -> int:
        return self._version

    @property
    def window(self) -> int:
        return self._window

    @property
    def in_flight(self) -> int:
        """Requests sent and not answered yet (timed-out ones included)."""
        return len(self._pending)

    @property
    def _load(self) -> int:
        """Window slots held, then requests in flight (an :class:`AsyncPool` sends to the
        least loaded connection)."""
        return (self._slots.used if self._slots is not None else 0) + len(self._pending)

    @property
    def closed(self) -> bool:
        return self._dead is not None

    def _idle_usable(self) -> bool:
        """For :class:`aker.AsyncCluster`, before it sends on a connection with nothing in
        flight: False when it broke, or when its socket has something to read, which on
        an idle connection is the server's end of stream (``idle_timeout_ms``, a
        restart) or bytes nobody asked for (``SHUTTING_DOWN``), even if the event loop has
        not run since they came."""
        if self._dead is not None or self._reader.at_eof():
            return False
        sock = self._writer.get_extra_info("socket")
        if sock is None:
            return True
        try:
            return not _readable_now(sock.fileno())
        except (OSError, ValueError):
            return False

    async def close(self) -> None:
        """Closes the connection (idempotent). A cancellation of the caller meanwhile is
        raised (the connection is closed all the same)."""
        self._abort()
        # asyncio.wait: the reader's end, whatever it raised (reported through _dead
        # already), without swallowing a cancellation of this caller.
        await asyncio.wait([self._task])
        if not self._task.cancelled():
            self._task.exception()
        try:
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)
        except (OSError, asyncio.TimeoutError):
            pass

    def _abort(self) -> None:
        """Closes the connection without waiting (the transport closes, the reader task is
        cancelled and ends by itself): for callers that must not await on the way out."""
        self._fail(ConnectionClosed("closed by the client"))
        if not self._task.done():
            self._task.cancel()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"v{self._version}"
        host, port = self.address
        return f"<aker.AsyncClient {host}:{port} {state}>"

    async def ping(self, payload: BytesLike = b"", *, timeout: TimeoutArg = DEFAULT) -> float:
        """PING; the round trip in seconds."""
        t0 = time.perf_counter()
        await self._call(self._codec.ping(payload), timeout)
        return time.perf_counter() - t0

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
        """As :meth:`aker.Client.search`."""
        req = self._codec.search(
            vector,
            k,
            bypass_cache=bypass_cache,
            refresh_entry=refresh_entry,
            deadline=deadline,
            collection=collection,
            at_position=at_position,
        )
        result: SearchResult = await self._call(req, timeout)
        return result

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
        """As :meth:`aker.Client.search_batch`: SEARCH_BATCH frames on a version 4 server
        (``count`` window slots each), one SEARCH per row on an older one; ``errors`` the same."""
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
        return batch_result(await self._many(reqs, timeout, errors == "return"), reqs, kk, errors)

    async def insert(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> None:
        await self._call(self._codec.insert(id, vector, payload, collection), timeout)

    async def insert_with_position(
        self,
        id: int,
        vector: VectorLike,
        payload: Payload = None,
        *,
        collection: int = 0,
        timeout: TimeoutArg = DEFAULT,
    ) -> int:
        """As :meth:`aker.Client.insert_with_position`."""
        req = self._codec.insert(id, vector, payload, collection, with_position=True)
        position: int = await self._call(req, timeout)
        return position

    async def delete(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> bool:
        existed: bool = await self._call(self._codec.delete(id, collection), timeout)
        return existed

    async def delete_with_position(self, id: int, *, collection: int = 0, timeout: TimeoutArg = DEFAULT) -> Deleted:
        """As :meth:`aker.Client.delete_with_position`."""
        d: Deleted = await self._call(self._codec.delete(id, collection, with_position=True), timeout)
        return d

    async def fill(
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
        req = self._codec.fill(query, k, ids, distances, vectors, token, collection)
        admitted: bool = await self._call(req, timeout)
        return admitted

    async def search_aside(
        self, vector: VectorLike, k: int, backend: Backend, *, timeout: TimeoutArg = DEFAULT
    ) -> SearchResult:
        """As :meth:`aker.Client.search_aside` (``backend`` is a plain function)."""
        q = as_vector(vector, self.info.dim)
        r = await self.search(q, k, timeout=timeout)
        if r.kind != HitKind.MISS or len(r) > 0:
            return r
        ids, dist, vecs = backend(q, k + self.info.delta)
        await self.fill(q, k, ids, dist, vecs, token=r.token, timeout=timeout)
        return _aside_result(ids, dist, k, r.token)

    async def flush(self, *, timeout: TimeoutArg = DEFAULT) -> None:
        await self._call(self._codec.flush(), timeout)

    async def stats(self, *, timeout: TimeoutArg = DEFAULT) -> dict[str, int | float | str]:
        stats: dict[str, int | float | str] = await self._call(self._codec.stats(), timeout)
        return stats

    async def cluster(self, *, timeout: TimeoutArg = DEFAULT) -> ClusterState:
        """As :meth:`aker.Client.cluster`."""
        state: ClusterState = await self._call(self._codec.cluster(), timeout)
        return state

    def pipeline(self) -> AsyncPipeline:
        return AsyncPipeline(self)


class AsyncPipeline(PipelineRequests):
    """As :class:`aker.Pipeline`: ``async with client.pipeline() as p: ...`` or
    ``await p.execute()``; results in order."""

    _client: AsyncClient

    async def execute(self, *, timeout: TimeoutArg = DEFAULT, return_exceptions: bool = False) -> list[Any]:
        reqs, self._reqs = self._reqs, []
        self.results = await self._client._many(reqs, timeout, return_exceptions)
        return self.results

    async def __aenter__(self) -> AsyncPipeline:
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None and self._reqs:
            await self.execute()


class AsyncPool:
    """Up to ``size`` :class:`AsyncClient` connections; each call goes to the least
    loaded one (window slots held: a SEARCH_BATCH of n rows counts n), and a new
    connection is opened (up to ``size``) when every open one is busy. Broken connections
    are dropped. Keyword arguments are
    :meth:`AsyncClient.connect`'s."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 7700, *, size: int = 4, **client_options: Unpack[ClientOptions]
    ) -> None:
        _check_size(size)
        self.address = (host, port)
        self.size = size
        self._options = client_options
        self._clients: list[AsyncClient] = []
        self._lock: asyncio.Lock | None = None
        self._closed = False

    async def acquire(self) -> AsyncClient:
        """A connection to send on (shared: do not close it)."""
        if self._closed:
            raise ConnectionClosed("the pool is closed")
        self._clients = [c for c in self._clients if not c.closed]
        best = min(self._clients, key=lambda c: c._load, default=None)
        if best is not None and (best.in_flight == 0 or len(self._clients) >= self.size):
            return best
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            self._clients = [c for c in self._clients if not c.closed]
            if len(self._clients) < self.size and all(c.in_flight > 0 for c in self._clients):
                new = await AsyncClient.connect(self.address[0], self.address[1], **self._options)
                if self._closed:
                    await new.close()
                    raise ConnectionClosed("the pool is closed")
                self._clients.append(new)
            return min(self._clients, key=lambda c: c._load)

    @property
    def connections(self) -> int:
        return sum(1 for c in self._clients if not c.closed)

    async def close(self) -> None:
        self._closed = True
        clients, self._clients = self._clients, []
        for c in clients:
            await c.close()
        if self._lock is not None:
            # A connection being opened while the pool closed: close it too.
            async with self._lock:
                clients, self._clients = self._clients, []
            for c in clients:
                await c.close()

    async def __aenter__(self) -> AsyncPool:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def info(self) -> ServerInfo:
        return (await self.acquire()).info

    async def ping(self, payload: BytesLike = b"", **kw: Unpack[CallOptions]) -> float:
        return await (await self.acquire()).ping(payload, **kw)

    async def search(self, vector: VectorLike, k: int = 10, **kw: Unpack[SearchOptions]) -> SearchResult:
        return await (await self.acquire()).search(vector, k, **kw)

    async def search_batch(self, matrix: VectorLike, k: int = 10, **kw: Unpack[BatchOptions]) -> BatchResult:
        return await (await self.acquire()).search_batch(matrix, k, **kw)

    async def insert(self, id: int, vector: VectorLike, payload: Payload = None, **kw: Unpack[WriteOptions]) -> None:
        await (await self.acquire()).insert(id, vector, payload, **kw)

    async def delete(self, id: int, **kw: Unpack[WriteOptions]) -> bool:
        return await (await self.acquire()).delete(id, **kw)

    async def insert_with_position(
        self, id: int, vector: VectorLike, payload: Payload = None, **kw: Unpack[WriteOptions]
    ) -> int:
        return await (await self.acquire()).insert_with_position(id, vector, payload, **kw)

    async def delete_with_position(self, id: int, **kw: Unpack[WriteOptions]) -> Deleted:
        return await (await self.acquire()).delete_with_position(id, **kw)

    async def fill(
        self,
        query: VectorLike,
        k: int,
        ids: VectorLike,
        distances: VectorLike,
        vectors: VectorLike,
        **kw: Unpack[FillOptions],
    ) -> bool:
        return await (await self.acquire()).fill(query, k, ids, distances, vectors, **kw)

    async def search_aside(
        self, vector: VectorLike, k: int, backend: Backend, **kw: Unpack[CallOptions]
    ) -> SearchResult:
        return await (await self.acquire()).search_aside(vector, k, backend, **kw)

    async def flush(self, **kw: Unpack[CallOptions]) -> None:
        await (await self.acquire()).flush(**kw)

    async def stats(self, **kw: Unpack[CallOptions]) -> dict[str, int | float | str]:
        return await (await self.acquire()).stats(**kw)

