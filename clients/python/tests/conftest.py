from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Iterable, Iterator, TypeVar

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aker  # noqa: E402
from akerd_process import Akerd, config_text  # noqa: E402

N = 400
DIM = 8
K_MAX = 32
DELTA = 3
MAX_INFLIGHT = 8
MAX_FRAME = 65536
SECRET = b"a shared secret of some length"

T = TypeVar("T")


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """Runs an async test body, bounded in time."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def newest_version(info: "aker.ServerInfo") -> int:
    """The version a client and akerd speak: the newest both know (5 with an akerd built
    before protocol version 6, 6 after)."""
    return min(aker.VERSIONS[0], info.version_max)


def make_data() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((N, DIM)).astype(np.float32)


def exact(data: np.ndarray, q: Any, k: int, exclude: Iterable[int] = ()) -> np.ndarray:
    """The exact squared-L2 top-k ids of ``q`` over ``data`` without ``exclude``."""
    d = ((data.astype(np.float64) - np.asarray(q, dtype=np.float64)) ** 2).sum(axis=1)
    ex = list(exclude)
    if ex:
        d[np.asarray(ex, dtype=np.int64)] = np.inf
    return np.argsort(d, kind="stable")[:k].astype(np.uint64)


def queries(n: int, seed: int = 1) -> np.ndarray:
    """Queries that are not data rows (each has a positive nearest distance)."""
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


@pytest.fixture(scope="session")
def data() -> np.ndarray:
    return make_data()


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory, data: np.ndarray) -> Path:
    d = tmp_path_factory.mktemp("akerd")
    np.save(d / "data.npy", data)
    (d / "secret").write_bytes(SECRET + b"\n")
    return d


def _serve(workdir: Path, name: str, **kw: Any) -> Iterator[Akerd]:
    sub = workdir / name
    sub.mkdir()
    server = Akerd(sub, config_text(data_file=str(workdir / "data.npy"), **kw)).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def akerd(workdir: Path) -> Iterator[Akerd]:
    """The embedded akerd (exact store), no authentication."""
    yield from _serve(workdir, "embedded", kind="embedded", k_max=K_MAX, delta=DELTA,
                      max_inflight=MAX_INFLIGHT, max_frame_bytes=MAX_FRAME)


@pytest.fixture(scope="session")
def akerd_batch3(workdir: Path) -> Iterator[Akerd]:
    """The embedded akerd with ``max_batch = 3`` (protocol v4): batches go in chunks of 3."""
    yield from _serve(workdir, "batch3", kind="embedded", k_max=K_MAX, delta=DELTA,
                      max_inflight=MAX_INFLIGHT, max_frame_bytes=MAX_FRAME, max_batch=3)


@pytest.fixture(scope="session")
def akerd_auth(workdir: Path) -> Iterator[Akerd]:
    """The embedded akerd with ``[auth] secret_file``."""
    yield from _serve(workdir, "auth", kind="embedded", secret_file=str(workdir / "secret"))


@pytest.fixture(scope="session")
def akerd_aside(workdir: Path) -> Iterator[Akerd]:
    """A cache-aside akerd (the client FILLs misses)."""
    yield from _serve(workdir, "aside", kind="cache_aside", k_max=K_MAX, delta=DELTA)


@pytest.fixture
def client(akerd: Akerd) -> Iterator[aker.Client]:
    """A client of the embedded akerd, its cache flushed first."""
    c = aker.Client(akerd.host, akerd.port, timeout=10.0, connect_timeout=5.0)
    c.flush()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def aside(akerd_aside: Akerd) -> Iterator[aker.Client]:
    c = aker.Client(akerd_aside.host, akerd_aside.port, timeout=10.0)
    c.flush()
    try:
        yield c
    finally:
        c.close()


# Admission is asynchronous in akerd (a MISS hands its answer to the shard owner as a
# hint): the next request may still miss. These wait for a kind, bounded in time.


def search_until(client: Any, vector: Any, k: int, kind: "aker.HitKind", timeout: float = 5.0, **kw: Any) -> Any:
    """Searches until the answer is of ``kind`` (at most ``timeout`` s); the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.search(vector, k, **kw)
        if r.kind is kind or time.monotonic() >= deadline:
            return r
        time.sleep(0.01)


def batch_until(client: Any, matrix: Any, k: int, kind: "aker.HitKind", timeout: float = 5.0, **kw: Any) -> Any:
    """search_batch until every row is of ``kind`` (at most ``timeout`` s); the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        b = client.search_batch(matrix, k, **kw)
        if all(x is kind for x in b.kinds) or time.monotonic() >= deadline:
            return b
        time.sleep(0.01)


async def asearch_until(client: Any, vector: Any, k: int, kind: "aker.HitKind", timeout: float = 5.0, **kw: Any) -> Any:
    """As :func:`search_until`, for an AsyncClient / AsyncPool."""
    deadline = time.monotonic() + timeout
    while True:
        r = await client.search(vector, k, **kw)
        if r.kind is kind or time.monotonic() >= deadline:
            return r
        await asyncio.sleep(0.01)


async def abatch_until(client: Any, matrix: Any, k: int, kind: "aker.HitKind", timeout: float = 5.0, **kw: Any) -> Any:
    """As :func:`batch_until`, for an AsyncClient / AsyncPool."""
    deadline = time.monotonic() + timeout
    while True:
        b = await client.search_batch(matrix, k, **kw)
        if all(x is kind for x in b.kinds) or time.monotonic() >= deadline:
            return b
        await asyncio.sleep(0.01)
