"""The routing functions of aker.cluster against golden values: computed with the Rust
definitions (src/cluster/mod.rs, compiled as they are), splitmix64's published outputs,
and PROTOCOL.md's rules worked by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

import aker
from aker.cluster import mix64, nearest_centroid, nearest_centroids, owner, owner_order, rendezvous_score

#: mix64(z) as the Rust ``aker::cluster::mix64`` computes it.
MIX64 = [
    (0, 0),
    (1, 0x5692_161D_100B_05E5),
    (2, 0xDBD2_3897_3A2B_148A),
    (0x9E37_79B9_7F4A_7C15, 0xE220_A839_7B1D_CDAF),
    (0xDEAD_BEEF, 0x4E06_2702_EC92_9EEA),
    (0xFFFF_FFFF_FFFF_FFFF, 0xB4D0_55FC_F2CB_BD7B),
    (1 << 63, 0x25C2_6EA5_79CE_A98A),
    (0x0123_4567_89AB_CDEF, 0xB2C0_58E4_EBB5_112C),
]

#: rendezvous_score(node_id, centroid), from the Rust definition.
SCORES = [
    (1, 0, 0x5692_161D_100B_05E5),
    (1, 1, 0x83EC_686C_1600_460A),
    (0xA1, 7, 0x02CB_661F_DCC2_8942),
    (0xFFFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF, 0x89BC_80F6_AC4B_92EC),
    (0x1234_5678_9ABC_DEF0, 63, 0x7117_859A_6F9F_8CFB),
]

#: Nodes 11, 22, 44 live, 33 and 55 not; overrides (3 -> 44), (5 -> 33, not live), (3 ->
#: 11, after the first for 3: not looked at). owner_order per centroid, from the Rust code.
ORDERS = {
    0: [22, 44, 11, 33, 55],
    1: [11, 44, 22, 55, 33],
    2: [22, 11, 44, 33, 55],
    3: [44, 11, 22, 55, 33],
    4: [22, 44, 11, 33, 55],
    5: [11, 44, 22, 55, 33],
    6: [22, 11, 44, 55, 33],
    7: [44, 22, 11, 55, 33],
}


def state(nodes: Sequence[tuple[int, bool]] = (), overrides: Sequence[tuple[int, int]] = (),
          centroids: Sequence[Sequence[float]] = ((0.0, 0.0),),
          metric: aker.Metric = aker.Metric.L2SQ) -> aker.ClusterState:
    if len(centroids):
        c = np.asarray(centroids, dtype=np.float32).reshape(len(centroids), -1)
    else:
        c = np.zeros((0, 2), np.float32)
    return aker.ClusterState(name="t", routing_version=1, centroids_version=1, balance_epoch=0, self_id=0,
                             lease_ms=3000, metric=metric, dim=int(c.shape[1]), centroids=c,
                             nodes=[aker.ClusterNode(i, live, f"127.0.0.1:{7000 + i}") for i, live in nodes],
                             overrides=list(overrides))


def test_mix64_is_the_rust_mix64() -> None:
    for z, want in MIX64:
        assert mix64(z) == want, hex(z)


def test_mix64_is_splitmix64s_finaliser() -> None:
    # splitmix64 seeded with 0 outputs mix64(i * 0x9e3779b97f4a7c15) for i = 1, 2, 3: its
    # published first outputs.
    s, out = 0, []
    for _ in range(3):
        s = (s + 0x9E37_79B9_7F4A_7C15) & 0xFFFF_FFFF_FFFF_FFFF
        out.append(mix64(s))
    assert out == [0xE220_A839_7B1D_CDAF, 0x6E78_9E6A_A1B9_65F4, 0x06C4_5D18_8009_454F]


def test_mix64_wraps_as_u64_arithmetic() -> None:
    """Against numpy's uint64, whose products wrap modulo 2**64."""
    zs = np.random.default_rng(3).integers(0, 1 << 64, size=2000, dtype=np.uint64)
    z = zs.copy()
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58_476D_1CE4_E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D0_49BB_1331_11EB)
        z = z ^ (z >> np.uint64(31))
    assert [mix64(int(x)) for x in zs] == [int(x) for x in z]
    outs = {mix64(i) for i in range(5000)}
    assert len(outs) == 5000 and all(0 <= x < 1 << 64 for x in outs)  # a bijection, in range


def test_rendezvous_scores_are_the_rust_ones() -> None:
    for node, c, want in SCORES:
        assert rendezvous_score(node, c) == want
        assert want == mix64(node ^ mix64(c))


def test_owner_order_is_the_rust_one() -> None:
    s = state(nodes=[(11, True), (22, True), (33, False), (44, True), (55, False)],
              overrides=[(3, 44), (5, 33), (3, 11)])
    for c, want in ORDERS.items():
        assert owner_order(s, c) == want, c
        assert owner(s, c) == want[0]


