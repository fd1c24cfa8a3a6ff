from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aker  # noqa: E402

from akerd_process import Akerd, config_text  # noqa: E402

# ci.sh runs these tests against the wheel it built and installed: aker must come from
# there (a copy of src/ on sys.path would make the run test the wrong thing).
_EXPECTED = os.environ.get("AKER_EXPECT_PACKAGE_IN")
if _EXPECTED and Path(_EXPECTED).resolve() not in Path(aker.__file__).resolve().parents:
    raise RuntimeError(f"aker was imported from {aker.__file__}, not from {_EXPECTED}")

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


def newest_version(info: aker.ServerInfo) -> int:
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


# TLS: a CA and akerd's certificate (for localhost and 127.0.0.1), another CA, a client CA
# and a client certificate, made with the openssl command (tests needing them are skipped
# where it is missing), and akerds with [tls] (mutual: client_ca_file too).


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=str(cwd), check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    # keyUsage: Python 3.13's default context verifies with VERIFY_X509_STRICT, which
    # refuses a CA certificate without it.
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", name + ".key", "-out", name + ".crt", "-subj", "/CN=" + name, "-days", "2",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)


def _leaf(d: Path, name: str, ca: str, ext: str) -> None:
    ext += "\nkeyUsage=critical,digitalSignature\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid"
    (d / (name + ".ext")).write_text(ext + "\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name, cwd=d)
    _openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
             "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext", cwd=d)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ca.crt (signed server.crt), other.crt, clients.crt (signed client.crt), their keys."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "other")
    _ca(d, "clients")
    _leaf(d, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth")
    _leaf(d, "client", "clients", "extendedKeyUsage=clientAuth")
    return d


def _serve_tls(workdir: Path, pki: Path, name: str, mutual: bool) -> Iterator[Akerd]:
    tls = f'cert_file = "{pki / "server.crt"}"\nkey_file = "{pki / "server.key"}"\nhandshake_timeout_ms = 2000\n'
    if mutual:
        tls += f"client_ca_file = \"{pki / 'clients.crt'}\"\n"
    yield from _serve(workdir, name, kind="embedded", k_max=K_MAX, max_inflight=64, tls=tls)


@pytest.fixture(scope="session")
def akerd_tls(workdir: Path, pki: Path) -> Iterator[Akerd]:
    """The embedded akerd with ``[tls]``."""
    yield from _serve_tls(workdir, pki, "tls", mutual=False)


@pytest.fixture(scope="session")
def akerd_mtls(workdir: Path, pki: Path) -> Iterator[Akerd]:
    """The embedded akerd with ``[tls]`` and ``client_ca_file``: mutual TLS."""
    yield from _serve_tls(workdir, pki, "mtls", mutual=True)


# Admission is asynchronous in akerd (a MISS hands its answer to the shard owner as a
# hint): the next request may still miss. These wait for a kind, bounded in time.


def search_until(client: Any, vector: Any, k: int, kind: aker.HitKind, timeout: float = 5.0, **kw: Any) -> Any:
    """Searches until the answer is of ``kind`` (at most ``timeout`` s); the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.search(vector, k, **kw)
        if r.kind is kind or time.monotonic() >= deadline:
            return r
        time.sleep(0.01)


def batch_until(client: Any, matrix: Any, k: int, kind: aker.HitKind, timeout: float = 5.0, **kw: Any) -> Any:
    """search_batch until every row is of ``kind`` (at most ``timeout`` s); the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        b = client.search_batch(matrix, k, **kw)
        if all(x is kind for x in b.kinds) or time.monotonic() >= deadline:
            return b
        time.sleep(0.01)


async def asearch_until(client: Any, vector: Any, k: int, kind: aker.HitKind, timeout: float = 5.0, **kw: Any) -> Any:
    """As :func:`search_until`, for an AsyncClient / AsyncPool."""
    deadline = time.monotonic() + timeout
    while True:
        r = await client.search(vector, k, **kw)
        if r.kind is kind or time.monotonic() >= deadline:
            return r
        await asyncio.sleep(0.01)


async def abatch_until(client: Any, matrix: Any, k: int, kind: aker.HitKind, timeout: float = 5.0, **kw: Any) -> Any:
    """As :func:`batch_until`, for an AsyncClient / AsyncPool."""
    deadline = time.monotonic() + timeout
    while True:
        b = await client.search_batch(matrix, k, **kw)
        if all(x is kind for x in b.kinds) or time.monotonic() >= deadline:
            return b
        await asyncio.sleep(0.01)
