//! The rules whose numbers depend on the metric, checked on all three (`rules.rs`
//! works them out by hand on a line, in squared L2).
//!
//! Thresholds live on the *gap* (`shards/src/gap.rs`): the distance itself on `l2sq`
//! and `cosine`, the angle `1 − cos` on `ip`, where `minD` is the smallest angle to one
//! of the entry's results. The expected values here are computed in f64 from the definitions, not with
//! the engine's helpers.

use shards::store::ExactStore;
use shards::{
    Admission, Backend, Cache, CacheConfig, Candidate, FilterKind, HitKind, Lookup, Metric,
    PolicyConfig,
};

const METRICS: [Metric; 3] = [Metric::L2Sq, Metric::Cosine, Metric::InnerProduct];

/// Points in the plane: unit vectors at 0°, 30°, 60°, 90°, and a long one at 20°
/// (which wins every inner product near it).
fn points() -> Vec<(u64, [f32; 2])> {
    vec![
        (1, at(0.0, 1.0)),
        (2, at(30.0, 1.0)),
        (3, at(60.0, 1.0)),
        (4, at(90.0, 1.0)),
        (5, at(20.0, 3.0)),
    ]
}

fn store(metric: Metric) -> ExactStore {
    let mut s = ExactStore::new(2, metric);
    for (id, v) in points() {
        s.insert(id, &v).unwrap();
    }
    s
}

fn cache(metric: Metric, delta: usize, policy: PolicyConfig) -> Cache {
    cache_checking(metric, delta, policy, 2, FilterKind::BruteForce)
}

/// The filters a lookup may search: brute force, and the engine's graph (int8 codes).
fn filters() -> [FilterKind; 2] {
    [FilterKind::BruteForce, FilterKind::default()]
}

/// `candidates`: how many nearest representatives a lookup tests (`filter_candidates`).
fn cache_checking(
    metric: Metric,
    delta: usize,
    policy: PolicyConfig,
    candidates: usize,
    filter: FilterKind,
) -> Cache {
    let cfg = CacheConfig {
        filter,
        k_max: 4,
        delta,
        filter_candidates: candidates,
        ..CacheConfig::new(2, metric)
    };
    Cache::new(cfg, policy.build()).unwrap()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

fn cos(a: &[f32], b: &[f32]) -> f64 {
    dot(a, b) / (dot(a, a).sqrt() * dot(b, b).sqrt())
}

/// The metric's distance, from its definition.
fn distance(m: Metric, a: &[f32], b: &[f32]) -> f64 {
    match m {
        Metric::L2Sq => a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
            .sum(),
        Metric::Cosine => 1.0 - cos(a, b),
        Metric::InnerProduct => -dot(a, b),
    }
}

/// The thresholds' unit, from its definition.
fn gap(m: Metric, a: &[f32], b: &[f32]) -> f64 {
    match m {
        Metric::InnerProduct => 1.0 - cos(a, b),
        _ => distance(m, a, b),
    }
}

/// `minD` in the gap's unit for `q` listing `list` (nearest first): the first gap, on
/// `ip` the smallest angle to any of them.
fn min_gap(m: Metric, q: &[f32], list: &[[f32; 2]]) -> f64 {
    match m {
        Metric::InnerProduct => list.iter().map(|v| gap(m, q, v)).fold(f64::MAX, f64::min),
        _ => gap(m, q, &list[0]),
    }
}

fn vectors(list: &[(u64, [f32; 2])]) -> Vec<[f32; 2]> {
    list.iter().map(|p| p.1).collect()
}

/// The exact top `n` by the metric (ties by id).
fn top(m: Metric, q: &[f32], n: usize) -> Vec<(u64, [f32; 2])> {
    let mut p = points();
    p.sort_by(|a, b| {
        distance(m, q, &a.1)
            .total_cmp(&distance(m, q, &b.1))
            .then(a.0.cmp(&b.0))
    });
    p.truncate(n);
    p
}

fn tau(c: &Cache, q: &[f32]) -> f64 {
    let rep = c.slot(q).unwrap().rep();
    c.representative(rep).unwrap().state.tau.load() as f64
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + a.abs().max(b.abs()))
}

