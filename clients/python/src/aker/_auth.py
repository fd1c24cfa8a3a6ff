"""Protocol version 3 authentication: HMAC-SHA256 challenge-response (src/auth.rs).

``proof  = HMAC-SHA256(secret, b"aker-auth-v3 client" + challenge + nonce)`` (client's)
``server = HMAC-SHA256(secret, b"aker-auth-v3 server" + challenge + nonce)`` (server's)
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import TypeAlias

from ._protocol import NONCE_LEN
from .errors import InvalidSecret

__all__ = ["load_secret", "client_proof", "server_proof", "verify_server", "random_nonce"]

SECRET_MIN_BYTES = 16
SECRET_MAX_BYTES = 4096
CLIENT_LABEL = b"aker-auth-v3 client"
SERVER_LABEL = b"aker-auth-v3 server"

PathLike: TypeAlias = str | os.PathLike[str]


def _checked(secret: bytes) -> bytes:
    if len(secret) < SECRET_MIN_BYTES:
        raise InvalidSecret(
            f"the secret is {len(secret)} bytes; at least {SECRET_MIN_BYTES} are needed"
        )
    if len(secret) > SECRET_MAX_BYTES:
        raise InvalidSecret(f"the secret is over {SECRET_MAX_BYTES} bytes")
    return secret


def load_secret(
    secret: bytes | bytearray | str | None = None,
    secret_file: PathLike | None = None,
) -> bytes | None:
    """The secret from ``secret`` (bytes, or str as UTF-8) or from the first line of
    ``secret_file`` (without its line ending, as akerd reads it); ``None`` for neither."""
    if secret is not None and secret_file is not None:
        raise InvalidSecret("give secret or secret_file, not both")
    if secret is not None:
        if isinstance(secret, str):
            return _checked(secret.encode("utf-8"))
        if isinstance(secret, (bytes, bytearray)):
            return _checked(bytes(secret))
        raise InvalidSecret(f"the secret must be bytes or str, not {type(secret).__name__}")
    if secret_file is not None:
        try:
            with open(secret_file, "rb") as f:
                text = f.read(SECRET_MAX_BYTES + 2)
        except OSError as e:
            # The path is named, never the content.
            raise InvalidSecret(f"cannot read the secret file {secret_file}: {e.strerror}") from None
        line = text.split(b"\n", 1)[0]
        if line.endswith(b"\r"):
            line = line[:-1]
        try:
            return _checked(line)
        except InvalidSecret as e:
            raise InvalidSecret(f"{secret_file}: {e}") from None
    return None


def _tag(secret: bytes, label: bytes, challenge: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, label + challenge + nonce, hashlib.sha256).digest()


def client_proof(secret: bytes, challenge: bytes, nonce: bytes) -> bytes:
    """What the client sends in AUTH for this connection's challenge and its nonce."""
    return _tag(secret, CLIENT_LABEL, challenge, nonce)


def server_proof(secret: bytes, challenge: bytes, nonce: bytes) -> bytes:
    """What a server holding the secret answers."""
    return _tag(secret, SERVER_LABEL, challenge, nonce)


def verify_server(secret: bytes, challenge: bytes, nonce: bytes, proof: bytes) -> bool:
    """Whether ``proof`` is the server's proof; compared in constant time."""
    return hmac.compare_digest(server_proof(secret, challenge, nonce), bytes(proof))


def random_nonce() -> bytes:
    return os.urandom(NONCE_LEN)
