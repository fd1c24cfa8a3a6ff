"""The requests a pipeline collects before it sends them, shared by the sync and the
asyncio pipelines (:class:`aker.Pipeline`, :class:`aker.AsyncPipeline`): each method
encodes its request at once (so bad input raises here, before anything is sent) and
returns the request's place in ``results``."""

from __future__ import annotations

from typing import Any

from ._codec import BytesLike, Payload, Req, VectorLike


class PipelineRequests:
    def __init__(self, client: Any) -> None:
        self._client = client
        self._reqs: list[Req] = []
        self.results: list[Any] = []

    def __len__(self) -> int:
        return len(self._reqs)

    def _add(self, req: Req) -> int:
        self._reqs.append(req)
        return len(self._reqs) - 1

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
    ) -> int:
        return self._add(
            self._client._codec.search(
                vector,
                k,
                bypass_cache=bypass_cache,
                refresh_entry=refresh_entry,
                deadline=deadline,
                collection=collection,
                at_position=at_position,
            )
        )

    def insert(self, id: int, vector: VectorLike, payload: Payload = None, *, collection: int = 0) -> int:
        return self._add(self._client._codec.insert(id, vector, payload, collection))

    def insert_with_position(self, id: int, vector: VectorLike, payload: Payload = None, *, collection: int = 0) -> int:
        """An INSERT whose result is the write's position (protocol version 5)."""
        return self._add(self._client._codec.insert(id, vector, payload, collection, with_position=True))

    def delete(self, id: int, *, collection: int = 0) -> int:
        return self._add(self._client._codec.delete(id, collection))

    def delete_with_position(self, id: int, *, collection: int = 0) -> int:
        """A DELETE whose result is a :class:`~aker.Deleted` (``existed``, ``position``)."""
        return self._add(self._client._codec.delete(id, collection, with_position=True))

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
    ) -> int:
        return self._add(self._client._codec.fill(query, k, ids, distances, vectors, token, collection))

    def ping(self, payload: BytesLike = b"") -> int:
        return self._add(self._client._codec.ping(payload))

    def flush(self) -> int:
        return self._add(self._client._codec.flush())

    def stats(self) -> int:
        return self._add(self._client._codec.stats())

    def cluster(self) -> int:
        """CLUSTER (protocol version 6); its result is a :class:`~aker.ClusterState`."""
        return self._add(self._client._codec.cluster())