/// A request at gap `g` from `q`: `q` turned by the angle whose `1 − cos` is `g` and
/// stretched 5x (cosine, ip: the top-k of a direction is scale-free), or moved
/// perpendicular by `√g` (squared L2).
fn at_gap(m: Metric, q: [f32; 2], g: f64) -> [f32; 2] {
    let (x, y) = (q[0] as f64, q[1] as f64);
    if m == Metric::L2Sq {
        let r = (x * x + y * y).sqrt();
        let s = g.sqrt() / r;
        return [(x - y * s) as f32, (y + x * s) as f32];
    }
    let t = (1.0 - g).acos();
    let (c, s) = (t.cos(), t.sin());
    [
        (5.0 * (x * c - y * s)) as f32,
        (5.0 * (x * s + y * c)) as f32,
    ]
}

fn at(deg: f64, r: f64) -> [f32; 2] {
    let a = deg.to_radians();
    [(r * a.cos()) as f32, (r * a.sin()) as f32]
}

/// The cached request: length 2 at 8°. Its best result is point 1 on squared L2 and
/// cosine (8° away), point 5 on inner product (long, 12° away).
fn q() -> [f32; 2] {
    at(8.0, 2.0)
}

#[test]
fn a_miss_admits_at_a_quarter_of_min_gap_and_equality_hits_grow_it_to_min_gap() {
    for m in METRICS {
        let (mut c, s) = (cache(m, 0, PolicyConfig::default()), store(m));
        let r = c.search(&s, &q(), 2).unwrap();
        let want = top(m, &q(), 2);
        assert_eq!(r.kind, HitKind::Miss);
        let ids: Vec<u64> = r.results.iter().map(|n| n.id).collect();
        assert_eq!(ids, want.iter().map(|p| p.0).collect::<Vec<_>>(), "{m}");
        let min_gap = min_gap(m, &q(), &vectors(&want));
        assert!(min_gap > 0.0, "{m}: a positive minD");
        assert!(close(tau(&c, &q()), min_gap / 4.0), "{m}: τ0 = minD / 4");
        c.search(&s, &q(), 2).unwrap();
        assert!(close(tau(&c, &q()), min_gap / 4.0 * 1.1), "{m}: τ · α_L");
        for _ in 0..40 {
            assert_eq!(c.search(&s, &q(), 2).unwrap().kind, HitKind::Exact);
        }
        assert!(close(tau(&c, &q()), min_gap), "{m}: capped at minD");
        c.check_invariants().unwrap();
    }
}

#[test]
fn approximate_hits_are_decided_on_the_gap_and_tighten_it() {
    for (m, filter) in METRICS.into_iter().flat_map(|m| filters().map(|f| (m, f))) {
        for (share, hit) in [(0.9, true), (1.1, false)] {
            let policy = PolicyConfig::default();
            let (mut c, s) = (cache_checking(m, 0, policy, 2, filter), store(m));
            c.search(&s, &q(), 2).unwrap();
            let t = tau(&c, &q());
            let near = at_gap(m, q(), t * share);
            assert!(
                close(gap(m, &near, &q()), t * share),
                "{m}: the request's gap"
            );
            let r = c.search(&s, &near, 2).unwrap();
            if !hit {
                assert_eq!(r.kind, HitKind::Miss, "{m}: gap {share} τ");
                continue;
            }
            assert_eq!(r.kind, HitKind::Approximate, "{m}: gap {share} τ");
            // Distances are the request's own (the entry keeps vectors).
            assert!(r.exact_distances);
            for n in &r.results {
                let v = points().into_iter().find(|p| p.0 == n.id).unwrap().1;
                assert!(close(n.distance as f64, distance(m, &near, &v)), "{m}");
            }
            assert!(close(tau(&c, &q()), t * 0.25), "{m}: τ · α_T, tighter");
        }
    }
}

