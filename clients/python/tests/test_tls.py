"""The clients over TLS against a real akerd with ``[tls]`` (the certificates and the
servers are conftest's ``pki``, ``akerd_tls`` and ``akerd_mtls``, made with the
``openssl`` command; the tests are skipped, saying so, where it is missing)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aker

from akerd_process import Akerd
from conftest import exact, queries, run

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


def _ctx(pki: Path, ca: str = "ca", client: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / (ca + ".crt")))
    if client:
        ctx.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return ctx


def _opts(pki: Path, **kw: Any) -> dict[str, Any]:
    return dict(ssl=_ctx(pki, **kw), server_hostname="localhost", timeout=10.0)


def test_sync_client_over_tls_answers_and_pipelines(akerd_tls: Akerd, pki: Path, data: np.ndarray) -> None:
    qs = queries(200)
    with aker.Client(akerd_tls.host, akerd_tls.port, **_opts(pki)) as c:
        r = c.search(qs[0], 5)
        assert list(r.ids) == list(exact(data, qs[0], 5))
        # Many requests in flight through one TLS session: every reply matches its query.
        p = c.pipeline()
        for q in qs:
            p.search(q, 5)
        got = p.execute()
        assert len(got) == len(qs)
        for q, res in zip(qs, got, strict=True):
            assert list(res.ids) == list(exact(data, q, 5))
        b = c.search_batch(qs[:50], 5)
        assert [list(x) for x in b.ids] == [list(exact(data, q, 5)) for q in qs[:50]]


def test_async_client_over_tls(akerd_tls: Akerd, pki: Path, data: np.ndarray) -> None:
    qs = queries(100, seed=3)

    async def go() -> None:
        c = await aker.AsyncClient.connect(akerd_tls.host, akerd_tls.port, **_opts(pki))
        try:
            res = await asyncio.gather(*(c.search(q, 5) for q in qs))
            for q, r in zip(qs, res, strict=True):
                assert list(r.ids) == list(exact(data, q, 5))
        finally:
            await c.close()

    run(go())


def test_a_server_certificate_from_another_ca_is_refused(akerd_tls: Akerd, pki: Path) -> None:
    with pytest.raises(aker.TLSError, match="certificate"):
        aker.Client(akerd_tls.host, akerd_tls.port, **_opts(pki, ca="other"))

    async def go() -> None:
        await aker.AsyncClient.connect(akerd_tls.host, akerd_tls.port, **_opts(pki, ca="other"))

    with pytest.raises(aker.TLSError):
        run(go())


def test_a_plaintext_client_is_told_the_port_requires_tls(akerd_tls: Akerd) -> None:
    with pytest.raises(aker.AkerError, match="requires TLS"):
        aker.Client(akerd_tls.host, akerd_tls.port, timeout=10.0)


def test_a_tls_client_against_a_plaintext_port_fails_clearly(akerd: Akerd, pki: Path) -> None:
    with pytest.raises((aker.AkerConnectionError, aker.Timeout)):
        aker.Client(akerd.host, akerd.port, connect_timeout=5.0, **_opts(pki))


def test_mutual_tls_needs_a_certificate_from_the_client_ca(akerd_mtls: Akerd, pki: Path, data: np.ndarray) -> None:
    with aker.Client(akerd_mtls.host, akerd_mtls.port, **_opts(pki, client=True)) as c:
        q = queries(1, seed=5)[0]
        assert list(c.search(q, 5).ids) == list(exact(data, q, 5))
    # Without one: refused in the handshake, or (TLS 1.3: the client's handshake ends
    # first) on the first request.
    with pytest.raises(aker.AkerConnectionError):
        with aker.Client(akerd_mtls.host, akerd_mtls.port, **_opts(pki)) as c:
            c.ping()


def test_a_stalled_handshake_is_closed_by_the_server(akerd_tls: Akerd) -> None:
    s = socket.create_connection((akerd_tls.host, akerd_tls.port), timeout=10.0)
    try:
        s.sendall(b"\x16\x03\x01")  # a TLS record header, and nothing more
        assert s.recv(64) == b""  # closed after handshake_timeout_ms (2 s)
    finally:
        s.close()