def by_score(group: list[int], centroid: int) -> list[int]:
    """``group`` by descending (score for ``centroid``, id)."""
    return sorted(group, key=lambda i: (rendezvous_score(i, centroid), i), reverse=True)


def test_owner_order_by_the_rule() -> None:
    """PROTOCOL.md's rule worked directly: live by descending (score, id), the override
    first when live, then the nodes not live by the same order."""
    rng = np.random.default_rng(9)
    for _ in range(200):
        ids = [int(x) for x in rng.choice(1 << 62, size=int(rng.integers(1, 7)), replace=False)]
        live = {i: bool(rng.integers(0, 3)) for i in ids}
        c = int(rng.integers(0, 16))
        over = [(c, ids[int(rng.integers(0, len(ids)))])] if rng.integers(0, 2) else []
        s = state(nodes=list(live.items()), overrides=over)
        up = by_score([i for i in ids if live[i]], c)
        first = [over[0][1]] if over and live[over[0][1]] else []
        want = first + [i for i in up if i not in first] + by_score([i for i in ids if not live[i]], c)
        assert owner_order(s, c) == want


def test_owner_without_nodes() -> None:
    assert owner(state(), 0) is None and owner_order(state(), 0) == []
    gone = state(nodes=[(1, False), (2, False)])
    assert owner(gone, 0) == owner_order(gone, 0)[0] and sorted(owner_order(gone, 0)) == [1, 2]


def test_nearest_centroid_by_metric() -> None:
    cs = [(0.1, 0.1), (12.0, 8.0), (-5.0, 0.0)]
    q = (10.0, 10.0)
    assert nearest_centroid(state(centroids=cs), q) == 1  # squared L2: (12, 8) is 8 away
    for m in (aker.Metric.COSINE, aker.Metric.IP):  # by angle: (0.1, 0.1) is the same direction
        assert nearest_centroid(state(centroids=cs, metric=m), q) == 0
    # Inner product routes by angle, not by the largest dot product (the longest centroid).
    long = [(1000.0, 10.0), (1.0, 1.0)]
    assert nearest_centroid(state(centroids=long, metric=aker.Metric.IP), (1.0, 1.0)) == 1


def test_nearest_centroid_ties_and_edges() -> None:
    two = state(centroids=[(1.0, 0.0), (-1.0, 0.0)])
    assert nearest_centroid(two, (0.0, 0.0)) == 0  # equidistant: the lower index
    assert nearest_centroid(state(centroids=[(0.0, 1.0), (1.0, 0.0), (1.0, 0.0)]), (2.0, 0.0)) == 1
    cos = [(1.0, 0.0), (0.0, 1.0)]
    assert nearest_centroid(state(centroids=cos, metric=aker.Metric.COSINE), (0.0, 0.0)) == 0  # all 1 - cos = 1
    zero = [(1.0, 0.0), (0.0, 0.0)]
    assert nearest_centroid(state(centroids=zero, metric=aker.Metric.COSINE), (0.0, 0.0)) == 1  # both zero: 0
    assert nearest_centroid(state(centroids=zero, metric=aker.Metric.COSINE), (0.0, 3.0)) == 0  # 1 - 0 = 1 both
    assert nearest_centroid(state(centroids=[]), (1.0, 2.0)) == 0  # none: 0
    big = state(centroids=[(3e38, 3e38), (-3e38, -3e38)])
    assert nearest_centroid(big, (-3e38, -3e38)) == 1  # f64 sums do not overflow
    with pytest.raises(aker.DimensionMismatch):
        nearest_centroid(two, (1.0, 2.0, 3.0))
    with pytest.raises(aker.NonFinite):
        nearest_centroid(two, (np.nan, 0.0))


def test_nearest_centroids_is_the_brute_force_one() -> None:
    rng = np.random.default_rng(11)
    for metric in aker.Metric:
        cs = rng.standard_normal((16, 5)).astype(np.float32)
        qs = rng.standard_normal((300, 5)).astype(np.float32)
        s = state(centroids=cs.tolist(), metric=metric)
        got = nearest_centroids(s, qs)
        c64, q64 = cs.astype(np.float64), qs.astype(np.float64)
        if metric == aker.Metric.L2SQ:
            d = ((q64[:, None, :] - c64[None, :, :]) ** 2).sum(axis=2)
        else:
            d = 1 - (q64 @ c64.T) / np.outer(np.linalg.norm(q64, axis=1), np.linalg.norm(c64, axis=1))
        assert got.tolist() == np.argmin(d, axis=1).tolist()
        assert [nearest_centroid(s, q) for q in qs[:20]] == got[:20].tolist()
