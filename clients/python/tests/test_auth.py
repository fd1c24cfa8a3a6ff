"""Authentication (protocol version 3) against a secret-protected akerd."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aker

from akerd_process import Akerd
from conftest import SECRET, exact, newest_version, queries, run
from fake_server import FakeConn, FakeServer, hello_body


def test_the_right_secret_authenticates(akerd_auth: Akerd, data: np.ndarray) -> None:
    for secret in (SECRET, SECRET.decode(), bytearray(SECRET)):
        with aker.Client(akerd_auth.host, akerd_auth.port, secret=secret) as c:
            assert c.info.auth_required and c.version == newest_version(c.info) and c.version >= 5
            assert c.info.max_batch is not None
            q = queries(1, seed=30)[0]
            assert c.search(q, 3, bypass_cache=True).ids.tolist() == exact(data, q, 3).tolist()
            assert int(c.stats()["server_requests"]) > 0


def test_the_secret_from_a_file(akerd_auth: Akerd, workdir: Path) -> None:
    with aker.Client(akerd_auth.host, akerd_auth.port, secret_file=str(workdir / "secret")) as c:
        assert c.ping() > 0 and c.stats()
    with aker.Pool(akerd_auth.host, akerd_auth.port, size=2, secret_file=workdir / "secret") as p:
        assert p.info.auth_required and isinstance(p.stats(), dict)


def test_no_secret_is_auth_required(akerd_auth: Akerd) -> None:
    with pytest.raises(aker.AuthRequired):
        aker.Client(akerd_auth.host, akerd_auth.port)


def test_a_wrong_secret_is_unauthenticated(akerd_auth: Akerd) -> None:
    with pytest.raises(aker.Unauthenticated) as e:
        aker.Client(akerd_auth.host, akerd_auth.port, secret=b"not the shared secret at all")
    assert isinstance(e.value, aker.AuthError) and not e.value.local


def test_a_short_secret_is_refused_before_connecting() -> None:
    with pytest.raises(aker.InvalidSecret):
        aker.Client("127.0.0.1", 1, secret="short")


def test_a_server_that_asks_no_challenge_is_refused(akerd: Akerd) -> None:
    with pytest.raises(aker.ServerNotAuthentic):
        aker.Client(akerd.host, akerd.port, secret=SECRET)


def test_a_server_with_a_wrong_proof_is_refused() -> None:
    challenge = bytes(range(16))

    def impostor(c: FakeConn) -> None:
        while True:
            req = c.recv()
            if req is None:
                return
            version, op, _flags, rid, body = req
            if op == 1:
                c.send(version, op, rid, hello_body(version, challenge=challenge))
            elif op == 9:
                c.send(version, op, rid, b"\x00" * 32)  # it does not know the secret

    with FakeServer(impostor) as fake:
        with pytest.raises(aker.ServerNotAuthentic):
            aker.Client("127.0.0.1", fake.port, secret=SECRET, connect_timeout=5.0)


def test_async_authentication(akerd_auth: Akerd, akerd: Akerd) -> None:
    async def body() -> None:
        async with await aker.AsyncClient.connect(akerd_auth.host, akerd_auth.port, secret=SECRET) as c:
            assert c.info.auth_required
            assert len(await c.search(queries(1)[0], 2)) == 2
        with pytest.raises(aker.AuthRequired):
            await aker.AsyncClient.connect(akerd_auth.host, akerd_auth.port)
        with pytest.raises(aker.Unauthenticated):
            await aker.AsyncClient.connect(akerd_auth.host, akerd_auth.port, secret=b"x" * 20)
        with pytest.raises(aker.ServerNotAuthentic):
            await aker.AsyncClient.connect(akerd.host, akerd.port, secret=SECRET)

    run(body())