#[test]
fn proximity_compares_its_one_threshold_with_the_gap() {
    for m in METRICS {
        let t = 0.05;
        for (g, want) in [(0.04, HitKind::Approximate), (0.06, HitKind::Miss)] {
            let policy = PolicyConfig::Proximity { threshold: t };
            let (mut c, s) = (cache(m, 0, policy), store(m));
            c.search(&s, &q(), 2).unwrap();
            let kind = c.search(&s, &at_gap(m, q(), g), 2).unwrap().kind;
            assert_eq!(kind, want, "{m}: gap {g} against {t}");
        }
    }
}

#[test]
fn merges_and_deletes_keep_min_gap_on_the_nearest_result() {
    for m in METRICS {
        let (mut c, mut s) = (cache(m, 1, PolicyConfig::default()), store(m));
        c.search(&s, &q(), 2).unwrap();
        let rep = c.slot(&q()).unwrap().rep();
        let before = top(m, &q(), 3);
        // A new best, half a degree off the request: near it (squared L2), or long
        // enough to outscore point 5 (inner product).
        let v = at(8.5, if m == Metric::InnerProduct { 4.0 } else { 2.05 });
        s.insert(9, &v).unwrap();
        assert!(c.insert(9, &v).unwrap().fast_path, "{m}");
        let r = c.representative(rep).unwrap();
        assert_eq!(r.nrl.ids[0], 9, "{m}: at the front");
        assert!(close(r.nrl.dists[0] as f64, distance(m, &q(), &v)), "{m}");
        let listed: Vec<[f32; 2]> = r
            .nrl
            .ids
            .iter()
            .map(|&id| {
                if id == 9 {
                    v
                } else {
                    points().into_iter().find(|p| p.0 == id).unwrap().1
                }
            })
            .collect();
        assert!(
            close(r.min_gap as f64, min_gap(m, &q(), &listed)),
            "{m}: minD follows"
        );
        s.delete(9).unwrap();
        c.delete(9);
        let r = c.representative(rep).unwrap();
        assert_eq!(
            r.nrl.ids[0], before[0].0,
            "{m}: the old best is promoted back"
        );
        let want = min_gap(m, &q(), &vectors(&before[..r.nrl.len()]));
        assert!(close(r.min_gap as f64, want), "{m}");
        c.check_invariants().unwrap();
    }
}

#[test]
fn ip_without_result_vectors_admits_but_serves_no_approximate_hit() {
    for m in METRICS {
        let (mut c, s) = (cache(m, 0, PolicyConfig::default()), store(m));
        let Lookup::Miss(ticket) = c.lookup(&q(), 2).unwrap() else {
            panic!("cold cache")
        };
        let bare: Vec<Candidate> = s
            .search(&q(), 2)
            .unwrap()
            .into_iter()
            .map(|c| Candidate::new(c.id, c.distance))
            .collect();
        assert!(matches!(
            c.admit(ticket, bare).unwrap(),
            Admission::Admitted(_)
        ));
        // The angle to the best result is unknown on ip: no threshold at all.
        let t = tau(&c, &q());
        assert_eq!(t == 0.0, m == Metric::InnerProduct, "{m}: τ = {t}");
        let near = at_gap(m, q(), min_gap(m, &q(), &vectors(&top(m, &q(), 2))) / 100.0);
        let kind = c.search(&s, &near, 2).unwrap().kind;
        let want = if m == Metric::InnerProduct {
            HitKind::Miss
        } else {
            HitKind::Approximate
        };
        assert_eq!(kind, want, "{m}");
        assert_eq!(c.search(&s, &q(), 2).unwrap().kind, HitKind::Exact, "{m}");
        c.check_invariants().unwrap();
    }
}

