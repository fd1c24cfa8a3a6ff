"""aker: the Python client of akerd, the vector-search result cache.

::

    import numpy as np
    import aker

    with aker.Client("127.0.0.1", 7700) as c:
        q = np.random.rand(c.info.dim).astype(np.float32)
        r = c.search(q, k=10)          # r.ids (uint64), r.distances (float32), r.kind
        print(r.kind.name, r.ids[:3])

Sync: :class:`Client`, :class:`Pipeline`, :class:`Pool`. Async: :class:`AsyncClient`,
:class:`AsyncPipeline`, :class:`AsyncPool`. Errors: :mod:`aker.errors` (all are
:class:`AkerError`).
"""

from __future__ import annotations

from ._auth import client_proof, load_secret, server_proof
from ._protocol import (
    NO_ID,
    VERSIONS,
    BatchResult,
    HitKind,
    Metric,
    Opcode,
    SearchResult,
    ServerInfo,
    Status,
)
from .aio import AsyncClient, AsyncPipeline, AsyncPool
from .client import DEFAULT, Client, Pipeline, Pool
from .errors import (
    STATUS_ERRORS,
    AkerConnectionError,
    AkerError,
    AuthError,
    AuthRequired,
    BadFrame,
    BadK,
    BadVersion,
    Busy,
    ConnectionClosed,
    DeadlineExceeded,
    DimensionMismatch,
    IncompatibleServer,
    InternalError,
    InvalidRequest,
    InvalidSecret,
    NonFinite,
    NotFound,
    ProtocolError,
    ServerNotAuthentic,
    ShuttingDown,
    StatusError,
    Timeout,
    TooLarge,
    Unauthenticated,
    UnknownCollection,
    UnknownOp,
    Unavailable,
    Unsupported,
    error_for_status,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Client",
    "Pipeline",
    "Pool",
    "AsyncClient",
    "AsyncPipeline",
    "AsyncPool",
    "DEFAULT",
    "SearchResult",
    "BatchResult",
    "ServerInfo",
    "HitKind",
    "Metric",
    "Opcode",
    "Status",
    "NO_ID",
    "VERSIONS",
    "load_secret",
    "client_proof",
    "server_proof",
    "STATUS_ERRORS",
    "error_for_status",
    "AkerError",
    "StatusError",
    "NotFound",
    "Busy",
    "TooLarge",
    "BadFrame",
    "BadVersion",
    "UnknownOp",
    "InvalidRequest",
    "DimensionMismatch",
    "NonFinite",
    "BadK",
    "DeadlineExceeded",
    "UnknownCollection",
    "Unsupported",
    "Unavailable",
    "ShuttingDown",
    "InternalError",
    "Unauthenticated",
    "AuthError",
    "AuthRequired",
    "ServerNotAuthentic",
    "InvalidSecret",
    "AkerConnectionError",
    "ConnectionClosed",
    "Timeout",
    "ProtocolError",
    "IncompatibleServer",
]
