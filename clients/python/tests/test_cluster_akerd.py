"""Version 6 against a real akerd in no cluster (the binary in $AKERD, which may predate
version 6: the client then speaks 5): replies carry routing version 0, CLUSTER is
UNSUPPORTED (from the server in version 6, from the client below), and aker.Cluster
and aker.AsyncCluster refuse such a seed."""

from __future__ import annotations

import numpy as np
import pytest

import aker

from akerd_process import Akerd
from conftest import exact, newest_version, queries, run


def test_a_node_in_no_cluster(client: aker.Client, akerd: Akerd, data: np.ndarray) -> None:
    assert client.version == newest_version(client.info) and client.version >= 5
    q = queries(1, seed=60)[0]
    r = client.search(q, 4)
    assert r.routing_version == 0 and r.ids.tolist() == exact(data, q, 4).tolist()
    b = client.search_batch(queries(5, seed=61), 3)
    assert b.routing_version == 0 and b[0].routing_version == 0 and b.ok.all()
    with pytest.raises(aker.Unsupported) as e:
        client.cluster()
    assert e.value.local is (client.version < 6)
    assert client.ping() >= 0  # the connection stays usable
    with pytest.raises(aker.Unsupported):
        aker.Cluster([f"{akerd.host}:{akerd.port}"], timeout=5.0)
    with pytest.raises(aker.Unsupported):
        run(aker.AsyncCluster.connect([f"{akerd.host}:{akerd.port}"], timeout=5.0))