#[test]
fn ip_filter_finds_the_nearest_direction_not_the_longest_query() {
    // Two cached queries: a long one 40° away and a short one 5° away. By dot product
    // the long one is nearer the request; by angle (the gap) the short one is, and only
    // it is within its threshold.
    // One candidate tested per lookup: the filter's order decides.
    let m = Metric::InnerProduct;
    for filter in filters() {
        let (mut c, s) = (
            cache_checking(m, 0, PolicyConfig::default(), 1, filter),
            store(m),
        );
        let (long, short) = (at(40.0, 50.0), at(5.0, 0.5));
        c.search(&s, &long, 2).unwrap();
        c.search(&s, &short, 2).unwrap();
        let request = at(6.0, 1.0);
        assert!(dot(&request, &long) > dot(&request, &short));
        let Lookup::Hit(hit) = c.lookup(&request, 2).unwrap() else {
            panic!("the short query's entry serves it")
        };
        assert_eq!(hit.kind, HitKind::Approximate);
        assert_eq!(hit.rep, c.slot(&short).unwrap().rep());
    }
}

#[test]
fn risk_is_never_zero_for_a_list_with_a_reserve_even_at_k_1() {
    // k = 1, Δ = 2, then one insert no list takes: U = W = 1, so R = r(e). On ip r is
    // measured from -|RQ| · the longest listed vector (k = 1 from d_1 itself gave 0).
    for m in METRICS {
        let cfg = CacheConfig {
            filter: FilterKind::BruteForce,
            k_max: 4,
            delta: 2,
            risk_threshold: 10.0,
            ..CacheConfig::new(2, m)
        };
        let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
        let s = store(m);
        c.search(&s, &q(), 1).unwrap();
        let far = [-50.0f32, -60.0];
        assert!(!c.insert(100, &far).unwrap().fast_path, "{m}");
        let list = top(m, &q(), 3);
        let d: Vec<f64> = list.iter().map(|p| distance(m, &q(), &p.1)).collect();
        let floor = match m {
            Metric::InnerProduct => {
                let longest = list
                    .iter()
                    .map(|p| dot(&p.1, &p.1).sqrt())
                    .fold(0.0, f64::max);
                -dot(&q(), &q()).sqrt() * longest
            }
            _ => 0.0,
        };
        let r = (d[0] - floor) / (d[2] - floor);
        assert!(
            r > 0.0 && close(c.risk(), r),
            "{m}: R {} against r {r}",
            c.risk()
        );
    }
}

#[test]
fn ip_without_kept_vectors_min_gap_falls_on_merges_and_holds_on_deletes() {
    let m = Metric::InnerProduct;
    let cfg = CacheConfig {
        filter: FilterKind::BruteForce,
        k_max: 4,
        delta: 1,
        store_vectors: false,
        ..CacheConfig::new(2, m)
    };
    let mut c = Cache::new(cfg, PolicyConfig::default().build()).unwrap();
    let mut s = store(m);
    c.search(&s, &q(), 2).unwrap();
    let rep = c.slot(&q()).unwrap().rep();
    let r = c.representative(rep).unwrap();
    assert!(
        r.nrl.vectors.iter().all(|v| v.is_none()),
        "vectors not kept"
    );
    let admitted = min_gap(m, &q(), &vectors(&top(m, &q(), 3)));
    assert!(
        close(r.min_gap as f64, admitted),
        "from the answer's vectors"
    );
    // A long vector half a degree off the request: the new best, the new smallest angle.
    let v = at(8.5, 4.0);
    s.insert(9, &v).unwrap();
    assert!(c.insert(9, &v).unwrap().fast_path);
    let merged = gap(m, &q(), &v);
    assert!(merged < admitted);
    assert!(close(c.representative(rep).unwrap().min_gap as f64, merged));
    // Its delete cannot be undone without vectors: minD stays the tighter one.
    s.delete(9).unwrap();
    c.delete(9);
    assert!(close(c.representative(rep).unwrap().min_gap as f64, merged));
    c.check_invariants().unwrap();
}
