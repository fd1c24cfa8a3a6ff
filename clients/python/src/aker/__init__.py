"""aker: the Python client of akerd, the vector-search result cache.

::

    import numpy as np
    import aker

    with aker.Client("127.0.0.1", 7700) as c:
        q = np.random.rand(c.info.dim).astype(np.float32)
        r = c.search(q, k=10)          # r.ids (uint64), r.distances (float32), r.kind
        print(r.kind.name, r.ids[:3])

Sync: :class:`Client`, :class:`Pipeline`, :class:`Pool`. Async: :class:`AsyncClient`,
:class:`AsyncPipeline`, :class:`AsyncPool`. A tier of nodes (protocol version 6):
:class:`Cluster` and :class:`AsyncCluster`, routing by :mod:`aker.cluster`. Errors: :mod:`aker.errors` (all are
:class:`AkerError`).
"""

from __future__ import annotations

from . import errors as _errors
from ._auth import client_proof, load_secret, server_proof
from ._protocol import (
    NO_ID,
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
from .aio import AsyncClient, AsyncPipeline, AsyncPool
from .client import DEFAULT, Client, ClientOptions, Pipeline, Pool
from .cluster import AsyncCluster, Cluster, ClusterCounters
from .errors import *  # noqa: F403 (every error class, listed once in errors.__all__)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "Client",
    "ClientOptions",
    "Pipeline",
    "Pool",
    "AsyncClient",
    "AsyncPipeline",
    "AsyncPool",
    "Cluster",
    "AsyncCluster",
    "ClusterCounters",
    "ClusterState",
    "ClusterNode",
    "DEFAULT",
    "SearchResult",
    "BatchResult",
    "Deleted",
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
]
__all__ += _errors.__all__
